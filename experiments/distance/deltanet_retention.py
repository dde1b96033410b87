"""How much of the pairs' write a (Gated) DeltaNet keeps as filler streams through it.
The command line of memzoo.diagnose.deltanet_retention, its rows appended to a table under --out.

    python experiments/distance/deltanet_retention.py RUN_DIR [RUN_DIR ...] [--gaps 8,16,64,256,1024] [--trials 32] [--out results/bench]
"""
from __future__ import annotations

from pathlib import Path

from memzoo.diagnose.deltanet_retention import SMALL_BETA, retention_rows
from memzoo.diagnose.table import append_rows, gap_list, runs_parser


def main() -> None:
    ap = runs_parser(__doc__, "deltanet / gated-deltanet", gaps="8,16,64,256,1024")
    args = ap.parse_args()
    gaps = gap_list(args.gaps)
    if min(gaps) < 1:
        ap.error(f"--gaps {args.gaps}; expected gaps >= 1 segment")
    path = Path(args.out) / "deltanet_retention.csv"
    for run in args.runs:
        rows = retention_rows(run, gaps, args.trials)
        print(f"{run} ({rows[0]['method']}, seed {rows[0]['seed']}): medians over examples")
        for r in rows:
            print(f"  gap {r['gap_segments']:>5} layer {r['layer']}: recall {r['recall_accuracy']:.2f}  retention "
                  f"{r['retention_median']:.3g}  filler/pairs {r['filler_over_pairs_median']:.3g}  read ratio "
                  f"{r['read_ratio_median']:.3g}  beta pairs {r['beta_pairs_mean']:.3f} filler {r['beta_filler_mean']:.3f} "
                  f"(< {SMALL_BETA}: {r['beta_filler_small_share']:.2f})  log alpha {r['log_alpha_filler_mean']:.2e}  "
                  f"split error {r['split_error']:.1e}", flush=True)
        append_rows(path, rows)
    print(f"appended to {path}")


if __name__ == "__main__":
    main()
