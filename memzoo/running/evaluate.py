"""Evaluation: stream whole documents segment by segment through the state API and report bits
per byte overall and by segment index within the document (does memory help later segments?),
tokens per second and peak memory; plus the footprint of the state (analytic and measured).
The per-method footprint table (plugin, card, measured) is memzoo.suites.footprint.
"""
from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path
from typing import Any, Optional

import torch
from omegaconf import DictConfig
from tqdm.auto import tqdm

from memzoo.core.config import ConfigError, model_config
from memzoo.core.losses import LN2, token_nll
from memzoo.core.memory import state_bytes, state_numbers
from memzoo.core.model import MemoryModel
from memzoo.core.plugins import get_memory
from memzoo.core.precision import autocast_context, precision_choice
from memzoo.data.corpus import load_documents, split_documents, stream_documents
from memzoo.running.configure import memory_config


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, in MB.

    Linux: VmHWM, the high-water mark of this process image. Not getrusage's ru_maxrss, which a
    spawned child inherits from its parent across fork and exec (a worker started by a 1.2 GB
    process would report 1.2 GB before doing anything). Elsewhere: ru_maxrss.
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0  # kB
    except OSError:
        pass
    divisor = 2**20 if sys.platform == "darwin" else 1024.0  # macOS reports bytes, Linux KiB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / divisor


@torch.no_grad()
def evaluate_model(model: MemoryModel, docs: list, batch_size: int, max_segments_per_doc: Optional[int],
                   precision: str = "fp32", progress: bool = True, desc: str = "eval",
                   reset_memory: bool = False) -> dict[str, Any]:
    """Bits per byte of `docs` streamed from their first byte, one segment per call. `reset_memory`:
    the memory ablation, the state reset before every segment as if each began a document (the
    model's own weights, no memory), so that what the memory buys is read apart from its weights.

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
    for batch in tqdm(stream_documents(docs, batch_size, n, max_segments_per_doc), total=total_steps,
                      desc=desc, disable=not progress, dynamic_ncols=True):
        step_rows.append((batch.seg_index[:, 0].cpu(), batch.doc_index[:, 0].cpu(), batch.mask.sum(dim=(1, 2)).double().cpu()))
        batch = batch.to(device)
        with autocast_context(precision, device):
            out = model(batch.tokens, state, torch.ones_like(batch.reset) if reset_memory else batch.reset)
        state = out.state
        step_nll.append((token_nll(out.logits, batch.targets) * batch.mask).sum(dim=(1, 2)).double())  # [B]
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
    return {
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


@torch.no_grad()
def measure_footprint(model: MemoryModel, segments: int = 1, batch_size: int = 1) -> int:
    """Numbers a real state holds per sequence after `segments` full segments of one document."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, model.cfg.vocab_size, (batch_size, segments, model.cfg.segment_len), generator=gen)
    state = model(tokens.to(device)).state
    model.train(was_training)
    return state_numbers(state.all(), batch_size)


def gate_values(model: MemoryModel) -> dict[str, list[float]]:
    """Per layer, the per-head gate a memory exposes (`gate_values()`, None if it has none): the
    Infini paper's Figure 3 data."""
    out = {}
    for i, mem in enumerate(model.memories):
        values = mem.gate_values()
        if values is not None:
            out[str(i)] = [float(x) for x in values]
    return out


def precision_columns(cfg: DictConfig, model: MemoryModel) -> dict[str, str]:
    """The precision train.precision resolved to on the model's device, and why (a result row's columns)."""
    choice = precision_choice(cfg.train.precision, next(model.parameters()).device)
    return {"precision": choice.precision, "precision_reason": choice.reason}


def _train_tokens(cfg: DictConfig) -> int:
    """Input bytes the run trained on: windows of the corpus, or (task runs) the expected length
    of the examples, one of task.lengths drawn uniformly per step."""
    tc = cfg.train
    if cfg.task.name == "lm":
        return int(tc.steps * tc.batch_size * tc.window_segments * cfg.model.segment_len)
    return int(tc.steps * tc.batch_size * sum(cfg.task.lengths) / len(cfg.task.lengths))


def write_result(run_dir: Path, cfg: DictConfig, model: MemoryModel, result: dict[str, Any]) -> dict[str, Any]:
    """eval-SPLIT.json (the full evaluation of that split) and result.json (the run's row in a results table)."""
    run_dir = Path(run_dir)
    if result.get("reset_memory"):
        return _write_ablation(run_dir, result)
    (run_dir / f"eval-{result['split']}.json").write_text(json.dumps(result, indent=1))
    mcfg = model_config(cfg)
    spec = get_memory(cfg.memory.name)
    mem_cfg = memory_config(cfg.memory.name, cfg.memory)
    tokens_seen = cfg.eval.max_segments_per_doc * mcfg.segment_len
    metrics_path = run_dir / "metrics.jsonl"
    train_tps = None
    if metrics_path.is_file():
        rows = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]
        tps = [r["tokens_per_s"] for r in rows if "tokens_per_s" in r]
        train_tps = sum(tps) / len(tps) if tps else None
    row = {
        "name": cfg.name,
        "method": cfg.memory.name,
        "seed": int(cfg.seed),
        "params": model.num_parameters(),
        "footprint_analytic": spec.cls.footprint(mem_cfg, mcfg, tokens_seen)["total"],
        "footprint_measured": measure_footprint(model, segments=cfg.eval.max_segments_per_doc),
        "footprint_tokens": tokens_seen,
        f"{result['split']}_bpb": result["bpb"],
        "bpb_by_segment": result["bpb_by_segment"],
        "tokens_by_segment": result["tokens_by_segment"],
        "bits_by_doc": result["bits_by_doc"],
        "tokens_by_doc": result["tokens_by_doc"],
        "backbone_init": cfg.model.init_streams,
        "tokens_per_s": result["tokens_per_s"],
        "train_tokens_per_s": train_tps,
        "peak_rss_mb": result["peak_rss_mb"],
        "train_steps": int(cfg.train.steps),
        "train_tokens": _train_tokens(cfg),
        "task": cfg.task.name,
        **precision_columns(cfg, model),
        "gates": gate_values(model),
    }
    # Merge into an existing row: evaluating another split adds its columns and loses none.
    previous = json.loads((run_dir / "result.json").read_text()) if (run_dir / "result.json").is_file() else {}
    if result["split"] != cfg.eval.split:  # the per-segment and speed columns describe the run's own split
        row = {**row, **{k: previous.get(k, row[k]) for k in ("bpb_by_segment", "tokens_by_segment", "bits_by_doc",
                                                                  "tokens_by_doc", "tokens_per_s")},
               **{f"{result['split']}_{k}": result[k] for k in ("bpb_by_segment", "bits_by_doc", "tokens_by_doc")}}
    return _write_row(run_dir, {**previous, **row})


def _write_row(run_dir: Path, row: dict[str, Any]) -> dict[str, Any]:
    """result.json, written through a temporary file and a rename (a reader never sees half of it)."""
    tmp = run_dir / "result.json.tmp"
    tmp.write_text(json.dumps(row, indent=1))
    tmp.replace(run_dir / "result.json")
    return row


def _write_ablation(run_dir: Path, result: dict[str, Any]) -> dict[str, Any]:
    """The memory ablation's evaluation: eval-SPLIT-reset.json, and its columns merged into the run's
    existing result.json row (SPLIT_bpb_reset, SPLIT_bpb_by_segment_reset), which keep every other column."""
    split, path = result["split"], run_dir / "result.json"
    if not path.is_file():
        raise FileNotFoundError(f"{run_dir} has no result.json: evaluate the run itself before its memory ablation")
    (run_dir / f"eval-{split}-reset.json").write_text(json.dumps(result, indent=1))
    return _write_row(run_dir, {**json.loads(path.read_text()), f"{split}_bpb_reset": result["bpb"],
                                f"{split}_bpb_by_segment_reset": result["bpb_by_segment"]})
