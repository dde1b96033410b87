"""∞-former: the continuous signal (ridge fit, padding, contraction), the long-term read against the
paper's formulas, the short-term memory and what it feeds the long-term one, the empty-memory rule,
reach, sticky memories and the KL auxiliary loss, checked against independent computations."""
from __future__ import annotations

import math

import pytest
import torch

from conftest import tiny_model, tiny_model_config
from memzoo.core.attention import LocalAttention
from memzoo.memories.infty_former import (
    InftyFormer,
    InftyFormerConfig,
    basis_matrix,
    expected_basis,
    first_positions,
    gaussian,
    kl_to_prior,
    new_positions,
    pad_positions,
    rbf_basis,
    ridge_fit,
    sample_positions,
    signal,
    sticky_positions,
)
from memzoo.core.memory import LayerInputs


def smooth_signal(t: torch.Tensor) -> torch.Tensor:
    """A smooth 3-channel signal X(t): [P] -> [P, 3]."""
    return torch.stack([torch.sin(2 * math.pi * t), torch.cos(3 * math.pi * t), t**2], dim=-1)


def test_basis_layout() -> None:
    mu, sigma = rbf_basis(8, [0.01, 0.05])
    assert mu.tolist() == pytest.approx([0, 0, 1 / 3, 1 / 3, 2 / 3, 2 / 3, 1, 1])
    assert sigma.tolist() == pytest.approx([0.01, 0.05] * 4)
    with pytest.raises(ValueError, match="multiple"):
        rbf_basis(7, [0.01, 0.05])


def test_closed_form_expectation_equals_numerical_integration() -> None:
    """r_i = ∫ N(t; μ, σ²) ψ_i(t) dt, closed form vs the trapezoid rule on a fine grid."""
    g = torch.Generator().manual_seed(0)
    mu_b = torch.rand(6, generator=g, dtype=torch.float64)
    sigma_b = torch.tensor([0.01, 0.05, 0.02, 0.1, 0.05, 0.01], dtype=torch.float64)
    mean = torch.rand(5, generator=g, dtype=torch.float64)
    var = torch.exp(torch.empty(5, dtype=torch.float64).uniform_(math.log(1e-4), math.log(0.5), generator=g))
    closed = expected_basis(mean, var, mu_b, sigma_b)  # [5, 6]
    t = torch.linspace(-4.0, 5.0, 400_001, dtype=torch.float64)
    density = gaussian(t, mean[:, None], var[:, None])  # [5, T]
    psi = basis_matrix(t, mu_b, sigma_b)  # [6, T]
    numeric = torch.trapezoid(density[:, None, :] * psi[None], t, dim=-1)  # [5, 6]
    assert torch.allclose(closed, numeric, rtol=1e-5, atol=1e-8)
    # and it is the read: E[V(t)] = Vᵀ r for V(t) = Vᵀψ(t)
    v = torch.randn(6, 3, generator=g, dtype=torch.float64)
    numeric_read = torch.trapezoid(density[:, :, None] * (psi.T @ v)[None], t, dim=1)  # [5, 3]
    assert torch.allclose(closed @ v, numeric_read, rtol=1e-5, atol=1e-8)


def test_ridge_fit_equals_least_squares_and_reconstructs() -> None:
    """B = (ΨΨᵀ + λI)⁻¹ΨX equals lstsq of the stacked system [Ψᵀ; √λ I] B = [X; 0], and X(t) ≈ Bᵀψ(t)."""
    mu, sigma = rbf_basis(64, [0.01, 0.05])
    t = first_positions(256)
    x = smooth_signal(t)  # [256, 3]
    lam = 0.5
    b = ridge_fit(x, t, mu, sigma, lam)  # [64, 3]
    psi = basis_matrix(t, mu, sigma)  # [64, 256]
    a = torch.cat((psi.T, math.sqrt(lam) * torch.eye(64, dtype=psi.dtype)))
    rhs = torch.cat((x, torch.zeros(64, 3, dtype=x.dtype)))
    ref = torch.linalg.lstsq(a, rhs).solution
    assert torch.allclose(b, ref, rtol=1e-6, atol=1e-8)
    assert torch.allclose(b.T, x.T @ psi.T @ torch.linalg.inv(psi @ psi.T + lam * torch.eye(64, dtype=psi.dtype)), atol=1e-8)
    err = (signal(b, t, mu, sigma) - x).abs().max()
    assert err < 0.03, f"reconstruction error {err:.3g}"


def test_contraction_keeps_the_old_signal_on_0_tau() -> None:
    """After adding a segment, the new signal at τu approximates the old one at u."""
    mu, sigma = rbf_basis(64, [0.01, 0.05])
    lam, tau, m, length = 0.5, 0.75, 256, 64
    t = first_positions(256)
    b_old = ridge_fit(smooth_signal(t), t, mu, sigma, lam)
    s = sample_positions(m)
    x_new = torch.randn(length, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    positions = torch.cat((tau * s, new_positions(length, tau)))
    b_new = ridge_fit(torch.cat((signal(b_old, s, mu, sigma), x_new)), positions, mu, sigma, lam)
    u = torch.linspace(0.05, 0.9, 200, dtype=torch.float64)
    old, new = signal(b_old, u, mu, sigma), signal(b_new, tau * u, mu, sigma)
    assert (old - new).abs().max() < 0.05
    assert (old - new).abs().mean() < 0.01
    # without the contraction (old signal read at u, not τu) it would not match
    assert (old - signal(b_new, u, mu, sigma)).abs().mean() > 0.1


def small_memory(**options) -> InftyFormer:
    """The LTM alone (no STM, no padding) unless options say otherwise."""
    cfg = InftyFormerConfig(**{"n_basis": 16, "n_samples": 64, "mem_len": 0, "ridge_padding": False, **options})
    torch.manual_seed(0)
    return InftyFormer(cfg, tiny_model_config(), 0)


def test_precomputed_write_equals_direct_refit() -> None:
    """The plugin's B_s = A B_{s-1} + G X_s equals the direct ridge fit on the contracted samples."""
    mem = small_memory()
    cfg, mu, sigma = mem.cfg, mem.basis_mu, mem.basis_sigma
    g = torch.Generator().manual_seed(2)
    b_old, x = torch.randn(2, 16, 32, generator=g), torch.randn(2, 5, 32, generator=g)  # partial segment, L=5 < N
    written = torch.tensor([True, False])
    b_new = mem.write(b_old, written, x, None)
    s = sample_positions(cfg.n_samples)
    positions = torch.cat((cfg.tau * s, new_positions(5, cfg.tau)))
    direct = ridge_fit(torch.cat((signal(b_old[0].double(), s, mu, sigma), x[0].double())), positions, mu, sigma, cfg.ridge_lambda)
    assert torch.allclose(b_new[0].double(), direct, atol=1e-4)
    first = ridge_fit(x[1].double(), first_positions(5), mu, sigma, cfg.ridge_lambda)
    assert torch.allclose(b_new[1].double(), first, atol=1e-4)
    # sticky positions at the uniform quantiles give (nearly) the same fit as m / M
    sticky = mem.write(b_old, written, x, sample_positions(cfg.n_samples).float().expand(2, -1))
    assert torch.allclose(sticky, b_new, atol=1e-3)


def layer_inputs(mem: InftyFormer, h: torch.Tensor) -> LayerInputs:
    """LayerInputs for a memory alone: q, k, v from fixed random projections of h [B, S, N, d]."""
    b, s, n, d = h.shape
    heads, dh = mem.n_heads, mem.d_head
    w = torch.randn(3, d, d, generator=torch.Generator().manual_seed(5)) / math.sqrt(d)
    q, k, v = (torch.einsum("bsnd,ed->bsne", h, w[i]).view(b, s, n, heads, dh).transpose(2, 3) for i in range(3))
    reset = torch.zeros(b, s, dtype=torch.bool)
    w_kv = torch.randn(2 * d, d, generator=torch.Generator().manual_seed(6)) / math.sqrt(d)

    def project_kv(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        kv = (x @ w_kv.T).view(x.shape[0], x.shape[1], 2, heads, dh).permute(2, 0, 3, 1, 4)
        return kv[0], kv[1]

    return LayerInputs(h, q, k, v, reset, LocalAttention(10000.0, "sdpa"), project_kv)


@pytest.mark.parametrize("kv_weights", ["own", "layer"])
def test_read_is_zero_when_empty_and_reaches_back(kv_weights: str) -> None:
    """Segment 0 reads an empty memory (output = local attention); segment 1 depends on segment 0's
    inputs, and its own inputs do not enter its read (the write comes after the read)."""
    mem = small_memory(kv_weights=kv_weights).eval()
    h = torch.randn(2, 2, 8, 32, generator=torch.Generator().manual_seed(3))
    x = layer_inputs(mem, h)
    with torch.no_grad():
        out, state, aux = mem(x, mem.initial_state(2, torch.device("cpu")))
        local = x.attend(x.q[:, 0], x.k[:, 0], x.v[:, 0])
        assert torch.equal(out[:, 0], local), "an empty memory must read 0"
        assert bool(state["written"].all())
        read1 = out[:, 1] - x.attend(x.q[:, 1], x.k[:, 1], x.v[:, 1])
        assert read1.abs().max() > 1e-4, "the read of segment 1 is zero although segment 0 was written"

        h2 = h.clone()
        h2[:, 0, 2] += 1.0  # change one input of segment 0 (through h only: the memory's write)
        out2, _, _ = mem(LayerInputs(h2, x.q, x.k, x.v, x.reset, x.attend, x.project_kv), mem.initial_state(2, torch.device("cpu")))
        assert (out2[:, 1] - out[:, 1]).abs().max() > 1e-5, "segment 0 does not reach segment 1"

        h3 = h.clone()
        h3[:, 1] += 1.0  # segment 1's own inputs are written after its read
        out3, _, _ = mem(LayerInputs(h3, x.q, x.k, x.v, x.reset, x.attend, x.project_kv), mem.initial_state(2, torch.device("cpu")))
        assert torch.equal(out3, out)


def test_sticky_positions_follow_the_reads() -> None:
    """Quantiles of the read histogram: uniform reads give ≈ uniform positions; a narrow read at 0.2
    puts most positions near 0.2; positions are sorted and in [0, 1]."""
    m = 64
    wide = sticky_positions(torch.full((1, 4), 0.5, dtype=torch.float64), torch.full((1, 4), 100.0, dtype=torch.float64), m, 32)
    assert torch.allclose(wide[0], (torch.arange(m, dtype=torch.float64) + 0.5) / m, atol=0.02)
    narrow = sticky_positions(torch.tensor([[0.2, 0.2]], dtype=torch.float64), torch.tensor([[1e-4, 1e-4]], dtype=torch.float64), m, 32)
    assert bool((narrow[0].diff() >= 0).all()) and bool(((narrow >= 0) & (narrow <= 1)).all())
    assert ((narrow - 0.2).abs() < 0.05).float().mean() > 0.9


def test_sticky_model_streams_like_one_call() -> None:
    model = tiny_model("infty-former")
    for mem in model.memories:
        mem.cfg.sticky_memories = True
    x = torch.randint(0, 256, (2, 3, 8), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        one = model(x).logits
        state, parts = model.initial_state(2), []
        for s in range(3):
            out = model(x[:, s : s + 1], state)
            state = out.state
            parts.append(out.logits)
    assert (torch.cat(parts, dim=1) - one).abs().max() < 1e-4


def test_kl_formula() -> None:
    """KL(N(μ, σ²) ‖ N(μ₀, σ₀²)) against torch.distributions; zero at the prior."""
    mean, var = torch.tensor([0.3, 0.7]), torch.tensor([0.01, 0.2])
    ref = torch.distributions.kl_divergence(torch.distributions.Normal(mean, var.sqrt()), torch.distributions.Normal(0.5, 0.1))
    assert torch.allclose(kl_to_prior(mean, var, 0.1, 0.5), ref, atol=1e-6)
    assert float(kl_to_prior(mean, torch.full((2,), 0.01), 0.1, None).abs().max()) < 1e-7


def test_kl_aux_loss_off_by_default_and_trains_the_query_side() -> None:
    x = torch.randint(0, 256, (2, 3, 8), generator=torch.Generator().manual_seed(7))
    model = tiny_model("infty-former")
    assert float(model(x).aux_loss) == 0.0
    for mem in model.memories:
        mem.cfg.kl_weight = 1.0
    model.train()
    aux = model(x).aux_loss
    assert float(aux.detach()) > 0
    aux.backward()
    mem = model.memories[0]
    assert float(mem.w_sigma.grad.abs().sum()) > 0, "no gradient to w_σ"
    assert float(mem.w_k.weight.grad.abs().sum()) > 0, "no gradient to W_K"
    qkv = model.blocks[0].attn.qkv.weight.grad
    d = model.cfg.d_model
    assert float(qkv[:d].abs().sum()) > 0, "no gradient to the queries' W_Q"
    # one segment only: every read is from an empty memory, so no KL
    model.zero_grad()
    assert float(model(x[:, :1]).aux_loss.detach()) == 0.0


def test_state_is_float32_under_autocast() -> None:
    model = tiny_model("infty-former")
    x = torch.randint(0, 256, (2, 2, 8))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        state = model(x).state
    assert all(s["B"].dtype == torch.float32 for s in state.layers)


def test_long_term_read_follows_the_paper_formulas() -> None:
    """The plugin's read against the paper computed independently, per head and query:
    K = B W_K, μ = sigmoid(w_μᵀ K q/√D), σ² = softplus(w_σᵀ K q/√D), and z = ∫ N(t; μ, σ²) Vᵀψ(t) dt
    by the trapezoid rule over t (not the closed form)."""
    mem = small_memory(n_basis=8)
    heads, dh, d = mem.n_heads, mem.d_head, mem.d_model
    g = torch.Generator().manual_seed(11)
    b = torch.randn(1, 8, d, generator=g)  # B [1, N, d]
    q = 3 * torch.randn(1, heads, 5, dh, generator=g)  # wide scores: σ² from ~0.06 to ~3
    with torch.no_grad():
        mem.w_sigma.copy_(torch.linspace(-4.0, 4.0, 8))
        z, mean, var = mem.read(q, b, project_kv=None)
    mu_b, sigma_b = mem.basis_mu, mem.basis_sigma
    t = torch.linspace(-5.0, 6.0, 50_001, dtype=torch.float64)
    psi = basis_matrix(t, mu_b, sigma_b)  # [N, T]
    w_k, w_v = mem.w_k.weight.double(), mem.w_v.weight.double()  # [d, d]: rows are head-major outputs
    for h in range(heads):
        rows = slice(h * dh, (h + 1) * dh)
        k_h, v_h = b[0].double() @ w_k[rows].T, b[0].double() @ w_v[rows].T  # [N, D]
        scores = q[0, h].double() @ k_h.T / math.sqrt(dh)  # [n, N]
        mu = torch.sigmoid(scores @ mem.w_mu.double())  # [n]
        var_ref = torch.nn.functional.softplus(scores @ mem.w_sigma.double()).clamp(min=mem.cfg.sigma_sq_min)  # [n]
        density = gaussian(t, mu[:, None], var_ref[:, None])  # [n, T]
        z_ref = torch.trapezoid(density[:, :, None] * (psi.T @ v_h)[None], t, dim=1)  # [n, D]
        assert torch.allclose(mean[0, h].double(), mu, atol=1e-6)
        assert torch.allclose(var[0, h].double(), var_ref, rtol=1e-5)
        assert torch.allclose(z[0, h].double(), z_ref, rtol=1e-4, atol=1e-5), (z[0, h].double() - z_ref).abs().max()
    assert float(var.min()) < 0.1 < 1.0 < float(var.max()), "the queries should span narrow and wide reads"


def test_padded_ridge_fit_is_least_squares_with_zero_targets() -> None:
    """Padding = extra positions outside [0, 1] whose target is 0 (authors' code): the fit equals lstsq
    of [Ψᵀ; Ψ_padᵀ; √λ I] B = [X; 0; 0], and the signal falls towards 0 beyond the ends."""
    mu, sigma = rbf_basis(16, [0.01, 0.05])
    t, lam = first_positions(40), 0.5
    x = smooth_signal(t) + 2.0  # far from 0 at the ends
    pad = pad_positions(40)
    assert pad.shape == (40,) and float(pad.min()) > -0.5 and float(pad.max()) < 1.5
    assert not bool(((pad >= 0) & (pad <= 1)).any())
    b = ridge_fit(x, t, mu, sigma, lam, pad)
    a = torch.cat((basis_matrix(t, mu, sigma).T, basis_matrix(pad, mu, sigma).T, math.sqrt(lam) * torch.eye(16, dtype=t.dtype)))
    rhs = torch.cat((x, torch.zeros(56, 3, dtype=x.dtype)))
    assert torch.allclose(b, torch.linalg.lstsq(a, rhs).solution, atol=1e-8)
    outside = torch.tensor([-0.3, 1.3], dtype=torch.float64)
    unpadded = ridge_fit(x, t, mu, sigma, lam)
    assert signal(b, outside, mu, sigma).abs().max() < 0.5 * signal(unpadded, outside, mu, sigma).abs().max()
    # the plugin's precomputed operators use the same padding
    mem = small_memory(ridge_padding=True)
    xs = torch.randn(1, 5, 32, generator=torch.Generator().manual_seed(8))
    b_first = mem.write(torch.zeros(1, 16, 32), torch.tensor([False]), xs, None)
    ref = ridge_fit(xs[0].double(), first_positions(5), mem.basis_mu, mem.basis_sigma, mem.cfg.ridge_lambda, pad_positions(5))
    assert torch.allclose(b_first[0].double(), ref, atol=1e-5)
    b_old = torch.randn(1, 16, 32, generator=torch.Generator().manual_seed(9))
    later = mem.write(b_old, torch.tensor([True]), xs, None)
    s = sample_positions(mem.cfg.n_samples)
    positions = torch.cat((mem.cfg.tau * s, new_positions(5, mem.cfg.tau)))
    past = signal(b_old[0].double(), s, mem.basis_mu, mem.basis_sigma)
    ref = ridge_fit(torch.cat((past, xs[0].double())), positions, mem.basis_mu, mem.basis_sigma, mem.cfg.ridge_lambda,
                    pad_positions(len(positions)))
    assert torch.allclose(later[0].double(), ref, atol=1e-4)


def stm_run(mem: InftyFormer, x: LayerInputs) -> list[dict]:
    """The states after each segment (S of them), run segment by segment."""
    state, states = mem.initial_state(x.q.shape[0], torch.device("cpu")), []
    for s in range(x.q.shape[1]):
        state = mem.reset_rows(state, x.reset[:, s])
        _, state, _ = mem.segment(x.segment(s), state)
        states.append(state)
    return states


def test_short_term_memory_feeds_the_long_term_only_what_it_evicts() -> None:
    """mem_len 12, segments of 8: segment 0 evicts nothing, segment 1 the oldest 4 states of segment 0,
    segment 2 the other 4 and segment 1's first 4. A row reset at segment 1 starts over: its first
    eviction, at segment 2, is the first 4 states of segment 1, fitted alone."""
    mem = small_memory(mem_len=12, ridge_padding=True).eval()
    h = torch.randn(2, 3, 8, 32, generator=torch.Generator().manual_seed(12))
    x = layer_inputs(mem, h)
    x.reset[1, 1] = True
    with torch.no_grad():
        states = stm_run(mem, x)
    mu, sigma, lam, tau = mem.basis_mu, mem.basis_sigma, mem.cfg.ridge_lambda, mem.cfg.tau

    def first_fit(v: torch.Tensor) -> torch.Tensor:
        return ridge_fit(v.double(), first_positions(len(v)), mu, sigma, lam, pad_positions(len(v)))

    assert not bool(states[0]["written"].any()) and float(states[0]["B"].abs().max()) == 0.0
    assert torch.equal(states[0]["stm"][:, 4:], h[:, 0]) and not bool(states[0]["stm_valid"][:, :4].any())
    assert states[1]["written"].tolist() == [True, False]
    assert torch.allclose(states[1]["B"][0].double(), first_fit(h[0, 0, :4]), atol=1e-5)
    assert float(states[1]["B"][1].abs().max()) == 0.0, "a reset row evicted nothing yet"
    s = sample_positions(mem.cfg.n_samples)
    positions = torch.cat((tau * s, new_positions(8, tau)))
    past = signal(states[1]["B"][0].double(), s, mu, sigma)
    new = torch.cat((h[0, 0, 4:], h[0, 1, :4])).double()
    ref = ridge_fit(torch.cat((past, new)), positions, mu, sigma, lam, pad_positions(len(positions)))
    assert torch.allclose(states[2]["B"][0].double(), ref, atol=1e-4)
    assert torch.allclose(states[2]["B"][1].double(), first_fit(h[1, 1, :4]), atol=1e-5)
    assert torch.equal(states[2]["stm"][0], torch.cat((h[0, 1, 4:], h[0, 2])))


def test_short_term_attention_is_xl_until_the_long_term_memory_has_something() -> None:
    """The STM read is Transformer-XL's (cache=hidden) over the same mem_len: equal outputs while the
    LTM is empty (segments 0 and 1 with mem_len = one segment), and from segment 2 on they differ by
    the LTM read alone."""
    from memzoo.memories.xl import TransformerXL, XLConfig

    mem = small_memory(mem_len=8).eval()
    xl = TransformerXL(XLConfig(mem_len=8, cache="hidden"), tiny_model_config(), 0)
    h = torch.randn(2, 3, 8, 32, generator=torch.Generator().manual_seed(13))
    x = layer_inputs(mem, h)
    with torch.no_grad():
        out, state, _ = mem(x, mem.initial_state(2, torch.device("cpu")))
        ref, _, _ = xl(x, xl.initial_state(2, torch.device("cpu")))
        assert torch.equal(out[:, :2], ref[:, :2])
        z, _, _ = mem.read(x.q[:, 2], stm_run(mem, x)[1]["B"], x.project_kv)
        assert float(z.abs().max()) > 1e-4
        assert torch.allclose(out[:, 2], ref[:, 2] + z, atol=1e-6)


def test_mem_len_must_be_a_non_negative_int() -> None:
    for bad in (-1, 2.5, True):
        with pytest.raises(ValueError, match=f"mem_len={bad!r}"):
            small_memory(mem_len=bad)


def test_a_key_value_stm_reads_as_the_hidden_one_where_keys_are_projections() -> None:
    """cache=kv keeps the keys and values the layer attended. Where those are W_K h and W_V h (no convolution)
    its STM reads as cache=hidden's, the LTM gets the same evicted h, and the state is what the footprint counts
    (2·H·D more numbers an STM slot)."""
    from dataclasses import replace

    from memzoo.core.memory import state_numbers

    h = torch.randn(2, 3, 8, 32, generator=torch.Generator().manual_seed(14))
    w = torch.randn(3, 32, 32, generator=torch.Generator().manual_seed(5)) / math.sqrt(32)  # layer_inputs' W_Q, W_K, W_V

    def project_kv(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        k, v = (torch.einsum("bmd,ed->bme", t, w[i]).view(t.shape[0], t.shape[1], 2, 16).transpose(1, 2) for i in (1, 2))
        return k, v

    outs, states = [], []
    for cache in ("hidden", "kv"):
        mem = small_memory(mem_len=12, cache=cache).eval()
        x = replace(layer_inputs(mem, h), project_kv=project_kv)
        with torch.no_grad():
            out, state, _ = mem(x, mem.initial_state(2, torch.device("cpu")))
        outs.append(out), states.append(state)
    assert float(outs[0].abs().max()) > 0 and torch.allclose(outs[0], outs[1], atol=1e-5)
    assert bool(states[1]["written"].all()) and torch.equal(states[0]["B"], states[1]["B"])
    assert torch.equal(states[0]["stm"], states[1]["stm"])
    assert torch.equal(states[1]["stm_k"].transpose(1, 2)[..., 4:, :], x.k[:, 2]), "the STM keeps the segment's keys"
    cfg = tiny_model_config()
    for cache, state in zip(("hidden", "kv"), states):
        total = InftyFormer.footprint(small_memory(mem_len=12, cache=cache).cfg, cfg, 24)["total"] // cfg.n_layers
        assert state_numbers([state], 2) == total == 16 * 32 + 12 * (32 + (64 if cache == "kv" else 0))
