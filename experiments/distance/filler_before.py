"""Is a short gap out of the training distribution? Recall in the stream's and the training's layout.
The command line of memzoo.diagnose.filler_before, its rows appended to a table under --out.

    python experiments/distance/filler_before.py RUN_DIR [RUN_DIR ...] [--trials 64] [--out results/bench]
"""
from __future__ import annotations

from pathlib import Path

from memzoo.diagnose.filler_before import layout_rows
from memzoo.diagnose.table import append_rows, runs_parser


def main() -> None:
    ap = runs_parser(__doc__, "", trials=64)
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
