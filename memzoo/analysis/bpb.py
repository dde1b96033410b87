"""Bits per byte against the floor: the summary table, what memory buys after segment 0, the memory
ablation, headroom recovered, differences by segment or range, and what pairing by seed gains."""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import pandas as pd

from memzoo.analysis.stats import (REFERENCE, RatioEstimate, compare_groups, holm, paired_differences, paired_t, per_seed,
                                   ratio_interval)
from memzoo.analysis.bootstrap import bootstrap_versus
from memzoo.analysis.results import bits_after, bpb_over, group_keys, long_by_segment


_COST_COLUMNS = ("params", "footprint_measured", "tokens_per_s", "train_tokens_per_s", "peak_rss_mb")


def summary_table(df: pd.DataFrame, bpb: str = "valid_bpb", paired: bool = True) -> pd.DataFrame:
    """One row per method (and grid point), best first: parameters, footprint, bits per byte as the
    mean over seeds with its 95% t interval (`bpb_ci` = half-width, `bpb_lo`/`bpb_hi`), the
    differences from `local` and from the best with their intervals and tests (`diff_vs_*`,
    `ci_vs_*`, `p_vs_*`, `sig_vs_*`, `n_vs_*`: paired by seed unless paired=False; see
    memzoo.analysis.stats), the per-document paired bootstrap against `local` (`boot_lo_vs_local`,
    `boot_hi_vs_local`, `boot_p_vs_local`, where the rows carry bits_by_doc), throughput and peak
    memory. Columns the table lacks come out NaN."""
    keys = group_keys(df)
    data = df.assign(**{c: np.nan for c in [bpb, *_COST_COLUMNS] if c not in df.columns})
    stats = compare_groups(data, keys, bpb, higher_is_better=False, paired=paired).rename(
        columns={"n": "runs", "mean": "bpb_mean", "ci": "bpb_ci", "lo": "bpb_lo", "hi": "bpb_hi"})
    stats["runs"] = data.groupby(keys, dropna=False, sort=False)["seed"].count().to_numpy()
    boot = [bootstrap_vs_local(data, sub, "bits_by_doc", "tokens_by_doc")
            for _, sub in data.groupby(keys, dropna=False, sort=False)]
    stats["boot_lo_vs_local"], stats["boot_hi_vs_local"], stats["boot_p_vs_local"] = zip(*[b[1:] for b in boot])
    cost = data.groupby(keys, dropna=False, sort=False)[list(_COST_COLUMNS)].mean().reset_index(drop=True)
    cost = cost.rename(columns={"footprint_measured": "footprint"})
    out = pd.concat([stats[keys + ["runs"]], cost[["params", "footprint"]],
                     stats.drop(columns=keys + ["runs"]), cost.drop(columns=["params", "footprint"])], axis=1)
    return out.sort_values("bpb_mean").reset_index(drop=True)


def bootstrap_vs_local(df: pd.DataFrame, runs: pd.DataFrame, units: str, weights: str) -> tuple[float, ...]:
    """(observed, lo, hi, p) of `runs` against the `local` runs by the paired bootstrap; NaN for local itself."""
    local = df[df["method"] == REFERENCE]
    if local.empty or (runs["method"] == REFERENCE).all():
        return (float("nan"),) * 4
    return bootstrap_versus(runs, local, units, weights)


def range_differences(df: pd.DataFrame, ranges: dict[str, tuple[int, Optional[int]]],
                      keys: Sequence[str] = ("method",)) -> pd.DataFrame:
    """Per group of `keys` (method, and e.g. training step) and per named range of segment indices
    (first, last inclusive; last None: to the end): the token-weighted bits per byte over the range and
    its difference from `local` in the same group less method, paired by seed (mean, 95% t half-width,
    p, seeds). Where a method is read past the length it was trained at, compare its ranges."""
    keys = list(keys)
    rest = [k for k in keys if k != "method"]
    rows = []
    for name, (first, last) in ranges.items():
        data = df.assign(bpb_range=[bpb_over(r, first, last) for _, r in df.iterrows()])
        references = data[data["method"] == REFERENCE]
        for key, sub in data.groupby(keys, sort=True):
            row = dict(zip(keys, key if isinstance(key, tuple) else (key,)))
            local = references
            for k in rest:
                local = local[local[k] == row[k]]
            d = paired_differences(per_seed(sub["bpb_range"], sub["seed"]), per_seed(local["bpb_range"], local["seed"]))
            mean, half, p = paired_t(d) if row["method"] != REFERENCE else (0.0, 0.0, float("nan"))
            rows.append({**row, "range": name, "bpb": float(sub["bpb_range"].mean()), "diff_vs_local": mean,
                         "ci": half, "p": p, "seeds": len(d)})
    return pd.DataFrame(rows)


def memory_gain(df: pd.DataFrame, first_segment: int = 1) -> pd.DataFrame:
    """Per method (and grid point): bits per byte over segments >= `first_segment` (where a memory
    can have been read), its paired difference from `local` at each seed with the 95% t interval and
    p-value (`sig_after_vs_local`: significant after Holm over every method's test against local),
    beside the difference over the whole document. A memory can only help after its first segment;
    this is where to look for what it buys."""
    keys = group_keys(df)
    if "bpb_by_segment" not in df.columns:
        return pd.DataFrame()
    data = df[df["bpb_by_segment"].map(lambda v: isinstance(v, (list, tuple, np.ndarray)) and len(v) > first_segment)]
    data = data.assign(bpb_after=[b / max(t, 1e-12) for b, t in (bits_after(r, first_segment) for _, r in data.iterrows())])
    local = data[data["method"] == REFERENCE]
    rows = []
    for key, sub in data.groupby(keys, dropna=False, sort=False):
        row = dict(zip(keys, key if isinstance(key, tuple) else (key,)))
        row["runs"], row["bpb_after"] = len(sub), float(sub["bpb_after"].mean())
        for col, name in (("bpb_after", "after"), ("valid_bpb", "all")):
            if local.empty or row["method"] == REFERENCE or col not in sub:
                mean = half = p = float("nan")
                n = 0
            else:
                d = paired_differences(per_seed(sub[col], sub["seed"]), per_seed(local[col], local["seed"]))
                (mean, half, p), n = paired_t(d), len(d)
            row[f"diff_{name}_vs_local"], row[f"ci_{name}_vs_local"], row[f"p_{name}_vs_local"] = mean, half, p
            row[f"n_{name}_vs_local"] = n
        rows.append(row)
    out = pd.DataFrame(rows)
    if out.empty:
        return out
    out["sig_after_vs_local"] = holm(out["p_after_vs_local"])  # the family: every method against local
    return out.sort_values("diff_after_vs_local", na_position="first").reset_index(drop=True)


def memory_ablation(df: pd.DataFrame, first_segment: int = 1, split: str = "valid") -> pd.DataFrame:
    """Per method: what its memory buys in its own weights, on segments >= `first_segment`: bits per byte
    with the state reset before every segment (`memzoo eval RUN --reset-memory`) minus bits per byte
    with it, per seed, with the 95% t interval over seeds. Positive: reading the memory helps. Unlike a
    difference from `local`, a method whose weights trained worse is not charged for it here."""
    column = f"{split}_bpb_by_segment_reset"
    columns = ["method", "seeds", "memory_gain", "ci", "p"]
    if column not in df.columns:
        return pd.DataFrame(columns=columns)
    data = df[df[column].map(lambda v: isinstance(v, (list, tuple, np.ndarray)) and len(v) > first_segment)]
    gain = [bpb_over(r, first_segment, column=column) - bpb_over(r, first_segment) for _, r in data.iterrows()]
    rows = []
    for method, sub in data.assign(gain=gain).groupby("method", sort=False):
        mean, half, p = paired_t(per_seed(sub["gain"], sub["seed"]).to_numpy())
        rows.append({"method": method, "seeds": int(sub["seed"].nunique()), "memory_gain": mean, "ci": half, "p": p})
    return pd.DataFrame(rows, columns=columns).sort_values("memory_gain", ascending=False).reset_index(drop=True)


CEILING = "full"  # attention over the whole (trained) context: headroom recovered is 1 there


NO_HEADROOM = "no headroom (full above local)"  # headroom_status where the ceiling is worse than the floor


def headroom_recovered(df: pd.DataFrame, first_segment: int = 1) -> pd.DataFrame:
    """Per method: the share of the gap between `local` (0) and `full` (1) that it closes on segments >=
    `first_segment`, (local - method) / (local - full) from per-seed differences paired by seed, with
    Fieller's 95% interval (`headroom_status`: bounded, unbounded, undefined where full equals local,
    NO_HEADROOM where full is above local on average, or one seed), beside the method's segment-0
    difference from local: a gain already there before any memory was read is the mixer's, not the memory's."""
    columns = ["method", "runs", "headroom", "headroom_lo", "headroom_hi", "headroom_status", "diff_seg0_vs_local",
               "ci_seg0_vs_local"]
    if "bpb_by_segment" not in df.columns or not {REFERENCE, CEILING} <= set(df["method"]):
        return pd.DataFrame(columns=columns)
    data = df[df["bpb_by_segment"].map(lambda v: isinstance(v, (list, tuple, np.ndarray)) and len(v) > first_segment)]
    data = data.assign(bpb_after=[b / max(t, 1e-12) for b, t in (bits_after(r, first_segment) for _, r in data.iterrows())],
                       bpb_first=[float(np.asarray(v, dtype=float)[0]) for v in data["bpb_by_segment"]])
    local, full = (data[data["method"] == m] for m in (REFERENCE, CEILING))
    floor = per_seed(local["bpb_after"], local["seed"])
    gap = floor - per_seed(full["bpb_after"], full["seed"])  # local - full per seed
    rows = []
    for method, sub in data.groupby("method", sort=False):
        gain = floor - per_seed(sub["bpb_after"], sub["seed"])  # local - method per seed
        seeds = gain.dropna().index.intersection(gap.dropna().index)
        est = ratio_interval(gain[seeds].to_numpy(), gap[seeds].to_numpy())
        if est.status != "undefined" and len(seeds) and float(gap[seeds].mean()) < 0:
            # full above local on average: no headroom to recover, and the ratio's sign would invert
            est = RatioEstimate(None, None, None, NO_HEADROOM)
        first = paired_differences(per_seed(sub["bpb_first"], sub["seed"]), per_seed(local["bpb_first"], local["seed"]))
        seg0, seg0_ci, _ = paired_t(first) if method != REFERENCE else (0.0, 0.0, float("nan"))
        rows.append({"method": method, "runs": len(sub), "headroom": est.value, "headroom_lo": est.low,
                     "headroom_hi": est.high, "headroom_status": est.status, "diff_seg0_vs_local": seg0,
                     "ci_seg0_vs_local": seg0_ci})
    out = pd.DataFrame(rows, columns=columns)
    return out.sort_values("headroom", ascending=False, na_position="last").reset_index(drop=True)


def segment_differences(df: pd.DataFrame) -> pd.DataFrame:
    """Per method and segment index: the paired difference from `local` in bits per byte at that
    segment (mean over seeds, 95% t half-width `ci`, p-value, seeds paired `n`)."""
    long = long_by_segment(df)
    local = long[long["method"] == REFERENCE]
    rows = []
    for (method, seg), sub in long[long["method"] != REFERENCE].groupby(["method", "segment"], sort=True):
        ref = local[local["segment"] == seg]
        d = paired_differences(per_seed(sub["bpb"], sub["seed"]), per_seed(ref["bpb"], ref["seed"]))
        mean, half, p = paired_t(d)
        rows.append({"method": method, "segment": int(seg), "diff": mean, "ci": half, "p": p, "n": len(d)})
    return pd.DataFrame(rows, columns=["method", "segment", "diff", "ci", "p", "n"])


def pairing_gain(df: pd.DataFrame, bpb: str = "valid_bpb") -> pd.DataFrame:
    """Per method: the difference from `local` with its unpaired (Welch) and paired 95% half-widths
    and their ratio (unpaired / paired): how much the seed's shared noise the pairing removes."""
    paired = summary_table(df, bpb, paired=True).set_index(group_keys(df))
    unpaired = summary_table(df, bpb, paired=False).set_index(group_keys(df))
    out = pd.DataFrame({"diff_vs_local": paired["diff_vs_local"], "ci_unpaired": unpaired["ci_vs_local"],
                        "p_unpaired": unpaired["p_vs_local"], "ci_paired": paired["ci_vs_local"],
                        "p_paired": paired["p_vs_local"], "sig_paired": paired["sig_vs_local"]})
    out["ratio"] = out["ci_unpaired"] / out["ci_paired"]
    out = out.reset_index()
    return out[out["method"] != REFERENCE].sort_values("diff_vs_local").reset_index(drop=True)
