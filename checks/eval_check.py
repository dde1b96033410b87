"""`memzoo eval` on the run's device, timed against a training step of the same model.

    PYTHONPATH=. python checks/eval_check.py [--device cuda] [--method local] [--steps 4] [--out results/gpu]

Trains `--method` at the paper-gpu backbone (8 layers, d_model 512, segments of 512, batch 48 of 8
segments, bf16) for a few steps on the device, then runs the command `memzoo eval RUN_DIR --json` in
a fresh process (it evaluates on the run's train.device) and reads back its tokens/s. Prints the
training tokens/s (steps after the first), the evaluation's, their ratio, and the evaluation's bits
per byte; exit status 1 when the evaluation fails, runs elsewhere than the device, or is not finite.
Writes eval_check.csv. `--device cpu` runs the same code at a tiny backbone, for checking the script.
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

PAPER_GPU = ["model.d_model=512", "model.n_layers=8", "model.n_heads=8", "model.segment_len=512",
             "train.batch_size=48", "train.window_segments=8", "train.bptt_segments=4", "train.precision=bf16",
             "eval.batch_size=16", "eval.max_docs=64", "eval.max_segments_per_doc=32", "data.max_docs=400"]
TINY = ["model.d_model=32", "model.n_layers=2", "model.n_heads=2", "model.segment_len=16", "train.batch_size=2",
        "train.window_segments=4", "train.bptt_segments=2", "eval.batch_size=2", "eval.max_docs=4",
        "eval.max_segments_per_doc=4", "data.max_docs=40"]


def measure(method: str, device: str, steps: int, root: Path) -> dict[str, Any]:
    """Train `steps` steps, then `memzoo eval` in a subprocess; both timed."""
    from memzoo.runs.configure import load_config
    from memzoo.training.train import train

    backbone = PAPER_GPU if device.startswith("cuda") else TINY
    cfg = load_config(method, [*backbone, f"train.steps={steps}", "train.warmup_steps=1", f"train.device={device}",
                               f"train.checkpoint_every={steps}", f"out_dir={root}", f"name={method}-eval-check"])
    tokens_per_step = cfg.train.batch_size * cfg.train.window_segments * cfg.model.segment_len
    marks: list[float] = []
    began = time.perf_counter()
    run_dir = train(cfg, progress=False, evaluate_at_end=False, on_step=lambda step: marks.append(time.perf_counter()))
    train_s = time.perf_counter() - began
    per_step = (marks[-1] - marks[0]) / (len(marks) - 1) if len(marks) > 1 else float("nan")  # after the first
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[1]),
                                                                     os.environ.get("PYTHONPATH")]))}
    began = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "memzoo", "eval", str(run_dir), "--json"], capture_output=True,
                          text=True, env=env)
    eval_wall = time.perf_counter() - began
    said = [line for line in proc.stderr.splitlines() if "evaluating on" in line]
    row: dict[str, Any] = {"method": method, "device": device, "train_steps": steps, "train_s": round(train_s, 2),
                           "train_tokens_per_s": tokens_per_step / per_step, "eval_wall_s": round(eval_wall, 2),
                           "eval_device_line": said[0] if said else ""}
    if proc.returncode != 0:
        return {**row, "ok": False, "note": f"memzoo eval exit {proc.returncode}: {proc.stderr.strip()[-300:]}"}
    result = json.loads(proc.stdout[proc.stdout.index("{"):]) if "{" in proc.stdout else {}
    result = result[0] if isinstance(result, list) else result
    bpb, tps = result.get("valid_bpb", result.get("bpb")), result.get("tokens_per_s")
    row.update(eval_tokens_per_s=tps, eval_bpb=bpb,
               eval_over_train=(tps / row["train_tokens_per_s"]) if tps and math.isfinite(row["train_tokens_per_s"]) else None)
    on_device = f"evaluating on {device}" in row["eval_device_line"]
    row["ok"] = bool(on_device and bpb is not None and math.isfinite(bpb))
    row["note"] = "" if on_device else "the evaluation did not say it ran on the device"
    return row


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--method", default="local")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("checks/eval_check.py: no CUDA device here, nothing checked (run it on a machine with a GPU)")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        row = measure(args.method, args.device, args.steps, Path(tmp))
    print(", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()), flush=True)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        with open(args.out / "eval_check.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(row))
            writer.writeheader()
            writer.writerow(row)
    return 0 if row["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
