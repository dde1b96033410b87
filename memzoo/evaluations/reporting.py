"""The report parts of memzoo's own evaluation kinds: for each kind, the notes that say what its
columns mean, its sections (heading, table as printed) and the table `memzoo compare` prints when a
suite of its rows ends, all from a suite's results table. Each kind names its part when it registers
(memzoo.evaluations.registry), as a plugin kind does, so the report (memzoo.publishing.report) asks
the registry and knows no kind by name.
"""
from __future__ import annotations

import pandas as pd

from memzoo.analysis.babilong import babilong_summary
from memzoo.analysis.bpb import headroom_recovered, memory_ablation, memory_gain, summary_table
from memzoo.analysis.capacity import capacity_table, capacity_thresholds
from memzoo.analysis.copy_distance import copy_distance_summary
from memzoo.analysis.cells import bootstrap_cell, display, format_value, has_columns, versus_cell
from memzoo.analysis.distance import distance_reach, distance_summary, distance_versus
from memzoo.analysis.longrange import PASSKEY_INTERVAL, accuracy_by_key_segment, recall_generalisation
from memzoo.analysis.passkey import length_cost_table, longrange_table
from memzoo.analysis.stats import BOOTSTRAP, t_halfwidth
from memzoo.core.resources import rounding_sensitive

Sections = list[tuple[str, pd.DataFrame]]

# ---- lm: bits per byte ------------------------------------------------------------------------


def holds_bpb(df: pd.DataFrame) -> bool:
    """Whether the runs were evaluated in bits per byte (every run whose training `lm` ends)."""
    return has_columns(df, "valid_bpb")


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


def bpb_notes(df: pd.DataFrame) -> list[str]:
    notes = ["valid_bpb: bits per byte on the validation documents, streamed from their first byte segment by segment."]
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
    if not headroom_recovered(df).empty:
        notes.append("headroom recovered: (local - method) / (local - full) in bits per byte on segments >= 1, "
                     "from per-seed differences paired by seed; local = 0, full = 1; 95% Fieller interval "
                     "(unbounded where full - local is not distinguishable from 0, undefined where they are "
                     "equal); \"vs local, segment 0\": the difference before any memory is read (a mixer's gain).")
    if not memory_ablation(df).empty:
        notes.append("memory buys: bits per byte on segments >= 1 with the state reset before every segment minus "
                     "with it (the memory-ablation stage), the same trained model; positive: reading the memory helps.")
    return notes


def bpb_sections(df: pd.DataFrame) -> Sections:
    sections = [("Summary (differences paired by seed)", summary_display(df))]
    gain, headroom, ablation = gain_display(df), headroom_display(df), ablation_display(df)
    if not gain.empty:
        sections.append(("What memory buys after the first segment (paired differences from local)", gain))
    if not headroom.empty:
        sections.append(("Headroom recovered between local (0) and full (1), segments >= 1", headroom))
    if not ablation.empty:
        sections.append(("What each memory buys: its state reset before every segment, minus read (segments >= 1)",
                         ablation))
    return sections + [("Summary, unpaired (Welch), for comparison", summary_display(df, paired=False))]


def bpb_summary(df: pd.DataFrame) -> pd.DataFrame:
    """The bits-per-byte summary with 95% intervals over seeds and the tests against local and the best."""
    return summary_display(df)[["method", "runs", "params", "footprint", "valid_bpb", "vs local", "vs best",
                                "tokens_per_s", "peak_rss_mb"]]


# ---- passkey and recall streamed ----------------------------------------------------------------


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


def passkey_notes(df: pd.DataFrame) -> list[str]:
    notes = [f"passkey against length: {PASSKEY_INTERVAL}."] if not passkey_summary(df).empty else []
    if not accuracy_by_key_segment(df).empty:
        notes.append("segments back: how many segments before the question's segment the key's last digit lies "
                     "(0: the same segment); accuracy_reset: the same prompts with the state reset right after "
                     "the key's segment (the memory-reset ablation; it must fall to chance where the memory did "
                     "the work).")
    return notes


def passkey_sections(df: pd.DataFrame) -> Sections:
    sections = []
    passkey = passkey_summary(df)
    if not passkey.empty:
        sections += [("Passkey retrieval (accuracy averaged over depths)",
                      display(passkey, {"accuracy": ("accuracy", "accuracy_ci")})),
                     ("Streaming cost against length (peak resident MB, tokens/s; ratios between streams of equal batch)",
                      display(streaming_cost(df, sorted(passkey["length"].unique().tolist()))))]
    by_segment = accuracy_by_key_segment(df)
    if not by_segment.empty:
        sections.append(("Passkey accuracy by the key's segment, counted back from the question", display(by_segment)))
    return sections


def recall_sections(df: pd.DataFrame) -> Sections:
    recall = recall_generalisation(df)
    if recall.empty:
        return []
    return [("Recall with the pairs `length` bytes before the queries (the training layout; mean over seeds; "
             "accuracy_reset: state reset after the pairs' segment)", display(recall))]


# ---- capacity: recall across one segment boundary -----------------------------------------------


def capacity_display(df: pd.DataFrame) -> pd.DataFrame:
    """The capacity cells as printed: accuracy and the reset ablation as mean ± 95% t interval."""
    return display(capacity_table(df), {"accuracy": ("accuracy", "accuracy_ci"), "reset": ("reset", "reset_ci")},
                   versus=True)


def capacity_notes(df: pd.DataFrame) -> list[str]:
    return ["capacity: accuracy on cross-segment queries only, at each cell's best learning rate (best mean "
            "over seeds); reset: the same model with its memory reset before the query segment; chance: "
            "uniform over the stored values, on the same examples; within: accuracy at the answers visible in their own "
            "segment (the model has learned the association if it is near 1)."]


def capacity_sections(df: pd.DataFrame) -> Sections:
    return [("Capacity: smallest measured state reaching 0.5 and 0.9 mean accuracy", display(capacity_thresholds(df))),
            ("Capacity: accuracy by method and state (best lr per cell)", capacity_display(df))]


def capacity_summary(df: pd.DataFrame) -> pd.DataFrame:
    cols = ["pairs", "gap_segments", "method", "state", "runs", "accuracy", "vs local", "vs best", "reset", "chance",
            "within"]
    return capacity_display(df)[cols]


# ---- distance: recall against the gap -----------------------------------------------------------


def distance_notes(df: pd.DataFrame) -> list[str]:
    return ["distance: recall at each key's first query with its answer written exactly `gap_segments` "
            "segments before (streamed; memzoo.evaluations.distance); trained_gap: the largest gap the run was "
            "trained on (a window memory stops at its reach); chance: uniform over the written values, on the "
            "same examples; stale (rewrites): answered with an earlier value of the key; reset: the same "
            "examples with the state reset right after the last write."]


def distance_sections(df: pd.DataFrame) -> Sections:
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


def distance_summary_display(df: pd.DataFrame) -> pd.DataFrame:
    """How far each variant carries what it stored (distance_reach), as printed."""
    return display(distance_reach(df))


# ---- babilong -----------------------------------------------------------------------------------


def babilong_notes(df: pd.DataFrame) -> list[str]:
    return ["BABILong: accuracy by the authors' scorer (the task's labels before the first '.', those in the "
            "question not counted; exact: strict exact match); reset: the same samples with the state reset "
            "before the question's segment; label_chance: a uniform guess among the task's labels in the "
            "input; trained_length: the longest input the run was fine-tuned on (bytes)."]


def babilong_sections(df: pd.DataFrame) -> Sections:
    table = babilong_summary(df).drop(columns=["length"]).rename(columns={"length_bytes": "length"})
    return [("BABILong accuracy by task and input length (mean ± 95% t over seeds)",
             display(table, {"accuracy": ("accuracy", "accuracy_ci"), "reset": ("reset", "reset_ci")}))]


def copy_distance_notes(df: pd.DataFrame) -> list[str]:
    return ["copy-distance: a chunk, other held-out text, then the chunk again `distance` bytes after the first, "
            "streamed with the state carried (memzoo.evaluations.copy_distance); bits per byte on the second "
            "copy, mean ± 95% t over seeds; first copy: its mean over every distance (nothing but copying "
            "improves on it); memory reset: the same rows with every memory forgotten before each segment "
            "and the window kept."]


def copy_distance_sections(df: pd.DataFrame) -> Sections:
    """Second-copy bits against distance per variant: random chunks, held-out text, and each with the
    memory ablation where measured."""
    out = []
    for kind, what in (("random", "random printable chunks (only copying predicts them)"),
                       ("text", "held-out text chunks")):
        for reset in (False, True):
            table = copy_distance_summary(df, kind, reset)
            if not table.empty:
                arm = ", every memory forgotten before each segment (the window kept)" if reset else ""
                out.append((f"Copying at distance, {what}{arm}: bits per byte on the second copy by distance "
                            "in bytes", table))
    return out
