"""A memory's fast path on a device against the same weights in float64 on the CPU (the oracle the
tests hold to each paper's per-token reference): logits, final state and every gradient, in fp32
(TF32 off), tf32 and bf16 autocast. `memzoo check NAME --device cuda` runs it for a plugin;
checks/cuda_check.py runs it for every registered method and variant (and fla's kernels).

A small backbone (2 layers, d_model 64, 4 heads, segments of 32, 4 segments a call, one row starting a
new document at segment 2). Rel. error = ||device - oracle|| / ||oracle|| over the logits, over every
state tensor (empty slots zeroed: they may hold uninitialised memory), and over all parameter
gradients concatenated. Each oracle run records the dtype of every floating-point op of its forward
and backward; a row whose oracle ran a narrower op fails and names the ops.
"""
from __future__ import annotations

import math
from typing import Any, Optional

import torch

FP32_TOL = 1e-4  # float32 keeps 24 bits; recurrences over 128 tokens and two layers stay far inside this
TF32_TOL = 1e-2  # 10-bit mantissa products: ~3e-4 relative per product, through two layers and a recurrent state
BF16_TOL = 5e-2  # 8-bit mantissa under autocast, through two layers and a recurrent state
# fla's kernels: TF32 inside (measured 1.7e-3 relative in fp32, 7.8e-3 in bf16 at the kernel); about 5x margin
FLA_TOL = {"fp32": 1e-2, "tf32": 1e-2, "bf16": BF16_TOL}
FLA_KERNEL_TOL = {torch.float32: 1e-2, torch.bfloat16: 4e-2}
B, S, N = 2, 4, 32
MODEL = dict(d_model=64, n_layers=2, n_heads=4, segment_len=N, mlp_ratio=2.0)
# what the CPU oracle runs instead, where a case sets these options: PyTorch's eager form
ORACLE_OPTIONS = {"kernel": "torch", "compile": "eager"}


def rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    """||a - ref|| / ||ref|| in float64 on the CPU (0 when both are zero)."""
    a, ref = a.detach().double().cpu(), ref.detach().double().cpu()
    den = ref.norm().item()
    return (a - ref).norm().item() / den if den else (a.norm().item() and math.inf)


def valid_slots(state: dict[str, Any]) -> list[torch.Tensor]:
    """The state's tensors with the slots their `valid` mask marks empty set to 0: a buffer left
    uninitialised until written (memorizing's store) holds whatever memory it was given there."""
    out = []
    for key, t in state.items():
        if not isinstance(t, torch.Tensor):
            continue
        mask = state.get(key[: key.rfind("_") + 1] + "valid") if not key.endswith("valid") else None
        if isinstance(mask, torch.Tensor) and mask.shape == t.shape[: mask.dim()] and t.dim() > mask.dim():
            t = t.masked_fill(~mask.view(*mask.shape, *[1] * (t.dim() - mask.dim())), 0)
        out.append(t)
    return out


def run_model(model: torch.nn.Module, tokens: torch.Tensor, reset: torch.Tensor, weight: torch.Tensor,
              autocast: Optional[torch.dtype], grad: bool = True) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
    """(logits, state tensors, parameter gradients) of one forward + backward of sum(logits * weight)
    (`grad` False: the forward alone, without autograd, and no gradients)."""
    model.zero_grad(set_to_none=True)
    device = tokens.device
    with torch.autocast(device.type, dtype=autocast, enabled=autocast is not None), torch.set_grad_enabled(grad):
        out = model(tokens, None, reset)
    logits = out.logits.to(torch.promote_types(out.logits.dtype, torch.float32))  # bf16 -> float32; float64 stays
    if grad:
        (logits * weight.to(device, logits.dtype)).sum().backward()
    states = [t for part in [*out.state.layers, out.state.model] for t in valid_slots(part)]
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in model.parameters()] if grad else []
    return logits, states, grads


def check(name: str, method: str, options: dict[str, Any], device: torch.device,
          tols: Optional[dict[str, float]] = None, grad: bool = True, note: str = "") -> list[dict[str, Any]]:
    """Rows (one per precision) of the device's errors against the float64 CPU oracle;
    `tols` replaces the default tolerances, `grad` False checks the forward alone (`note` says why)."""
    from memzoo.core.model import MemoryModel
    from memzoo.conformance.precision import FloatOps
    from memzoo.conformance.tiny import tiny_memory_config, tiny_model_config

    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 256, (B, S, N), generator=g)
    reset = torch.zeros(B, S, dtype=torch.bool)
    reset[1, 2] = True
    weight = torch.randn(B, S, N, 256, generator=g, dtype=torch.float64)
    build = lambda opts=options: MemoryModel(tiny_model_config(**MODEL), method, tiny_memory_config(method, opts)).train()  # noqa: E731
    torch.manual_seed(0)
    # the oracle runs PyTorch's eager form on the CPU (an fla case's kernel=fla would refuse the CPU)
    oracle = build({**options, **{k: v for k, v in ORACLE_OPTIONS.items() if k in options}}).double()  # dropout is 0 in the tiny config
    with FloatOps() as ops:  # the oracle is float64 only if every op it ran was
        ref_logits, ref_states, ref_grads = run_model(oracle, tokens, reset, weight, None)
    narrower = ops.narrower_than(torch.float64)
    oracle_note = "cpu float64" if not narrower else f"cpu float64 with {len(narrower)} narrower op kind(s): {', '.join(narrower[:3])}"
    rows, tf32_before = [], (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    for precision in ("fp32", "tf32", "bf16"):
        model = build()
        model.load_state_dict({k: v.float() for k, v in oracle.state_dict().items()})
        model.to(device)
        tf32 = precision == "tf32"
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        logits, states, grads = run_model(model, tokens.to(device), reset.to(device), weight,
                                          torch.bfloat16 if precision == "bf16" else None, grad)
        state_err = max((rel(a, r) for a, r in zip(states, ref_states)), default=0.0)
        errs = {"logits_rel": rel(logits, ref_logits), "state_rel": state_err}
        worst = (0.0, "-")
        if grad:
            errs["grad_rel"] = rel(torch.cat([t.flatten().float().cpu() for t in grads]), torch.cat([t.flatten() for t in ref_grads]))
            names = [n for n, _ in model.named_parameters()]
            per_param = [(rel(a, r), n) for n, a, r in zip(names, grads, ref_grads)]
            worst = max(per_param, key=lambda e: (math.isnan(e[0]), e[0]))  # where a failing gradient comes from
        tol = (tols or {"fp32": FP32_TOL, "tf32": TF32_TOL, "bf16": BF16_TOL})[precision]
        finite = all(math.isfinite(e) for e in errs.values())
        ok = finite and not narrower and max(errs.values()) <= tol
        rows.append({"case": name, "method": method, "precision": precision, "grad_rel": None, **errs, "tol": tol,
                     "ok": ok, "worst_grad": f"{worst[1]} {worst[0]:.1e}", "oracle": oracle_note,
                     "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "note": note})
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32_before
    return rows


def first_line(err: BaseException) -> str:
    return f"{type(err).__name__}: {str(err).strip().splitlines()[0][:200] if str(err).strip() else ''}"


