"""Gated DeltaNet and DeltaNet: the chunkwise (WY/UT) form against the per-token loop in float64 on
values and on the gradients of every input and parameter (the gates' A_log, dt_bias, W_a, W_b
included), the decay-before-error order the paper and fla use, DeltaNet as α = 1, and known answers
on hand-built keys (β = 1 and orthonormal keys store and return values exactly)."""
from __future__ import annotations

import pytest
import torch

from conftest import tiny_model, tiny_model_config
from memzoo.conformance.tiny import streamed
from memzoo.core.attention import LocalAttention
from memzoo.core.memory import LayerInputs
from memzoo.memories.gated_deltanet import (
    GatedDeltaNet, GatedDeltaNetConfig, delta_rule_chunkwise, delta_rule_loop, l2_normalise,
)
from memzoo.memories.reference import gated_delta_reference

B, S, H, N, D = 2, 3, 2, 8, 8
D_MODEL = 16
TOL = 1e-10  # float64: the two forms differ only by rounding (observed ~1e-15)


def layer_inputs(seed: int = 0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(B, S, N, D_MODEL, generator=g, dtype=dtype, requires_grad=True)
    q, k, v = (torch.randn(B, S, H, N, D, generator=g, dtype=dtype, requires_grad=True) for _ in range(3))
    reset = torch.zeros(B, S, dtype=torch.bool)
    reset[1, 2] = True  # row 1 starts a new document at segment 2
    return h, q, k, v, reset


def plugin(seed: int = 0, **options) -> GatedDeltaNet:
    torch.manual_seed(seed)
    cfg = GatedDeltaNetConfig(**options)
    mem = GatedDeltaNet(cfg, tiny_model_config(d_model=D_MODEL, n_heads=H, head_dim=D, segment_len=N), 0).double()
    with torch.no_grad():
        mem.gate.beta.copy_(torch.tensor([0.7, -1.2]))  # the mix away from 0.5, so both paths show
    return mem


def run(mem: GatedDeltaNet, h, q, k, v, reset, state=None):
    x = LayerInputs(h, q, k, v, reset, LocalAttention(10000.0), project_kv=lambda t: (t, t))
    state = state if state is not None else mem.initial_state(B, q.device)
    out, new_state, _ = mem(x, state)
    return out, new_state


def random_state(mem: GatedDeltaNet, seed: int = 9):
    """A carried state that is not zero (as after earlier segments), in float64."""
    g = torch.Generator().manual_seed(seed)
    return {key: 0.3 * torch.randn(val.shape, generator=g, dtype=torch.float64) for key, val in mem.initial_state(B, "cpu").items()}


@pytest.mark.parametrize("method_gated", [True, False], ids=["gated-deltanet", "deltanet"])
@pytest.mark.parametrize("chunk_size", [3, 4, 64], ids=["chunk3-partial", "chunk4-divides", "chunk-segment"])
@pytest.mark.parametrize("strong_decay", [False, True], ids=["init-decay", "strong-decay"])
def test_chunkwise_matches_per_token_loop_values_and_gradients(method_gated: bool, chunk_size: int, strong_decay: bool) -> None:
    """float64, 3 segments, a reset in row 1, a non-zero carried state: outputs, final state, and the
    gradients of h, q, k, v, the carried state and every parameter agree within 1e-10."""
    h, q, k, v, reset = layer_inputs()
    fast = plugin(gated=method_gated, chunk_size=chunk_size)
    slow = plugin(gated=method_gated, chunkwise=False)
    slow.load_state_dict(fast.state_dict())
    if strong_decay and method_gated:  # α down to about e^-12 per token (fla's gate-gradient trouble)
        with torch.no_grad():
            for m in (fast, slow):
                m.A_log.copy_(torch.tensor([2.5, 1.0], dtype=torch.float64))
    s_fast = {k_: t.clone().requires_grad_() for k_, t in random_state(fast).items()}
    s_slow = {k_: t.clone().requires_grad_() for k_, t in random_state(fast).items()}
    out_f, st_f = run(fast, h, q, k, v, reset, s_fast)
    out_s, st_s = run(slow, h, q, k, v, reset, s_slow)
    assert (out_f - out_s).abs().max() < TOL
    for key in st_f:
        assert (st_f[key] - st_s[key]).abs().max() < TOL, key

    w = torch.randn_like(out_f)
    loss = lambda out, st: (out * w).sum() + 0.1 * st["S"].pow(2).sum()  # noqa: E731
    inputs = (h, q, k, v)
    grads_f = torch.autograd.grad(loss(out_f, st_f), [*inputs, *s_fast.values(), *fast.parameters()])
    grads_s = torch.autograd.grad(loss(out_s, st_s), [*inputs, *s_slow.values(), *slow.parameters()])
    names = ["h", "q", "k", "v", *(f"state.{k_}" for k_ in s_fast), *(n for n, _ in fast.named_parameters())]
    if method_gated:
        assert {"A_log", "dt_bias", "w_alpha.weight", "w_beta.weight"} <= set(names)
    for name, gf, gs in zip(names, grads_f, grads_s):
        assert gf.abs().max() > 0, f"no gradient reaches {name}"
        assert (gf - gs).abs().max() < TOL * max(1.0, float(gs.abs().max())), f"gradient of {name} differs"


def core_inputs(seed: int = 1, n: int = 7, strong: bool = True):
    """q, k (ℓ2-normalised), v, log α, β for the recurrence alone: [B, S, H, n, D] / [B, S, H, n]."""
    g = torch.Generator().manual_seed(seed)
    q, k = (l2_normalise(torch.randn(B, S, H, n, D, generator=g, dtype=torch.float64)) for _ in range(2))
    v = torch.randn(B, S, H, n, D, generator=g, dtype=torch.float64)
    log_alpha = -(torch.rand(B, S, H, n, generator=g, dtype=torch.float64) * (1.5 if strong else 0.1))
    beta = torch.rand(B, S, H, n, generator=g, dtype=torch.float64)
    reset = torch.zeros(B, S, dtype=torch.bool)
    reset[0, 1] = True
    s0 = torch.randn(B, H, D, D, generator=g, dtype=torch.float64)
    return q, k, v, log_alpha, beta, s0, reset


def undecayed_error_loop(q, k, v, g, beta, s0, reset):
    """The wrong order (fla #885): e = v − S_{t-1} k from the state before its decay, then
    S_t = α S_{t-1} + β e kᵀ. Written only to show that the plugin does not do this."""
    state, segments = s0, []
    for s in range(q.shape[1]):
        state = torch.where(reset[:, s, None, None, None], torch.zeros_like(state), state)
        outs = []
        for t in range(q.shape[3]):
            k_t = k[:, s, :, t]
            error = beta[:, s, :, t, None] * (v[:, s, :, t] - torch.einsum("bhvk,bhk->bhv", state, k_t))
            state = torch.exp(g[:, s, :, t])[..., None, None] * state + torch.einsum("bhv,bhk->bhvk", error, k_t)
            outs.append(torch.einsum("bhvk,bhk->bhv", state, q[:, s, :, t]))
        segments.append(torch.stack(outs, dim=2))
    return torch.stack(segments, dim=1), state


@pytest.mark.parametrize("strong", [False, True])
def test_loop_and_chunkwise_match_the_papers_product_form(strong: bool) -> None:
    """Both forms against S_t = S_{t-1}(α_t(I − β_t k_t k_tᵀ)) + β_t v_t k_tᵀ written per row, head and
    token with explicit matrices (memzoo.memories.reference), values and gradients, float64."""
    q, k, v, g, beta, s0, reset = core_inputs(strong=strong)
    leaves = [t.requires_grad_() for t in (q, k, v, g, beta, s0)]
    o_ref, s_ref = gated_delta_reference(*leaves, reset)
    w = torch.randn_like(o_ref)
    grads_ref = torch.autograd.grad((o_ref * w).sum() + s_ref.square().sum(), leaves)
    for name, fn in (("loop", lambda: delta_rule_loop(*leaves, reset)),
                     ("chunkwise", lambda: delta_rule_chunkwise(*leaves, reset, chunk_size=3))):
        o, st = fn()
        assert (o - o_ref).abs().max() < TOL and (st - s_ref).abs().max() < TOL, name
        grads = torch.autograd.grad((o * w).sum() + st.square().sum(), leaves)
        for arg, gr, gref in zip("q k v log_alpha beta s0".split(), grads, grads_ref):
            assert (gr - gref).abs().max() < TOL * max(1.0, float(gref.abs().max())), f"{name}: gradient of {arg}"


@pytest.mark.parametrize("chunk_size", [3, 7])
def test_error_is_taken_after_the_decay(chunk_size: int) -> None:
    """e_t = v_t − (α_t S_{t-1}) k_t: the chunkwise form equals the decay-first loop and disagrees with
    a loop that takes the error from the undecayed state (by far more than rounding)."""
    args = core_inputs()
    o_chunk, s_chunk = delta_rule_chunkwise(*args, chunk_size=chunk_size)
    o_loop, s_loop = delta_rule_loop(*args)
    o_wrong, s_wrong = undecayed_error_loop(*args)
    assert (o_chunk - o_loop).abs().max() < TOL and (s_chunk - s_loop).abs().max() < TOL
    assert (o_chunk - o_wrong).abs().max() > 1e-2, "the undecayed-error recurrence gives the same outputs"
    assert (s_chunk - s_wrong).abs().max() > 1e-2

    # With α = 1 the two orders coincide (the control: the difference above is the decay's).
    q, k, v, g, beta, s0, reset = args
    ones = torch.zeros_like(g)
    assert (delta_rule_chunkwise(q, k, v, ones, beta, s0, reset, chunk_size)[0]
            - undecayed_error_loop(q, k, v, ones, beta, s0, reset)[0]).abs().max() < TOL


def test_deltanet_is_gated_deltanet_with_alpha_one() -> None:
    """deltanet == gated-deltanet whose decay is forced to α = 1 (A_log → −∞, so g = 0), with the
    same shared weights; and with its learned decay gated-deltanet differs."""
    h, q, k, v, reset = layer_inputs(seed=3)
    gdn, dn = plugin(gated=True, chunk_size=3), plugin(gated=False, chunk_size=3)
    missing, unexpected = dn.load_state_dict(gdn.state_dict(), strict=False)
    assert not missing and set(unexpected) == {"A_log", "dt_bias", "w_alpha.weight"}
    with torch.no_grad():
        out_gdn, _ = run(gdn, h, q, k, v, reset)
        out_dn, _ = run(dn, h, q, k, v, reset)
        assert (out_gdn - out_dn).abs().max() > 1e-3, "the learned decay changes nothing (vacuous)"
        gdn.A_log.fill_(-1e4)  # exp(-1e4) = 0 in float64: g = −0 · softplus(...) = 0, α = 1
        out_gdn, st_gdn = run(gdn, h, q, k, v, reset)
        out_dn, st_dn = run(dn, h, q, k, v, reset)
    assert (out_gdn - out_dn).abs().max() == 0.0
    assert all(torch.equal(st_gdn[key], st_dn[key]) for key in st_dn)


def orthonormal_keys(n: int, seed: int = 5) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    basis, _ = torch.linalg.qr(torch.randn(D, D, generator=g, dtype=torch.float64))
    return basis.T[:n]  # [n, D] rows orthonormal


@pytest.mark.parametrize("form", ["chunkwise", "loop"])
def test_known_answer_orthonormal_keys_store_and_read_back(form: str) -> None:
    """β = 1, orthonormal keys k_1..k_5 written with v_1..v_5 in segment 0 and read in segment 1 by
    tokens that write nothing (k = 0): q = k_j reads v_j ∏_{i>j} α_i exactly (DeltaNet: v_j), and a
    second write to k_2 replaces v_2 (the delta rule's overwrite)."""
    keys = orthonormal_keys(5)
    g = torch.Generator().manual_seed(6)
    vals = torch.randn(5, D, generator=g, dtype=torch.float64)
    new_v2 = torch.randn(D, generator=g, dtype=torch.float64)
    alphas = torch.tensor([0.9, 0.5, 0.8, 0.7, 0.6, 0.95], dtype=torch.float64)  # the 6th: the overwrite of k_2

    def build(gated: bool):
        n = 6
        q = torch.zeros(1, 2, 1, n, D, dtype=torch.float64)
        k = torch.zeros_like(q)
        v = torch.zeros_like(q)
        log_alpha = torch.zeros(1, 2, 1, n, dtype=torch.float64)
        beta = torch.ones(1, 2, 1, n, dtype=torch.float64)
        k[0, 0, 0, :5], v[0, 0, 0, :5] = keys, vals
        k[0, 0, 0, 5], v[0, 0, 0, 5] = keys[1], new_v2  # write k_2 again with a new value
        if gated:
            log_alpha[0, 0, 0] = alphas.log()
        q[0, 1, 0, :5] = keys  # segment 1 reads: k = 0 and α = 1 there, so nothing changes
        return q, k, v, log_alpha, beta, torch.zeros(1, 1, D, D, dtype=torch.float64), torch.zeros(1, 2, dtype=torch.bool)

    for gated in (False, True):
        args = build(gated)
        o, state = delta_rule_chunkwise(*args, chunk_size=4) if form == "chunkwise" else delta_rule_loop(*args)
        read = o[0, 1, 0, :5]  # [5, D]
        decay_after = torch.stack([alphas[j + 1 :].prod() for j in range(5)]) if gated else torch.ones(5, dtype=torch.float64)
        expected = decay_after[:, None] * vals
        expected[1] = new_v2  # overwritten at the last token, after every decay
        assert torch.allclose(read, expected, atol=1e-12, rtol=0), f"gated={gated}: stored values not read back"
        # five orthonormal bindings: S has rank 5 (the overwrite replaced v_2, it did not add a sixth)
        assert int(torch.linalg.matrix_rank(state[0, 0])) == 5


def test_state_is_float32_under_bf16_autocast_and_footprint_counts_it() -> None:
    model = tiny_model("gated-deltanet", options={"chunk_size": 3})
    x = torch.randint(0, 256, (2, 2, 8))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        state = model(x).state
    assert all(t.dtype == torch.float32 for st in state.layers for t in st.values())
    cfg = model.cfg  # d_model 32, 2 heads of 16, 2 layers
    parts = GatedDeltaNet.footprint(model.memory_cfg, cfg, 16)
    assert parts["matrix"] == 2 * 2 * 16 * 16 and parts["conv"] == 2 * 3 * 2 * 16 * 3
    assert parts["total"] == sum(t.numel() for st in state.layers for t in st.values()) // 2


def test_quick_backbone_parameter_budget_and_gate_optimiser_settings() -> None:
    """At the quick suite's backbone (d_model 128, 4 layers, 4 heads) both methods stay within 10% of
    `local`'s parameters; A_log and dt_bias get no weight decay; the mixing gates start at 0.5."""
    from memzoo.core.config import ModelConfig
    from memzoo.core.model import MemoryModel
    from memzoo.core.plugins import get_memory

    cfg = ModelConfig(d_model=128, n_layers=4, n_heads=4, segment_len=128)
    counts = {m: MemoryModel(cfg, m, get_memory(m).config()).num_parameters() for m in ("local", "gated-deltanet", "deltanet")}
    assert counts["gated-deltanet"] == counts["local"] + 4 * (2 * 128 * 4 + 2 * 4 + 3 * 128 * 4 + 32 + 2 * 128 * 16 + 4)
    assert counts["deltanet"] == counts["gated-deltanet"] - 4 * (128 * 4 + 2 * 4)
    assert (counts["gated-deltanet"] - counts["local"]) / counts["local"] < 0.05

    model = MemoryModel(cfg, "gated-deltanet", get_memory("gated-deltanet").config())
    decay = {id(p): g["weight_decay"] for g in model.optim_groups(0.1, 1e-3) for p in g["params"]}
    for mem in model.memories:
        assert decay[id(mem.A_log)] == 0.0 and decay[id(mem.dt_bias)] == 0.0
        assert decay[id(mem.w_alpha.weight)] == 0.1  # the projections keep the global decay
        assert torch.allclose(mem.gate_values(), torch.full((4,), 0.5))
        a = mem.A_log.exp()
        dt = torch.nn.functional.softplus(mem.dt_bias)
        assert bool((a > 0).all() and (a <= 16).all()) and bool((dt >= 1e-4 - 1e-9).all() and (dt <= 0.1 + 1e-6).all())


@pytest.mark.parametrize("method", ["gated-deltanet", "deltanet"])
def test_conv_cache_spans_segments_shorter_than_the_kernel(method: str) -> None:
    """Segments of 2 tokens (< the conv's 3 carried inputs): the cache holds inputs from two segments
    back, so streaming still equals one shot, and a token two segments back changes the conv's input
    of the current segment even with S forced to zero (the conv cache itself carries it)."""
    model = tiny_model(method, segment_len=2)
    x = torch.randint(0, 256, (2, 6, 2), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        one_shot = model(x)
        by_segment = streamed(model, x)
    assert (by_segment - one_shot.logits).abs().max() < 1e-5

    with torch.no_grad():
        state = model(x[:, :2]).state
        cut = [{**st, "S": torch.zeros_like(st["S"])} for st in state.layers]  # only the conv caches remain
        y = x.clone()
        y[:, 0, 1] = (y[:, 0, 1] + 7) % 256  # the last token of segment 0: in the cache after segment 1
        state_y = model(y[:, :2]).state
        cut_y = [{**st, "S": torch.zeros_like(st["S"])} for st in state_y.layers]
        from memzoo.core.model import ModelState

        a = model(x[:, 2:3], ModelState(cut, {})).logits
        b = model(y[:, 2:3], ModelState(cut_y, {})).logits
    assert (a - b).abs().max() > 1e-6


def test_compile_option_runs_the_whole_memory_read_through_torch_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    """compile='default' hands the memory read (conv, gates, chunkwise form, norm) to torch.compile once,
    shared by every layer (static shapes, one graph), and runs what it returns with the same values (a
    recording stand-in: CPU tests never compile); 'eager' does not, nor does a run a probe listens to;
    a bad mode is refused by name. The compiled read's values were checked against the float64 oracle
    through inductor (checks/cuda_check.py's compiled cases, on the CPU and on an H100)."""
    import memzoo.core.compiled as compiled
    from memzoo.core.probe import recording
    from memzoo.memories.gated_deltanet import GatedDeltaNet

    calls: list[tuple] = []

    def fake_compile(fn, **kwargs):
        calls.append((fn, kwargs))
        return lambda *args: calls.append(("read", args[-1])) or fn(*args)

    monkeypatch.setattr(torch, "compile", fake_compile)
    monkeypatch.setattr(compiled, "COMPILED", {})
    h, q, k, v, reset = layer_inputs()
    outs = []
    for mode in ("eager", "default", "default"):
        mem = plugin(compile=mode, kernel="torch")
        outs.append(run(mem, h, q, k, v, reset, random_state(mem)))
    assert calls == [(GatedDeltaNet.memory_read, {"mode": "default", "dynamic": False, "fullgraph": True}),
                     ("read", True), ("read", True)]
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1]["S"], outs[1][1]["S"])
    with recording(names={"gated-deltanet.recurrence"}) as seen:
        run(plugin(compile="default", kernel="torch"), h, q, k, v, reset)
    assert len(calls) == 3 and len(seen) == 1  # a probe listening: the eager read, which calls it
    with pytest.raises(ValueError, match="gated-deltanet compile='fast'"):
        plugin(compile="fast")
