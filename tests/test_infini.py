"""Infini-attention against the naive per-segment reference (values and gradients), and the
failure modes PAPERS.md lists for public re-implementations."""
from __future__ import annotations

import pytest
import torch

from conftest import tiny_model, tiny_model_config
from memzoo.attention import LocalAttention
from memzoo.memories.infini import InfiniAttention, InfiniConfig, retrieve, sigma, update_delta, update_linear
from memzoo.memory import LayerInputs
from memzoo.reference import infini_reference

B, S, H, N, D = 2, 3, 2, 6, 8


def inputs(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, S, H, N, D, generator=g, requires_grad=True) for _ in range(3))
    reset = torch.zeros(B, S, dtype=torch.bool)
    reset[1, 2] = True  # row 1 starts a new document at segment 2
    return q, k, v, reset


def plugin(rule: str, first_read: str = "zeros", vectorized: bool = True) -> InfiniAttention:
    model_cfg = tiny_model_config(d_model=H * D, n_heads=H)
    mem = InfiniAttention(InfiniConfig(rule=rule, first_read=first_read, vectorized=vectorized), model_cfg, 0)
    with torch.no_grad():
        mem.gate.beta.copy_(torch.tensor([0.7, -1.2]))
    return mem


def run_plugin(mem: InfiniAttention, q, k, v, reset):
    h = torch.zeros(B, S, N, H * D)
    x = LayerInputs(h, q, k, v, reset, LocalAttention(10000.0), project_kv=lambda t: (t, t))
    out, state, _ = mem(x, mem.initial_state(B, q.device))
    return out, state


@pytest.mark.parametrize("rule", ["linear", "delta"])
@pytest.mark.parametrize("first_read", ["zeros", "skip"])
@pytest.mark.parametrize("vectorized", [True, False])
def test_matches_naive_reference_values_and_gradients(rule: str, first_read: str, vectorized: bool) -> None:
    q, k, v, reset = inputs()
    mem = plugin(rule, first_read, vectorized)
    out, state = run_plugin(mem, q, k, v, reset)
    ref, ref_m, ref_z = infini_reference(q, k, v, mem.gate.beta, reset, rule, first_read)
    assert torch.allclose(out, ref, atol=1e-5, rtol=1e-4)
    assert torch.allclose(state["M"], ref_m, atol=1e-4, rtol=1e-4)
    assert torch.allclose(state["z"], ref_z, atol=1e-4, rtol=1e-4)

    w = torch.randn_like(out)
    grads = torch.autograd.grad((out * w).sum() + state["M"].sum() * 1e-3, (q, k, v, mem.gate.beta))
    ref_grads = torch.autograd.grad((ref * w).sum() + ref_m.sum() * 1e-3, (q, k, v, mem.gate.beta))
    for name, g, r in zip("q k v gate".split(), grads, ref_grads):
        assert torch.allclose(g, r, atol=1e-4, rtol=1e-3), f"gradient of {name} differs from the reference"


def test_denominator_is_one_scalar_per_token() -> None:
    """σ(Q)M / (σ(Q)z): scaling z's direction changes every output coordinate of a token by the same factor."""
    g = torch.Generator().manual_seed(3)
    sq = sigma(torch.randn(1, 1, 4, D, generator=g))
    m = torch.rand(1, 1, D, D, generator=g)
    z = torch.rand(1, 1, D, generator=g) + 0.1
    out = retrieve(sq, m, z)
    expected = (sq @ m) / (sq @ z[..., None])  # [1, 1, 4, D] / [1, 1, 4, 1]
    assert torch.allclose(out, expected)
    elementwise = (sq @ m) / (sq * z[:, :, None, :])
    assert not torch.allclose(out, elementwise)


def test_delta_rule_leaves_stored_binding_unchanged() -> None:
    """After writing (K, V), a delta update with V' = what the memory returns for K changes nothing."""
    g = torch.Generator().manual_seed(4)
    sk = sigma(torch.randn(1, 1, 5, D, generator=g))
    v = torch.randn(1, 1, 5, D, generator=g)
    m0, z0 = torch.zeros(1, 1, D, D), torch.zeros(1, 1, D)
    m1, z1 = update_linear(m0, z0, sk, v)
    stored = retrieve(sk, m1, z1)
    m2, _ = update_delta(m1, z1, sk, stored)
    assert torch.allclose(m2, m1, atol=1e-5)
    m_lin, _ = update_linear(m1, z1, sk, stored)
    assert not torch.allclose(m_lin, m1, atol=1e-3), "the linear rule does write it again (control)"


def test_memory_path_has_no_positional_encoding() -> None:
    """The memory read ignores positions: the same query at two positions of a segment reads the same
    value (gate forced to memory), and permuting a previous segment's tokens leaves M unchanged."""
    mem = plugin("linear")
    with torch.no_grad():
        mem.gate.beta.fill_(30.0)  # sigmoid(30) = 1: the output is A_mem
    q, k, v, reset = inputs()
    q = q.detach().clone()
    q[:, 1, :, 5] = q[:, 1, :, 1]  # segment 1: the query at position 5 repeats the one at position 1
    with torch.no_grad():
        out, _ = run_plugin(mem, q, k, v, reset)
    assert torch.allclose(out[:, 1, :, 5], out[:, 1, :, 1], atol=1e-5)

    mem = plugin("linear")
    q, k, v, reset = inputs()
    reset[:] = False
    perm = torch.randperm(N, generator=torch.Generator().manual_seed(5))
    k2, v2 = k.detach().clone(), v.detach().clone()
    k2[:, 0], v2[:, 0] = k2[:, 0, :, perm], v2[:, 0, :, perm]
    with torch.no_grad():
        _, s1 = run_plugin(mem, q, k, v, reset)
        _, s2 = run_plugin(mem, q, k2, v2, reset)
    assert torch.allclose(s1["M"], s2["M"], atol=1e-4)


def test_gate_starts_unsaturated_and_has_its_own_optimiser_settings() -> None:
    model = tiny_model("infini-linear")
    gates = [m.gate_values() for m in model.memories]
    assert all(torch.allclose(g, torch.full_like(g, 0.5)) for g in gates)
    from memzoo.model import MemoryModel

    cfg = InfiniConfig(gate_lr_mult=10.0, gate_weight_decay=0.0)
    model = MemoryModel(tiny_model_config(), "infini-linear", cfg)
    groups = model.optim_groups(weight_decay=0.1, lr=1e-3)
    gate_ids = {id(m.gate.beta) for m in model.memories}
    for g in groups:
        ids = {id(p) for p in g["params"]}
        if ids & gate_ids:
            assert ids <= gate_ids and g["lr"] == pytest.approx(1e-2) and g["weight_decay"] == 0.0


def test_one_memory_per_layer_head_and_row() -> None:
    """Rows and heads do not share memory: changing row 0's head 0 input leaves the rest alone."""
    mem = plugin("linear")
    q, k, v, reset = inputs()
    k2 = k.detach().clone()
    k2[0, 0, 0] += 1.0
    with torch.no_grad():
        _, s1 = run_plugin(mem, q, k, v, reset)
        _, s2 = run_plugin(mem, q, k2, v, reset)
    changed = (s1["M"] - s2["M"]).abs().amax(dim=(-1, -2)) > 1e-6  # [B, H]
    assert changed.tolist() == [[True, False], [False, False]]


def test_state_stays_float32_under_bf16_autocast() -> None:
    model = tiny_model("infini-delta")
    x = torch.randint(0, 256, (2, 2, 8))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(x)
    for st in out.state.layers:
        assert st["M"].dtype == torch.float32 and st["z"].dtype == torch.float32
    assert torch.isfinite(out.logits).all()


def test_bad_rule_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="rule='hebbian'"):
        InfiniAttention(InfiniConfig(rule="hebbian"), tiny_model_config(), 0)
