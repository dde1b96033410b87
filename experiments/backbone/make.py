"""Pretrain the shared `local` backbone that every method can be fine-tuned from, and ship it inside the
package as memzoo/backbones/NAME.pt (memzoo.training.backbones; `task.init_from=backbone:NAME`).

    PYTHONPATH=. python experiments/backbone/make.py [--name small-stdlib] [--steps 1500] [--out runs/backbone]

The shipped `small-stdlib`: the `small` preset (0.82M parameters, d_model 128, 4 layers, 128-byte
segments) as `local`, 1,500 steps of 8 windows of 8 segments (12.3M bytes of the standard library's
source), seed 0; valid bits per byte 2.001. It took 25 minutes of training on one thread of this
project's 2-core CPU while other jobs ran (8,064 training bytes/s); about 10 minutes on an idle machine.
An interrupted run resumes from its checkpoint when the same command is run again.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from memzoo.training.backbones import ship_backbone, shipped_dir
from memzoo.runs.configure import load_config
from memzoo.training.train import train


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--name", default="small-stdlib")
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--out", default="runs/backbone", help="where the pretraining run folder goes")
    ap.add_argument("--dest", default=None, help="where to ship it (default: memzoo/backbones of this checkout)")
    args = ap.parse_args()
    cfg = load_config("local", [f"train.steps={args.steps}", f"seed={args.seed}", f"train.threads={args.threads}",
                                f"out_dir={args.out}", f"name=local-{args.name}-s{args.seed}"])
    run = train(cfg)
    result = (run / "result.json").read_text()
    cost = (f"{args.steps} steps of local at the small preset, seed {args.seed}, "
            f"experiments/backbone/make.py (result: {run / 'result.json'})")
    path = ship_backbone(run, args.name, cost=cost, dest=Path(args.dest) if args.dest else shipped_dir())
    print(f"shipped {path} ({len(result)} bytes of result.json beside the run)")


if __name__ == "__main__":
    main()
