"""Is a short gap out of the training distribution? (a protocol check of the `distance` suite.) The `distance`
suite's last stage draws each row's gap G in [1, G_max] and opens the shorter rows with G_max - G
filler segments before the pairs, so in training the memory has always read G_max - 1 segments of
filler before the queries, whatever G. The streamed evaluation opens with the pairs: at G < G_max it
reads less filler than any training row did. This benchmark scores the same examples both ways:

    stream    the pairs open the sequence, G - 1 filler segments, the queries (memzoo distance's layout)
    trained   G_max - G filler segments first, then the same bytes (the training rows' layout)

with the state reset before the queries' segment as the ablation. A memory whose recall at G < G_max
differs between the two reads the filler's amount, not only the pairs.

    python benchmarks/filler_before.py RUN_DIR [RUN_DIR ...] [--trials 64] [--out results/bench]

Appends one row per (run, gap, layout) to filler_before.csv and prints them.
"""
from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from typing import Any

from memzoo.data.tasks import SegmentRecallExample, _filler
from memzoo.running.bench_table import append_rows
from memzoo.running.capacity import accuracy, predict_scored
from memzoo.running.checkpoints import load_trained
from memzoo.running.distance import distance_batch
from memzoo.running.recall_stream import training_layout


def with_filler_before(example: SegmentRecallExample, segments: int, segment_len: int) -> SegmentRecallExample:
    """The example opened by `segments` segments of filler text (the training rows' prefix): the same
    pairs, gap and queries, every position shifted by segments x segment_len."""
    shift = segments * segment_len
    return replace(example, tokens=_filler(shift) + example.tokens,
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="trained run folders of the distance suite (its last stage)")
    ap.add_argument("--trials", type=int, default=64)
    ap.add_argument("--out", default="results/bench")
    args = ap.parse_args()
    path = Path(args.out) / "filler_before.csv"
    for run in args.runs:
        rows = layout_rows(run, args.trials)
        append_rows(path, rows)
        print(f"{run} ({rows[0]['method']}, seed {rows[0]['seed']}, trained to {rows[0]['trained_gap']})")
        for r in rows:
            print(f"  gap {r['gap_segments']:>2}  {r['layout']:7s} (filler before: {r['filler_before']} segments)  "
                  f"recall {r['recall_accuracy']:.2f}  reset {r['recall_accuracy_reset']:.2f}", flush=True)
    print(f"appended to {path}")


if __name__ == "__main__":
    main()
