"""`memzoo report RESULTS_DIR`: tables and figures from a suite's results.parquet, as a
self-contained report.html (figures embedded) and report.md (figures beside it as PNG files).
The figures come from the recipes in memzoo.analysis, which a notebook can call directly."""
from __future__ import annotations

import base64
import html
import json
from pathlib import Path

import pandas as pd

from memzoo.analysis import (bpb_by_segment, cost_per_method, cost_vs_length, footprint_vs_bpb, gate_heatmaps,
                             length_cost_table, load_results, longrange_table, passkey_heatmaps, summary_table)

FIGURES = {
    "footprint": "Footprint (state numbers per sequence, log) against valid bits per byte",
    "segments": "Bits per byte by segment index within the document",
    "cost": "Evaluation throughput and peak resident memory per method",
    "gates": "Per-head gate values per layer (0 = local attention only, 1 = memory only)",
    "passkey": "Passkey accuracy by prompt length and key depth (oob: out of the time or memory budget)",
    "length_cost": "Peak resident memory and streaming throughput against prompt length (passkey streams)",
}


def _table_md(df: pd.DataFrame) -> str:
    cols = list(df.columns)
    lines = ["| " + " | ".join(cols) + " |", "| " + " | ".join("---" for _ in cols) + " |"]
    for _, row in df.iterrows():
        lines.append("| " + " | ".join(_fmt(row[c]) for c in cols) + " |")
    return "\n".join(lines)


def _fmt(value) -> str:
    if isinstance(value, float):
        if value != value:  # NaN
            return ""
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3f}"
    if isinstance(value, (int,)) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def _save(fig, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def draw_figures(df: pd.DataFrame, out: Path) -> dict[str, Path]:
    """Every standard figure that the table has data for, as PNG files in `out`."""
    import matplotlib

    matplotlib.use("Agg")
    paths: dict[str, Path] = {}
    ax = footprint_vs_bpb(df)
    _save(ax.figure, paths.setdefault("footprint", out / "footprint_vs_bpb.png"))
    ax = bpb_by_segment(df)
    _save(ax.figure, paths.setdefault("segments", out / "bpb_by_segment.png"))
    axes = cost_per_method(df)
    _save(axes[0].figure, paths.setdefault("cost", out / "cost.png"))
    fig = gate_heatmaps(df)
    if fig is not None:
        _save(fig, paths.setdefault("gates", out / "gates.png"))
    fig = passkey_heatmaps(df)
    if fig is not None:
        _save(fig, paths.setdefault("passkey", out / "passkey.png"))
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
    """Per method and length: mean passkey accuracy over depths, throughput, peak memory, status."""
    table = longrange_table(df, "passkey")
    if table.empty:
        return table
    table = table.assign(ok=table["status"] == "ok")
    out = table.groupby(["method", "length"], as_index=False).agg(
        accuracy=("accuracy", "mean"), tokens_per_s=("tokens_per_s", "mean"), peak_rss_mb=("peak_rss_mb", "mean"),
        within_budget=("ok", "all"))
    return out.astype({"length": int})


def write_report(results_dir: str | Path) -> tuple[Path, Path]:
    """report.md and report.html in `results_dir` (which holds results.parquet or run folders)."""
    root = Path(results_dir)
    table_path = root / "results.parquet"
    df = load_results(table_path if table_path.is_file() else root)
    summary = summary_table(df)
    shown = summary.rename(columns={"bpb_mean": "valid_bpb", "bpb_sd": "sd"})
    figures = draw_figures(df, root)
    params = json.loads((root / "params.json").read_text()) if (root / "params.json").is_file() else None
    title = f"memzoo report: {root.name}"
    notes = [
        f"{len(df)} runs, {df['method'].nunique()} methods, seeds {sorted(df['seed'].unique().tolist())}.",
        "footprint: floating-point numbers the memory state holds per sequence, measured on a real state "
        "after the evaluation length (the plugin's analytic count agrees; see footprint_analytic).",
        "valid_bpb: bits per byte on the validation documents, streamed from their first byte segment by segment.",
    ]
    if params:
        notes.append(f"Parameter counts span {min(params['counts'].values()):,} to {max(params['counts'].values()):,} "
                     f"(spread {params['spread']:.1%}).")

    passkey = passkey_summary(df)
    md = [f"# {title}", "", *[f"- {n}" for n in notes], "", "## Summary", "", _table_md(shown), ""]
    cost_title = "Streaming cost against length (peak resident MB, tokens/s; ratios between streams of equal batch)"
    if not passkey.empty:
        targets = streaming_cost(df, sorted(passkey["length"].unique().tolist()))
        md += ["## Passkey retrieval (accuracy averaged over depths)", "", _table_md(passkey), ""]
        md += [f"## {cost_title}", "", _table_md(targets), ""]
    for key, path in figures.items():
        md += [f"## {FIGURES[key]}", "", f"![{key}]({path.name})", ""]
    md_path = root / "report.md"
    md_path.write_text("\n".join(md))

    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
             "<style>body{font-family:sans-serif;max-width:1000px;margin:2em auto}table{border-collapse:collapse}"
             "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}img{max-width:100%}</style></head><body>",
             f"<h1>{html.escape(title)}</h1><ul>", *[f"<li>{html.escape(n)}</li>" for n in notes], "</ul>",
             "<h2>Summary</h2>", shown.to_html(index=False, float_format=lambda v: _fmt(float(v)), na_rep="")]
    if not passkey.empty:
        parts += ["<h2>Passkey retrieval (accuracy averaged over depths)</h2>",
                  passkey.to_html(index=False, float_format=lambda v: _fmt(float(v)), na_rep=""),
                  f"<h2>{html.escape(cost_title)}</h2>",
                  targets.to_html(index=False, float_format=lambda v: _fmt(float(v)), na_rep="")]
    for key, path in figures.items():
        data = base64.b64encode(path.read_bytes()).decode("ascii")
        parts += [f"<h2>{html.escape(FIGURES[key])}</h2>", f"<img alt='{key}' src='data:image/png;base64,{data}'>"]
    parts.append("</body></html>")
    html_path = root / "report.html"
    html_path.write_text("\n".join(parts))
    return md_path, html_path
