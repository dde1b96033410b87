"""CPU cost of a distance suite, estimated from a few steps: per run, the training steps of every
curriculum stage it trains (memzoo.training.curriculum, reach included) times that stage's measured
CPU seconds per step, and the streamed evaluation (one stream to the longest gap, both arms)
extrapolated from a stream to a shorter gap.

    python benchmarks/speed/distance_cost.py [--suite distance] [--steps 4] [--methods xl,rmt] [--out results/bench]

CPU seconds are this process's (time.process_time, one thread), so a busy machine slows the
measurement less than a wall clock would; --calibrate also times capacity-top's stage (gap 1), whose
measured cost on the 2-core machine is 217 CPU-s a run of 5,000 steps (README), and scales by the
ratio. `full` streams a cache of everything before it: its evaluation grows with the square of the
gap, so it is measured at two gaps and extrapolated, capped at the suite's time limit.
Writes distance_cost.csv (one row per method) and prints the table and the suite's total.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Optional

import pandas as pd
import torch

from memzoo.data.tasks import TaskSampler
from memzoo.runs.configure import build_model
from memzoo.evaluations.distance import DistanceConfig, stream_gaps
from memzoo.evaluations.harness import Meter
from memzoo.evaluations.recall_stream import training_layout
from memzoo.training.train import build_optimizer, train_window
from memzoo.suites.compare import expand, load_suite, longrange_configs

CAPACITY_TOP_CPU_S = 217.0  # a capacity-top run (5,000 steps at gap 1), measured on the 2-core machine (README)


def step_cpu_s(cfg, steps: int) -> float:
    """CPU seconds per training step of run config `cfg` (its task, batch and BPTT), after one warm-up."""
    torch.manual_seed(0)
    model = build_model(cfg).train()
    opt = build_optimizer(model, cfg.train)
    sampler = TaskSampler(cfg.task, cfg.model.segment_len, 0)
    times = []
    for i in range(steps + 1):
        batch = sampler.sample(i, cfg.train.batch_size)
        start = time.process_time()
        train_window(model, batch, cfg.train.bptt_segments, align_end=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i:
            times.append(time.process_time() - start)
    return sorted(times)[len(times) // 2]  # the median: robust to one slow step


def eval_cpu_s(cfg, evaluation: DistanceConfig, gap: int) -> float:
    """CPU seconds of one gap of the distance evaluation (both arms), on an untrained model."""
    model = build_model(cfg).eval()
    probe = DistanceConfig(gaps=[gap], trials=evaluation.trials, reset=evaluation.reset,
                           segments_per_call=evaluation.segments_per_call, time_limit_s=None)
    start = time.process_time()
    for _ in stream_gaps(model, [gap], probe, training_layout(cfg.task), Meter(probe)):
        pass
    return time.process_time() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", default="distance")
    ap.add_argument("--steps", type=int, default=4, help="timed steps per stage (after one warm-up)")
    ap.add_argument("--methods", default=None, help="comma-separated; default the suite's")
    ap.add_argument("--probe-gap", type=int, default=64, help="the gap timed for the evaluation (full: and 4x it)")
    ap.add_argument("--calibrate", action="store_true", help="scale by capacity-top's measured 217 CPU-s a run")
    ap.add_argument("--out", default="results/bench")
    args = ap.parse_args()
    torch.set_num_threads(1)

    overrides = ["seeds=[0]"] + ([f"methods=[{args.methods}]"] if args.methods else [])
    suite = load_suite(args.suite, overrides)
    seeds = len(load_suite(args.suite).seeds)
    (evaluation,) = [c for c in longrange_configs(suite) if c.task == "distance"]
    rows = []
    for spec in expand(suite):
        train = sum(int(c.train.steps) * step_cpu_s(c, args.steps) for c in spec.chain)
        g1, longest = args.probe_gap, max(evaluation.gaps)
        c1 = eval_cpu_s(spec.cfg, evaluation, g1)
        if spec.method == "full":  # a cache of everything: a segment costs more the further it is: a g + b g^2
            c4 = eval_cpu_s(spec.cfg, evaluation, 4 * g1)
            b = max(0.0, (c4 - 4 * c1) / (12 * g1 * g1))
            cost = min((c1 - b * g1 * g1) / g1 * longest + b * longest * longest, evaluation.time_limit_s or float("inf"))
        else:  # a bounded state: one stream to the longest gap, linear in its segments
            rewrites = int(spec.cfg.task.rewrites)
            cost = c1 * (rewrites + longest + 1) / (rewrites + g1 + 1)
        rows.append({"method": spec.method, "run": spec.name, "stages": len(spec.chain),
                     "steps": sum(int(c.train.steps) for c in spec.chain), "train_cpu_s": train,
                     "eval_cpu_s": cost})
        print(f"{spec.name:48s} {rows[-1]['stages']} stages {rows[-1]['steps']:>6,} steps  train {train:7.0f} CPU-s  "
              f"eval {cost:6.0f} CPU-s", flush=True)
    table = pd.DataFrame(rows)
    scale: Optional[float] = None
    if args.calibrate:
        first_eight = "full,local,xl,memorizing,compressive,infini-delta,rmt,infty-former"  # the 217 CPU-s runs
        top = expand(load_suite("capacity-top", ["seeds=[0]", f"methods=[{first_eight}]"]))
        here = sum(int(s.cfg.train.steps) * step_cpu_s(s.cfg, args.steps) for s in top) / len(top)
        scale = CAPACITY_TOP_CPU_S / here
        print(f"capacity-top here: {here:.0f} CPU-s a run against 217 measured: scale {scale:.2f}")
        table[["train_cpu_s", "eval_cpu_s"]] *= scale
    table["run_cpu_s"] = table["train_cpu_s"] + table["eval_cpu_s"]
    total = table["run_cpu_s"].sum() * seeds
    print(table.to_string(index=False))
    print(f"{args.suite}: {len(table) * seeds} runs, {total / 3600:.1f} CPU-hours; on 2 cores (2 jobs) about "
          f"{total / 2 / 3600:.1f} hours wall if the runs pack evenly")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    table.assign(seeds=seeds, scale=scale).to_csv(out / f"{args.suite}_cost.csv", index=False)


if __name__ == "__main__":
    main()
