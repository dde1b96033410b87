"""A distance figure with rows beyond the shipped ones: the shipped `distance` references and the
given result folders, one line per variant, a point only where every seed of that variant was
measured. The README's figure is drawn from the shipped rows alone by `memzoo figures`; this draws
the fuller one from local result folders (e.g. ARMT, and RMT with stage 1 at 20,000 steps, whose
rows are not shipped).

    python experiments/distance/figure.py OUT.png [RESULTS_DIR ...] [--drop METHOD ...]

RESULTS_DIR: distance suite folders (results.parquet). E.g. (2026-11-26):
    python experiments/distance/figure.py distance-all.png --drop rmt \\
        RMT20K RMT20K_S12 ARMT_S0 ARMT_S1 ARMT_S2 ARMT_RMS_KV
(--drop rmt: the shipped 5,000-step RMT sits on the recall plateau; the folders with stage 1 at
20,000 steps, seed 0 and seeds 1-2, replace it).
"""
from __future__ import annotations

import argparse

import pandas as pd

from memzoo.analysis import load_results
from memzoo.analysis.distance import common_gaps_only, distance_curves
from memzoo.publishing.references import load_references


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("folders", nargs="*")
    ap.add_argument("--drop", action="append", default=[], help="a shipped method to leave out (repeatable)")
    args = ap.parse_intermixed_args()
    shipped = load_references("distance")
    df = pd.concat([shipped[~shipped["method"].isin(args.drop)],
                    *(load_results(f"{f}/results.parquet") for f in args.folders)], ignore_index=True)
    if "grid_write_norm" in df:  # ARMT runs from before the option are the paper's write
        armt = df["method"] == "armt"
        df.loc[armt, "grid_write_norm"] = df.loc[armt, "grid_write_norm"].fillna("none")
    distance_curves(common_gaps_only(df)).savefig(args.out, dpi=110, bbox_inches="tight")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
