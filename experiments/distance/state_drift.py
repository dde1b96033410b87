"""What a memory's state holds as the gap grows: drift and filler against the pairs' write, per state tensor.
The command line of memzoo.diagnose.state_drift, its rows appended to a table under --out.

    python experiments/distance/state_drift.py RUN_DIR [RUN_DIR ...] [--gaps 8,64,512,4096] [--trials 32] [--float64] [--set KEY=VALUE] [--out results/bench]
"""
from __future__ import annotations

from pathlib import Path

from memzoo.diagnose.state_drift import drift_rows
from memzoo.diagnose.table import append_rows, gap_list, runs_parser


def main() -> None:
    ap = runs_parser(__doc__, "", gaps="8,64,512,4096")
    ap.add_argument("--states", default=None, help="comma-separated substrings: print only state tensors matching one")
    ap.add_argument("--float64", action="store_true", help="weights and state in float64 (does the overflow cause the misses?)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="change a memory option of the trained model for the stream (e.g. norm_floor=0)")
    args = ap.parse_args()
    options = dict(kv.split("=", 1) for kv in args.set)
    path = Path(args.out) / "state_drift.csv"
    gaps = gap_list(args.gaps)
    for run in args.runs:
        rows = drift_rows(run, gaps, args.trials, float64=args.float64, options=options)
        append_rows(path, rows)
        print(f"{run} ({rows[0]['method']}, seed {rows[0]['seed']}): medians over the rows whose state is finite; "
              f"'overflowed': rows with inf or NaN in any state tensor")
        for r in rows:
            if args.states and not any(x in r["state"] for x in args.states.split(",")):
                continue
            print(f"  gap {r['gap_segments']:>5}  {r['state']:10s} recall {r['recall_accuracy']:.2f} (finite rows "
                  f"{r['recall_finite_rows']:.2f}, overflowed {r['recall_nonfinite_rows']:.2f})  overflowed "
                  f"{r['nonfinite_rows']:.2f}  log10|S| {r['log10_norm_median']:6.1f}  drift {r['drift_median']:.3g}  "
                  f"filler {r['filler_over_write_median']:.3g}", flush=True)
    print(f"appended to {path}")


if __name__ == "__main__":
    main()
