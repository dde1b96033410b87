"""`memzoo report RESULTS_DIR`: tables and figures from a suite's results.parquet, as a
self-contained report.html (figures embedded) and report.md (figures beside it as PNG files).
The figures and tables come from the recipes in memzoo.analysis, which a notebook can call directly.
A results table with `recall_accuracy` (the `capacity` suite) gets the capacity figure and tables; one
whose runs carry distance rows (the `distance` suites) gets the distance figure and tables instead."""
from __future__ import annotations

import base64
import html
import json
from pathlib import Path

import pandas as pd

from memzoo.analysis import (capacity_thresholds, is_capacity_table, load_results)
from memzoo.analysis.babilong import babilong_summary, is_babilong_table
from memzoo.analysis.distance import is_distance_table
from memzoo.analysis.longrange import (PASSKEY_INTERVAL, accuracy_by_key_segment, gate_summary, lm_before_after,
                                       recall_generalisation)
from memzoo.analysis.stats import BOOTSTRAP, INTERVAL, PAIRED_TEST, UNPAIRED_TEST
from memzoo.conformance.catalog import rounding_sensitive
from memzoo.publishing.cells import display, table_md
from memzoo.publishing.drawing import caption, draw_figures, has_columns
from memzoo.publishing.sections import (ablation_display, capacity_display, distance_sections, gain_display,
                                        headroom_display, passkey_summary, registered_sections, streaming_cost,
                                        summary_display)


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
                     "segments before (streamed; memzoo.evaluations.distance); trained_gap: the largest gap the run was "
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
    if has_columns(df, "valid_bpb"):
        notes.append("valid_bpb: bits per byte on the validation documents, streamed from their first byte segment by segment.")
        if has_columns(df, "bits_by_doc"):
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
        md += [f"## {caption(key)}", "", f"![{key}]({path.name})", ""]
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
        parts += [f"<h2>{html.escape(caption(key))}</h2>", f"<img alt='{key}' src='data:image/png;base64,{data}'>"]
    parts.append("</body></html>")
    html_path = root / "report.html"
    html_path.write_text("\n".join(parts))
    return md_path, html_path
