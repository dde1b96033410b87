"""memzoo.diagnose.state_drift's measures on hand-built states: an overflowed row is counted and left
out of the medians, drift is |S_G - S_0| / |S_0| and filler the same over the pairs' own write."""
from __future__ import annotations

import math

import torch

import memzoo.diagnose.state_drift as sd


def test_overflowed_rows_are_counted_and_the_medians_use_the_others() -> None:
    n = 4
    before = {"A": torch.ones(4, n, dtype=torch.float64)}  # S_pre
    after = {"A": 2 * torch.ones(4, n, dtype=torch.float64)}  # S_0: the pairs' write added ones
    now = after["A"].clone()
    now[1] += 2.0  # moved by |2 x ones| = |S_0|: drift 1, filler 2
    now[2, 0] = float("inf")  # overflowed
    now[3] *= 3.0  # moved by 2 |S_0|: drift 2, filler 4
    hits = torch.tensor([1.0, 1.0, 0.0, 0.5], dtype=torch.float64)
    (row,) = sd.state_metrics(before, after, {"A": now}, hits)
    assert row["state"] == "A" and row["numbers"] == n
    assert row["nonfinite_rows"] == 0.25
    assert math.isclose(row["recall_finite_rows"], 2.5 / 3) and row["recall_nonfinite_rows"] == 0.0
    assert math.isclose(row["drift_median"], 1.0)  # rows 0, 1, 3: drifts 0, 1, 2
    assert math.isclose(row["filler_over_write_median"], 2.0)  # the pairs' write is half of S_0
    assert math.isclose(row["log10_norm_median"], math.log10(4 * math.sqrt(n)))  # |S_G| of rows 0, 1, 3: 4, 8, 12


def test_flat_state_keeps_float_tensors_per_part() -> None:
    from memzoo.core.model import ModelState

    state = ModelState([{"S": torch.ones(2, 3, 3), "valid": torch.ones(2, 3, dtype=torch.bool)}],
                       {"A.0": torch.zeros(2, 5), "written": torch.ones(2, dtype=torch.bool)})
    flat = sd.flat_state(state)
    assert set(flat) == {"0.S", "model.A.0"}
    assert flat["0.S"].shape == (2, 9) and flat["0.S"].dtype == torch.float64
