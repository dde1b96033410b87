"""Statistics over seeds, stated once and used by every table and figure.

- Interval: the mean over seeds ± t_{0.975, n-1} · sd / √n (Student's t over seeds, 95%).
- "A differs from B": Welch's two-sided t-test over the two sets of seeds (unequal variances),
  at α = 0.05 after Holm's correction within each family of comparisons (every method against
  `local`; every method against the best).
- With fewer than two seeds on either side there is no interval (NaN) and nothing is significant.
"""
from __future__ import annotations

import math
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

LEVEL = 0.95
ALPHA = 0.05
REFERENCE = "local"  # the floor every method is tested against
INTERVAL = "95% interval: mean ± t over seeds (Student's t, n - 1 degrees of freedom)"
TEST = "significance: Welch's two-sided t-test over seeds, α = 0.05, Holm-corrected per family"


def _values(x: Iterable[float]) -> np.ndarray:
    a = np.asarray(list(x) if not isinstance(x, (np.ndarray, pd.Series)) else x, dtype=float)
    return a[~np.isnan(a)]


def t_halfwidth(x: Iterable[float], level: float = LEVEL) -> float:
    """Half-width of the t interval of the mean: t_{(1+level)/2, n-1} · sd / √n; NaN below two values."""
    from scipy import stats

    if not 0 < level < 1:
        raise ValueError(f"level={level}: expected a probability in (0, 1)")
    a = _values(x)
    if len(a) < 2:
        return float("nan")
    return float(stats.t.ppf((1 + level) / 2, len(a) - 1) * a.std(ddof=1) / math.sqrt(len(a)))


def mean_interval(x: Iterable[float], level: float = LEVEL) -> tuple[float, float, float]:
    """(mean, lo, hi) of the t interval over seeds; lo and hi are NaN below two values."""
    a = _values(x)
    mean = float(a.mean()) if len(a) else float("nan")
    h = t_halfwidth(a, level)
    return mean, mean - h, mean + h


def t_errorbar(x: Sequence[float]) -> tuple[float, float]:
    """seaborn `errorbar=` callable: the (lo, hi) t interval (collapses to the mean with one seed)."""
    mean, lo, hi = mean_interval(x)
    return (mean, mean) if math.isnan(lo) else (lo, hi)


def welch_p(a: Iterable[float], b: Iterable[float]) -> float:
    """Two-sided p-value of Welch's t-test that the means of a and b differ; NaN below two values a side.

    t = (mean_a - mean_b) / √(s_a²/n_a + s_b²/n_b), Welch–Satterthwaite degrees of freedom. Two sets
    with no spread at all are different when their means differ (p = 0) and equal otherwise (p = 1)."""
    from scipy import stats

    x, y = _values(a), _values(b)
    if len(x) < 2 or len(y) < 2:
        return float("nan")
    vx, vy = x.var(ddof=1) / len(x), y.var(ddof=1) / len(y)
    diff = x.mean() - y.mean()
    if vx + vy == 0:
        return 0.0 if diff != 0 else 1.0
    t = diff / math.sqrt(vx + vy)
    df = (vx + vy) ** 2 / (vx**2 / (len(x) - 1) + vy**2 / (len(y) - 1))
    return float(2 * stats.t.sf(abs(t), df))


def holm(p: Sequence[float], alpha: float = ALPHA) -> list[bool]:
    """Holm's step-down correction: which of the p-values are significant at family-wise `alpha` (NaN: never)."""
    p = [float(v) for v in p]
    order = sorted((v, i) for i, v in enumerate(p) if not math.isnan(v))
    out = [False] * len(p)
    m = len(order)
    for rank, (v, i) in enumerate(order):
        if v > alpha / (m - rank):
            break
        out[i] = True
    return out


def compare_groups(df: pd.DataFrame, keys: list[str], value: str, *, higher_is_better: bool) -> pd.DataFrame:
    """Per group of `keys` (which include "method"): n, mean and 95% t interval of `value`, and Welch
    tests against `local` (all its groups pooled) and against the best group (by mean).

    Columns: keys…, n, mean, ci (half-width), lo, hi, diff_vs_local, p_vs_local, sig_vs_local,
    diff_vs_best, p_vs_best, sig_vs_best, is_best (diff = this mean - the other's; NaN on the reference's own rows)."""
    if "method" not in keys:
        raise ValueError(f"keys={keys}: expected them to include 'method' (the tests are against method local)")
    for col in [*keys, value]:
        if col not in df.columns:
            raise KeyError(f"column {col!r} not in the results table; it has {sorted(df.columns)}")
    groups = [(k if isinstance(k, tuple) else (k,), s) for k, s in df.groupby(keys, dropna=False, sort=False)[value]]
    rows = []
    for key, series in groups:
        mean, lo, hi = mean_interval(series)
        rows.append({**dict(zip(keys, key)), "n": int(series.notna().sum()), "mean": mean, "ci": hi - mean, "lo": lo, "hi": hi})
    out = pd.DataFrame(rows)
    values = [s for _, s in groups]
    is_local = [key[keys.index("method")] == REFERENCE for key, _ in groups]
    sign = 1.0 if higher_is_better else -1.0
    best = int(np.nanargmax(sign * out["mean"].to_numpy())) if out["mean"].notna().any() else -1
    against = {"local": (pd.concat([v for v, r in zip(values, is_local) if r]) if any(is_local) else None, is_local),
               "best": (values[best] if best >= 0 else None, [i == best for i in range(len(values))])}
    for name, (other, own) in against.items():
        diffs = [float("nan") if other is None or mine else float(s.mean() - other.mean()) for s, mine in zip(values, own)]
        ps = [float("nan") if other is None or mine else welch_p(s, other) for s, mine in zip(values, own)]
        out[f"diff_vs_{name}"], out[f"p_vs_{name}"], out[f"sig_vs_{name}"] = diffs, ps, holm(ps)
    out["is_best"] = against["best"][1]
    return out


def wilson_interval(successes: int, trials: int, level: float = LEVEL) -> tuple[float, float]:
    """Wilson's score interval (lo, hi) for a proportion of `successes` in `trials` pooled trials
    (keeps inside [0, 1] and is not empty at 0 or n successes, unlike the normal approximation):
    (p + z²/2n ± z √(p(1-p)/n + z²/4n²)) / (1 + z²/n). NaN for no trials."""
    from scipy import stats

    if not 0 < level < 1:
        raise ValueError(f"level={level}: expected a probability in (0, 1)")
    if trials < 0 or not 0 <= successes <= max(trials, 0):
        raise ValueError(f"successes={successes}, trials={trials}: expected 0 <= successes <= trials")
    if trials == 0:
        return float("nan"), float("nan")
    z = float(stats.norm.ppf((1 + level) / 2))
    p = successes / trials
    centre = (p + z * z / (2 * trials)) / (1 + z * z / trials)
    half = z / (1 + z * z / trials) * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials))
    # At 0 or n successes the bound is exactly 0 or 1 (the formula leaves a rounding residue).
    lo = 0.0 if successes == 0 else max(0.0, centre - half)
    hi = 1.0 if successes == trials else min(1.0, centre + half)
    return lo, hi
