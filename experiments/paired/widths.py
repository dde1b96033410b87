"""Common random numbers, before and after: the quick suite's difference from `local` per method, with its
unpaired (Welch) and paired 95% half-widths, from two results tables (before: the shared initialisation
stream; after: common random numbers). Prints markdown tables.

    python experiments/paired/widths.py results-before/quick/results.parquet results/quick/results.parquet
"""
from __future__ import annotations

import sys

import pandas as pd

from memzoo.analysis import memory_gain, pairing_gain, summary_table


def fmt(x: float, sign: bool = False) -> str:
    return "" if x != x else (f"{x:+.3f}" if sign else f"{x:.3f}")


def widths_table(before: pd.DataFrame, after: pd.DataFrame) -> str:
    b, a = pairing_gain(before).set_index("method"), pairing_gain(after).set_index("method")
    lines = ["| method | before: diff, unpaired ± (p) | after: diff, paired ± (p) | after: unpaired ± | "
             "ratio before-unpaired / after-paired | after: unpaired / paired |",
             "| --- | --- | --- | ---: | ---: | ---: |"]
    for m in a.sort_values("diff_vs_local").index:
        rb = b.loc[m] if m in b.index else None
        ra = a.loc[m]
        before_cell = "" if rb is None else f"{fmt(rb['diff_vs_local'], True)} ± {fmt(rb['ci_unpaired'])} (p {rb['p_unpaired']:.2g})"
        ratio = "" if rb is None else f"{rb['ci_unpaired'] / ra['ci_paired']:.1f}×"
        star = " *" if ra["sig_paired"] else ""
        lines.append(f"| `{m}` | {before_cell} | {fmt(ra['diff_vs_local'], True)} ± {fmt(ra['ci_paired'])} "
                     f"(p {ra['p_paired']:.2g}){star} | {fmt(ra['ci_unpaired'])} | {ratio} | {ra['ratio']:.1f}× |")
    return "\n".join(lines)


def after_table(after: pd.DataFrame) -> str:
    s = summary_table(after).set_index("method")
    g = memory_gain(after).set_index("method")
    lines = ["| method | state numbers | valid bpb | vs local (paired) | vs local (per-document bootstrap) | "
             "vs local, segments ≥ 1 (paired) | eval tokens/s | train tokens/s | peak RSS MB |",
             "| --- | ---: | --- | --- | --- | --- | ---: | ---: | ---: |"]
    for m, r in s.iterrows():
        vs = "ref" if m == "local" else (f"{fmt(r['diff_vs_local'], True)} ± {fmt(r['ci_vs_local'])} "
                                         f"(p {r['p_vs_local']:.2g}){' *' if r['sig_vs_local'] else ''}")
        boot = "" if r["boot_lo_vs_local"] != r["boot_lo_vs_local"] else \
            f"[{fmt(r['boot_lo_vs_local'], True)}, {fmt(r['boot_hi_vs_local'], True)}]"
        after_seg = "ref" if m == "local" else (
            f"{fmt(g.loc[m, 'diff_after_vs_local'], True)} ± {fmt(g.loc[m, 'ci_after_vs_local'])} "
            f"(p {g.loc[m, 'p_after_vs_local']:.2g})" if m in g.index else "")
        lines.append(f"| `{m}` | {r['footprint']:,.0f} | {r['bpb_mean']:.3f} ± {r['bpb_ci']:.3f} | {vs} | {boot} | "
                     f"{after_seg} | {r['tokens_per_s']:,.0f} | {r['train_tokens_per_s']:,.0f} | {r['peak_rss_mb']:,.0f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    before, after = (pd.read_parquet(p) for p in sys.argv[1:3])
    print(widths_table(before, after))
    print()
    print(after_table(after))
