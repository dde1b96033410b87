"""The figure recipes read a results table as a user would in a notebook."""
from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

from memzoo.analysis import bpb_by_segment, footprint_vs_bpb, load_results, long_by_segment  # noqa: E402


def write_runs(root: Path) -> None:
    rows = [
        ("local", 0, 0, 3.0, [3.1, 3.0, 2.9]),
        ("infini-linear", 0, 16896, 2.8, [3.1, 2.8, 2.5]),
        ("infini-linear", 1, 16896, 2.9, [3.2, 2.9, 2.6]),
    ]
    for i, (m, seed, fp, bpb, by) in enumerate(rows):
        d = root / f"run{i}"
        d.mkdir(parents=True)
        (d / "result.json").write_text(json.dumps(
            {"method": m, "seed": seed, "footprint_measured": fp, "valid_bpb": bpb, "bpb_by_segment": by}))


def test_results_table_and_figures(tmp_path: Path) -> None:
    write_runs(tmp_path)
    df = load_results(tmp_path)
    assert len(df) == 3 and set(df["method"]) == {"local", "infini-linear"}
    long = long_by_segment(df)
    assert len(long) == 9
    sel = long[(long.method == "infini-linear") & (long.segment == 2)]["bpb"]
    assert sorted(sel.tolist()) == [2.5, 2.6]
    ax = footprint_vs_bpb(df)
    assert ax.get_xscale() == "log"
    ax2 = bpb_by_segment(df)
    assert len(ax2.get_lines()) >= 2
