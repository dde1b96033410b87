"""A suite's long-range stages: its `longrange:` entries as the registered evaluations' configs
(memzoo.evaluations.registry), and whether a run has done exactly these stages."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from memzoo.core.config import ConfigError
from memzoo.training.curriculum import finished
from memzoo.evaluations.registry import evaluation_config
from memzoo.suites.expansion import RunSpec


def longrange_configs(suite: DictConfig, threads: int = 0) -> list[Any]:
    """The suite's long-range evaluations as LongRangeConfig, DistanceConfig or BabilongConfig objects
    (validated early)."""
    configs = []
    for i, options in enumerate(suite.longrange or []):
        opts = OmegaConf.to_container(options, resolve=True) if isinstance(options, DictConfig) else dict(options)
        try:
            configs.append(evaluation_config({"threads": threads, **opts}))
        except (TypeError, ValueError) as err:
            raise ConfigError(f"suite.longrange[{i}]: {err}") from None
    return configs


def stages_signature(longrange: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The long-range stages as recorded when done (thread counts do not change results)."""
    return [{k: v for k, v in stage.items() if k != "threads"} for stage in longrange]


def is_finished(spec: RunSpec, stages: list[dict[str, Any]]) -> bool:
    """Trained and evaluated, and exactly these long-range `stages` (`stages_signature`) are done
    (a stage added or changed since makes the run unfinished; its worker then evaluates only what
    is missing)."""
    if not all(finished(Path(c.out_dir) / c.name, c) for c in spec.chain):  # every training stage, as configured
        return False
    if not stages:
        return True
    done = spec.run_dir / "longrange-done.json"
    return done.is_file() and json.loads(done.read_text()) == stages
