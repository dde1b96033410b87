"""An interrupted run resumes on CUDA and ends where an uninterrupted one does.

    PYTHONPATH=. python checks/resume_check.py [--device cuda] [--out results/gpu]

A small backbone with dropout trains 6 steps straight, then again cut off after step 3 and resumed
from its checkpoint, which train loads onto the device (RNG states included: the first resume of
lm-stream-gpu failed there, H200 2026-11-27). Per method it prints the largest weight difference
between the two; exit status 1 when a resume fails or a difference passes TOL. Bitwise equality is
what the CPU tests hold (tests/test_train.py); on a GPU a backward with atomics may differ in the last
bits, hence the tolerance. Writes resume_check.csv. `--device cpu` checks the script itself.
"""
from __future__ import annotations

import argparse
import csv
import sys
import tempfile
from pathlib import Path

import torch

from memzoo.runs.checkpoints import load_checkpoint
from memzoo.runs.configure import load_config
from memzoo.training.train import train

TOL = 1e-5  # relative to the weight's scale; a wrong RNG or step count moves weights by ~1e-2
OVERRIDES = ["model.d_model=32", "model.n_layers=2", "model.n_heads=2", "model.segment_len=16", "model.dropout=0.1",
             "train.steps=6", "train.batch_size=2", "train.window_segments=4", "train.bptt_segments=2",
             "train.warmup_steps=2", "train.checkpoint_every=2", "train.log_every=1", "data.max_docs=60"]


class Interrupt(Exception):
    pass


def check(method: str, device: str, root: Path) -> dict[str, object]:
    """Straight against cut-and-resumed, for one method: the largest relative weight difference."""
    over = [*OVERRIDES, f"train.device={device}", f"out_dir={root}"]
    straight = train(load_config(method, [*over, f"name={method}-straight"]), progress=False, evaluate_at_end=False)
    cfg = load_config(method, [*over, f"name={method}-cut"])

    def crash(step: int) -> None:
        if step == 3:
            raise Interrupt()

    try:
        train(cfg, on_step=crash, progress=False, evaluate_at_end=False)
    except Interrupt:
        pass
    try:
        resumed = train(cfg, progress=False, evaluate_at_end=False)
    except Exception as err:  # the failure this script exists to catch
        return {"method": method, "device": device, "ok": False, "max_rel_diff": "", "note": f"{type(err).__name__}: {err}"}
    a, b = load_checkpoint(straight)["model"], load_checkpoint(resumed)["model"]
    diff = max(float((a[k].double() - b[k].double()).abs().max() / a[k].double().abs().max().clamp_min(1e-12))
               for k in a if a[k].is_floating_point())
    bitwise = all(torch.equal(a[k], b[k]) for k in a)
    return {"method": method, "device": device, "ok": diff <= TOL, "max_rel_diff": f"{diff:.2e}",
            "note": "bitwise equal" if bitwise else ""}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--methods", default="local,full,xl,infini-delta")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for method in args.methods.split(","):
            rows.append(check(method, args.device, Path(tmp)))
            print(rows[-1], flush=True)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        with open(args.out / "resume_check.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    sys.exit(0 if all(r["ok"] for r in rows) else 1)


if __name__ == "__main__":
    main()
