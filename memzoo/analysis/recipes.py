"""The standard figures, each a function from a results DataFrame to a matplotlib Axes."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import pandas as pd

from memzoo.analysis.capacity import pareto_front
from memzoo.analysis.palette import colour, marker, ordered_legend, style
from memzoo.analysis.stats import (REFERENCE, bootstrap_versus, compare_groups, holm, paired_differences, paired_t, per_seed,
                                   RatioEstimate, ratio_interval, t_errorbar)


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


_COST_COLUMNS = ("params", "footprint_measured", "tokens_per_s", "train_tokens_per_s", "peak_rss_mb")


def summary_table(df: pd.DataFrame, bpb: str = "valid_bpb", paired: bool = True) -> pd.DataFrame:
    """One row per method (and grid point), best first: parameters, footprint, bits per byte as the
    mean over seeds with its 95% t interval (`bpb_ci` = half-width, `bpb_lo`/`bpb_hi`), the
    differences from `local` and from the best with their intervals and tests (`diff_vs_*`,
    `ci_vs_*`, `p_vs_*`, `sig_vs_*`, `n_vs_*`: paired by seed unless paired=False; see
    memzoo.analysis.stats), the per-document paired bootstrap against `local` (`boot_lo_vs_local`,
    `boot_hi_vs_local`, `boot_p_vs_local`, where the rows carry bits_by_doc), throughput and peak
    memory. Columns the table lacks come out NaN."""
    keys = _group_keys(df)
    data = df.assign(**{c: np.nan for c in [bpb, *_COST_COLUMNS] if c not in df.columns})
    stats = compare_groups(data, keys, bpb, higher_is_better=False, paired=paired).rename(
        columns={"n": "runs", "mean": "bpb_mean", "ci": "bpb_ci", "lo": "bpb_lo", "hi": "bpb_hi"})
    stats["runs"] = data.groupby(keys, dropna=False, sort=False)["seed"].count().to_numpy()
    boot = [_bootstrap_vs_local(data, sub, "bits_by_doc", "tokens_by_doc")
            for _, sub in data.groupby(keys, dropna=False, sort=False)]
    stats["boot_lo_vs_local"], stats["boot_hi_vs_local"], stats["boot_p_vs_local"] = zip(*[b[1:] for b in boot])
    cost = data.groupby(keys, dropna=False, sort=False)[list(_COST_COLUMNS)].mean().reset_index(drop=True)
    cost = cost.rename(columns={"footprint_measured": "footprint"})
    out = pd.concat([stats[keys + ["runs"]], cost[["params", "footprint"]],
                     stats.drop(columns=keys + ["runs"]), cost.drop(columns=["params", "footprint"])], axis=1)
    return out.sort_values("bpb_mean").reset_index(drop=True)


def _group_keys(df: pd.DataFrame) -> list[str]:
    return ["method"] + [c for c in df.columns if c.startswith("grid_")]


def _bootstrap_vs_local(df: pd.DataFrame, runs: pd.DataFrame, units: str, weights: str) -> tuple[float, ...]:
    """(observed, lo, hi, p) of `runs` against the `local` runs by the paired bootstrap; NaN for local itself."""
    local = df[df["method"] == REFERENCE]
    if local.empty or (runs["method"] == REFERENCE).all():
        return (float("nan"),) * 4
    return bootstrap_versus(runs, local, units, weights)


def bits_after(row: pd.Series, first: int, last: Optional[int] = None) -> tuple[float, float]:
    """(bits, tokens) of a run's evaluation over segments first..last (inclusive; to the end when last is
    None), token-weighted; equal weights when the row predates tokens_by_segment."""
    bpb = np.asarray(row["bpb_by_segment"], dtype=float)
    tokens = row.get("tokens_by_segment")
    w = np.asarray(tokens, dtype=float) if isinstance(tokens, (list, tuple, np.ndarray)) else np.ones_like(bpb)
    end = None if last is None else last + 1
    return float((bpb[first:end] * w[first:end]).sum()), float(w[first:end].sum())


def bpb_over(row: pd.Series, first: int, last: Optional[int] = None, column: str = "bpb_by_segment") -> float:
    """Token-weighted bits per byte of a run's `column` (by segment) over segments first..last; NaN
    where the range holds no token."""
    bits, tokens = bits_after({"bpb_by_segment": row[column], "tokens_by_segment": row.get("tokens_by_segment")},
                              first, last)
    return bits / tokens if tokens > 0 else float("nan")


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
    keys = _group_keys(df)
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
    paired = summary_table(df, bpb, paired=True).set_index(_group_keys(df))
    unpaired = summary_table(df, bpb, paired=False).set_index(_group_keys(df))
    out = pd.DataFrame({"diff_vs_local": paired["diff_vs_local"], "ci_unpaired": unpaired["ci_vs_local"],
                        "p_unpaired": unpaired["p_vs_local"], "ci_paired": paired["ci_vs_local"],
                        "p_paired": paired["p_vs_local"], "sig_paired": paired["sig_vs_local"]})
    out["ratio"] = out["ci_unpaired"] / out["ci_paired"]
    out = out.reset_index()
    return out[out["method"] != REFERENCE].sort_values("diff_vs_local").reset_index(drop=True)


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


def variant_labels(df: pd.DataFrame) -> pd.Series:
    """Per row, its method and the grid values (`grid_<option>` columns) that differ between that
    method's rows: "infini-delta normalizer=gamma" beside "infini-delta normalizer=paper"; the bare
    method name where its rows share every grid value."""
    grid = [c for c in df.columns if c.startswith("grid_")]
    labels = df["method"].astype(str).copy()
    for method, rows in df.groupby("method", sort=False):
        varying = [c for c in grid if rows[c].astype(str).nunique() > 1]
        if varying:
            labels.loc[rows.index] = [f"{method} " + ", ".join(f"{c[5:]}={r[c]}" for c in varying)
                                      for _, r in rows.iterrows()]
    return labels


def gate_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per-head gate values (sigmoid(β) for Infini; sigmoid(b) for Memorizing) as rows
    (method, variant, state, seed, layer, head, gate), from the `gates_json` (or `gates`) column; `state`
    is the run's measured footprint (a method swept over its memory size has one set of gates per
    size), `variant` its `variant_labels` (grid points of equal state, e.g. two normalisers, apart)."""
    rows = []
    variants = variant_labels(df) if len(df) else pd.Series(dtype=str)
    for i, r in df.iterrows():
        gates = r.get("gates_json", r.get("gates", "{}"))
        gates = json.loads(gates) if isinstance(gates, str) else (gates or {})
        state = r.get("footprint_measured", None)
        for layer, values in gates.items():
            for head, g in enumerate(values):
                rows.append({"method": r["method"], "variant": variants[i], "state": state, "seed": r["seed"],
                             "layer": int(layer), "head": head, "gate": g})
    return pd.DataFrame(rows, columns=["method", "variant", "state", "seed", "layer", "head", "gate"])


def gate_heatmaps(df: pd.DataFrame):
    """The Infini paper's Figure 3: gate per layer and head (0 = local only, 1 = memory only), one
    panel per gated method (first seed). Returns the figure, or None when no run has gates."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    table = gate_table(df)
    if table.empty:
        return None
    panels = list(table.groupby(["variant", "state"], dropna=False, sort=True))
    several = table.groupby("variant")["state"].nunique(dropna=False)
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.2), squeeze=False)
    for ax, ((v, state), sub) in zip(axes[0], panels):
        sub = sub[sub["seed"] == sub["seed"].min()]
        grid = sub.pivot(index="layer", columns="head", values="gate")
        sns.heatmap(grid, vmin=0, vmax=1, cmap="coolwarm", annot=True, fmt=".2f", cbar=False, ax=ax)
        ax.set_title(v if several[v] == 1 else f"{v}, state {int(state):,}")
    fig.tight_layout()
    return fig


LONGRANGE_COLUMNS = ["method", "seed", "task", "length", "depth", "accuracy", "tokens_per_s", "peak_rss_mb", "status"]


def longrange_table(df: pd.DataFrame, task: str = "passkey", reset: Optional[bool] = False) -> pd.DataFrame:
    """Long-range rows (memzoo passkey / recall, suite `longrange` stages) in long form: one row per
    (run, length, depth), from the `passkey_json` / `recall_json` column (or a `passkey` list).
    reset: False (default) the plain rows, True the memory-reset ablation's (`reset_after_key`),
    None both. Each row carries its run's `seed` and `gates_json` (where the run has one); the seed
    that drew the row's prompts is `prompt_seed`."""
    rows = []
    for _, r in df.iterrows():
        cell = r.get(f"{task}_json", r.get(task))
        if cell is None or (isinstance(cell, float) and cell != cell):
            continue
        gates = {"gates_json": r["gates_json"]} if isinstance(r.get("gates_json"), str) else {}
        for item in json.loads(cell) if isinstance(cell, str) else cell:
            if reset is None or bool(item.get("reset_after_key", False)) == reset:
                # the row's own "seed" draws its prompts; the run's seed is what intervals over seeds group by
                prompts = {"prompt_seed": item["seed"]} if "seed" in item else {}
                rows.append({**item, **prompts, "method": r["method"], "seed": r.get("seed", 0), **gates})
    out = pd.DataFrame(rows)
    if out.empty:
        return pd.DataFrame(columns=LONGRANGE_COLUMNS)
    return out[[c for c in LONGRANGE_COLUMNS if c in out.columns] + [c for c in out.columns if c not in LONGRANGE_COLUMNS]]


def length_label(n: int) -> str:
    for unit, size in (("M", 2**20), ("K", 2**10)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return f"{n:,}"


def passkey_heatmaps(df: pd.DataFrame):
    """Passkey accuracy per method: depth (rows) x length (columns), mean over seeds; cells out of
    budget are grey and marked "oob". Returns the figure, or None when no run has passkey rows."""
    import matplotlib.pyplot as plt
    import numpy as np
    import seaborn as sns

    table = longrange_table(df, "passkey")
    if table.empty:
        return None
    methods = sorted(table["method"].unique())
    cols = min(3, len(methods))
    rows_n = -(-len(methods) // cols)
    fig, axes = plt.subplots(rows_n, cols, figsize=(4.2 * cols, 2.6 * rows_n), squeeze=False)
    for ax, m in zip(axes.flat, methods):
        sub = table[table["method"] == m]
        acc = sub.pivot_table(index="depth", columns="length", values="accuracy", aggfunc="mean", dropna=False)
        ok = sub.assign(ok=sub["status"] == "ok").pivot_table(index="depth", columns="length", values="ok", aggfunc="max")
        acc = acc.reindex(index=ok.index, columns=ok.columns)
        within = ok.fillna(False).values.astype(bool)
        values = acc.astype(float).where(within)  # out of budget: a grey cell marked "oob"
        sns.heatmap(values, vmin=0, vmax=1, cmap="viridis", annot=True, fmt=".2f", cbar=False, ax=ax,
                    xticklabels=[length_label(int(c)) for c in acc.columns], yticklabels=[f"{d:g}" for d in acc.index])
        ax.set_facecolor("#cccccc")
        for i, j in zip(*np.nonzero(~within)):
            ax.text(j + 0.5, i + 0.5, "oob", ha="center", va="center", color="#333333")
        ax.set_title(m)
        ax.set_xlabel("prompt length (bytes)")
        ax.set_ylabel("key depth")
    for ax in list(axes.flat)[len(methods):]:
        ax.axis("off")
    fig.tight_layout()
    return fig


def cost_vs_length(df: pd.DataFrame, task: str = "passkey", axes=None):
    """Peak resident memory and streaming throughput against prompt length, one line per method
    (log length axis; rows out of budget are left out). A bounded memory gives flat lines."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    table = longrange_table(df, task)
    table = table[table["status"] == "ok"]
    if table.empty:
        return None
    per_length = table.groupby(["method", "length"], as_index=False)[["peak_rss_mb", "tokens_per_s"]].mean()
    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(11, 4))
    methods = sorted(per_length["method"].unique())
    look = dict(hue="method", style="method", dashes=False, palette={m: colour(m) for m in methods},
                markers={m: marker(m) for m in methods})
    sns.lineplot(data=per_length, x="length", y="peak_rss_mb", **look, ax=axes[0])
    sns.lineplot(data=per_length, x="length", y="tokens_per_s", **look, ax=axes[1], legend=False)
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xlabel("prompt length (bytes, log)")
    axes[0].set_ylabel("peak resident memory (MB)")
    axes[1].set_ylabel("streaming tokens per second")
    axes[0].legend(*ordered_legend(axes[0]), fontsize=8, loc="upper left", bbox_to_anchor=(-0.02, -0.15), ncol=5, frameon=False)  # below the panels
    return axes


def length_cost_table(df: pd.DataFrame, task: str = "passkey", short: int = 32768, long: int = 1048576) -> pd.DataFrame:
    """Per method: peak resident memory and streaming throughput at each length, and the ratios
    long / short (the bounded-memory targets: memory ratio within 1.10, throughput ratio near 1),
    between streams of the same batch size (`ratio_of` names the lengths compared). A length out of
    budget has no numbers."""
    table = longrange_table(df, task)
    if table.empty:
        return pd.DataFrame()
    out = []
    for method, sub in table.groupby("method"):
        row: dict = {"method": method}
        for length, at in sub.groupby("length"):
            ok = at[at["status"] == "ok"]
            label = length_label(int(length))
            row[f"rss_mb_{label}"] = ok["peak_rss_mb"].mean() if len(ok) == len(at) else None
            row[f"tokens_per_s_{label}"] = ok["tokens_per_s"].mean() if len(ok) == len(at) else None
            if task == "passkey":
                row[f"accuracy_{label}"] = ok["accuracy"].mean() if len(ok) == len(at) else None
        # Ratios compare streams of the same batch (rows per batch); when `short` was streamed with
        # another batch, the longest shorter length that matches `long`'s batch stands in for it.
        batch = sub.groupby("length")["rows_in_batch"].max() if "rows_in_batch" in sub else None
        base = short
        if batch is not None and long in batch.index and short in batch.index and batch[short] != batch[long]:
            same = [n for n in batch.index if n < long and batch[n] == batch[long]]
            base = max(same) if same else None
        s, l = (length_label(base) if base else None), length_label(long)
        if s and row.get(f"rss_mb_{s}") and row.get(f"rss_mb_{l}"):
            row["ratio_of"] = f"{l} / {s}"
            row["rss_ratio"] = row[f"rss_mb_{l}"] / row[f"rss_mb_{s}"]
            row["tokens_per_s_ratio"] = row[f"tokens_per_s_{l}"] / row[f"tokens_per_s_{s}"]
        else:
            row["ratio_of"] = row["rss_ratio"] = row["tokens_per_s_ratio"] = None
        out.append(row)
    return pd.DataFrame(out)
