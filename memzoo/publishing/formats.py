"""How the generated tables write numbers and tables: signed differences with a typographic minus,
"mean ± half" intervals, a row's seeds, and pipe tables of at most 8 columns (they fit the page)."""
from __future__ import annotations

from typing import Sequence

import pandas as pd

MINUS = "−"


def signed(x: float, digits: int = 3) -> str:
    """+0.123 / −0.123 with a typographic minus."""
    return f"{'+' if x >= 0 else MINUS}{abs(x):.{digits}f}"


def interval(mean: float, half: float, digits: int = 3, sign: bool = False) -> str:
    """"mean ± half" ("mean" alone where the interval is undefined)."""
    text = signed(mean, digits) if sign else f"{mean:.{digits}f}"
    return text if half != half else f"{text} ± {half:.{digits}f}"


def seeds_of(rows: pd.DataFrame) -> str:
    """The seeds a table row is over: "0, 1, 2"."""
    return ", ".join(str(int(s)) for s in sorted(rows["seed"].unique()))


def markdown(header: Sequence[str], rows: list[Sequence[str]], right: Sequence[int] = ()) -> str:
    """A pipe table; columns in `right` are right-aligned (numbers of one kind)."""
    if len(header) > 8:
        raise ValueError(f"a table of {len(header)} columns ({list(header)}): at most 8 fit the page; split it")
    align = ["---:" if i in right else "---" for i in range(len(header))]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"
