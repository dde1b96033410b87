"""Why a memory retrieves or not: the per-run columns a suite's results table gets from its
training stages (memzoo.suites.compare.write_table), beside the long-range rows.

- `valid_bpb_pretrain`, `valid_bpb_ratio`: validation bits per byte before fine-tuning, and
  after / before (the target: within 5%);
- `answer_loss_json`: the task's training loss (bits per byte on the answer bytes) over the
  fine-tuning steps, every stage in order, steps counted from the first fine-tuning step;
- `gates_pretrain_json`: per-head gates before fine-tuning (`gates_json` holds them after).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional


def _result(run_dir: Path) -> Optional[dict[str, Any]]:
    path = run_dir / "result.json"
    return json.loads(path.read_text()) if path.is_file() else None


def answer_loss(stage_dirs: list[Path]) -> list[dict[str, Any]]:
    """[{step, stage, train_bpb}] from the stages' metrics.jsonl, steps cumulative across stages
    (stage 1 = the first fine-tuning stage)."""
    out: list[dict[str, Any]] = []
    offset = 0
    for i, run_dir in enumerate(stage_dirs, start=1):
        path = run_dir / "metrics.jsonl"
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []
        rows = [r for r in rows if "train_bpb" in r]
        # answer_bpb: the answer bytes alone (logged since task.loss=all); train_bpb is that under loss=answer
        out += [{"step": offset + int(r["step"]), "stage": i, "train_bpb": float(r.get("answer_bpb", r["train_bpb"]))}
                for r in rows]
        offset += max((int(r["step"]) for r in rows), default=0)
    return out


def stage_columns(pretrain_dir: Optional[Path], finetune_dirs: list[Path], row: dict[str, Any]) -> dict[str, Any]:
    """The diagnostic columns of a suite run whose last stage's row is `row` (empty without
    fine-tuning stages)."""
    if pretrain_dir is None or not finetune_dirs:
        return {}
    out: dict[str, Any] = {"answer_loss_json": json.dumps(answer_loss(finetune_dirs))}
    pre = _result(pretrain_dir)
    if pre is not None:
        before, after = pre.get("valid_bpb"), row.get("valid_bpb")
        out["valid_bpb_pretrain"] = before
        out["valid_bpb_ratio"] = after / before if before and after is not None else None
        out["gates_pretrain_json"] = json.dumps(pre.get("gates", {}))
    return out
