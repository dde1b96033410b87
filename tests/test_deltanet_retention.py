"""memzoo.diagnose.deltanet_retention: the pairs' part of a DeltaNet state is carried by hand-checkable
erasures and decay, and the split S = P + F holds on a real (untrained) model's stream."""
from __future__ import annotations

import math

import pytest
import torch

from conftest import tiny_model
from memzoo.evaluations.generate import StreamingDecoder

import memzoo.diagnose.deltanet_retention as dr


def tokens_of(k: torch.Tensor, g: float, beta: float) -> tuple[torch.Tensor, ...]:
    """k [T, D] as one segment of T tokens, batch 1, head 1: (k [1, 1, 1, T, D], g and β [1, 1, 1, T], reset [1, 1])."""
    t = k.shape[0]
    full = torch.full((1, 1, 1, t), 1.0, dtype=torch.float64)
    return k[None, None, None], g * full, beta * full, torch.zeros(1, 1, dtype=torch.bool)


def test_carry_by_hand() -> None:
    p = torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=torch.float64)[None, None]  # [1, 1, Dv, Dk], not symmetric
    e1 = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    # β = 0, α = 1: nothing moves
    assert torch.equal(dr.carry(p, *tokens_of(e1.repeat(3, 1), 0.0, 0.0), chunk_size=2), p)
    # β = 0, α = 1/2 on each of 3 tokens: P / 8 (DeltaNet's α ≡ 1 would keep P)
    assert torch.allclose(dr.carry(p, *tokens_of(e1.repeat(3, 1), math.log(0.5), 0.0), chunk_size=2), p / 8)
    # β = 1 along k = e1: P (I − e1 e1ᵀ) erases P's first column (the key e1's value), keeps the second
    erased = dr.carry(p, *tokens_of(e1, 0.0, 1.0), chunk_size=2)
    assert torch.allclose(erased, torch.tensor([[0.0, 2.0], [0.0, 4.0]], dtype=torch.float64)[None, None])
    # β = 1/2 twice along e1: the first column halves twice
    halved = dr.carry(p, *tokens_of(e1.repeat(2, 1), 0.0, 0.5), chunk_size=1)
    assert torch.allclose(halved, torch.tensor([[0.25, 2.0], [0.75, 4.0]], dtype=torch.float64)[None, None])


@pytest.mark.parametrize("method", ["gated-deltanet", "deltanet"])
def test_split_adds_up_to_the_models_state(method: str) -> None:
    """Stream a pairs' segment then filler through an untrained model: P + F equals the model's S after
    every call, P starts as the whole state, and P shrinks (β > 0 erases it); the recorder stops listening when it leaves."""
    model = tiny_model(method).eval()
    layers = [m for m in model.modules() if isinstance(m, dr.gdn.GatedDeltaNet)]
    n = model.cfg.segment_len
    tokens = torch.randint(0, 256, (2, 6 * n), generator=torch.Generator().manual_seed(0))
    split = dr.PairsSplit(len(layers), layers[0].cfg.chunk_size)
    decoder = StreamingDecoder(model, 2, 2, "fp32")
    with torch.no_grad(), dr.recorded(split):
        decoder.feed(tokens[:, :n])
        p0 = [p.clone() for p in split.p]
        assert all(torch.equal(p, s) for p, s in zip(split.p, split.s))
        split.phase = "filler"
        decoder.feed(tokens[:, n:])
        split.phase = "query"
        decoder.peek(tokens[:, :n])
    with torch.no_grad():
        decoder.feed(tokens[:, :n])  # outside: not recorded
    assert split.calls == (1 + 3 + 1) * len(layers)  # pairs: 1 call, filler: 5 segments in 3 calls of <= 2, peek: 1
    for layer in range(len(layers)):
        assert split.split_error[layer] < 1e-5
        assert torch.allclose(split.p[layer] + split.f[layer], split.s[layer], atol=1e-5)
        assert dr.frob(split.p[layer]).max() < dr.frob(p0[layer]).min()
        assert split.q[layer].shape == (2, model.cfg.n_heads, n, model.cfg.d_head)
    metrics = dr.layer_metrics(split, 0, p0[0], [[0, 3], [5]])
    assert 0 < metrics["retention_median"] < 1 and metrics["split_error"] < 1e-5
    assert 0 < metrics["beta_filler_mean"] < 1 and metrics["beta_filler_small_share"] < 1
    assert (metrics["log_alpha_filler_mean"] < 0) == (method == "gated-deltanet")
