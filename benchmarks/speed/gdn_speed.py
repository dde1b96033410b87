"""Gated DeltaNet's chunkwise (WY/UT) form against the per-token loop, forward + backward, measured
side by side in one run (CPU, or CUDA with --device cuda): the recurrence alone (`delta_rule_chunkwise` vs `delta_rule_loop`)
and the whole layer memory (conv, gates, norm, output gate and the mix with local attention).

    OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/speed/gdn_speed.py [--segment 512] [--heads 4] [--head-dim 32] [--batch 2]
                                                                  [--chunk 64] [--rounds 7] [--device cpu] [--out results/bench]

Defaults are the quick backbone's heads (4 of 32, d_model 128) at a segment of 512 tokens. The two
forms alternate for `rounds` rounds; the ratio printed is median(loop) / median(chunkwise), which a
shared, noisy machine leaves meaningful where absolute times are not. Appends one row per
measurement to gdn_speed.csv.
"""
from __future__ import annotations

import argparse
import csv
import statistics
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from memzoo.core.attention import LocalAttention
from memzoo.core.config import ModelConfig
from memzoo.core.memory import LayerInputs
from memzoo.memories.gated_deltanet import (
    GatedDeltaNet, GatedDeltaNetConfig, delta_rule_chunkwise, delta_rule_loop, l2_normalise,
)


def timed(fn, device: torch.device) -> float:
    """Wall seconds of fn() (on CUDA, synchronised before and after: its kernels run asynchronously)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def recurrence_steps(args):
    """Forward + backward of the recurrence alone, both forms, on the same inputs."""
    g, dev = torch.Generator().manual_seed(0), args.device
    shape = (args.batch, 1, args.heads, args.segment, args.head_dim)
    q = l2_normalise(torch.randn(shape, generator=g)).to(dev).requires_grad_()
    k = l2_normalise(torch.randn(shape, generator=g)).to(dev).requires_grad_()
    v = torch.randn(shape, generator=g).to(dev).requires_grad_()
    log_alpha = (-torch.rand(shape[:-1], generator=g)).to(dev).requires_grad_()
    beta = torch.rand(shape[:-1], generator=g).to(dev).requires_grad_()
    s0 = torch.zeros(args.batch, args.heads, args.head_dim, args.head_dim, device=dev)
    reset = torch.zeros(args.batch, 1, dtype=torch.bool, device=dev)
    leaves = (q, k, v, log_alpha, beta)

    def step(chunkwise: bool):
        def run():
            if chunkwise:
                o, s = delta_rule_chunkwise(q, k, v, log_alpha, beta, s0, reset, args.chunk)
            else:
                o, s = delta_rule_loop(q, k, v, log_alpha, beta, s0, reset)
            torch.autograd.grad(o.square().sum() + s.square().sum(), leaves)
        return run

    return step(True), step(False)


def layer_steps(args):
    """Forward + backward of the whole layer memory (chunkwise=True vs False, same weights)."""
    d_model = args.heads * args.head_dim
    model_cfg = ModelConfig(d_model=d_model, n_heads=args.heads, n_layers=1, segment_len=args.segment)
    torch.manual_seed(0)
    dev = args.device
    fast = GatedDeltaNet(GatedDeltaNetConfig(chunk_size=args.chunk), model_cfg, 0).to(dev)
    slow = GatedDeltaNet(GatedDeltaNetConfig(chunkwise=False), model_cfg, 0).to(dev)
    slow.load_state_dict(fast.state_dict())
    g = torch.Generator().manual_seed(1)
    h = torch.randn(args.batch, 1, args.segment, d_model, generator=g).to(dev).requires_grad_()
    q, k, v = (0.3 * torch.randn(args.batch, 1, args.heads, args.segment, args.head_dim, generator=g) for _ in range(3))
    q, k, v = (t.to(dev).requires_grad_() for t in (q, k, v))
    reset = torch.zeros(args.batch, 1, dtype=torch.bool, device=dev)
    attend = LocalAttention(10000.0)

    def step(mem: GatedDeltaNet):
        def run():
            x = LayerInputs(h, q, k, v, reset, attend, project_kv=lambda t: (t, t))
            out, state, _ = mem(x, mem.initial_state(args.batch, dev))
            torch.autograd.grad(out.square().sum() + state["S"].square().sum(), [h, q, k, v, *mem.parameters()])
        return run

    return step(fast), step(slow)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--segment", type=int, default=512)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=32)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--chunk", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--device", default="cpu", help="cpu or cuda (CUDA timings synchronise around each step)")
    ap.add_argument("--out", default="results/bench")
    args = ap.parse_args()
    args.device = torch.device(args.device)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "gdn_speed.csv"
    fields = ["when", "device", "what", "segment", "heads", "head_dim", "batch", "chunk", "rounds", "threads",
              "chunkwise_median_s", "loop_median_s", "ratio"]
    new = not path.exists()
    with open(path, "a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        if new:
            writer.writeheader()
        for what, (fast, slow) in (("recurrence", recurrence_steps(args)), ("layer", layer_steps(args))):
            fast(), slow()  # warm-up, untimed
            t_fast, t_slow = [], []
            for _ in range(args.rounds):  # alternate, so both see the same load on a shared machine
                t_fast.append(timed(fast, args.device))
                t_slow.append(timed(slow, args.device))
            med_fast, med_slow = statistics.median(t_fast), statistics.median(t_slow)
            ratio = med_slow / med_fast
            print(f"{what:10s} segment {args.segment}, {args.heads} heads of {args.head_dim}, batch {args.batch}, chunk {args.chunk}: "
                  f"chunkwise {med_fast:.4f} s, per-token loop {med_slow:.4f} s (medians of {args.rounds}), "
                  f"ratio {ratio:.1f}x", flush=True)
            writer.writerow({"when": datetime.now(timezone.utc).isoformat(timespec="seconds"), "what": what,
                             "device": torch.cuda.get_device_name() if args.device.type == "cuda" else "cpu",
                             "segment": args.segment, "heads": args.heads, "head_dim": args.head_dim,
                             "batch": args.batch, "chunk": args.chunk, "rounds": args.rounds,
                             "threads": torch.get_num_threads(), "chunkwise_median_s": round(med_fast, 5),
                             "loop_median_s": round(med_slow, 5), "ratio": round(ratio, 2)})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
