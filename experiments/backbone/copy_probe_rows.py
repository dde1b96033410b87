"""A shipped backbone's copy probe with an interval: a card's probe draws 16 rows a distance (seed 0), too few
to tell 0.52 bits from 0.5. Here each distance draws `--rows` fresh rows (seeds 1, 2, ...; 16 a seed, so none
is the card's), random chunks or held-out text as the card's, and reports the second copy's bits per byte as
the mean over rows with its 95% t half-width over rows, beside the first copy's and the share of rows whose
second copy costs at most half a bit. `full` on the CPU, streamed with the state carried as the card's probe.

    python experiments/backbone/copy_probe_rows.py copy-conv5 copy-conv6 [--rows 128] [--kinds random]
        [--distances 32 128 512 1024 2048 4000] [--out experiments/backbone/copy_probe_rows.json]
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any, Sequence

import torch

from memzoo.analysis.stats import t_halfwidth
from memzoo.core.model import MemoryModel
from memzoo.data.corpus import load_documents, split_documents
from memzoo.evaluations.copy_distance import copy_row_bits, probe_rows
from memzoo.runs.checkpoints import load_backbone
from memzoo.runs.configure import build_model, load_config
from memzoo.training.backbones import load_shipped_backbone

CHUNK, PER_SEED = 32, 16  # as the card's probe (memzoo.training.make_backbone)


def row_bits(model: MemoryModel, texts: list[bytes], distance: int, kind: str, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Bits per byte on the first and the second copy, one value per probe row. [rows], [rows]"""
    seq = torch.cat([probe_rows(texts, distance, CHUNK, kind, PER_SEED, seed=s) for s in range(1, 1 + math.ceil(rows / PER_SEED))])[:rows]
    return copy_row_bits(model, seq, distance, CHUNK)


def summary(first: torch.Tensor, second: torch.Tensor) -> dict[str, Any]:
    """Mean and 95% t half-width over rows of the second copy, the first copy's mean, the share <= 0.5 bits."""
    n, half = len(second), t_halfwidth(second.tolist())
    return {"rows": n, "first": round(float(first.mean()), 3), "second": round(float(second.mean()), 3),
            "second_ci": round(half, 3), "share_at_most_half_bit": round(float((second <= 0.5).double().mean()), 3)}


def probe(name: str, distances: Sequence[int], kinds: Sequence[str], rows: int) -> list[dict[str, Any]]:
    """The shipped backbone `name` as `full` (its own model config), probed at each distance and kind."""
    cfg = load_config("backbones/copy-conv6")  # the convolution's model config (every copy-conv stage has it)
    model = build_model(cfg)
    load_backbone(model, load_shipped_backbone(f"backbone:{name}", cfg.model), name)
    model.eval()
    texts = [d.data for d in split_documents(load_documents(cfg.data), cfg.data)["valid"]]
    out = []
    for kind in kinds:
        for d in distances:
            out.append({"kind": kind, "distance": d, **summary(*row_bits(model, texts, d, kind, rows))})
            print(name, out[-1], flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("backbones", nargs="+", help="shipped copy-conv backbones, e.g. copy-conv5 copy-conv6")
    p.add_argument("--rows", type=int, default=128)
    p.add_argument("--kinds", nargs="+", default=["random"])
    p.add_argument("--distances", nargs="+", type=int, default=[32, 128, 512, 1024, 2048, 4000])
    p.add_argument("--out", default="experiments/backbone/copy_probe_rows.json")
    args = p.parse_args()
    torch.set_num_threads(1)
    path = Path(args.out)
    results = json.loads(path.read_text()) if path.is_file() else {}
    for name in args.backbones:
        results[name] = probe(name, args.distances, args.kinds, args.rows)
        path.write_text(json.dumps(results, indent=1) + "\n")  # each backbone kept as it finishes


if __name__ == "__main__":
    main()
