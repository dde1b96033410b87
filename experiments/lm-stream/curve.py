"""The full - local curve against fine-tuning steps, from the runs of an `lm-stream` suite.

Every run evaluates every `train.eval_every` steps (evals.jsonl) and at its end (result.json), by
segment index. Per step, per method and per range of segments, this prints the paired difference from
`local` over seeds (95% t interval) and writes curve.csv (and curve.png with --plot):

    python experiments/lm-stream/curve.py results/lm-stream --out experiments/lm-stream/stdlib

At the last step it also prints each method's memory ablation (bits per byte with the state reset
before every segment minus with it, segments >= 1), for the runs evaluated with
`memzoo eval RUN --reset-memory`, and headroom recovered. Where runs were cut off before their end
(a GPU lease), headroom recovered is also given at the last step every run has evaluated
(`--step` picks another), so that methods are compared at equal training (headroom.csv, and
headroom.md beside each method's segment-0 and segments >= 1 differences there).
"""
from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from memzoo.analysis.bpb import headroom_recovered, memory_ablation, range_differences
from memzoo.analysis.results import load_results
from memzoo.publishing.curves import RANGES, common_step, curve_rows, curve_table, step_table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path, help="the suite's folder (holding runs/*/result.json)")
    ap.add_argument("--out", type=Path, help="write curve.csv (and curve.png with --plot) here")
    ap.add_argument("--plot", action="store_true")
    ap.add_argument("--step", type=int, help="headroom recovered at this step (default: the last step every run reached)")
    args = ap.parse_args()
    rows = curve_rows(args.folder)
    table = range_differences(rows, RANGES, keys=("method", "step"))
    text = []
    for method in sorted(set(table["method"]) - {"local"}):
        seeds = int(table[table["method"] == method]["seeds"].max())
        text.append(f"`{method}` − `local`, bits per byte (paired over {seeds} seeds, 95% t interval):\n\n"
                    + curve_table(table, method))
    print("\n" + "\n".join(text))
    final = load_results(args.folder) if any(args.folder.rglob("result.json")) else pd.DataFrame()
    ablation = memory_ablation(final) if not final.empty else pd.DataFrame()
    headroom = headroom_recovered(final) if not final.empty else pd.DataFrame()
    if not ablation.empty:
        print("\nmemory ablation at the last step (reset - read, segments >= 1; positive: the memory helps):\n")
        print(ablation.to_string(index=False, float_format=lambda v: f"{v:+.3f}"))
    if not headroom.empty:
        print("\nheadroom recovered at the last step (segments >= 1):\n")
        print(headroom.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    step = args.step if args.step is not None else common_step(rows)
    at_step = headroom_recovered(rows[rows["step"] == step])
    if not at_step.empty:
        print(f"\nheadroom recovered at step {step}, every run's evaluation there (segments >= 1):\n")
        print(at_step.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        if not at_step.empty:
            at_step.assign(step=step).to_csv(args.out / "headroom.csv", index=False)
            (args.out / "headroom.md").write_text(step_table(table, at_step, step) + "\n")
        table.to_csv(args.out / "curve.csv", index=False)
        (args.out / "curve.md").write_text("\n".join(text))
        if not ablation.empty:
            ablation.to_csv(args.out / "ablation.csv", index=False)
        if args.plot:
            import matplotlib.pyplot as plt

            fig, ax = plt.subplots(figsize=(6, 3.5))
            for (method, rng), sub in table[table["method"] != "local"].groupby(["method", "range"]):
                if rng in ("segment 0", "segments 1-7", "segments 8-31"):
                    ax.errorbar(sub["step"], sub["diff_vs_local"], yerr=sub["ci"], capsize=3, label=f"{method}, {rng}")
            ax.axhline(0, color="grey", lw=0.8)
            ax.set_xlabel("fine-tuning steps from the backbone")
            ax.set_ylabel("bits per byte vs local")
            ax.legend(fontsize=7)
            fig.tight_layout()
            fig.savefig(args.out / "curve.png", dpi=120)
        print(f"\nwrote {args.out / 'curve.csv'}")


if __name__ == "__main__":
    main()
