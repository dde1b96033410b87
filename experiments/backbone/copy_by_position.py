"""Where a backbone's copying cost sits within the second copy: bits on each byte of it, by its position in
the chunk, at each distance and kind (the copy probe's rows, memzoo.evaluations.copy_distance.probe_rows, drawn
at seed 1 and 64 rows a distance, where a card's probe draws 16 at seed 0). `full`, on the CPU.

The probe's figure is the mean over the chunk's bytes 4..31. A model that locates the copy late, or one that
locates it at once but keeps hedging against its text prior, both give a mean near a bit; the curve by
position tells them apart: the first falls to near 0 after a few bytes, the second stays high. For held-out
text, the cost of bytes 8..31 is also split by whether a lookup keyed on their last k bytes is unambiguous (no
earlier place with those k bytes is followed by a wrong byte, memzoo.analysis.copy_distance.wrong_matches),
beside the same bytes' cost on the first copy: if unambiguous bytes gain more from the first copy than the
others (first - second), the copying is keyed on about k bytes; if they are only cheaper on both copies, the
text prior explains them.

With --logit-scale s every attention's logits are multiplied by s at inference (sharper reads): if a far
copy's cost came from the match's weight diluted among thousands of keys, s > 1 would lower it.

    python experiments/backbone/copy_by_position.py [BACKBONE ...] [--logit-scale S] [--label NAME]
    # MEMZOO_BACKBONES=DIR for a pilot's backbone; appends to copy_by_position.json under NAME (default BACKBONE)
    python experiments/backbone/copy_by_position.py --run RUN_DIR [--import PLUGIN.py] --label NAME
    # a trained run as it is, its memory's own weights included (a pilot whose memory is a plugin)
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch
import torch.nn.functional as F
from omegaconf import DictConfig

from memzoo.analysis.copy_distance import wrong_matches
from memzoo.core.model import MemoryModel
from memzoo.data.corpus import load_documents, split_documents
from memzoo.evaluations.copy_distance import probe_rows, streamed_bits
from memzoo.runs.checkpoints import load_backbone, load_trained
from memzoo.runs.configure import build_model, load_config
from memzoo.suites.suite_plugins import import_plugins
from memzoo.training.backbones import load_shipped_backbone

DISTANCES, CHUNK, ROWS = (32, 128, 1024, 4000), 32, 64
KEYS = (1, 2, 3, 4, 8)  # lookup key lengths in bytes
BANDS = ((0, 4), (4, 8), (8, 16), (16, 32))  # positions within the chunk's second copy
KEYED_FROM = 8  # the bytes split by key: 8..31, past where a random chunk is located


def shipped_full(name: str) -> tuple[MemoryModel, DictConfig]:
    """The shipped backbone `name` as `full` on the CPU, as the backbone configs read it."""
    cfg = load_config("backbones/copy-stdlib-rope4")
    model = build_model(cfg)
    load_backbone(model, load_shipped_backbone(f"backbone:{name}", cfg.model), name)
    return model.eval(), cfg


def by_key(rows: np.ndarray, first: np.ndarray, second: np.ndarray, distance: int) -> dict[str, float]:
    """For each key length k: the share of bytes KEYED_FROM..31 that a lookup by k bytes locates
    unambiguously, and their mean bits on the second and the first copy, and the others' likewise.
    rows: [B, T] bytes; first, second: [B, CHUNK] bits on each copy's byte p."""
    out: dict[str, float] = {}
    for k in KEYS:
        cls: dict[str, tuple[list[float], list[float]]] = {"unambiguous": ([], []), "misled": ([], [])}
        for r, f, s in zip(rows, first, second):
            for p, n in wrong_matches(r, distance, k, CHUNK).items():
                if p >= KEYED_FROM:
                    two, one = cls["unambiguous" if n == 0 else "misled"]
                    two.append(float(s[p]))
                    one.append(float(f[p]))
        total = sum(len(two) for two, _ in cls.values())
        out[f"k{k}_unambiguous_share"] = round(len(cls["unambiguous"][0]) / max(1, total), 3)
        for name, (two, one) in cls.items():
            if two:
                out[f"k{k}_{name}_bits"] = round(float(np.mean(two)), 3)
                out[f"k{k}_{name}_first_bits"] = round(float(np.mean(one)), 3)
    return out


def by_position(model: MemoryModel, texts: list[bytes]) -> list[dict[str, Any]]:
    """One row per (kind, distance): bits on each copy, the second by band of position, text by key."""
    out = []
    for kind in ("text", "random"):
        for d in DISTANCES:
            seq = probe_rows(texts, d, CHUNK, kind, ROWS, seed=1)  # [B, d + CHUNK + 1]
            with torch.no_grad():
                bits = streamed_bits(model, seq)  # [B, T]: bits[:, i] is the cost of byte i + 1
            first = torch.cat([torch.full_like(bits[:, :1], float("nan")), bits[:, :CHUNK - 1]], 1)  # [B, CHUNK]: byte p
            second = bits[:, d - 1:d - 1 + CHUNK]  # [B, CHUNK]: byte d + p
            mean = second.mean(0)  # [CHUNK]
            row: dict[str, Any] = {"kind": kind, "distance": d, "first_4_31": round(float(first[:, 4:].mean()), 3),
                                   "second_4_31": round(float(mean[4:].mean()), 3)}
            row.update({f"second_{a}_{b - 1}": round(float(mean[a:b].mean()), 3) for a, b in BANDS})
            if kind == "text":
                row.update(by_key(seq.numpy(), first.numpy(), second.numpy(), d))
            out.append(row)
            print(row, flush=True)
    return out


def scale_attention_logits(s: float) -> None:
    """Every softmax attention call from here on multiplies its logits by s (inference only; on the CPU
    every attention goes through F.scaled_dot_product_attention)."""
    plain = F.scaled_dot_product_attention

    def sharper(*args: Any, scale: float | None = None, **kw: Any) -> torch.Tensor:
        q = args[0] if args else kw["query"]
        base = scale if scale is not None else q.shape[-1] ** -0.5
        return plain(*args, scale=s * base, **kw)

    F.scaled_dot_product_attention = sharper


def models(a: argparse.Namespace) -> Iterator[tuple[str, tuple[MemoryModel, DictConfig]]]:
    """(label, (model, config)) for the run folder --run, else for each shipped backbone asked for."""
    if a.run is not None:
        cfg, model = load_trained(a.run)
        yield a.label, (model.cpu().eval(), cfg)
        return
    for name in a.backbones:
        yield a.label or (name if a.logit_scale == 1.0 else f"{name}, logits x{a.logit_scale}"), shipped_full(name)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("backbones", nargs="*", help="shipped backbones (default: copy-stdlib-rope4)")
    p.add_argument("--logit-scale", type=float, default=1.0, help="multiply every attention's logits (1: as trained)")
    p.add_argument("--label", default=None, help="the result's name in the JSON (one backbone; default: its name)")
    p.add_argument("--run", type=Path, default=None, help="a trained run folder instead of shipped backbones")
    p.add_argument("--import", dest="imports", action="append", default=[], help="a plugin the run's memory needs")
    p.add_argument("--out", type=Path, default=Path(__file__).with_name("copy_by_position.json"))
    a = p.parse_args()
    if a.run is not None and (a.backbones or not a.label):
        p.error(f"--run takes one run folder and a --label, no backbones; got backbones {a.backbones}, label {a.label!r}")
    a.backbones = a.backbones or ["copy-stdlib-rope4"]
    if a.label and a.run is None and len(a.backbones) != 1:
        p.error(f"--label names one backbone's result; got {len(a.backbones)} backbones: {a.backbones}")
    import_plugins(a.imports)
    if a.logit_scale != 1.0:
        scale_attention_logits(a.logit_scale)
    torch.manual_seed(0)
    result = json.loads(a.out.read_text()) if a.out.exists() else {}
    for label, (model, cfg) in models(a):
        texts = [d.data for d in split_documents(load_documents(cfg.data), cfg.data)["valid"]]
        result[label] = by_position(model, texts)
        a.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
