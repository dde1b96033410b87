"""Reading a results table: every run folder's row, one row per segment, variant labels, and
bits per byte over a range of segments or on a class of bytes."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd



def load_results(path: str | Path) -> pd.DataFrame:
    """A results table: a parquet/CSV file, or every `result.json` found under a folder."""
    path = Path(path)
    if path.suffix == ".parquet":
        return pd.read_parquet(path)
    if path.suffix == ".csv":
        return pd.read_csv(path)
    rows = [json.loads(p.read_text()) | {"run_dir": str(p.parent)} for p in sorted(path.rglob("result.json"))]
    if not rows:
        raise FileNotFoundError(f"no result.json under {path}")
    return pd.DataFrame(rows)


def long_by_segment(df: pd.DataFrame, column: str = "bpb_by_segment") -> pd.DataFrame:
    """One row per (run, segment index) with its bits per byte."""
    out = df[["method", "seed", column]].explode(column).rename(columns={column: "bpb"})
    out["segment"] = out.groupby(level=0).cumcount()
    return out.reset_index(drop=True).astype({"bpb": float})


def group_keys(df: pd.DataFrame) -> list[str]:
    return ["method"] + [c for c in df.columns if c.startswith("grid_")]


def variant_labels(df: pd.DataFrame) -> pd.Series:
    """Per row, its method and the grid values (`grid_<option>` columns) that differ between that
    method's rows: "infini-delta normalizer=gamma" beside "infini-delta normalizer=paper"; the bare
    method name where its rows share every grid value."""
    grid = {c: df[c].tolist() for c in df.columns if c.startswith("grid_")}
    methods = df["method"].astype(str).tolist()
    labels = list(methods)
    for method in dict.fromkeys(methods):
        at = [i for i, m in enumerate(methods) if m == method]
        varying = [c for c, values in grid.items() if len({str(values[i]) for i in at}) > 1]
        for i in at if varying else ():
            labels[i] = f"{method} " + ", ".join(f"{c[5:]}={grid_value(grid[c][i])}" for c in varying)
    return pd.Series(labels, index=df.index, name="method")


def grid_value(value: object) -> str:
    """A grid value as a label shows it: a whole number without its ".0" (a column that also holds
    NaN for other methods' rows reads 33 back as 33.0)."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def bits_after(row: pd.Series, first: int, last: Optional[int] = None) -> tuple[float, float]:
    """(bits, tokens) of a run's evaluation over segments first..last (inclusive; to the end when last is
    None), token-weighted; equal weights when the row predates tokens_by_segment."""
    bpb = np.asarray(row["bpb_by_segment"], dtype=float)
    tokens = row.get("tokens_by_segment")
    w = np.asarray(tokens, dtype=float) if isinstance(tokens, (list, tuple, np.ndarray)) else np.ones_like(bpb)
    end = None if last is None else last + 1
    return float((bpb[first:end] * w[first:end]).sum()), float(w[first:end].sum())


def bpb_over(row: pd.Series, first: int, last: Optional[int] = None, column: str = "bpb_by_segment") -> float:
    """Token-weighted bits per byte of a run's `column` (by segment) over segments first..last; NaN
    where the range holds no token."""
    bits, tokens = bits_after({"bpb_by_segment": row[column], "tokens_by_segment": row.get("tokens_by_segment")},
                              first, last)
    return bits / tokens if tokens > 0 else float("nan")


def class_records(df: pd.DataFrame, key: str) -> list[dict]:
    """Each row's seed, bits and tokens by document on class `key` (not iterrows: a row as a Series
    carries every list column along, which the tables would pay for thousands of times)."""
    columns = ["seed", f"bits_by_doc_{key}", f"tokens_by_doc_{key}"]
    return [dict(zip(columns, values)) for values in zip(*(df[c].tolist() for c in columns))]


def run_bpb(row: pd.Series | dict, key: str) -> float:
    """A run's bits per byte on class `key` over all its documents (NaN where it has no byte)."""
    bits, tokens = np.asarray(row[f"bits_by_doc_{key}"], float), np.asarray(row[f"tokens_by_doc_{key}"], float)
    return float(bits.sum() / tokens.sum()) if tokens.sum() > 0 else float("nan")


def doc_bpb(row: pd.Series | dict, key: str) -> np.ndarray:
    """Per document, bits per byte on class `key` (NaN where the document has none). [docs]"""
    bits, tokens = np.asarray(row[f"bits_by_doc_{key}"], float), np.asarray(row[f"tokens_by_doc_{key}"], float)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(tokens > 0, bits / tokens, np.nan)
