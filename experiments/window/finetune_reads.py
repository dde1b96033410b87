"""What pair reads in fine-tuning change: `lm-window-pairs` against `lm-window-rope3`, run for run (the
same backbone, method and seed; only train.copy_share and train.copy_layout differ, as
tests/test_window_pairs.py holds). For every variant in both suites: bits per byte on segments >= 1 and
on beyond-window copyable bytes, and the difference from its own suite's floor, under each protocol,
with the protocol's effect (pairs - text) paired by seed, mean ± the 95% t half-width over seeds; and
second-copy bits per byte by distance (random chunks, state carried), mean over seeds.

    python experiments/window/finetune_reads.py [--text ROWS.parquet] [--pairs ROWS.parquet] [--out FILE.json]

Without --text / --pairs it reads the shipped rows of the two suites.
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


def protocol_effect(text: pd.DataFrame, pairs: pd.DataFrame) -> dict[str, dict[str, dict[str, float]]]:
    """Per variant in both: each quantity under text-only and pair-read fine-tuning (mean over seeds) and
    pairs - text paired by seed (mean, 95% t half-width, p, seeds), the means over the seeds both have."""
    a, b = per_variant(text), per_variant(pairs)
    effects = {}
    for variant in [v for v in b if v in a]:
        row, seeds = {}, a[variant].index.intersection(b[variant].index)  # the means too: paired seeds only
        for q in QUANTITIES:
            d = paired_differences(b[variant][q], a[variant][q])
            mean, half, p = paired_t(d)
            row[q] = {"text": round(float(a[variant].loc[seeds, q].mean()), 4),
                      "pairs": round(float(b[variant].loc[seeds, q].mean()), 4),
                      "effect": round(mean, 4), "ci": round(half, 4), "p": round(p, 4), "seeds": int(len(d))}
        effects[variant] = row
    return effects


def copying(text: pd.DataFrame, pairs: pd.DataFrame, kind: str = "random") -> dict[str, dict[str, list[float]]]:
    """Variant -> distance -> [second copy after text-only fine-tuning, after pair-read fine-tuning]."""
    a, b = copy_distance_long(text, kind), copy_distance_long(pairs, kind)
    merged = a.merge(b, on=["variant", "distance"], suffixes=("_text", "_pairs"))
    out: dict[str, dict[str, list[float]]] = {}
    for _, r in merged.iterrows():
        out.setdefault(r["variant"], {})[str(int(r["distance"]))] = [round(r["second_text"], 3), round(r["second_pairs"], 3)]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--text", type=Path, help="lm-window-rope3 rows (default: the shipped ones)")
    ap.add_argument("--pairs", type=Path, help="lm-window-pairs rows (default: the shipped ones)")
    ap.add_argument("--out", type=Path, help="write the numbers as JSON here")
    args = ap.parse_args()
    text = pd.read_parquet(args.text) if args.text else load_references("lm-window-rope3")
    pairs = pd.read_parquet(args.pairs) if args.pairs else load_references("lm-window-pairs")
    effects = protocol_effect(text, pairs)
    for variant, row in effects.items():
        cells = [f"{q} {r['text']:.3f} -> {r['pairs']:.3f} ({r['effect']:+.3f} ± {r['ci']:.3f}, {r['seeds']} seeds)"
                 for q, r in row.items()]
        print(f"{variant}:\n  " + "\n  ".join(cells))
    copy = {kind: copying(text, pairs, kind) for kind in ("random", "text")}
    for kind, by_variant in copy.items():
        for variant, by_d in by_variant.items():
            print(f"{kind:6} {variant:>16}: " + " ".join(f"{d}:{t:.2f}->{p:.2f}" for d, (t, p) in by_d.items()))
    if args.out:
        args.out.write_text(json.dumps({"effects": effects, "copy_second_bits_text_then_pairs": copy}, indent=1) + "\n")


if __name__ == "__main__":
    main()
