"""fla's fused chunk kernels against memzoo's PyTorch chunkwise form on CUDA, for both DeltaNets: the
recurrence alone (through the adapter, memzoo/memories/fla_kernels.py) and the whole layer memory
(kernel=fla against kernel=torch, same weights), each forward alone (no autograd, as in evaluation)
and forward + backward (as in training), with the outputs' relative difference beside each timing.

    PYTHONPATH=. python benchmarks/gpu/fla_speed.py [--batch 8] [--segments 4] [--segment 512] [--heads 8]
                                                [--head-dim 64] [--rounds 5] [--out results/gpu]

The defaults are the paper-gpu backbone's heads (8 of 64, segments of 512) at batch 8 and 4 segments a
call, one row starting a new document at segment 2 (fla's varlen form). The two paths alternate for
`rounds` rounds; speed-up = median(torch) / median(fla). A path fla refuses or fails (its Hopper Triton
guard on the gated backward, say) prints the reason and is skipped. Without CUDA or fla it says so in
one line and exits 0. Appends rows to fla_speed.csv.
"""
from __future__ import annotations

import argparse
import csv
import functools
import statistics
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import torch

from memzoo.core.attention import LocalAttention
from memzoo.core.config import ModelConfig
from memzoo.core.memory import LayerInputs
from memzoo.memories import fla_kernels
from memzoo.memories.gated_deltanet import GatedDeltaNet, GatedDeltaNetConfig, delta_rule_chunkwise, l2_normalise


def timed(fn: Callable[[], object], device: torch.device) -> float:
    """Wall seconds of fn(), synchronised before and after on CUDA."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - start


def recurrence_paths(args, gated: bool, fla: fla_kernels.FlaKernels, train: bool):
    """(torch step, fla step, outputs of each) of the recurrence on the same float32 inputs."""
    gen, dev = torch.Generator().manual_seed(0), args.device
    shape = (args.batch, args.segments, args.heads, args.segment, args.head_dim)
    q, k = (l2_normalise(torch.randn(shape, generator=gen)).to(dev) for _ in range(2))
    v = torch.randn(shape, generator=gen).to(dev)
    g = (-0.1 * torch.rand(shape[:-1], generator=gen)).to(dev) if gated else torch.zeros(shape[:-1], device=dev)
    beta = torch.rand(shape[:-1], generator=gen).to(dev)
    s0 = (0.1 * torch.randn(args.batch, args.heads, args.head_dim, args.head_dim, generator=gen)).to(dev)
    leaves = [t.requires_grad_(train) for t in (q, k, v, g, beta, s0)]
    reset = torch.zeros(args.batch, args.segments, dtype=torch.bool, device=dev)
    reset[-1, min(2, args.segments - 1)] = True
    forms = {"torch": functools.partial(delta_rule_chunkwise, chunk_size=64),
             "fla": functools.partial(fla_kernels.delta_rule_fla, fla.gated, True)}  # fp32: the gated kernel

    def step(form):
        def run():
            with torch.set_grad_enabled(train):
                o, s = form(*leaves, reset)
                if train:
                    torch.autograd.grad(o.square().sum() + s.square().sum(), leaves)
            return o
        return run

    return {name: step(form) for name, form in forms.items()}


def layer_paths(args, gated: bool, train: bool):
    """(kernel=torch step, kernel=fla step) of the whole layer memory, same weights."""
    d_model = args.heads * args.head_dim
    model_cfg = ModelConfig(d_model=d_model, n_heads=args.heads, n_layers=1, segment_len=args.segment)
    dev = args.device
    mems = {}
    for kernel in ("torch", "fla"):
        torch.manual_seed(0)
        mems[kernel] = GatedDeltaNet(GatedDeltaNetConfig(gated=gated, kernel=kernel), model_cfg, 0).to(dev)
    gen = torch.Generator().manual_seed(1)
    h = torch.randn(args.batch, args.segments, args.segment, d_model, generator=gen).to(dev).requires_grad_(train)
    qkv = [(0.3 * torch.randn(args.batch, args.segments, args.heads, args.segment, args.head_dim, generator=gen))
           .to(dev).requires_grad_(train) for _ in range(3)]
    reset = torch.zeros(args.batch, args.segments, dtype=torch.bool, device=dev)
    reset[-1, min(2, args.segments - 1)] = True
    attend = LocalAttention(10000.0)

    def step(mem: GatedDeltaNet):
        def run():
            with torch.set_grad_enabled(train):
                x = LayerInputs(h, *qkv, reset, attend, project_kv=lambda t: (t, t))
                out, state, _ = mem(x, mem.initial_state(args.batch, dev))
                if train:
                    torch.autograd.grad(out.square().sum() + state["S"].square().sum(), [h, *qkv, *mem.parameters()])
            return out
        return run

    return {kernel: step(mem) for kernel, mem in mems.items()}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--segments", type=int, default=4)
    ap.add_argument("--segment", type=int, default=512)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default="results/gpu")
    args = ap.parse_args(argv)
    args.device = torch.device("cuda")
    if not torch.cuda.is_available():
        print("benchmarks/gpu/fla_speed.py: no CUDA device here, nothing measured")
        return
    fla = fla_kernels.load_fla()
    if isinstance(fla, str):
        print(f"benchmarks/gpu/fla_speed.py: fla does not import ({fla}), nothing measured")
        return
    device = torch.cuda.get_device_name(args.device)
    print(f"{device}, fla kernels with Triton {fla.triton}, torch {torch.__version__}: batch {args.batch}, "
          f"{args.segments} segments of {args.segment}, {args.heads} heads of {args.head_dim}", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "fla_speed.csv"
    new = not path.exists()
    with open(path, "a", newline="") as f:
        writer = None
        for gated in (True, False):
            for train in (False, True):
                for what in ("recurrence", "layer"):
                    label = f"{fla_kernels.method_name(gated):14s} {what:10s} {'fwd+bwd' if train else 'forward'}"
                    try:
                        paths = recurrence_paths(args, gated, fla, train) if what == "recurrence" else layer_paths(args, gated, train)
                        outs = {name: run() for name, run in paths.items()}  # warm-up (Triton compiles), untimed
                        times: dict[str, list[float]] = {name: [] for name in paths}
                        for _ in range(args.rounds):
                            for name, run in paths.items():
                                times[name].append(timed(run, args.device))
                    except Exception as err:  # fla refused or failed here: say why, measure the rest
                        print(f"{label}: skipped ({type(err).__name__}: {str(err).strip().splitlines()[0][:200]})", flush=True)
                        continue
                    med = {name: statistics.median(t) for name, t in times.items()}
                    diff = ((outs["fla"].float() - outs["torch"].float()).norm() / outs["torch"].float().norm()).item()
                    print(f"{label}: torch {med['torch'] * 1e3:8.2f} ms, fla {med['fla'] * 1e3:8.2f} ms, "
                          f"speed-up {med['torch'] / med['fla']:5.1f}x, outputs rel. diff {diff:.1e}", flush=True)
                    row = {"when": datetime.now(timezone.utc).isoformat(timespec="seconds"), "device": device,
                           "triton": fla.triton, "method": fla_kernels.method_name(gated), "what": what,
                           "mode": "fwd+bwd" if train else "forward", "batch": args.batch, "segments": args.segments,
                           "segment": args.segment, "heads": args.heads, "head_dim": args.head_dim, "rounds": args.rounds,
                           "torch_median_ms": round(med["torch"] * 1e3, 3), "fla_median_ms": round(med["fla"] * 1e3, 3),
                           "speedup": round(med["torch"] / med["fla"], 2), "out_rel_diff": diff}
                    if writer is None:
                        writer = csv.DictWriter(f, fieldnames=list(row))
                        if new:
                            writer.writeheader()
                    writer.writerow(row)
                    f.flush()
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
