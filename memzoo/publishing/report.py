"""`memzoo report RESULTS_DIR`: tables and figures from a suite's results.parquet, as a
self-contained report.html (figures embedded) and report.md (figures beside it as PNG files).
The figures and tables come from the recipes in memzoo.analysis, which a notebook can call directly.
Each evaluation kind whose rows the table holds gives its notes, sections and figure, as it declared
them when it registered (memzoo.evaluations.registry): bits per byte, capacity, distance, passkey,
BABILong, a plugin's."""
from __future__ import annotations

import base64
import html
import json
from pathlib import Path

import pandas as pd

from memzoo.analysis import load_results
from memzoo.analysis.cells import display, table_md
from memzoo.analysis.longrange import gate_summary, lm_before_after
from memzoo.analysis.stats import INTERVAL, PAIRED_TEST, UNPAIRED_TEST
from memzoo.evaluations.registry import reported
from memzoo.publishing.drawing import caption, draw_figures
from memzoo.publishing.sections import kind_sections


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
    counts = [f"Parameter counts span {min(params['counts'].values()):,} to {max(params['counts'].values()):,} "
              f"(spread {params['spread']:.1%})."] if params else []
    sections: list[tuple[str, pd.DataFrame]] = []
    for evaluation in reported(df).values():  # the runs' own evaluation first, then their stages'
        notes += evaluation.notes(df) if evaluation.notes is not None else []
        notes, counts = notes + counts, []  # the parameter counts after the first kind's notes
        sections += kind_sections(evaluation, df)
    notes += counts
    lm = lm_before_after(df)
    if not lm.empty:
        sections.append(("Validation bits per byte before and after fine-tuning (ratio: after / before)", display(lm)))
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
