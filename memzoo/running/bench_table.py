"""A benchmark's result rows appended to its CSV table: the header written once, and a table whose
columns differ refused, naming both (appended under another header, the rows would be misread)."""
from __future__ import annotations

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
