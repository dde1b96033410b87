"""How much of Infini-attention's memory read is the pairs' as the gap grows (the linear rule).
The command line of memzoo.diagnose.infini_pairs_share, its rows appended to a table under --out.

    python experiments/distance/infini_pairs_share.py RUN_DIR [RUN_DIR ...] [--gaps 8,64,256,1024,4096] [--trials 32] [--out results/bench]
"""
from __future__ import annotations

from pathlib import Path

from memzoo.diagnose.infini_pairs_share import share_rows
from memzoo.diagnose.table import append_rows, gap_list, runs_parser


def main() -> None:
    ap = runs_parser(__doc__, "infini-linear", gaps="8,64,256,1024,4096")
    args = ap.parse_args()
    path = Path(args.out) / "infini_pairs_share.csv"
    for run in args.runs:
        rows = share_rows(run, gap_list(args.gaps), args.trials)
        append_rows(path, rows)
        print(f"{run} (seed {rows[0]['seed']}): per layer, the head whose share is largest (median over examples)")
        for gap in sorted({r["gap_segments"] for r in rows}):
            for layer in sorted({r["layer"] for r in rows}):
                heads = [r for r in rows if r["gap_segments"] == gap and r["layer"] == layer]
                best = max(heads, key=lambda r: r["share_median"])
                print(f"  gap {gap:>5} layer {layer}: recall {best['recall_accuracy']:.2f}  head {best['head']} share "
                      f"{best['share_median']:.3g}  selectivity {best['selectivity_median']:.3g}  gate "
                      f"{best['memory_gate']:.2f}", flush=True)
    print(f"appended to {path}")


if __name__ == "__main__":
    main()
