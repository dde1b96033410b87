"""What four times the fine-tuning steps change, run for run: a pilot of a window suite at 400 steps (one seed,
its own folder) against the suite's shipped rows at 100 steps, the same seed. For each variant in both: bits
per byte on segment 0, on segments >= 1 and on beyond-window copyable bytes, each less its own floor; what
the memory buys (segments >= 1 with the memory forgotten before each segment, minus with it); and the headroom
it recovers, (variant - floor) / (full - floor) on segments >= 1. One seed: differences, not intervals.

    memzoo compare lm-window-conv6 "methods=[local,infini-delta,rmt,gated-deltanet,full,xl]" "grid.xl.mem_len=[128]" \\
        "seeds=[0]" token_budget=3276800 name=lm-window-conv6-ft400 out_dir=/work/conv/pilot --jobs 2
    python experiments/window/finetune_steps.py /work/conv/pilot/lm-window-conv6-ft400/results.parquet \\
        [--suite lm-window-conv6] [--seed 0] [--out FILE.json]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from memzoo.analysis.beyond_window import seed_gains
from memzoo.analysis.bpb import CEILING, bpb_over
from memzoo.analysis.stats import REFERENCE
from memzoo.publishing.references import load_references

COLUMN_RESET = "valid_bpb_by_segment_reset"


def per_variant(rows: pd.DataFrame, seed: int) -> dict[str, dict[str, float]]:
    """Run name less its seed -> its numbers, each against the same seed's floor, and its headroom."""
    g = seed_gains(rows[rows["seed"] == seed])
    floor, full = g[g["method"] == REFERENCE].iloc[0], g[g["method"] == CEILING].iloc[0]
    out = {}
    for _, r in g.iterrows():
        buys = bpb_over(r, 1, column=COLUMN_RESET) - bpb_over(r, 1)  # the memory ablation, as the suite's
        name = str(r["name"]).rsplit("-s", 1)[0]  # the run's name less its seed: labels drop one-valued grid options
        out[name] = {"after": round(float(r["after"]), 4), "seg0_vs_floor": round(float(r["first"] - floor["first"]), 4),
                     "after_vs_floor": round(float(r["after"] - floor["after"]), 4),
                     "beyond_vs_floor": round(float(r["beyond"] - floor["beyond"]), 4),
                     "memory_buys": round(float(buys), 4),
                     "headroom": round(float((r["after"] - floor["after"]) / (full["after"] - floor["after"])), 3)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("pilot", type=Path, help="the pilot's results.parquet")
    ap.add_argument("--suite", default="lm-window-conv6", help="the shipped suite it lengthens")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, help="write the numbers as JSON here")
    args = ap.parse_args()
    shipped, pilot = per_variant(load_references(args.suite), args.seed), per_variant(pd.read_parquet(args.pilot), args.seed)
    result = {"suite": args.suite, "seed": args.seed, "variants": {v: {"steps_100": shipped[v], "steps_400": pilot[v]}
                                                                    for v in pilot if v in shipped}}
    for v, both in result["variants"].items():
        print(f"{v:>29}: " + "  ".join(f"{q} {both['steps_100'][q]:+.3f} -> {both['steps_400'][q]:+.3f}"
                                       for q in ("after", "seg0_vs_floor", "after_vs_floor", "beyond_vs_floor", "memory_buys", "headroom")))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
