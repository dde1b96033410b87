"""Where a backbone's copying cost sits within the second copy: bits on each byte of it, by its position in
the chunk, at each distance and kind (the copy probe's rows, memzoo.evaluations.copy_distance, 64 rows).

The probe's figure is the mean over the chunk's bytes 4..31. A model that locates the copy late, or one that
locates it at once but keeps hedging against its text prior, both give a mean near a bit; the curve by
position tells them apart: the first falls to near 0 after a few bytes, the second stays flat. For held-out
text, each byte's cost is also split by whether a lookup keyed on its last k bytes is unambiguous (no earlier
place with those k bytes followed by a wrong byte, memzoo.analysis.copy_distance.wrong_matches): the shortest
k at which unambiguous bytes become cheap is about the key length the model's copying uses.

With --logit-scale s every attention's logits are multiplied by s at inference (sharper reads): if a far
copy's cost came from the match's weight diluted among thousands of keys, s > 1 would lower it.

    python experiments/backbone/copy_by_position.py [BACKBONE ...] [--logit-scale S]   # MEMZOO_BACKBONES=DIR for a pilot's; writes copy_by_position.json
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from memzoo.analysis.copy_distance import wrong_matches
from memzoo.data.corpus import load_documents, split_documents
from memzoo.evaluations.copy_distance import probe_rows, streamed_bits
from memzoo.runs.checkpoints import load_backbone
from memzoo.runs.configure import build_model, load_config
from memzoo.training.backbones import load_shipped_backbone

DISTANCES, CHUNK, ROWS = (32, 128, 1024, 4000), 32, 64
KEYS = (1, 2, 3, 4, 8)  # lookup key lengths in bytes
BANDS = ((0, 4), (4, 8), (8, 16), (16, 32))  # positions within the chunk's second copy


def shipped_full(name: str) -> tuple[torch.nn.Module, Any]:
    """The shipped backbone `name` as `full`, as the backbone configs read it (a pilot's folder: set
    MEMZOO_BACKBONES to it)."""
    cfg = load_config("backbones/copy-stdlib-rope4")
    model = build_model(cfg)
    load_backbone(model, load_shipped_backbone(f"backbone:{name}", cfg.model), name)
    return model.eval(), cfg


def by_key(rows: np.ndarray, second: np.ndarray, distance: int) -> dict[str, float]:
    """Mean bits on second-copy bytes 8..31 that a lookup by k bytes finds unambiguously, and on the rest,
    with the share of bytes that are unambiguous. rows: [B, T] bytes; second: [B, CHUNK] bits."""
    out: dict[str, float] = {}
    for k in KEYS:
        clean, misled = [], []
        for r, b in zip(rows, second):
            for p, n in wrong_matches(r, distance, k, CHUNK).items():
                if p >= 8:
                    (clean if n == 0 else misled).append(float(b[p]))
        out[f"k{k}_unambiguous_share"] = round(len(clean) / max(1, len(clean) + len(misled)), 3)
        out[f"k{k}_unambiguous_bits"] = round(float(np.mean(clean)), 3) if clean else float("nan")
        out[f"k{k}_misled_bits"] = round(float(np.mean(misled)), 3) if misled else float("nan")
    return out


def by_position(model, texts: list[bytes]) -> list[dict]:
    out = []
    for kind in ("text", "random"):
        for d in DISTANCES:
            seq = probe_rows(texts, d, CHUNK, kind, ROWS, seed=1)
            with torch.no_grad():
                bits = streamed_bits(model, seq)  # [B, T]: bits[:, i] predicts byte i + 1
            second = bits[:, d - 1:d - 1 + CHUNK].mean(0)  # [CHUNK] by position in the copy
            first = bits[:, 0:CHUNK - 1].mean(0)
            row = {"kind": kind, "distance": d, "first_4_31": round(float(first[3:].mean()), 3),
                   "second_4_31": round(float(second[4:].mean()), 3)}
            row.update({f"second_{a}_{b - 1}": round(float(second[a:b].mean()), 3) for a, b in BANDS})
            if kind == "text":
                row.update(by_key(seq.numpy(), bits[:, d - 1:d - 1 + CHUNK].numpy(), d))
            out.append(row)
            print(row, flush=True)
    return out


def scale_attention_logits(s: float) -> None:
    """Every softmax attention call from here on multiplies its logits by s (inference only)."""
    plain = F.scaled_dot_product_attention

    def sharper(q, k, v, attn_mask=None, is_causal=False, scale=None, **kw):  # the sdpa signature
        base = scale if scale is not None else q.shape[-1] ** -0.5
        return plain(q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=s * base, **kw)

    F.scaled_dot_product_attention = sharper


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("backbones", nargs="*", default=["copy-stdlib-rope4"])
    p.add_argument("--out", type=Path, default=Path(__file__).with_name("copy_by_position.json"))
    p.add_argument("--logit-scale", type=float, default=1.0, help="multiply every attention's logits (1: as trained)")
    a = p.parse_args()
    if a.logit_scale != 1.0:
        scale_attention_logits(a.logit_scale)
    torch.manual_seed(0)
    result = json.loads(a.out.read_text()) if a.out.exists() else {}
    for name in a.backbones:
        model, cfg = shipped_full(name)
        texts = [d.data for d in split_documents(load_documents(cfg.data), cfg.data)["valid"]]
        result[name if a.logit_scale == 1.0 else f"{name}, logits x{a.logit_scale}"] = by_position(model, texts)
    a.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
