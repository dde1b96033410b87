"""Recall against distance, streamed: a model trained on recall across segments (the `distance`
suite's gap curriculum) evaluated with its answers exactly G segments before its queries, for gaps
far past those it was trained on.

Per gap G: `trials` examples of the run's own layout (memzoo.data.tasks.segment_recall_batch at the
fixed gap G: its pairs, local queries, alphabet and rewrites as trained). The pairs open segment 0,
the R rewrites fill segments 1..R, filler fills the G - 1 segments after the last write, and the
queries open segment R + G: every scored answer was written exactly G segments before its query.
Everything before the queries' segment is streamed through the state (StreamingDecoder: the live
activations are `segments_per_call` segments, whatever G), then the queries' segment is fed for
its logits. The same examples are streamed twice in one batch: as they are, and with the state
reset right after the last write (the pairs' segment, or the last rewrite's): the reset ablation,
where accuracy must fall to `recall_chance` if the memory carried the answers.

Scored as the capacity suite scores (memzoo.running.capacity): teacher-forced argmax at each key's
first query; `recall_chance` guesses uniformly among the written values of the same examples; with
rewrites, `recall_stale` (an earlier value of the key) and `recall_stale_chance`. One row per
(gap, reset) with the hits per example (every run sees the same examples at a gap: the paired
bootstrap's units), throughput and the process's peak resident memory.

Rows are kept in RUN_DIR/distance.json and in the run's result.json under "distance", written
after every gap; a gap already measured with these settings and weights is skipped. A gap past its
time or memory budget gives rows with status "out of budget: ..." and no accuracy, and the longer
gaps are then not tried (each costs more than the one before).
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch

from memzoo.core.model import MemoryModel
from memzoo.data.tasks import SegmentRecallExample, recall_chance, segment_recall_batch
from memzoo.running.capacity import accuracy, hits_by_example, rewrite_metrics
from memzoo.running.checkpoints import load_trained
from memzoo.running.configure import load_run_config
from memzoo.running.evaluate import peak_rss_mb
from memzoo.running.generate import StreamingDecoder
from memzoo.running.longrange import (OutOfBudget, _Meter, _atomic_json, _merge_into_result, _stream, total_memory_mb,
                                      weights_id)
from memzoo.running.recall_stream import training_layout

DEFAULT_GAPS = [1, 2, 4, 8, 16, 64, 256, 1024, 4096]


@dataclass
class DistanceConfig:
    """What the distance evaluation measures and its budget per gap."""

    task: str = "distance"  # the kind of a suite's `longrange:` entry (memzoo.suites.compare)
    gaps: list[int] = field(default_factory=lambda: list(DEFAULT_GAPS))  # segments from the last write to the queries
    trials: int = 64  # examples per gap (the same for every run: they depend on `seed` and the gap only)
    seed: int = 0
    reset: bool = True  # also the reset ablation, on the same examples in the same batch
    segments_per_call: int = 64  # segments per model call while streaming (bounds the live activations)
    time_limit_s: Optional[float] = 900.0  # per gap; None = no limit
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
        return {"time_limit_s": self.time_limit_s, "memory_limit_mb": self.memory_limit_mb or round(0.6 * total_memory_mb())}


def distance_batch(layout: dict[str, int], gap: int, trials: int, segment_len: int, seed: int):
    """The examples of one gap: the run's layout at the fixed gap, deterministic in (seed, gap)."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + gap)
    return segment_recall_batch(gen, trials, segment_len, layout["pairs"], layout["queries"], gap,
                                layout["local_queries"], layout["alphabet"], rewrites=layout["rewrites"])


def recall_scores(predicted: list[list[int]], examples: list[SegmentRecallExample]) -> dict[str, Any]:
    """A row's scores from the argmax bytes at each example's scored positions: recall_accuracy,
    recall_chance, the hits and queries per example, and with rewrites recall_stale and its chance."""
    chance = [c for e in examples for c in recall_chance(e)]
    return {"recall_accuracy": accuracy(predicted, examples), "recall_chance": sum(chance) / max(len(chance), 1),
            **rewrite_metrics(predicted, examples), "scored": len(chance),
            "recall_hits_by_example": hits_by_example(predicted, examples),
            "recall_queries_by_example": [len(e.scored_positions) for e in examples]}


def gap_rows(model: MemoryModel, gap: int, cfg: DistanceConfig, layout: dict[str, int], meter: _Meter,
             precision: str = "fp32", progress: bool = False) -> list[dict[str, Any]]:
    """The rows of one gap: plain (and reset, with cfg.reset), streamed as one batch."""
    n = model.cfg.segment_len
    batch = distance_batch(layout, gap, cfg.trials, n, cfg.seed)
    examples = [batch.example(row) for row in range(cfg.trials)]
    arms = [False, True] if cfg.reset else [False]
    data = batch.tokens.to(torch.uint8).repeat(len(arms), 1)  # [A B, (R + G + 1) N]: plain rows, then reset rows
    decoder = StreamingDecoder(model, data.shape[0], cfg.segments_per_call, precision)
    last_write = int(batch.pairs_segment[0]) + layout["rewrites"]  # the pairs open segment 0
    decoder.reset_at = torch.tensor([last_write + 1 if reset else -1 for reset in arms for _ in examples])  # [A B]
    query = batch.query_segment * n  # the queries' segment's first byte
    seconds = _stream(decoder, data[:, :query], meter, f"distance {gap:,}", progress)
    logits = decoder.feed(data[:, query:].long(), return_logits=True)  # [A B, N, V]: the queries' segment
    rows = []
    for a, reset in enumerate(arms):
        predicted = [logits[a * len(examples) + i, [p - query for p in e.scored_positions]].argmax(-1).cpu().tolist()
                     for i, e in enumerate(examples)]
        rows.append({"gap_segments": gap, "reset_after_pairs": reset, "status": "ok",
                     **recall_scores(predicted, examples), "tokens": data.shape[1], "seconds": seconds,
                     "tokens_per_s": data.numel() / max(seconds, 1e-9)})
    return rows


def _reusable(row: dict[str, Any], cfg: DistanceConfig, weights: str) -> bool:
    """Measured with these settings and weights, and not out of a budget smaller than this one."""
    if row.get("weights") != weights or any(row.get(k) != v for k, v in cfg.settings().items()):
        return False
    if row.get("status") == "ok":
        return True
    inf = float("inf")
    return all((row.get(k) or inf) >= (v or inf) for k, v in cfg.budget().items())


def _done(rows: list[dict[str, Any]], gap: int, cfg: DistanceConfig, weights: str) -> bool:
    want = {False, True} if cfg.reset else {False}
    return want <= {r["reset_after_pairs"] for r in rows if r["gap_segments"] == gap and _reusable(r, cfg, weights)}


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
    ran_out: Optional[int] = None
    for gap in sorted(set(cfg.gaps)):
        if resume and _done(kept, gap, cfg, weights):
            if ran_out is None and any(r["gap_segments"] == gap and r["status"] != "ok" for r in kept):
                ran_out = gap  # out of budget before: the longer gaps would be too
            continue
        meter = _Meter(cfg)
        if ran_out is not None:
            rows = [{"gap_segments": gap, "reset_after_pairs": reset, "status": f"out of budget: gap {ran_out} ran out",
                     "recall_accuracy": None} for reset in ([False, True] if cfg.reset else [False])]
        else:
            start = time.perf_counter()
            try:
                rows = gap_rows(model, gap, cfg, layout, meter, run_cfg.train.precision, progress)
            except OutOfBudget as err:
                ran_out = gap
                rows = [{"gap_segments": gap, "reset_after_pairs": reset, "status": f"out of budget: {err}",
                         "recall_accuracy": None, "seconds": time.perf_counter() - start}
                        for reset in ([False, True] if cfg.reset else [False])]
        rows = [{**base, **r, "peak_rss_mb": peak_rss_mb()} for r in rows]
        keys = {(r["gap_segments"], r["reset_after_pairs"]) for r in rows}
        kept = [r for r in kept if (r["gap_segments"], r["reset_after_pairs"]) not in keys] + rows
        kept.sort(key=lambda r: (r["gap_segments"], r["reset_after_pairs"]))
        _atomic_json(store, kept)
        _merge_into_result(run_dir, "distance", kept)
    wanted = set(cfg.gaps)
    return [r for r in kept if r["gap_segments"] in wanted and _reusable(r, cfg, weights)]
