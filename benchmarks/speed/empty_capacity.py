"""Does empty memory capacity cost time? Training-step time of a big and a small capacity side by side,
while fewer slots are filled than the small one holds, so both give the same outputs.

    python benchmarks/speed/empty_capacity.py [--steps 5] [--threads 1] [--d-model 64] [--out results/bench] [--tag after]

Pairs (the rest of memzoo/configs/small.yaml with d_model 64, as in the empty-capacity probe):
* memorizing: store_size 65,536 (the default) against 1,024, every other option at its default;
* compressive: the defaults (mem_len 2,048, cmem_len 2,048) against mem_len 1,024, cmem_len 1,024;
* xl: the default mem_len 2,048 against 1,024.
A window is 8 segments of 128 bytes from a fresh state, so at most 896 slots are filled when a
segment reads. The two models of a pair share their weights and batch; their steps alternate
(big, small, big, ...) after one warm-up each, and the median step time of each is reported with
big / small. The summed loss of the two must agree (same outputs). Writes empty_capacity[-TAG].csv.
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import pandas as pd
import torch

from memzoo.data.corpus import load_documents, split_documents
from memzoo.data.samplers import WindowSampler
from memzoo.runs.configure import build_model, load_config
from memzoo.training.train import train_window

PAIRS = {  # method: (big overrides, small overrides)
    "memorizing": (["memory.store_size=65536"], ["memory.store_size=1024"]),
    "compressive": (["memory.mem_len=2048", "memory.cmem_len=2048"], ["memory.mem_len=1024", "memory.cmem_len=1024"]),
    "xl": (["memory.mem_len=2048"], ["memory.mem_len=1024"]),
}


def timed_step(model, batch, bptt: int) -> tuple[float, float]:
    """Seconds for one forward+backward window, and its summed loss (nats)."""
    start = time.perf_counter()
    res = train_window(model, batch, bptt)
    seconds = time.perf_counter() - start
    model.zero_grad(set_to_none=True)
    return seconds, res.nll_sum


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--methods", default=",".join(PAIRS))
    ap.add_argument("--out", default="results/bench")
    ap.add_argument("--tag", default="")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    rows = []
    for method in args.methods.split(","):
        models, cfgs = {}, {}
        for size, overrides in zip(("big", "small"), PAIRS[method]):
            cfg = load_config("small", [f"memory.name={method}", f"model.d_model={args.d_model}", *overrides])
            torch.manual_seed(0)
            models[size], cfgs[size] = build_model(cfg).train(), cfg
        models["small"].load_state_dict(models["big"].state_dict())
        cfg = cfgs["big"]
        cfg.data.max_docs = 200
        docs = split_documents(load_documents(cfg.data), cfg.data)["train"]
        tc, m = cfg.train, cfg.model
        batch = WindowSampler(docs, m.segment_len, 0).sample(0, tc.batch_size, tc.window_segments)
        times: dict[str, list[float]] = {"big": [], "small": []}
        losses = {size: timed_step(models[size], batch, tc.bptt_segments)[1] for size in times}  # warm-up
        for _ in range(args.steps):
            for size in times:
                times[size].append(timed_step(models[size], batch, tc.bptt_segments)[0])
        med = {size: statistics.median(t) for size, t in times.items()}
        row = {"method": method, "big": " ".join(PAIRS[method][0]), "small": " ".join(PAIRS[method][1]),
               "big_step_s": med["big"], "small_step_s": med["small"], "ratio": med["big"] / med["small"],
               "loss_big": losses["big"], "loss_small": losses["small"], "steps": args.steps,
               "threads": args.threads, "d_model": args.d_model, "tag": args.tag}
        rows.append(row)
        print(f"{method:12s} big {med['big']:7.3f} s/step  small {med['small']:7.3f} s/step  "
              f"big/small {row['ratio']:5.2f}x  loss {losses['big']:.6f} vs {losses['small']:.6f}", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / (f"empty_capacity-{args.tag}.csv" if args.tag else "empty_capacity.csv")
    pd.DataFrame(rows).to_csv(path, index=False)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
