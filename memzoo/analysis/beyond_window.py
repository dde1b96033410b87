"""What a memory carries beyond the window (the `lm-window` suite): each variant's paired
difference from the floor on a class of bytes (a copy class or a position band, per document), the
ceiling check, and headroom recovered beside its segment-0 correction.

The floor is the suite's own `local` (with the window when the rows' `attention_span` is W > 0: the
window floor); rows of different spans are never mixed. Differences are paired by seed (95% t
interval, Holm over the variants tested against the floor) and, per document, pooled over seeds (the
same documents for every method: the t interval over documents of each document's mean difference).
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import pandas as pd

from memzoo.analysis.bpb import NO_HEADROOM
from memzoo.analysis.results import bits_after, bpb_over, class_records, doc_bpb, run_bpb, variant_labels
from memzoo.analysis.stats import REFERENCE, RatioEstimate, holm, paired_differences, paired_t, per_seed, ratio_interval

CEILING = "full"
COPY_CLASSES = {"copy_beyond": "beyond-window copyable", "copy_within": "within-window copyable",
                "copy_none": "not copyable"}


def one_span(df: pd.DataFrame) -> int:
    """The rows' attention span, which must be one (a floor with the window is another protocol)."""
    spans = sorted({int(s) for s in df.get("attention_span", pd.Series([0] * len(df))).fillna(0)})
    if len(spans) > 1:
        raise ValueError(f"rows of attention_span {spans} mixed; compare each span with its own floor "
                         "(select df[df.attention_span == W])")
    return spans[0] if spans else 0


def floor_name(df: pd.DataFrame) -> str:
    """How tables name the floor: `local` (segment-local) or the window floor with its span."""
    span = one_span(df)
    return "local" if span == 0 else f"window floor (local, W = {span})"


def class_keys(df: pd.DataFrame) -> list[str]:
    """The per-document class columns the rows carry: copy classes, then position bands in order."""
    keys = [c.removeprefix("bits_by_doc_") for c in df.columns if c.startswith("bits_by_doc_")]
    bands = sorted((k for k in keys if k.startswith("band_")), key=lambda k: int(k[5:].split("-")[0]))
    return [k for k in COPY_CLASSES if k in keys] + bands


def doc_differences(rows: pd.DataFrame, floor: pd.DataFrame, key: str) -> tuple[float, float, int]:
    """(mean, 95% t half-width, documents) of per-document differences from the floor, each document's
    averaged over the seeds both have: a comparison on the same bytes, unit = document."""
    mine = {int(r["seed"]): doc_bpb(r, key) for r in class_records(rows, key)}
    ref = {int(r["seed"]): doc_bpb(r, key) for r in class_records(floor, key)}
    seeds = sorted(set(mine) & set(ref))
    if not seeds:
        return float("nan"), float("nan"), 0
    stacked = np.stack([mine[s] - ref[s] for s in seeds])  # [seeds, docs]
    counted = ~np.isnan(stacked)
    diff = np.where(counted, stacked, 0).sum(0)[counted.any(0)] / counted.sum(0)[counted.any(0)]  # [docs with bytes]
    mean, half, _ = paired_t(diff)
    return mean, half, len(diff)


def class_differences(df: pd.DataFrame, key: str = "copy_beyond") -> pd.DataFrame:
    """Per variant: bits per byte on class `key` (mean over seeds), its difference from the floor paired
    by seed (mean, 95% t half-width, p, Holm over the variants), and per document pooled over seeds."""
    one_span(df)
    data = df.assign(variant=variant_labels(df).to_numpy(), class_bpb=[run_bpb(r, key) for r in class_records(df, key)])
    floor = data[data["method"] == REFERENCE]
    rows = []
    for variant, sub in data.groupby("variant", sort=False):
        own = bool((sub["method"] == REFERENCE).all())
        d = paired_differences(per_seed(sub["class_bpb"], sub["seed"]), per_seed(floor["class_bpb"], floor["seed"]))
        mean, half, p = (0.0, 0.0, float("nan")) if own else paired_t(d)
        dmean, dhalf, docs = (0.0, 0.0, 0) if own else doc_differences(sub, floor, key)
        rows.append({"variant": variant, "method": sub["method"].iloc[0], "runs": len(sub), "class": key,
                     "bpb": float(sub["class_bpb"].mean()), "diff_vs_floor": mean, "ci": half, "p": p,
                     "doc_diff": dmean, "doc_ci": dhalf, "docs": docs})
    out = pd.DataFrame(rows)
    out["sig"] = holm(out["p"].tolist())
    return out


def band_table(df: pd.DataFrame) -> pd.DataFrame:
    """Every position band and copy class, one row per (variant, class): as `class_differences`."""
    return pd.concat([class_differences(df, key) for key in class_keys(df)], ignore_index=True)


def seed_gains(df: pd.DataFrame) -> pd.DataFrame:
    """Per run: bits per byte on segment 0, on segments >= 1 and (where the rows carry copy classes) on
    beyond-window copyable bytes, with its variant label."""
    out = df.assign(variant=variant_labels(df).to_numpy(),
                    after=[b / max(t, 1e-12) for b, t in (bits_after(r, 1) for _, r in df.iterrows())],
                    first=[float(np.asarray(v, float)[0]) for v in df["bpb_by_segment"]])
    if "bits_by_doc_copy_beyond" in df.columns:
        out["beyond"] = [run_bpb(r, "copy_beyond") if isinstance(r["bits_by_doc_copy_beyond"], (list, np.ndarray))
                         else float("nan") for _, r in df.iterrows()]
    return out


def ceiling_check(df: pd.DataFrame, tol: float = 0.01) -> dict[str, object]:
    """Whether `full` bounds the comparison: full - floor at segment 0 (mean, half-width; the target: the
    mean within ±tol and an interval covering 0), and the variants better than full on segments >= 1
    beyond their paired interval."""
    data = seed_gains(df)
    floor, full = data[data["method"] == REFERENCE], data[data["method"] == CEILING]
    seg0 = paired_t(paired_differences(per_seed(full["first"], full["seed"]), per_seed(floor["first"], floor["seed"])))
    beats = []
    for variant, sub in data[~data["method"].isin([REFERENCE, CEILING])].groupby("variant", sort=False):
        mean, half, _ = paired_t(paired_differences(per_seed(sub["after"], sub["seed"]), per_seed(full["after"], full["seed"])))
        if mean == mean and half == half and mean + half < 0:
            beats.append(variant)
    mean, half, _ = seg0
    seg0_holds = bool(abs(mean) <= tol and half == half and abs(mean) <= half)  # within ±tol, interval covers 0
    return {"full_seg0_vs_floor": mean, "full_seg0_ci": half, "seg0_holds": seg0_holds, "better_than_full": beats,
            "holds": seg0_holds and not beats}


def headroom_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per variant: headroom recovered on segments >= 1, (floor - variant) / (floor - full) paired by
    seed with Fieller's 95% interval, beside the segment-0-corrected headroom, where each difference
    has its segment-0 difference taken off first: what the weights' drift from fine-tuning (visible
    before any memory or context is read) would otherwise add to what the memory carries; and, where
    the rows carry copy classes, headroom recovered on beyond-window copyable bytes (`headroom_beyond`:
    the bytes only a memory, or `full`, can copy)."""
    data = seed_gains(df)
    floor, full = data[data["method"] == REFERENCE], data[data["method"] == CEILING]
    if floor.empty or full.empty:
        return pd.DataFrame()
    f_after, f_first = per_seed(floor["after"], floor["seed"]), per_seed(floor["first"], floor["seed"])
    gap = f_after - per_seed(full["after"], full["seed"])
    gap0 = gap - (f_first - per_seed(full["first"], full["seed"]))
    beyond = "beyond" in data.columns and bool(full["beyond"].notna().any())
    if beyond:
        f_beyond = per_seed(floor["beyond"], floor["seed"])
        gap_b = f_beyond - per_seed(full["beyond"], full["seed"])
    rows = []
    for variant, sub in data.groupby("variant", sort=False):
        gain = f_after - per_seed(sub["after"], sub["seed"])
        gain0 = gain - (f_first - per_seed(sub["first"], sub["seed"]))
        seeds = gain.dropna().index.intersection(gap.dropna().index)
        row = {"variant": variant, "method": sub["method"].iloc[0], "runs": len(sub)}
        estimates = [("headroom", gain, gap, seeds), ("headroom_corrected", gain0, gap0, seeds)]
        if beyond:
            gain_b = f_beyond - per_seed(sub["beyond"], sub["seed"])
            estimates.append(("headroom_beyond", gain_b, gap_b, gain_b.dropna().index.intersection(gap_b.dropna().index)))
        for name, g, h, seeds in estimates:
            est = ratio_interval(g[seeds].to_numpy(), h[seeds].to_numpy()) if len(seeds) else None
            if est is not None and est.status != "undefined" and float(h[seeds].mean()) < 0:
                est = RatioEstimate(None, None, None, NO_HEADROOM)  # full above the floor: nothing to recover
            row |= {name: None if est is None else est.value, f"{name}_lo": None if est is None else est.low,
                    f"{name}_hi": None if est is None else est.high, f"{name}_status": "none" if est is None else est.status}
        rows.append(row)
    return pd.DataFrame(rows)


def position_curve(df: pd.DataFrame, variant: Optional[str] = None) -> pd.DataFrame:
    """Bits per byte by within-segment position (segments >= 1), mean over seeds, per variant: long form."""
    data = df.assign(variant=variant_labels(df).to_numpy())
    if variant is not None:
        data = data[data["variant"] == variant]
    rows = [{"variant": v, "position": i, "bpb": float(np.nanmean([r[i] for r in sub["bpb_by_position"]]))}
            for v, sub in data.groupby("variant", sort=False) for i in range(len(sub["bpb_by_position"].iloc[0]))]
    return pd.DataFrame(rows)


def window_summary(df: pd.DataFrame, split: str = "valid") -> pd.DataFrame:
    """The window suite's headline per variant, best on segments >= 1 first: the memory's state numbers
    (the window's own are the backbone's, apart), the paired difference from the floor at segment 0 and
    on segments >= 1 (`sig_after`: Holm over the variants), on beyond-window copyable bytes, what the
    memory buys (its state forgotten before every segment, the window kept, minus read; segments >= 1),
    and headroom recovered raw and segment-0-corrected."""
    data = seed_gains(df)
    reset = f"{split}_bpb_by_segment_reset"
    data["buys"] = [bpb_over(r, 1, column=reset) - r["after"] if isinstance(r.get(reset), (list, tuple, np.ndarray))
                    else float("nan") for _, r in data.iterrows()]
    floor = data[data["method"] == REFERENCE]
    beyond = class_differences(df, "copy_beyond").set_index("variant") if "bits_by_doc_copy_beyond" in df else None
    head = headroom_table(df)
    head = head.set_index("variant") if not head.empty else None
    rows = []
    for variant, sub in data.groupby("variant", sort=False):
        own = bool((sub["method"] == REFERENCE).all())
        row = {"variant": variant, "method": sub["method"].iloc[0], "seeds": sorted(int(s) for s in sub["seed"].unique()),
               "state": int(sub["footprint_measured"].iloc[0]), "bpb_after": float(sub["after"].mean())}
        for name, col in (("seg0", "first"), ("after", "after")):
            d = paired_differences(per_seed(sub[col], sub["seed"]), per_seed(floor[col], floor["seed"]))
            row[f"{name}"], row[f"{name}_ci"], row[f"{name}_p"] = (0.0, 0.0, float("nan")) if own else paired_t(d)
        buys = per_seed(sub["buys"], sub["seed"])
        row["buys"], row["buys_ci"], _ = paired_t(buys.to_numpy()) if len(buys) else (float("nan"),) * 3
        if beyond is not None:
            row["beyond"], row["beyond_ci"] = beyond.loc[variant, "diff_vs_floor"], beyond.loc[variant, "ci"]
        if head is not None:
            row |= {k: head.loc[variant, k] for k in head.columns if k.startswith("headroom")}
        rows.append(row)
    out = pd.DataFrame(rows)
    out["sig_after"] = holm(out["after_p"].tolist())
    return out.sort_values("bpb_after").reset_index(drop=True)


def beyond_window_figure(df: pd.DataFrame):
    """Two panels: (left) each variant's difference from the floor by within-segment position band,
    segments >= 1; (right) its memory's state (log) against its difference from the floor on
    beyond-window copyable bytes, 95% t intervals over seeds. Points of equal state are offset."""
    import matplotlib.pyplot as plt

    from matplotlib.ticker import NullFormatter

    from memzoo.analysis.palette import colour, marker, ordered_legend, spread

    bands = band_table(df)
    measured = bands[bands["diff_vs_floor"].notna()]  # rows without classes (full's borrowed rows) are not drawn
    variants = [v for v in dict.fromkeys(measured["variant"]) if v != REFERENCE]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    band_keys = [k for k in class_keys(df) if k.startswith("band_")]
    for v in variants:
        sub = bands[(bands["variant"] == v) & bands["class"].isin(band_keys)].set_index("class").loc[band_keys]
        left.errorbar(range(len(band_keys)), sub["diff_vs_floor"], yerr=sub["ci"].fillna(0), marker=marker(v),
                      color=colour(v), capsize=3, label=v)
    left.set_xticks(range(len(band_keys)), [k[5:] for k in band_keys])
    left.axhline(0, color="grey", lw=0.8)
    left.set_xlabel("position in the segment (bytes), segments ≥ 1")
    left.set_ylabel(f"bits per byte − {floor_name(df)}")
    summary = window_summary(df).set_index("variant")
    beyond = bands[bands["class"] == "copy_beyond"].set_index("variant")
    states = {v: [float(max(int(summary.loc[v, "state"]), 1))] for v in variants}
    moved = spread(states)  # equal states side by side, none hiding another
    for v in variants:
        half = beyond.loc[v, "ci"]
        right.errorbar(moved[v], [beyond.loc[v, "diff_vs_floor"]], yerr=[half if half == half else 0], marker=marker(v),
                       color=colour(v), capsize=3, ls="none", label=v)
    right.set_xscale("log")
    right.xaxis.set_minor_formatter(NullFormatter())  # decades only: minor labels collide
    right.axhline(0, color="grey", lw=0.8)
    right.set_xlabel("memory state (numbers per sequence, log; equal states offset)")
    right.set_ylabel("− floor, beyond-window copyable bytes")
    right.legend(*ordered_legend(left), fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    return fig


def headroom_figure(df: pd.DataFrame):
    """The headline: each memory's state (log axis) against the headroom it recovers, (floor - memory) /
    (floor - full), with its Fieller 95% interval over seeds; the floor at 0 and the ceiling at 1, the
    Pareto front stepped; left on segments >= 1, right on beyond-window copyable bytes. A memory whose
    interval is unbounded is drawn at its estimate without bars (said in the legend)."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    from memzoo.analysis.capacity import pareto_front
    from memzoo.analysis.palette import colour, marker, ordered_legend, spread

    summary = window_summary(df)
    memories = summary[~summary["method"].isin([REFERENCE, CEILING])].copy()
    memories["state"] = memories["state"].clip(lower=1).astype(float)
    moved = spread({v: [s] for v, s in zip(memories["variant"], memories["state"])})
    panels = [("headroom", "segments ≥ 1")] + ([("headroom_beyond", "beyond-window copyable bytes")]
                                                if "headroom_beyond" in memories.columns else [])
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4), squeeze=False)
    for ax, (name, title) in zip(axes[0], panels):
        for _, r in memories.iterrows():
            v, value = r["variant"], r.get(name)
            if value is None or value != value:
                continue
            bounded = r.get(f"{name}_status") == "bounded"
            err = [[value - r[f"{name}_lo"]], [r[f"{name}_hi"] - value]] if bounded else None
            ax.errorbar(moved[v], [value], yerr=err, marker=marker(v), color=colour(v), capsize=3, ls="none",
                        label=v if bounded else f"{v} (interval unbounded)")
        placed = memories.assign(state=[moved[v][0] for v in memories["variant"]]).dropna(subset=[name])
        front = pareto_front(placed, "state", name)
        if len(front):
            ax.step(front["state"], front[name], where="post", color="black", lw=0.8, alpha=0.6, label="Pareto front")
        ax.axhline(0, color="grey", lw=0.8, ls="--")
        ax.axhline(1, color="grey", lw=0.8, ls=":")
        ax.text(0.99, 0.02, "floor", color="grey", fontsize=7, ha="right", transform=ax.get_yaxis_transform())
        ax.text(0.99, 0.98, "full (ceiling)", color="grey", fontsize=7, ha="right", va="top",
                transform=ax.get_yaxis_transform())
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("memory state (numbers per sequence, log)\nequal states offset side by side")
        ax.set_ylabel("headroom recovered (0 floor, 1 full)")
        ax.set_title(title)
    axes[0][-1].legend(*ordered_legend(axes[0][0]), fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0),
                       frameon=False)  # outside the data: no point hidden under it
    fig.tight_layout()
    return fig
