"""What one change to a suite does, run for run: `lm-window-pairs` (pair reads in fine-tuning) or
`lm-window-conv` (the backbone with the convolution on queries and keys) against `lm-window-rope3`, or each of
`lm-window-conv3` to `lm-window-conv6` (that backbone trained further) against the one before it (the same
method and seed; only the change differs, as tests/test_suite_variants.py holds). For every variant in both
suites: bits per byte on segments >= 1 and on beyond-window copyable bytes, and the difference from its own
suite's floor, under each, with the change's effect (variant - base) paired by seed, mean ± the 95% t
half-width over seeds; and second-copy bits per byte by distance (state carried), mean over seeds.

    python experiments/window/finetune_reads.py [--suite lm-window-conv] [--base-suite lm-window-rope3]
        [--base ROWS] [--rows ROWS] [--out FILE.json]

Without --base / --rows it reads the shipped rows of the two suites.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from memzoo.analysis.beyond_window import seed_gains
from memzoo.analysis.copy_distance import copy_distance_long
from memzoo.analysis.stats import REFERENCE, paired_differences, paired_t
from memzoo.publishing.references import load_references

QUANTITIES = ("after", "beyond", "after_vs_floor", "beyond_vs_floor")
BASE = "lm-window-rope3"  # the suite a change is read against unless --base-suite names another


def per_variant(rows: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """Variant -> its runs indexed by seed: bits per byte after segment 0 and on beyond-window copyable
    bytes, and each less its own seed's floor."""
    g = seed_gains(rows)
    floor = g[g["method"] == REFERENCE].set_index("seed")
    out = {}
    for variant, sub in g.groupby("variant", sort=False):
        s = sub.set_index("seed")[["after", "beyond"]]
        out[variant] = s.assign(after_vs_floor=s["after"] - floor["after"], beyond_vs_floor=s["beyond"] - floor["beyond"])
    return out


def protocol_effect(base: pd.DataFrame, changed: pd.DataFrame) -> dict[str, dict[str, dict[str, float]]]:
    """Per variant in both: each quantity under the base suite and the changed one (mean over seeds) and
    changed - base paired by seed (mean, 95% t half-width, p, seeds), the means over the seeds both have."""
    a, b = per_variant(base), per_variant(changed)
    effects = {}
    for variant in [v for v in b if v in a]:
        row, seeds = {}, a[variant].index.intersection(b[variant].index)  # the means too: paired seeds only
        for q in QUANTITIES:
            d = paired_differences(b[variant][q], a[variant][q])
            mean, half, p = paired_t(d)
            row[q] = {"base": round(float(a[variant].loc[seeds, q].mean()), 4),
                      "variant": round(float(b[variant].loc[seeds, q].mean()), 4),
                      "effect": round(mean, 4), "ci": round(half, 4), "p": round(p, 4), "seeds": int(len(d))}
        effects[variant] = row
    return effects


def copying(base: pd.DataFrame, changed: pd.DataFrame, kind: str = "random") -> dict[str, dict[str, list[float]]]:
    """Variant -> distance -> [second copy under the base suite, under the changed one]."""
    a, b = copy_distance_long(base, kind), copy_distance_long(changed, kind)
    merged = a.merge(b, on=["variant", "distance"], suffixes=("_base", "_variant"))
    out: dict[str, dict[str, list[float]]] = {}
    for _, r in merged.iterrows():
        out.setdefault(r["variant"], {})[str(int(r["distance"]))] = [round(r["second_base"], 3), round(r["second_variant"], 3)]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--suite", default="lm-window-pairs", help="the changed suite (e.g. lm-window-conv)")
    ap.add_argument("--base-suite", default=BASE, help="the suite it changes (e.g. lm-window-conv for conv3)")
    ap.add_argument("--base", type=Path, help="the base suite's rows (default: the shipped ones)")
    ap.add_argument("--rows", type=Path, help="the changed suite's rows (default: the shipped ones)")
    ap.add_argument("--out", type=Path, help="write the numbers as JSON here")
    args = ap.parse_args()
    base = pd.read_parquet(args.base) if args.base else load_references(args.base_suite)
    changed = pd.read_parquet(args.rows) if args.rows else load_references(args.suite)
    effects = protocol_effect(base, changed)
    for variant, row in effects.items():
        cells = [f"{q} {r['base']:.3f} -> {r['variant']:.3f} ({r['effect']:+.3f} ± {r['ci']:.3f}, {r['seeds']} seeds)"
                 for q, r in row.items()]
        print(f"{variant}:\n  " + "\n  ".join(cells))
    copy = {kind: copying(base, changed, kind) for kind in ("random", "text")}
    for kind, by_variant in copy.items():
        for variant, by_d in by_variant.items():
            print(f"{kind:6} {variant:>16}: " + " ".join(f"{d}:{t:.2f}->{p:.2f}" for d, (t, p) in by_d.items()))
    if args.out:
        args.out.write_text(json.dumps({"base": args.base_suite, "variant": args.suite, "effects": effects,
                                        "copy_second_bits_base_then_variant": copy}, indent=1) + "\n")

if __name__ == "__main__":
    main()
