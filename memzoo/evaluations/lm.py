"""The language-model evaluation (`memzoo eval RUN_DIR`): stream whole documents segment by segment
through the state API and report bits per byte overall, by segment index within the document (does
memory help later segments?) and per document (so that differences pair by document), with
throughput and peak memory, written into the run's result.json (memzoo.evaluations.run_result).
Training runs it at its end, so a suite never lists it as a long-range stage.

`memory-ablation`, the same evaluation with the state reset before every segment, is a suite stage
(`longrange: [{task: memory-ablation}]`), so that a suite measures what each memory buys by itself.
"""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch
from omegaconf import DictConfig
from tqdm.auto import tqdm

from memzoo.core.config import ConfigError
from memzoo.core.losses import LN2, token_nll
from memzoo.core.memory import state_bytes
from memzoo.core.model import MemoryModel
from memzoo.core.precision import autocast_context
from memzoo.data.corpus import load_documents, split_documents
from memzoo.data.samplers import stream_documents
from memzoo.evaluations.byte_classes import byte_class_columns
from memzoo.evaluations.harness import forget_before_segment
from memzoo.evaluations.registry import Command, Evaluation, Score, register_evaluation
from memzoo.evaluations.reporting import bpb_notes, bpb_sections, bpb_summary, holds_bpb
from memzoo.analysis.results import bpb_over
from memzoo.evaluations.run_result import peak_rss_mb, write_result
from memzoo.runs.checkpoints import load_run, run_config


@torch.no_grad()
def evaluate_model(model: MemoryModel, docs: list, batch_size: int, max_segments_per_doc: Optional[int],
                   precision: str = "fp32", progress: bool = True, desc: str = "eval",
                   reset_memory: bool = False) -> dict[str, Any]:
    """Bits per byte of `docs` streamed from their first byte, one segment per call. `reset_memory`:
    the memory ablation, the memory's state reset before every segment as if each began a document (the
    model's own weights, no memory), so that what the memory buys is read apart from its weights; with
    the backbone's sliding window the window is kept (it resets at documents only), so the ablation
    measures what the memory buys beyond the window.

    Each step's summed NLL [B] stays on the device until the stream ends (one host sync in all, not one
    per segment, so a GPU is fed ahead); the sums are then added up on the CPU in the order streamed."""
    model.eval()
    device = next(model.parameters()).device
    n = model.cfg.segment_len
    max_seg = max_segments_per_doc or 10**9
    nll_by_seg = torch.zeros(max_seg if max_segments_per_doc else 1024, dtype=torch.float64)
    cnt_by_seg = torch.zeros_like(nll_by_seg)
    nll_by_doc = torch.zeros(len(docs), dtype=torch.float64)  # each document scored apart: the same bytes
    cnt_by_doc = torch.zeros_like(nll_by_doc)  # for every method, so differences can be paired per document
    state = model.initial_state(batch_size, device)
    total_steps = sum(min(max_seg, -(-(len(d.data) - 1) // n)) for d in docs) // batch_size + 1
    start, tokens = time.perf_counter(), 0
    step_nll, step_rows = [], []  # [B] float64 on the device; (seg, doc, count) [B] each on the CPU
    step_tokens, step_masks = [], []  # [B, N] per-byte NLL on the device, [B, N] bool masks on the CPU
    for batch in tqdm(stream_documents(docs, batch_size, n, max_segments_per_doc), total=total_steps,
                      desc=desc, disable=not progress, dynamic_ncols=True):
        step_rows.append((batch.seg_index[:, 0].cpu(), batch.doc_index[:, 0].cpu(), batch.mask.sum(dim=(1, 2)).double().cpu()))
        batch = batch.to(device)
        reset = batch.reset
        if reset_memory:
            state, reset = forget_before_segment(model, state, reset, batch_size)
        with autocast_context(precision, device):
            out = model(batch.tokens, state, reset)
        state = out.state
        nll = token_nll(out.logits, batch.targets)  # [B, 1, N]
        step_nll.append((nll * batch.mask).sum(dim=(1, 2)).double())  # [B]
        step_tokens.append(nll[:, 0].detach())
        step_masks.append(batch.mask[:, 0].cpu())
    nll_all = torch.cat(step_nll).cpu().split([len(r[0]) for r in step_rows]) if step_nll else []  # the one sync
    for nll, (seg, doc, count) in zip(nll_all, step_rows):
        ok = seg >= 0
        if ok.any() and int(seg[ok].max()) >= nll_by_seg.numel():
            grow = int(seg[ok].max()) + 1 - nll_by_seg.numel()
            nll_by_seg = torch.cat((nll_by_seg, torch.zeros(grow, dtype=torch.float64)))
            cnt_by_seg = torch.cat((cnt_by_seg, torch.zeros(grow, dtype=torch.float64)))
        nll_by_seg.index_add_(0, seg[ok], nll[ok])
        cnt_by_seg.index_add_(0, seg[ok], count[ok])
        nll_by_doc.index_add_(0, doc[ok], nll[ok])
        cnt_by_doc.index_add_(0, doc[ok], count[ok])
        tokens += int(count.sum())
    elapsed = time.perf_counter() - start
    if tokens == 0:
        raise ValueError("evaluation saw no token to predict (documents shorter than two bytes?)")
    used = cnt_by_seg > 0
    by_seg = (nll_by_seg[used] / cnt_by_seg[used] / LN2).tolist()
    byte_classes = byte_class_columns(docs, torch.cat(step_tokens).cpu().double() / LN2, torch.cat(step_masks),
                                      torch.cat([r[0] for r in step_rows]), torch.cat([r[1] for r in step_rows]), n,
                                      span=model.cfg.attention_span)  # the protocol's W, full's too
    return {
        **byte_classes,
        "bpb": float(nll_by_seg.sum() / cnt_by_seg.sum().clamp(min=1) / LN2),
        "bpb_by_segment": by_seg,
        "tokens_by_segment": cnt_by_seg[used].long().tolist(),
        "bits_by_doc": (nll_by_doc / LN2).tolist(),  # summed bits of each document, in the order given
        "tokens_by_doc": cnt_by_doc.long().tolist(),
        "tokens": tokens,
        "tokens_per_s": tokens / max(elapsed, 1e-9),
        "seconds": elapsed,
        "peak_rss_mb": peak_rss_mb(),
        "peak_cuda_mb": torch.cuda.max_memory_allocated() / 2**20 if device.type == "cuda" else None,
        "state_bytes_per_row": state_bytes(state.all(), batch_size),
    }


def split_docs(cfg: DictConfig, split: str) -> list:
    docs = split_documents(load_documents(cfg.data), cfg.data)[split]
    if not docs:
        raise ConfigError(
            f"the {split!r} split of data.source={cfg.data.source!r} has no document; add documents or raise "
            f"data.{split}_fraction (the split is by a hash of each document's name)"
        )
    return docs[: cfg.eval.max_docs] if cfg.eval.max_docs else docs


def evaluate_run(cfg: DictConfig, model: MemoryModel, split: Optional[str] = None, progress: bool = True,
                 reset_memory: bool = False) -> dict[str, Any]:
    split = split or cfg.eval.split
    docs = split_docs(cfg, split)
    res = evaluate_model(model, docs, cfg.eval.batch_size, cfg.eval.max_segments_per_doc, cfg.train.precision,
                         progress, desc=f"eval {cfg.name} ({split}{', memory reset' if reset_memory else ''})",
                         reset_memory=reset_memory)
    res["split"] = split
    res["reset_memory"] = reset_memory
    res["docs"] = len(docs)
    return res



SPLITS = ("train", "valid", "test")


def check_split(split: Optional[str]) -> None:
    """A split option: None (the run's own eval.split) or one of SPLITS."""
    if split is not None and split not in SPLITS:
        raise ValueError(f"split={split!r}; expected one of {', '.join(SPLITS)}")


@dataclass
class LmEvalConfig:
    """Which split to evaluate (None: the run's own eval.split); reset_memory: the memory ablation
    (the state reset before every segment), merged into result.json as SPLIT_bpb_reset columns."""

    task: str = "lm"
    split: Optional[str] = None
    reset_memory: bool = False

    def __post_init__(self) -> None:
        check_split(self.split)


def evaluate_folder(run_dir: str | Path, cfg: LmEvalConfig, resume: bool = True, progress: bool = True) -> list[dict]:
    """The run's result.json row after evaluating its trained model on the split (always measured again)."""
    run_cfg, model = load_run(run_dir, device=None)  # --device, else the run's train.device (eval_device)
    return [write_result(Path(run_dir), run_cfg, model, evaluate_run(run_cfg, model, split=cfg.split, progress=progress,
                                                                     reset_memory=cfg.reset_memory))]


@dataclass
class MemoryAblationConfig:
    """The memory ablation as a suite stage: the split (None: the run's own eval.split) evaluated with
    the state reset before every segment, merged into result.json as SPLIT_bpb_reset columns."""

    task: str = "memory-ablation"
    split: Optional[str] = None
    threads: int = 0  # torch threads; 0 = torch's default

    def __post_init__(self) -> None:
        check_split(self.split)


def ablate_folder(run_dir: str | Path, cfg: MemoryAblationConfig, resume: bool = True, progress: bool = True) -> list[dict]:
    """The run's result.json row with SPLIT_bpb_reset: measured, unless `resume` finds it there already."""
    result = Path(run_dir) / "result.json"
    row = json.loads(result.read_text()) if result.is_file() else {}
    if resume and f"{cfg.split or run_config(run_dir).eval.split}_bpb_reset" in row:
        return [row]  # done: the model is not loaded
    run_cfg, model = load_run(run_dir, device=None)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    return [write_result(Path(run_dir), run_cfg, model,
                         evaluate_run(run_cfg, model, split=cfg.split, progress=progress, reset_memory=True))]


def print_summary(result: dict[str, Any]) -> None:
    """A result.json row's headline numbers, one per line, and bpb by segment index."""
    keys = ["method", "params", "footprint_analytic", "footprint_measured", "valid_bpb", "valid_bpb_reset", "test_bpb", "tokens_per_s",
            "train_tokens_per_s", "peak_rss_mb"]
    for k in keys:
        if k in result and result[k] is not None:
            v = result[k]
            print(f"  {k:20s} {v:.4f}" if isinstance(v, float) else f"  {k:20s} {v}")
    if result.get("bpb_by_segment"):
        print("  bpb by segment index: " + " ".join(f"{x:.3f}" for x in result["bpb_by_segment"]))


def table_columns(row: dict[str, Any]) -> None:
    """bpb by segment as bpb_seg_<i> columns (the list stays too); the gates as one JSON column."""
    for i, value in enumerate(row.get("bpb_by_segment") or []):
        row[f"bpb_seg_{i}"] = value
    row["gates_json"] = json.dumps(row.pop("gates", {}))


def _print_rows(args: argparse.Namespace, rows: list[dict]) -> None:
    """The row as JSON with --json, else its summary."""
    print(json.dumps(rows[0], indent=1)) if args.json else print_summary(rows[0])


def _arguments(s: argparse.ArgumentParser) -> None:
    s.add_argument("run_dir")
    s.add_argument("--split", default=None, choices=list(SPLITS))
    s.add_argument("--json", action="store_true")
    s.add_argument("--reset-memory", action="store_true",
                   help="the memory ablation: reset the state before every segment (result.json gets SPLIT_bpb_reset)")


def finish_training(run_dir: Path, cfg: DictConfig, model: MemoryModel, progress: bool = True) -> dict[str, Any]:
    """The run's row when its training ends: its own split evaluated, written into result.json."""
    return write_result(run_dir, cfg, model, evaluate_run(cfg, model, progress=progress))


register_evaluation(Evaluation(
    "lm", LmEvalConfig, evaluate_folder,
    Command("evaluate a run folder", _arguments, lambda args: {"split": args.split, "reset_memory": args.reset_memory}, dict, [], "",
            print_rows=_print_rows, name="eval"),
    columns=table_columns, in_suite=False, finish=finish_training,
    # where a memory can have been read (segment 0 has none yet); valid_bpb over whole documents
    scores=(Score("bpb_after_segment_0", False, lambda row: bpb_over(row, 1)), Score("valid_bpb", False)),
    section=bpb_sections, notes=bpb_notes, summary=bpb_summary, holds=holds_bpb))

register_evaluation(Evaluation("memory-ablation", MemoryAblationConfig, ablate_folder))
