"""Statistics over seeds, stated once and used by every table and figure.

- Interval: the mean over seeds ± t_{0.975, n-1} · sd / √n (Student's t over seeds, 95%).
- "A differs from B", paired (the default wherever both have runs at the same seeds): at a seed
  every method starts from the same backbone weights and sees the same batches (common random
  numbers, `model.init_streams=split`), so the difference is taken within each seed and the
  per-seed differences get a one-sample t interval and a two-sided t-test (n - 1 degrees of
  freedom, n the seeds both have). What the seed shares cancels.
- Unpaired (`paired=False`, or no seed in common): Welch's two-sided t-test over the two sets of
  seeds (unequal variances), and the Welch interval of the difference of means.
- Either way at α = 0.05 after Holm's correction within each family of comparisons (every method
  against `local`; every method against the best).
- A second, seed-free interval: the per-document (or per-example) paired bootstrap, which resamples
  the evaluation units that every method scored alike (`paired_bootstrap`).
- With fewer than two seeds on either side there is no interval (NaN) and nothing is significant.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Optional, Sequence

import numpy as np
import pandas as pd

LEVEL = 0.95
ALPHA = 0.05
REFERENCE = "local"  # the floor every method is tested against
INTERVAL = "95% interval: mean ± t over seeds (Student's t, n - 1 degrees of freedom)"
TEST = "significance: Welch's two-sided t-test over seeds, α = 0.05, Holm-corrected per family"

PAIRED_TEST = ("differences paired by seed (same backbone initialisation and batches at a seed): mean of the per-seed "
               "differences ± the 95% t interval, two-sided paired t-test, α = 0.05, Holm-corrected per family")
UNPAIRED_TEST = ("differences unpaired: difference of means ± the 95% Welch interval, Welch's two-sided t-test, "
                 "α = 0.05, Holm-corrected per family")
BOOTSTRAP = ("per-document paired bootstrap: the evaluation documents resampled with replacement (the same draw for "
             "every seed), the difference of bits per byte recomputed, mean over seeds; 95% percentile interval")


def t_quantile(q: float, df: float) -> float:
    """Student's t quantile (scipy.stats.t.ppf's value, through its special function: the tables call
    it thousands of times, and the distribution object costs a millisecond a call)."""
    from scipy import special

    return float(special.stdtrit(df, q))


def t_sf(x: float, df: float) -> float:
    """Student's t survival function (scipy.stats.t.sf's value, as `t_quantile`)."""
    from scipy import special

    return float(special.stdtr(df, -x))


def _values(x: Iterable[float]) -> np.ndarray:
    a = np.asarray(list(x) if not isinstance(x, (np.ndarray, pd.Series)) else x, dtype=float)
    return a[~np.isnan(a)]


def t_halfwidth(x: Iterable[float], level: float = LEVEL) -> float:
    """Half-width of the t interval of the mean: t_{(1+level)/2, n-1} · sd / √n; NaN below two values."""
    if not 0 < level < 1:
        raise ValueError(f"level={level}: expected a probability in (0, 1)")
    a = _values(x)
    if len(a) < 2:
        return float("nan")
    return float(t_quantile((1 + level) / 2, len(a) - 1) * a.std(ddof=1) / math.sqrt(len(a)))


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
    x, y = _values(a), _values(b)
    if len(x) < 2 or len(y) < 2:
        return float("nan")
    vx, vy = x.var(ddof=1) / len(x), y.var(ddof=1) / len(y)
    diff = x.mean() - y.mean()
    if vx + vy == 0:
        return 0.0 if diff != 0 else 1.0
    t = diff / math.sqrt(vx + vy)
    df = (vx + vy) ** 2 / (vx**2 / (len(x) - 1) + vy**2 / (len(y) - 1))
    return float(2 * t_sf(abs(t), df))


def welch_halfwidth(a: Iterable[float], b: Iterable[float], level: float = LEVEL) -> float:
    """Half-width of the Welch interval of mean(a) - mean(b): t_{df} · √(s_a²/n_a + s_b²/n_b),
    Welch–Satterthwaite df; NaN below two values a side (0 when neither side has spread)."""
    x, y = _values(a), _values(b)
    if len(x) < 2 or len(y) < 2:
        return float("nan")
    vx, vy = x.var(ddof=1) / len(x), y.var(ddof=1) / len(y)
    if vx + vy == 0:
        return 0.0
    df = (vx + vy) ** 2 / (vx**2 / (len(x) - 1) + vy**2 / (len(y) - 1))
    return float(t_quantile((1 + level) / 2, df) * math.sqrt(vx + vy))


def per_seed(values: pd.Series, seeds: pd.Series) -> pd.Series:
    """`values` indexed by seed (several runs at one seed, e.g. a grid, are averaged), NaNs dropped."""
    seed, v = np.asarray(seeds), np.asarray(values, dtype=float)
    keep = ~(np.isnan(v) | pd.isna(seed))
    index, slot = np.unique(seed[keep], return_inverse=True)  # sorted seeds, as a groupby gives
    sums = np.zeros(len(index))
    np.add.at(sums, slot, v[keep])
    return pd.Series(sums / np.bincount(slot, minlength=len(index)), index=pd.Index(index, name="seed"), name="v")


def paired_differences(a: pd.Series, b: pd.Series) -> np.ndarray:
    """a - b at every seed both have (a and b indexed by seed, as `per_seed` gives)."""
    common = a.index.intersection(b.index)
    return (a.loc[common] - b.loc[common]).to_numpy(dtype=float)


def paired_t(diffs: Iterable[float], level: float = LEVEL) -> tuple[float, float, float]:
    """(mean, half-width, p) of per-seed differences: the one-sample t interval and two-sided t-test
    of mean 0. No spread: p = 0 if the mean is not 0, else 1; fewer than two pairs: NaN."""
    d = _values(diffs)
    if len(d) < 2:
        return (float(d.mean()) if len(d) else float("nan")), float("nan"), float("nan")
    mean, sd = float(d.mean()), float(d.std(ddof=1))
    if sd == 0:
        return mean, 0.0, (0.0 if mean != 0 else 1.0)
    t = mean / (sd / math.sqrt(len(d)))
    return mean, t_halfwidth(d, level), float(2 * t_sf(abs(t), len(d) - 1))


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


def compare_groups(df: pd.DataFrame, keys: list[str], value: str, *, higher_is_better: bool,
                   paired: bool = True) -> pd.DataFrame:
    """Per group of `keys` (which include "method"): n, mean and 95% t interval of `value`, and tests
    against `local` (all its groups pooled) and against the best group (by mean).

    paired (default): differences taken within each seed the two groups share (column `seed`) and
    tested by the paired t-test; a pair of groups with no seed in common falls back to Welch's test.
    paired=False: Welch's test and interval throughout. Columns: keys…, n, mean, ci (half-width), lo,
    hi, and for ref in (local, best): diff_vs_ref (this minus the other), ci_vs_ref (half-width of the
    difference's interval), p_vs_ref, sig_vs_ref (Holm), n_vs_ref (seeds paired; 0 when unpaired),
    is_best. NaN on the reference's own rows."""
    if "method" not in keys:
        raise ValueError(f"keys={keys}: expected them to include 'method' (the tests are against method local)")
    for col in [*keys, value, *(["seed"] if paired else [])]:
        if col not in df.columns:
            raise KeyError(f"column {col!r} not in the results table; it has {sorted(df.columns)}")
    groups = [(k if isinstance(k, tuple) else (k,), s) for k, s in df.groupby(keys, dropna=False, sort=False)]
    rows = []
    for key, sub in groups:
        mean, lo, hi = mean_interval(sub[value])
        rows.append({**dict(zip(keys, key)), "n": int(sub[value].notna().sum()), "mean": mean, "ci": hi - mean,
                     "lo": lo, "hi": hi})
    out = pd.DataFrame(rows)
    subs = [sub for _, sub in groups]
    is_local = [key[keys.index("method")] == REFERENCE for key, _ in groups]
    sign = 1.0 if higher_is_better else -1.0
    best = int(np.nanargmax(sign * out["mean"].to_numpy())) if out["mean"].notna().any() else -1
    local = pd.concat([s for s, r in zip(subs, is_local) if r]) if any(is_local) else None
    against = {"local": (local, is_local),
               "best": (subs[best] if best >= 0 else None, [i == best for i in range(len(subs))])}
    for name, (other, own) in against.items():
        cols: dict[str, list] = {c: [] for c in ("diff", "ci", "p", "n")}
        for sub, mine in zip(subs, own):
            d, ci, p, n = _versus(sub, other, value, paired) if other is not None and not mine else (float("nan"),) * 3 + (0,)
            for c, v in zip(("diff", "ci", "p", "n"), (d, ci, p, n)):
                cols[c].append(v)
        out[f"diff_vs_{name}"], out[f"ci_vs_{name}"], out[f"p_vs_{name}"] = cols["diff"], cols["ci"], cols["p"]
        out[f"sig_vs_{name}"], out[f"n_vs_{name}"] = holm(cols["p"]), cols["n"]
    out["is_best"] = against["best"][1]
    return out


def _versus(sub: pd.DataFrame, other: pd.DataFrame, value: str, paired: bool) -> tuple[float, float, float, int]:
    """(difference, interval half-width, p, seeds paired) of `value` in sub against other."""
    if paired:
        diffs = paired_differences(per_seed(sub[value], sub["seed"]), per_seed(other[value], other["seed"]))
        if len(diffs):
            mean, half, p = paired_t(diffs)
            return mean, half, p, len(diffs)
    a, b = _values(sub[value]), _values(other[value])
    diff = float(a.mean() - b.mean()) if len(a) and len(b) else float("nan")
    return diff, welch_halfwidth(a, b), welch_p(a, b), 0


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


@dataclass(frozen=True)
class RatioEstimate:
    """A ratio of two paired means with its Fieller interval. `status`: "bounded" (the interval is
    [low, high]), "unbounded" (the denominator is not distinguishable from 0 at this level, so no finite
    interval exists), "undefined" (the denominator's mean is exactly 0) or "one seed" (no interval)."""

    value: Optional[float]
    low: Optional[float]
    high: Optional[float]
    status: str


def ratio_interval(numerator: Sequence[float], denominator: Sequence[float], level: float = LEVEL) -> RatioEstimate:
    """mean(a) / mean(b) over paired samples (a_i, b_i), with Fieller's interval: the R for which
    mean(a) - R mean(b) is within the t interval of 0, i.e. (ā - R b̄)² <= t² (s_aa - 2R s_ab + R² s_bb) / n.
    Fieller, not the delta method: it stays exact when b̄ is small, where a ratio's interval is not symmetric."""
    a, b = np.asarray(numerator, dtype=float), np.asarray(denominator, dtype=float)
    if a.shape != b.shape:
        raise ValueError(f"ratio_interval needs paired samples; got {a.size} numerators and {b.size} denominators")
    mean_a, mean_b = float(a.mean()), float(b.mean())
    if mean_b == 0.0:
        return RatioEstimate(None, None, None, "undefined")
    value = mean_a / mean_b + 0.0  # + 0.0: no -0.0 where nothing is gained
    n = a.size
    if n < 2:
        return RatioEstimate(value, None, None, "one seed")
    t2 = float(t_quantile(0.5 + level / 2, n - 1)) ** 2
    cov = np.cov(np.stack([a, b]), ddof=1)  # [[s_aa, s_ab], [s_ab, s_bb]]
    qa = mean_b**2 - t2 * cov[1, 1] / n  # R² coefficient
    qb = mean_a * mean_b - t2 * cov[0, 1] / n  # half the R coefficient (sign folded in)
    qc = mean_a**2 - t2 * cov[0, 0] / n
    disc = qb * qb - qa * qc
    if qa <= 0 or disc < 0:
        return RatioEstimate(value, None, None, "unbounded")
    root = math.sqrt(disc)
    return RatioEstimate(value, float((qb - root) / qa), float((qb + root) / qa), "bounded")
