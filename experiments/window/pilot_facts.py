"""A window pilot's own facts, as a shipped suite's would read: each variant against the pilot's floor on
segments >= 1 and beyond-window copyable bytes (paired t 95% over its seeds, Holm over its variants), what its
memory buys, its headroom (Fieller) and its copy at distance, plus its state in numbers. The pilot reruns the
floor and `full` itself, so its facts stand alone; `--shipped SUITE` gives how far they are from that suite's
shipped rows of the same names (the same runs, on another day's code and machine), to read its variants beside
the suite's.

    memzoo compare lm-window-rope3 "methods=[local,full,compressive,infty-former]" "grid.compressive.cmem_len=[256]" \\
        "grid.infty-former.mem_len=[0]" "grid.infty-former.n_basis=[32]" name=lm-window-rope3-states \\
        out_dir=/work/conv/pilot --jobs 2
    python experiments/window/pilot_facts.py /work/conv/pilot/lm-window-rope3-states/results.parquet \\
        --shipped lm-window-rope3 --out experiments/window/pilot_states_rope3.json

A pilot of memory variants alone (its floor rerun, `full` not) borrows the shipped ceiling with `--ceiling-from`:

    memzoo compare lm-window-conv6 "methods=[local,memorizing]" "grid.memorizing.store_size=[null]" \
        "grid.memorizing.knn_layer=[0,1,3]" name=lm-window-conv6-knn out_dir=/work/conv/pilot --jobs 2
    python experiments/window/pilot_facts.py /work/conv/pilot/lm-window-conv6-knn/results.parquet \
        --shipped lm-window-conv6 --ceiling-from lm-window-conv6 --out experiments/window/pilot_knn_layer_conv6.json
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from memzoo.analysis.bpb import CEILING
from memzoo.analysis.stats import REFERENCE
from memzoo.publishing.facts import copy_facts, window_facts
from memzoo.publishing.references import load_references

# The facts kept: each variant's table numbers (headroom_corrected, net of segment 0, included), copy at distance.
KEPT = (".after", ".beyond", ".buys", ".seg0", ".headroom", ".headroom_beyond", ".sig_after", ".copy_random_",
        "holm.", "ceiling.")


def controls_drift(rows: pd.DataFrame, shipped: pd.DataFrame) -> dict[str, float]:
    """Run name -> the pilot's floor or `full` run's valid bits per byte less the shipped run's (NaN: none shipped)."""
    ours = rows[rows["method"].isin([REFERENCE, CEILING])].set_index("name")["valid_bpb"]
    theirs = shipped.set_index("name")["valid_bpb"]
    return {name: float(value - theirs.get(name, float("nan"))) for name, value in ours.items()}


def with_shipped_ceiling(rows: pd.DataFrame, shipped: pd.DataFrame) -> pd.DataFrame:
    """The pilot's rows plus the shipped suite's `full` runs at the pilot's seeds (its own, if it has any, kept)."""
    if (rows["method"] == CEILING).any():
        return rows
    ceiling = shipped[(shipped["method"] == CEILING) & shipped["seed"].isin(rows["seed"].unique())]
    return pd.concat([rows, ceiling], ignore_index=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", type=Path, help="the pilot's results.parquet")
    ap.add_argument("--shipped", default=None, help="report the pilot's floor and full runs less this suite's shipped runs of the same names")
    ap.add_argument("--ceiling-from", default=None, help="a pilot that did not rerun `full`: add this suite's shipped "
                    "`full` rows at the pilot's seeds (with --shipped, which shows whether the pilot's floor is the shipped one)")
    ap.add_argument("--out", type=Path, default=None, help="write the facts as JSON here")
    args = ap.parse_args()
    own = rows = pd.read_parquet(args.results)
    if args.ceiling_from:
        rows = with_shipped_ceiling(rows, load_references(args.ceiling_from))
    facts = {**window_facts(rows), **copy_facts(rows)}
    out = {"facts": {k: v for k, v in sorted(facts.items()) if any(part in k for part in KEPT) and "_mean" not in k},
           "state": {str(n).rsplit("-s", 1)[0]: int(s) for n, s in zip(rows["name"], rows["footprint_analytic"])}}
    if args.shipped:
        out["controls_minus_shipped"] = controls_drift(own, load_references(args.shipped))  # the pilot's own runs only
    if args.ceiling_from and not (own["method"] == CEILING).any():
        out["ceiling_from"] = args.ceiling_from
    text = json.dumps(out, indent=1, ensure_ascii=False)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
