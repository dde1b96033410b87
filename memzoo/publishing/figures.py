"""`memzoo figures`: every results table of the README and docs/ and every results figure, redrawn
from the shipped reference rows (memzoo/references/*.parquet), so nothing a reader sees goes stale.

A table sits in a page between `<!-- generated:NAME -->` and `<!-- /generated -->` (NAME a key of
memzoo.publishing.tables.TABLES); everything between the markers is replaced. A number in prose sits
between `<!-- fact:NAME -->` and `<!-- /fact -->` (memzoo.publishing.facts) and is replaced the same way. A figure carries, in a
PNG text chunk, the suite and the SHA-256 of the rows it was drawn from, so a test can tell a stale
figure without redrawing it. Figures of runs that are not shipped are listed in ARCHIVED with
where they come from.
"""
from __future__ import annotations

import hashlib
import re
import struct
import zlib
from pathlib import Path
from typing import Callable, Iterable, Optional

import pandas as pd

from memzoo.core.config import ConfigError
from memzoo.publishing.facts import FACT, all_facts, render_facts
from memzoo.publishing.references import load_rows, rows_path
from memzoo.publishing.shipped import shipped_rows
from memzoo.publishing.references import CEILING_SUITES
from memzoo.publishing.tables import TABLES

CEILING_FIGURES = ("headroom", "copy_distance", "beyond_window")  # each ceiling suite's figures (drawn by _draws)

BLOCK = re.compile(r"(<!-- generated:(?P<name>[a-z0-9-]+) -->\n)(?P<body>.*?)(<!-- /generated -->)", re.S)
OPEN = re.compile(r"<!-- generated:([a-z0-9-]+) -->")
ROWS_KEY = "memzoo-rows"  # the PNG text chunk naming the rows a figure was drawn from


def rows_hash(suite: str) -> str:
    """SHA-256 of a suite's shipped rows (the parquet file's bytes; a measurement's CSV file)."""
    return hashlib.sha256(rows_path(suite).read_bytes()).hexdigest()


def rows_stamp(suite: str) -> str:
    return f"{suite} sha256:{rows_hash(suite)}"


# ---- pages -----------------------------------------------------------------------------------

def pages(root: Path) -> list[Path]:
    """The pages that may hold generated blocks: README.md and every Markdown file under docs/."""
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def render(text: str, tables: dict[str, str], where: str = "page") -> str:
    """`text` with every generated block's body replaced by its table; an unknown name or a block
    without its closing marker is an error naming it."""
    opened, closed = OPEN.findall(text), [m.group("name") for m in BLOCK.finditer(text)]
    if opened != closed:
        raise ConfigError(f"{where}: generated blocks {opened} opened but only {closed} closed by '<!-- /generated -->'")
    unknown = sorted(set(opened) - set(tables))
    if unknown:
        raise ConfigError(f"{where}: unknown generated block(s) {unknown}; expected one of {sorted(tables)}")
    return BLOCK.sub(lambda m: m.group(1) + tables[m.group("name")] + m.group(4), text)


def all_tables(rows: Optional[dict[str, pd.DataFrame]] = None, names: Optional[Iterable[str]] = None) -> dict[str, str]:
    """Every generated table (or those of `names`), from `rows` (suite -> rows; the shipped rows by default)."""
    rows = rows or {}
    wanted = TABLES if names is None else {name: TABLES[name] for name in names if name in TABLES}
    cache: dict[str, pd.DataFrame] = {}

    def load(source: str) -> pd.DataFrame:
        if source not in cache:
            cache[source] = rows[source] if source in rows else shipped_rows(source)
        return cache[source]

    out = {}
    for name, (source, make) in wanted.items():
        if isinstance(source, tuple):  # a table of several sources: each says where it has no row
            out[name] = make({s: load(s) for s in source})
        else:  # a suite declared but not yet run: say so in the page instead of failing every table
            out[name] = make(load(source)) if not load(source).empty else f"No rows of `{source}` are shipped yet.\n"
    return out


def stale_pages(root: Path, rows: Optional[dict[str, pd.DataFrame]] = None, write: bool = False,
                tables: Optional[dict[str, str]] = None, facts: Optional[dict[str, str]] = None) -> list[Path]:
    """The pages whose generated blocks or facts in prose differ from those of the rows, or the `tables`
    and `facts` given (rewritten when `write`)."""
    texts = {page: page.read_text() for page in pages(root)}
    if tables is None:  # the tables some page shows (a block of an unknown name stays an error in render)
        tables = all_tables(rows, names={name for text in texts.values() for name in OPEN.findall(text)})
    stale = []
    for page, text in texts.items():
        if facts is None and "<!-- fact:" in text:  # computed once, for the suites some page quotes
            facts = all_facts(rows, suites={m.group("name").split(".", 1)[0] for t in texts.values() for m in FACT.finditer(t)})
        new = render_facts(render(text, tables, str(page.relative_to(root))), facts or {}, str(page.relative_to(root)))
        if new != text:
            stale.append(page)
            if write:
                page.write_text(new)
    return stale


# ---- figures ---------------------------------------------------------------------------------

def _quick(draw: Callable) -> Callable:
    def figure(rows: pd.DataFrame):
        out = draw(rows)
        return out.figure if hasattr(out, "figure") else (out[0].figure if hasattr(out, "__len__") else out)
    return figure


# docs-relative path -> the shipped suite it is drawn from
FIGURES: dict[str, str] = {
    "quick/footprint_vs_gain.png": "quick", "quick/gain_by_segment.png": "quick", "quick/footprint_vs_bpb.png": "quick",
    "quick/bpb_by_segment.png": "quick", "quick/cost.png": "quick", "quick/gates.png": "quick",
    "capacity/capacity.png": "capacity-top", "distance/distance.png": "distance",
    "lm-stream/memory_vs_state.png": "lm-stream", "lm-stream-gpu/memory_vs_state.png": "lm-stream-gpu",
    "lm-window/beyond_window.png": "lm-window", "cpu-cost/speed.png": "cpu-cost",
    **{f"{suite}/{name}.png": suite for suite in CEILING_SUITES for name in CEILING_FIGURES},
}


def _draws() -> dict[str, Callable]:
    """docs-relative path -> (rows -> matplotlib figure)."""
    from memzoo import analysis as a
    from memzoo.analysis.beyond_window import beyond_window_figure, headroom_figure
    from memzoo.analysis.copy_distance import copy_distance_figure
    from memzoo.analysis.cpu_cost import cpu_cost_figure
    from memzoo.analysis.distance import common_gaps_only
    from memzoo.publishing.shipped import with_ceiling

    ceiling = {"headroom": headroom_figure, "copy_distance": copy_distance_figure, "beyond_window": beyond_window_figure}
    return {
        "quick/footprint_vs_gain.png": _quick(a.footprint_vs_gain),
        "quick/gain_by_segment.png": _quick(a.gain_by_segment),
        "quick/footprint_vs_bpb.png": _quick(a.footprint_vs_bpb),
        "quick/bpb_by_segment.png": _quick(a.bpb_by_segment),
        "quick/cost.png": _quick(a.cost_per_method),
        "quick/gates.png": a.gate_heatmaps,
        "capacity/capacity.png": a.capacity_curves,
        "distance/distance.png": lambda rows: a.distance_curves(common_gaps_only(rows)),
        "lm-stream/memory_vs_state.png": _quick(a.memory_vs_state),
        "lm-stream-gpu/memory_vs_state.png": _quick(a.memory_vs_state),
        "lm-window/beyond_window.png": lambda rows: beyond_window_figure(with_ceiling(rows)),
        "cpu-cost/speed.png": cpu_cost_figure,
        **{f"{suite}/{name}.png": ceiling[name] for suite in CEILING_SUITES for name in CEILING_FIGURES},
    }


# figures of runs that are not shipped: drawn once from local result folders, with where they come from
ARCHIVED = {
    "distance/rewrites.png": "the `distance-rewrites` suite's folders (not shipped): memzoo.analysis.distance_curves",
    "longrange/passkey.png": "the `longrange-answer-only` suite's folders (not shipped): memzoo.analysis.passkey_heatmaps",
    "longrange/cost_vs_length.png": "the `longrange-answer-only` suite's folders (not shipped): memzoo.analysis.cost_vs_length",
    "longrange/curriculum/passkey.png": "the `longrange` suite's folders (not shipped): memzoo.analysis.passkey_heatmaps",
    "longrange/curriculum/passkey_vs_length.png": "the `longrange` suite's folders (not shipped): passkey_length_curves",
    "longrange/curriculum/answer_loss.png": "the `longrange` suite's folders (not shipped): answer_loss_curves",
}


def png_text(path: Path) -> dict[str, str]:
    """The tEXt chunks of a PNG (keyword -> text), read without drawing it."""
    data, out, at = Path(path).read_bytes(), {}, 8
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError(f"{path} is not a PNG")
    while at + 8 <= len(data):
        size, kind = struct.unpack(">I4s", data[at:at + 8])
        body = data[at + 8:at + 8 + size]
        if kind == b"tEXt":
            key, _, value = body.partition(b"\0")
            out[key.decode("latin-1")] = value.decode("latin-1")
        elif kind == b"zTXt":
            key, _, rest = body.partition(b"\0")
            out[key.decode("latin-1")] = zlib.decompress(rest[1:]).decode("latin-1")
        at += 12 + size
    return out


def stale_figures(docs: Path) -> dict[str, str]:
    """Figure -> why it is stale (missing, or drawn from rows other than the shipped ones)."""
    out = {}
    for rel, suite in FIGURES.items():
        path = docs / rel
        if not path.is_file():
            out[rel] = "missing"
        elif (stamp := png_text(path).get(ROWS_KEY)) != rows_stamp(suite):
            out[rel] = f"drawn from {stamp or 'unrecorded rows'}; the shipped rows are {rows_stamp(suite)}"
    return out


def draw_figures(docs: Path, only: Optional[list[str]] = None) -> list[Path]:
    """Redraw the figures (all, or the docs-relative paths in `only`) from the shipped rows."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for rel, draw in _draws().items():
        if only and rel not in only:
            continue
        suite = FIGURES[rel]
        fig = draw(load_rows(suite))
        if fig is None:
            continue
        path = docs / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        # no Software/date chunk: the same rows give the same file
        fig.savefig(path, dpi=110, bbox_inches="tight", metadata={"Software": None, ROWS_KEY: rows_stamp(suite)})
        plt.close(fig)
        written.append(path)
    return written
