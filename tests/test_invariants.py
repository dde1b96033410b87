"""The invariants every registered memory must pass (DESIGN.md), parametrised over the registry,
so a new plugin inherits them by registering."""
from __future__ import annotations

import pytest
import torch

from conftest import CASES, METHODS, tiny_model
from memzoo.core.memory import state_numbers
from memzoo.data.corpus import Batch
from memzoo.running.train import train_window
from memzoo.suites.catalog import card_footprint, load_cards

B, S, N, V = 2, 4, 8, 256


def tokens(seed: int = 1, s: int = S) -> torch.Tensor:
    return torch.randint(0, V, (B, s, N), generator=torch.Generator().manual_seed(seed))


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max())


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_causality(case: tuple) -> None:
    """Changing tokens at positions >= t changes no output at positions < t (t inside segment 1)."""
    _, method, options = case
    model = tiny_model(method, options=options)
    x = tokens()
    t = N + 3
    y = x.clone().view(B, S * N)
    y[:, t:] = (y[:, t:] + 17) % V
    y = y.view(B, S, N)
    with torch.no_grad():
        a = model(x).logits.reshape(B, S * N, V)
        b = model(y).logits.reshape(B, S * N, V)
    assert max_diff(a[:, :t], b[:, :t]) < 1e-5, "an output before t depends on a token at or after t"
    assert max_diff(a[:, t:], b[:, t:]) > 1e-4, "the change had no effect at all (vacuous test)"


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_reach(case: tuple) -> None:
    """A token two whole segments back changes the current output iff the method has memory."""
    _, method, options = case
    model = tiny_model(method, options=options)
    x = tokens()
    y = x.clone()
    y[:, 0, 3] = (y[:, 0, 3] + 101) % V
    with torch.no_grad():
        diff = max_diff(model(x).logits[:, 2], model(y).logits[:, 2])
    if model.spec.cls.has_memory:
        assert diff > 1e-5, f"{method}: segment 0 does not reach segment 2 (diff {diff:.2e})"
    else:
        assert diff == 0.0, f"{method} has no memory but segment 0 changed segment 2 (diff {diff:.2e})"


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_streaming_equals_one_shot(case: tuple) -> None:
    """Segment by segment through the state API == one call over all segments (with a reset)."""
    _, method, options = case
    model = tiny_model(method, options=options)
    x = tokens()
    reset = torch.zeros(B, S, dtype=torch.bool)
    reset[1, 2] = True
    with torch.no_grad():
        one_shot = model(x, reset=reset).logits
        state, parts = model.initial_state(B), []
        for s in range(S):
            out = model(x[:, s : s + 1], state, reset[:, s : s + 1])
            state = out.state
            parts.append(out.logits)
    assert max_diff(torch.cat(parts, dim=1), one_shot) < 1e-4


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_partial_last_segment(case: tuple) -> None:
    """A final segment shorter than N gives the same outputs as the start of the full segment."""
    _, method, options = case
    model = tiny_model(method, options=options)
    x = tokens(s=3)
    with torch.no_grad():
        full = model(x).logits
        state = model(x[:, :2]).state
        part = model(x[:, 2:, :5], state).logits
    assert max_diff(part[:, 0], full[:, 2, :5]) < 1e-4


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_reset_equals_fresh_state(case: tuple) -> None:
    """After a document boundary a row's outputs equal those of a fresh state; other rows keep memory."""
    _, method, options = case
    model = tiny_model(method, options=options)
    x = tokens()
    reset = torch.zeros(B, S, dtype=torch.bool)
    reset[0, 2] = True
    with torch.no_grad():
        with_reset = model(x, reset=reset).logits
        fresh = model(x[:, 2:]).logits
    assert max_diff(with_reset[0, 2:], fresh[0]) < 1e-4, "reset row does not start from a fresh state"
    if model.spec.cls.has_memory:
        assert max_diff(with_reset[1, 2:], fresh[1]) > 1e-5, "a row without a boundary lost its memory"


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("segments", [1, 3])
def test_footprint_measured_analytic_card(case: tuple, segments: int) -> None:
    """Numbers in a real state == the plugin's formula == the card's formula on the same config."""
    _, method, options = case
    model = tiny_model(method, options=options)
    with torch.no_grad():
        state = model(tokens(s=segments)).state
    measured = state_numbers(state.all(), B)
    parts = model.spec.cls.footprint(model.memory_cfg, model.cfg, segments * N)
    assert measured == parts["total"], f"measured {measured} != analytic {parts['total']}"
    card = load_cards().get(method)
    if card is None:
        pytest.skip(f"{method} has no card in registry/ (an out-of-tree plugin)")
    expected = parts.get("table1", parts["total"])
    assert card_footprint(card, model.cfg, model.memory_cfg, segments * N) == expected


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("s_loss", [3, 2], ids=["block-end", "block-start"])
def test_gradient_horizon(case: tuple, s_loss: int) -> None:
    """Truncated BPTT in blocks of k segments (the state is detached between blocks): the loss at
    segment s reaches back to its block's first segment when the method carries gradient through its
    state, and never into the previous block. At a block's last segment that is s-k+1 and not s-k."""
    _, method, options = case
    k = 2
    block_start = (s_loss // k) * k
    model = tiny_model(method, options=options)
    model.train()
    embeds: list[torch.Tensor] = []

    def keep(_module, _inp, out):
        out.retain_grad()
        embeds.append(out)

    handle = model.embed.register_forward_hook(keep)
    x = tokens()
    targets = torch.roll(x, -1, dims=-1)
    mask = torch.zeros(B, S, N, dtype=torch.bool)
    mask[:, s_loss] = True
    reset = torch.zeros(B, S, dtype=torch.bool)
    batch = Batch(x, targets, mask, reset, torch.arange(S).expand(B, S))
    train_window(model, batch, bptt_segments=k)
    handle.remove()
    # Embedding outputs are [B, k, N, d] per call (layer-major) or [B, N, d] per segment.
    per_segment = []
    for e in embeds:
        g = e.grad if e.grad is not None else torch.zeros_like(e)
        per_segment.extend(g.unbind(1) if e.dim() == 4 else [g])
    assert len(per_segment) == S
    norms = [float(g.norm()) for g in per_segment]
    assert norms[s_loss] > 0
    assert all(n == 0.0 for n in norms[:block_start]), f"gradient crossed the truncation horizon: {norms}"
    assert all(n == 0.0 for n in norms[s_loss + 1 :]), f"gradient reached later segments: {norms}"
    cls = model.spec.cls
    within = norms[block_start:s_loss]
    if cls.has_memory and cls.gradient_through_state:
        assert all(n > 0 for n in within), f"gradient does not flow through the state within the horizon: {norms}"
    else:
        assert all(n == 0.0 for n in within), f"state is meant to stop gradient but it flowed: {norms}"


def test_every_implemented_method_has_a_card() -> None:
    cards = load_cards()
    missing = [m for m in METHODS if m not in cards]
    assert not missing, f"registered in-tree methods without a card: {missing}"



@pytest.mark.parametrize("method", METHODS)
def test_card_defaults_are_the_registered_config(method: str) -> None:
    """One source of truth: the card lists every option of the method with its real default."""
    import dataclasses

    from memzoo.core.plugins import get_memory

    card = load_cards().get(method)
    if card is None:
        pytest.skip(f"{method} has no card (an out-of-tree plugin)")
    config = dataclasses.asdict(get_memory(method).config())
    assert card.defaults == config, f"card defaults {card.defaults} != config {config}"
