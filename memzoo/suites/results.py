"""The results table: each finished run's result.json as one row (each evaluation kind's entries as
its registered columns), written atomically as results.parquet and results.csv."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import pandas as pd

from memzoo.runs.disk import atomic_write
from memzoo.training.curriculum import config_matches
from memzoo.diagnose.training_stages import stage_columns
from memzoo.evaluations.registry import table_columns
from memzoo.suites.expansion import RunSpec, grid_columns


def result_row(run_dir: Path, spec_grid: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """A finished run's result.json as a flat table row: each registered evaluation's entry as its columns
    (memzoo.evaluations.registry; bpb by segment as bpb_seg_<i>, the long-range rows as TASK_json)."""
    row = table_columns(json.loads((run_dir / "result.json").read_text()))
    row["run_dir"] = str(run_dir)
    row.update(grid_columns(spec_grid or {}))
    return row


def write_table(root: Path, specs: list[RunSpec]) -> pd.DataFrame:
    """results.parquet (and .csv) from every finished run of the suite, written atomically. A run
    folder trained under another config (a stale one, not yet re-run) gives no row."""
    rows = []
    for s in specs:
        if (s.run_dir / "result.json").is_file() and config_matches(s.run_dir, s.cfg):
            row = result_row(s.run_dir, s.grid)
            row["suite"] = root.name
            # before fine-tuning (what it cost the LM), the answer loss over the stages, the gates before
            pre = Path(s.pretrain.out_dir) / s.pretrain.name if s.pretrain is not None else None
            row.update(stage_columns(pre, [Path(c.out_dir) / c.name for c in [*s.stages, s.cfg]], row))
            rows.append(row)
    df = pd.DataFrame(rows)
    if rows:  # a full disk: one DiskFullError line, the previous tables kept whole (memzoo.runs.disk)
        atomic_write(root / "results.parquet", lambda tmp: df.to_parquet(tmp, index=False), "the results table (results.parquet)")
        lists = [c for c in df.columns if df[c].map(lambda v: isinstance(v, (list, tuple))).any()]
        atomic_write(root / "results.csv", lambda tmp: df.drop(columns=lists).to_csv(tmp, index=False),
                     "the results table (results.csv)")  # per-segment, per-document lists: parquet only
    return df
