"""The results tables of the README and docs/, as Markdown, from the shipped reference rows
(memzoo.publishing.references): every number a reader sees is computed here, never typed by hand.

Each table has a `seeds` column, so one-seed and three-seed rows are told apart in the row itself,
and at most 8 columns, so it fits the page.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import pandas as pd

from memzoo.analysis import (capacity_table, distance_reach, distance_summary, headroom_recovered, memory_ablation,
                             memory_gain, summary_table, variant_labels)
from memzoo.analysis.beyond_window import band_table, window_summary
from memzoo.analysis.distance import common_gaps_only
from memzoo.analysis.bpb import CEILING, NO_HEADROOM
from memzoo.analysis.stats import REFERENCE
from memzoo.publishing import backbone_cards
from memzoo.publishing.cpu_cost import cpu_cost_md
from memzoo.publishing.formats import MINUS, interval, markdown, seeds_of
from memzoo.publishing.overview import OVERVIEW_SOURCES, overview_table
from memzoo.publishing.references import CEILING_SUITES
from memzoo.publishing.shipped import with_ceiling

DISTANCE_GAPS = (8, 16, 64, 256, 1024, 4096)  # the gaps the distance table shows (segments)


def grid_label(rows: pd.DataFrame) -> str:
    """`method` (option value, ...) from the grid columns its rows set: "`armt` (d_mem 8)"."""
    first = rows.iloc[0]
    opts = [f"{c[5:]} {first[c]:g}" if isinstance(first[c], (int, float, np.number)) else f"{c[5:]} {first[c]}"
            for c in rows.columns if c.startswith("grid_") and first[c] == first[c] and first[c] is not None]
    return f"`{first['method']}`" + (f" ({', '.join(opts)})" if opts else "")


def quick_table(rows: pd.DataFrame) -> str:
    """The main command's table: bits per byte per method, best first, and the paired difference
    from `local` over the whole document and over segments >= 1 (`*`: significant after Holm)."""
    table, after = summary_table(rows), memory_gain(rows).set_index("method")
    out = []
    for _, r in table.iterrows():
        sub = rows[rows["method"] == r["method"]]
        if r["method"] == REFERENCE:
            vs, vs_after = "ref", "ref"
        else:
            vs = interval(r["diff_vs_local"], r["ci_vs_local"], sign=True) + (" *" if r["sig_vs_local"] else "")
            a = after.loc[r["method"]]
            vs_after = interval(a["diff_after_vs_local"], a["ci_after_vs_local"], sign=True)
        out.append([f"`{r['method']}`", seeds_of(sub), f"{int(r['footprint']):,}", interval(r["bpb_mean"], r["bpb_ci"]),
                    vs, vs_after])
    return markdown(["method", "seeds", "state numbers", "valid bits per byte", "vs local (paired)",
                     "vs local, segments ≥ 1"], out, right=[2])


def lm_stream_table(rows: pd.DataFrame) -> str:
    """The bits-per-byte comparison from the shipped backbone: per method, its difference from `local` at
    segment 0 (no memory read yet: the weights') and on segments >= 1, what its memory buys in its own
    weights (the ablation: reset before every segment minus read, segments >= 1) and headroom recovered
    (`*`: the paired difference from `local` on segments >= 1 is significant after Holm over every method)."""
    after, ablation = memory_gain(rows).set_index("method"), memory_ablation(rows).set_index("method")
    head = headroom_recovered(rows).set_index("method")
    out = []
    for method, sub in sorted(rows.groupby("method"), key=lambda kv: after.loc[kv[0], "bpb_after"]):
        local = method == REFERENCE
        seg0 = "ref" if local else interval(head.loc[method, "diff_seg0_vs_local"], head.loc[method, "ci_seg0_vs_local"], sign=True)
        vs = "ref" if local else (interval(after.loc[method, "diff_after_vs_local"], after.loc[method, "ci_after_vs_local"], sign=True)
                                  + (" *" if after.loc[method, "sig_after_vs_local"] else ""))
        gain = "none (no state)" if local else (interval(ablation.loc[method, "memory_gain"], ablation.loc[method, "ci"], sign=True)
                                                 if method in ablation.index else "not measured")
        h = head.loc[method]
        status = h["headroom_status"]
        if status == NO_HEADROOM:  # full above local: no ceiling to recover towards
            recovered = status
        elif method == CEILING:
            recovered = "1 (ceiling)"
        elif status == "bounded":
            recovered = f"{h['headroom']:.2f} [{h['headroom_lo']:.2f}, {h['headroom_hi']:.2f}]".replace("-", MINUS)
        else:  # unbounded, one seed, or undefined (full equal to local)
            recovered = f"{h['headroom']:.2f} ({status})" if pd.notna(h["headroom"]) else status
        out.append([f"`{method}`", seeds_of(sub), f"{int(sub['footprint_measured'].iloc[0]):,}", seg0, vs, gain,
                    "0 (floor)" if local else recovered])
    return markdown(["method", "seeds", "state numbers", "vs local, segment 0", "vs local, segments ≥ 1",
                     "memory buys (reset − read)", "headroom recovered"], out, right=[2])


def capacity_md(rows: pd.DataFrame) -> str:
    """Recall across one segment boundary per method, best first, with the reset ablation and each
    seed's accuracy (`*`: the paired difference from `local` is significant after Holm)."""
    table = capacity_table(rows).sort_values(["accuracy", "state"], ascending=[False, True], kind="stable")
    out = []
    for _, r in table.iterrows():
        sub = rows[(rows["method"] == r["method"]) & (rows["footprint_measured"] == r["state"])].sort_values("seed")
        vs = "ref" if r["method"] == REFERENCE else (
            interval(r["diff_vs_local"], r["ci_vs_local"], sign=True) + (" *" if r["sig_vs_local"] else ""))
        out.append([grid_label(sub), seeds_of(sub), f"{int(r['state']):,}", interval(r["accuracy"], r["accuracy_ci"]),
                    vs, f"{r['reset']:.3f}", " / ".join(f"{a:.2f}" for a in sub["recall_accuracy"])])
    return markdown(["method", "seeds", "state numbers", "recall accuracy", "vs local (paired)", "reset", "per seed"],
                    out, right=[2])


def _distance_rows(rows: pd.DataFrame) -> tuple[pd.DataFrame, pd.Series, pd.DataFrame]:
    data = common_gaps_only(rows)
    return data, variant_labels(data), distance_summary(data)


def distance_md(rows: pd.DataFrame) -> str:
    """Recall (mean over the row's seeds) at each gap, one row per variant, farthest reach first."""
    data, variants, summary = _distance_rows(rows)
    reach = distance_reach(data).set_index("variant")
    order = reach.sort_values(["gap_at_0.5", "gap_at_0.9"], ascending=False, kind="stable").index
    out = []
    for v in order:
        sub, at = data[variants == v], summary[summary["variant"] == v].set_index("gap_segments")
        cells = []
        for g in DISTANCE_GAPS:
            ok = g in at.index and bool(at.loc[g, "within_budget"])
            cells.append(f"{at.loc[g, 'accuracy']:.2f}" if ok else ("over budget" if g in at.index else "–"))
        out.append([f"`{v}` ({int(sub['footprint_measured'].mean()):,})", seeds_of(sub), *cells])
    return markdown(["method (state numbers)", "seeds", *[f"gap {g:,}" for g in DISTANCE_GAPS]], out,
                    right=list(range(2, 2 + len(DISTANCE_GAPS))))


def distance_reach_md(rows: pd.DataFrame) -> str:
    """How far each variant's mean recall stays at or above 0.9 and 0.5, against its trained gap."""
    data, variants, _ = _distance_rows(rows)
    reach = distance_reach(data).sort_values(["gap_at_0.5", "gap_at_0.9"], ascending=False, kind="stable")

    def upto(gap: int, trained: int) -> str:
        return "–" if gap == 0 else f"{gap:,} ({gap / trained:g}×)"

    out = [[f"`{r['variant']}`", seeds_of(data[variants == r["variant"]]), f"{int(r['trained_gap']):,}",
            f"{r['accuracy_at_trained']:.2f}", f"{r['reset_at_trained']:.2f}",
            upto(int(r["gap_at_0.9"]), int(r["trained_gap"])), upto(int(r["gap_at_0.5"]), int(r["trained_gap"]))]
           for _, r in reach.iterrows()]
    return markdown(["method", "seeds", "trained gap", "recall there", "reset there", "≥ 0.9 up to", "≥ 0.5 up to"],
                    out, right=[2, 3, 4])


def ratio_cell(row: pd.Series, name: str) -> str:
    """A headroom estimate as "0.50 [0.41, 0.62]", or its status where the interval is not bounded."""
    status = row.get(f"{name}_status")
    if status == NO_HEADROOM:
        return "none: full above the floor"
    if status == "bounded":
        return f"{row[name]:.2f} [{row[f'{name}_lo']:.2f}, {row[f'{name}_hi']:.2f}]".replace("-", MINUS)
    value = row.get(name)
    return f"{value:.2f} ({status})".replace("-", MINUS) if value is not None and value == value else str(status)


def lm_window_table(rows: pd.DataFrame) -> str:
    """What a memory carries beyond the window: per variant, its memory's state, the paired difference
    from the window floor on segments >= 1 (`*`: after Holm) and on beyond-window copyable bytes (bytes
    whose 9-gram occurred earlier only beyond the window), what the memory buys (its state forgotten
    before every segment, the window kept), and headroom recovered raw and segment-0-corrected."""
    rows = with_ceiling(rows)
    borrowed = rows.loc[rows["method"] == CEILING, "ceiling_from"].iloc[0] if (rows["method"] == CEILING).any() else "own"
    out = []
    for _, r in window_summary(rows).iterrows():
        floor = r["method"] == REFERENCE
        ceiling = r["method"] == CEILING
        after = "ref" if floor else interval(r["after"], r["after_ci"], sign=True) + (" *" if r["sig_after"] else "")
        beyond = "ref" if floor else (interval(r["beyond"], r["beyond_ci"], sign=True) if "beyond" in r else "not measured")
        buys = ("none (no memory)" if floor else "whole document (no window)" if ceiling else
                "not measured" if r["buys"] != r["buys"] else interval(r["buys"], r["buys_ci"], sign=True))
        if floor or ceiling:
            head = "0 (floor)" if floor else f"1 (ceiling); segment 0 {interval(r['seg0'], r['seg0_ci'], sign=True)}"
        else:
            head = f"{ratio_cell(r, 'headroom')}; corrected {ratio_cell(r, 'headroom_corrected')}"
        name = f"`{r['variant']}`" + (f" ({borrowed}'s rows)" if ceiling and borrowed != "own" else "")
        if ceiling and borrowed != "own":
            beyond = "not measured"
        out.append([name, ", ".join(map(str, r["seeds"])), f"{r['state']:,}", after, beyond, buys, head])
    return markdown(["method", "seeds", "memory's state numbers", "vs window floor, segments ≥ 1",
                     "vs window floor, beyond-window copyable", "memory buys (forgotten − read)",
                     "headroom recovered (raw; segment-0-corrected)"], out, right=[2])


def headroom_md(rows: pd.DataFrame) -> str:
    """The headline table: per variant, its memory's state, the paired difference from the floor on
    segments >= 1 (`*`: after Holm) and on beyond-window copyable bytes, and headroom recovered on each
    ((floor - variant) / (floor - full), Fieller 95% over seeds)."""
    out = []
    for _, r in window_summary(with_ceiling(rows)).iterrows():
        floor, ceiling = r["method"] == REFERENCE, r["method"] == CEILING
        after = "ref" if floor else interval(r["after"], r["after_ci"], sign=True) + (" *" if r["sig_after"] else "")
        beyond = "ref" if floor else interval(r["beyond"], r["beyond_ci"], sign=True) if "beyond" in r else "not measured"
        if floor or ceiling:
            head = ["0 (the floor)"] * 2 if floor else ["1 (the ceiling)"] * 2
        else:
            head = [ratio_cell(r, "headroom"), ratio_cell(r, "headroom_beyond") if "headroom_beyond_status" in r else "–"]
        out.append([f"`{r['variant']}`", ", ".join(map(str, r["seeds"])), f"{r['state']:,}", after, beyond, *head])
    return markdown(["method", "seeds", "memory's state numbers", "vs floor, segments ≥ 1",
                     "vs floor, beyond-window copyable", "headroom recovered, segments ≥ 1",
                     "headroom recovered, beyond-window copyable"], out, right=[2])


def lm_window_copy_more(rows: pd.DataFrame) -> str:
    """The rest of the window table for a suite with its own ceiling: segment 0 against the floor (the
    ceiling check), what each memory buys (forgotten - read) and the segment-0-corrected headroom."""
    out = []
    for _, r in window_summary(with_ceiling(rows)).iterrows():
        if r["method"] == REFERENCE:
            continue
        buys = ("whole document (no window)" if r["method"] == CEILING else
                "not measured" if r["buys"] != r["buys"] else interval(r["buys"], r["buys_ci"], sign=True))
        corrected = "1 (the ceiling)" if r["method"] == CEILING else ratio_cell(r, "headroom_corrected")
        out.append([f"`{r['variant']}`", ", ".join(map(str, r["seeds"])), interval(r["seg0"], r["seg0_ci"], sign=True),
                    buys, corrected])
    return markdown(["method", "seeds", "vs floor, segment 0", "memory buys (forgotten − read)",
                     "headroom, segment-0-corrected"], out)


COPY_DISTANCES = (32, 128, 256, 1024, 4000)  # the distances the copy table shows (bytes; the figure has every one)


def copy_distance_md(rows: pd.DataFrame) -> str:
    """Copying at distance per variant: second-copy bits per byte on random chunks by distance (mean ±
    95% t over seeds), and the first copy's mean; then the same with every memory forgotten."""
    from memzoo.analysis.copy_distance import copy_distance_summary, is_copy_distance_table

    if not is_copy_distance_table(rows):
        return "No copy-distance rows are shipped yet.\n"
    parts = []
    for kind, reset, title in (("random", False, "random chunks, state carried"),
                               ("random", True, "random chunks, every memory forgotten before each segment"),
                               ("text", False, "held-out text chunks, state carried")):
        table = copy_distance_summary(rows, kind, reset)
        if table.empty:
            continue
        cols = [c for c in table.columns if c not in ("variant", "seeds", "first copy") and int(c) in COPY_DISTANCES]
        body = [[f"`{r['variant']}`", str(r["seeds"]), r["first copy"], *(r[c] for c in cols)] for _, r in table.iterrows()]
        parts.append(f"*{title}* (bits per byte on the second copy, by distance in bytes):\n\n" +
                     markdown(["method", "seeds", "first copy", *cols], body, right=list(range(2, 3 + len(cols)))))
    return "\n".join(parts)


BANDS = {"band_0-7": "0–7", "band_8-15": "8–15", "band_16-31": "16–31", "band_32-63": "32–63", "band_64-127": "64–127",
         "copy_none": "not copyable"}  # the window table's position bands (bytes into the segment) and copy class


def lm_window_bands(rows: pd.DataFrame) -> str:
    """Where in the segment each variant differs from the window floor: the paired difference by position
    band (segments >= 1) and on bytes no earlier 9-gram lets anyone copy (`*`: after Holm within the band)."""
    table = band_table(rows)
    table = table[(table["method"] != REFERENCE) & table["class"].isin(list(BANDS))]
    labels, out = variant_labels(rows).to_numpy(), []
    for variant, group in table.groupby("variant", sort=False):
        cells = {r["class"]: interval(r["diff_vs_floor"], r["ci"], sign=True) + (" *" if r["sig"] else "")
                 for _, r in group.iterrows()}
        seeds = sorted(rows.loc[labels == variant, "seed"].unique())
        out.append([f"`{variant}`", ", ".join(map(str, seeds)), *(cells.get(c, "–") for c in BANDS)])
    return markdown(["method", "seeds", *(f"bytes {b}" if c.startswith("band") else b for c, b in BANDS.items())], out)


# generated-block name -> (its shipped source, or sources, and the function that writes its table from
# their rows: one source's rows, or source -> rows)
TABLES: dict[str, tuple[str | tuple[str, ...], Callable]] = {
    "overview": (OVERVIEW_SOURCES, overview_table),
    "quick-table": ("quick", quick_table),
    "lm-window-table": ("lm-window", lm_window_table),
    "lm-window-bands": ("lm-window", lm_window_bands),
    **{f"{suite}-{block}": (suite, table) for suite in CEILING_SUITES
       for block, table in (("table", headroom_md), ("more", lm_window_copy_more), ("bands", lm_window_bands),
                            ("copy-distance", copy_distance_md))},
    "lm-stream-table": ("lm-stream", lm_stream_table),
    "lm-stream-sotu-table": ("lm-stream-sotu", lm_stream_table),
    "lm-stream-gpu-table": ("lm-stream-gpu", lm_stream_table),
    "capacity-table": ("capacity-top", capacity_md),
    "distance-table": ("distance", distance_md),
    "distance-reach": ("distance", distance_reach_md),
    "cpu-cost-table": ("cpu-cost", cpu_cost_md),
    "backbone-probe": (backbone_cards.SOURCE, backbone_cards.probe_md),
}
