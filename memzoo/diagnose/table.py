"""A measure's result rows appended to its CSV table: the header written once, and a table whose
columns differ refused, naming both (appended under another header, the rows would be misread);
and the command line the distance measures share."""
from __future__ import annotations

import argparse
import csv
from pathlib import Path
from typing import Any


def append_rows(path: Path, rows: list[dict[str, Any]]) -> Path:
    """Append rows (dicts with the same keys) to the CSV at path, creating it and its folder if needed."""
    if not rows:
        return path
    fields = list(rows[0])
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() and path.stat().st_size:
        with path.open(newline="") as f:
            header = next(csv.reader(f), [])
        if header != fields:
            raise ValueError(f"{path} has the columns {header}; these rows have {fields}: write them to another --out")
        mode = "a"
    else:
        mode = "w"
    with path.open(mode, newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        if mode == "w":
            writer.writeheader()
        writer.writerows(rows)
    return path


def runs_parser(doc: str, runs_help: str, trials: int = 32, gaps: str | None = None) -> argparse.ArgumentParser:
    """The command line every distance measure shares: run folders, --trials, --out (the table's
    folder), and --gaps when the measure streams to several gaps (read them with `gap_list`)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    which = f"{runs_help} " if runs_help else ""
    ap.add_argument("runs", nargs="+", help=f"trained {which}run folders of the distance suite (its last stage)")
    if gaps is not None:
        ap.add_argument("--gaps", default=gaps, help="comma-separated gaps in segments")
    ap.add_argument("--trials", type=int, default=trials)
    ap.add_argument("--out", default="results/bench", help="the folder of the CSV table the rows are appended to")
    return ap


def gap_list(text: str) -> list[int]:
    """--gaps "8,64,512" -> [8, 64, 512]; a gap that is no integer is an error naming it."""
    try:
        return [int(g) for g in text.split(",")]
    except ValueError:
        raise ValueError(f"--gaps {text!r}; expected comma-separated integers (segments), e.g. 8,64,512") from None
