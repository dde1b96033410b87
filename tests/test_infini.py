"""Infini-attention against the naive per-segment reference (values and gradients), the failure
modes PAPERS.md lists for public re-implementations, and no NaN from legal input (exact σ, the
denominator's floor, long calls with a late reset)."""
from __future__ import annotations

import pytest
import torch

from conftest import tiny_model, tiny_model_config
from memzoo.core.attention import LocalAttention
from memzoo.memories.infini import (
    InfiniAttention, InfiniConfig, retrieve, segmented_cumsum, sigma, update_delta, update_linear,
)
from memzoo.core.memory import LayerInputs
from memzoo.memories.reference import infini_reference

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


@pytest.mark.parametrize("rule", ["linear", "delta"])
@pytest.mark.parametrize("vectorized", [True, False])
def test_float64_plugin_matches_the_float64_reference_to_1e_10(rule: str, vectorized: bool) -> None:
    """A float64 plugin computes in float64 (the precision policy): against the float64 reference its
    outputs, state and gradients agree to 1e-10, where float32 arithmetic anywhere would leave 1e-6."""
    *qkv, reset = inputs()
    q, k, v = (t.detach().double().requires_grad_() for t in qkv)
    mem = plugin(rule, vectorized=vectorized).double()
    out, state = run_plugin(mem, q, k, v, reset)
    ref, ref_m, ref_z = infini_reference(q, k, v, mem.gate.beta, reset, rule)
    assert out.dtype == state["M"].dtype == state["z"].dtype == torch.float64
    for name, got, want in (("output", out, ref), ("M", state["M"], ref_m), ("z", state["z"], ref_z)):
        assert float((got - want).detach().abs().max()) < 1e-10, f"{name} differs from the float64 reference"
    w = torch.randn_like(out)
    grads = torch.autograd.grad((out * w).sum() + state["M"].sum() * 1e-3, (q, k, v, mem.gate.beta))
    ref_grads = torch.autograd.grad((ref * w).sum() + ref_m.sum() * 1e-3, (q, k, v, mem.gate.beta))
    for name, g, r in zip("q k v gate".split(), grads, ref_grads):
        assert float((g - r).abs().max()) < 1e-10, f"gradient of {name} differs from the float64 reference"


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
    from memzoo.core.model import MemoryModel

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


def test_sigma_is_exact_positive_and_its_gradient_finite() -> None:
    """σ = ELU + 1 to float32 rounding where `elu(x) + 1` cancels to 0 (x < −16.6); gradient 1 for x > 0,
    exp(x) for x <= 0 (1 at 0), finite at ±20 and at ±200 (where an unclamped exp branch gives inf * 0)."""
    x = torch.tensor([-200.0, -120.0, -60.0, -20.0, -16.0, -1e-6, 0.0, 1e-6, 0.5, 20.0, 200.0], requires_grad=True)
    y = sigma(x)
    x64 = x.detach().double()
    exact = torch.where(x64 > 0, x64 + 1, x64.exp())
    assert torch.allclose(y.double(), exact.float().double(), rtol=1e-6, atol=0), (y, exact)
    assert bool((y[2:] > 0).all()), "σ must be positive wherever exp(x) is representable"
    (grad,) = torch.autograd.grad(y.sum(), x)
    assert torch.isfinite(grad).all(), grad
    expected = torch.where(x64 > 0, torch.ones_like(x64), x64.exp())
    assert torch.allclose(grad.double(), expected.float().double(), rtol=1e-6, atol=0), (grad, expected)
    assert float(grad[6]) == 1.0  # at x = 0 the two pieces agree


def test_sigma_backward_is_autograd_of_its_formula() -> None:
    """The hand-written backward (grad * min(σ, 1)) against autograd through the plain formula
    where(x > 0, x + 1, exp(min(x, 0))): bitwise in float32 on random and boundary inputs, and
    torch's numerical gradcheck in float64."""
    g = torch.Generator().manual_seed(3)
    x = torch.cat((torch.randn(4000, generator=g) * 5, torch.tensor([0.0, -0.0, 1e-8, -1e-8, 88.0, -150.0])))
    fast, naive = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    y_fast = sigma(fast)
    y_naive = torch.where(naive > 0, naive + 1.0, torch.exp(torch.clamp(naive, max=0.0)))
    assert torch.equal(y_fast, y_naive)
    w = torch.randn(x.shape, generator=g)
    (g_fast,) = torch.autograd.grad((y_fast * w).sum(), fast)
    (g_naive,) = torch.autograd.grad((y_naive * w).sum(), naive)
    assert torch.equal(g_fast, g_naive)
    x64 = (torch.randn(64, generator=g, dtype=torch.float64) * 3).requires_grad_(True)
    assert torch.autograd.gradcheck(sigma, (x64,))


def far_negative_inputs(where: str, value: float, segments: slice = slice(1, None)):
    """inputs() with token 2 of the given segments (default 1 and 2) of both rows set to `value` in every
    coordinate: its query (where='q') or its key (where='k'); noise 0.1 keeps the coordinates distinct."""
    q, k, v, reset = inputs(seed=6)
    t = {"q": q, "k": k}[where].detach().clone()
    noise = 0.1 * torch.randn(t[:, segments, :, 2].shape, generator=torch.Generator().manual_seed(7))
    t[:, segments, :, 2] = value + noise
    t.requires_grad_(True)
    return (t, k, v, reset) if where == "q" else (q, t, v, reset)


@pytest.mark.parametrize("rule", ["linear", "delta"])
@pytest.mark.parametrize("vectorized", [True, False])
@pytest.mark.parametrize("value", [-20.0, -120.0])
def test_far_negative_query_reads_finite_values(rule: str, vectorized: bool, value: float) -> None:
    """A query with every coordinate near −20 (σ ≈ 2e-9: `elu + 1` gave 0/0) reads what the reference
    reads, and near −120 (σ underflows to 0 even when exact) reads 0 by the denominator's floor; outputs,
    state and gradients finite."""
    mem = plugin(rule, vectorized=vectorized)
    q, k, v, reset = far_negative_inputs("q", value)
    out, state = run_plugin(mem, q, k, v, reset)
    assert torch.isfinite(out).all() and torch.isfinite(state["M"]).all()
    ref, _, _ = infini_reference(q, k, v, mem.gate.beta, reset, rule)
    assert torch.allclose(out, ref, atol=1e-5, rtol=1e-4)
    grads = torch.autograd.grad(out.square().sum() + state["M"].sum(), (q, k, v))
    assert all(torch.isfinite(g).all() for g in grads)


def test_far_negative_query_reads_like_any_uniform_query() -> None:
    """σ(Q)M / (σ(Q)z) is invariant to scaling σ(Q): a query with all coordinates −20 reads exactly what
    one with all coordinates 0 reads (gate forced to memory). `elu + 1` makes the first 0/0."""
    mem = plugin("linear")
    with torch.no_grad():
        mem.gate.beta.fill_(30.0)  # sigmoid(30) = 1 in float32: the output is A_mem
    q, k, v, reset = inputs(seed=8)
    q = q.detach().clone()
    q[:, 1:, :, 0], q[:, 1:, :, 1] = -20.0, 0.0
    with torch.no_grad():
        out, _ = run_plugin(mem, q, k, v, reset)
    assert torch.allclose(out[:, 1:, :, 0], out[:, 1:, :, 1], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("rule", ["linear", "delta"])
@pytest.mark.parametrize("value", [-20.0, -120.0])
def test_far_negative_key_does_not_poison_memory(rule: str, value: float) -> None:
    """One key token near −20 (or −120, where σ is 0) in segment 1 (memory not empty): M and z stay
    finite, and segment 2's memory reads (gate forced to memory) equal those of a run with that key at
    −60 (contribution ~1e-26, no floor involved). With `elu + 1` the delta rule's inner read for that
    key was 0/0, and M stayed NaN until the next reset."""
    mem = plugin(rule, vectorized=False)
    with torch.no_grad():
        mem.gate.beta.fill_(30.0)  # sigmoid(30) = 1 in float32: the output is A_mem
    q, k, v, reset = far_negative_inputs("k", value, segments=slice(1, 2))
    _, k_small, _, _ = far_negative_inputs("k", -60.0, segments=slice(1, 2))
    reset[:] = False  # both rows carry their memory into segment 2
    with torch.no_grad():
        out, state = run_plugin(mem, q, k, v, reset)
        out_small, state_small = run_plugin(mem, q, k_small, v, reset)
    assert torch.isfinite(state["M"]).all() and torch.isfinite(state["z"]).all()
    assert torch.isfinite(out).all()
    assert torch.allclose(out[:, 2], out_small[:, 2], atol=1e-6, rtol=1e-5)
    assert torch.allclose(state["M"], state_small["M"], atol=1e-5, rtol=1e-5)


def test_segmented_cumsum_restarts_at_every_start() -> None:
    """Against a plain loop, with several restarts per row, one at s = 0, and a row with none."""
    g = torch.Generator().manual_seed(9)
    x = torch.randn(4, 13, 2, 3, generator=g)
    start = torch.rand(4, 13, generator=g) < 0.3
    start[1, 0] = True
    start[2] = False
    expected = torch.zeros_like(x)
    for b in range(4):
        run = torch.zeros(2, 3)
        for s in range(13):
            run = x[b, s] + (0 if start[b, s] else run)
            expected[b, s] = run
    assert torch.allclose(segmented_cumsum(x, start), expected, atol=1e-6)
    assert torch.allclose(segmented_cumsum(x, torch.zeros(4, 13, dtype=torch.bool)), x.cumsum(1), atol=1e-6)


def test_long_call_with_late_reset_matches_the_loop() -> None:
    """2,000 segments in one call, a reset 4 segments before the end: the vectorized linear path and the
    loop (float32) each match a float64 loop to 1e-5 on every read. Taking the sums after the reset as
    differences of the whole call's cumulative sums was off by 1.9e-4 here."""
    s_total, n, d = 2000, 4, 4
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, s_total, 1, n, d, generator=g, dtype=torch.float64) for _ in range(3))
    reset = torch.zeros(1, s_total, dtype=torch.bool)
    reset[0, s_total - 4] = True
    mem = InfiniAttention(InfiniConfig(rule="linear"), tiny_model_config(d_model=d, n_heads=1), 0)
    state = mem.initial_state(1, torch.device("cpu"))
    with torch.no_grad():
        exact, _, _ = mem.segment_loop(sigma(q), sigma(k), v, reset, {key: t.double() for key, t in state.items()})
        sq, sk, v32 = sigma(q.float()), sigma(k.float()), v.float()
        fast, _, fast_state = mem.linear_all_segments(sq, sk, v32, reset, state)
        loop, _, loop_state = mem.segment_loop(sq, sk, v32, reset, state)
    assert float((loop.double() - exact).abs().max()) < 1e-5
    assert float((fast.double() - exact).abs().max()) < 1e-5
    assert float((fast - loop).abs().max()) < 1e-5
    assert torch.allclose(fast_state["M"], loop_state["M"], atol=1e-5) and torch.equal(fast_state["z"] > 0, loop_state["z"] > 0)


def test_rules_agree_until_the_second_write() -> None:
    """The delta rule's correction reads the memory before writing; with one write behind it (the
    capacity suite's G = 1: pairs in segment 0, queries in segment 1) the memory is empty, so both
    rules give the same outputs and gradients. From the third segment on they differ."""
    q, k, v, _ = inputs()
    reset = torch.zeros(B, S, dtype=torch.bool)
    lin, delta = run_plugin(plugin("linear"), q, k, v, reset)[0], run_plugin(plugin("delta"), q, k, v, reset)[0]
    assert torch.allclose(lin[:, :2], delta[:, :2], atol=1e-6, rtol=1e-5)  # [B, S, H, N, D]: segments 0 and 1
    assert (lin[:, 2:] - delta[:, 2:]).abs().max() > 1e-3
    w = torch.randn_like(lin[:, :2])
    g_lin = torch.autograd.grad((lin[:, :2] * w).sum(), (q, k, v))
    g_delta = torch.autograd.grad((delta[:, :2] * w).sum(), (q, k, v))
    for name, a, b in zip("qkv", g_lin, g_delta):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-5), name


# --- normalizer="gamma": ARMT's γ-corrected z on the delta rule (not the paper's method) ---


@pytest.mark.parametrize("first_read", ["zeros", "skip"])
def test_gamma_normalizer_matches_reference_values_and_gradients(first_read: str) -> None:
    """The fast path with normalizer=gamma against the reference's key-by-key γ (values and gradients)."""
    q, k, v, reset = inputs(1)
    mem = InfiniAttention(InfiniConfig(rule="delta", first_read=first_read, normalizer="gamma"),
                          tiny_model_config(d_model=H * D, n_heads=H), 0)
    with torch.no_grad():
        mem.gate.beta.copy_(torch.tensor([0.7, -1.2]))
    out, state = run_plugin(mem, q, k, v, reset)
    ref, ref_m, ref_z = infini_reference(q, k, v, mem.gate.beta, reset, "delta", first_read, normalizer="gamma")
    assert torch.allclose(out, ref, atol=1e-5, rtol=1e-4)
    assert torch.allclose(state["M"], ref_m, atol=1e-4, rtol=1e-4)
    assert torch.allclose(state["z"], ref_z, atol=1e-5, rtol=1e-5)
    _, paper_m, paper_z = infini_reference(q, k, v, mem.gate.beta, reset, "delta", first_read)
    assert not torch.allclose(state["z"], paper_z, atol=1e-2, rtol=1e-2), "gamma gave the paper's z (vacuous)"
    w = torch.randn_like(out)
    loss = lambda o, m, z: (o * w).sum() + m.sum() * 1e-3 + z.sum() * 1e-2  # noqa: E731
    grads = torch.autograd.grad(loss(out, state["M"], state["z"]), (q, k, v, mem.gate.beta))
    ref_grads = torch.autograd.grad(loss(ref, ref_m, ref_z), (q, k, v, mem.gate.beta))
    for name, g, r in zip("q k v gate".split(), grads, ref_grads):
        assert torch.allclose(g, r, atol=1e-4, rtol=1e-3), f"gradient of {name} differs from the reference"


def test_gamma_normalizer_is_not_the_papers_z() -> None:
    """Two segments written by hand: z_2 = z_1 + Σ_t clip(1 − z_1ᵀσ(K_t)/‖σ(K_t)‖², 0, 1) σ(K_t), with
    z_1 = Σ_t σ(K_t) (an empty memory: γ = 1). Fails if the option silently falls back to the paper's z."""
    q, k, v, reset = inputs(2)
    reset[:] = False
    with torch.no_grad():
        _, gamma_state = run_plugin(plugin_with(normalizer="gamma"), q[:, :2], k[:, :2], v[:, :2], reset[:, :2])
        _, paper_state = run_plugin(plugin_with(), q[:, :2], k[:, :2], v[:, :2], reset[:, :2])
        sk1, sk2 = sigma(k[:, 0]), sigma(k[:, 1])  # [B, H, N, D]
        z1 = sk1.sum(dim=-2)
        raw = 1 - torch.einsum("bhnk,bhk->bhn", sk2, z1) / sk2.square().sum(-1)
        z2 = z1 + (raw.clamp(0, 1)[..., None] * sk2).sum(dim=-2)
    assert bool((raw < 1).all()), "every γ should be below 1 once the memory holds something"
    assert torch.allclose(gamma_state["z"], z2, rtol=1e-5, atol=1e-5)
    assert torch.allclose(paper_state["z"], z1 + sk2.sum(dim=-2), rtol=1e-5, atol=1e-5)
    assert float((paper_state["z"] - gamma_state["z"]).abs().max()) > 0.1
    assert torch.equal(gamma_state["M"], paper_state["M"])  # the normaliser of the second write only: M_2 reads z_1


def plugin_with(**options) -> InfiniAttention:
    mem = InfiniAttention(InfiniConfig(rule="delta", **options), tiny_model_config(d_model=H * D, n_heads=H), 0)
    with torch.no_grad():
        mem.gate.beta.copy_(torch.tensor([0.7, -1.2]))
    return mem


def test_gamma_normalizer_is_clipped_and_detached() -> None:
    """γ in [0, 1] (z never decreases, even for keys the normaliser over-covers) and a constant:
    ∂z'/∂z = I through the γ-weighted sum."""
    g = torch.Generator().manual_seed(6)
    sk = sigma(torch.randn(1, 2, 5, D, generator=g))
    m = torch.randn(1, 2, D, D, generator=g)
    for scale, want in ((0.05, "inside"), (50.0, "clipped")):
        z = (scale * torch.rand(1, 2, D, generator=g)).requires_grad_()
        raw = 1 - torch.einsum("bhnk,bhk->bhn", sk, z.detach()) / sk.square().sum(-1)
        if want == "inside":
            assert bool(((raw > 0) & (raw < 1)).all())
        else:
            assert bool((raw < 0).all())
        _, z_new = update_delta(m, z, sk, torch.randn(1, 2, 5, D, generator=g), normalizer="gamma")
        assert bool((z_new >= z).all())
        w = torch.randn_like(z_new)
        (grad,) = torch.autograd.grad((z_new * w).sum(), z)
        assert torch.equal(grad, w), "gradient flows through γ"


def test_gamma_normalizer_refused_with_the_linear_rule() -> None:
    with pytest.raises(ValueError, match="normalizer='gamma'.*'linear' rule"):
        InfiniAttention(InfiniConfig(rule="linear", normalizer="gamma"), tiny_model_config(), 0)
    with pytest.raises(ValueError, match="normalizer='ARMT'"):
        InfiniAttention(InfiniConfig(rule="delta", normalizer="ARMT"), tiny_model_config(), 0)
