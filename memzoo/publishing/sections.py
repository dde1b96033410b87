"""The report's tables, one function per section: the bits-per-byte summary and its paired gains,
headroom and memory ablation, capacity, distance, passkey, and a section for every registered
evaluation kind without one of its own."""
from __future__ import annotations

import pandas as pd

from memzoo.analysis import (capacity_table, headroom_recovered, is_capacity_table, length_cost_table, longrange_table,
                             memory_ablation, memory_gain, summary_table)
from memzoo.analysis.distance import distance_reach, distance_summary, distance_versus, is_distance_table
from memzoo.analysis.stats import t_halfwidth
from memzoo.evaluations.registry import evaluations
from memzoo.publishing.cells import bootstrap_cell, display, format_value, versus_cell


def streaming_cost(df: pd.DataFrame, lengths: list[int]) -> pd.DataFrame:
    """Peak memory and throughput per length and their ratios (longest against 32K when measured)."""
    short = 32768 if 32768 in lengths else lengths[0]
    table = length_cost_table(df, short=short, long=lengths[-1])
    cost = [c for c in table.columns if c.startswith(("rss_mb_", "tokens_per_s_")) or c.endswith("ratio")]
    return table[["method", *cost, "ratio_of"]]


def passkey_summary(df: pd.DataFrame) -> pd.DataFrame:
    """Per method and length: passkey accuracy averaged over depths (mean over seeds, `accuracy_ci` the
    95% t half-width over seeds), throughput, peak memory, and whether every row was within budget."""
    table = longrange_table(df, "passkey")
    if table.empty:
        return table
    table = table.assign(ok=table["status"] == "ok")
    per_seed = table.groupby(["method", "length", "seed"], as_index=False).agg(
        accuracy=("accuracy", "mean"), tokens_per_s=("tokens_per_s", "mean"), peak_rss_mb=("peak_rss_mb", "mean"),
        within_budget=("ok", "all"))
    out = per_seed.groupby(["method", "length"], as_index=False).agg(
        accuracy=("accuracy", "mean"), accuracy_ci=("accuracy", t_halfwidth), tokens_per_s=("tokens_per_s", "mean"),
        peak_rss_mb=("peak_rss_mb", "mean"), within_budget=("within_budget", "all"))
    return out.astype({"length": int})


def summary_display(df: pd.DataFrame, paired: bool = True) -> pd.DataFrame:
    """The language-model summary as printed: valid bpb as mean ± 95% t interval, differences from local
    and the best with their intervals and tests (paired by seed unless paired=False)."""
    table = summary_table(df, paired=paired).drop(columns=["bpb_lo", "bpb_hi"])
    return display(table, {"valid_bpb": ("bpb_mean", "bpb_ci")}, versus=True)


def gain_display(df: pd.DataFrame) -> pd.DataFrame:
    """Per method: bits per byte over segments >= 1 and the paired differences from local there and
    over the whole document, as printed."""
    table = memory_gain(df)
    if table.empty:
        return table
    out = table[[c for c in table.columns if not c.startswith(("diff_", "ci_", "p_", "n_"))]].copy()
    out["bpb_after"] = [format_value("bpb", v) for v in out["bpb_after"]]
    for name, label in (("after", "vs local, segments >= 1"), ("all", "vs local, whole document")):
        out[label] = [versus_cell(d, p, False, m == "local", h) for d, p, h, m in
                      zip(table[f"diff_{name}_vs_local"], table[f"p_{name}_vs_local"], table[f"ci_{name}_vs_local"],
                          table["method"])]
    return out.rename(columns={"bpb_after": "bpb, segments >= 1"})


def ablation_display(df: pd.DataFrame) -> pd.DataFrame:
    """What each memory buys in its own weights as printed (memory_ablation: reset minus read on segments
    >= 1, mean over seeds ± the 95% t interval, none with one seed)."""
    table = memory_ablation(df)
    return pd.DataFrame({
        "method": table["method"], "seeds": table["seeds"],
        "memory buys (reset - read)": [f"{g:+.3f} ± {c:.3f}" if pd.notna(c) else f"{g:+.3f}"
                                       for g, c in zip(table["memory_gain"], table["ci"])],
    })


def headroom_display(df: pd.DataFrame) -> pd.DataFrame:
    """Headroom recovered per method as printed: the ratio with its Fieller interval (or why there is
    none), beside the segment-0 difference from local."""
    table = headroom_recovered(df)
    if table.empty:
        return table
    def interval(r) -> str:
        if r.headroom_status == "bounded":
            return f"[{r.headroom_lo:+.2f}, {r.headroom_hi:+.2f}]"
        return {"unbounded": "unbounded (full - local not significant)", "undefined": "undefined (full = local)",
                "one seed": "none (one seed)"}.get(r.headroom_status, r.headroom_status)  # else it says why
    return pd.DataFrame({
        "method": table["method"], "runs": table["runs"],
        "headroom recovered": ["undefined" if v is None or pd.isna(v) else f"{v:+.2f}" for v in table["headroom"]],
        "95% interval": [interval(r) for r in table.itertuples()],
        "vs local, segment 0": [f"{d:+.3f} ± {c:.3f}" if pd.notna(c) else f"{d:+.3f}"
                                for d, c in zip(table["diff_seg0_vs_local"], table["ci_seg0_vs_local"])],
    })


def capacity_display(df: pd.DataFrame) -> pd.DataFrame:
    """The capacity cells as printed: accuracy and the reset ablation as mean ± 95% t interval."""
    return display(capacity_table(df), {"accuracy": ("accuracy", "accuracy_ci"), "reset": ("reset", "reset_ci")},
                   versus=True)


def distance_sections(df: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """The distance suite's tables: reach and generalisation per variant, accuracy by gap, and the
    paired comparison of each method's variants (Infini's normalisers) at every gap."""
    reach = distance_reach(df)
    summary = distance_summary(df)
    sections = [("How far each memory carries what it stored: the longest gap up to which mean accuracy stays "
                 ">= 0.9 and >= 0.5, and that gap / the largest trained gap (the generalisation factor)",
                 display(reach)),
                ("Recall accuracy by gap (mean ± 95% t over seeds; reset: the state reset after the last write)",
                 display(summary.drop(columns=["method"]), {"accuracy": ("accuracy", "accuracy_ci"),
                                                             "reset": ("reset", "reset_ci"),
                                                             "stale": ("stale", "stale_ci")}))]
    for method, sub in summary.groupby("method", sort=True):
        variants = sorted(sub["variant"].unique())
        for other in variants[1:]:
            versus = distance_versus(df, other, variants[0])
            shown = versus.assign(diff=[versus_cell(d, p, False, False, h) for d, p, h in
                                        zip(versus["diff"], versus["p"], versus["ci"])],
                                  bootstrap=[bootstrap_cell(lo, hi) for lo, hi in zip(versus["boot_lo"], versus["boot_hi"])])
            sections.append((f"{other} against {variants[0]}: the difference in recall accuracy per gap, paired by "
                             "seed, and the per-example paired bootstrap",
                             display(shown.drop(columns=["ci", "p", "boot_lo", "boot_hi", "boot_p"]))))
    return sections


def console_table(df: pd.DataFrame) -> pd.DataFrame:
    """What `memzoo compare` prints when a suite ends: the distance reach, the capacity cells, or the
    bits-per-byte summary (with 95% intervals over seeds and the tests against local and the best)."""
    if is_distance_table(df):
        return display(distance_reach(df))
    if is_capacity_table(df):
        cols = ["pairs", "gap_segments", "method", "state", "runs", "accuracy", "vs local", "vs best", "reset", "chance",
                "within"]
        return capacity_display(df)[cols]
    return summary_display(df)[["method", "runs", "params", "footprint", "valid_bpb", "vs local", "vs best",
                                "tokens_per_s", "peak_rss_mb"]]


# The evaluation kinds this report has sections of its own for; any other registered kind gets its rows.
OWN_SECTIONS = ("lm", "passkey", "recall", "distance", "babilong")


def registered_sections(df: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """The sections of each registered evaluation (memzoo.evaluations.registry) with rows in the table and
    no section of its own here: the kind's own `section` where it declares one, else its rows per run."""
    sections = []
    for name, evaluation in evaluations().items():
        if name in OWN_SECTIONS or f"{name}_json" not in df.columns:
            continue
        if evaluation.section is not None:
            sections += [(heading, display(table)) for heading, table in evaluation.section(df)]
            continue
        table = longrange_table(df, name, reset=None)
        if not table.empty:
            sections.append((f"Evaluation {name}: its rows per run", display(table)))
    return sections
