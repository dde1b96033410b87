"""A results table as a report prints it: each cell formatted for its column, intervals as
"mean ± half", paired tests as "vs local" / "vs best" cells, and the table as Markdown. Below the
evaluations, so that each evaluation kind prints its own report section (memzoo.evaluations.reporting)."""
from __future__ import annotations

import math
import numbers

import numpy as np
import pandas as pd

# How each column is printed: counts, sizes, bytes and rates as integers with thousands separators;
# learning rates compactly; p-values to two significant digits; everything else (bpb, accuracy) to 3 decimals.
_INTEGER = {"params", "footprint", "footprint_measured", "footprint_analytic", "state", "runs", "n", "seed",
            "peak_rss_mb", "tokens_per_s", "train_tokens_per_s", "length", "pairs", "gap_segments", "d_model",
            "recall_queries", "rows_in_batch", "n_reset", "correct", "heads", "trained_gap", "rewrites", "seeds"}
_INTEGER_PREFIXES = ("rss_mb_", "tokens_per_s_", "grid_", "state_at_", "gap_at_")


def has_columns(df: pd.DataFrame, *columns: str) -> bool:
    """Whether every column is in the table with at least one value."""
    return all(c in df.columns and df[c].notna().any() for c in columns)


def format_value(column: str, value) -> str:
    """One cell as the report prints it (see _INTEGER for which columns are whole numbers)."""
    if value is None or (isinstance(value, numbers.Real) and math.isnan(value)):
        return ""
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    if not isinstance(value, numbers.Real):
        return str(value)
    if column in _INTEGER or column.startswith(_INTEGER_PREFIXES):
        return f"{round(value):,}"
    if column == "lr":
        return f"{value:g}"
    if column.startswith("p_"):
        return f"{value:.2g}"
    return f"{value:,.3f}"


def with_interval(mean: float, half: float) -> str:
    if mean != mean:
        return ""
    return f"{mean:.3f}" if half != half else f"{mean:.3f} ± {half:.3f}"


def versus_cell(diff: float, p: float, sig: bool, own: bool, half: float = float("nan")) -> str:
    """A difference ± its interval's half-width, its p-value, and * when significant after Holm; "ref"
    for the reference itself."""
    if own:
        return "ref"
    if diff != diff:
        return ""
    shown = f"{diff:+.3f}" if half != half else f"{diff:+.3f} ± {half:.3f}"
    return shown if p != p else f"{shown} (p {p:.2g}){' *' if sig else ''}"


def bootstrap_cell(lo: float, hi: float) -> str:
    return "" if lo != lo else f"[{lo:+.3f}, {hi:+.3f}]"


def display(df: pd.DataFrame, intervals: dict[str, tuple[str, str]] | None = None,
            versus: bool = False) -> pd.DataFrame:
    """A table as strings: each `intervals` entry (shown name: (mean column, half-width column)) becomes
    one "mean ± half" column; with `versus`, the diff/p/sig columns against local and the best become
    "vs local" and "vs best"; every other column is formatted by `format_value`."""
    intervals = intervals or {}
    used = {c for pair in intervals.values() for c in pair}
    stat_cols = {f"{k}_vs_{r}" for k in ("diff", "p", "sig", "ci", "n") for r in ("local", "best")} | {"is_best"}
    stat_cols |= {f"boot_{k}_vs_local" for k in ("lo", "hi", "p")}
    out = {}
    for col in df.columns:
        if col in stat_cols:
            continue
        hit = [name for name, (m, _) in intervals.items() if m == col]
        if hit:
            m, h = intervals[hit[0]]
            out[hit[0]] = [with_interval(a, b) for a, b in zip(df[m], df[h])]
        elif col not in used:
            out[col] = [format_value(col, v) for v in df[col]]
    if versus:  # placed right after the (first) interval column they test
        anchor = next(iter(intervals), None)
        cols = list(out)
        at = cols.index(anchor) + 1 if anchor in out else len(cols)
        tests = {}
        for ref in ("local", "best"):
            own = df["method"].eq("local") if ref == "local" else df["is_best"]
            half = df[f"ci_vs_{ref}"] if f"ci_vs_{ref}" in df else [float("nan")] * len(df)
            tests[f"vs {ref}"] = [versus_cell(d, p, bool(s), bool(o), h) for d, p, s, o, h in
                                  zip(df[f"diff_vs_{ref}"], df[f"p_vs_{ref}"], df[f"sig_vs_{ref}"], own, half)]
            if ref == "local" and "boot_lo_vs_local" in df and df["boot_lo_vs_local"].notna().any():
                tests["vs local, bootstrap"] = [bootstrap_cell(lo, hi) for lo, hi in zip(df["boot_lo_vs_local"],
                                                                                 df["boot_hi_vs_local"])]
        out = {**{c: out[c] for c in cols[:at]}, **tests, **{c: out[c] for c in cols[at:]}}
    return pd.DataFrame(out)


def table_md(shown: pd.DataFrame) -> str:
    cols = list(shown.columns)
    lines = ["| " + " | ".join(cols) + " |", "| " + " | ".join("---" for _ in cols) + " |"]
    lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in shown.itertuples(index=False)]
    return "\n".join(lines)
