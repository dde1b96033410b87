"""Where `full`'s segment-0 gap comes from: each control's fine-tuned weights evaluated with the other
control's attention. At segment 0 the window floor and `full` compute the same function of the same
bytes, so a gap there is in the weights; this asks whether `full`'s weights are worse at short context
everywhere (read through the window on every segment) and whether the floor's still read far (read with
full attention), per seed of a window suite's folder.

    python experiments/window/swap_attention.py results/lm-window-rope [--out experiments/window/swap_attention.json]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from memzoo.analysis.results import bpb_over
from memzoo.analysis.stats import paired_t
from memzoo.evaluations.lm import evaluate_run
from memzoo.runs.checkpoints import load_checkpoint, run_config
from memzoo.runs.configure import build_model

CONTROLS = {"local": "full", "full": "local"}  # each control -> the attention its weights are read with


def segment_bpb(res: dict) -> tuple[float, float]:
    """(segment 0, segments >= 1) bits per byte of one evaluation, byte-weighted."""
    return bpb_over(res, 0, 0), bpb_over(res, 1)


def read_with(run_dir: Path, method: str) -> tuple[float, float]:
    """A run's trained weights read with `method`'s attention (the two controls share every parameter)."""
    cfg = run_config(run_dir)
    cfg.memory = {"name": method, **({"max_len": None} if method == "full" else {})}
    model = build_model(cfg)
    model.load_state_dict(load_checkpoint(run_dir, "cpu")["model"])
    model.eval()
    with torch.no_grad():
        return segment_bpb(evaluate_run(cfg, model, progress=False))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("suite_dir", type=Path, help="a window suite's folder (its runs/ holds local-sS and full-sS)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--out", type=Path, default=None, help="write the rows and the paired summary as JSON")
    args = ap.parse_args()
    rows = []
    for seed in args.seeds:
        for weights, attention in [(m, m) for m in CONTROLS] + list(CONTROLS.items()):
            seg0, after = read_with(args.suite_dir / "runs" / f"{weights}-s{seed}", attention)
            rows.append({"seed": seed, "weights": weights, "attention": attention, "seg0": seg0, "after": after})
            print(f"seed {seed}: {weights}'s weights read with {attention}'s attention: "
                  f"segment 0 {seg0:.3f}, segments >= 1 {after:.3f}", flush=True)
    summary = {}
    for weights, attention in list(CONTROLS.items()):
        for q in ("seg0", "after"):
            own = [r[q] for r in rows if r["weights"] == attention and r["attention"] == attention]
            swapped = [r[q] for r in rows if r["weights"] == weights and r["attention"] == attention]
            mean, half = paired_t([s - o for s, o in zip(swapped, own)])[:2]
            summary[f"{weights} weights with {attention} attention - {attention}, {q}"] = [mean, half]
    for k, (mean, half) in summary.items():
        print(f"{k}: {mean:+.3f} +- {half:.3f} (95% t over {len(args.seeds)} seeds)")
    if args.out:
        args.out.write_text(json.dumps({"suite_dir": str(args.suite_dir), "rows": rows, "summary": summary}, indent=1))


if __name__ == "__main__":
    main()
