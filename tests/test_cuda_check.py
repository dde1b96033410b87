"""benchmarks/cuda_check.py, run on the CPU: it passes a correct model, fails one whose float32 path
is planted off by 1e-3, and compares a state's written slots only (an uninitialised slot is no error)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
import torch.nn.functional as F

spec = importlib.util.spec_from_file_location("cuda_check", Path(__file__).resolve().parent.parent / "benchmarks" / "cuda_check.py")
cc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cc)


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
