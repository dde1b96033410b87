"""The report's figures: every standard figure a results table has data for, drawn by the recipes of
memzoo.analysis, and the figure of each evaluation kind the table holds (declared when it registered),
saved as PNG files, with the caption each gets."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from memzoo.analysis import (bpb_by_segment, cost_per_method, cost_vs_length, footprint_vs_bpb, footprint_vs_gain,
                             gain_by_segment, gate_heatmaps, passkey_heatmaps)
from memzoo.analysis.cells import has_columns
from memzoo.analysis.longrange import answer_loss_curves, passkey_length_curves
from memzoo.evaluations.registry import evaluations, reported

CAPTIONS = {
    "gain": "Headline: state (numbers per sequence, log) against the difference from local in valid bits per byte, "
            "paired by seed (95% t interval; below 0 the memory buys something)",
    "gain_segments": "Difference from local in bits per byte by segment index, paired by seed (95% t band)",
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


def save_figure(fig, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def draw_figures(df: pd.DataFrame, out: Path) -> dict[str, Path]:
    """Every standard figure that the table has data for, as PNG files in `out`."""
    import matplotlib

    matplotlib.use("Agg")
    paths: dict[str, Path] = {}
    if has_columns(df, "valid_bpb", "footprint_measured") and (df["method"] == "local").any() and df["method"].nunique() > 1:
        save_figure(footprint_vs_gain(df).figure, paths.setdefault("gain", out / "footprint_vs_gain.png"))
    if has_columns(df, "bpb_by_segment") and (df["method"] == "local").any() and df["method"].nunique() > 1:
        save_figure(gain_by_segment(df).figure, paths.setdefault("gain_segments", out / "gain_by_segment.png"))
    for name, evaluation in reported(df).items():  # each kind's own figure, where the table holds its rows
        fig = evaluation.figure.draw(df) if evaluation.figure is not None else None
        if fig is not None:
            save_figure(fig, paths.setdefault(name, out / f"{name}.png"))
    if has_columns(df, "valid_bpb", "footprint_measured"):
        ax = footprint_vs_bpb(df)
        save_figure(ax.figure, paths.setdefault("footprint", out / "footprint_vs_bpb.png"))
    if has_columns(df, "bpb_by_segment"):
        ax = bpb_by_segment(df)
        save_figure(ax.figure, paths.setdefault("segments", out / "bpb_by_segment.png"))
    if has_columns(df, "tokens_per_s", "peak_rss_mb"):
        axes = cost_per_method(df)
        save_figure(axes[0].figure, paths.setdefault("cost", out / "cost.png"))
    fig = gate_heatmaps(df)
    if fig is not None:
        save_figure(fig, paths.setdefault("gates", out / "gates.png"))
    fig = passkey_heatmaps(df)
    if fig is not None:
        save_figure(fig, paths.setdefault("passkey", out / "passkey.png"))
    ax = passkey_length_curves(df)
    if ax is not None:
        save_figure(ax.figure, paths.setdefault("passkey_length", out / "passkey_vs_length.png"))
    ax = answer_loss_curves(df)
    if ax is not None:
        save_figure(ax.figure, paths.setdefault("answer_loss", out / "answer_loss.png"))
    axes = cost_vs_length(df)
    if axes is not None:
        save_figure(axes[0].figure, paths.setdefault("length_cost", out / "cost_vs_length.png"))
    return paths


def caption(key: str) -> str:
    """A report figure's caption: the standard figures', or the registered evaluation's that drew it."""
    return CAPTIONS[key] if key in CAPTIONS else evaluations()[key].figure.caption
