"""memzoo.diagnose.table: append_rows writes one header however many appends, and a table with other
columns is refused with both column lists named, its rows untouched; the measures' shared command line."""
from __future__ import annotations

import csv

import pytest

from memzoo.diagnose.table import append_rows, gap_list, runs_parser


def test_appends_under_one_header_and_refuses_other_columns(tmp_path) -> None:
    path = tmp_path / "sub" / "t.csv"
    append_rows(path, [{"a": 1, "b": 2}])
    append_rows(path, [{"a": 3, "b": 4}, {"a": 5, "b": 6}])
    append_rows(path, [])
    with path.open(newline="") as f:
        assert list(csv.reader(f)) == [["a", "b"], ["1", "2"], ["3", "4"], ["5", "6"]]
    before = path.read_text()
    with pytest.raises(ValueError, match=r"\['a', 'b'\].*\['a', 'c'\]"):
        append_rows(path, [{"a": 7, "c": 8}])
    assert path.read_text() == before


def test_the_shared_command_line_reads_runs_gaps_trials_and_out() -> None:
    args = runs_parser("A measure.\nmore", "ARMT", trials=16, gaps="8,64").parse_args(["r1", "r2", "--gaps", "2,4"])
    assert (args.runs, gap_list(args.gaps), args.trials, args.out) == (["r1", "r2"], [2, 4], 16, "results/bench")
    assert not hasattr(runs_parser("A measure.", "").parse_args(["r"]), "gaps")  # a measure without gaps has no --gaps
    with pytest.raises(ValueError, match=r"--gaps '8,x'; expected comma-separated integers"):
        gap_list("8,x")
