"""The language-model evaluation as a registered kind (`memzoo eval RUN_DIR`): bits per byte over a
split's documents, overall and by segment index, with throughput and peak memory
(memzoo.running.evaluate), written into the run's result.json. Training runs it at its end, so a
suite never lists it as a long-range stage; its table columns are bpb by segment and the gates.

`memory-ablation`, the same evaluation with the state reset before every segment, is a suite stage
(`longrange: [{task: memory-ablation}]`), so that a suite measures what each memory buys by itself."""
from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from memzoo.running.evaluations import Command, Evaluation, register_evaluation

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
    from memzoo.running.checkpoints import load_run
    from memzoo.running.evaluate import evaluate_run, write_result

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
    import torch

    from memzoo.running.checkpoints import load_run, run_config
    from memzoo.running.evaluate import evaluate_run, write_result

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


register_evaluation(Evaluation(
    "lm", LmEvalConfig, evaluate_folder,
    Command("evaluate a run folder", _arguments, lambda args: {"split": args.split, "reset_memory": args.reset_memory}, dict, [], "",
            print_rows=_print_rows, name="eval"),
    columns=table_columns, in_suite=False))

register_evaluation(Evaluation("memory-ablation", MemoryAblationConfig, ablate_folder))
