"""Recall against distance, streamed: a model trained on recall across segments (the `distance`
suite's gap curriculum) evaluated with its answers exactly G segments before its queries, for gaps
far past those it was trained on.

The examples: `trials` of the run's own layout (memzoo.data.recall.segment_recall_batch: its pairs,
local queries, alphabet and rewrites as trained), the same for every gap and every run (they depend
on `seed` alone). The pairs open segment 0, the R rewrites fill segments 1..R, filler follows. At
gap G the queries' segment is segment R + G: every scored answer was written exactly G segments
before its query (`gap_tokens` gives the examples at G). One stream serves every gap: the examples
of the longest gap are fed segment by segment through the state (StreamingDecoder: the live
activations are `segments_per_call` segments, whatever G), and at segment R + G the queries'
segment is read from the state without committing it (a probe), so the stream goes on as if no
query had been asked: the same computation as streaming the examples at G alone, for the cost of
the longest gap. The same examples are streamed twice in one batch: as they are, and with the state
reset right after the last write (the pairs' segment, or the last rewrite's): the reset ablation,
where accuracy must fall to `recall_chance` if the memory carried the answers.

Scored as the capacity suite scores (memzoo.evaluations.capacity): teacher-forced argmax at each key's
first query; `recall_chance` guesses uniformly among the written values of the same examples; with
rewrites, `recall_stale` (an earlier value of the key) and `recall_stale_chance`. One row per
(gap, reset) with the hits per example (every run sees the same examples at a gap: the paired
bootstrap's units), throughput and the process's peak resident memory.

Rows are kept in RUN_DIR/distance.json and in the run's result.json under "distance", written
as the stream reaches each gap; a gap already measured with these settings and weights is not
measured again (the stream runs to the longest gap still missing). A stream past its time or memory
budget gives the gaps it did not reach rows with status "out of budget: ..." and no accuracy; a
later evaluation under the same budget does not try them again.
"""
from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional

import torch
from torch import Tensor

from memzoo.core.model import MemoryModel
from memzoo.data.recall import SegmentRecallBatch, SegmentRecallExample, recall_chance, segment_recall_batch
from memzoo.evaluations.capacity import accuracy, hits_by_example, rewrite_metrics
from memzoo.runs.checkpoints import load_trained
from memzoo.runs.configure import load_run_config
from memzoo.evaluations.run_result import peak_rss_mb
from memzoo.analysis.distance import distance_curves, is_distance_table
from memzoo.evaluations.registry import (Command, Evaluation, Figure, Score, add_stream_options, fmt, numbers,
                                         register_evaluation)
from memzoo.evaluations.reporting import distance_notes, distance_sections, distance_summary_display
from memzoo.evaluations.generate import StreamingDecoder
from memzoo.evaluations.harness import (Meter, OutOfBudget, atomic_json, default_budget, merge_into_result, reusable, stream,
                                    weights_id)
from memzoo.evaluations.recall_stream import training_layout

DEFAULT_GAPS = [1, 2, 4, 8, 16, 64, 256, 1024, 4096]
EXAMPLES_STREAM = 24  # the examples' generator: seed x 1,000,003 + this (no other evaluation draws from it)


@dataclass
class DistanceConfig:
    """What the distance evaluation measures and its budget per gap."""

    task: str = "distance"  # the kind of a suite's `longrange:` entry (memzoo.suites.compare)
    gaps: list[int] = field(default_factory=lambda: list(DEFAULT_GAPS))  # segments from the last write to the queries
    trials: int = 64  # examples per gap (the same for every run: they depend on `seed` and the gap only)
    seed: int = 0
    reset: bool = True  # also the reset ablation, on the same examples in the same batch
    segments_per_call: int = 64  # segments per model call while streaming (bounds the live activations)
    time_limit_s: Optional[float] = 900.0  # the whole stream (every gap); None = no limit
    memory_limit_mb: Optional[float] = None  # resident memory; None = 60% of physical memory
    threads: int = 0  # torch threads; 0 = torch's default

    def __post_init__(self) -> None:
        if self.task != "distance":
            raise ValueError(f"distance task={self.task!r}; expected 'distance'")
        if not self.gaps or min(self.gaps) < 1:
            raise ValueError(f"distance gaps={self.gaps}; expected a non-empty list of segment counts >= 1")
        if self.trials < 1:
            raise ValueError(f"distance trials={self.trials}; expected >= 1")
        if self.segments_per_call < 1:
            raise ValueError(f"distance segments_per_call={self.segments_per_call}; expected >= 1")

    def settings(self) -> dict[str, Any]:
        """The options that change results (rows measured under others are not reused)."""
        return {"trials": self.trials, "example_seed": self.seed}

    def budget(self) -> dict[str, Optional[float]]:
        """The limits a row was measured under (an out-of-budget row is retried under larger ones)."""
        return default_budget(self.time_limit_s, self.memory_limit_mb)


def distance_batch(layout: dict[str, int], gap: int, trials: int, segment_len: int, seed: int) -> SegmentRecallBatch:
    """The examples of an evaluation whose longest gap is `gap`: the run's layout at that fixed gap,
    deterministic in `seed` alone, so every gap and every run sees the same pairs and queries."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + EXAMPLES_STREAM)
    return segment_recall_batch(gen, trials, segment_len, layout["pairs"], layout["queries"], gap,
                                layout["local_queries"], layout["alphabet"], rewrites=layout["rewrites"])


def gap_tokens(batch: SegmentRecallBatch, gap: int, segment_len: int) -> Tensor:
    """[B, (R + gap + 1) N]: the examples at `gap` that a stream probed there reads: the batch's
    writes and the filler after them up to segment R + gap - 1, then its queries' segment."""
    last_write = int(batch.pairs_segment.max()) + batch.rewrites
    longest = batch.query_segment - last_write
    if not 1 <= gap <= longest or bool((batch.pairs_segment != batch.pairs_segment[0]).any()):
        raise ValueError(f"distance gap={gap}; expected 1..{longest} (the batch's longest gap) in a batch of one layout")
    last = batch.query_segment * segment_len  # the queries' segment of the longest gap
    return torch.cat((batch.tokens[:, : (last_write + gap) * segment_len], batch.tokens[:, last:]), 1)


def query_offsets(batch: SegmentRecallBatch, examples: list[SegmentRecallExample], segment_len: int) -> list[list[int]]:
    """Each example's scored positions counted from the start of the queries' segment (what a peek of it returns)."""
    start = batch.query_segment * segment_len
    return [[p - start for p in e.scored_positions] for e in examples]


def recall_scores(predicted: list[list[int]], examples: list[SegmentRecallExample]) -> dict[str, Any]:
    """A row's scores from the argmax bytes at each example's scored positions: recall_accuracy,
    recall_chance, the hits and queries per example, and with rewrites recall_stale and its chance."""
    chance = [c for e in examples for c in recall_chance(e)]
    return {"recall_accuracy": accuracy(predicted, examples), "recall_chance": sum(chance) / max(len(chance), 1),
            **rewrite_metrics(predicted, examples), "scored": len(chance),
            "recall_hits_by_example": hits_by_example(predicted, examples),
            "recall_queries_by_example": [len(e.scored_positions) for e in examples]}


def stream_gaps(model: MemoryModel, gaps: list[int], cfg: DistanceConfig, layout: dict[str, int], meter: Meter,
                precision: str = "fp32", progress: bool = False) -> Iterator[list[dict[str, Any]]]:
    """The rows of every gap, shortest first, from one stream: the examples of the longest gap fed
    segment by segment, and at segment R + G the queries' segment read from the state without
    committing it (StreamingDecoder.peek), so the stream goes on as if no query had been asked. The
    reset arm's rows (cfg.reset) are the same examples, their state reset after the last write, in
    the same batch. Yields each gap's rows as soon as the stream reaches it; raises OutOfBudget."""
    n = model.cfg.segment_len
    gaps = sorted(set(gaps))
    batch = distance_batch(layout, gaps[-1], cfg.trials, n, cfg.seed)
    examples = [batch.example(row) for row in range(cfg.trials)]
    arms = [False, True] if cfg.reset else [False]
    data = batch.tokens.to(torch.uint8).repeat(len(arms), 1)  # [A B, (R + G_max + 1) N]: plain rows, then reset rows
    query = data[:, batch.query_segment * n :].long()  # [A B, N]: the queries' segment
    decoder = StreamingDecoder(model, data.shape[0], cfg.segments_per_call, precision)
    last_write = int(batch.pairs_segment[0]) + layout["rewrites"]  # the pairs open segment 0
    decoder.reset_at = torch.tensor([last_write + 1 if reset else -1 for reset in arms for _ in examples])  # [A B]
    total, done, seconds = batch.query_segment * n, 0, 0.0
    offsets = query_offsets(batch, examples, n)
    for gap in gaps:
        stop = (last_write + gap) * n  # the segments before the queries' segment at this gap
        seconds += stream(decoder, data[:, done:stop], meter, f"distance {gap:,}", progress, offset=done, total=total)
        done = stop
        start = time.perf_counter()
        logits = decoder.peek(query)  # [A B, N, V]
        seconds += time.perf_counter() - start
        rows = []
        for a, reset in enumerate(arms):
            predicted = [logits[a * len(examples) + i, offsets[i]].argmax(-1).cpu().tolist() for i in range(len(examples))]
            rows.append({"gap_segments": gap, "reset_after_pairs": reset, "status": "ok",
                         **recall_scores(predicted, examples), "tokens": stop + n, "seconds": seconds,
                         "tokens_per_s": data.shape[0] * (stop + n) / max(seconds, 1e-9)})
        yield rows


def _done(rows: list[dict[str, Any]], gap: int, cfg: DistanceConfig, weights: str) -> bool:
    """Reusable rows of this gap are there for every arm (plain, and reset with cfg.reset)."""
    want = {False, True} if cfg.reset else {False}
    return want <= {r["reset_after_pairs"] for r in rows if r["gap_segments"] == gap and reusable(r, cfg, weights)}


def evaluate_distance(run_dir: str | Path, cfg: DistanceConfig, resume: bool = True, progress: bool = True,
                      model: Optional[MemoryModel] = None) -> list[dict[str, Any]]:
    """Every gap of `cfg` for the trained run in `run_dir` (shortest first), in this process;
    returns this evaluation's rows and keeps them in RUN_DIR/distance.json and result.json.
    `model`: evaluate this model instead of loading the run's checkpoint."""
    run_dir = Path(run_dir)
    if not (run_dir / "checkpoint.pt").is_file():
        raise FileNotFoundError(f"{run_dir} has no checkpoint.pt: train the run before evaluating it")
    run_cfg = load_run_config(run_dir)
    model = model if model is not None else load_trained(run_dir)[1]
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    layout = training_layout(run_cfg.task)
    weights = weights_id(run_dir)
    store = run_dir / "distance.json"
    kept: list[dict[str, Any]] = json.loads(store.read_text()) if store.is_file() else []
    base = {"method": str(run_cfg.memory.name), "weights": weights, **layout, **cfg.settings(), **cfg.budget(),
            "trained_gap": int(run_cfg.task.gap_segments)}
    arms = [False, True] if cfg.reset else [False]

    def keep(rows: list[dict[str, Any]]) -> None:
        nonlocal kept
        rows = [{**base, **r, "peak_rss_mb": peak_rss_mb()} for r in rows]
        keys = {(r["gap_segments"], r["reset_after_pairs"]) for r in rows}
        kept = sorted([r for r in kept if (r["gap_segments"], r["reset_after_pairs"]) not in keys] + rows,
                      key=lambda r: (r["gap_segments"], r["reset_after_pairs"]))
        atomic_json(store, kept)
        merge_into_result(run_dir, "distance", kept)

    todo = [g for g in sorted(set(cfg.gaps)) if not (resume and _done(kept, g, cfg, weights))]
    ran_out = [g for g in sorted(set(cfg.gaps)) if g not in todo and any(
        r["gap_segments"] == g and r["status"] != "ok" and reusable(r, cfg, weights) for r in kept)]
    if ran_out:  # out of budget before: the longer gaps need the same stream and more
        keep([{"gap_segments": g, "reset_after_pairs": a, "status": f"out of budget: gap {ran_out[0]} ran out",
               "recall_accuracy": None} for g in todo if g > ran_out[0] for a in arms])
        todo = [g for g in todo if g < ran_out[0]]
    if todo:
        meter = Meter(cfg, project=False)  # every gap reached is kept: run to the limit, not to a projection
        reached: list[int] = []
        try:
            for rows in stream_gaps(model, todo, cfg, layout, meter, run_cfg.train.precision, progress):
                reached.append(rows[0]["gap_segments"])
                keep(rows)
        except OutOfBudget as err:
            keep([{"gap_segments": g, "reset_after_pairs": a, "status": f"out of budget: {err}", "recall_accuracy": None}
                  for g in todo if g not in reached for a in arms])
    wanted = set(cfg.gaps)
    return [r for r in kept if r["gap_segments"] in wanted and reusable(r, cfg, weights)]


def _arguments(s: argparse.ArgumentParser) -> None:
    s.add_argument("run_dir", help="a run trained on task recall (e.g. a distance suite's run)")
    s.add_argument("--gaps", type=numbers(int, "--gaps"), default=list(DEFAULT_GAPS),
                   help="gaps in segments, comma-separated (default the distance suite's 1..4096)")
    s.add_argument("--trials", type=int, default=64, help="examples per gap (the same for every run at a seed)")
    s.add_argument("--no-reset", action="store_true", help="skip the reset ablation (the state reset after the last write)")
    add_stream_options(s, segments_per_call=64, time_limit="seconds for the whole stream before 'out of budget' (0: none)")


def _options(args: argparse.Namespace) -> dict[str, Any]:
    return dict(gaps=args.gaps, trials=args.trials, seed=args.seed, reset=not args.no_reset,
                segments_per_call=args.segments_per_call, time_limit_s=args.time_limit or None,
                memory_limit_mb=args.memory_limit_mb, threads=args.threads)


def _shown(r: dict[str, Any]) -> dict[str, Any]:
    return {"gap": f"{r['gap_segments']:,}", "reset": "yes" if r["reset_after_pairs"] else "",
            "accuracy": fmt(r.get("recall_accuracy"), ".3f"), "chance": fmt(r.get("recall_chance"), ".3f"),
            "stale": fmt(r.get("recall_stale"), ".3f"), "status": str(r["status"])[:90]}


def recall_past_training(distance_json: object) -> float:
    """A distance run's mean recall over the streamed gaps longer than its largest trained gap
    (log-spaced, so the area under its curve on the figure's axis); the reset arm and the gaps out
    of the stream's budget are left out. NaN for a run without such gaps."""
    if not isinstance(distance_json, str):
        return math.nan
    scores = [float(r["recall_accuracy"]) for r in json.loads(distance_json)
              if not r["reset_after_pairs"] and r.get("recall_accuracy") is not None
              and int(r["gap_segments"]) > int(r["trained_gap"])]
    return sum(scores) / len(scores) if scores else math.nan


register_evaluation(Evaluation("distance", DistanceConfig, evaluate_distance, Command(
    "recall of a recall-trained run at each gap (segments from the last write), streamed", _arguments, _options,
    _shown, ["gap", "reset", "accuracy", "chance", "stale", "status"], "distance.json"),
    # every memory is at about 1.0 at the gaps it was trained on: ranked on what it carries past them
    scores=(Score("recall_past_training", True, lambda row: recall_past_training(row["distance_json"])),),
    section=distance_sections, notes=distance_notes, summary=distance_summary_display, holds=is_distance_table,
    replaces=("capacity",),  # its runs are capacity-trained: their report is the distance one
    figure=Figure("Recall accuracy against the gap between the last write and the queries (segments, log): mean over "
                  "seeds with the 95% t interval; dashed: the state reset after the last write; grey: chance",
                  distance_curves)))
