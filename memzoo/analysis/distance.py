"""Recall against distance (the `distance` and `distance-rewrites` suites): how far each memory
carries what it stored, trained through a gap curriculum and streamed to gaps of thousands of
segments (memzoo.evaluations.distance).

A distance table is a results table whose runs carry `distance_json`: per run, one row per (gap,
reset) with `recall_accuracy`, `recall_chance`, with rewrites `recall_stale` and
`recall_stale_chance`, the hits per example, and `trained_gap` (the largest gap the run trained
on). Runs are told apart by `variant` (memzoo.analysis.results.variant_labels: the method, and the
grid values that differ between its runs, e.g. Infini's two normalisers). Means and intervals are
over seeds (memzoo.analysis.stats: Student's t, 95%); differences between two variants are paired
by seed, with the per-example paired bootstrap beside them (every run at a gap is scored on the
same examples).

    from memzoo.analysis import load_results, distance_curves, distance_reach
    df = load_results("results/distance/results.parquet")
    distance_curves(df).savefig("distance.png"); distance_reach(df)
"""
from __future__ import annotations

import json
from typing import Optional, Sequence

import numpy as np
import pandas as pd

from memzoo.analysis.palette import legend_order, style, variant_lines
from memzoo.analysis.results import variant_labels
from memzoo.analysis.stats import paired_differences, paired_t, per_seed, t_halfwidth
from memzoo.analysis.bootstrap import bootstrap_versus

COLUMNS = ["method", "variant", "seed", "rewrites", "trained_gap", "gap_segments", "reset_after_pairs", "status",
           "recall_accuracy", "recall_chance", "recall_stale", "recall_stale_chance", "recall_hits_by_example",
           "recall_queries_by_example"]


def is_distance_table(df: pd.DataFrame) -> bool:
    """A results table is a distance table when a run carries distance rows."""
    return "distance_json" in df.columns and df["distance_json"].map(lambda v: isinstance(v, str)).any()


def distance_table(df: pd.DataFrame, reset: Optional[bool] = False) -> pd.DataFrame:
    """The distance rows in long form: one per (run, gap, reset), with the run's method, variant and
    seed. reset: False (default) the plain rows, True the reset ablation's, None both."""
    variants = variant_labels(df) if len(df) else pd.Series(dtype=str)
    rows = []
    for i, r in df.iterrows():
        cell = r.get("distance_json")
        if not isinstance(cell, str):
            continue
        for item in json.loads(cell):
            if reset is None or bool(item["reset_after_pairs"]) == reset:
                rows.append({**{k: item.get(k) for k in COLUMNS}, "method": r["method"], "variant": variants[i],
                             "seed": int(r.get("seed", 0)), "rewrites": int(item.get("rewrites", 0) or 0)})
    out = pd.DataFrame(rows, columns=COLUMNS)
    return out.astype({"recall_accuracy": float, "recall_chance": float, "recall_stale": float,
                       "recall_stale_chance": float})


def common_gaps_only(df: pd.DataFrame) -> pd.DataFrame:
    """Each run's distance rows cut to the gaps every run of its variant measured (some runs add
    gaps, e.g. 24-48 or 512, that others lack; a mean over fewer seeds would carry a wider interval)."""
    variants = variant_labels(df)
    gaps = {i: {r["gap_segments"] for r in json.loads(j)} for i, j in df["distance_json"].items()}
    common = {v: set.intersection(*(gaps[i] for i in idx)) for v, idx in variants.groupby(variants).groups.items()}
    return df.assign(distance_json=[json.dumps([r for r in json.loads(j) if r["gap_segments"] in common[v]])
                                    for j, v in zip(df["distance_json"], variants)])


def distance_summary(df: pd.DataFrame) -> pd.DataFrame:
    """Per (variant, rewrites, gap): runs, accuracy (mean over seeds, `accuracy_ci` the 95% t
    half-width), the reset ablation (`reset`, `reset_ci`), chance, with rewrites the stale share and
    its chance, the largest trained gap, and `within_budget` (False where any run's row ran out of
    its time or memory budget; the means are then over the runs that finished)."""
    plain, ablated = distance_table(df, reset=False), distance_table(df, reset=True)
    keys = ["method", "variant", "rewrites", "gap_segments"]
    cols = [*keys, "runs", "accuracy", "accuracy_ci", "reset", "reset_ci", "chance", "stale", "stale_ci",
            "stale_chance", "trained_gap", "within_budget"]
    if plain.empty:
        return pd.DataFrame(columns=cols)
    out = plain.assign(ok=plain["status"] == "ok").groupby(keys, as_index=False).agg(
        runs=("recall_accuracy", "count"), accuracy=("recall_accuracy", "mean"),
        accuracy_ci=("recall_accuracy", t_halfwidth), chance=("recall_chance", "mean"),
        stale=("recall_stale", "mean"), stale_ci=("recall_stale", t_halfwidth),
        stale_chance=("recall_stale_chance", "mean"), trained_gap=("trained_gap", "max"), within_budget=("ok", "all"))
    if not ablated.empty:
        reset = ablated.groupby(keys, as_index=False).agg(reset=("recall_accuracy", "mean"),
                                                           reset_ci=("recall_accuracy", t_halfwidth))
        out = out.merge(reset, on=keys, how="left")
    out = out.assign(**{c: np.nan for c in ("reset", "reset_ci") if c not in out})
    return out[cols].astype({"gap_segments": int}).sort_values(["rewrites", "variant", "gap_segments"]).reset_index(drop=True)


def longest_gap(gaps: Sequence[int], accuracy: Sequence[float], level: float) -> int:
    """The longest gap up to which mean accuracy stays >= `level` at every measured gap (sorted by
    gap; a gap not measured, NaN, ends the run); 0 when the shortest gap is already below it."""
    if not 0 < level <= 1:
        raise ValueError(f"accuracy level={level}: expected a number in (0, 1]")
    best = 0
    for gap, acc in sorted(zip(gaps, accuracy)):
        if not acc == acc or acc < level:  # NaN (out of budget) or below the level
            break
        best = int(gap)
    return best


def distance_reach(df: pd.DataFrame, levels: Sequence[float] = (0.9, 0.5)) -> pd.DataFrame:
    """Per (variant, rewrites): the largest trained gap, and for each level the longest gap up to
    which mean accuracy over seeds stays >= level (`gap_at_<level>`, `longest_gap`) and the
    generalisation factor, that gap / the largest trained gap (`factor_at_<level>`); beside them the
    mean accuracy and reset ablation at the largest trained gap and, with rewrites, the stale share there."""
    summary = distance_summary(df)
    rows = []
    for (method, variant, rewrites), sub in summary.groupby(["method", "variant", "rewrites"], sort=True):
        trained = int(sub["trained_gap"].max())
        row: dict = {"method": method, "variant": variant, "rewrites": int(rewrites), "runs": int(sub["runs"].max()),
                     "trained_gap": trained}
        for level in levels:
            gap = longest_gap(sub["gap_segments"], sub["accuracy"], level)
            row[f"gap_at_{level:g}"] = gap
            row[f"factor_at_{level:g}"] = gap / trained if trained else np.nan
        at = sub[sub["gap_segments"] == trained]
        row["accuracy_at_trained"] = float(at["accuracy"].iloc[0]) if len(at) else np.nan
        row["reset_at_trained"] = float(at["reset"].iloc[0]) if len(at) else np.nan
        if rewrites:
            row["stale_at_trained"] = float(at["stale"].iloc[0]) if len(at) else np.nan
        rows.append(row)
    return pd.DataFrame(rows)


def distance_versus(df: pd.DataFrame, variant: str, reference: str, rewrites: Optional[int] = None) -> pd.DataFrame:
    """Per gap: `variant` minus `reference` in recall accuracy, paired by seed (mean of the per-seed
    differences, its 95% t half-width `ci` and paired t-test `p`, `seeds` paired) and the
    per-example paired bootstrap over the examples both scored (`boot_lo`, `boot_hi`, `boot_p`).
    E.g. distance_versus(df, "infini-delta normalizer=gamma", "infini-delta normalizer=paper")."""
    table = distance_table(df, reset=False)
    table = table[table["status"] == "ok"]
    if rewrites is not None:
        table = table[table["rewrites"] == rewrites]
    known = set(table["variant"])
    for name in (variant, reference):
        if name not in known:
            raise KeyError(f"variant {name!r} has no distance rows; variants: {sorted(known)}")
    rows = []
    for (r, gap), sub in table.groupby(["rewrites", "gap_segments"], sort=True):
        a, b = sub[sub["variant"] == variant], sub[sub["variant"] == reference]
        if a.empty or b.empty:
            continue
        diffs = paired_differences(per_seed(a["recall_accuracy"], a["seed"]), per_seed(b["recall_accuracy"], b["seed"]))
        mean, half, p = paired_t(diffs)
        _, lo, hi, boot_p = bootstrap_versus(a, b, "recall_hits_by_example", "recall_queries_by_example")
        rows.append({"rewrites": int(r), "gap_segments": int(gap), "variant": variant, "reference": reference,
                     "diff": mean, "ci": half, "p": p, "seeds": len(diffs), "boot_lo": lo, "boot_hi": hi,
                     "boot_p": boot_p})
    return pd.DataFrame(rows)


def distance_curves(df: pd.DataFrame):
    """Recall accuracy against the gap (segments, log axis), one line per variant: the mean over
    seeds with its 95% t interval (colour and marker: the method's, memzoo.analysis.palette; a second
    variant of a method dashed); thin dots, the same examples with the state reset after the last
    write (the reset ablation); grey, chance (the stored values guessed uniformly, same examples);
    a dotted vertical line at the largest trained gap. One row of panels per number of rewrites;
    with rewrites a second panel shows the stale share (an earlier value of the key) and its chance."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    summary = distance_summary(df)
    if summary.empty:
        raise ValueError("no distance rows in the table (runs with `distance_json`; memzoo.evaluations.distance)")
    rewrites = sorted(summary["rewrites"].unique())
    columns = 2 if any(rewrites) else 1
    fig, axes = plt.subplots(len(rewrites), columns, figsize=(7.5 * columns, 4.8 * len(rewrites)), squeeze=False)
    variants = sorted(summary["variant"].unique())
    styles, lines = {v: style(v) for v in variants}, variant_lines(variants)  # a method's variants: one colour, other lines
    for row, r in enumerate(rewrites):
        facet = summary[summary["rewrites"] == r]
        panels = [("accuracy", "recall accuracy (latest value)" if r else "recall accuracy")]
        panels += [("stale", "stale share (an earlier value of the key)")] if r else []
        for col, (value, ylabel) in enumerate(panels):
            ax = axes[row][col]
            for v in variants:
                sub = facet[facet["variant"] == v].sort_values("gap_segments")
                if sub.empty:
                    continue
                ax.errorbar(sub["gap_segments"], sub[value], yerr=sub[f"{value}_ci"].fillna(0), ls=lines[v],
                            marker=styles[v][1], ms=5, capsize=2, color=styles[v][0], label=v)
                if value == "accuracy" and sub["reset"].notna().any():
                    ax.plot(sub["gap_segments"], sub["reset"], ls=(0, (1, 3)), color=styles[v][0], alpha=0.5, lw=1)
            chance = facet.groupby("gap_segments")["chance" if value == "accuracy" else "stale_chance"].mean()
            ax.plot(chance.index, chance.to_numpy(), color="grey", lw=2, alpha=0.7)
            ax.axvline(facet["trained_gap"].max(), color="black", ls=":", lw=1)
            ax.set_xscale("log", base=2)
            gaps = sorted(facet["gap_segments"].unique())
            ax.set_xticks(gaps, [f"{g:,}" for g in gaps])
            ax.set_ylim(-0.02, 1.02)
            ax.set_xlabel("gap: segments between the last write and the queries (log)")
            ax.set_ylabel(f"{ylabel}; mean, 95% t over seeds")
            ax.set_title(f"{r} rewrite{'s' if r != 1 else ''}" if r else "recall across the gap", fontsize=10)
    handles = [Line2D([], [], color=styles[v][0], marker=styles[v][1], ls=lines[v]) for v in variants]
    handles += [Line2D([], [], color="black", ls=(0, (1, 3)), alpha=0.5), Line2D([], [], color="grey", lw=2),
                Line2D([], [], color="black", ls=":")]
    labels = [*variants, "state reset after the last write", "chance (same examples)", "largest trained gap"]
    fig.legend(*legend_order(handles, labels), loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8, frameon=False)
    fig.tight_layout()
    return fig
