"""One colour and one marker per method, the same in every figure, so a reader who learns that
Titans-MAG is the red star finds it again on the next page. A method outside the zoo (a plugin)
gets a pair of its own from its name, drawn from colours and markers the zoo does not use.
"""
from __future__ import annotations

import hashlib

# method -> (colour, marker): every colour distinct, and every (colour, marker) pair distinct.
STYLES: dict[str, tuple[str, str]] = {
    "local": ("#000000", "o"),
    "full": ("#7f7f7f", "s"),
    "xl": ("#1f77b4", "o"),
    "compressive": ("#6baed6", "v"),
    "memorizing": ("#17becf", "D"),
    "rmt": ("#9467bd", "^"),
    "armt": ("#c49cde", "<"),
    "infini-linear": ("#2ca02c", "s"),
    "infini-delta": ("#8fd175", "P"),
    "infty-former": ("#8c564b", "h"),
    "deltanet": ("#ff7f0e", "D"),
    "gated-deltanet": ("#fdb462", "X"),
    "titans-mag": ("#d62728", "*"),
    "titans-mac": ("#e377c2", "p"),
}
# for methods the zoo does not ship: none of these colours is in STYLES
SPARE_COLOURS = ("#bcbd22", "#393b79", "#843c39", "#7b4173", "#637939", "#e7969c")
SPARE_MARKERS = ("d", ">", "8", "H", "^", "v")  # filled, as seaborn will not mix filled and line markers


def style(method: str) -> tuple[str, str]:
    """(colour, marker) of a method; a variant label ("infini-delta normalizer=gamma") takes its method's."""
    name = method.split(" ", 1)[0]
    if name in STYLES:
        return STYLES[name]
    digest = int(hashlib.sha256(name.encode()).hexdigest(), 16)  # stable across runs, unlike hash()
    return SPARE_COLOURS[digest % len(SPARE_COLOURS)], SPARE_MARKERS[(digest // 7) % len(SPARE_MARKERS)]


def colour(method: str) -> str:
    return style(method)[0]


def marker(method: str) -> str:
    return style(method)[1]


def variant_lines(variants: list[str]) -> dict[str, str]:
    """Line style per variant: a method's first variant solid, its others dashed and dotted, so two
    variants of one method share its colour and marker and differ by line."""
    seen: dict[str, int] = {}
    out = {}
    for v in sorted(variants):
        name = v.split(" ", 1)[0]
        out[v] = ("-", "--", "-.", ":")[seen.get(name, 0) % 4]
        seen[name] = seen.get(name, 0) + 1
    return out
