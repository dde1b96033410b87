"""Which of fla's delta-rule kernels run on this GPU, forward and backward, and how fast against memzoo's
PyTorch chunkwise form on the same inputs (one CSV row per kernel, dtype and pass).

The shapes are the paper-gpu backbone's (8 heads of 64, 512-byte segments); the error column is the
largest difference from the float64 chunkwise form on the same (normalised) inputs, relative to its
largest value. A kernel that refuses to run gets a row with its one-line reason.
"""
from __future__ import annotations

import argparse
import csv
import time
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from memzoo.memories.gated_deltanet import delta_rule_chunkwise


def timed(fn: Callable[[], object], repeats: int) -> float:
    """Median milliseconds of `fn` on CUDA after one untimed call."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return sorted(times)[len(times) // 2]


def inputs(b: int, s: int, h: int, n: int, d: int, gated: bool, seed: int = 0) -> dict[str, torch.Tensor]:
    """float64 inputs in memzoo's layout: q, k [B, S, H, N, D] (unit k), v, g (log decay), beta [B, S, H, N]."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, s, h, n, d, generator=gen, dtype=torch.float64)
    k = F.normalize(torch.randn(b, s, h, n, d, generator=gen, dtype=torch.float64), dim=-1)
    v = torch.randn(b, s, h, n, d, generator=gen, dtype=torch.float64)
    g = -F.softplus(torch.randn(b, s, h, n, generator=gen, dtype=torch.float64)) * 0.1 if gated else torch.zeros(b, s, h, n, dtype=torch.float64)
    beta = torch.sigmoid(torch.randn(b, s, h, n, generator=gen, dtype=torch.float64))
    return {"q": F.normalize(q, dim=-1), "k": k, "v": v, "g": g, "beta": beta}


def run(args: argparse.Namespace) -> list[dict]:
    dev = torch.device("cuda")
    b, s, h, n, d = args.batch, args.segments, args.heads, args.segment, args.head_dim
    rows = []
    for gated in (False, True):
        x64 = inputs(b, s, h, n, d, gated)
        s0 = torch.zeros(b, h, d, d, dtype=torch.float64)
        reset = torch.zeros(b, s, dtype=torch.bool)
        ref, _ = delta_rule_chunkwise(*(x64[k].to(dev) for k in ("q", "k", "v", "g", "beta")), s0.to(dev), reset.to(dev), 64)
        for dtype in (torch.float32, torch.bfloat16):
            x = {k: t.to(dev, dtype if k in ("q", "k", "v") else torch.float32).requires_grad_() for k, t in x64.items()}
            st = s0.to(dev, torch.float32)
            rs = reset.to(dev)

            def memzoo_fwd():
                return delta_rule_chunkwise(x["q"].float(), x["k"].float(), x["v"].float(), x["g"], x["beta"], st, rs, 64)[0]

            def fla_args():
                # memzoo [B, S, H, N, D] -> fla [B, S*N, H, D]: one sequence through all segments (no reset here)
                flat = {k: x[k].permute(0, 1, 3, 2, 4).reshape(b, s * n, h, d) for k in ("q", "k", "v")}
                gb = {k: x[k].permute(0, 1, 3, 2).reshape(b, s * n, h) for k in ("g", "beta")}
                return flat, gb

            cases: dict[str, Callable[[], torch.Tensor]] = {"memzoo-chunkwise": memzoo_fwd}
            try:
                if gated:
                    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

                    def fla_fwd():
                        flat, gb = fla_args()
                        o, _ = chunk_gated_delta_rule(flat["q"], flat["k"], flat["v"], gb["g"], gb["beta"].to(flat["q"].dtype),
                                                      scale=1.0, initial_state=st, output_final_state=True, state_v_first=True)
                        return o.reshape(b, s, n, h, d).permute(0, 1, 3, 2, 4)
                else:
                    from fla.ops.delta_rule import chunk_delta_rule

                    def fla_fwd():
                        flat, gb = fla_args()
                        o, _ = chunk_delta_rule(flat["q"], flat["k"], flat["v"], gb["beta"].to(flat["q"].dtype), scale=1.0,
                                                initial_state=st.transpose(-1, -2).contiguous(), output_final_state=True)
                        return o.reshape(b, s, n, h, d).permute(0, 1, 3, 2, 4)
                cases["fla"] = fla_fwd
            except Exception as err:  # fla absent or broken: one row says why
                rows.append({"gated": gated, "dtype": str(dtype), "kernel": "fla", "pass": "import", "ms": "", "rel_err": "",
                             "note": f"{type(err).__name__}: {err}"[:200]})
            for name, fwd in cases.items():
                for phase in ("forward", "forward+backward"):
                    try:
                        if phase == "forward":
                            with torch.no_grad():
                                out = fwd()
                                err = ((out.double() - ref).abs().max() / ref.abs().max()).item()
                            ms = timed(lambda: fwd(), args.repeats)
                        else:
                            def step():
                                for t in x.values():
                                    t.grad = None
                                fwd().float().square().mean().backward()
                            ms, err = timed(step, args.repeats), ""
                        rows.append({"gated": gated, "dtype": str(dtype), "kernel": name, "pass": phase, "ms": round(ms, 3),
                                     "rel_err": err if err == "" else f"{err:.2e}", "note": ""})
                    except Exception as e:
                        rows.append({"gated": gated, "dtype": str(dtype), "kernel": name, "pass": phase, "ms": "", "rel_err": "",
                                     "note": f"{type(e).__name__}: {e}"[:200]})
                    print(rows[-1], flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--segments", type=int, default=4)
    p.add_argument("--segment", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--out", default="results/gpu")
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("fla_probe: no CUDA device; nothing measured")
        return
    print("device", torch.cuda.get_device_name(), "torch", torch.__version__)
    rows = run(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "fla_probe.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


if __name__ == "__main__":
    main()
