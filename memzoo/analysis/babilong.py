"""BABILong accuracy against length (the `babilong` suite, `memzoo babilong`): how accuracy on
qa1-qa3 questions falls as the facts hide in more background text.

A BABILong table is a results table whose runs carry `babilong_json`: per run, one row per (task,
length, reset) with `accuracy_official` (the authors' scorer), `accuracy_exact`, `label_chance`
(a uniform guess among the task's labels in the input) and `trained_length` (the longest input the
run was fine-tuned on, in bytes). Means and intervals are over seeds (memzoo.analysis.stats:
Student's t, 95%); "reset" is the ablation with the state reset before the question's segment.

    from memzoo.analysis import load_results, babilong_curves, babilong_summary
    df = load_results("results/babilong/results.parquet")
    babilong_curves(df).savefig("babilong.png"); babilong_summary(df)
"""
from __future__ import annotations

import json
from typing import Optional

import numpy as np
import pandas as pd

from memzoo.analysis.palette import colour, legend_order, marker
from memzoo.analysis.stats import t_halfwidth
from memzoo.data.babilong import length_bytes

COLUMNS = ["method", "seed", "task", "length", "length_bytes", "reset_before_question", "status", "accuracy_official",
           "accuracy_exact", "label_chance", "n", "trained_length"]
SUMMARY = ["method", "task", "length", "length_bytes", "runs", "accuracy", "accuracy_ci", "exact", "reset", "reset_ci",
           "label_chance", "trained_length", "within_budget"]


def is_babilong_table(df: pd.DataFrame) -> bool:
    """A results table is a BABILong table when a run carries BABILong rows."""
    return "babilong_json" in df.columns and df["babilong_json"].map(lambda v: isinstance(v, str)).any()


def babilong_table(df: pd.DataFrame, reset: Optional[bool] = False) -> pd.DataFrame:
    """The BABILong rows in long form: one per (run, task, length, reset), with the run's method and
    seed. reset: False (default) the plain rows, True the reset ablation's, None both."""
    rows = []
    for _, r in df.iterrows():
        cell = r.get("babilong_json")
        if not isinstance(cell, str):
            continue
        for item in json.loads(cell):
            if reset is None or bool(item["reset_before_question"]) == reset:
                rows.append({**{k: item.get(k) for k in COLUMNS}, "method": r["method"], "seed": int(r.get("seed", 0)),
                             "length_bytes": length_bytes(str(item["length"]))})
    out = pd.DataFrame(rows, columns=COLUMNS)
    return out.astype({"accuracy_official": float, "accuracy_exact": float, "label_chance": float,
                       "trained_length": float})


def babilong_summary(df: pd.DataFrame) -> pd.DataFrame:
    """Per (method, task, length): runs, official accuracy (mean over seeds, `accuracy_ci` the 95% t
    half-width), exact match, the reset ablation (`reset`, `reset_ci`), the label chance, the longest
    trained length, and `within_budget` (False where a run's row did not finish)."""
    plain, ablated = babilong_table(df, reset=False), babilong_table(df, reset=True)
    keys = ["method", "task", "length", "length_bytes"]
    if plain.empty:
        return pd.DataFrame(columns=SUMMARY)
    out = plain.assign(ok=plain["status"] == "ok").groupby(keys, as_index=False).agg(
        runs=("accuracy_official", "count"), accuracy=("accuracy_official", "mean"),
        accuracy_ci=("accuracy_official", t_halfwidth), exact=("accuracy_exact", "mean"),
        label_chance=("label_chance", "mean"), trained_length=("trained_length", "max"), within_budget=("ok", "all"))
    if not ablated.empty:
        reset = ablated.groupby(keys, as_index=False).agg(reset=("accuracy_official", "mean"),
                                                           reset_ci=("accuracy_official", t_halfwidth))
        out = out.merge(reset, on=keys, how="left")
    out = out.assign(**{c: np.nan for c in ("reset", "reset_ci") if c not in out})
    return out[SUMMARY].sort_values(["task", "method", "length_bytes"]).reset_index(drop=True)


def babilong_curves(df: pd.DataFrame):
    """Official accuracy against the input's length (bytes; evenly spaced, 0 is the facts alone), one
    panel per task, one line per method: the mean over seeds with its 95% t interval; dashed, the
    state reset before the question's segment; grey, the label chance; a dotted vertical line at the
    longest length trained on."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    summary = babilong_summary(df)
    if summary.empty:
        raise ValueError("no BABILong rows in the table (runs with `babilong_json`; memzoo.evaluations.babilong)")
    tasks = sorted(summary["task"].unique())
    fig, axes = plt.subplots(1, len(tasks), figsize=(6.5 * len(tasks), 4.5), squeeze=False)
    methods = sorted(summary["method"].unique())
    colours, markers = {m: colour(m) for m in methods}, {m: marker(m) for m in methods}
    lengths = sorted(summary["length_bytes"].unique())
    where = {n: i for i, n in enumerate(lengths)}  # evenly spaced: the lengths double, and 0 has no log
    for ax, task in zip(axes[0], tasks):
        facet = summary[summary["task"] == task]
        for m in methods:
            sub = facet[facet["method"] == m].sort_values("length_bytes")
            if sub.empty:
                continue
            x = sub["length_bytes"].map(where)
            ax.errorbar(x, sub["accuracy"], yerr=sub["accuracy_ci"].fillna(0), ls="-", marker=markers[m], ms=5,
                        capsize=2, color=colours[m], label=m)
            ablated = sub.dropna(subset=["reset"])  # measured at some lengths only: marked, so a lone point shows
            if not ablated.empty:
                ax.plot(ablated["length_bytes"].map(where), ablated["reset"], "--x", color=colours[m], alpha=0.5, lw=1)
        chance = facet.groupby("length_bytes")["label_chance"].mean()
        ax.plot(chance.index.map(where), chance.to_numpy(), color="grey", lw=2, alpha=0.7)
        trained = facet["trained_length"].dropna()
        if not trained.empty and trained.max() in where:
            ax.axvline(where[trained.max()], color="black", ls=":", lw=1)
        ax.set_xticks(range(len(lengths)), [f"{n:,}" for n in lengths], rotation=30)
        ax.set_ylim(-0.02, 1.02)
        ax.set_xlabel("input length (bytes of facts and background)")
        ax.set_ylabel("accuracy (official scorer); mean, 95% t over seeds")
        ax.set_title(task, fontsize=10)
    handles = [Line2D([], [], color=colours[m], marker=markers[m]) for m in methods]
    handles += [Line2D([], [], color="black", ls="--", marker="x", alpha=0.5), Line2D([], [], color="grey", lw=2),
                Line2D([], [], color="black", ls=":")]
    labels = [*methods, "state reset before the question", "label chance (same samples)", "longest trained length"]
    fig.legend(*legend_order(handles, labels), loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8, frameon=False)
    fig.tight_layout()
    return fig
