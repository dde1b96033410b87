"""Recall against state size (MQAR across segments, the `capacity` suite), as zoology draws it.

A capacity table has one row per run with `recall_accuracy` (cross-segment queries only),
`recall_chance`, `recall_accuracy_reset` (memory reset before the query segment), `footprint_measured`,
`pairs`, `gap_segments`, `d_model`, `lr`, `seed` and `grid_<option>` columns. A cell is one
(method, memory options, d_model, pairs, gap); its learning rate is the one with the best mean
accuracy over seeds (zoology's best-of), and its statistics are over that learning rate's seeds.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

from memzoo.analysis.palette import colour, legend_order, marker, spread
from memzoo.analysis.stats import REFERENCE, compare_groups, t_halfwidth
from memzoo.analysis.bootstrap import bootstrap_versus

FACETS = ["pairs", "gap_segments"]
REQUIRED = ["method", "seed", "footprint_measured", "pairs", "gap_segments", "recall_accuracy"]


def is_capacity_table(df: pd.DataFrame) -> bool:
    """A results table is a capacity table when it has a `recall_accuracy` column."""
    return "recall_accuracy" in df.columns


def _check(df: pd.DataFrame) -> None:
    missing = [c for c in REQUIRED if c not in df.columns]
    if missing:
        raise KeyError(f"not a capacity table: columns {missing} missing (it has {sorted(df.columns)})")


def cell_keys(df: pd.DataFrame) -> list[str]:
    """The columns that name a cell: method, memory-option grid values, d_model, pairs, gap, state."""
    grid = sorted(c for c in df.columns if c.startswith("grid_"))
    return ["method", *grid, *[c for c in ("d_model",) if c in df.columns], *FACETS, "footprint_measured"]


def best_lr(df: pd.DataFrame, value: str = "recall_accuracy") -> pd.DataFrame:
    """The rows of each cell's best learning rate: the lr whose mean `value` over seeds is highest."""
    _check(df)
    if "lr" not in df.columns:
        return df.reset_index(drop=True)
    keys = cell_keys(df)
    means = df.groupby([*keys, "lr"], dropna=False)[value].mean().reset_index()
    best = means.loc[means.groupby(keys, dropna=False)[value].idxmax(), [*keys, "lr"]]
    return df.merge(best, on=[*keys, "lr"], how="inner").reset_index(drop=True)


def capacity_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per cell (best lr): state, runs, accuracy mean with 95% t interval, the reset ablation and
    chance, and tests within each (pairs, gap) against `local` (all its cells pooled) and against the
    most accurate cell: paired by seed (memzoo.analysis.stats), with the per-example paired bootstrap
    against `local` where the rows carry recall_hits_by_example. Sorted by pairs, gap, method, state."""
    data = best_lr(df)
    data = data.assign(**{c: np.nan for c in ("lr", "recall_accuracy_reset", "recall_chance", "recall_accuracy_within")
                          if c not in data})
    keys = cell_keys(data)
    parts = []
    for _, facet in data.groupby(FACETS, sort=True):
        acc = compare_groups(facet, keys, "recall_accuracy", higher_is_better=True).rename(
            columns={"n": "runs", "mean": "accuracy", "ci": "accuracy_ci"}).drop(columns=["lo", "hi"])
        extra = facet.groupby(keys, dropna=False, sort=False).agg(
            lr=("lr", "first"), reset=("recall_accuracy_reset", "mean"),
            reset_ci=("recall_accuracy_reset", t_halfwidth), chance=("recall_chance", "mean"),
            within=("recall_accuracy_within", "mean")).reset_index(drop=True)
        local = facet[facet["method"] == REFERENCE]
        boot = [bootstrap_versus(cell, local, "recall_hits_by_example", "recall_queries_by_example")
                if not local.empty and not (cell["method"] == REFERENCE).all() else (np.nan,) * 4
                for _, cell in facet.groupby(keys, dropna=False, sort=False)]
        extra["boot_lo_vs_local"], extra["boot_hi_vs_local"], extra["boot_p_vs_local"] = zip(*[b[1:] for b in boot])
        parts.append(pd.concat([acc, extra], axis=1))
    out = pd.concat(parts, ignore_index=True).rename(columns={"footprint_measured": "state"})
    order = ["pairs", "gap_segments", "method", "state"]
    lead = [*order, *[c for c in out.columns if c.startswith("grid_") or c == "d_model"], "lr", "runs",
            "accuracy", "accuracy_ci", "reset", "reset_ci", "chance", "within"]
    out = out[lead + [c for c in out.columns if c not in lead]]
    return out.sort_values(order, kind="stable").reset_index(drop=True)


def capacity_thresholds(df: pd.DataFrame, levels: Sequence[float] = (0.5, 0.9)) -> pd.DataFrame:
    """Per (pairs, gap, method): the smallest measured state at which a cell's mean accuracy over
    seeds (best lr) reaches each level, as an int, or "not reached". Columns `state_at_<level>`."""
    for level in levels:
        if not 0 < level <= 1:
            raise ValueError(f"threshold level {level}: expected an accuracy in (0, 1]")
    cells = capacity_table(df)
    rows = []
    for (pairs, gap, method), sub in cells.groupby(["pairs", "gap_segments", "method"], sort=True):
        row: dict = {"pairs": pairs, "gap_segments": gap, "method": method}
        for level in levels:
            reached = sub.loc[sub["accuracy"] >= level, "state"]
            row[f"state_at_{level:g}"] = int(reached.min()) if len(reached) else "not reached"
        rows.append(row)
    return pd.DataFrame(rows)


def pareto_front(points: pd.DataFrame, x: str = "state", y: str = "accuracy") -> pd.DataFrame:
    """The points no other point beats with less or equal state and higher accuracy, by state."""
    ordered = points.sort_values([x, y], ascending=[True, False])
    keep, best = [], -np.inf
    for i, v in zip(ordered.index, ordered[y]):
        if v > best:
            keep.append(i)
            best = v
    return ordered.loc[keep]


def capacity_curves(df: pd.DataFrame):
    """Accuracy (mean over seeds of the best lr, 95% t interval) against state numbers (log) per
    method; hollow markers: the same model with its memory reset before the query segment; dashed
    grey: `recall_chance`; black steps: the Pareto front. Facets: pairs (rows) x gap (columns)."""
    import matplotlib.pyplot as plt

    cells = capacity_table(df)
    pairs, gaps = sorted(cells["pairs"].unique()), sorted(cells["gap_segments"].unique())
    methods = sorted(cells["method"].unique())
    colours = {m: colour(m) for m in methods}
    fig, axes = plt.subplots(len(pairs), len(gaps), figsize=(4.6 * len(gaps), 3.6 * len(pairs)),
                             sharex=True, sharey=True, squeeze=False)
    for r, p in enumerate(pairs):
        for c, g in enumerate(gaps):
            ax = axes[r][c]
            facet = cells[(cells["pairs"] == p) & (cells["gap_segments"] == g)].assign(
                x=lambda d: d["state"].clip(lower=1))
            at = {m: sorted(facet.loc[facet["method"] == m, "x"].unique()) for m in methods}
            moved = spread(at, factor=1.35, near=1.4)  # methods at about one state side by side, none hiding another
            for m in methods:
                sub = facet[facet["method"] == m].sort_values("x")
                if sub.empty:
                    continue
                sub = sub.assign(x=sub["x"].map(dict(zip(at[m], moved[m]))))
                line = sub.groupby("x", as_index=False)["accuracy"].max()
                ax.plot(line["x"], line["accuracy"], color=colours[m], lw=1, alpha=0.6)
                ax.errorbar(sub["x"], sub["accuracy"], yerr=sub["accuracy_ci"].fillna(0), fmt=marker(m),
                            color=colours[m], ms=6, capsize=3, label=m)
                ax.scatter(sub["x"], sub["reset"], facecolors="none", edgecolors=colours[m], s=40, zorder=3)
            front = pareto_front(facet.assign(state=facet["x"]))
            ax.step(front["state"], front["accuracy"], where="post", color="black", lw=1.2, ls="-", alpha=0.8)
            if facet["chance"].notna().any():
                ax.axhline(facet["chance"].mean(), color="grey", ls="--", lw=1)
            ax.set_xscale("log")
            ax.set_ylim(-0.02, 1.02)
            ax.set_title(f"{p} pairs, {g} segment{'s' if g != 1 else ''} back", fontsize=10)
            if r == len(pairs) - 1:
                ax.set_xlabel("state per sequence (numbers, log; none drawn at 1; equal states side by side)")
            if c == 0:
                ax.set_ylabel("cross-segment recall accuracy")
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], marker=marker(m), ls="", color=colours[m]) for m in methods]
    labels = list(methods)
    handles += [Line2D([], [], marker="o", ls="", mfc="none", mec="black"), Line2D([], [], color="grey", ls="--"),
                Line2D([], [], color="black")]
    labels += ["memory reset before the query", "chance (uniform over stored values)", "Pareto front"]
    fig.legend(*legend_order(handles, labels), loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8, frameon=False)
    fig.tight_layout()
    return fig
