"""How strongly ARMT writes, segment by segment: β, |k|, |v| and the delta gain per layer.
The command line of memzoo.diagnose.armt_write_gate, its rows appended to a table under --out.

    python experiments/distance/armt_write_gate.py RUN_DIR [RUN_DIR ...] [--segments 40] [--trials 32] [--out results/bench]
"""
from __future__ import annotations

from pathlib import Path

from memzoo.diagnose.armt_write_gate import write_gate_rows
from memzoo.diagnose.table import append_rows, runs_parser


def main() -> None:
    ap = runs_parser(__doc__, "ARMT")
    ap.add_argument("--segments", type=int, default=40, help="segments streamed: the pairs' and the filler after them")
    args = ap.parse_args()
    if args.segments < 2:
        ap.error(f"--segments {args.segments}; expected >= 2 (the pairs' segment and some filler)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "armt_write_gate.csv"
    for run in args.runs:
        rows = write_gate_rows(run, args.segments, args.trials)
        print(f"{run} (write_norm {rows[0]['write_norm']}, seed {rows[0]['seed']})")
        for r in rows:
            print(f"  layer {r['layer']} {r['phase']:6s} ({r['segments']:3d} segments): beta median {r['beta_median']:.2e}, "
                  f"shut {r['beta_shut_share']:.2f}, |k| {r['k_norm_median']:.2e}, |v| {r['v_norm_median']:.2e}, "
                  f"non-finite {r['nonfinite_share']:.2f}, delta gain {r['gain_median']:.2f} (> 2: {r['gain_over_2_share']:.2f})")
        append_rows(path, rows)
    print(f"appended to {path}")


if __name__ == "__main__":
    main()
