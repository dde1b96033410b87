"""Streaming cost against length: peak resident memory and tokens per second for every method
at 32K and 1M bytes (and any other lengths), each length in a fresh process. The targets: for the
bounded memories (Infini, RMT, the ∞-former, ...) the peak at 1M is within 10% of the peak at 32K,
and the time per token does not grow with length.

    python benchmarks/speed/streaming.py                                  # untrained models, every method
    python benchmarks/speed/streaming.py --results results/longrange      # summarise a longrange suite

Without --results it builds each method at its preset with untrained weights (cost does not
depend on the weights), streams one passkey prompt per length through `memzoo.evaluations.longrange`, and
writes results/bench/streaming.csv (long rows) and streaming_targets.csv (one row per method).
"""
from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd
import torch

from memzoo.analysis import length_cost_table, load_results, longrange_table
from memzoo.core.config import ConfigError, to_yaml
from memzoo.core.plugins import registered
from memzoo.runs.configure import build_model, load_config
from memzoo.evaluations.longrange import evaluate_longrange
from memzoo.evaluations.passkey_recall import LongRangeConfig


def untrained_run(method: str, root: Path) -> Path:
    """A run folder holding the method's preset config and its freshly initialised weights."""
    try:
        cfg = load_config(f"presets/{method}")
    except ConfigError:
        cfg = load_config("small", [f"memory.name={method}"])
    cfg.name = method
    run = root / method
    run.mkdir(parents=True, exist_ok=True)
    (run / "config.yaml").write_text(to_yaml(cfg))
    torch.manual_seed(cfg.seed)
    torch.save({"model": build_model(cfg).state_dict()}, run / "checkpoint.pt")
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", default=None, help="a suite folder with passkey rows (skip measuring)")
    ap.add_argument("--methods", default=None, help="comma-separated (default: every registered method)")
    ap.add_argument("--lengths", default="32768,1048576")
    ap.add_argument("--time-limit", type=float, default=900.0)
    ap.add_argument("--depths", default="0.5", help="key depths; all of one length stream as one batch")
    ap.add_argument("--threads", type=int, default=0, help="torch threads per length worker (0: default)")
    ap.add_argument("--out", default="results/bench")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lengths = [int(x) for x in args.lengths.split(",")]

    if args.results:
        df = load_results(Path(args.results) / "results.parquet")
    else:
        rows = []
        for method in args.methods.split(",") if args.methods else registered():
            run = untrained_run(method, out / "streaming-runs")
            cfg = LongRangeConfig(lengths=lengths, depths=[float(d) for d in args.depths.split(",")], trials=1,
                                  time_limit_s=args.time_limit, threads=args.threads)
            print(f"{method}: streaming {', '.join(f'{n:,}' for n in lengths)} bytes", flush=True)
            rows.append({"method": method, "seed": 0, "passkey": evaluate_longrange(run, cfg, resume=True, progress=True)})
        df = pd.DataFrame(rows)
    longrange_table(df).to_csv(out / "streaming.csv", index=False)
    short, long = min(lengths), max(lengths)
    targets = length_cost_table(df, short=short, long=long)
    targets.to_csv(out / "streaming_targets.csv", index=False)
    pd.set_option("display.width", 200)
    print(targets.to_string(index=False, float_format=lambda v: f"{v:,.3f}" if abs(v) < 10 else f"{v:,.0f}"))
    print(f"wrote {out / 'streaming.csv'} and {out / 'streaming_targets.csv'}")


if __name__ == "__main__":
    main()
