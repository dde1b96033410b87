"""`memzoo report RESULTS_DIR`: tables and figures from a suite's results.parquet, as a
self-contained report.html (figures embedded) and report.md (figures beside it as PNG files).
The figures and tables come from the recipes in memzoo.analysis, which a notebook can call directly.
A results table with `recall_accuracy` (the `capacity` suite) gets the capacity figure and tables; one
whose runs carry distance rows (the `distance` suites) gets the distance figure and tables instead."""
from __future__ import annotations

import base64
import html
import json
import math
import numbers
from pathlib import Path

import numpy as np
import pandas as pd

from memzoo.analysis import (bpb_by_segment, capacity_curves, capacity_table, capacity_thresholds, cost_per_method,
                             cost_vs_length, footprint_vs_bpb, footprint_vs_gain, gain_by_segment, gate_heatmaps,
                             headroom_recovered, is_capacity_table, length_cost_table, load_results, longrange_table,
                             memory_ablation, memory_gain, passkey_heatmaps, summary_table)
from memzoo.analysis.babilong import babilong_curves, babilong_summary, is_babilong_table
from memzoo.analysis.distance import (distance_curves, distance_reach, distance_summary, distance_versus,
                                      is_distance_table)
from memzoo.analysis.longrange import (PASSKEY_INTERVAL, accuracy_by_key_segment, answer_loss_curves, gate_summary,
                                       lm_before_after, passkey_length_curves, recall_generalisation)
from memzoo.analysis.stats import BOOTSTRAP, INTERVAL, PAIRED_TEST, UNPAIRED_TEST, t_halfwidth
from memzoo.running.evaluations import evaluations
from memzoo.suites.catalog import rounding_sensitive

FIGURES = {
    "gain": "Headline: state (numbers per sequence, log) against the difference from local in valid bits per byte, "
            "paired by seed (95% t interval; below 0 the memory buys something)",
    "gain_segments": "Difference from local in bits per byte by segment index, paired by seed (95% t band)",
    "capacity": "Cross-segment recall accuracy against state numbers (log), per gap and number of pairs",
    "distance": "Recall accuracy against the gap between the last write and the queries (segments, log): mean over "
                "seeds with the 95% t interval; dashed: the state reset after the last write; grey: chance",
    "babilong": "BABILong accuracy (official scorer) against the input's length in bytes, per task: mean over seeds "
                "with the 95% t interval; dashed: the state reset before the question; grey: label chance",
    "footprint": "Footprint (state numbers per sequence, log) against valid bits per byte",
    "segments": "Bits per byte by segment index within the document",
    "cost": "Evaluation throughput and peak resident memory per method",
    "gates": "Per-head gate values per layer (0 = local attention only, 1 = memory only)",
    "passkey": "Passkey accuracy by prompt length and key depth (oob: out of the time or memory budget)",
    "passkey_length": "Passkey accuracy against prompt length, depths pooled (95% Wilson interval over the pooled keys; "
                      "dashed: the memory reset after the key's segment)",
    "answer_loss": "Answer loss (bits per byte) over the fine-tuning steps, one line per run; dotted lines: curriculum stages",
    "length_cost": "Peak resident memory and streaming throughput against prompt length (passkey streams)",
}

# How each column is printed: counts, sizes, bytes and rates as integers with thousands separators;
# learning rates compactly; p-values to two significant digits; everything else (bpb, accuracy) to 3 decimals.
_INTEGER = {"params", "footprint", "footprint_measured", "footprint_analytic", "state", "runs", "n", "seed",
            "peak_rss_mb", "tokens_per_s", "train_tokens_per_s", "length", "pairs", "gap_segments", "d_model",
            "recall_queries", "rows_in_batch", "n_reset", "correct", "heads", "trained_gap", "rewrites", "seeds"}
_INTEGER_PREFIXES = ("rss_mb_", "tokens_per_s_", "grid_", "state_at_", "gap_at_")


def format_value(column: str, value) -> str:
    """One cell as the report prints it (see _INTEGER for which columns are whole numbers)."""
    if value is None or (isinstance(value, numbers.Real) and math.isnan(value)):
        return ""
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    if not isinstance(value, numbers.Real):
        return str(value)
    if column in _INTEGER or column.startswith(_INTEGER_PREFIXES):
        return f"{round(value):,}"
    if column == "lr":
        return f"{value:g}"
    if column.startswith("p_"):
        return f"{value:.2g}"
    return f"{value:,.3f}"


def _with_interval(mean: float, half: float) -> str:
    if mean != mean:
        return ""
    return f"{mean:.3f}" if half != half else f"{mean:.3f} ± {half:.3f}"


def _versus(diff: float, p: float, sig: bool, own: bool, half: float = float("nan")) -> str:
    """A difference ± its interval's half-width, its p-value, and * when significant after Holm; "ref"
    for the reference itself."""
    if own:
        return "ref"
    if diff != diff:
        return ""
    shown = f"{diff:+.3f}" if half != half else f"{diff:+.3f} ± {half:.3f}"
    return shown if p != p else f"{shown} (p {p:.2g}){' *' if sig else ''}"


def _boot(lo: float, hi: float) -> str:
    return "" if lo != lo else f"[{lo:+.3f}, {hi:+.3f}]"


def display(df: pd.DataFrame, intervals: dict[str, tuple[str, str]] | None = None,
            versus: bool = False) -> pd.DataFrame:
    """A table as strings: each `intervals` entry (shown name: (mean column, half-width column)) becomes
    one "mean ± half" column; with `versus`, the diff/p/sig columns against local and the best become
    "vs local" and "vs best"; every other column is formatted by `format_value`."""
    intervals = intervals or {}
    used = {c for pair in intervals.values() for c in pair}
    stat_cols = {f"{k}_vs_{r}" for k in ("diff", "p", "sig", "ci", "n") for r in ("local", "best")} | {"is_best"}
    stat_cols |= {f"boot_{k}_vs_local" for k in ("lo", "hi", "p")}
    out = {}
    for col in df.columns:
        if col in stat_cols:
            continue
        hit = [name for name, (m, _) in intervals.items() if m == col]
        if hit:
            m, h = intervals[hit[0]]
            out[hit[0]] = [_with_interval(a, b) for a, b in zip(df[m], df[h])]
        elif col not in used:
            out[col] = [format_value(col, v) for v in df[col]]
    if versus:  # placed right after the (first) interval column they test
        anchor = next(iter(intervals), None)
        cols = list(out)
        at = cols.index(anchor) + 1 if anchor in out else len(cols)
        tests = {}
        for ref in ("local", "best"):
            own = df["method"].eq("local") if ref == "local" else df["is_best"]
            half = df[f"ci_vs_{ref}"] if f"ci_vs_{ref}" in df else [float("nan")] * len(df)
            tests[f"vs {ref}"] = [_versus(d, p, bool(s), bool(o), h) for d, p, s, o, h in
                                  zip(df[f"diff_vs_{ref}"], df[f"p_vs_{ref}"], df[f"sig_vs_{ref}"], own, half)]
            if ref == "local" and "boot_lo_vs_local" in df and df["boot_lo_vs_local"].notna().any():
                tests["vs local, bootstrap"] = [_boot(lo, hi) for lo, hi in zip(df["boot_lo_vs_local"],
                                                                                 df["boot_hi_vs_local"])]
        out = {**{c: out[c] for c in cols[:at]}, **tests, **{c: out[c] for c in cols[at:]}}
    return pd.DataFrame(out)


def table_md(shown: pd.DataFrame) -> str:
    cols = list(shown.columns)
    lines = ["| " + " | ".join(cols) + " |", "| " + " | ".join("---" for _ in cols) + " |"]
    lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in shown.itertuples(index=False)]
    return "\n".join(lines)


def _save(fig, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def _has(df: pd.DataFrame, *columns: str) -> bool:
    return all(c in df.columns and df[c].notna().any() for c in columns)


def draw_figures(df: pd.DataFrame, out: Path) -> dict[str, Path]:
    """Every standard figure that the table has data for, as PNG files in `out`."""
    import matplotlib

    matplotlib.use("Agg")
    paths: dict[str, Path] = {}
    if _has(df, "valid_bpb", "footprint_measured") and (df["method"] == "local").any() and df["method"].nunique() > 1:
        _save(footprint_vs_gain(df).figure, paths.setdefault("gain", out / "footprint_vs_gain.png"))
    if _has(df, "bpb_by_segment") and (df["method"] == "local").any() and df["method"].nunique() > 1:
        _save(gain_by_segment(df).figure, paths.setdefault("gain_segments", out / "gain_by_segment.png"))
    if is_distance_table(df):
        _save(distance_curves(df), paths.setdefault("distance", out / "distance.png"))
    elif is_capacity_table(df):
        _save(capacity_curves(df), paths.setdefault("capacity", out / "capacity.png"))
    if is_babilong_table(df):
        _save(babilong_curves(df), paths.setdefault("babilong", out / "babilong.png"))
    if _has(df, "valid_bpb", "footprint_measured"):
        ax = footprint_vs_bpb(df)
        _save(ax.figure, paths.setdefault("footprint", out / "footprint_vs_bpb.png"))
    if _has(df, "bpb_by_segment"):
        ax = bpb_by_segment(df)
        _save(ax.figure, paths.setdefault("segments", out / "bpb_by_segment.png"))
    if _has(df, "tokens_per_s", "peak_rss_mb"):
        axes = cost_per_method(df)
        _save(axes[0].figure, paths.setdefault("cost", out / "cost.png"))
    fig = gate_heatmaps(df)
    if fig is not None:
        _save(fig, paths.setdefault("gates", out / "gates.png"))
    fig = passkey_heatmaps(df)
    if fig is not None:
        _save(fig, paths.setdefault("passkey", out / "passkey.png"))
    ax = passkey_length_curves(df)
    if ax is not None:
        _save(ax.figure, paths.setdefault("passkey_length", out / "passkey_vs_length.png"))
    ax = answer_loss_curves(df)
    if ax is not None:
        _save(ax.figure, paths.setdefault("answer_loss", out / "answer_loss.png"))
    axes = cost_vs_length(df)
    if axes is not None:
        _save(axes[0].figure, paths.setdefault("length_cost", out / "cost_vs_length.png"))
    return paths


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
        out[label] = [_versus(d, p, False, m == "local", h) for d, p, h, m in
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
            shown = versus.assign(diff=[_versus(d, p, False, False, h) for d, p, h in
                                        zip(versus["diff"], versus["p"], versus["ci"])],
                                  bootstrap=[_boot(lo, hi) for lo, hi in zip(versus["boot_lo"], versus["boot_hi"])])
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
    """A section for each registered evaluation (memzoo.running.evaluations) with rows in the table
    and no section of its own here: its rows per run, as measured."""
    sections = []
    for name in evaluations():
        if name not in OWN_SECTIONS and f"{name}_json" in df.columns:
            table = longrange_table(df, name, reset=None)
            if not table.empty:
                sections.append((f"Evaluation {name}: its rows per run", display(table)))
    return sections


def write_report(results_dir: str | Path, figures: bool = True) -> tuple[Path, Path]:
    """report.md and report.html in `results_dir` (which holds results.parquet or run folders);
    figures=False: the tables only (drawing is most of a report's time)."""
    root = Path(results_dir)
    table_path = root / "results.parquet"
    df = load_results(table_path if table_path.is_file() else root)
    figures = draw_figures(df, root) if figures else {}
    params = json.loads((root / "params.json").read_text()) if (root / "params.json").is_file() else None
    title = f"memzoo report: {root.name}"
    notes = [
        f"{len(df)} runs, {df['method'].nunique()} methods, seeds {sorted(df['seed'].unique().tolist())}.",
        f"{INTERVAL}; none with one seed.",
        f"\"vs local\" against `local`'s runs, \"vs best\" against the best row: {PAIRED_TEST} (rows with no seed "
        f"in common: {UNPAIRED_TEST}); * = significant; empty with one seed.",
        "footprint / state: floating-point numbers the memory state holds per sequence, measured on a real state "
        "(the plugin's analytic count agrees; see footprint_analytic).",
    ]
    sections: list[tuple[str, pd.DataFrame]] = []
    if is_distance_table(df):
        notes.append("distance: recall at each key's first query with its answer written exactly `gap_segments` "
                     "segments before (streamed; memzoo.running.distance); trained_gap: the largest gap the run was "
                     "trained on (a window memory stops at its reach); chance: uniform over the written values, on the "
                     "same examples; stale (rewrites): answered with an earlier value of the key; reset: the same "
                     "examples with the state reset right after the last write.")
        sections += distance_sections(df)
    elif is_capacity_table(df):
        notes.append("capacity: accuracy on cross-segment queries only, at each cell's best learning rate (best mean "
                     "over seeds); reset: the same model with its memory reset before the query segment; chance: "
                     "uniform over the stored values, on the same examples; within: accuracy at the answers visible in their own "
                     "segment (the model has learned the association if it is near 1).")
        thresholds = capacity_thresholds(df)
        sections += [("Capacity: smallest measured state reaching 0.5 and 0.9 mean accuracy",
                      display(thresholds)),
                     ("Capacity: accuracy by method and state (best lr per cell)", capacity_display(df))]
    if _has(df, "valid_bpb"):
        notes.append("valid_bpb: bits per byte on the validation documents, streamed from their first byte segment by segment.")
        if _has(df, "bits_by_doc"):
            notes.append(f"\"vs local, bootstrap\": {BOOTSTRAP}.")
        if "backbone_init" in df.columns:
            kinds = sorted(df["backbone_init"].fillna("shared").unique().tolist())
            notes.append(f"backbone initialisation: {', '.join(kinds)} (split: every method at a seed starts from the "
                         "same backbone weights; shared: a memory's parameters shifted the backbone's draws).")
        marked = rounding_sensitive(df["method"].unique().tolist())
        if marked:
            notes.append(f"rounding-sensitive: {', '.join(marked)}: a 1e-7 nudge of the initial weights moves one "
                         "quick run by more than 0.01 bits per byte (the card's rounding_sensitivity says how much "
                         "and why); read their seeds' spread, not one seed.")
        gain = gain_display(df)
        sections.insert(0, ("Summary (differences paired by seed)", summary_display(df)))
        if not gain.empty:
            sections.insert(1, ("What memory buys after the first segment (paired differences from local)", gain))
        headroom = headroom_display(df)
        if not headroom.empty:
            notes.append("headroom recovered: (local - method) / (local - full) in bits per byte on segments >= 1, "
                         "from per-seed differences paired by seed; local = 0, full = 1; 95% Fieller interval "
                         "(unbounded where full - local is not distinguishable from 0, undefined where they are "
                         "equal); \"vs local, segment 0\": the difference before any memory is read (a mixer's gain).")
            sections.insert(2, ("Headroom recovered between local (0) and full (1), segments >= 1", headroom))
        ablation = ablation_display(df)
        if not ablation.empty:
            notes.append("memory buys: bits per byte on segments >= 1 with the state reset before every segment minus "
                         "with it (the memory-ablation stage), the same trained model; positive: reading the memory helps.")
            sections.insert(1 + (not gain.empty) + (not headroom.empty),
                            ("What each memory buys: its state reset before every segment, minus read (segments >= 1)", ablation))
        sections.insert(len(sections), ("Summary, unpaired (Welch), for comparison", summary_display(df, paired=False)))
    if params:
        notes.append(f"Parameter counts span {min(params['counts'].values()):,} to {max(params['counts'].values()):,} "
                     f"(spread {params['spread']:.1%}).")
    if is_babilong_table(df):
        notes.append("BABILong: accuracy by the authors' scorer (the task's labels before the first '.', those in the "
                     "question not counted; exact: strict exact match); reset: the same samples with the state reset "
                     "before the question's segment; label_chance: a uniform guess among the task's labels in the "
                     "input; trained_length: the longest input the run was fine-tuned on (bytes).")
        sections.append(("BABILong accuracy by task and input length (mean ± 95% t over seeds)",
                         display(babilong_summary(df).drop(columns=["length"]).rename(columns={"length_bytes": "length"}),
                                 {"accuracy": ("accuracy", "accuracy_ci"), "reset": ("reset", "reset_ci")})))
    passkey = passkey_summary(df)
    if not passkey.empty:
        sections += [("Passkey retrieval (accuracy averaged over depths)",
                      display(passkey, {"accuracy": ("accuracy", "accuracy_ci")})),
                     ("Streaming cost against length (peak resident MB, tokens/s; ratios between streams of equal batch)",
                      display(streaming_cost(df, sorted(passkey["length"].unique().tolist()))))]
        notes.append(f"passkey against length: {PASSKEY_INTERVAL}.")
    by_segment = accuracy_by_key_segment(df)
    if not by_segment.empty:
        notes.append("segments back: how many segments before the question's segment the key's last digit lies "
                     "(0: the same segment); accuracy_reset: the same prompts with the state reset right after "
                     "the key's segment (the memory-reset ablation; it must fall to chance where the memory did "
                     "the work).")
        sections.append(("Passkey accuracy by the key's segment, counted back from the question", display(by_segment)))
    recall = recall_generalisation(df)
    if not recall.empty:
        sections.append(("Recall with the pairs `length` bytes before the queries (the training layout; mean over "
                         "seeds; accuracy_reset: state reset after the pairs' segment)", display(recall)))
    lm = lm_before_after(df)
    if not lm.empty:
        sections.append(("Validation bits per byte before and after fine-tuning (ratio: after / before)", display(lm)))
    sections += registered_sections(df)
    gates = gate_summary(df)
    if not gates.empty and "gate_before" in gates and gates["gate_before"].notna().any():
        sections.append(("Gates before and after fine-tuning (mean over heads; share of heads < 0.1 and > 0.9 after)",
                         display(gates)))

    md = [f"# {title}", "", *[f"- {n}" for n in notes], ""]
    for heading, shown in sections:
        md += [f"## {heading}", "", table_md(shown), ""]
    for key, path in figures.items():
        md += [f"## {FIGURES[key]}", "", f"![{key}]({path.name})", ""]
    md_path = root / "report.md"
    md_path.write_text("\n".join(md))

    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
             "<style>body{font-family:sans-serif;max-width:1100px;margin:2em auto}table{border-collapse:collapse}"
             "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}img{max-width:100%}</style></head><body>",
             f"<h1>{html.escape(title)}</h1><ul>", *[f"<li>{html.escape(n)}</li>" for n in notes], "</ul>"]
    for heading, shown in sections:
        parts += [f"<h2>{html.escape(heading)}</h2>", shown.to_html(index=False)]
    for key, path in figures.items():
        data = base64.b64encode(path.read_bytes()).decode("ascii")
        parts += [f"<h2>{html.escape(FIGURES[key])}</h2>", f"<img alt='{key}' src='data:image/png;base64,{data}'>"]
    parts.append("</body></html>")
    html_path = root / "report.html"
    html_path.write_text("\n".join(parts))
    return md_path, html_path
