"""One colour and one marker per method, the same in every figure, so a reader who learns that
Titans-MAG is the red star finds it again on the next page. A method outside the zoo (a plugin)
gets a pair of its own from its name, drawn from colours and markers the zoo does not use.
"""
from __future__ import annotations

import hashlib
import math

# method -> (colour, marker): every colour distinct, and every (colour, marker) pair distinct.
STYLES: dict[str, tuple[str, str]] = {
    "local": ("#000000", "o"),
    "full": ("#7f7f7f", "s"),
    "xl": ("#1f77b4", ">"),
    "compressive": ("#6baed6", "v"),
    "memorizing": ("#17becf", "D"),
    "rmt": ("#9467bd", "^"),
    "armt": ("#c49cde", "<"),
    "infini-linear": ("#2ca02c", "H"),
    "infini-delta": ("#8fd175", "P"),
    "infty-former": ("#8c564b", "h"),
    "deltanet": ("#ff7f0e", "d"),
    "gated-deltanet": ("#fdb462", "X"),
    "titans-mag": ("#d62728", "*"),
    "titans-mac": ("#e377c2", "p"),
}
# Legends list methods in this order in every figure (the zoo's order: controls, caches, token memories,
# matrix memories, neural memories), whatever order a figure drew them in.
METHOD_ORDER = tuple(STYLES)
# for methods the zoo does not ship: none of these colours is in STYLES
SPARE_COLOURS = ("#bcbd22", "#393b79", "#843c39", "#7b4173", "#637939", "#e7969c")
SPARE_MARKERS = ("8", "o", "s", "D", "^", "v")  # filled, as seaborn will not mix filled and line markers


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


def legend_order(handles: list, labels: list[str]) -> tuple[list, list[str]]:
    """Legend entries sorted by METHOD_ORDER (a variant after its method; unknown names after the zoo's,
    then entries that name no method, each group in the order drawn)."""
    def key(item: tuple[int, str]) -> tuple[int, int]:
        index, label = item
        name = label.split(" ", 1)[0]
        return (METHOD_ORDER.index(name) if name in METHOD_ORDER else len(METHOD_ORDER), index)

    order = [i for i, _ in sorted(enumerate(labels), key=key)]
    return [handles[i] for i in order], [labels[i] for i in order]


def ordered_legend(ax) -> tuple[list, list[str]]:
    """An Axes' legend entries in METHOD_ORDER: `ax.legend(*ordered_legend(ax), ...)`."""
    return legend_order(*ax.get_legend_handles_labels())


def spread(xs: dict[str, list[float]], factor: float = 1.2, near: float = 1.15) -> dict[str, list[float]]:
    """x positions (on a log axis) with the methods whose x values lie within a ratio `near` of each other
    placed side by side, `factor` apart around the group's geometric mean, in METHOD_ORDER, so that no
    marker hides another at (nearly) equal state. A method alone keeps its x."""
    points = sorted((x, METHOD_ORDER.index(m.split(" ", 1)[0]) if m.split(" ", 1)[0] in METHOD_ORDER
                     else len(METHOD_ORDER), m, i) for m, values in xs.items() for i, x in enumerate(values))
    groups: list[list[tuple]] = []
    for point in points:
        if groups and point[0] <= groups[-1][0][0] * near:
            groups[-1].append(point)
        else:
            groups.append([point])
    out = {m: list(values) for m, values in xs.items()}
    for group in groups:
        if len({p[2] for p in group}) < 2:
            continue
        centre = math.exp(sum(math.log(p[0]) for p in group) / len(group))
        for rank, (_, _, m, i) in enumerate(sorted(group, key=lambda p: (p[1], p[2]))):
            out[m][i] = centre * factor ** (rank - (len(group) - 1) / 2)
    return out
