"""What the Titans' memories write, and what it costs them: each trained Titans run of a window suite
folder evaluated twice, as trained and with nothing written (θ = 0 and α = 0 at every token, so the
memory keeps its initial weights W⁰ and every read is M⁰(q): the same read path, no content), beside the
window floor. If the no-write arm reads as well as the trained one, what the memory writes buys nothing
and the cost against the floor is the read path itself; if it reads better, the writes cost.

    python experiments/titans/titans_write_probe.py RESULTS/lm-window-rope3 [--docs 16] [--out FILE.json]

Bits per byte on the first validation documents (segment 0 and segments >= 1), and the copy probe's
second copy of a random chunk (memzoo.evaluations.copy_distance) at a few distances.
"""
from __future__ import annotations

import argparse
import json
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Iterator

import torch
from torch import Tensor

from memzoo.analysis.results import bpb_over
from memzoo.data.corpus import load_documents, split_documents
from memzoo.evaluations.copy_distance import copy_bits, probe_rows
from memzoo.evaluations.lm import evaluate_model
from memzoo.memories.titans import Titans
from memzoo.runs.checkpoints import load_trained, run_config

DISTANCES = (32, 128, 256)


@contextmanager
def nothing_written(model: torch.nn.Module) -> Iterator[None]:
    """Every Titans layer's gates give log(1 − α) = 0 and θ = 0: no decay and no write, W stays W⁰."""
    layers = [m for m in model.modules() if isinstance(m, Titans)]
    if not layers:
        raise ValueError("nothing_written: the model has no Titans layer")
    originals = [m.gate_values_of for m in layers]

    def frozen(original):
        def gate_values_of(h: Tensor) -> tuple[Tensor, Tensor, Tensor]:
            log_keep, log_eta, theta = original(h)
            return torch.zeros_like(log_keep), log_eta, torch.zeros_like(theta)
        return gate_values_of

    for m, original in zip(layers, originals):
        m.gate_values_of = frozen(original)
    try:
        yield
    finally:
        for m in layers:
            del m.gate_values_of  # the class's method again


def measure(run_dir: Path, valid: list, docs: int, arm: str) -> dict:
    """Bits per byte (segment 0, segments >= 1) and second-copy bits by distance, for one arm; `valid`:
    the held-out documents (the same split for every run of a suite)."""
    cfg, model = load_trained(run_dir)
    context = nothing_written(model) if arm == "nothing written" else nullcontext()
    with context, torch.no_grad():
        res = evaluate_model(model, valid[:docs], cfg.eval.batch_size, cfg.eval.max_segments_per_doc,
                             cfg.train.precision, progress=False)
        texts = [d.data for d in valid]
        copies = {str(d): round(copy_bits(model, probe_rows(texts, d, 32, "random", 16), d, 32)[1], 3)
                  for d in DISTANCES}
    return {"run": run_dir.name, "arm": arm, "seg0": round(res["bpb_by_segment"][0], 4),
            "after": round(bpb_over(res, 1), 4), "copy_random": copies}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path, help="a window suite's results folder (with runs/)")
    ap.add_argument("--docs", type=int, default=16)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    runs = sorted(p for p in (args.folder / "runs").iterdir() if p.name.startswith(("titans-", "local-")))
    cfg = run_config(runs[0])  # the split is the suite's: one config, no model
    valid = split_documents(load_documents(cfg.data), cfg.data)[cfg.eval.split]
    rows = []
    for run in runs:
        for arm in ("as trained",) + (("nothing written",) if run.name.startswith("titans-") else ()):
            rows.append(measure(run, valid, args.docs, arm))
            print(json.dumps(rows[-1]), flush=True)
    if args.out:
        args.out.write_text(json.dumps({"folder": str(args.folder), "docs": args.docs, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
