"""memzoo.diagnose.armt_write_gate: the recorded writes are attributed to the right layer and segment,
and β's shut share and medians are what hand-built writes give."""
from __future__ import annotations

import math

import torch

from conftest import tiny_model

import memzoo.diagnose.armt_write_gate as wg


def test_gate_stats_on_hand_built_writes() -> None:
    beta = torch.tensor([[0.0, 1e-7], [0.5, 1.0]], dtype=torch.float64)  # [B, m]
    k = torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=torch.float64)
    stats = wg.gate_stats([(beta, k, 2 * k)])
    assert stats["beta_shut_share"] == 0.5  # 0 and 1e-7 are below 1e-6
    assert stats["beta_median"] == 1e-7  # torch's median: the lower of the middle two
    assert stats["k_norm_median"] == 2.0 and stats["v_norm_median"] == 4.0 and stats["nonfinite_share"] == 0.0
    k[1, 1] = float("nan")  # an overflowed row's write: left out of every median
    stats = wg.gate_stats([(beta, k, 2 * k)])
    assert stats["nonfinite_share"] == 0.25 and stats["beta_median"] == 1e-7 and stats["beta_shut_share"] == 2 / 3


def test_each_layer_and_segment_gets_its_own_writes() -> None:
    """Layer 0's β shut by its bias, layer 1's open: the recorder must not mix the layers up, and
    records one write per layer per segment (through the plugin's probe), and stops listening when it leaves."""
    model = tiny_model("armt", options={"w_v_init_std": 0.3})
    with torch.no_grad():
        model.model_memory.layers[0].W_beta.bias.fill_(-1e3)
        model.model_memory.layers[1].W_beta.bias.fill_(1e3)
    n, segments = model.cfg.segment_len, 3
    tokens = torch.randint(0, 256, (2, segments * n), generator=torch.Generator().manual_seed(0))
    per_segment = wg.writes_per_segment(model, tokens, segments)
    with wg.recorded_writes() as calls:
        with torch.no_grad():
            model(tokens[:, :n].view(2, 1, n))
    inside = len(calls)
    with torch.no_grad():
        model(tokens[:, :n].view(2, 1, n))
    assert inside == model.cfg.n_layers and len(calls) == inside  # one write a layer inside, none after
    assert len(per_segment) == segments and all(len(s) == model.cfg.n_layers for s in per_segment)
    shut = wg.gate_stats([s[0] for s in per_segment])
    open_ = wg.gate_stats([s[1] for s in per_segment])
    assert shut["beta_shut_share"] == 1.0 and shut["beta_median"] == 0.0
    assert open_["beta_shut_share"] == 0.0 and math.isclose(open_["beta_median"], 1.0)
    assert shut["k_norm_median"] > 0 and open_["v_norm_median"] > 0


def test_delta_gain_counts_aligned_keys() -> None:
    """m keys along one direction with β = 1 and a z that covers them (den = ‖k‖² + ε): the batched
    write subtracts m times A's value there (gain m); orthogonal keys, once each (gain 1); β scales it."""
    eps = 1e-5
    k = torch.zeros(2, 3, 4, dtype=torch.float64)
    k[0, :, 0] = 2.0  # row 0: three copies of one key
    k[1, 0, 0], k[1, 1, 1], k[1, 2, 2] = 2.0, 2.0, 2.0  # row 1: three orthogonal keys
    z = torch.tensor([[1.0, 0, 0, 0], [1.0, 1.0, 1.0, 0]], dtype=torch.float64) * 2.0  # zᵀk = 4 = ‖k‖²
    ones = torch.ones(2, 3, 1, dtype=torch.float64)
    gain = wg.delta_gain(k, z, ones, eps, 1.0)
    assert torch.allclose(gain, torch.tensor([3 * 4 / (4 + eps), 4 / (4 + eps)], dtype=torch.float64))
    assert torch.allclose(wg.delta_gain(k, z, 0.5 * ones, eps, 1.0), gain / 2)
    k[0, 0, 0] = float("inf")
    assert torch.isnan(wg.delta_gain(k, z, ones, eps, 1.0)[0])
