"""CPU training throughput of memzoo's Infini-attention against the public port
(lucidrains' infini-transformer-pytorch 0.2.1) at the port's configuration: dim 256, depth 4,
4 heads of 64, segments of 256, batch 4 x 2,048 bytes, AdamW, memory detached every 2 segments,
fp32 (or bf16 autocast on both sides with --precision bf16: worth it only on a CPU with bf16 units).

    python benchmarks/peers/peer.py [--rule delta|linear] [--precision fp32|bf16] [--rounds 3] [--steps 5] [--threads 2] [--out results/bench]
    python benchmarks/peers/peer.py --profile memzoo [--threads 1]    # where one memzoo step spends its time
    python benchmarks/peers/peer.py --breakdown [--steps 4]           # both sides: matmuls, attention, the rest

Each side runs in its own process, one after the other, for several rounds (the order alternates
per round, so background load hits both alike); each process warms up, then times `--steps`
optimiser steps. memzoo's step is `memzoo train`'s own: `train_window` over the window with
`bptt_segments=2`, gradient clipping, the AdamW of `build_optimizer`. The port's step is its
wrapper's `forward(backward=True)` (backward every 2 segments, memory detached there), gradient
clipping and `torch.optim.AdamW`, as in its train.py. Prints each side's tokens/s (min, median,
max over every timed step) and last `ratio X.XX` (memzoo's median over the port's); writes peer.csv.
Without the port installed only memzoo runs and the ratio is nan.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import torch

# The port's configuration (the table of the port's settings): model, segment, batch and truncation.
DIM, DEPTH, HEADS, DIM_HEAD = 256, 4, 4, 64
SEGMENT, BATCH, LENGTH, DETACH_EVERY = 256, 4, 2048, 2
SIDES = ("memzoo", "port")


def port_installed() -> bool:
    try:
        import infini_transformer_pytorch  # noqa: F401
    except ImportError:
        return False
    return True


PRECISIONS = ("fp32", "bf16")  # both sides run at the one chosen


def memzoo_config(rule: str, threads: int, overrides: list[str] | None = None, precision: str = "fp32"):
    """The `memzoo train` config at the port's configuration (CPU; fp32 unless `precision` says bf16)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r}; expected one of {PRECISIONS}")
    from memzoo.runs.configure import load_config

    return load_config("small", [
        f"memory.name=infini-{rule}", f"model.d_model={DIM}", f"model.n_layers={DEPTH}", f"model.n_heads={HEADS}",
        f"model.segment_len={SEGMENT}", f"train.batch_size={BATCH}", f"train.window_segments={LENGTH // SEGMENT}",
        f"train.bptt_segments={DETACH_EVERY}", f"train.threads={threads}", f"train.precision={precision}", "train.device=cpu",
        "data.max_docs=200", *(overrides or []),
    ])


def memzoo_step(rule: str, threads: int, overrides: list[str] | None = None,
                precision: str = "fp32") -> tuple[Callable[[], None], torch.nn.Module]:
    """`memzoo train`'s first optimiser step (its batch, learning rate, train_window under
    train.precision, clipping and AdamW), as a closure that repeats it, and the model it trains."""
    from memzoo.runs.configure import build_model
    from memzoo.training.train import batch_source, build_optimizer, lr_at, train_window

    cfg = memzoo_config(rule, threads, overrides, precision)
    tc = cfg.train
    torch.manual_seed(cfg.seed)
    model = build_model(cfg).train()
    optimizer = build_optimizer(model, tc)
    for group in optimizer.param_groups:
        group["lr"] = lr_at(0, tc) * group.get("lr_mult", 1.0)
    batch = batch_source(cfg)(0)

    def step() -> None:
        train_window(model, batch, tc.bptt_segments, tc.aux_loss_weight, tc.precision,
                     state=model.initial_state(batch.tokens.shape[0], batch.tokens.device))
        torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step, model


def autocast(precision: str):
    """The port's forward and backward under the precision memzoo's side trains in: bf16 autocast
    on the CPU (as memzoo.core.precision.autocast_context gives memzoo), or nothing for fp32."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r}; expected one of {PRECISIONS}")
    return torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16" else contextlib.nullcontext()


def port_step(rule: str, threads: int, precision: str = "fp32") -> Callable[[], None]:
    """One step of the port as its train.py takes it (wrapper backward under `autocast(precision)`,
    clipping, AdamW), as a closure."""
    from infini_transformer_pytorch import InfiniTransformer, InfiniTransformerWrapper

    from memzoo.training.train import batch_source

    cfg = memzoo_config(rule, threads, precision=precision)  # the same bytes and optimiser settings
    tc = cfg.train
    torch.manual_seed(cfg.seed)
    model = InfiniTransformer(num_tokens=256, dim=DIM, depth=DEPTH, dim_head=DIM_HEAD, heads=HEADS,
                              use_mem_delta_rule=rule == "delta")
    wrapper = InfiniTransformerWrapper(model, segment_length=SEGMENT, detach_mems_every_num_segments=DETACH_EVERY).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=tc.lr, betas=tuple(tc.betas), weight_decay=tc.weight_decay)
    batch = batch_source(cfg)(0)  # the bytes memzoo trains on
    b = batch.tokens.shape[0]
    seq = torch.cat((batch.tokens.reshape(b, -1), batch.targets.reshape(b, -1)[:, -1:]), dim=1)  # [B, LENGTH + 1]

    def step() -> None:
        with autocast(precision):
            wrapper(seq, backward=True)
        torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def make_step(side: str, rule: str, threads: int, overrides: list[str] | None = None,
              precision: str = "fp32") -> Callable[[], None]:
    if side == "memzoo":
        return memzoo_step(rule, threads, overrides, precision)[0]
    if side == "port":
        return port_step(rule, threads, precision)
    raise ValueError(f"side={side!r}; expected one of {SIDES}")


def worker(side: str, rule: str, steps: int, warmup: int, threads: int, overrides: list[str],
           precision: str = "fp32") -> None:
    """Child process: warm up, time `steps` steps, print their seconds as one JSON line."""
    torch.set_num_threads(threads)
    step = make_step(side, rule, threads, overrides, precision)
    for _ in range(warmup):
        step()
    seconds = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        seconds.append(time.perf_counter() - start)
    print(json.dumps({"side": side, "seconds": seconds}))


def profile(side: str, rule: str, steps: int, threads: int, overrides: list[str], rows: int,
            precision: str = "fp32") -> None:
    """torch.profiler over `steps` steps after one warm-up: the ops by self CPU time."""
    from torch.profiler import ProfilerActivity, profile as torch_profile

    torch.set_num_threads(threads)
    step = make_step(side, rule, threads, overrides, precision)
    step()
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows))


def matmul_flops(name: str, shapes: list[list[int]]) -> int:
    """FLOPs of one aten::mm / addmm / bmm call from its recorded input shapes."""
    a, b = [s for s in shapes if len(s) >= 2][-2:]
    if name == "aten::bmm":
        return 2 * a[0] * a[1] * a[2] * b[2]  # [G, M, K] @ [G, K, N]
    return 2 * a[0] * a[1] * b[1]  # [M, K] @ [K, N]


def breakdown(rule: str, steps: int, threads: int, overrides: list[str], precision: str = "fp32") -> None:
    """Both sides in this process, steps alternating, profiled: each step's self CPU time split into
    matrix products (mm/addmm: the parameter matmuls; bmm), softmax attention (SDPA) and the rest,
    with the matmuls' GFLOP and GFLOP/s; then the ratio memzoo would reach with no time outside them."""
    from torch.profiler import ProfilerActivity, profile as torch_profile

    torch.set_num_threads(threads)
    steps_of = {side: make_step(side, rule, threads, overrides, precision) for side in SIDES}
    for step in steps_of.values():
        step()
    parts = {side: dict.fromkeys(("total", "mm", "mm_flop", "bmm", "bmm_flop", "sdpa"), 0.0) for side in SIDES}
    for i in range(steps):
        for side in SIDES if i % 2 == 0 else SIDES[::-1]:
            with torch_profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
                steps_of[side]()
            acc = parts[side]
            for event in prof.key_averages(group_by_input_shape=True):
                seconds = event.self_cpu_time_total / 1e6
                acc["total"] += seconds / steps
                if event.key in ("aten::mm", "aten::addmm", "aten::bmm"):
                    kind = "bmm" if event.key == "aten::bmm" else "mm"
                    acc[kind] += seconds / steps
                    acc[f"{kind}_flop"] += matmul_flops(event.key, event.input_shapes) * event.count / steps
                elif "scaled_dot_product" in event.key:
                    acc["sdpa"] += seconds / steps
    for side, acc in parts.items():
        rest = acc["total"] - acc["mm"] - acc["bmm"] - acc["sdpa"]
        print(f"{side:6s} {acc['total']:.3f} s/step (profiled, {threads} threads): "
              f"mm/addmm {acc['mm']:.3f} s ({acc['mm'] / acc['total']:.0%}, {acc['mm_flop'] / 1e9:.1f} GFLOP, "
              f"{acc['mm_flop'] / acc['mm'] / 1e9:.1f} GFLOP/s), bmm {acc['bmm']:.3f} s ({acc['bmm_flop'] / 1e9:.1f} GFLOP), "
              f"SDPA {acc['sdpa']:.3f} s, rest {rest:.3f} s ({rest / acc['total']:.0%})")
    mz, port = parts["memzoo"], parts["port"]
    print(f"ratio now {port['total'] / mz['total']:.2f}; with nothing but memzoo's matmuls and attention "
          f"{port['total'] / (mz['mm'] + mz['bmm'] + mz['sdpa']):.2f}; with nothing but its mm/addmm "
          f"{port['total'] / mz['mm']:.2f}")


def run_side(side: str, args: argparse.Namespace) -> list[float]:
    """One fresh process for one side; returns its timed steps' seconds."""
    cmd = [sys.executable, __file__, "--worker", side, "--rule", args.rule, "--steps", str(args.steps),
           "--warmup", str(args.warmup), "--threads", str(args.threads), "--precision", args.precision,
           *[f"--set={o}" for o in args.set]]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads)}
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])["seconds"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rule", default="delta", choices=("delta", "linear"))
    ap.add_argument("--rounds", type=int, default=3, help="processes per side, alternating")
    ap.add_argument("--steps", type=int, default=5, help="timed steps per process")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps per process first")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--precision", default="fp32", choices=PRECISIONS,
                    help="both sides at this precision: fp32, or bf16 autocast (memory state stays float32 in memzoo)")
    ap.add_argument("--out", default="results/bench")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="an override of memzoo's config (e.g. --set memory.vectorized=false)")
    ap.add_argument("--worker", choices=SIDES, help=argparse.SUPPRESS)
    ap.add_argument("--profile", choices=SIDES, help="profile this side's step in this process instead")
    ap.add_argument("--breakdown", action="store_true",
                    help="both sides in this process, profiled: time in matmuls, attention and the rest")
    ap.add_argument("--rows", type=int, default=30, help="--profile: rows of the table")
    args = ap.parse_args()
    for name in ("rounds", "steps", "threads"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name} must be >= 1; got {getattr(args, name)}")
    if args.warmup < 0:
        raise SystemExit(f"--warmup must be >= 0; got {args.warmup}")
    if args.worker:
        return worker(args.worker, args.rule, args.steps, args.warmup, args.threads, args.set, args.precision)
    if args.profile:
        return profile(args.profile, args.rule, args.steps, args.threads, args.set, args.rows, args.precision)
    if args.breakdown:
        if not port_installed():
            raise SystemExit("--breakdown compares with the port: pip install infini-transformer-pytorch==0.2.1")
        return breakdown(args.rule, args.steps, args.threads, args.set, args.precision)

    sides = list(SIDES) if port_installed() else ["memzoo"]
    if len(sides) == 1:
        print("infini-transformer-pytorch is not installed: memzoo only", flush=True)
    rows = []
    for r in range(args.rounds):
        for side in sides if r % 2 == 0 else sides[::-1]:
            for i, sec in enumerate(run_side(side, args)):
                rows.append({"round": r, "side": side, "rule": args.rule, "precision": args.precision,
                             "threads": args.threads, "step": i,
                             "seconds": sec, "tokens_per_s": BATCH * LENGTH / sec})
            last = [row["tokens_per_s"] for row in rows if row["side"] == side and row["round"] == r]
            print(f"round {r} {side:6s} median {statistics.median(last):8,.0f} tokens/s", flush=True)
    medians = {}
    for side in sides:
        tps = sorted(row["tokens_per_s"] for row in rows if row["side"] == side)
        medians[side] = statistics.median(tps)
        print(f"{side:6s} tokens/s  min {tps[0]:8,.0f}  median {medians[side]:8,.0f}  max {tps[-1]:8,.0f}"
              f"  ({len(tps)} steps, rule {args.rule}, {args.precision}, {args.threads} threads)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    import pandas as pd  # only the parent writes the table

    pd.DataFrame(rows).to_csv(out / "peer.csv", index=False)
    print(f"wrote {out / 'peer.csv'}")
    ratio = medians["memzoo"] / medians["port"] if "port" in medians else float("nan")
    print(f"ratio {ratio:.2f}")


if __name__ == "__main__":
    main()
