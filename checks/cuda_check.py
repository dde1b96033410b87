"""Every registered method's fast path on CUDA against the same weights in float64 on the CPU (the
oracle the tests hold to each paper's per-token reference): logits, final state and every gradient.

    PYTHONPATH=. python checks/cuda_check.py [--device cuda] [--out results/gpu]

A small backbone (2 layers, d_model 64, 4 heads, segments of 32, 4 segments a call, one row starting
a new document at segment 2) at each method's default options, the chunked ones at a chunk that
does not divide the segment as well. Three precisions on the device:
  fp32: TF32 off, so the device computes what the CPU computes; rel. error must be <= FP32_TOL;
  tf32: the matrix units' float32 mode (torch's default for convolutions, opt-in for matmuls); rel.
        error must be <= TF32_TOL;
  bf16: autocast, as the GPU suites train; rel. error must be <= BF16_TOL.
Rel. error = ||device - oracle|| / ||oracle|| over the logits, over every state tensor (empty slots
zeroed: they may hold uninitialised memory), and over all parameter gradients concatenated. Writes cuda_check.csv; exit status 1 when a check fails or is not
finite. `--device cpu` runs the same code on the CPU (float32 there), for checking the script.

The oracle is float64 for every method (the precision policy: a float64 model computes in float64
throughout, Compressive included). Each oracle run records the dtype of every floating-point op
of its forward and backward; a row whose oracle ran a narrower op fails and names the ops.

Where fla imports on CUDA (`pip install memzoo[fla]`), the fla path is checked too, against the same
oracles with FLA_TOL (fla's triangular solve runs in TF32: measured 1.7e-3 relative in fp32 and 7.8e-3
in bf16 on one H100): both DeltaNets with kernel=fla through the model, and each fla kernel through
the adapter on its own (`fla-recurrence`: values, final state and the gradients of q, k, v, g, β and the
carried state against the float64 per-token loop, with resets inside the block (cu_seqlens) and
without). Where fla refuses a backward (Hopper with Triton >= 3.4 and < 3.7.1) or fails, the reason is
printed and the forward alone is checked; the rest of the script runs on.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any, Optional

import torch

from memzoo.evaluations.harness import atomic_csv
from memzoo.conformance.device import (BF16_TOL, FLA_KERNEL_TOL, FLA_TOL, FP32_TOL, TF32_TOL, check, first_line,  # noqa: F401
                                       rel, valid_slots)

# Options beyond each method's defaults: ARMT's W_V starts at zero in the paper (a silent memory with no
# gradient through its state), so it is drawn nonzero here; the chunked forms also at a partial chunk;
# Memorizing also at a store that fills and overflows.
CASES: list[tuple[str, str, dict[str, Any]]] = [
    ("armt", "armt", {"w_v_init_std": 0.2}),
    ("gated-deltanet-chunk12", "gated-deltanet", {"chunk_size": 12, "kernel": "torch"}),
    ("deltanet-chunk12", "deltanet", {"chunk_size": 12, "kernel": "torch"}),
    ("titans-mac-chunk12", "titans-mac", {"chunk_size": 12}),
    ("titans-mag-chunk12", "titans-mag", {"chunk_size": 12}),
    # Memorizing's store filled, overflowed and restarted within the call: fewer valid keys than top_k in
    # segment 1 and in the reset row, a full store (the shifting push) from segment 2, an XL cache of 40.
    ("memorizing-store80", "memorizing", {"store_size": 80, "top_k": 40, "mem_len": 40}),
    # torch.compile of the recurrences (inductor's Triton kernels on CUDA); the oracle runs them eagerly
    ("gated-deltanet-compiled", "gated-deltanet", {"chunk_size": 12, "kernel": "torch", "compile": "default"}),
    ("deltanet-compiled", "deltanet", {"chunk_size": 12, "kernel": "torch", "compile": "default"}),
    ("titans-mac-compiled", "titans-mac", {"chunk_size": 12, "compile": "default", "checkpoint": True}),
    ("titans-mag-compiled", "titans-mag", {"chunk_size": 12, "compile": "default", "checkpoint": True}),
]


FLA_CASES: list[tuple[str, str, dict[str, Any]]] = [
    ("gated-deltanet-fla", "gated-deltanet", {"kernel": "fla"}),
    ("deltanet-fla", "deltanet", {"kernel": "fla"}),
]


def cases(with_fla: bool = False) -> list[tuple[str, str, dict[str, Any]]]:
    """Every registered method at its defaults (ARMT's W_V drawn), then the partial-chunk variants
    (and the DeltaNets through fla's kernels)."""
    from memzoo.core.plugins import registered

    extra = {name: opts for name, method, opts in CASES if name == method}
    return ([(m, m, extra.get(m, {})) for m in sorted(registered())] + [c for c in CASES if c[0] != c[1]]
            + (FLA_CASES if with_fla else []))


def fla_here(device: torch.device) -> Optional[str]:
    """None when fla's kernels import for this CUDA device, else why not."""
    from memzoo.memories import fla_kernels

    if device.type != "cuda":
        return f"the device is {device.type}"
    fla = fla_kernels.load_fla()
    return fla if isinstance(fla, str) else None


def check_case(name: str, method: str, options: dict[str, Any], device: torch.device) -> list[dict[str, Any]]:
    """`check`, for an fla case at FLA_TOL; where fla refuses or fails the backward, the reason is
    printed and the forward alone is checked."""
    if options.get("kernel") != "fla":
        return check(name, method, options, device)
    try:
        return check(name, method, options, device, FLA_TOL)
    except Exception as err:
        reason = first_line(err)
        print(f"{name:26s} fla with gradients did not run ({reason}); checking the forward alone", flush=True)
        return check(name, method, options, device, FLA_TOL, grad=False, note=f"forward only: {reason}")


def fla_recurrence_inputs(resets: list[tuple[int, int]], seed: int = 2, shape: tuple[int, ...] = (3, 3, 4, 40, 64)):
    """float64 CPU leaves q, k, v, g, β, S0 and resets [3, 3] for the kernel check; shape (B, S, H, N, D):
    4 heads of 64, segments of 40 tokens (fla's chunks of 64 end inside a segment)."""
    from memzoo.memories.gated_deltanet import l2_normalise

    gen = torch.Generator().manual_seed(seed)
    b, s, h, n, d = shape
    q, k = (l2_normalise(torch.randn(b, s, h, n, d, generator=gen, dtype=torch.float64)) for _ in range(2))
    v = torch.randn(b, s, h, n, d, generator=gen, dtype=torch.float64)
    g = -0.1 * torch.rand(b, s, h, n, generator=gen, dtype=torch.float64)
    beta = torch.rand(b, s, h, n, generator=gen, dtype=torch.float64)
    s0 = 0.5 * torch.randn(b, h, d, d, generator=gen, dtype=torch.float64)
    reset = torch.zeros(b, s, dtype=torch.bool)
    for r, t in resets:
        reset[r, t] = True
    return [q, k, v, g, beta, s0], reset


def check_fla_recurrence(device: torch.device) -> list[dict[str, Any]]:
    """Each fla kernel through the adapter (delta_rule_fla) against delta_rule_loop in float64 on the CPU:
    outputs, final states, and the gradients of q, k, v, g (gated), β and the carried state."""
    from memzoo.memories import fla_kernels
    from memzoo.memories.gated_deltanet import delta_rule_loop

    fla = fla_kernels.load_fla()
    rows = []
    kernels = (("chunk_gated_delta_rule", fla.gated, True, torch.float32),
               ("chunk_delta_rule", fla.delta, False, torch.bfloat16))
    resets = {"resets-inside": [(0, 0), (1, 2), (2, 1), (2, 2)], "no-reset-inside": [(1, 0)]}
    for kname, kernel, gated, dtype in kernels:
        for rname, where in resets.items():
            case = f"fla-recurrence {kname} {str(dtype).removeprefix('torch.')} {rname}"
            leaves, reset = fla_recurrence_inputs(where)
            if not gated:
                leaves[3].zero_()
            gen = torch.Generator().manual_seed(3)
            w_o = torch.randn(leaves[2].shape, generator=gen, dtype=torch.float64)
            w_s = torch.randn(leaves[5].shape, generator=gen, dtype=torch.float64)
            ref = [t.clone().requires_grad_() for t in leaves]
            o_ref, s_ref = delta_rule_loop(*ref, reset)
            ref_grads = torch.autograd.grad((o_ref * w_o).sum() + (s_ref * w_s).sum(), ref)
            dev = [t.to(device, dtype if i < 3 or (i == 4 and not gated) else torch.float32).requires_grad_()
                   for i, t in enumerate(leaves)]  # q, k, v (β for chunk_delta_rule) in dtype; g, S0 float32
            note = ""
            try:
                o, st = fla_kernels.delta_rule_fla(kernel, gated, *dev, reset.to(device))
                errs = {"logits_rel": rel(o, o_ref), "state_rel": rel(st, s_ref)}
                loss = (o.float() * w_o.to(device, torch.float32)).sum() + (st.float() * w_s.to(device, torch.float32)).sum()
                try:
                    grads = torch.autograd.grad(loss, dev, allow_unused=True)
                    per = {n: rel(gr, r) for n, gr, r in zip(("q", "k", "v", "g", "beta", "s0"), grads, ref_grads)
                           if gr is not None}
                    errs["grad_rel"] = max(per.values())
                    worst = max(per, key=per.get)
                    note = f"worst grad {worst} {per[worst]:.1e}"
                except Exception as err:  # the Hopper Triton guard raises here
                    note = f"forward only: {first_line(err)}"
            except Exception as err:
                rows.append({"case": case, "method": kname, "precision": "-", "ok": False, "error": first_line(err)})
                continue
            tol = FLA_KERNEL_TOL[dtype]
            ok = all(math.isfinite(e) for e in errs.values()) and max(errs.values()) <= tol
            rows.append({"case": case, "method": kname, "precision": str(dtype).removeprefix("torch."), "grad_rel": None,
                         **errs, "tol": tol, "ok": ok, "worst_grad": note, "oracle": "cpu float64 delta_rule_loop",
                         "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "note": note})
    return rows


def print_row(r: dict[str, Any]) -> None:
    if "error" in r:
        print(f"{r['case']:26s} ERROR {r['error']}", flush=True)
        return
    grads = "grads (forward only)" if r["grad_rel"] is None else f"grads {r['grad_rel']:.1e}"
    print(f"{r['case']:26s} {r['precision']}  logits {r['logits_rel']:.1e}  state {r['state_rel']:.1e}  {grads}  "
          f"(tol {r['tol']:.0e}; oracle {r.get('oracle', '-')})  {'ok' if r['ok'] else 'FAIL, worst grad: ' + r['worst_grad']}"
          f"{'  ' + r['note'] if r.get('note') else ''}", flush=True)


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", default="results/gpu")
    ap.add_argument("--only", default=None, help="comma-separated case names")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("checks/cuda_check.py: no CUDA device here, nothing checked (run it on a machine with a GPU)")
        return 0
    print("CPU oracle: float64 for every method (each row checks that its oracle ran float64 ops only)", flush=True)
    rows: list[dict[str, Any]] = []
    path = Path(args.out) / "cuda_check.csv"
    no_fla = fla_here(device)
    print(f"fla: {'not checked (' + no_fla + ')' if no_fla else 'imports; its path is checked too'}", flush=True)
    for name, method, options in cases(with_fla=no_fla is None):
        if args.only and name not in args.only.split(","):
            continue
        try:
            new = check_case(name, method, options, device)
        except Exception as err:  # a method that fails on the device is a finding, not a stop
            new = [{"case": name, "method": method, "precision": "-", "ok": False, "error": first_line(err)}]
        for r in new:
            print_row(r)
        rows += new
        atomic_csv(path, rows)
    if no_fla is None and (not args.only or "fla-recurrence" in args.only.split(",")):
        for r in check_fla_recurrence(device):
            print_row(r)
            rows.append(r)
    atomic_csv(path, rows)
    bad = sorted({r["case"] for r in rows if not r["ok"]})
    print(f"wrote {path}; {len(bad)} failing: {', '.join(bad) or 'none'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
