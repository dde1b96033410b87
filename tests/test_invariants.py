"""The invariants every registered memory must pass (docs/architecture.md), parametrised over the registry,
so a new plugin inherits them by registering. The checks themselves are memzoo.conformance.invariants,
which `memzoo check PLUGIN` runs too: these tests are thin wrappers over the same functions."""
from __future__ import annotations

import dataclasses

import pytest

from conftest import CASES, METHODS
from memzoo.conformance import invariants as inv
from memzoo.conformance.catalog import load_cards

IDS = [c[0] for c in CASES]


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_causality(case: tuple) -> None:
    inv.check_causality(case[1], case[2])


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_reach(case: tuple) -> None:
    inv.check_reach(case[1], case[2])


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_streaming_equals_one_shot(case: tuple) -> None:
    inv.check_streaming(case[1], case[2])


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_partial_last_segment(case: tuple) -> None:
    inv.check_partial_last_segment(case[1], case[2])


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_reset_equals_fresh_state(case: tuple) -> None:
    inv.check_reset(case[1], case[2])


@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("segments", [1, 3])
def test_footprint_measured_analytic_card(case: tuple, segments: int) -> None:
    """Numbers in a real state == the plugin's formula == the card's formula on the same config."""
    inv.check_footprint(case[1], case[2], [segments])
    try:
        inv.check_footprint_card(case[1], case[2], [segments])
    except inv.NotApplicable as why:
        pytest.skip(str(why))


@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("s_loss", [3, 2], ids=["block-end", "block-start"])
def test_gradient_horizon(case: tuple, s_loss: int) -> None:
    inv.check_gradient_horizon(case[1], case[2], [s_loss])


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_finite_at_extreme_inputs(case: tuple) -> None:
    inv.check_finite(case[1], case[2])


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_precision_float64_runs_no_narrower_op(case: tuple) -> None:
    inv.check_precision(case[1], case[2])


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_precision_bf16_autocast_keeps_policy_state(case: tuple) -> None:
    inv.check_precision_bf16(case[1], case[2])


def test_every_implemented_method_has_a_card() -> None:
    cards = load_cards()
    missing = [m for m in METHODS if m not in cards]
    assert not missing, f"registered in-tree methods without a card: {missing}"


@pytest.mark.parametrize("method", METHODS)
def test_card_defaults_are_the_registered_config(method: str) -> None:
    """One source of truth: the card lists every option of the method with its real default."""
    from memzoo.core.plugins import get_memory

    card = load_cards().get(method)
    if card is None:
        pytest.skip(f"{method} has no card (an out-of-tree plugin)")
    config = dataclasses.asdict(get_memory(method).config())
    assert card.defaults == config, f"card defaults {card.defaults} != config {config}"
