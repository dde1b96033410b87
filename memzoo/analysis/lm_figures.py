"""The bits-per-byte figures, each a function from a results DataFrame to a matplotlib Axes: state
against bits per byte or against the gain, bits per byte by segment, what memory buys, the cost."""
from __future__ import annotations

from typing import Optional

import pandas as pd

from memzoo.analysis.capacity import pareto_front
from memzoo.analysis.palette import colour, marker, ordered_legend, style
from memzoo.analysis.stats import (REFERENCE, t_errorbar)
from memzoo.analysis.bpb import memory_ablation, segment_differences, summary_table
from memzoo.analysis.results import long_by_segment


def footprint_vs_bpb(df: pd.DataFrame, bpb: str = "valid_bpb", ax=None):
    """Footprint (numbers per sequence, log axis) against bits per byte: one point per method, or a
    curve when a grid varies its memory size; error bars are the 95% t interval over seeds (none with
    one seed). Methods with no state are drawn at 1 so the log axis shows them."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    ax = ax or plt.subplots(figsize=(7, 4.5))[1]
    data = df.assign(footprint=df["footprint_measured"].clip(lower=1))
    methods = sorted(data["method"].unique())
    sns.lineplot(data=data, x="footprint", y=bpb, hue="method", style="method", dashes=False, err_style="bars",
                 palette={m: colour(m) for m in methods}, markers={m: marker(m) for m in methods},
                 errorbar=t_errorbar, markersize=8, ax=ax)
    ax.set_xscale("log")
    ax.set_xlabel("state per sequence (numbers, log)")
    ax.set_ylabel(f"{bpb.replace('_', ' ')} (bits per byte; mean, 95% t interval over seeds)")
    ax.legend(*ordered_legend(ax), fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)  # outside the data
    return ax


def bpb_by_segment(df: pd.DataFrame, ax=None, max_segment: Optional[int] = None):
    """Bits per byte by segment index within the document, one line per method with a band of the 95%
    t interval over seeds: does memory help later segments?"""
    import matplotlib.pyplot as plt
    import seaborn as sns

    ax = ax or plt.subplots(figsize=(6, 4))[1]
    data = long_by_segment(df)
    if max_segment is not None:
        data = data[data["segment"] <= max_segment]
    methods = sorted(data["method"].unique())
    sns.lineplot(data=data, x="segment", y="bpb", hue="method", style="method", dashes=False, errorbar=t_errorbar,
                 palette={m: colour(m) for m in methods}, markers={m: marker(m) for m in methods}, ax=ax)
    ax.set_xlabel("segment index within document")
    ax.set_ylabel("bits per byte (mean, 95% t interval)")
    ax.legend(*ordered_legend(ax), fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)  # outside the data
    return ax


def gain_by_segment(df: pd.DataFrame, ax=None):
    """The paired difference from `local` in bits per byte against the segment index, one line per
    method with a band of its 95% paired interval: below 0, the memory helps at that segment."""
    import matplotlib.pyplot as plt

    ax = ax or plt.subplots(figsize=(7, 4.5))[1]
    table = segment_differences(df)
    for method, sub in table.groupby("method", sort=True):
        colour, marker = style(method)
        ax.plot(sub["segment"], sub["diff"], marker=marker, markersize=4, color=colour, label=method)
        ci = sub["ci"].fillna(0.0)
        ax.fill_between(sub["segment"], sub["diff"] - ci, sub["diff"] + ci, color=colour, alpha=0.12)
    ax.axhline(0.0, color="black", lw=0.8)
    ax.set_xlabel("segment index within document")
    ax.set_ylabel("bpb − local's at the same seed (paired; 95% t)")
    ax.legend(*ordered_legend(ax), fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)  # outside the data
    return ax


def footprint_vs_gain(df: pd.DataFrame, bpb: str = "valid_bpb", ax=None):
    """The headline figure: state per sequence (log) against the paired difference from `local` in
    bits per byte with its 95% paired interval. Below the zero line a memory buys something; left is
    cheaper. Methods without state are drawn at 1 so the log axis shows them."""
    import matplotlib.pyplot as plt

    ax = ax or plt.subplots(figsize=(7, 4.5))[1]
    table = summary_table(df, bpb)
    table = table[table["method"] != REFERENCE]
    for _, r in table.iterrows():
        x = max(float(r["footprint"]), 1.0)
        yerr = None if r["ci_vs_local"] != r["ci_vs_local"] else [[r["ci_vs_local"]], [r["ci_vs_local"]]]
        colour, marker = style(r["method"])
        ax.errorbar([x], [r["diff_vs_local"]], yerr=yerr, fmt=marker, color=colour, ms=8, capsize=3,
                    label=r["method"] + ("" if not r.get("sig_vs_local") else " *"))
    ax.axhline(0.0, color="black", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("state per sequence (numbers, log)")
    ax.set_ylabel(f"{bpb.replace('_', ' ')} − local's (paired by seed; 95% t)")
    ax.legend(*ordered_legend(ax), fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False,  # outside the data
              title="* differs from local (Holm)", title_fontsize=8)
    return ax


def memory_vs_state(df: pd.DataFrame, ax=None, split: str = "valid"):
    """What each memory buys in its own weights (bits per byte with the state reset before every segment
    minus with it, segments >= 1; 95% t over seeds) against its state per sequence (log), with the
    Pareto front: up is more bought, left is cheaper."""
    import matplotlib.pyplot as plt

    ax = ax or plt.subplots(figsize=(7, 4.5))[1]
    table = memory_ablation(df, split=split)
    state = df.groupby("method")["footprint_measured"].first()
    table = table[table["method"].map(lambda m: state.get(m, 0) > 0)].reset_index(drop=True)
    for _, r in table.iterrows():
        colour, marker = style(r["method"])
        yerr = None if r["ci"] != r["ci"] else [[r["ci"]], [r["ci"]]]
        ax.errorbar([state[r["method"]]], [r["memory_gain"]], yerr=yerr, fmt=marker, color=colour, ms=8, capsize=3,
                    label=r["method"])
    points = pd.DataFrame({"state": [float(state[m]) for m in table["method"]], "gain": table["memory_gain"]})
    front = pareto_front(points, "state", "gain")
    if len(front) > 1:
        ax.plot(front["state"], front["gain"], color="grey", lw=1, ls="--", label="Pareto front")
    ax.axhline(0.0, color="black", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("state per sequence (numbers, log)")
    ax.set_ylabel("bpb with memory reset − with it (segments ≥ 1)")
    ax.legend(*ordered_legend(ax), fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return ax


def cost_per_method(df: pd.DataFrame, axes=None):
    """Evaluation tokens per second and peak resident memory per method (two bar charts, 95% t interval over seeds)."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(10, 4))
    order = sorted(df["method"].unique())
    palette = {m: colour(m) for m in order}
    for ax, y in zip(axes, ("tokens_per_s", "peak_rss_mb")):
        sns.barplot(data=df, x="method", y=y, hue="method", order=order, palette=palette, legend=False,
                    errorbar=t_errorbar, ax=ax)
    axes[0].set_ylabel("eval tokens per second")
    axes[1].set_ylabel("peak resident memory (MB)")
    for ax in axes:
        ax.tick_params(axis="x", rotation=45)
        ax.set_xlabel("")
    return axes
