"""checks/cuda_check.py, run on the CPU: it passes a correct model, fails one whose float32 path
is planted off by 1e-3, and compares a state's written slots only (an uninitialised slot is no error)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

import checks.cuda_check as cc


def test_valid_slots_zero_the_empty_slots_of_each_buffer_only() -> None:
    store_k = torch.full((2, 3, 1, 2), float("nan"))  # [B, C, H, D], as an uninitialised buffer
    store_k[0, 2] = 5.0
    store_valid = torch.tensor([[False, False, True], [False, False, False]])
    s = torch.ones(2, 4)  # no mask of its own: compared whole
    out = cc.valid_slots({"store_k": store_k, "store_valid": store_valid, "S": s, "n": 3})
    assert len(out) == 3
    expected = torch.zeros(2, 3, 1, 2)
    expected[0, 2] = 5.0
    assert torch.equal(out[0], expected)
    assert torch.equal(out[1], store_valid) and torch.equal(out[2], s)


def test_check_passes_a_correct_model_and_fails_a_planted_float32_error(monkeypatch) -> None:
    rows = cc.check("local", "local", {}, torch.device("cpu"))
    assert [r["precision"] for r in rows] == ["fp32", "tf32", "bf16"]
    assert all(r["ok"] for r in rows) and rows[0]["grad_rel"] < 1e-5
    assert all(r["oracle"] == "cpu float64" for r in rows)

    real_gelu = F.gelu

    def planted(x, *args, **kw):  # wrong only where the device computes: float32, not the float64 oracle
        y = real_gelu(x, *args, **kw)
        return y * (1 + 1e-3) if x.dtype == torch.float32 else y

    monkeypatch.setattr(F, "gelu", planted)
    rows = cc.check("local", "local", {}, torch.device("cpu"))
    fp32 = rows[0]
    assert not fp32["ok"] and fp32["logits_rel"] > cc.FP32_TOL
    assert "mlp" in fp32["worst_grad"]  # the worst gradient points at the MLP that was planted


def test_fla_checks_pass_the_adapter_fall_back_to_the_forward_and_fail_a_planted_error(monkeypatch) -> None:
    """cuda_check's fla path on the CPU through the float64 stand-ins: each kernel through the adapter
    passes with gradients; a backward that raises leaves a forward-only row that says why; a kernel
    whose final state comes back off by 10% fails."""
    from memzoo.memories import fla_kernels
    from test_fla_kernels import FlaKernels, standin_delta, standin_gated

    monkeypatch.setattr(fla_kernels, "load_fla", lambda: FlaKernels(standin_gated, standin_delta, "3.7.1"))
    # The stand-ins are per-token loops: 2 heads of 16 and segments of 8 tokens check the same adapter in
    # a tenth of the time of the device check's 4 x 64 and 40 (the resets still inside the blocks).
    real_inputs = cc.fla_recurrence_inputs
    monkeypatch.setattr(cc, "fla_recurrence_inputs", lambda resets: real_inputs(resets, shape=(3, 3, 2, 8, 16)))
    rows = cc.check_fla_recurrence(torch.device("cpu"))
    assert len(rows) == 4 and all(r["ok"] and r["grad_rel"] < 1e-2 for r in rows)
    assert all(r["grad_rel"] < 1e-6 for r in rows if "float32" in r["case"])

    class NoBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, o):
            return o.clone()

        @staticmethod
        def backward(ctx, grad):
            raise RuntimeError("Triton >= 3.4.0 and < 3.7.1 on Hopper GPUs produces incorrect results")

    def gated_no_backward(*args, **kwargs):
        o, st = standin_gated(*args, **kwargs)
        return NoBackward.apply(o), st

    def delta_off(*args, **kwargs):
        o, st = standin_delta(*args, **kwargs)
        return o, st * 1.1

    monkeypatch.setattr(fla_kernels, "load_fla", lambda: FlaKernels(gated_no_backward, delta_off, "3.7.1"))
    rows = {r["case"]: r for r in cc.check_fla_recurrence(torch.device("cpu"))}
    gated = rows["fla-recurrence chunk_gated_delta_rule float32 resets-inside"]
    assert gated["ok"] and gated["grad_rel"] is None and "forward only: RuntimeError: Triton >= 3.4.0" in gated["note"]
    delta = rows["fla-recurrence chunk_delta_rule bfloat16 resets-inside"]
    assert not delta["ok"] and delta["state_rel"] > cc.FLA_KERNEL_TOL[torch.bfloat16]


def test_cudnn_sdpa_check_passes_right_gradients_and_flags_a_wrong_layout(monkeypatch, capsys) -> None:
    """checks/cudnn_sdpa_check.py on the CPU: every layout agrees with float32 math; a gradient that is
    wrong for one layout only (as cuDNN's was on an H100) makes it exit 1 naming that layout."""
    import checks.cudnn_sdpa_check as sc

    assert sc.main(["--device", "cpu", "--shapes", "cuda_check"]) == 0
    assert capsys.readouterr().out.count(" ok\n") == 6

    real = sc.layouts
    monkeypatch.setattr(sc, "layouts", lambda g: {**real(g), "strided": real(g * 1.2)["strided"]})
    assert sc.main(["--device", "cpu", "--shapes", "cuda_check"]) == 1
    out = capsys.readouterr().out
    assert out.count("WRONG") == 2 and all("strided" in line for line in out.splitlines() if "WRONG" in line)


def test_the_oracle_is_float64_for_compressive_too_and_a_float32_oracle_fails(monkeypatch) -> None:
    """Compressive's oracle is float64 like every method's; an oracle that runs a float32 op (RoPE
    tables built in float32, as before the precision policy) fails its rows, naming the op."""
    rows = cc.check("compressive", "compressive", {}, torch.device("cpu"))
    assert all(r["ok"] and r["oracle"] == "cpu float64" for r in rows), rows
    from memzoo.core import attention

    monkeypatch.setattr(attention, "working_dtype", lambda x: torch.float32)  # RoPE back in float32
    rows = cc.check("local", "local", {}, torch.device("cpu"))
    assert not any(r["ok"] for r in rows)
    assert rows[0]["oracle"].startswith("cpu float64 with") and "float32" in rows[0]["oracle"]
