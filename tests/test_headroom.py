"""Headroom recovered, (local - memory) / (local - full) on segments >= 1, with Fieller's interval:
checked against numbers computed by hand, and never reported as inf or NaN."""
from __future__ import annotations

import math

import pandas as pd
import pytest

from memzoo.analysis.bpb import headroom_recovered
from memzoo.analysis.stats import ratio_interval

T_975_2 = 0.95 / math.sqrt(2 * 0.975 * 0.025)  # Student's t at 97.5% with 2 degrees of freedom: (2p - 1) / sqrt(2p(1 - p))


def test_a_constant_denominator_gives_the_t_interval_of_the_numerator_divided_by_it() -> None:
    # a = 1, 2, 3 (mean 2, sd 1); b = 2 every seed: R = 1, and with s_bb = 0 Fieller's interval is
    # (mean a ± t sd / sqrt(3)) / 2 = 1 ± 4.3027 / (2 sqrt 3) = 1 ± 1.24207
    est = ratio_interval([1.0, 2.0, 3.0], [2.0, 2.0, 2.0])
    half = T_975_2 / (2 * math.sqrt(3))
    assert est.status == "bounded"
    assert est.value == pytest.approx(1.0)
    assert est.low == pytest.approx(1 - half, abs=1e-12) and est.high == pytest.approx(1 + half, abs=1e-12)


def test_a_correlated_denominator_narrows_the_interval_as_fieller_says() -> None:
    # a = 2b exactly: (ā - R b̄)² = (2 - R)² b̄² and the variance term (2 - R)² s_bb / n: R = 2 is the
    # only solution when b̄² > t² s_bb / n, so the interval closes on 2
    b = [1.0, 1.1, 0.9]
    est = ratio_interval([2 * x for x in b], b)
    assert est.status == "bounded"
    assert est.low == pytest.approx(2.0, abs=1e-9) and est.high == pytest.approx(2.0, abs=1e-9)


def test_full_equal_to_local_is_undefined_not_inf_or_nan() -> None:
    est = ratio_interval([0.1, 0.2, 0.3], [0.0, 0.0, 0.0])
    assert est.status == "undefined" and est.value is None and est.low is None and est.high is None


def test_a_denominator_not_distinguishable_from_zero_gives_no_finite_interval() -> None:
    est = ratio_interval([0.1, 0.2, 0.3], [0.1, -0.05, 0.02])
    assert est.status == "unbounded" and est.low is None and est.high is None
    assert est.value == pytest.approx(0.2 / (0.07 / 3))


def runs(method: str, per_seed: list[list[float]]) -> list[dict]:
    return [{"method": method, "seed": s, "bpb_by_segment": v, "tokens_by_segment": [10] * len(v)}
            for s, v in enumerate(per_seed)]


def test_headroom_recovered_by_hand_with_the_segment_zero_gain_beside_it() -> None:
    df = pd.DataFrame(
        runs("local", [[4.0, 3.0, 3.0], [4.1, 3.1, 3.3], [3.9, 2.9, 2.9]])
        + runs("full", [[4.0, 2.0, 2.0], [4.1, 2.2, 2.2], [3.9, 1.9, 1.9]])  # local - full: 1.0, 1.0, 1.0
        + runs("mixer", [[3.5, 2.5, 2.5], [3.6, 2.6, 2.8], [3.4, 2.4, 2.4]])  # local - mixer: 0.5 every seed
    )
    table = headroom_recovered(df).set_index("method")
    assert table.loc["full", "headroom"] == pytest.approx(1.0)
    assert table.loc["local", "headroom"] == 0.0
    assert table.loc["mixer", "headroom"] == pytest.approx(0.5)
    assert table.loc["mixer", "headroom_status"] == "bounded"
    assert table.loc["mixer", "headroom_lo"] == pytest.approx(0.5) and table.loc["mixer", "headroom_hi"] == pytest.approx(0.5)
    assert table.loc["mixer", "diff_seg0_vs_local"] == pytest.approx(-0.5)  # its gain is there before memory


def test_full_above_local_leaves_no_headroom_instead_of_an_inverted_ratio() -> None:
    """local - full = -0.1 every seed (full worse): a memory 0.2 below local would read -2.0 "recovered";
    it is reported as no headroom, with no value or interval."""
    df = pd.DataFrame(
        runs("local", [[4.0, 3.0], [4.1, 3.1], [3.9, 2.9]])
        + runs("full", [[4.0, 3.1], [4.1, 3.2], [3.9, 3.0]])
        + runs("xl", [[4.0, 2.8], [4.1, 2.9], [3.9, 2.7]])
    )
    table = headroom_recovered(df).set_index("method")
    for method in ("xl", "full"):
        assert table.loc[method, "headroom_status"] == "no headroom (full above local)"
        assert table.loc[method, ["headroom", "headroom_lo", "headroom_hi"]].isna().all()


def test_no_full_runs_means_no_headroom_table() -> None:
    df = pd.DataFrame(runs("local", [[4.0, 3.0]]) + runs("xl", [[4.0, 2.0]]))
    assert headroom_recovered(df).empty


def test_range_differences_by_hand_per_range_and_training_step() -> None:
    """Token-weighted bits per byte over each named range of segments, and the paired difference from
    local at the same training step (not another step's local)."""
    from memzoo.analysis.bpb import range_differences

    rows = []
    for step, shift in ((100, 0.0), (200, -1.0)):  # at step 200 everything is 1 lower: local too
        for r in runs("local", [[4.0, 3.0, 3.0, 3.0], [4.0, 3.2, 3.0, 3.0]]) + runs("full", [[4.0, 2.0, 3.5, 3.5], [4.0, 2.4, 3.3, 3.3]]):
            rows.append({**r, "step": step, "bpb_by_segment": [v + shift for v in r["bpb_by_segment"]],
                         "tokens_by_segment": [10, 10, 30, 10]})
    table = range_differences(pd.DataFrame(rows), {"seg0": (0, 0), "near": (1, 1), "far": (2, None), "after": (1, None)},
                              keys=("method", "step")).set_index(["method", "step", "range"])
    for step in (100, 200):
        assert table.loc[("full", step, "seg0"), "diff_vs_local"] == pytest.approx(0.0)
        assert table.loc[("full", step, "near"), "diff_vs_local"] == pytest.approx(-0.9)  # -1.0 and -0.8
        assert table.loc[("full", step, "far"), "diff_vs_local"] == pytest.approx(0.4)  # +0.5 and +0.3
        # segments 1..3 weighted 10, 30, 10: seed 0 (2 + 3 x 3.5 + 3.5 - 3 x 5) / 5 = +0.2; seed 1 (2.4 + 13.2 - 15.2) / 5 = +0.08
        assert table.loc[("full", step, "after"), "diff_vs_local"] == pytest.approx(0.14)
        assert table.loc[("full", step, "far"), "seeds"] == 2
    assert table.loc[("local", 200, "near"), "bpb"] == pytest.approx(2.1)
    assert table.loc[("full", 100, "far"), "ci"] == pytest.approx(12.706 * 0.1, rel=1e-3)  # sd 0.1414 / sqrt 2 x t(1)


def test_memory_ablation_by_hand_is_the_reset_minus_the_read_per_seed() -> None:
    from memzoo.analysis.bpb import memory_ablation

    rows = []
    for seed, (read, reset) in enumerate([([4.0, 2.0, 3.0], [4.0, 2.5, 3.5]), ([4.0, 2.2, 3.0], [4.0, 2.5, 3.5])]):
        rows.append({"method": "xl", "seed": seed, "bpb_by_segment": read, "tokens_by_segment": [10, 10, 30],
                     "valid_bpb_by_segment_reset": reset})
    rows.append({"method": "local", "seed": 0, "bpb_by_segment": [4.0, 3.0, 3.0], "tokens_by_segment": [10, 10, 30],
                 "valid_bpb_by_segment_reset": [4.0, 3.0, 3.0]})
    table = memory_ablation(pd.DataFrame(rows)).set_index("method")
    # seed 0: (2.5 + 3 x 3.5 - 2 - 3 x 3) / 4 = 0.5; seed 1: (2.5 + 10.5 - 2.2 - 9) / 4 = 0.45 (segment 0 left out)
    assert table.loc["xl", "memory_gain"] == pytest.approx(0.475)
    assert table.loc["xl", "ci"] == pytest.approx(12.706 * 0.025, rel=1e-3)
    assert table.loc["local", "memory_gain"] == 0.0 and table.loc["local", "seeds"] == 1

