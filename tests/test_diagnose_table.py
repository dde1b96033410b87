"""memzoo.diagnose.table.append_rows: one header however many appends, and a table with other
columns refused with both column lists named, its rows untouched."""
from __future__ import annotations

import csv

import pytest

from memzoo.diagnose.table import append_rows


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
