"""Copying at distance per method (the `copy-distance` evaluation kind): bits per byte on the second
copy of a chunk written `distance` bytes earlier, against the first copy, per variant and over seeds.
The bridge between the synthetic recall suites and bits per byte: the window floor should copy within
its window and not beyond it, `full` at every distance, and each memory as far as it carries.

    from memzoo.analysis.copy_distance import copy_distance_summary, copy_distance_figure
    copy_distance_summary(df, kind="random")  # one row per variant, one column per distance
"""
from __future__ import annotations

import json

import numpy as np
import pandas as pd

from memzoo.analysis.palette import legend_order, style
from memzoo.analysis.results import variant_labels
from memzoo.analysis.stats import t_halfwidth

COLUMNS = ["method", "variant", "seed", "kind", "distance", "reset_memory", "first_bits", "second_bits"]
KEY = "copy-distance_json"


def is_copy_distance_table(df: pd.DataFrame) -> bool:
    """A results table holds copy-distance rows when a run carries them."""
    return KEY in df.columns and df[KEY].map(lambda v: isinstance(v, str)).any()


def copy_distance_table(df: pd.DataFrame) -> pd.DataFrame:
    """The probe's rows in long form: one per (run, kind, distance, arm), with the run's method,
    variant and seed."""
    variants = variant_labels(df) if len(df) else pd.Series(dtype=str)
    rows = []
    for i, r in df.iterrows():
        cell = r.get(KEY)
        if not isinstance(cell, str):
            continue
        for item in json.loads(cell):
            rows.append({"method": r["method"], "variant": variants[i], "seed": int(r.get("seed", 0)),
                         "kind": item["kind"], "distance": int(item["distance"]),
                         "reset_memory": bool(item.get("reset_memory", False)),
                         "first_bits": float(item["first_bits"]), "second_bits": float(item["second_bits"])})
    return pd.DataFrame(rows, columns=COLUMNS)


def copy_distance_long(df: pd.DataFrame, kind: str = "random", reset_memory: bool = False) -> pd.DataFrame:
    """Per (variant, distance): second- and first-copy bits, mean over seeds, with the second's 95% t
    half-width over seeds (NaN with one seed)."""
    t = copy_distance_table(df)
    t = t[(t["kind"] == kind) & (t["reset_memory"] == reset_memory)]
    out = (t.groupby(["variant", "distance"], sort=False)
           .agg(method=("method", "first"), seeds=("seed", "nunique"), second=("second_bits", "mean"),
                second_ci=("second_bits", t_halfwidth), first=("first_bits", "mean"))
           .reset_index())
    return out.sort_values(["variant", "distance"], kind="stable").reset_index(drop=True)


def copy_distance_summary(df: pd.DataFrame, kind: str = "random", reset_memory: bool = False) -> pd.DataFrame:
    """One row per variant, one column per distance: second-copy bits as "mean ± ci" (mean alone with
    one seed), and the first copy's mean over every distance (what nothing but copying improves on)."""
    long = copy_distance_long(df, kind, reset_memory)
    if long.empty:
        return pd.DataFrame()
    rows = []
    for variant, sub in long.groupby("variant", sort=False):
        row = {"variant": variant, "seeds": int(sub["seeds"].max()), "first copy": f"{sub['first'].mean():.2f}"}
        for _, r in sub.iterrows():
            ci = r["second_ci"]
            row[str(int(r["distance"]))] = f"{r['second']:.2f}" + (f" ± {ci:.2f}" if ci == ci else "")
        rows.append(row)
    return pd.DataFrame(rows)


def copy_reach(df: pd.DataFrame, kind: str = "random", threshold: float = 0.5,
               reset_memory: bool = False) -> pd.Series:
    """Per variant: the largest probed distance up to which every distance's mean second-copy bits
    stay below `threshold` times the first copy's (0 where the shortest already fails)."""
    long = copy_distance_long(df, kind, reset_memory)
    reach = {}
    for variant, sub in long.groupby("variant", sort=False):
        ok = (sub["second"] < threshold * sub["first"]).to_numpy()
        failed = np.flatnonzero(~ok)
        upto = len(ok) if not len(failed) else int(failed[0])
        reach[variant] = int(sub["distance"].iloc[upto - 1]) if upto else 0
    return pd.Series(reach, name="copies_up_to", dtype=int)


def copy_distance_figure(df: pd.DataFrame, window: int = 0):
    """Second-copy bits per byte against distance (log axis), one line per variant with its interval
    over seeds, random chunks left and held-out text right; dotted: the memory ablation's arm where
    measured, and a vertical line at the backbone's window."""
    import matplotlib.pyplot as plt

    if not window and "attention_span" in df.columns:
        window = int(pd.to_numeric(df["attention_span"], errors="coerce").fillna(0).max())
    kinds = [k for k in ("random", "text") if k in set(copy_distance_table(df)["kind"])]
    fig, axes = plt.subplots(1, len(kinds), figsize=(5.5 * len(kinds), 4), squeeze=False, sharey=True)
    for ax, kind in zip(axes[0], kinds):
        plain = copy_distance_long(df, kind)
        reset = copy_distance_long(df, kind, reset_memory=True)
        for variant in plain["variant"].unique():
            sub, (color, mark) = plain[plain["variant"] == variant], style(variant)
            ax.errorbar(sub["distance"], sub["second"], yerr=sub["second_ci"].fillna(0), label=variant,
                        capsize=2, color=color, marker=mark, markersize=4)
            gone = reset[reset["variant"] == variant]
            if len(gone) and variant.split()[0] not in ("local", "full"):
                ax.plot(gone["distance"], gone["second"], linestyle=":", color=color, alpha=0.7)
        ax.plot(plain.groupby("distance")["first"].mean(), color="grey", linestyle="--", label="first copy (mean)")
        if window:
            ax.axvline(window, color="black", linewidth=0.8, alpha=0.5)
        ax.set_xscale("log")
        ax.set_xlabel("distance between the copies (bytes)")
        ax.set_title(f"{kind} chunks")
    axes[0][0].set_ylabel("bits per byte on the second copy")
    handles, labels = axes[0][-1].get_legend_handles_labels()
    axes[0][-1].legend(*legend_order(handles, labels), fontsize=7, loc="best")
    fig.tight_layout()
    return fig


def wrong_matches(row: np.ndarray, distance: int, k: int, chunk_len: int, skip: int = 4) -> dict[int, int]:
    """For each byte p (skip <= p < chunk_len, p >= k) of a probe row's second copy: how many earlier
    places a lookup by the k bytes before it finds that are followed by a wrong byte (a head keyed on k
    bytes alone is misled by each). row: [T] bytes, the second copy starting at `distance`."""
    out: dict[int, int] = {}
    for p in range(max(skip, k), chunk_len):
        target = distance + p  # the byte to predict; its key is the k bytes before it
        key, answer = row[target - k:target], row[target]
        before = np.lib.stride_tricks.sliding_window_view(row[:target], k)  # [target - k + 1, k]
        match = np.all(before == key, axis=1)[:-1]  # the window ending just before byte j = i + k
        out[p] = int(np.sum(match & (row[k:target] != answer)))
    return out
