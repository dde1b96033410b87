"""memzoo.publishing.curves (what experiments/lm-stream/curve.py prints) on hand-made runs: a suite cut off by a lease is compared at the last
step every run reached, and the step table gives the hand-computed differences and headroom there."""
from __future__ import annotations

import pandas as pd
import pytest

from memzoo.analysis.bpb import headroom_recovered, range_differences

import memzoo.publishing.curves as curve

# bits per byte after segment 0 at step 200, per (method, seed): local - full is 0.4 and 0.2, local - m 0.1 and 0.1
AFTER = {("local", 0): 2.0, ("local", 1): 2.2, ("full", 0): 1.6, ("full", 1): 2.0, ("m", 0): 1.9, ("m", 1): 2.1}


def rows(last_full_step: int) -> pd.DataFrame:
    out = []
    for (method, seed), after in AFTER.items():
        for step in (100, 200, 300):
            if method == "full" and step > last_full_step:
                continue  # cut off by the lease
            # m's gain grows with the step (none at 100, twice step 200's at 300): headroom differs by step
            moved = after + (0.1 * (200 - step) / 100 if method == "m" else 0.0)
            out.append({"method": method, "seed": seed, "step": step, "bpb_by_segment": [3.0, moved, moved],
                        "tokens_by_segment": [128, 128, 128]})
    return pd.DataFrame(out)


def test_a_cut_off_suite_is_compared_at_the_last_step_every_run_reached() -> None:
    assert curve.common_step(rows(200)) == 200
    assert curve.common_step(rows(300)) == 300


def test_the_step_table_gives_the_differences_and_headroom_by_hand() -> None:
    data = rows(200)
    table = range_differences(data, curve.RANGES, keys=("method", "step"))
    at = headroom_recovered(data[data["step"] == 200])
    m = at.set_index("method").loc["m"]
    assert m["headroom"] == pytest.approx(0.2 / 0.6)  # mean(local - m) / mean(local - full) = 0.1 / 0.3
    text = curve.step_table(table, at, 200)
    line = next(row for row in text.splitlines() if row.startswith("| `m`"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[1] == "2" and cells[2] == "+0.000 ± 0.000" and cells[3] == "-0.100 ± 0.000"
    assert cells[4] == "0.33 (unbounded)"  # two seeds: t(1) = 12.7 leaves Fieller's interval open
    full = next(row for row in text.splitlines() if row.startswith("| `full`"))
    assert "-0.300 ± " in full and full.rstrip(" |").endswith("1 (ceiling)")
    step = curve.common_step(data)
    assert headroom_recovered(data[data["step"] == step]).set_index("method").loc["m", "headroom"] == pytest.approx(1 / 3)
