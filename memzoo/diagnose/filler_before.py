"""Is a short gap out of the training distribution? The `distance`
suite's last stage draws each row's gap G in [1, G_max] and opens the shorter rows with G_max - G
filler segments before the pairs, so in training the memory has always read G_max - 1 segments of
filler before the queries, whatever G. The streamed evaluation opens with the pairs: at G < G_max it
reads less filler than any training row did. This measure scores the same examples both ways:

    stream    the pairs open the sequence, G - 1 filler segments, the queries (memzoo distance's layout)
    trained   G_max - G filler segments first, then the same bytes (the training rows' layout)

with the state reset before the queries' segment as the ablation. A memory whose recall at G < G_max
differs between the two reads the filler's amount, not only the pairs.

    python experiments/distance/filler_before.py RUN_DIR [RUN_DIR ...] [--trials 64] [--out results/bench]

The command line appends one row per (run, gap, layout) to filler_before.csv and prints them.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from memzoo.data.recall import SegmentRecallExample, filler_bytes
from memzoo.evaluations.capacity import accuracy, predict_scored
from memzoo.runs.checkpoints import load_trained
from memzoo.evaluations.distance import distance_batch
from memzoo.evaluations.recall_stream import training_layout


def with_filler_before(example: SegmentRecallExample, segments: int, segment_len: int) -> SegmentRecallExample:
    """The example opened by `segments` segments of filler text (the training rows' prefix): the same
    pairs, gap and queries, every position shifted by segments x segment_len."""
    shift = segments * segment_len
    return replace(example, tokens=filler_bytes(shift) + example.tokens,
                   answer_positions=[p + shift for p in example.answer_positions],
                   scored_positions=[p + shift for p in example.scored_positions],
                   query_segment=example.query_segment + segments, pairs_segment=example.pairs_segment + segments)


def layout_rows(run_dir: str, trials: int, seed: int = 0) -> list[dict[str, Any]]:
    """Recall at every gap 1..G_max of a trained distance run, in the stream's and the training's layout."""
    cfg, model = load_trained(run_dir)
    layout, n, trained = training_layout(cfg.task), model.cfg.segment_len, int(cfg.task.gap_segments)
    rows = []
    for gap in range(1, trained + 1):
        batch = distance_batch(layout, gap, trials, n, seed)  # the distance evaluation's examples at this gap
        stream = [batch.example(row) for row in range(trials)]
        for name, examples in (("stream", stream), ("trained", [with_filler_before(e, trained - gap, n) for e in stream])):
            rows.append({"run": str(run_dir), "method": cfg.memory.name, "seed": cfg.seed, "trained_gap": trained,
                         "gap_segments": gap, "layout": name, "filler_before": 0 if name == "stream" else trained - gap,
                         "trials": trials, "recall_accuracy": accuracy(predict_scored(model, examples), examples),
                         "recall_accuracy_reset": accuracy(predict_scored(model, examples, reset_before_query=True), examples)})
    return rows
