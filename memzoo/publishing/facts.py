"""Numbers quoted in prose, computed from the shipped rows as the tables are, so a re-freeze cannot leave
a sentence behind: a page writes `<!-- fact:NAME -->value<!-- /fact -->` and `memzoo figures` rewrites
the value (`--check` fails when it differs). NAME is SUITE.METHOD.QUANTITY, e.g.
`lm-stream.xl.after` ("−0.085 ± 0.008"): the paired difference from `local` on segments >= 1.

Quantities per method of a bits-per-byte suite (paired by seed, 95% t half-width):
  after, after_mean  difference from local on segments >= 1 (with and without its interval)
  seg0, seg0_mean    difference from local at segment 0 (no memory read yet: the weights')
  whole, whole_mean  difference from local over whole documents
  buys, buys_mean    what the memory buys: reset before every segment minus read, segments >= 1
  headroom           headroom recovered on segments >= 1 with its Fieller interval
  sig_after          "after Holm" or "not after Holm": the test of `after` over every method
  seed0_after, seed0_whole, seed0_buys   the same at seed 0 alone (no interval): one run's numbers
  in_window, past_window   difference from local on segments 1-7 (inside a training window of 8) and 8-31

Per method of a recall suite (capacity-top): `mean` (recall, "0.50"), `min_seed` and `max_seed`; and
for the suite `chance` (guessing among the stored values) and `reset_range` (the lowest and highest
method's mean with its state reset before the query segment, "0.12–0.13"). The distance suite gives the
same `chance` and `reset_range` (every method and gap) and per method `mean`, its recall over every gap.

Measured rows (memzoo.publishing.references.MEASURED) give facts too: `gpu-speed.ROW.ratio` (training
tokens/s over local's in the same call, "0.31"), `.peak_gb` and `.card`, ROW the method with its options
("gated-deltanet_compile-default"); `cpu-cost.VARIANT.speed` (local's median CPU seconds of a training
window over the variant's, timed in the same rounds, no bytes carried before the window: "0.51"),
`.speed_BYTES` with BYTES carried before it ("speed_3072"), `.seconds` and `.seconds_BYTES` (the median CPU
seconds of the window), VARIANT the suite's label slugged ("xl_mem_len-33"); and `cpu-cost.machine`,
`cpu-cost.rounds`, `cpu-cost.threads`, `cpu-cost.date`.
"""
from __future__ import annotations

import re
from typing import Callable, Iterable, Optional

import pandas as pd

from memzoo.analysis import (capacity_table, distance_summary, headroom_recovered, memory_ablation, memory_gain,
                             range_differences, summary_table)
from memzoo.analysis.beyond_window import CEILING, band_table, ceiling_check, class_keys, seed_gains, window_summary
from memzoo.analysis.copy_distance import copy_distance_long, copy_reach, is_copy_distance_table
from memzoo.analysis.results import variant_labels
from memzoo.analysis.stats import REFERENCE, paired_differences, paired_t, per_seed
from memzoo.core.config import ConfigError
from memzoo.publishing.references import CEILING_SUITES, HOURS, MEASURED, load_index, load_measured, load_references
from memzoo.publishing.formats import MINUS, interval, signed
from memzoo.publishing.shipped import with_ceiling
from memzoo.publishing.tables import ratio_cell

FACT = re.compile(r"<!-- fact:(?P<name>[a-z0-9.+_-]+) -->(?P<body>.*?)<!-- /fact -->")


def quantities(mean: float, half: float) -> tuple[str, str]:
    """("−0.085 ± 0.008", "−0.085")."""
    return interval(mean, half, sign=True), signed(mean)


def bpb_facts(rows: pd.DataFrame) -> dict[str, str]:
    """METHOD.QUANTITY -> text for every method of a bits-per-byte suite's rows (see the module docstring)."""
    after, whole = memory_gain(rows).set_index("method"), summary_table(rows).set_index("method")
    ablation, head = memory_ablation(rows).set_index("method"), headroom_recovered(rows).set_index("method")
    out: dict[str, str] = {}
    for method in rows["method"].unique():
        if method == REFERENCE:
            continue
        a, w, h = after.loc[method], whole.loc[method], head.loc[method] if method in head.index else None
        out[f"{method}.after"], out[f"{method}.after_mean"] = quantities(a["diff_after_vs_local"], a["ci_after_vs_local"])
        out[f"{method}.sig_after"] = "after Holm" if a["sig_after_vs_local"] else "not after Holm"
        out[f"{method}.whole"], out[f"{method}.whole_mean"] = quantities(w["diff_vs_local"], w["ci_vs_local"])
        if h is not None:
            out[f"{method}.seg0"], out[f"{method}.seg0_mean"] = quantities(h["diff_seg0_vs_local"], h["ci_seg0_vs_local"])
            if h["headroom_status"] == "bounded":
                out[f"{method}.headroom"] = (f"{h['headroom']:.2f} [{h['headroom_lo']:.2f}, {h['headroom_hi']:.2f}]"
                                             .replace("-", MINUS))
        if method in ablation.index:
            g = ablation.loc[method]
            out[f"{method}.buys"], out[f"{method}.buys_mean"] = f"{g['memory_gain']:.3f} ± {g['ci']:.3f}", f"{g['memory_gain']:.3f}"
    ranges = range_differences(rows, {"in_window": (1, 7), "past_window": (8, 31)})
    for _, r in ranges[ranges["method"] != REFERENCE].iterrows():  # inside a training window's 8 segments, past it
        out[f"{r['method']}.{r['range']}"], out[f"{r['method']}.{r['range']}_mean"] = quantities(r["diff_vs_local"], r["ci"])
    return out | seed_facts(rows[rows["seed"] == 0], "seed0")


def seed_facts(rows: pd.DataFrame, prefix: str) -> dict[str, str]:
    """METHOD.PREFIX_after, _whole and _buys of one seed's rows (what one run of the README's command prints)."""
    if rows.empty:
        return {}
    gain, ablation = memory_gain(rows).set_index("method"), memory_ablation(rows).set_index("method")
    out: dict[str, str] = {}
    for method in gain.index.drop(REFERENCE, errors="ignore"):
        out[f"{method}.{prefix}_after"] = signed(gain.loc[method, "diff_after_vs_local"])
        out[f"{method}.{prefix}_whole"] = signed(gain.loc[method, "diff_all_vs_local"])
        if method in ablation.index:
            out[f"{method}.{prefix}_buys"] = f"{ablation.loc[method, 'memory_gain']:.3f}"
    return out


def slug(variant: str) -> str:
    """A variant label as a fact name's part: "xl mem_len=33" -> "xl_mem_len-33"."""
    return variant.replace(" ", "_").replace("=", "-").replace(",", "")


NUMBER_WORDS = ("no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
                "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen", "twenty")


def in_words(n: int) -> str:
    """A count as prose writes it: 'twelve' up to twenty, digits above."""
    return NUMBER_WORDS[n] if 0 <= n < len(NUMBER_WORDS) else f"{n:,}"


def window_facts(rows: pd.DataFrame) -> dict[str, str]:
    """VARIANT.QUANTITY for the window suite (its table's numbers: after, seg0, beyond, buys, headroom,
    headroom_corrected, each with _mean where it has an interval; p_after, the unadjusted p),
    `holm.comparisons` (the Holm family on segments >= 1: every variant but the floor, `full` included),
    `holm.memories` (the memory variants in it) and `holm.better` (memory variants better than the floor
    after Holm), in words; `ceiling.seg0` (full - floor at segment 0), `ceiling.holds` and
    `floor.vs_block_local` (the window floor against lm-stream's `local` on segments >= 1, paired by seed:
    what the window alone buys); `none` and `sig_none`: the difference on bytes no earlier 9-gram makes
    copyable (what weights, not a memory, can buy)."""
    rows = with_ceiling(rows)
    out: dict[str, str] = {}
    summary = window_summary(rows)
    compared = summary[summary["method"] != REFERENCE]
    memories = compared[compared["method"] != CEILING]
    out["holm.comparisons"], out["holm.memories"] = in_words(len(compared)), in_words(len(memories))
    better = int((memories["sig_after"] & (memories["after"] < 0)).sum())
    out["holm.better"] = in_words(better) if better else "none"
    for _, r in summary.iterrows():
        name = slug(r["variant"])
        if r["method"] == REFERENCE:
            continue
        for q in ("after", "seg0", "beyond", "buys"):
            if q in r and r[q] == r[q]:
                out[f"{name}.{q}"], out[f"{name}.{q}_mean"] = quantities(r[q], r[f"{q}_ci"])
        out[f"{name}.sig_after"] = "after Holm" if r["sig_after"] else "not after Holm"
        out[f"{name}.p_after"] = f"{r['after_p']:.3f}"  # the paired t-test's p, before Holm
        for q in ("headroom", "headroom_corrected", "headroom_beyond"):
            if f"{q}_status" in r and isinstance(r[f"{q}_status"], str):
                out[f"{name}.{q}"] = ratio_cell(r, q)
    bands = band_table(rows) if class_keys(rows) else pd.DataFrame(columns=["method", "class"])
    none = bands[(bands["method"] != REFERENCE) & (bands["class"] == "copy_none")].dropna(subset=["diff_vs_floor"])
    for _, r in none.iterrows():
        name = slug(r["variant"])
        out[f"{name}.none"], out[f"{name}.none_mean"] = quantities(r["diff_vs_floor"], r["ci"])
        out[f"{name}.sig_none"] = "after Holm" if r["sig"] else "not after Holm"
    floor_rows = rows[rows["method"] == REFERENCE]
    if "tokens_by_doc_copy_beyond" in floor_rows:  # the same documents and classes for every run of the floor
        first = floor_rows.iloc[0]
        total = sum(sum(first[f"tokens_by_doc_copy_{c}"]) for c in ("beyond", "within", "none"))
        out["copy.beyond_share"] = f"{sum(first['tokens_by_doc_copy_beyond']) / total:.0%}"
    out |= window_seed_facts(rows, seed=0)
    check = ceiling_check(rows)
    out["ceiling.seg0"] = interval(check["full_seg0_vs_floor"], check["full_seg0_ci"], sign=True)
    out["ceiling.holds"] = "holds" if check["holds"] else "does not hold"
    block = load_references("lm-stream")
    block = seed_gains(block[block["method"] == REFERENCE])
    floor = seed_gains(rows[rows["method"] == REFERENCE])
    d = paired_differences(per_seed(floor["after"], floor["seed"]), per_seed(block["after"], block["seed"]))
    out["floor.vs_block_local"], out["floor.vs_block_local_mean"] = quantities(*paired_t(d)[:2])
    return out


def window_seed_facts(rows: pd.DataFrame, seed: int) -> dict[str, str]:
    """VARIANT.seedS_after, _whole and _buys: one seed's differences from the window floor (segments >= 1,
    whole documents, and reset minus read), what one seed of the suite's command prints."""
    one = rows[rows["seed"] == seed]
    if one.empty or not (one["method"] == REFERENCE).any():
        return {}
    bpb, floor = dict(zip(variant_labels(one), one["valid_bpb"])), one.loc[one["method"] == REFERENCE, "valid_bpb"].iloc[0]
    gains = window_summary(one).query("method != @REFERENCE")
    return {f"{slug(r['variant'])}.seed{seed}_{q}": text for _, r in gains.iterrows() for q, text in
            (("after", signed(r["after"])), ("whole", signed(bpb[r["variant"]] - floor)), ("buys", f"{r['buys']:.3f}"))}


def copy_facts(rows: pd.DataFrame) -> dict[str, str]:
    """VARIANT.copy_KIND_D (second-copy bits per byte at distance D, mean over seeds, "0.42"),
    VARIANT.copy_reset_KIND_D (the same with every memory forgotten before each segment),
    VARIANT.copies_KIND_up_to (the largest distance up to which every second copy costs under half the
    first) and `copy.first_KIND` (the first copy's mean over every run and distance)."""
    if not is_copy_distance_table(rows):
        return {}
    out: dict[str, str] = {}
    for kind in ("random", "text"):
        for reset, tag in ((False, "copy"), (True, "copy_reset")):
            for _, r in copy_distance_long(rows, kind, reset).iterrows():
                out[f"{slug(r['variant'])}.{tag}_{kind}_{int(r['distance'])}"] = f"{r['second']:.2f}"
        for variant, upto in copy_reach(rows, kind).items():
            out[f"{slug(variant)}.copies_{kind}_up_to"] = f"{upto:,}" if upto else "none"
        long = copy_distance_long(rows, kind)
        if len(long):
            out[f"copy.first_{kind}"] = f"{long['first'].mean():.2f}"
    return out


# suite -> the function that gives its facts
def recall_facts(rows: pd.DataFrame) -> dict[str, str]:
    """METHOD.mean, METHOD.min_seed, METHOD.max_seed, chance and reset_range of a recall suite's rows."""
    table = capacity_table(rows)
    out = {"chance": f"{table['chance'].mean():.2f}",
           "reset_range": f"{table['reset'].min():.2f}–{table['reset'].max():.2f}"}
    for method, group in rows.groupby("method"):
        out[f"{method}.mean"] = f"{group['recall_accuracy'].mean():.2f}"
        out[f"{method}.min_seed"] = f"{group['recall_accuracy'].min():.2f}"
        out[f"{method}.max_seed"] = f"{group['recall_accuracy'].max():.2f}"
    return out


def distance_facts(rows: pd.DataFrame) -> dict[str, str]:
    """chance, reset_range (the lowest and highest mean recall with the state reset after the last write,
    over every method and gap) and METHOD.mean (mean recall over every gap measured) of the distance suite."""
    table = distance_summary(rows)
    out = {"chance": f"{table['chance'].mean():.2f}",
           "reset_range": f"{table['reset'].min():.2f}–{table['reset'].max():.2f}"}
    for method, group in table.groupby("method"):
        out[f"{method}.mean"] = f"{group['accuracy'].mean():.2f}"
    return out


FACTS: dict[str, Callable[[pd.DataFrame], dict[str, str]]] = {
    "quick": bpb_facts,
    "lm-stream": bpb_facts,
    "lm-stream-sotu": bpb_facts,
    "lm-stream-gpu": bpb_facts,
    "lm-window": window_facts,
    **{suite: (lambda rows: window_facts(rows) | copy_facts(rows)) for suite in CEILING_SUITES},
    "capacity-top": recall_facts,
    "distance": distance_facts,
}


def speed_facts(rows: pd.DataFrame) -> dict[str, str]:
    """ROW.ratio, ROW.peak_gb and ROW.card of measured GPU speed rows (ROW: method and options, slugged;
    local, the reference of each call, has none)."""
    out: dict[str, str] = {}
    for r in rows.to_dict("records"):
        if r["method"] == REFERENCE:  # 1 by definition, and in every call
            continue
        row = slug(" ".join([r["method"], *filter(None, str(r["options"]).split(","))]))
        if f"{row}.ratio" in out:
            raise ConfigError(f"gpu-speed: two rows of {row!r}; one measurement per method and options")
        out[f"{row}.ratio"] = f"{r['tokens_per_s'] / r['local_tokens_per_s']:.2f}"
        out[f"{row}.peak_gb"] = f"{r['peak_cuda_mb'] / 1024:.0f}"
        out[f"{row}.card"] = str(r["card"])
    return out


def cpu_cost_facts(rows: pd.DataFrame) -> dict[str, str]:
    """VARIANT.speed[_BYTES] and VARIANT.seconds[_BYTES] of the measured CPU cost rows (see the module
    docstring; the reference `local` has seconds only), and the measurement's machine, rounds, threads, date."""
    out: dict[str, str] = {}
    if rows.empty:
        return out
    for r in rows.to_dict("records"):
        name, carried = slug(str(r["variant"])), int(r["carried_bytes"])
        tail = "" if carried == 0 else f"_{carried}"
        if f"{name}.seconds{tail}" in out:
            raise ConfigError(f"cpu-cost: two rows of {r['variant']!r} at {carried} carried bytes; one measurement each")
        out[f"{name}.seconds{tail}"] = f"{float(r['median_s']):.2f}"
        if r["variant"] != REFERENCE:
            out[f"{name}.speed{tail}"] = f"{float(r['speed_vs_local']):.2f}"
    for column in ("machine", "rounds", "threads", "date"):
        values = sorted({str(v) for v in rows[column]})
        out[column] = " / ".join(values)
    return out


MEASURED_FACTS: dict[str, Callable[[pd.DataFrame], dict[str, str]]] = {"gpu-speed": speed_facts, "cpu-cost": cpu_cost_facts}


def all_facts(rows: Optional[dict[str, pd.DataFrame]] = None, suites: Optional[Iterable[str]] = None) -> dict[str, str]:
    """SUITE.METHOD.QUANTITY -> text for every shipped suite with facts (or those of `suites`; rows:
    suite -> rows to use instead), and for the shipped measurements; SUITE.train_hours: the shipped runs'
    training hours from the references' index (one job's wall hours each, runs sharing the cores)."""
    rows = rows or {}
    wanted = set(FACTS) | set(MEASURED) if suites is None else set(suites)
    out: dict[str, str] = {}
    index = load_index()
    for suite, make in FACTS.items():
        if suite not in wanted:
            continue
        data = rows[suite] if suite in rows else load_references(suite)
        if not data.empty:
            out |= {f"{suite}.{name}": text for name, text in make(data).items()}
        if index.get(suite, {}).get(HOURS) is not None:
            out[f"{suite}.train_hours"] = f"{index[suite][HOURS]:.1f}"
    for name in MEASURED:
        if name not in wanted:
            continue
        data = rows[name] if name in rows else load_measured(name)
        out |= {f"{name}.{fact}": text for fact, text in MEASURED_FACTS[name](data).items()}
    return out


def render_facts(text: str, facts: dict[str, str], where: str = "page") -> str:
    """`text` with every fact's value replaced; an unknown name is an error naming it and the page."""
    unknown = sorted({m.group("name") for m in FACT.finditer(text)} - set(facts))
    if unknown:
        raise ConfigError(f"{where}: unknown fact(s) {unknown}; a fact is SUITE.METHOD.QUANTITY of a suite in "
                          f"memzoo.publishing.facts.FACTS ({sorted(FACTS)}) or of {sorted(MEASURED_FACTS)}")
    return FACT.sub(lambda m: f"<!-- fact:{m.group('name')} -->{facts[m.group('name')]}<!-- /fact -->", text)
