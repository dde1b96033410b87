"""Does a trained run copy from its context, and from how far back? (the induction probe by distance)

Each probe row is a chunk, other text, then the same chunk again, so that every byte of the second copy
sits exactly `distance` bytes after the same byte of the first. The row is streamed segment by segment
with the state carried, as evaluation reads, so a memory is read across segments as it is in the
suites. A model that looks up what it has seen at that distance predicts the second copy for a
fraction of a bit; one that does not predicts both copies alike. Two kinds of chunk: `text` (held-out
corpus bytes, the copying that bits per byte rewards) and `random` (a random printable string, which
nothing but copying predicts). The filler is held-out text from other documents.

    python -m memzoo.evaluations.copy_distance RUN_DIR [RUN_DIR ...] [--distances 32 128 1024 4000]
"""
from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from typing import Iterable, Sequence

import torch
from torch import Tensor

from memzoo.core.losses import token_nll
from memzoo.core.model import MemoryModel
from memzoo.data.copy_reads import PRINTABLE

DISTANCES = (32, 64, 128, 256, 512, 1024, 2048, 4000)
KINDS = ("text", "random")
SKIP = 4  # bytes of each copy left out: the first few of a copy cannot be located yet


@dataclass(frozen=True)
class CopyRow:
    distance: int
    kind: str
    first_bits: float  # bits per byte on the first copy
    second_bits: float  # bits per byte on the second copy (distance bytes after the first)


def probe_rows(texts: Sequence[bytes], distance: int, chunk_len: int, kind: str, rows: int, seed: int = 0) -> Tensor:
    """[rows, distance + chunk_len + 1] bytes: chunk, filler, chunk again (starting `distance` after the first).

    texts: held-out documents; chunks and filler are cut from different ones."""
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r}; expected one of {', '.join(KINDS)}")
    if distance < chunk_len:
        raise ValueError(f"distance={distance} is shorter than the chunk ({chunk_len} bytes): the copies would overlap")
    long_enough = [t for t in texts if len(t) > chunk_len + 1]
    if len(long_enough) < 2:
        raise ValueError(f"probe_rows needs at least two held-out documents longer than {chunk_len + 1} bytes")
    gen = torch.Generator().manual_seed(seed * 7919 + distance)
    pool = b"".join(long_enough)  # the filler is read across document ends: only its length matters
    out = []
    for _ in range(rows):
        if kind == "random":
            chunk = PRINTABLE[torch.randint(len(PRINTABLE), (chunk_len,), generator=gen)].tolist()
        else:
            doc = long_enough[int(torch.randint(len(long_enough), (1,), generator=gen))]
            at = int(torch.randint(len(doc) - chunk_len, (1,), generator=gen))
            chunk = list(doc[at:at + chunk_len])
        gap = distance - chunk_len
        at = int(torch.randint(max(1, len(pool) - gap - 1), (1,), generator=gen))
        filler = list((pool * (1 + gap // max(1, len(pool))))[at:at + gap + 1])
        out.append(chunk + filler[:gap] + chunk + filler[gap:gap + 1])  # one byte after: the last target
    return torch.tensor(out)


@torch.no_grad()
def streamed_bits(model: MemoryModel, seq: Tensor) -> Tensor:
    """Bits of each next byte of seq [B, T + 1], streamed one segment at a time from a fresh state. [B, T]"""
    n = model.cfg.segment_len
    b, t = seq.shape[0], seq.shape[1] - 1
    state = model.initial_state(b, seq.device)
    bits = []
    for start in range(0, t, n):
        tokens = seq[:, start:min(t, start + n)]  # [B, n']
        reset = torch.full((b, 1), start == 0, dtype=torch.bool, device=seq.device)
        out = model(tokens[:, None], state, reset)
        state = out.state
        bits.append(token_nll(out.logits, seq[:, None, start + 1:start + 1 + tokens.shape[1]])[:, 0] / math.log(2))
    return torch.cat(bits, dim=1)


def copy_bits(model: MemoryModel, seq: Tensor, distance: int, chunk_len: int) -> tuple[float, float]:
    """Bits per byte on the first and the second copy of probe rows seq (probe_rows')."""
    model.eval()
    bits = streamed_bits(model, seq.to(next(model.parameters()).device))  # [B, T]
    # bits[:, i] predicts byte i + 1: the first copy's bytes are 0..chunk_len-1, the second's distance..
    first = bits[:, SKIP - 1:chunk_len - 1]
    second = bits[:, distance + SKIP - 1:distance + chunk_len - 1]
    return float(first.mean()), float(second.mean())


def copy_by_distance(model: MemoryModel, texts: Sequence[bytes], distances: Iterable[int] = DISTANCES,
                     chunk_len: int = 32, rows: int = 16, kinds: Iterable[str] = KINDS) -> list[CopyRow]:
    """Bits on each copy at each distance and kind of chunk."""
    out = []
    for kind in kinds:
        for d in distances:
            first, second = copy_bits(model, probe_rows(texts, d, chunk_len, kind, rows), d, chunk_len)
            out.append(CopyRow(d, kind, first, second))
    return out


def main(argv: Sequence[str] | None = None) -> None:
    from memzoo.data.corpus import load_documents, split_documents
    from memzoo.runs.checkpoints import load_trained

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--distances", type=int, nargs="+", default=list(DISTANCES))
    ap.add_argument("--chunk-len", type=int, default=32)
    ap.add_argument("--rows", type=int, default=16)
    args = ap.parse_args(argv)
    for run in args.runs:
        cfg, model = load_trained(run)
        texts = [d.data for d in split_documents(load_documents(cfg.data), cfg.data)["valid"]]
        for row in copy_by_distance(model, texts, args.distances, args.chunk_len, args.rows):
            print(f"{run}\t{row.kind}\t{row.distance}\t{row.first_bits:.3f}\t{row.second_bits:.3f}", flush=True)


if __name__ == "__main__":
    main()
