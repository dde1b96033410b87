"""Step 0 of an `lm-stream` fine-tune: the shipped backbone loaded into each method, evaluated by segment.

Before any fine-tuning step, how far is each method's read from what the backbone (trained as `local`,
attention within 128 bytes) already does? `full` attends to up to 4,096 past positions, at RoPE
distances the backbone never saw; XL to at most 256. Prints `method - local` by range of segments and
writes zero_shot.md with --out:

    python experiments/lm-stream/zero_shot.py --methods local,full,xl --docs 16 --out DIR
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from memzoo.training.backbones import load_shipped_backbone
from memzoo.runs.checkpoints import load_backbone
from memzoo.runs.configure import build_model
from memzoo.evaluations.lm import evaluate_model, split_docs
from memzoo.suites.compare import expand, load_suite
from memzoo.publishing.tables import markdown

RANGES = {"segment 0": (0, 1), "segments 1-3": (1, 4), "segments 4-7": (4, 8), "segments 8-15": (8, 16),
          "segments 16-31": (16, 32)}


def step_zero_bpb(method: str, docs: int, suite: str = "lm-stream") -> np.ndarray:
    """Bits per byte by segment [S] of `method`'s seed-0 run of `suite`, backbone loaded, not trained."""
    spec = expand(load_suite(suite, [f"methods=[{method}]", "seeds=[0]"]))[0]
    cfg = spec.cfg
    torch.manual_seed(cfg.seed)
    model = build_model(cfg)
    load_backbone(model, load_shipped_backbone(cfg.task.init_from, cfg.model, "cpu"), cfg.task.init_from)
    ev = evaluate_model(model, split_docs(cfg, "valid")[:docs], cfg.eval.batch_size, cfg.eval.max_segments_per_doc,
                        progress=False)
    return np.asarray(ev["bpb_by_segment"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--methods", default="local,full,xl", help="comma-separated; must include local")
    ap.add_argument("--docs", type=int, default=16, help="validation documents evaluated (each to 32 segments)")
    ap.add_argument("--out", type=Path, help="write zero_shot.md here")
    args = ap.parse_args()
    methods = args.methods.split(",")
    if "local" not in methods:
        raise SystemExit(f"--methods={args.methods!r}: expected local among them (the differences are from local)")
    bpb = {m: step_zero_bpb(m, args.docs) for m in methods}
    rows = []
    for m in methods:
        diff = bpb[m] - bpb["local"]
        rows.append([f"`{m}`", f"{bpb[m].mean():.3f}", *(f"{diff[a:b].mean():+.3f}" for a, b in RANGES.values())])
    table = markdown(["method", "bits per byte (mean of segments)", *(f"− local, {r}" for r in RANGES)], rows, right=range(1, len(RANGES) + 2))
    text = (f"The shipped backbone in each method before fine-tuning: {args.docs} validation documents x 32 "
            f"segments (`python experiments/lm-stream/zero_shot.py --methods {args.methods} --docs {args.docs}`).\n\n{table}")
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "zero_shot.md").write_text(text)


if __name__ == "__main__":
    main()
