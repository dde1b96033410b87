"""ARMT's write from raw and from unit-RMS memory-token outputs (`write_norm`): recall
against the gap per variant (mean over seeds ± 95% t) and each variant minus the paper's, paired by
seed (the same backbone weights, batches and examples at a seed), with the per-example bootstrap.

    python experiments/distance/armt_write_norm.py RESULTS_DIR [RESULTS_DIR ...]

RESULTS_DIR: distance suite folders holding ARMT runs (results.parquet); runs made before the option
existed are the paper's write (write_norm none).
"""
from __future__ import annotations

import sys

import pandas as pd

from memzoo.analysis import load_results
from memzoo.analysis.distance import distance_summary, distance_versus


def main(folders: list[str]) -> None:
    df = pd.concat([load_results(f"{f}/results.parquet") for f in folders], ignore_index=True)
    df["grid_write_norm"] = df.get("grid_write_norm", pd.Series(index=df.index, dtype=object)).fillna("none")
    summary = distance_summary(df)
    wide = summary.pivot_table(index="gap_segments", columns="variant", values=["accuracy", "accuracy_ci", "reset"])
    pd.set_option("display.width", 200)
    print("recall accuracy, mean over seeds (± 95% t), and the reset ablation's mean")
    for variant in sorted(summary["variant"].unique()):
        cells = [f"{g}: {wide.loc[g, ('accuracy', variant)]:.3f} ± {wide.loc[g, ('accuracy_ci', variant)]:.3f} "
                 f"(reset {wide.loc[g, ('reset', variant)]:.2f})" for g in wide.index]
        print(f"  {variant}\n    " + "\n    ".join(cells))
    print("\nminus the paper's write, paired by seed")
    for variant in sorted(v for v in summary["variant"].unique() if not v.endswith("none")):
        print(distance_versus(df, variant, "armt write_norm=none").round(3).to_string(index=False))


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
