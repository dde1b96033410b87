"""Titans against references written from the paper's equations, in float64: the hand-written inner
gradient against autograd of ‖M(k) − v‖² (and a few steps of momentum and decay on it); the chunked
dual-form scan against a per-token loop whose gradients are autograd's at the chunk's start (values
and gradients, tolerance 1e-10); MAC's order (read the old memory, attend, then write); a segment
shorter than a chunk still writes; no NaN or inf on extreme inputs."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from conftest import tiny_model_config
from memzoo.core.attention import LocalAttention
from memzoo.core.memory import LayerInputs, SegmentInputs
from memzoo.memories.titans import CausalConv, Titans, TitansConfig, inner_grad, l2n, scan_memory

B, H, D = 2, 2, 4
TOL = dict(atol=1e-10, rtol=1e-9)


def shapes(depth: int, expansion: int = 2) -> list[tuple[int, int]]:
    return Titans.layer_shapes(TitansConfig(depth=depth, expansion=expansion), D)


def random_weights(depth: int, g: torch.Generator, scale: float = 1.0) -> list[torch.Tensor]:
    return [(torch.randn(B, H, o, i, generator=g, dtype=torch.float64) * scale / i**0.5).requires_grad_()
            for o, i in shapes(depth)]


def mlp_ref(weights: list[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """M(x) for one token per (row, head): x [B, H, D]; W_L SiLU(… SiLU(W_1 x))."""
    for l, w in enumerate(weights):
        x = (w @ x[..., None])[..., 0]
        if l < len(weights) - 1:
            x = F.silu(x)
    return x


def scan_reference(w0, s0, k, v, q, alpha, eta, theta, chunk: int, clip: float):
    """Per token, from the equations: g_t = ∇ℓ(W_start; x_t) by autograd at the chunk's starting
    weights (scaled to norm ≤ clip), S_t = η_t S_{t−1} − θ_t g_t, W_t = (1 − α_t) W_{t−1} + S_t,
    read_t = M_t(q_t)."""
    w, s = list(w0), list(s0)
    reads = []
    for t in range(k.shape[-2]):
        if t % chunk == 0:
            start = w
        loss = ((mlp_ref(start, k[..., t, :]) - v[..., t, :]) ** 2).sum()  # rows and heads are separate
        g = torch.autograd.grad(loss, start, create_graph=True)
        lr = theta[..., t]
        if clip > 0:
            norm = torch.sqrt(sum((gl ** 2).sum((-2, -1)) for gl in g))  # [B, H]
            lr = lr / torch.clamp(norm / clip, min=1.0)
        s = [eta[..., t, None, None] * sl - lr[..., None, None] * gl for sl, gl in zip(s, g)]
        w = [(1 - alpha[..., t, None, None]) * wl + sl for wl, sl in zip(w, s)]
        reads.append(mlp_ref(w, q[..., t, :]))
    return torch.stack(reads, dim=-2), w, s


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_inner_gradient_matches_autograd_and_steps(depth: int) -> None:
    """δ aᵀ per token == autograd of ‖M(k_t) − v_t‖²; five steps of momentum and decay agree."""
    g = torch.Generator().manual_seed(depth)
    w = random_weights(depth, g)
    n = 5
    k = l2n(torch.randn(B, H, n, D, generator=g, dtype=torch.float64))
    v = torch.randn(B, H, n, D, generator=g, dtype=torch.float64)
    deltas, acts = inner_grad(w, k, v)
    for t in range(n):
        auto = torch.autograd.grad(((mlp_ref(w, k[..., t, :]) - v[..., t, :]) ** 2).sum(), w)
        for l in range(depth):
            hand = deltas[l][..., t, :, None] * acts[l][..., t, None, :]  # [B, H, out, in]
            assert torch.allclose(hand, auto[l], **TOL), f"layer {l} token {t}"
    # A few steps of S_t = η S − θ ∇ℓ(W_{t−1}), W_t = (1 − α) W_{t−1} + S_t: hand-written vs autograd.
    wa, wb = [x.detach() for x in w], [x.detach().clone() for x in w]
    sa, sb = [torch.zeros_like(x) for x in wa], [torch.zeros_like(x) for x in wa]
    for t, (al, et, th) in enumerate([(0.1, 0.9, 0.5), (0.0, 0.5, 1.0), (0.3, 0.99, 0.2), (0.05, 0.0, 0.7)]):
        d, a = inner_grad(wa, k[..., t : t + 1, :], v[..., t : t + 1, :])
        hand = [dl[..., 0, :, None] * al_[..., 0, None, :] for dl, al_ in zip(d, a)]
        wr = [x.requires_grad_() for x in wb]
        auto = torch.autograd.grad(((mlp_ref(wr, k[..., t, :]) - v[..., t, :]) ** 2).sum(), wr)
        sa = [et * s - th * gr for s, gr in zip(sa, hand)]
        wa = [(1 - al) * x + s for x, s in zip(wa, sa)]
        sb = [et * s - th * gr for s, gr in zip(sb, auto)]
        wb = [((1 - al) * x + s).detach() for x, s in zip(wr, sb)]
    for x, y in zip(wa, wb):
        assert torch.allclose(x, y, **TOL)


def scan_inputs(n: int, seed: int, scale: float = 1.0):
    g = torch.Generator().manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    k = l2n(rnd(B, H, n, D)).requires_grad_()
    q = l2n(rnd(B, H, n, D)).requires_grad_()
    v = (rnd(B, H, n, D) * scale).requires_grad_()
    za, ze = (rnd(B, H, n).requires_grad_() for _ in range(2))
    zt = (rnd(B, H, n) - 1.0).requires_grad_()  # θ = softplus(zt) about 0.3: the memory stays bounded
    return k, v, q, za, ze, zt


@pytest.mark.parametrize("depth", [1, 2, 3])
@pytest.mark.parametrize("chunk", [1, 3, 4, 10])  # n = 7: chunks of 3 and 4 leave a partial chunk; 10 > n
@pytest.mark.parametrize("clip", [0.0, 0.3])  # 0.3 is active for most tokens
def test_chunked_scan_matches_per_token_reference(depth: int, chunk: int, clip: float) -> None:
    """The dual-form chunked scan == the per-token loop (gradients at the chunk's start) on reads,
    final weights and momentum, and on the gradients of all of them w.r.t. every input."""
    g = torch.Generator().manual_seed(10 * depth + chunk)
    w0 = random_weights(depth, g)
    s0 = [(torch.randn(x.shape, generator=g, dtype=torch.float64) * 0.1).requires_grad_() for x in w0]
    k, v, q, za, ze, zt = scan_inputs(7, seed=chunk + depth)
    reads, w, s = scan_memory(w0, s0, k, v, q, F.logsigmoid(-za), F.logsigmoid(ze), F.softplus(zt), chunk, clip)
    ref_reads, ref_w, ref_s = scan_reference(w0, s0, k, v, q, torch.sigmoid(za), torch.sigmoid(ze),
                                             F.softplus(zt), chunk, clip)
    assert torch.allclose(reads, ref_reads, **TOL)
    for a, b in zip(w + s, ref_w + ref_s):
        assert torch.allclose(a, b, **TOL)
    # Outer-loss gradients through every write (full BPTT), against autograd through the reference.
    gen = torch.Generator().manual_seed(99)
    probes = [torch.randn(x.shape, generator=gen, dtype=torch.float64) for x in [reads, *w, *s]]
    wrt = [k, v, q, za, ze, zt, *w0, *s0]
    loss = sum((p * x).sum() for p, x in zip(probes, [reads, *w, *s]))
    ref_loss = sum((p * x).sum() for p, x in zip(probes, [ref_reads, *ref_w, *ref_s]))
    grads = torch.autograd.grad(loss, wrt)
    ref_grads = torch.autograd.grad(ref_loss, wrt)
    names = "k v q alpha eta theta".split() + [f"W0_{l}" for l in range(depth)] + [f"S0_{l}" for l in range(depth)]
    for name, a, b in zip(names, grads, ref_grads):
        assert torch.allclose(a, b, **TOL), f"gradient w.r.t. {name}: max diff {float((a - b).abs().max()):.2e}"


def test_chunk_one_is_the_exact_recurrence_and_chunks_differ() -> None:
    """Chunk 1 takes every gradient at the previous token's weights; a chunk of 4 does not (not vacuous)."""
    g = torch.Generator().manual_seed(5)
    w0 = random_weights(2, g)
    s0 = [torch.zeros_like(x) for x in w0]
    k, v, q, za, ze, zt = scan_inputs(8, seed=5, scale=2.0)
    args = (k, v, q, F.logsigmoid(-za), F.logsigmoid(ze), F.softplus(zt))
    r1, _, _ = scan_memory(w0, s0, *args, 1, 0.0)
    r4, _, _ = scan_memory(w0, s0, *args, 4, 0.0)
    assert float((r1 - r4).detach().abs().max()) > 1e-4


@pytest.mark.parametrize("n", [2, 7])
def test_causal_conv_matches_the_formula(n: int) -> None:
    """y_t = SiLU(b + Σ_j w_j x_{t−K+1+j}) with zeros before the segment, per stream, head and channel,
    against a per-token sum (float64, 1e-12). n = 2 < K − 1: the kernel reaches past the segment's start."""
    torch.manual_seed(3)
    conv = CausalConv(3, H, D, 4).double()
    with torch.no_grad():
        conv.weight.normal_()
        conv.bias.normal_()
    x = torch.randn(3, B, H, n, D, dtype=torch.float64)
    w, b = conv.weight, conv.bias  # [T, K, H, 1, D], [T, H, 1, D]
    ref = torch.stack([F.silu(b[:, None, :, 0] + sum(w[:, j, None, :, 0] * x[..., t - 3 + j, :]
                                                      for j in range(4) if t - 3 + j >= 0)) for t in range(n)], dim=-2)
    assert torch.allclose(conv(x), ref, atol=1e-12)


# -- the plugin ------------------------------------------------------------------------------


N = 6


def plugin(variant: str, **options) -> Titans:
    model_cfg = tiny_model_config(d_model=H * D * 2, n_heads=H, head_dim=D)
    torch.manual_seed(0)
    options = {"chunk_size": 4, "n_persistent": 2, **options}
    mem = Titans(TitansConfig(variant=variant, **options), model_cfg, 0).double()
    with torch.no_grad():  # away from the near-identity initialisation, so every piece matters
        for p in mem.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return mem


def layer_inputs(segments: int, seed: int = 0, scale: float = 1.0):
    g = torch.Generator().manual_seed(seed)
    rnd = lambda *s: (torch.randn(*s, generator=g, dtype=torch.float64) * scale).requires_grad_()  # noqa: E731
    q, k, v = (rnd(B, segments, H, N, D) for _ in range(3))
    h = rnd(B, segments, N, H * D * 2)
    w_kv = torch.randn(2 * H * D, H * D * 2, generator=g, dtype=torch.float64) * 0.3

    def project_kv(x, fixed_weights=False):
        kv = x @ w_kv.T  # [B, M, 2 H D]
        kk, vv = kv.view(*x.shape[:2], 2, H, D).permute(2, 0, 3, 1, 4)
        return kk, vv

    reset = torch.zeros(B, segments, dtype=torch.bool)
    return LayerInputs(h, q, k, v, reset, LocalAttention(10000.0), project_kv)


def mac_in_paper_order(mem: Titans, x: SegmentInputs, state: dict) -> tuple[torch.Tensor, dict]:
    """One MAC segment composed from the paper's steps, with the reads of the OLD memory written here:
    r = M_{t−1}(q̃) (test's own MLP, per token), attend [persistent ‖ r ‖ segment], write y, gate."""
    weights = [state[f"W{l}"] for l in range(mem.cfg.depth)]
    q_read = mem.read_queries(x.q)
    r = torch.stack([mlp_ref(weights, q_read[..., t, :]) for t in range(x.q.shape[-2])], dim=-2)
    y = mem.attend_with_context(x, r, mem.persistent_prefix(x.project_kv, B, x.q.device))
    yq, yk, yv = mem.y_features(y)
    m, new_state = mem.write_memory(state, yk, yv, yq, mem.gate_values_of(x.h))
    return mem.combine(y, m), new_state


def test_mac_reads_old_memory_attends_then_writes() -> None:
    """Two segments (the second reads a memory the first wrote): the plugin equals the paper's order.
    Writing before attention (the public port's order) fails this test."""
    mem = plugin("mac")
    x = layer_inputs(2)
    out, state, _ = mem(x, mem.initial_state(B, torch.device("cpu")))
    st = mem.initial_state(B, torch.device("cpu"))
    expected = []
    for seg in x.segments():
        o, st = mac_in_paper_order(mem, seg, st)
        expected.append(o)
    assert torch.allclose(out, torch.stack(expected, dim=1), **TOL)
    for key in state:
        assert torch.allclose(state[key], st[key], **TOL)
    # Not vacuous: attention's retrieved context matters, and the write changed the memory.
    seg1 = x.segments()[1]
    _, st1 = mac_in_paper_order(mem, x.segments()[0], mem.initial_state(B, torch.device("cpu")))
    w1 = [st1[f"W{l}"].detach() for l in range(mem.cfg.depth)]
    w2 = [state[f"W{l}"].detach() for l in range(mem.cfg.depth)]
    prefix = mem.persistent_prefix(seg1.project_kv, B, seg1.q.device)
    with torch.no_grad():
        r_old = mem.retrieve(st1, mem.read_queries(seg1.q))
        r_new = mem.retrieve(state, mem.read_queries(seg1.q))
    assert float((r_old - r_new).abs().max()) > 1e-3 and any(float((a - b).abs().max()) > 1e-3 for a, b in zip(w1, w2))
    with torch.no_grad():
        y_old, y_new = mem.attend_with_context(seg1, r_old, prefix), mem.attend_with_context(seg1, r_new, prefix)
    assert float((y_old - y_new).abs().max()) > 1e-4


@pytest.mark.parametrize("variant", ["mac", "mag"])
def test_plugin_gradients_reach_kv_gates_and_m0(variant: str) -> None:
    """The outer loss differentiates through the memory's writes: q, k, v, h (hence W_Q/K/V and the
    gates' inputs), the gates' maps and M_0 all get gradient from the second segment's output."""
    mem = plugin(variant)
    x = layer_inputs(2)
    out, _, _ = mem(x, mem.initial_state(B, torch.device("cpu")))
    loss = out[:, 1].square().sum()
    grads = torch.autograd.grad(loss, [x.q, x.k, x.v, x.h, mem.gates.proj.weight, *mem.m0])
    for name, gr in zip(["q", "k", "v", "h", "gates", *[f"M0_{l}" for l in range(len(mem.m0))]], grads):
        assert float(gr.abs().max()) > 0, name
    # Through the state: segment 0's inputs affect segment 1's output.
    assert float(grads[2][:, 0].abs().max()) > 0 if variant == "mag" else float(grads[0][:, 0].abs().max()) > 0


@pytest.mark.parametrize("variant", ["mac", "mag"])
def test_short_segment_still_writes(variant: str) -> None:
    """A segment shorter than a chunk (3 tokens, chunk 16) writes its tokens (titans-pytorch #59)."""
    mem = plugin(variant, chunk_size=16)
    x = layer_inputs(1)
    short = LayerInputs(x.h[:, :, :3], x.q[..., :3, :], x.k[..., :3, :], x.v[..., :3, :], x.reset, x.attend, x.project_kv)
    init = mem.initial_state(B, torch.device("cpu"))
    _, state, _ = mem(short, init)
    assert all(float((state[key] - init[key]).detach().abs().max()) > 1e-6 for key in state)


@pytest.mark.parametrize("variant", ["mac", "mag"])
def test_no_nan_on_extreme_inputs(variant: str) -> None:
    """Inputs of 1e4 over 12 segments (float32): outputs, state and gradients stay finite (titans-pytorch #29)."""
    mem = plugin(variant).float()
    x = layer_inputs(12, scale=1e4)
    x = LayerInputs(*(t.detach().float().requires_grad_() for t in (x.h, x.q, x.k, x.v)), x.reset, x.attend,
                    lambda t, fixed_weights=False: (t.new_zeros(t.shape[0], H, t.shape[1], D),) * 2)
    out, state, _ = mem(x, mem.initial_state(B, torch.device("cpu")))
    assert torch.isfinite(out).all() and all(torch.isfinite(t).all() for t in state.values())
    grads = torch.autograd.grad(out.sum(), [x.q, x.k, x.v, x.h, *mem.m0])
    assert all(torch.isfinite(gr).all() for gr in grads)
    assert float(max(t.detach().abs().max() for t in state.values())) < 1e3


@pytest.mark.parametrize("variant", ["mac", "mag"])
def test_outer_gradient_bounded_at_the_quick_segment(variant: str) -> None:
    """At the quick backbone's segment (128 tokens, chunks of 16, depth 2) a freshly built model's
    loss gradient has a norm of order 10, as the attention-only model's. θ unbounded at 0.1 (η 0.9)
    gave 10⁵ (MAG) to 10⁷ (MAC) here: 16 tokens' gradients at one point with θ/(1 − η) near 1."""
    from memzoo.core.config import ModelConfig
    from memzoo.core.model import MemoryModel

    cfg = ModelConfig(d_model=64, n_layers=2, n_heads=2, segment_len=128)
    model = MemoryModel(cfg, f"titans-{variant}", TitansConfig(variant=variant), seed=0)
    tokens = torch.randint(0, 256, (2, 4, 128), generator=torch.Generator().manual_seed(0))
    logits = model(tokens).logits
    F.cross_entropy(logits[:, :, :-1].reshape(-1, 256), tokens[:, :, 1:].reshape(-1)).backward()
    norm = torch.sqrt(sum(p.grad.square().sum() for p in model.parameters() if p.grad is not None))
    assert float(norm) < 50, float(norm)


# -- speed options: values and gradients unchanged -------------------------------------------


@pytest.mark.parametrize("variant", ["mac", "mag"])
def test_checkpointed_scan_equals_the_stored_one(variant: str) -> None:
    """checkpoint=True (each segment's scan recomputed in backward) gives the same outputs, state and
    gradients w.r.t. every input and parameter as the scan that stores its activations (float64)."""
    results = []
    for checkpoint in (False, True):
        mem = plugin(variant, checkpoint=checkpoint)
        x = layer_inputs(2)
        out, state, _ = mem(x, mem.initial_state(B, torch.device("cpu")))
        probe = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
        loss = (probe * out).sum() + sum(t.square().sum() for t in state.values())
        wrt = [x.q, x.k, x.v, x.h, *mem.parameters()]
        results.append((out, state, torch.autograd.grad(loss, wrt)))
    (out0, st0, g0), (out1, st1, g1) = results
    assert torch.allclose(out0, out1, **TOL)
    assert all(torch.allclose(st0[k], st1[k], **TOL) for k in st0)
    assert len(g0) == len(g1) and all(torch.allclose(a, b, **TOL) for a, b in zip(g0, g1))
    assert all(float(g.abs().max()) > 0 for g in g1[:4])  # not vacuous: the inputs get gradient


def test_compile_option_routes_the_chunk_step_through_torch_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    """compile='default' calls torch.compile on the chunk step once and uses what it returns (a
    recording stand-in here: CPU tests never compile); 'eager' does not; a bad mode is refused by name."""
    import memzoo.core.compiled as compiled
    import memzoo.memories.titans as titans

    calls: list[tuple] = []

    def fake_compile(fn, **kwargs):
        calls.append((fn, kwargs))

        def wrapped(*args):
            calls.append(("step",))
            return fn(*args)
        return wrapped

    monkeypatch.setattr(torch, "compile", fake_compile)
    monkeypatch.setattr(compiled, "COMPILED", {})
    x = layer_inputs(1)
    for mode in ("eager", "default"):
        mem = plugin("mag", compile=mode)
        mem(x, mem.initial_state(B, torch.device("cpu")))
    assert calls[0] == (titans.chunk_step, {"mode": "default", "dynamic": False, "fullgraph": True})
    assert calls[1:] == [("step",)] * 2  # N = 6 tokens in chunks of 4: two chunk steps, both compiled
    with pytest.raises(ValueError, match="compile='fast'"):
        plugin("mag", compile="fast")
