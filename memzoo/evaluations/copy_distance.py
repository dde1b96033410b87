"""Does a trained run copy from its context, and from how far back? (the induction probe by distance)

Each probe row is a chunk, other text, then the same chunk again, so that every byte of the second copy
sits exactly `distance` bytes after the same byte of the first. The row is streamed segment by segment
with the state carried, as evaluation reads, so a memory is read across segments as it is in the
suites. A model that looks up what it has seen at that distance predicts the second copy for a
fraction of a bit; one that does not predicts both copies alike. Two kinds of chunk: `text` (held-out
corpus bytes, the copying that bits per byte rewards) and `random` (a random printable string, which
nothing but copying predicts). The filler is held-out text from other documents.

    memzoo copy-distance RUN_DIR [--distances 32,128,1024,4000] [--kinds random]   # or a suite stage:
    longrange: [{task: copy-distance}]
"""
from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import torch
from torch import Tensor
from tqdm.auto import tqdm

from memzoo.core.config import ConfigError
from memzoo.core.losses import token_nll
from memzoo.core.model import MemoryModel
from memzoo.data.copy_reads import PRINTABLE
from memzoo.evaluations.harness import atomic_json, forget_before_segment, merge_into_result, trained_run
from memzoo.evaluations.registry import Command, Evaluation, Figure, fmt, names, numbers, register_evaluation
from memzoo.evaluations.reporting import copy_distance_notes, copy_distance_sections
from memzoo.analysis.copy_distance import copy_distance_figure, is_copy_distance_table

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
def streamed_bits(model: MemoryModel, seq: Tensor, reset_memory: bool = False) -> Tensor:
    """Bits of each next byte of seq [B, T + 1], streamed one segment at a time from a fresh state. [B, T]

    reset_memory: the memory ablation, as bits per byte's (memzoo.evaluations.lm): every memory forgets
    before each segment and the backbone's window is kept, so what is copied from beyond the window
    with it is what the memory carried (without a window the whole state resets, as a document start)."""
    n = model.cfg.segment_len
    b, t = seq.shape[0], seq.shape[1] - 1
    state = model.initial_state(b, seq.device)
    bits = []
    for start in range(0, t, n):
        tokens = seq[:, start:min(t, start + n)]  # [B, n']
        reset = torch.full((b, 1), start == 0, dtype=torch.bool, device=seq.device)
        if reset_memory:
            state, reset = forget_before_segment(model, state, reset, b)
        out = model(tokens[:, None], state, reset)
        state = out.state
        bits.append(token_nll(out.logits, seq[:, None, start + 1:start + 1 + tokens.shape[1]])[:, 0] / math.log(2))
    return torch.cat(bits, dim=1)


def copy_row_bits(model: MemoryModel, seq: Tensor, distance: int, chunk_len: int,
                  reset_memory: bool = False) -> tuple[Tensor, Tensor]:
    """Bits per byte on the first and the second copy of each probe row of seq (probe_rows'). [B], [B]"""
    model.eval()
    bits = streamed_bits(model, seq.to(next(model.parameters()).device), reset_memory)  # [B, T]
    # bits[:, i] predicts byte i + 1: the first copy's bytes are 0..chunk_len-1, the second's distance..
    first = bits[:, SKIP - 1:chunk_len - 1]
    second = bits[:, distance + SKIP - 1:distance + chunk_len - 1]
    return first.mean(1), second.mean(1)


def copy_bits(model: MemoryModel, seq: Tensor, distance: int, chunk_len: int,
              reset_memory: bool = False) -> tuple[float, float]:
    """Bits per byte on the first and the second copy of probe rows seq, over all rows (every row's copy has
    chunk_len bytes, so the mean of row means is the mean over bytes)."""
    first, second = copy_row_bits(model, seq, distance, chunk_len, reset_memory)
    return float(first.mean()), float(second.mean())


def copy_by_distance(model: MemoryModel, texts: Sequence[bytes], distances: Iterable[int] = DISTANCES,
                     chunk_len: int = 32, rows: int = 16, kinds: Iterable[str] = KINDS,
                     reset_memory: bool = False) -> list[CopyRow]:
    """Bits on each copy at each distance and kind of chunk."""
    out = []
    for kind in kinds:
        for d in distances:
            first, second = copy_bits(model, probe_rows(texts, d, chunk_len, kind, rows), d, chunk_len, reset_memory)
            out.append(CopyRow(d, kind, first, second))
    return out


@dataclass
class CopyDistanceConfig:
    """The probe as a suite stage (`longrange: [{task: copy-distance}]`): the run's held-out documents
    give the chunks and filler; `reset_memory` adds the memory ablation's arm beside the plain one."""

    task: str = "copy-distance"
    distances: list[int] = field(default_factory=lambda: list(DISTANCES))
    kinds: list[str] = field(default_factory=lambda: list(KINDS))
    chunk_len: int = 32
    rows: int = 16
    reset_memory: bool = True
    threads: int = 0  # torch threads; 0 = torch's default

    def __post_init__(self) -> None:
        bad = [k for k in self.kinds if k not in KINDS]
        if bad:
            raise ConfigError(f"copy-distance kinds={bad}; expected among {', '.join(KINDS)}")
        short = [d for d in self.distances if d < self.chunk_len]
        if short:
            raise ConfigError(f"copy-distance distances={short} are shorter than chunk_len={self.chunk_len}: "
                              "the two copies would overlap")
        if self.rows < 1:
            raise ConfigError(f"copy-distance rows={self.rows}; expected >= 1")

    def settings(self) -> dict[str, Any]:
        """What the rows depend on besides the weights (a stored row is reused only with these)."""
        return {"chunk_len": self.chunk_len, "rows": self.rows}


def evaluate_copy_distance(run_dir: str | Path, cfg: CopyDistanceConfig, resume: bool = True,
                           progress: bool = True) -> list[dict[str, Any]]:
    """Each (kind, distance, arm) of `cfg` for the trained run in `run_dir`: rows kept in
    RUN_DIR/copy-distance.json and under "copy-distance" in result.json; rows already measured with
    these weights and settings are kept, not measured again."""
    from memzoo.data.corpus import load_documents, split_documents
    from memzoo.runs.checkpoints import load_trained

    run_dir, weights = trained_run(run_dir)
    store = run_dir / "copy-distance.json"
    kept = [r for r in (json.loads(store.read_text()) if store.is_file() else [])
            if r.get("weights") == weights and all(r.get(k) == v for k, v in cfg.settings().items())]
    done = {(r["kind"], r["distance"], r["reset_memory"]) for r in kept} if resume else set()
    arms = [False, True] if cfg.reset_memory else [False]
    todo = [(k, d, a) for a in arms for k in cfg.kinds for d in cfg.distances if (k, d, a) not in done]
    rows = kept if resume else []
    if todo:
        run_cfg, model = load_trained(run_dir)
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        texts = [d.data for d in split_documents(load_documents(run_cfg.data), run_cfg.data)[run_cfg.eval.split]]
        for kind, distance, arm in tqdm(todo, desc=f"copy-distance {run_dir.name}", disable=not progress):
            seq = probe_rows(texts, distance, cfg.chunk_len, kind, cfg.rows)
            first, second = copy_bits(model, seq, distance, cfg.chunk_len, reset_memory=arm)
            rows.append({"kind": kind, "distance": distance, "reset_memory": arm, "first_bits": first,
                         "second_bits": second, "weights": weights, **cfg.settings()})
            atomic_json(store, rows)  # each row kept as it is measured
    merge_into_result(run_dir, "copy-distance", rows)
    return rows


def _arguments(s: argparse.ArgumentParser) -> None:
    s.add_argument("run_dir")
    s.add_argument("--distances", type=numbers(int, "distances"), default=list(DISTANCES),
                   help="comma-separated distances in bytes between the two copies")
    s.add_argument("--kinds", type=names("kinds"), default=list(KINDS), help="random and/or text chunks")
    s.add_argument("--chunk-len", type=int, default=32)
    s.add_argument("--rows", type=int, default=16)
    s.add_argument("--no-reset", action="store_true", help="skip the memory ablation's arm")
    s.add_argument("--json", action="store_true")


def _options(args: argparse.Namespace) -> dict[str, Any]:
    return {"distances": args.distances, "kinds": args.kinds, "chunk_len": args.chunk_len, "rows": args.rows,
            "reset_memory": not args.no_reset}


def _shown(row: dict[str, Any]) -> dict[str, Any]:
    return {"kind": row["kind"], "distance": row["distance"], "memory": "forgotten" if row["reset_memory"] else "read",
            "first": fmt(row["first_bits"], ".3f"), "second": fmt(row["second_bits"], ".3f")}


register_evaluation(Evaluation(
    "copy-distance", CopyDistanceConfig, evaluate_copy_distance,
    Command("the induction probe by distance: bits per byte on a chunk's first and second copy, per distance",
            _arguments, _options, _shown, ["kind", "distance", "memory", "first", "second"], "copy-distance.json"),
    section=copy_distance_sections,
    notes=copy_distance_notes, holds=is_copy_distance_table,
    figure=Figure("second-copy bits per byte against distance (dotted: every memory forgotten before each segment)",
                  lambda df: copy_distance_figure(df) if is_copy_distance_table(df) else None)))
