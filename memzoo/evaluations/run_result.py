"""A run's result files: eval-SPLIT.json, and result.json, its row in a results table (footprints,
bits per byte, speed, peak memory, precision, gates), merged so that a later evaluation adds columns
and loses none. Shared by every evaluation kind that writes a run's row.
"""
from __future__ import annotations

import json
import resource
import sys
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from memzoo.core.config import model_config
from memzoo.core.memory import state_numbers
from memzoo.core.model import MemoryModel
from memzoo.core.plugins import get_memory
from memzoo.core.precision import precision_choice
from memzoo.runs.configure import memory_config
from memzoo.runs.disk import atomic_text, writing


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


def train_tokens(cfg: DictConfig) -> int:
    """Input bytes the run trained on: windows of the corpus, or (task runs) the expected length
    of the examples, one of task.lengths drawn uniformly per step."""
    tc = cfg.train
    if cfg.task.name == "lm":
        return int(tc.steps * tc.batch_size * tc.window_segments * cfg.model.segment_len)
    return int(tc.steps * tc.batch_size * sum(cfg.task.lengths) / len(cfg.task.lengths))


def class_columns(result: dict[str, Any], prefix: str = "", suffix: str = "") -> dict[str, Any]:
    """The evaluation's bits by position and per document by band and copy class as flat row columns
    (`bpb_by_position`, `bits_by_doc_<key>`, `tokens_by_doc_<key>`), named prefix + column + suffix."""
    if "bits_by_doc_class" not in result:  # an evaluation written before these columns existed
        return {}
    cols = {"bpb_by_position": result["bpb_by_position"]}
    cols |= {f"bits_by_doc_{key}": bits for key, bits in result["bits_by_doc_class"].items()}
    cols |= {f"tokens_by_doc_{key}": count for key, count in result["tokens_by_doc_class"].items()}
    return {f"{prefix}{key}{suffix}": value for key, value in cols.items()}


def write_result(run_dir: Path, cfg: DictConfig, model: MemoryModel, result: dict[str, Any]) -> dict[str, Any]:
    """eval-SPLIT.json (the full evaluation of that split) and result.json (the run's row in a results table)."""
    run_dir = Path(run_dir)
    if result.get("reset_memory"):
        return write_ablation(run_dir, result)
    with writing(run_dir, f"the evaluation (eval-{result['split']}.json)"):
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
        "train_tokens": train_tokens(cfg),
        "task": cfg.task.name,
        **precision_columns(cfg, model),
        "gates": gate_values(model),
        "attention_span": int(result.get("attention_span", 0)),
        "copy_k": result.get("copy_k"),
        **class_columns(result),
    }
    # Merge into an existing row: evaluating another split adds its columns and loses none.
    previous = json.loads((run_dir / "result.json").read_text()) if (run_dir / "result.json").is_file() else {}
    if result["split"] != cfg.eval.split:  # the per-segment and speed columns describe the run's own split
        row = {**row, **{k: previous.get(k, row[k]) for k in ("bpb_by_segment", "tokens_by_segment", "bits_by_doc",
                                                                  "tokens_by_doc", "tokens_per_s")},
               **{f"{result['split']}_{k}": result[k] for k in ("bpb_by_segment", "bits_by_doc", "tokens_by_doc")}}
        for key in class_columns(result):  # the run's own split keeps these; the other split's are prefixed
            if key in previous:
                row[key] = previous[key]
            else:
                row.pop(key)
        row |= class_columns(result, prefix=f"{result['split']}_")
    return write_row(run_dir, {**previous, **row})


def write_row(run_dir: Path, row: dict[str, Any]) -> dict[str, Any]:
    """result.json, written through a temporary file and a rename (a reader never sees half of it; a full
    disk is one DiskFullError line, memzoo.runs.disk)."""
    atomic_text(Path(run_dir) / "result.json", json.dumps(row, indent=1), "the result row (result.json)")
    return row


def write_ablation(run_dir: Path, result: dict[str, Any]) -> dict[str, Any]:
    """The memory ablation's evaluation: eval-SPLIT-reset.json, and its columns merged into the run's
    existing result.json row (SPLIT_bpb_reset, SPLIT_bpb_by_segment_reset), which keep every other column."""
    split, path = result["split"], run_dir / "result.json"
    if not path.is_file():
        raise FileNotFoundError(f"{run_dir} has no result.json: evaluate the run itself before its memory ablation")
    with writing(run_dir, f"the evaluation (eval-{split}-reset.json)"):
        (run_dir / f"eval-{split}-reset.json").write_text(json.dumps(result, indent=1))
    return write_row(run_dir, {**json.loads(path.read_text()), f"{split}_bpb_reset": result["bpb"],
                                f"{split}_bpb_by_segment_reset": result["bpb_by_segment"],
                                **class_columns(result, prefix=f"{split}_", suffix="_reset")})
