"""A suite expanded into its runs: one `RunSpec` per (method, grid point, sweep point, seed), each a
resolved run config under the same token budget, with its fine-tuning chain and shared backbone."""
from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf

from memzoo.core.config import ConfigError, run_schema
from memzoo.core.overrides import merge_checked
from memzoo.runs.configure import load_config, resolve
from memzoo.training.curriculum import merge_chain, name_chain, seeded_stages, stage_overrides, stages_within_reach
from memzoo.suites.suite_plugins import suite_methods


@dataclass
class RunSpec:
    name: str
    method: str
    seed: int
    cfg: DictConfig  # the run whose row the table gets (the fine-tuned one when there is a fine-tuning stage)
    grid: dict[str, Any]
    pretrain: Optional[DictConfig] = None  # the language-model stage fine-tuning starts from
    sweep: dict[str, Any] = field(default_factory=dict)  # run-config values of this run's sweep point
    stages: list[DictConfig] = field(default_factory=list)  # curriculum stages between pretrain and cfg, in order

    @property
    def chain(self) -> list[DictConfig]:
        """Every training stage in order: pretraining (if any), curriculum stages, the run itself."""
        return ([self.pretrain] if self.pretrain is not None else []) + list(self.stages) + [self.cfg]

    @property
    def run_dir(self) -> Path:
        return Path(self.cfg.out_dir) / self.name

    @property
    def steps(self) -> int:
        return sum(int(c.train.steps) for c in self.chain)


def _grid_points(grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Every combination of the grid's (or the sweep's) values."""
    if not grid:
        return [{}]
    keys = list(grid)
    return [dict(zip(keys, values)) for values in itertools.product(*(list(grid[k]) for k in keys))]


def set_values(point: dict[str, Any]) -> dict[str, Any]:
    """The values a grid point sets: a null leaves that option as the run would have it without the key,
    so the run's name and config are those the grid makes without it."""
    return {k: v for k, v in point.items() if v is not None}


def _run_name(method: str, point: dict[str, Any], seed: int, sweep: Optional[dict[str, Any]] = None) -> str:
    tag = "".join(f"-{k.rsplit('.', 1)[-1]}{v}" for k, v in {**set_values(point), **(sweep or {})}.items())
    return f"{method}{tag}-s{seed}"


def grid_values(point: dict[str, Any], cfg: DictConfig) -> dict[str, Any]:
    """The point as its run has it: a null replaced by the value the run's config holds (its rows' grid
    columns then label it)."""
    return {k: (v if v is not None else OmegaConf.select(cfg, k if "." in k else f"memory.{k}")) for k, v in point.items()}


def grid_columns(grid: dict[str, Any]) -> dict[str, Any]:
    """A run's grid values as its table row's columns: grid_mem_len, ...; a run-config key by its last part."""
    return {f"grid_{key.rsplit('.', 1)[-1]}": value for key, value in grid.items()}


def sweep_points(suite: DictConfig) -> list[dict[str, Any]]:
    """Every combination of the suite's run-config sweep ({} when there is none); keys are checked
    against the run-config schema."""
    sweep = OmegaConf.to_container(suite.sweep, resolve=True) if suite.sweep else {}
    schema = run_schema()
    for key, values in sweep.items():
        if key.split(".", 1)[0] == "memory":
            raise ConfigError(f"suite.sweep key {key!r}: memory options belong in suite.grid (per method)")
        if OmegaConf.select(schema, key, default="__missing__") == "__missing__":
            raise ConfigError(f"suite.sweep key {key!r} is not a run-config key (e.g. train.lr, model.d_model, task.pairs)")
        if not isinstance(values, list) or not values:
            raise ConfigError(f"suite.sweep[{key!r}]={values!r}; expected a non-empty list of values")
    return _grid_points(sweep)


def _apply_run_keys(cfg: DictConfig, values: dict[str, Any]) -> None:
    """Set the dotted run-config keys among `values` (a sweep point, or a grid's model.n_heads); the
    others are memory options."""
    for key, value in values.items():
        if "." in key:
            OmegaConf.update(cfg, key, value, force_add=False)


def suite_dir(suite: DictConfig) -> Path:
    return Path(suite.out_dir) / suite.name


def expand(suite: DictConfig) -> list[RunSpec]:
    """Every (method, grid point, seed) as a resolved run config, all with the same token budget."""
    root = suite_dir(suite)
    specs = []
    for method in suite_methods(suite):
        preset = load_config(suite.base.format(method=method))
        base = OmegaConf.to_container(preset, resolve=True)
        # A per-method preset brings its own memory options; a shared base's belong to another method.
        preset_options = {k: v for k, v in base["memory"].items() if k != "name"} if preset.memory.name == method else {}
        options = {**preset_options, **dict(suite.options.get(method, {}) or {})}
        merged = OmegaConf.merge(base, suite.run or {})
        for point, sweep in itertools.product(_grid_points(dict(suite.grid.get(method, {}) or {})), sweep_points(suite)):
            template: Optional[list[DictConfig]] = None  # the run's chain of configs, resolved and checked once
            for seed in suite.seeds:  # for every seed, then seeded and named
                name = _run_name(method, point, seed, sweep)
                if template is None:
                    template, seeded = _unseeded_chain(suite, merged, method, options, point, sweep, name)
                chain = [copy.deepcopy(cfg) for cfg in template]
                for cfg, takes_seed in zip(chain, seeded):
                    if takes_seed:
                        cfg.seed = int(seed)
                chain[-1].name = name
                if suite.backbone:  # the first stage starts from the shared backbone
                    chain[0].task.init_from, chain[0].task.init_backbone_only = str(root / "runs" / backbone_name(seed)), True
                pretrain, stages, cfg = None, [], chain[-1]
                if len(chain) > 1:
                    pretrain, *stages, cfg = name_chain(chain, root, name)
                specs.append(RunSpec(name, method, int(seed), cfg, grid_values(point, cfg), pretrain, sweep, stages))
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ConfigError("two suite runs share a name; check the grid and seeds for duplicates")
    return specs


def _unseeded_chain(suite: DictConfig, merged: DictConfig, method: str, options: dict[str, Any], point: dict[str, Any],
                    sweep: dict[str, Any], name: str) -> tuple[list[DictConfig], list[bool]]:
    """A run's configs before its seed and names are set: [run] or [pretraining, stage 1, ...] (the stages
    the suite's `finetune:` makes, those within the memory's reach with `stop_at_reach`), each resolved
    and checked (errors name the run `name`), and which of them take the run's seed (`seeded_stages`)."""
    root = suite_dir(suite)
    cfg = copy.deepcopy(merged)
    _apply_run_keys(cfg, {**sweep, **set_values(point)})
    cfg.memory = {"name": method, **options, **{k: v for k, v in set_values(point).items() if "." not in k}}
    cfg.methods = {}
    cfg.out_dir = str(root / "runs")
    cfg = resolve(merge_checked(run_schema(), cfg, where=f"suite run {name}"))
    if cfg.log.group is None:  # a tracker shows the suite's runs together, each under its run name
        cfg.log.group = str(suite.name)
    if suite.token_budget:
        per_step = cfg.train.batch_size * cfg.train.window_segments * cfg.model.segment_len
        cfg.train.steps = max(1, int(suite.token_budget) // per_step)
    overrides = stage_overrides(suite.finetune) if suite.finetune else []
    if overrides and suite.stop_at_reach:
        overrides = stages_within_reach(cfg, overrides)
    if not overrides:
        return [cfg], [True]
    return merge_chain(cfg, overrides, name), seeded_stages(overrides)


def backbone_name(seed: int) -> str:
    return f"backbone-s{seed}"


def backbone_specs(suite: DictConfig) -> list[RunSpec]:
    """The suite's shared backbone runs, one per seed (none without `backbone:`)."""
    if not suite.backbone:
        return []
    method = OmegaConf.select(suite.backbone, "memory.name")  # default: the base's own memory
    if "{method}" in suite.base and not method:
        raise ConfigError(f"suite.backbone needs memory.name: the base {suite.base!r} is per method")
    base = load_config(suite.base.format(method=method))
    root = suite_dir(suite)
    specs = []
    for seed in suite.seeds:
        cfg = OmegaConf.merge(base, suite.run or {}, suite.backbone)
        cfg.seed, cfg.name, cfg.out_dir = int(seed), backbone_name(seed), str(root / "runs")
        cfg = resolve(merge_checked(run_schema(), cfg, where="suite backbone"))
        if cfg.log.group is None:
            cfg.log.group = str(suite.name)
        if cfg.task.name != "lm":
            raise ConfigError(f"suite.backbone trains a language model; got task.name={cfg.task.name!r}")
        specs.append(RunSpec(cfg.name, str(cfg.memory.name), int(seed), cfg, {}))
    return specs
