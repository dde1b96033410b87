"""Training-step throughput of every registered method at a preset's backbone, with model FLOP/s
and utilisation against a stated ceiling (fp32 matmul on this machine: about 200 GFLOP/s).

    python benchmarks/speed/step_time.py [--preset small] [--steps 3] [--ceiling-gflops 200] [--out results/bench]

Writes step_time.csv (one row per method) and prints the table. Model FLOPs per token are
6 × parameters (forward + backward of the matrices) plus the local attention's 12 × n_layers × N × d_model / 2
(causal); memory reads are not counted, so methods with heavier memories show lower utilisation.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import pandas as pd
import torch

from memzoo.core.config import ConfigError
from memzoo.core.plugins import registered
from memzoo.data.corpus import load_documents, split_documents
from memzoo.data.samplers import WindowSampler
from memzoo.runs.configure import build_model, load_config
from memzoo.training.train import train_window


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="small")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--ceiling-gflops", type=float, default=200.0)
    ap.add_argument("--out", default="results/bench")
    args = ap.parse_args()

    rows = []
    for method in registered():
        try:  # the method's own preset when it ships one, else the shared one with its defaults
            cfg = load_config(f"presets/{method}")
        except ConfigError:
            cfg = load_config(args.preset, [f"memory.name={method}"])
        cfg.data.max_docs = 200
        docs = split_documents(load_documents(cfg.data), cfg.data)["train"]
        tc, m = cfg.train, cfg.model
        batch = WindowSampler(docs, m.segment_len, 0).sample(0, tc.batch_size, tc.window_segments)
        torch.manual_seed(0)
        model = build_model(cfg).train()
        train_window(model, batch, tc.bptt_segments)  # warm-up
        start = time.perf_counter()
        for _ in range(args.steps):
            train_window(model, batch, tc.bptt_segments)
            model.zero_grad(set_to_none=True)
        step = (time.perf_counter() - start) / args.steps
        tokens = tc.batch_size * tc.window_segments * m.segment_len
        flops_per_token = 6 * model.num_parameters() + 6 * m.n_layers * m.segment_len * m.d_model
        gflops = flops_per_token * tokens / step / 1e9
        rows.append({"method": method, "params": model.num_parameters(), "step_s": step, "tokens_per_s": tokens / step,
                     "model_gflops": gflops, "utilisation": gflops / args.ceiling_gflops,
                     "threads": torch.get_num_threads()})
        print(f"{method:14s} {rows[-1]['params']:>9,} params  {step:6.3f} s/step  {tokens / step:8,.0f} tok/s  "
              f"{gflops:5.1f} GFLOP/s  {gflops / args.ceiling_gflops:5.1%} of {args.ceiling_gflops:.0f}", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(out / "step_time.csv", index=False)
    print(f"wrote {out / 'step_time.csv'}")


if __name__ == "__main__":
    main()
