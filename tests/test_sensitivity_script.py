"""experiments/precision/sensitivity.py: the nudge of the initial weights and the differences table."""
from __future__ import annotations

import pytest
import torch

from experiments.precision.sensitivity import differences, perturb_weights


def test_the_nudge_is_relative_reproducible_and_leaves_the_global_rng_alone() -> None:
    torch.manual_seed(0)
    a, b = torch.nn.Linear(64, 64).double(), torch.nn.Linear(64, 64).double()
    b.load_state_dict(a.state_dict())
    before = [p.detach().clone() for p in a.parameters()]
    rng = torch.get_rng_state()
    perturb_weights(a, 1e-7)
    assert torch.equal(torch.get_rng_state(), rng)  # sampling and dropout of the run are not shifted
    perturb_weights(b, 1e-7)
    for p, q, w in zip(a.parameters(), b.parameters(), before):
        assert torch.equal(p, q)  # the same nudge every time
        ratio = (p.detach() / w - 1).abs() / 1e-7  # |noise| of a standard normal
        assert float(ratio.max()) < 6 and float(ratio.mean()) == pytest.approx(0.8, abs=0.1)
    with pytest.raises(ValueError, match="rel=-1"):
        perturb_weights(a, -1.0)


def test_differences_are_from_the_one_thread_run_of_the_same_method() -> None:
    rows = [{"method": "a", "seed": 0, "condition": "1thread", "valid_bpb": 4.0},
            {"method": "a", "seed": 0, "condition": "perturbed", "valid_bpb": 4.25},
            {"method": "b", "seed": 0, "condition": "perturbed", "valid_bpb": 3.0}]
    assert [r["diff"] for r in differences(rows)] == [0.0, 0.25, None]
