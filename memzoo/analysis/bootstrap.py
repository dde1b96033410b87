"""The seed-free interval: a paired bootstrap over the evaluation units (documents, examples) that two
methods scored alike, one resampling draw shared by every seed (memzoo.analysis.stats states it)."""
from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

from memzoo.analysis.stats import LEVEL


def paired_bootstrap(units_a: Sequence[Sequence[float]], units_b: Sequence[Sequence[float]],
                     weights: Sequence[Sequence[float]], n_boot: int = 2000, seed: int = 0,
                     level: float = LEVEL) -> tuple[float, float, float, float]:
    """A paired bootstrap over evaluation units that two methods scored alike (documents, examples).

    units_a, units_b: per seed, each unit's summed score (bits of a document; hits of an example);
    weights: per seed, each unit's size (its tokens; its queries), the same for both methods.
    The statistic is the mean over seeds of Σ a / Σ w - Σ b / Σ w (a difference of bits per byte,
    or of accuracy). Units are resampled with replacement, one draw per replicate shared by every
    seed. Returns (observed, lo, hi, p): the percentile interval at `level` and the two-sided
    bootstrap p = 2 min(P(d* <= 0), P(d* >= 0)) (floored at 1 / n_boot).
    """
    a, b, w = (np.asarray(x, dtype=float) for x in (units_a, units_b, weights))  # [seeds, units]
    if a.ndim != 2 or a.shape != b.shape or a.shape != w.shape or a.shape[1] == 0:
        raise ValueError(f"paired_bootstrap needs [seeds, units] arrays of one shape; got {a.shape}, {b.shape}, {w.shape}")
    observed = float(np.mean((a - b).sum(1) / w.sum(1)))
    rng = np.random.default_rng(seed)
    counts = rng.multinomial(a.shape[1], np.full(a.shape[1], 1.0 / a.shape[1]), size=n_boot)  # [n_boot, units]
    rep = ((counts @ (a - b).T) / np.maximum(counts @ w.T, 1e-300)).mean(1)  # [n_boot]
    lo, hi = np.quantile(rep, [(1 - level) / 2, (1 + level) / 2])
    p = min(1.0, 2 * min(float((rep <= 0).mean()), float((rep >= 0).mean())))
    return observed, float(lo), float(hi), max(p, 1.0 / n_boot)


def bootstrap_versus(runs: pd.DataFrame, reference: pd.DataFrame, units: str, weights: str, *, n_boot: int = 2000,
                     seed: int = 0) -> tuple[float, float, float, float]:
    """`paired_bootstrap` of one group of runs against another, over the seeds both have: `units` and
    `weights` are list columns (bits and tokens of each evaluation document; hits and queries of
    each recall example). (observed, lo, hi, p), all NaN when a side lacks the columns or a seed's
    units were not scored alike (another evaluation set)."""
    nan = (float("nan"),) * 4
    if any(c not in frame.columns for frame in (runs, reference) for c in (units, weights, "seed")):
        return nan
    a_rows = {int(r["seed"]): r for _, r in runs.iterrows() if is_list(r[units])}
    b_rows = {int(r["seed"]): r for _, r in reference.iterrows() if is_list(r[units])}
    common = sorted(set(a_rows) & set(b_rows))
    if not common:
        return nan
    a, b, w = [], [], []
    for s in common:
        wa, wb = np.asarray(a_rows[s][weights], dtype=float), np.asarray(b_rows[s][weights], dtype=float)
        if wa.shape != wb.shape or not np.array_equal(wa, wb):
            return nan
        a.append(np.asarray(a_rows[s][units], dtype=float))
        b.append(np.asarray(b_rows[s][units], dtype=float))
        w.append(wa)
    if len({len(x) for x in w}) != 1:  # seeds scored different numbers of units: one shared draw cannot pair them
        return nan
    return paired_bootstrap(a, b, w, n_boot=n_boot, seed=seed)


def is_list(value) -> bool:
    """A non-empty list column value (a row's per-unit scores)."""
    return isinstance(value, (list, tuple, np.ndarray)) and len(value) > 0
