"""The invariants every memory must pass (docs/architecture.md), as plain functions on a tiny model, so the
project's parametrised tests and `memzoo check PLUGIN` run one implementation.

Each `check_xxx(method, options)` builds the tiny model afresh, returns None when the invariant
holds, raises AssertionError saying what failed and where when it does not, and raises `NotApplicable`
when it cannot be checked (the footprint card of an out-of-tree plugin that has none).
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from memzoo.core.losses import token_nll
from memzoo.core.memory import state_numbers
from memzoo.core.model import MemoryModel
from memzoo.core.plugins import get_memory
from memzoo.data.corpus import Batch
from memzoo.training.windows import train_window
from memzoo.conformance.catalog import card_footprint, load_cards
from memzoo.conformance.precision import check_precision, check_precision_bf16
from memzoo.conformance.tiny import (B, N, S, V, NotApplicable, boundary, first_over, max_diff, streamed,
                                     tiny_memory_config, tiny_model, tiny_model_config, tokens)


def check_causality(method: str, options: dict[str, Any]) -> None:
    """Changing tokens at positions >= t changes no output at positions < t (t inside segment 1)."""
    model = tiny_model(method, options=options)
    x = tokens()
    t = N + 3
    y = x.clone().view(B, S * N)
    y[:, t:] = (y[:, t:] + 17) % V
    y = y.view(B, S, N)
    with torch.no_grad():
        a = model(x).logits.reshape(B, S * N, V)  # [B, S*N, V]
        b = model(y).logits.reshape(B, S * N, V)
    before = max_diff(a[:, :t], b[:, :t])
    assert before < 1e-5, (f"an output before position {t} depends on a token at or after {t} "
                           f"(max diff {before:.2e}, {first_over(a[:, :t], b[:, :t], 1e-5)})")
    assert max_diff(a[:, t:], b[:, t:]) > 1e-4, "the change had no effect at all (vacuous test)"


def check_reach(method: str, options: dict[str, Any]) -> None:
    """A token two whole segments back changes the current output iff the method has memory."""
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


def check_streaming(method: str, options: dict[str, Any]) -> None:
    """Segment by segment through the state API == one call over all segments (with a reset)."""
    model = tiny_model(method, options=options)
    x = tokens()
    reset = boundary(1, 2)
    with torch.no_grad():
        one_shot = model(x, reset=reset).logits  # [B, S, N, V]
        by_segment = streamed(model, x, reset)
    diff = max_diff(by_segment, one_shot)
    assert diff < 1e-4, (f"streaming segment by segment differs from one call by {diff:.2e} "
                         f"({first_over(by_segment, one_shot, 1e-4, 'segment')})")


def check_partial_last_segment(method: str, options: dict[str, Any]) -> None:
    """A final segment shorter than N gives the same outputs as the start of the full segment."""
    model = tiny_model(method, options=options)
    x = tokens(s=3)
    with torch.no_grad():
        full = model(x).logits  # [B, 3, N, V]
        state = model(x[:, :2]).state
        part = model(x[:, 2:, :5], state).logits  # [B, 1, 5, V]
    diff = max_diff(part[:, 0], full[:, 2, :5])
    assert diff < 1e-4, (f"a last segment of 5 tokens differs from the first 5 of the full segment by {diff:.2e} "
                         f"({first_over(part[:, 0], full[:, 2, :5], 1e-4)})")


def check_reset(method: str, options: dict[str, Any]) -> None:
    """After a document boundary a row's outputs equal those of a fresh state; other rows keep memory."""
    model = tiny_model(method, options=options)
    x = tokens()
    reset = boundary(0, 2)
    with torch.no_grad():
        with_reset = model(x, reset=reset).logits  # [B, S, N, V]
        fresh = model(x[:, 2:]).logits  # [B, S-2, N, V]
    diff = max_diff(with_reset[0, 2:], fresh[0])
    assert diff < 1e-4, f"reset row does not start from a fresh state (row 0 reset at segment 2, diff {diff:.2e})"
    if model.spec.cls.has_memory:
        assert max_diff(with_reset[1, 2:], fresh[1]) > 1e-5, "a row without a boundary lost its memory"


def check_footprint(method: str, options: dict[str, Any], segments: Sequence[int] = (1, 3)) -> None:
    """Numbers in a real state == the plugin's analytic `footprint` (after 1 and after 3 segments)."""
    for s in segments:
        model = tiny_model(method, options=options)
        with torch.no_grad():
            state = model(tokens(s=s)).state
        measured = state_numbers(state.all(), B)
        parts = model.spec.cls.footprint(model.memory_cfg, model.cfg, s * N)
        assert measured == parts["total"], f"measured {measured} != analytic {parts['total']} after {s} segment(s)"


def check_footprint_card(method: str, options: dict[str, Any], segments: Sequence[int] = (1, 3)) -> None:
    """The plugin's analytic footprint == its card's formula (memzoo/registry/) on the same config."""
    card = load_cards().get(method)
    if card is None:
        raise NotApplicable(f"{method} has no card in memzoo/registry/ (an out-of-tree plugin)")
    model_cfg, memory_cfg = tiny_model_config(), tiny_memory_config(method, options)
    for s in segments:
        parts = get_memory(method).cls.footprint(memory_cfg, model_cfg, s * N)
        expected = parts.get("table1", parts["total"])
        got = card_footprint(card, model_cfg, memory_cfg, s * N)
        assert got == expected, f"card formula gives {got} != analytic {expected} after {s} segment(s)"


def embedding_grads(model: MemoryModel, s_loss: int, k: int) -> list[float]:
    """Gradient norm at each segment's embeddings when only segment s_loss has a loss, BPTT over k."""
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
    try:
        train_window(model, batch, bptt_segments=k)
    finally:
        handle.remove()
    # Embedding outputs are [B, k, N, d] per call (layer-major) or [B, N, d] per segment.
    per_segment = []
    for e in embeds:
        g = e.grad if e.grad is not None else torch.zeros_like(e)
        per_segment.extend(g.unbind(1) if e.dim() == 4 else [g])
    assert len(per_segment) == S, f"expected {S} segments of embeddings, saw {len(per_segment)}"
    return [float(g.norm()) for g in per_segment]


def check_gradient_horizon(method: str, options: dict[str, Any], losses_at: Sequence[int] = (3, 2)) -> None:
    """Truncated BPTT in blocks of k segments (the state is detached between blocks): the loss at
    segment s reaches back to its block's first segment when the method carries gradient through its
    state, and never into the previous block. At a block's last segment that is s-k+1 and not s-k."""
    k = 2
    for s_loss in losses_at:
        block_start = (s_loss // k) * k
        model = tiny_model(method, options=options)
        norms = embedding_grads(model, s_loss, k)
        where = f"loss at segment {s_loss}, k={k}: embedding gradient norms by segment {norms}"
        assert norms[s_loss] > 0, f"no gradient at the loss's own segment ({where})"
        assert all(n == 0.0 for n in norms[:block_start]), f"gradient crossed the truncation horizon ({where})"
        assert all(n == 0.0 for n in norms[s_loss + 1 :]), f"gradient reached later segments ({where})"
        cls = model.spec.cls
        within = norms[block_start:s_loss]
        if cls.has_memory and cls.gradient_through_state:
            assert all(n > 0 for n in within), f"gradient does not flow through the state within the horizon ({where})"
        else:
            assert all(n == 0.0 for n in within), f"state is meant to stop gradient but it flowed ({where})"


def check_finite(method: str, options: dict[str, Any], scale: float = 1e4, gain: float = 1e3) -> None:
    """No NaN/inf in outputs, state or gradients when hidden states are huge: the embedding (tied to
    the head) scaled by `scale` makes the residual stream huge (what model memories and the head
    see), and the attention norms' gain by `gain` makes the inputs every layer memory sees huge;
    forward and backward over S segments with a document boundary."""
    model = tiny_model(method, options=options)
    model.train()
    with torch.no_grad():
        model.embed.weight.mul_(scale)
        for block in model.blocks:
            block.norm_attn.weight.mul_(gain)  # h, q, k, v of the layer's memory: [B, S, (H,) N, D] x gain
    x = tokens()
    reset = boundary(0, 2)
    out = model(x, reset=reset)
    loss = token_nll(out.logits, torch.roll(x, -1, dims=-1)).mean() + out.aux_loss
    loss.backward()
    bad = [] if torch.isfinite(out.logits).all() else ["logits"]
    bad += [] if torch.isfinite(out.aux_loss).all() else ["aux loss"]
    bad += [f"state[{i}][{key!r}]" for i, st in enumerate(out.state.all()) for key, value in st.items()
            if value.is_floating_point() and not torch.isfinite(value).all()]
    bad += [f"grad {name}" for name, p in model.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()]
    assert not bad, f"not finite with the embedding x{scale:g} and attention inputs x{gain:g}: {', '.join(bad[:6])}" + (
        f" and {len(bad) - 6} more" if len(bad) > 6 else "")


# The invariants in the order `memzoo check` runs and prints them.
INVARIANTS: dict[str, Callable[[str, dict[str, Any]], None]] = {
    "causality": check_causality,
    "reach": check_reach,
    "streaming": check_streaming,
    "partial-segment": check_partial_last_segment,
    "reset": check_reset,
    "footprint": check_footprint,
    "footprint-card": check_footprint_card,
    "gradient-horizon": check_gradient_horizon,
    "finite": check_finite,
    "precision": check_precision,
    "precision-bf16": check_precision_bf16,
}
