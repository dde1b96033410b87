"""Every registered method's fast path on CUDA against the same weights in float64 on the CPU (the
oracle the tests hold to each paper's per-token reference): logits, final state and every gradient.

    PYTHONPATH=. python benchmarks/cuda_check.py [--device cuda] [--out results/gpu]

A small backbone (2 layers, d_model 64, 4 heads, segments of 32, 4 segments a call, one row starting
a new document at segment 2) at each method's default options, the chunked ones at a chunk that
does not divide the segment as well. Three precisions on the device:
  fp32: TF32 off, so the device computes what the CPU computes; rel. error must be <= FP32_TOL;
  tf32: the matrix units' float32 mode (torch's default for convolutions, opt-in for matmuls);
  bf16: autocast, as the GPU suites train; rel. error must be <= BF16_TOL.
Rel. error = ||device - oracle|| / ||oracle|| over the logits, over every state tensor (empty slots
zeroed: they may hold uninitialised memory), and over all parameter gradients concatenated. Writes cuda_check.csv; exit status 1 when a check fails or is not
finite. `--device cpu` runs the same code on the CPU (float32 there), for checking the script.

The oracle is float64 for every method (the precision policy: a float64 model computes in float64
throughout, Compressive included). Each oracle run records the dtype of every floating-point op
of its forward and backward; a row whose oracle ran a narrower op fails and names the ops.
"""
from __future__ import annotations

import argparse
import csv
import math
import sys
from pathlib import Path
from typing import Any, Optional

import torch

FP32_TOL = 1e-4  # float32 keeps 24 bits; recurrences over 128 tokens and two layers stay far inside this
TF32_TOL = 1e-2  # 10-bit mantissa products: ~3e-4 per product, reported, not failed on
BF16_TOL = 5e-2  # 8-bit mantissa under autocast, through two layers and a recurrent state
B, S, N = 2, 4, 32
MODEL = dict(d_model=64, n_layers=2, n_heads=4, segment_len=N, mlp_ratio=2.0)

# Options beyond each method's defaults: ARMT's W_V starts at zero in the paper (a silent memory with no
# gradient through its state), so it is drawn nonzero here; the chunked forms also at a partial chunk.
CASES: list[tuple[str, str, dict[str, Any]]] = [
    ("armt", "armt", {"w_v_init_std": 0.2}),
    ("gated-deltanet-chunk12", "gated-deltanet", {"chunk_size": 12}),
    ("deltanet-chunk12", "deltanet", {"chunk_size": 12}),
    ("titans-mac-chunk12", "titans-mac", {"chunk_size": 12}),
    ("titans-mag-chunk12", "titans-mag", {"chunk_size": 12}),
]


def cases() -> list[tuple[str, str, dict[str, Any]]]:
    """Every registered method at its defaults (ARMT's W_V drawn), then the partial-chunk variants."""
    from memzoo.core.plugins import registered

    extra = {name: opts for name, method, opts in CASES if name == method}
    return [(m, m, extra.get(m, {})) for m in sorted(registered())] + [c for c in CASES if c[0] != c[1]]


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
              autocast: Optional[torch.dtype]) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
    """(logits, state tensors, parameter gradients) of one forward + backward of sum(logits * weight)."""
    model.zero_grad(set_to_none=True)
    device = tokens.device
    with torch.autocast(device.type, dtype=autocast, enabled=autocast is not None):
        out = model(tokens, None, reset)
    logits = out.logits.to(torch.promote_types(out.logits.dtype, torch.float32))  # bf16 -> float32; float64 stays
    (logits * weight.to(device, logits.dtype)).sum().backward()
    states = [t for part in [*out.state.layers, out.state.model] for t in valid_slots(part)]
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in model.parameters()]
    return logits, states, grads


def check(name: str, method: str, options: dict[str, Any], device: torch.device) -> list[dict[str, Any]]:
    """Rows (one per precision) of the device's errors against the float64 CPU oracle."""
    from memzoo.core.model import MemoryModel
    from memzoo.suites.invariants import FloatOps, tiny_memory_config, tiny_model_config

    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 256, (B, S, N), generator=g)
    reset = torch.zeros(B, S, dtype=torch.bool)
    reset[1, 2] = True
    weight = torch.randn(B, S, N, 256, generator=g, dtype=torch.float64)
    build = lambda: MemoryModel(tiny_model_config(**MODEL), method, tiny_memory_config(method, options)).train()  # noqa: E731
    torch.manual_seed(0)
    oracle = build().double()  # dropout is 0 in the tiny config: train mode changes nothing random
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
                                          torch.bfloat16 if precision == "bf16" else None)
        state_err = max((rel(a, r) for a, r in zip(states, ref_states)), default=0.0)
        grad_err = rel(torch.cat([t.flatten().float().cpu() for t in grads]), torch.cat([t.flatten() for t in ref_grads]))
        errs = {"logits_rel": rel(logits, ref_logits), "state_rel": state_err, "grad_rel": grad_err}
        names = [n for n, _ in model.named_parameters()]
        per_param = [(rel(a, r), n) for n, a, r in zip(names, grads, ref_grads)]
        worst = max(per_param, key=lambda e: (math.isnan(e[0]), e[0]))  # where a failing gradient comes from
        tol = {"fp32": FP32_TOL, "tf32": TF32_TOL, "bf16": BF16_TOL}[precision]
        finite = all(math.isfinite(e) for e in errs.values())
        ok = finite and not narrower and (precision == "tf32" or max(errs.values()) <= tol)
        rows.append({"case": name, "method": method, "precision": precision, **errs, "tol": tol,
                     "ok": ok, "worst_grad": f"{worst[1]} {worst[0]:.1e}", "oracle": oracle_note, "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu"})
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32_before
    return rows


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", default="results/gpu")
    ap.add_argument("--only", default=None, help="comma-separated case names")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("benchmarks/cuda_check.py: no CUDA device here, nothing checked (run it on a machine with a GPU)")
        return 0
    print("CPU oracle: float64 for every method (each row checks that its oracle ran float64 ops only)", flush=True)
    rows = []
    for name, method, options in cases():
        if args.only and name not in args.only.split(","):
            continue
        try:
            new = check(name, method, options, device)
        except Exception as err:  # a method that fails on the device is a finding, not a stop
            new = [{"case": name, "method": method, "precision": "-", "ok": False,
                    "error": f"{type(err).__name__}: {str(err).splitlines()[0][:160] if str(err) else ''}"}]
        rows += new
        for r in new:
            if "error" in r:
                print(f"{name:26s} ERROR {r['error']}", flush=True)
            else:
                print(f"{name:26s} {r['precision']}  logits {r['logits_rel']:.1e}  state {r['state_rel']:.1e}  "
                      f"grads {r['grad_rel']:.1e}  (tol {r['tol']:.0e}; oracle {r['oracle']})  "
                      f"{'ok' if r['ok'] else 'FAIL, worst grad: ' + r['worst_grad']}",
                      flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    fields = list(dict.fromkeys(k for r in rows for k in r))
    with open(out / "cuda_check.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    bad = sorted({r["case"] for r in rows if not r["ok"]})
    print(f"wrote {out / 'cuda_check.csv'}; {len(bad)} failing: {', '.join(bad) or 'none'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
