"""The generated table of the shipped CPU cost rows (memzoo/references/cpu-cost.csv, measured by
benchmarks/speed/cpu_cost.py: one training window of every variant of a suite, timed beside `local`)."""
from __future__ import annotations

import pandas as pd

from memzoo.analysis.cpu_cost import REFERENCE, cpu_cost_table
from memzoo.publishing.formats import markdown


def cpu_cost_md(rows: pd.DataFrame) -> str:
    """Per variant, fastest first: its rounds, the median CPU seconds of one training window and its speed
    against `local` timed in the same rounds (local's median / the variant's: below 1 is slower), with no
    bytes carried before the window, then the speed with each larger carried context and the seconds at
    the largest."""
    table = cpu_cost_table(rows)
    carried = sorted(int(c) for c in rows["carried_bytes"].unique())
    first, later = carried[0], carried[1:]
    header = ["method", "rounds", f"CPU s a window ({first:,} bytes carried)", "speed vs local"]
    header += [f"speed, {c:,} bytes carried" for c in later]
    header += [f"CPU s, {later[-1]:,} bytes carried"] if later else []

    def speed(r: pd.Series, c: int) -> str:
        value = r[f"speed_{c}"]
        return "–" if value != value else ("1 (ref)" if r["variant"] == REFERENCE else f"{value:.2f}")

    out = []
    for _, r in table.iterrows():
        cells = [f"`{r['variant']}`", str(int(r["rounds"])), f"{r[f'seconds_{first}']:.2f}", speed(r, first)]
        cells += [speed(r, c) for c in later]
        if later:
            last = r[f"seconds_{later[-1]}"]
            cells.append("–" if last != last else f"{last:.2f}")
        out.append(cells)
    return markdown(header, out, right=list(range(1, len(header))))
