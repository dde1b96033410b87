"""The parameter check: every run of a suite has about as many parameters as every other (within
`max_param_spread`, per model width when a sweep changes it)."""
from __future__ import annotations

from memzoo.core.config import ConfigError
from memzoo.suites.expansion import RunSpec


def parameter_counts(specs: list[RunSpec]) -> dict[str, int]:
    """Parameters of each run's model (built, not trained)."""
    from memzoo.runs.configure import build_model

    return {s.name: build_model(s.cfg).num_parameters() for s in specs}


def check_parameter_spread(counts: dict[str, int], limit: float) -> float:
    lo, hi = min(counts.values()), max(counts.values())
    spread = (hi - lo) / max(lo, 1)
    if spread > limit:
        worst = max(counts, key=counts.get)
        raise ConfigError(
            f"parameter counts differ by {spread:.1%} across runs (limit suite.max_param_spread={limit:.0%}): "
            f"{worst} has {counts[worst]:,}, smallest {lo:,}; counts: {counts}"
        )
    return spread


def check_parameter_spread_by_width(specs: list[RunSpec], counts: dict[str, int], limit: float) -> float:
    """The spread check within each model.d_model group (a d_model sweep changes every count on
    purpose); returns the largest spread."""
    groups: dict[int, dict[str, int]] = {}
    for s in specs:
        groups.setdefault(int(s.cfg.model.d_model), {})[s.name] = counts[s.name]
    return max(check_parameter_spread(group, limit) for group in groups.values())
