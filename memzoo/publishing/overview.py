"""The overview: one row per method, one column per question (what its memory keeps, how fast it
trains, what it buys on the window, how much it recalls at its state, how far its recall carries, how
fast it trains on a GPU), each from its suite's or measurement's shipped rows, as a generated block
of the README and docs/results.md (`<!-- generated:overview -->`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import pandas as pd

from memzoo.analysis.beyond_window import window_summary
from memzoo.analysis.bpb import CEILING
from memzoo.analysis.capacity import capacity_table
from memzoo.analysis.distance import common_gaps_only, distance_reach
from memzoo.analysis.stats import REFERENCE
from memzoo.publishing.formats import interval, markdown
from memzoo.publishing.shipped import shipped_rows, with_ceiling

DASH = "–"  # a column whose suite has no row of the method
CONTROLS = (REFERENCE, CEILING)  # not memories: never marked best
# The window suite whose rows give the LM columns: every method fine-tuned on the window from the backbone that
# copies at every distance (copy-conv6), so that `full` is a ceiling that pays (lm-window's backbone never
# attended past 127 bytes; lm-window-rope3's copies less far).
LM_SUITE = "lm-window-conv6"
OVERVIEW_SOURCES = (LM_SUITE, "capacity-top", "distance", "gpu-speed", "cpu-cost")


def option_of(variant: str, method: str) -> str:
    """A variant label's options without the method: "xl mem_len=33" -> "mem_len=33" ("" for the method)."""
    return variant[len(method):].strip()


@dataclass
class Cell:
    """One overview cell: its text, the value its column ranks by (higher better), and how many seeds."""
    text: str
    rank: Optional[tuple] = None  # None: not ranked (a control, or no value)
    seeds: Optional[int] = None


@dataclass
class WindowRow:
    """A method's row of the window suite in the overview: the variant shown (its best on segments >= 1),
    the label naming it (Markdown), its difference from the floor there (the sort key), and its two cells."""
    variant: str
    label: str
    after: float
    state: Cell
    bpb: Cell


def window_rows(window: pd.DataFrame) -> dict[str, WindowRow]:
    """Method -> its variant best on segments >= 1 in the window suite (the row the lm-window table ranks
    first): its memory's state, and its paired difference from the window floor ± the 95% t half-width,
    `*` where significant after Holm over every variant (the lm-window table's numbers)."""
    if window.empty:
        return {}
    rows = with_ceiling(window)
    borrowed = rows.loc[rows["method"] == CEILING, "ceiling_from"]
    borrowed = borrowed.iloc[0] if len(borrowed) and borrowed.iloc[0] != "own" else None
    out: dict[str, WindowRow] = {}
    for _, r in window_summary(rows).sort_values("after", kind="stable").iterrows():
        method, seeds = r["method"], len(r["seeds"])
        if method in out:
            continue
        memory = method not in CONTROLS
        text = "ref (the floor)" if method == REFERENCE else (interval(r["after"], r["after_ci"], sign=True)
                                                              + (" *" if r["sig_after"] else ""))
        label = f"`{r['variant']}`" + (f" ({borrowed}'s rows)" if method == CEILING and borrowed else "")
        out[method] = WindowRow(r["variant"], label, float(r["after"]),
                                Cell(f"{r['state']:,}", (-r["state"],) if memory else None, seeds),
                                Cell(text, (-r["after"],) if memory else None, seeds))
    return out


def recall_cells(capacity: pd.DataFrame) -> dict[str, Cell]:
    """Method -> its recall across one segment boundary at its state (capacity-top, the capacity table's
    cells): the cell of most recall, then least state; ranked the same way."""
    if capacity.empty:
        return {}
    table = capacity_table(capacity).sort_values(["accuracy", "state"], ascending=[False, True], kind="stable")
    out = {}
    for _, r in table.drop_duplicates("method").iterrows():
        memory = r["method"] not in CONTROLS
        out[r["method"]] = Cell(f"{r['accuracy']:.2f} at {int(r['state']):,}",
                                (r["accuracy"], -r["state"]) if memory else None, int(r["runs"]))
    return out


def reach_cells(distance: pd.DataFrame) -> dict[str, Cell]:
    """Method -> the largest gap (segments) up to which its mean recall stays >= 0.5 (the distance
    table's reach; "none": not even at gap 1), its farthest variant named where it has several."""
    if distance.empty:
        return {}
    reach = distance_reach(common_gaps_only(distance))
    reach = reach[reach["rewrites"] == 0].sort_values(["gap_at_0.5", "gap_at_0.9"], ascending=False, kind="stable")
    counts = reach["method"].value_counts()
    out = {}
    for _, r in reach.drop_duplicates("method").iterrows():
        gap, method = int(r["gap_at_0.5"]), r["method"]
        named = f" ({option_of(r['variant'], method)})" if counts[method] > 1 else ""
        out[method] = Cell((f"{gap:,}" if gap else "none") + named,
                           (gap,) if method not in CONTROLS else None, int(r["runs"]))
    return out


def options_of(variant: str, method: str) -> frozenset[str]:
    """A variant label's options as a set: "xl mem_len=128, cache=kv" -> {"mem_len=128", "cache=kv"}."""
    return frozenset(o.strip() for o in option_of(variant, method).split(",") if o.strip())


def nearest_variant(group: pd.DataFrame, method: str, preferred: Optional[str]) -> pd.DataFrame:
    """The rows of `preferred`, else of the variant whose options are the largest subset of its options
    (none: empty). The CPU cost suite measures fewer variants than the window suites run."""
    if preferred is None:
        return group.iloc[:0]
    if (group["variant"] == preferred).any():
        return group[group["variant"] == preferred]
    want = options_of(preferred, method)
    held = group["variant"].map(lambda v: options_of(v, method))
    fits = held.map(lambda o: o <= want)
    if not fits.any():
        return group.iloc[:0]
    most = held[fits].map(len).max()
    return group[fits & (held.map(len) == most)]


def speed_cells(rows: pd.DataFrame, ratio: pd.Series, prefer: Callable[[str], Optional[str]] = lambda method: None,
                name: Callable[[pd.Series], str] = lambda row: "") -> dict[str, Cell]:
    """Method -> its speed as a ratio to `local`'s measured beside it (`ratio`, per row): the row of the
    variant `prefer(method)` where there is one, else of the variant sharing most of its options and none
    other ("xl mem_len=128" for "xl mem_len=128, cache=kv"), else the method's fastest row; named by
    `name(row)` ("defaults" where it has no options) where it is not the preferred variant; "ref" for local."""
    out = {}
    rows = rows.assign(ratio=ratio)
    for method, group in rows.groupby("method", sort=False):
        if method == REFERENCE:
            out[method] = Cell("ref")
            continue
        preferred, labelled = prefer(method), "variant" in group
        own = nearest_variant(group, method, preferred) if labelled else group.iloc[:0]
        fastest = (own if not own.empty else group).sort_values("ratio", ascending=False, kind="stable").iloc[0]
        exact = labelled and fastest["variant"] == preferred
        several = group["variant"].nunique() > 1 if labelled else len(group) > 1
        # another variant than the one asked for (a stand-in), or the fastest of several: named
        label = name(fastest) or ("defaults" if preferred is not None else "")
        named = f" ({label})" if label and not exact and (preferred is not None or several) else ""
        out[method] = Cell(f"{fastest['ratio']:.2f}{named}", (fastest["ratio"],) if method not in CONTROLS else None)
    return out


def overview_table(rows: dict[str, pd.DataFrame]) -> str:
    """One row per method, sorted by what its memory buys on the window suite (best first; methods
    without a window row last): its memory's state there, its CPU step speed against `local` (one
    training window, cpu-cost.csv, no bytes carried before it), its bits per byte against the window
    floor on segments >= 1, its recall at its state (capacity-top), how far its recall stays >= 0.5
    (distance) and its GPU training speed against `local` (gpu-speed.csv). A dash where a source has no
    row of the method; in bold, each column's best among the memories (the controls `local` and `full`
    are not ranked). `rows`: source (OVERVIEW_SOURCES) -> its rows, the shipped ones where absent."""
    rows = {source: rows[source] if source in rows else shipped_rows(source) for source in OVERVIEW_SOURCES}
    window = window_rows(rows[LM_SUITE])
    cpu, gpu = rows["cpu-cost"], rows["gpu-speed"]
    if not cpu.empty:
        cpu = cpu[cpu["carried_bytes"] == 0]
        # measured at lm-window's config: LM_SUITE's but for its convolution on queries and keys, which every method pays alike
        if "suite" in cpu and (cpu["suite"] == "lm-window").any():
            cpu = cpu[cpu["suite"] == "lm-window"]
    columns = {
        "state": {m: w.state for m, w in window.items()},
        "cpu": speed_cells(cpu, cpu["speed_vs_local"], lambda m: window[m].variant if m in window else None,
                           lambda r: option_of(r["variant"], r["method"])) if not cpu.empty else {},
        "lm": {m: w.bpb for m, w in window.items()},
        "recall": recall_cells(rows["capacity-top"]),
        "reach": reach_cells(rows["distance"]),
        "gpu": speed_cells(gpu, gpu["tokens_per_s"] / gpu["local_tokens_per_s"], name=lambda r: str(r["options"]))
        if not gpu.empty else {},
    }
    methods = sorted({m for cells in columns.values() for m in cells},
                     key=lambda m: (m not in window, window[m].after if m in window else 0.0, m))
    best = {key: max((c.rank for c in cells.values() if c.rank is not None), default=None)
            for key, cells in columns.items()}

    def shown(key: str, method: str) -> str:
        cell = columns[key].get(method)
        if cell is None:
            return DASH
        if cell.rank is None or cell.rank != best[key]:
            return cell.text
        value, star, rest = cell.text.partition(" *")  # the Holm mark stays outside the bold
        return f"**{value}**{star}{rest}"

    def seeds(method: str) -> str:
        return " / ".join(DASH if (c := columns[k].get(method)) is None else str(c.seeds) for k in ("lm", "recall", "reach"))

    cards = ", ".join(sorted(gpu["card"].unique())) if not gpu.empty else ""
    out = [[window[m].label if m in window else f"`{m}`", seeds(m), *(shown(k, m) for k in columns)] for m in methods]
    return markdown(["method", "seeds (LM / recall / reach)", "memory's state numbers (LM)", "CPU step speed vs local",
                     "bits per byte vs window floor, segments ≥ 1", "recall at its state", "recall ≥ 0.5 up to (gap)",
                     "GPU step speed vs local" + (f" ({cards})" if cards else "")], out, right=[2, 3, 6, 7])
