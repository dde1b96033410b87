"""The standard figures, each a function from a results DataFrame to a matplotlib Axes."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

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


def footprint_vs_bpb(df: pd.DataFrame, bpb: str = "valid_bpb", ax=None):
    """Footprint (numbers per sequence, log axis) against bits per byte; one point per method,
    mean and spread over seeds. Methods with no state are drawn at 1 so the log axis shows them."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    ax = ax or plt.subplots(figsize=(6, 4))[1]
    data = df.assign(footprint=df["footprint_measured"].clip(lower=1))
    sns.pointplot(data=data, x="footprint", y=bpb, hue="method", native_scale=True, log_scale=(True, False),
                  errorbar="sd", linestyle="none", markers="o", ax=ax)
    ax.set_xlabel("state per sequence (numbers, log)")
    ax.set_ylabel(f"{bpb.replace('_', ' ')} (bits per byte)")
    return ax


def bpb_by_segment(df: pd.DataFrame, ax=None, max_segment: Optional[int] = None):
    """Bits per byte by segment index within the document, one line per method: does memory help later segments?"""
    import matplotlib.pyplot as plt
    import seaborn as sns

    ax = ax or plt.subplots(figsize=(6, 4))[1]
    data = long_by_segment(df)
    if max_segment is not None:
        data = data[data["segment"] <= max_segment]
    sns.lineplot(data=data, x="segment", y="bpb", hue="method", errorbar="sd", marker="o", ax=ax)
    ax.set_xlabel("segment index within document")
    ax.set_ylabel("bits per byte")
    return ax
