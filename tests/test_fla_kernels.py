"""The fla adapter (memzoo/memories/fla_kernels.py) held to memzoo's float64 recurrence on the CPU,
through stand-ins for fla's two chunk kernels: per-token float64 loops written from the gated delta
rule in fla's own conventions (tokens [B, T, H, D], state [K, V] unless state_v_first, scale 1/sqrt(K)
unless given, varlen pieces through cu_seqlens), with fla 0.6.0's call signatures. Checked: values,
final state and gradients (q, k, v, g, β, the carried state and every parameter), with resets inside a
block and a block without; and the one line saying which path ran and why (fla absent, CPU device, the
Hopper Triton guard, fp32 for chunk_delta_rule, a kernel that raises)."""
from __future__ import annotations

import pytest
import torch
from einops import einsum

from memzoo.memories import fla_kernels
from memzoo.memories.fla_kernels import FlaKernels, delta_rule_fla
from memzoo.memories.gated_deltanet import delta_rule_loop
from test_gated_deltanet import B, D, S, layer_inputs, plugin, random_state, run

TOL = 1e-10  # float64 on both sides; they differ only by rounding


def _pieces(batch: int, length: int, cu_seqlens):
    """(row, start, end) of every sequence fla processes: the rows, or the varlen pieces of row 0."""
    if cu_seqlens is None:
        return [(b, 0, length) for b in range(batch)]
    assert batch == 1, "fla: batch 1 with cu_seqlens"
    cu = cu_seqlens.tolist()
    return [(0, cu[i], cu[i + 1]) for i in range(len(cu) - 1)]


def _loop(q, k, v, g, beta, scale, initial_state, output_final_state, state_v_first, cu_seqlens):
    """S_t = α_t S_{t-1} + k_t β_t (v_t − α_t S_{t-1}ᵀ k_t)ᵀ in fla's [K, V] layout, o_t = scale · S_tᵀ q_t."""
    batch, length, h, dk = q.shape
    dv, out_dtype = v.shape[-1], v.dtype
    q, k, v, g, beta = (t.double() for t in (q, k, v, g, beta))  # fla computes in float32 inside; this, in float64
    scale = dk ** -0.5 if scale is None else scale
    outs = torch.zeros(batch, length, h, dv, dtype=q.dtype)
    finals = []
    for i, (b, start, end) in enumerate(_pieces(batch, length, cu_seqlens)):
        state = torch.zeros(h, dk, dv, dtype=q.dtype) if initial_state is None else initial_state[i].double()
        state = state.transpose(-1, -2) if state_v_first else state  # [H, K, V]
        for t in range(start, end):
            state = torch.exp(g[b, t])[:, None, None] * state
            error = beta[b, t][:, None] * (v[b, t] - einsum(state, k[b, t], "h k v, h k -> h v"))  # [H, V]
            state = state + einsum(k[b, t], error, "h k, h v -> h k v")
            outs[b, t] = scale * einsum(state, q[b, t], "h k v, h k -> h v")
        finals.append(state.transpose(-1, -2) if state_v_first else state)
    state_dtype = torch.float32 if initial_state is None else initial_state.dtype
    return outs.to(out_dtype), torch.stack(finals).to(state_dtype) if output_final_state else None


def standin_gated(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                  use_qk_l2norm_in_kernel=False, use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False,
                  state_v_first=False, cu_seqlens=None, cu_seqlens_cpu=None, chunk_indices=None, cp_context=None,
                  **kwargs):
    """chunk_gated_delta_rule's signature (fla 0.6.0), computed by the per-token loop."""
    assert not (use_qk_l2norm_in_kernel or use_beta_sigmoid_in_kernel or allow_neg_eigval or kwargs)
    assert cu_seqlens_cpu is None or cu_seqlens_cpu.tolist() == cu_seqlens.tolist()
    return _loop(q, k, v, g, beta, scale, initial_state, output_final_state, state_v_first, cu_seqlens)


def standin_delta(q, k, v, beta, scale=None, initial_state=None, output_final_state=False,
                  use_qk_l2norm_in_kernel=False, cu_seqlens=None, cu_seqlens_cpu=None, **kwargs):
    """chunk_delta_rule's signature (fla 0.6.0: no g, no state_v_first, not float32)."""
    assert q.dtype != torch.float32 and beta.dim() == 3 and not (use_qk_l2norm_in_kernel or kwargs)
    assert cu_seqlens_cpu is None or cu_seqlens_cpu.tolist() == cu_seqlens.tolist()
    return _loop(q, k, v, torch.zeros_like(beta), beta, scale, initial_state, output_final_state, False, cu_seqlens)


STANDIN = FlaKernels(standin_gated, standin_delta, "3.7.1",
                     gated_dtypes=frozenset({torch.float64, torch.float32, torch.bfloat16}),
                     delta_dtypes=frozenset({torch.float64, torch.bfloat16}))


@pytest.fixture
def fla(monkeypatch):
    """fla 'present' on a CUDA device of capability 8.0, its kernels the float64 stand-ins; no line said yet."""
    monkeypatch.setattr(fla_kernels, "load_fla", lambda: STANDIN)
    monkeypatch.setattr(fla_kernels, "gpu_capability", lambda device: (8, 0))
    monkeypatch.setattr(fla_kernels, "SAID", set())
    monkeypatch.setattr(fla_kernels, "FAILED", {})
    monkeypatch.setattr(fla_kernels, "BACKWARD_TRIED", set())
    return monkeypatch


RESETS = {
    # rows 1 and 2 start documents inside the block (row 2 twice in a row), row 0 at its first segment
    "resets-inside": [(0, 0), (1, 2), (2, 1), (2, 2)],
    "no-reset-inside": [(1, 0)],  # only a first-segment reset: fla's batched form, no cu_seqlens
}


def recurrence_inputs(resets, seed: int = 3, rows: int = 3, segments: int = 3, n: int = 5):
    """q, k (ℓ2-normalised), v, g <= 0, β in (0, 1), a nonzero carried state, and the resets; float64."""
    gen = torch.Generator().manual_seed(seed)
    h, dk, dv = 2, 4, 3  # Dk != Dv: a wrong transpose is a shape error or a wrong value, never silent
    q, k = (torch.nn.functional.normalize(torch.randn(rows, segments, h, n, dk, generator=gen, dtype=torch.float64), dim=-1)
            for _ in range(2))
    v = torch.randn(rows, segments, h, n, dv, generator=gen, dtype=torch.float64)
    g = -torch.rand(rows, segments, h, n, generator=gen, dtype=torch.float64)
    beta = torch.rand(rows, segments, h, n, generator=gen, dtype=torch.float64)
    s0 = torch.randn(rows, h, dv, dk, generator=gen, dtype=torch.float64)
    reset = torch.zeros(rows, segments, dtype=torch.bool)
    for r, s in resets:
        reset[r, s] = True
    return [t.requires_grad_() for t in (q, k, v, g, beta, s0)], reset


@pytest.mark.parametrize("resets", RESETS.values(), ids=RESETS.keys())
@pytest.mark.parametrize("gated_kernel", [True, False], ids=["chunk_gated_delta_rule", "chunk_delta_rule"])
def test_adapter_matches_the_recurrence_values_state_and_gradients(resets, gated_kernel: bool) -> None:
    """delta_rule_fla through a stand-in equals delta_rule_loop: outputs, each row's final S, and the
    gradients of q, k, v, g, β and the carried S (chunk_delta_rule: DeltaNet, g = 0)."""
    leaves, reset = recurrence_inputs(resets)
    if not gated_kernel:
        with torch.no_grad():
            leaves[3].zero_()
    kernel = standin_gated if gated_kernel else standin_delta
    results = {}
    for name, fn in (("fla", lambda *a: delta_rule_fla(kernel, gated_kernel, *a)), ("loop", delta_rule_loop)):
        o, state = fn(*leaves, reset)
        w_o = torch.randn(o.shape, generator=torch.Generator().manual_seed(5), dtype=o.dtype)
        w_s = torch.randn(state.shape, generator=torch.Generator().manual_seed(6), dtype=o.dtype)
        grads = torch.autograd.grad((o * w_o).sum() + (state * w_s).sum(), leaves, allow_unused=True)
        results[name] = (o, state, grads)
    (o_f, s_f, g_f), (o_l, s_l, g_l) = results["fla"], results["loop"]
    assert (o_f - o_l).abs().max() < TOL
    assert (s_f - s_l).abs().max() < TOL
    for name, a, b in zip(("q", "k", "v", "g", "beta", "s0"), g_f, g_l):
        if name == "g" and not gated_kernel:
            assert a is None  # chunk_delta_rule never sees g
            continue
        assert (a - b).abs().max() < TOL, name
    reset_rows = reset[:, 0]
    assert (g_f[5][reset_rows] == 0).all() and g_f[5][~reset_rows].abs().max() > 1e-3  # S reaches only carrying rows


def test_resets_inside_a_block_become_cu_seqlens_pieces() -> None:
    """A piece opens at every row start and every reset; each row's first piece carries its S."""
    leaves, reset = recurrence_inputs(RESETS["resets-inside"])
    seen = {}

    def spy(q, k, v, g, beta, **kw):
        seen.update(kw, shape=q.shape)
        return standin_gated(q, k, v, g, beta, **kw)

    delta_rule_fla(spy, True, *[t.detach() for t in leaves], reset)
    n = 5
    assert seen["shape"][0] == 1 and seen["scale"] == 1.0 and seen["state_v_first"] is True
    assert seen["cu_seqlens"].tolist() == [0, 3 * n, 5 * n, 6 * n, 7 * n, 8 * n, 9 * n]  # rows 0 | 1 1+ | 2 2+ 2+
    h0 = seen["initial_state"]  # [M, H, Dv, Dk]
    s0 = leaves[5].detach()
    assert (h0[0] == 0).all() and (h0[1] == s0[1]).all() and (h0[3] == s0[2]).all()  # row 0 reset at segment 0
    assert all((h0[i] == 0).all() for i in (2, 4, 5))


def build_pair(gated: bool, **options):
    """The same plugin twice (same weights): kernel='fla' and kernel='torch'."""
    return plugin(gated=gated, kernel="fla", **options), plugin(gated=gated, kernel="torch", **options)


@pytest.mark.parametrize("no_reset", [False, True], ids=["reset-inside", "no-reset"])
@pytest.mark.parametrize("gated", [True, False], ids=["gated-deltanet", "deltanet"])
def test_plugin_fla_path_matches_torch_path_with_every_gradient(fla, gated: bool, no_reset: bool) -> None:
    """The whole layer, kernel='fla' (stand-in, float64) against kernel='torch': output, new state, and
    the gradients of its inputs, the carried state and every parameter (A_log, dt_bias, W_a, W_b too)."""
    calls = []
    counted = lambda kernel: lambda *a, **kw: calls.append(kw.get("cu_seqlens")) or kernel(*a, **kw)  # noqa: E731
    fla.setattr(fla_kernels, "load_fla", lambda: FlaKernels(counted(standin_gated), counted(standin_delta), "3.7.1",
                                                            STANDIN.gated_dtypes, STANDIN.delta_dtypes))
    mem_fla, mem_torch = build_pair(gated)
    h, q, k, v, reset = layer_inputs()
    if no_reset:
        reset.zero_()
    results = []
    for mem in (mem_fla, mem_torch):
        state = {key: t.clone().requires_grad_() for key, t in random_state(mem).items()}
        out, new = run(mem, h, q, k, v, reset, state)
        loss = (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view(out.shape)).sum() + new["S"].pow(2).sum()
        params = [p for _, p in mem.named_parameters()]
        grads = torch.autograd.grad(loss, [h, q, k, v, state["S"], *params], allow_unused=True)
        results.append((out, new["S"], grads))
    (out_f, s_f, g_f), (out_t, s_t, g_t) = results
    assert (out_f - out_t).abs().max() < 1e-9
    assert (s_f - s_t).abs().max() < 1e-9
    for a, b in zip(g_f, g_t):
        assert (a is None) == (b is None)
        if a is not None:
            assert (a - b).abs().max() < 1e-9
    assert g_f[4].abs().max() > 1e-3  # the gradient reaches the carried state
    assert len(calls) == 1 and (calls[0] is None) == no_reset  # one call over all segments; varlen only for a reset


def forward_once(gated: bool, dtype=torch.float64, grad: bool = True, **options):
    """One forward of a fresh plugin (options e.g. kernel=...) in `dtype`."""
    mem = plugin(gated=gated, **options).to(dtype)
    h, q, k, v, reset = (t.detach().to(dtype) if t.is_floating_point() else t for t in layer_inputs())
    with torch.set_grad_enabled(grad):
        return run(mem, h.requires_grad_(grad), q, k, v, reset, {key: t.to(dtype) for key, t in mem.initial_state(B, "cpu").items()})


def said(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("memzoo: ")]


def test_fla_absent_runs_torch_with_one_line(fla, capsys) -> None:
    fla.setattr(fla_kernels, "load_fla", lambda: "ModuleNotFoundError: No module named 'fla'")
    out = forward_once(True)[0]
    forward_once(True)  # a second call says nothing more
    ref = forward_once(True, kernel="torch")[0]
    assert torch.equal(out, ref)
    lines = said(capsys)
    assert lines[0] == ("memzoo: gated-deltanet: PyTorch chunkwise form (kernel=auto: fla absent "
                        "(ModuleNotFoundError: No module named 'fla'))")
    assert lines[1:] == ["memzoo: gated-deltanet: PyTorch chunkwise form (kernel=torch)"]


def test_cpu_device_runs_torch_and_says_so(monkeypatch, capsys) -> None:
    monkeypatch.setattr(fla_kernels, "SAID", set())
    monkeypatch.setattr(fla_kernels, "load_fla", lambda: pytest.fail("fla is not loaded for a CPU device"))
    forward_once(False)
    assert said(capsys) == ["memzoo: deltanet: PyTorch chunkwise form (kernel=auto: fla's kernels are Triton "
                            "kernels for CUDA; the device is cpu)"]
    with pytest.raises(RuntimeError, match="kernel='fla' cannot run: fla's kernels are Triton kernels for CUDA; the device is cpu"):
        forward_once(False, kernel="fla")


def test_hopper_triton_guard_refuses_gated_backward_only(fla, capsys) -> None:
    """sm_90 with Triton 3.6.0: fla 0.6.0's gated backward raises there, so a step that needs gradients
    runs PyTorch (named); evaluation (no gradient) still runs fla; kernel='fla' is an error naming why."""
    fla.setattr(fla_kernels, "gpu_capability", lambda device: (9, 0))
    fla.setattr(fla_kernels, "load_fla", lambda: FlaKernels(standin_gated, standin_delta, "3.6.0",
                                                            gated_dtypes=STANDIN.gated_dtypes, delta_dtypes=STANDIN.delta_dtypes))
    calls = []
    fla.setattr(fla_kernels, "delta_rule_fla", lambda *a: calls.append(a) or delta_rule_fla(*a))
    forward_once(True, dtype=torch.float32)
    assert not calls
    forward_once(True, dtype=torch.float32, grad=False)
    assert len(calls) == 1
    guard = ("fla refused chunk_gated_delta_rule: its backward raises on Hopper (sm_90) with Triton 3.6.0 "
             "(>= 3.4 and < 3.7.1; upgrade Triton to >= 3.7.1)")
    assert said(capsys) == [f"memzoo: gated-deltanet: PyTorch chunkwise form (kernel=auto: {guard})",
                            "memzoo: gated-deltanet: fla chunk_gated_delta_rule (torch.float32; its products in TF32, "
                            "about 1e-3 relative) (kernel=auto)"]
    with pytest.raises(RuntimeError, match="Hopper"):
        forward_once(True, dtype=torch.float32, kernel="fla")
    for version, capability in (("3.7.1", (9, 0)), ("3.3.1", (9, 0)), ("3.6.0", (8, 0)), ("3.6.0", (10, 0))):
        fla.setattr(fla_kernels, "load_fla", lambda v=version: FlaKernels(standin_gated, standin_delta, v))
        fla.setattr(fla_kernels, "gpu_capability", lambda device, c=capability: c)
        assert fla_kernels.choose("auto", True, torch.device("cuda"), torch.float32, True).run is not None
    for version in ("3.7.1rc1", "3.7.1a0", "3.4.0rc2", "3.6.0+git1a2b"):  # a pre-release is below its release
        fla.setattr(fla_kernels, "load_fla", lambda v=version: FlaKernels(standin_gated, standin_delta, v))
        fla.setattr(fla_kernels, "gpu_capability", lambda device: (9, 0))
        assert fla_kernels.choose("auto", True, torch.device("cuda"), torch.float32, True).run is None, version


def test_version_tuple_orders_pre_releases_below_their_release() -> None:
    v = fla_kernels.version_tuple
    assert v("3.7.1rc1") < v("3.7.1") == v("3.7.1+local") < v("3.7.2.dev0") < v("3.7.2")
    assert v("3.4.0") > v("3.4.0b1") >= fla_kernels.HOPPER_BAD_TRITON[0] > v("3.3.1")
    assert v("3.10.0") > v("3.9.9") and v("3.7") == v("3.7.0")
    with pytest.raises(ValueError, match="cannot read the version 'nightly'"):
        v("nightly")


def test_deltanet_fp32_uses_the_gated_kernel_at_g_zero_and_names_why(fla, capsys) -> None:
    """chunk_delta_rule takes bf16/fp16 only: an fp32 DeltaNet runs chunk_gated_delta_rule with g = 0
    (the same rule), named; where the gated kernel is refused too, PyTorch runs, both reasons named."""
    fla.setattr(fla_kernels, "load_fla", lambda: FlaKernels(standin_gated, standin_delta, "3.6.0"))
    out_fla = forward_once(False, dtype=torch.float32)[0]
    out_torch = forward_once(False, dtype=torch.float32, kernel="torch")[0]
    assert (out_fla - out_torch).abs().max() < 1e-4
    delta = "chunk_delta_rule takes ['torch.bfloat16', 'torch.float16'], not torch.float32"
    assert said(capsys)[0] == (f"memzoo: deltanet: fla chunk_gated_delta_rule with g = 0 ({delta}; its products in "
                               "TF32, about 1e-3 relative) (kernel=auto)")
    fla.setattr(fla_kernels, "gpu_capability", lambda device: (9, 0))
    forward_once(False, dtype=torch.float32)
    assert said(capsys) == [f"memzoo: deltanet: PyTorch chunkwise form (kernel=auto: {delta}; fla refused "
                            "chunk_gated_delta_rule: its backward raises on Hopper (sm_90) with Triton 3.6.0 "
                            "(>= 3.4 and < 3.7.1; upgrade Triton to >= 3.7.1))"]
    choice = fla_kernels.choose("auto", False, torch.device("cuda"), torch.bfloat16, True)
    assert choice.line == "deltanet: fla chunk_delta_rule (torch.bfloat16) (kernel=auto)"


def test_an_fla_call_that_raises_falls_back_under_auto_and_raises_under_fla(fla, capsys) -> None:
    def broken(*args, **kwargs):
        raise RuntimeError("triton compile failed\nmore")

    fla.setattr(fla_kernels, "load_fla", lambda: FlaKernels(broken, broken, "3.7.1", gated_dtypes=STANDIN.gated_dtypes))
    assert torch.equal(forward_once(True)[0], forward_once(True, kernel="torch")[0])
    assert said(capsys)[0] == ("memzoo: gated-deltanet: PyTorch chunkwise form (kernel=auto: fla raised "
                               "RuntimeError: triton compile failed)")
    with pytest.raises(RuntimeError, match="triton compile failed"):
        forward_once(True, kernel="fla")


class BackwardRaises(torch.autograd.Function):
    """Identity forward; a backward that raises, as fla's gated backward does on Hopper with Triton 3.6."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError("PassManager::run failed\nin chunk_bwd_dqkwg")


def test_an_fla_backward_that_raises_falls_back_under_auto_before_the_step(fla, capsys) -> None:
    """Under kernel=auto a backward error is found by a small forward + backward before the real call,
    so PyTorch's form runs and the caller's backward succeeds; under kernel=fla the caller's backward
    raises; without gradients fla still runs (no backward to try)."""
    def gated_bad_backward(q, *args, **kwargs):
        o, state = standin_gated(q, *args, **kwargs)
        return BackwardRaises.apply(o), state

    fla.setattr(fla_kernels, "load_fla", lambda: FlaKernels(gated_bad_backward, standin_delta, "3.7.1",
                                                            STANDIN.gated_dtypes, STANDIN.delta_dtypes))
    out, new = forward_once(True)[:2]
    out.sum().backward()  # PyTorch's form ran: its backward works
    assert torch.equal(out, forward_once(True, kernel="torch")[0])
    assert said(capsys)[0] == ("memzoo: gated-deltanet: PyTorch chunkwise form (kernel=auto: fla raised "
                               "RuntimeError: PassManager::run failed)")
    forward_once(True, grad=False)  # evaluation: fla's forward is fine
    assert said(capsys) == ["memzoo: gated-deltanet: fla chunk_gated_delta_rule (torch.float64) (kernel=auto)"]
    with pytest.raises(RuntimeError, match="PassManager"):
        forward_once(True, kernel="fla")[0].sum().backward()


def test_kernel_option_is_checked() -> None:
    with pytest.raises(ValueError, match="kernel must be one of .*got kernel='triton'"):
        plugin(kernel="triton")
    with pytest.raises(ValueError, match="'fla' needs chunkwise=true"):
        plugin(kernel="fla", chunkwise=False)
    assert fla_kernels.version_tuple("3.6.0+git1a2b") == (3, 6, 0, 0)


def test_kernel_torch_never_calls_fla(fla) -> None:
    fla.setattr(fla_kernels, "load_fla", lambda: pytest.fail("kernel=torch must not load fla"))
    forward_once(True, kernel="torch")


def test_standins_are_the_paper_recurrence() -> None:
    """The stand-ins themselves against memzoo's loop at fla's defaults (scale 1/sqrt(K), [K, V] state):
    the oracle of the adapter tests is not built on the adapter."""
    leaves, reset = recurrence_inputs([])
    q, k, v, g, beta, s0 = (t.detach() for t in leaves)
    o_ref, s_ref = delta_rule_loop(q / 2.0, k, v, g, beta, s0, reset)  # Dk = 4: 1/sqrt(4) = 1/2
    o, st = standin_gated(*(t.transpose(2, 3).flatten(1, 2) for t in (q, k, v)),
                          *(t.transpose(2, 3).flatten(1, 2) for t in (g, beta)),
                          initial_state=s0.transpose(-1, -2), output_final_state=True)
    assert (o - o_ref.transpose(2, 3).flatten(1, 2)).abs().max() < TOL
    assert (st.transpose(-1, -2) - s_ref).abs().max() < TOL
