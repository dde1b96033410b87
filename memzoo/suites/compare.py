"""Comparison suites: one config names the methods, the shared backbone and data, seeds, an optional
grid of memory options and one token budget; `run_suite` trains and evaluates every run in worker
processes and keeps `results.parquet` (one row per finished run) up to date.

Resumable by construction: a run with a `result.json` is finished and skipped; an unfinished run
resumes from its checkpoint; the table is rewritten atomically from the finished runs' rows after
each run, so a killed suite loses no finished result and never leaves a half-written row.
"""
from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import itertools
import json
import multiprocessing
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import pandas as pd
from omegaconf import DictConfig, OmegaConf
from tqdm.auto import tqdm

from memzoo.core.config import (ConfigError, RunConfig, _load_yaml_chain, _merge_checked, _parse_overrides, apply_indexed,
                                preset_path, split_indexed, to_yaml)
from memzoo.running.configure import load_config, resolve
from memzoo.running.curriculum import (config_matches, finetune_chain, finished, prepare_stage, stage_overrides,
                                       stages_within_reach)
from memzoo.running.diagnostics import stage_columns
from memzoo.running.tracking import check_tracker
from memzoo.suites.threads import Claim, suite_threads


@dataclass
class SuiteConfig:
    name: str = "suite"
    base: str = "small"  # the run preset every run starts from; "{method}" in it is replaced per method
    run: Any = field(default_factory=dict)  # overrides of the run config shared by every run
    methods: Any = "all"  # "all": every registered method (plugins from other packages too), or a list
    exclude: list[str] = field(default_factory=list)
    options: Any = field(default_factory=dict)  # {method: {memory option: value}}
    # {method: {memory option or dotted run-config key (model.n_heads): [values, ...]}}: one run per combination
    grid: Any = field(default_factory=dict)
    seeds: list[int] = field(default_factory=lambda: [0])
    token_budget: Optional[int] = None  # training bytes per run, the same for every method (sets train.steps)
    imports: list[str] = field(default_factory=list)  # modules or .py files to import first (notebook plugins)
    jobs: int = 1  # worker processes
    threads_per_job: int = 0  # torch threads per worker; 0 = the usable cores that other suites leave, // jobs
    max_param_spread: float = 0.10  # (max - min) / min of the parameter counts across runs
    out_dir: str = "results"  # the suite's folder is out_dir/name
    # Optional fine-tuning after pretraining: run-config overrides (one stage, e.g. on the passkey
    # task), or a list of them (curriculum stages, each merged onto the previous stage's config and
    # starting from its weights; memzoo.running.curriculum). The pretrained run is kept as NAME-lm, earlier
    # stages as NAME-c1, NAME-c2, ...; the last stage is the suite's run.
    finetune: Any = None
    # Optional shared pretraining: run-config overrides (on base + run) of one language model per seed,
    # trained first, whose backbone every method's pretraining stage starts from
    # (task.init_backbone_only: each memory's own parameters at their initialisation). The Infini and
    # RMT papers add their memory to a pretrained transformer; one backbone for all also makes the
    # methods differ only in their memory. Kept as runs/backbone-sSEED.
    backbone: Any = None
    # Curriculum stages past a method's reach are not trained (memzoo.running.curriculum.stages_within_reach):
    # a memory whose window cannot bridge a stage's largest gap (memzoo.running.reach) stops at the stage before.
    stop_at_reach: bool = False
    # Optional last stage: long-range evaluations of each run, a list of memzoo.running.longrange.LongRangeConfig
    # options (e.g. [{task: passkey, lengths: [...], depths: [...]}]), with task: distance of
    # memzoo.running.distance.DistanceConfig options (recall at gaps), or with task: babilong of
    # memzoo.running.babilong.BabilongConfig options; their rows join the results table.
    longrange: Any = field(default_factory=list)
    # Cluster settings for `--launcher slurm|submitit-local` (memzoo.suites.launchers.LauncherConfig):
    # partition, account, gpus_per_node, cpus_per_task, mem_gb, timeout_min, additional, setup, ...
    launcher: Any = field(default_factory=dict)
    # Optional sweep over run-config keys applied to every method, one run per combination
    # (e.g. {"train.lr": [0.001, 0.003], "model.d_model": [32, 64], "task.gap_segments": [1, 2]}).
    # Parameter counts are then compared within each model.d_model group.
    sweep: Any = field(default_factory=dict)


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


def load_suite(name_or_path: Optional[str] = "quick", overrides: Optional[list[str]] = None) -> DictConfig:
    """Schema <- suite YAML (configs/suites/NAME.yaml or a path; `defaults: [other.yaml]` builds on
    another suite file: mappings merge, lists are replaced) <- key=value overrides."""
    schema = OmegaConf.structured(SuiteConfig)
    path = Path(name_or_path) if name_or_path else None
    if path is None or not path.is_file():
        path = preset_path(f"suites/{name_or_path or 'quick'}")
    layers: list[Any] = [_load_yaml_chain(path)]
    plain, indexed = split_indexed(list(overrides or []))
    if plain:
        layers.append(_parse_overrides(plain))
    suite = apply_indexed(_merge_checked(schema, *layers, where="suite"), indexed, where="suite")
    if suite.jobs < 1:
        raise ConfigError(f"suite.jobs={suite.jobs}; expected >= 1")
    return suite


def import_plugins(paths: list[str]) -> None:
    """Import the suite's extra plugin modules (dotted names or .py files): their decorators register them."""
    import importlib
    import importlib.util

    for item in paths:
        if item.endswith(".py"):
            file = Path(item).expanduser().resolve()
            if not file.is_file():
                raise ConfigError(f"suite.imports: {item!r} is not a file")
            spec = importlib.util.spec_from_file_location(f"memzoo_suite_plugin_{file.stem}", file)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        else:
            importlib.import_module(item)


def plugin_methods(plugin: str) -> tuple[list[str], list[str]]:
    """Import a plugin (a .py file, a dotted module, or an installed entry point's name) and return
    (the memories its module registers, what a suite's `imports:` needs to import it again)."""
    from importlib import metadata

    from memzoo.core.plugins import ENTRY_POINT_GROUP, registered

    registered()  # discover the installed entry points first
    points = {ep.name: ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}
    if plugin.endswith(".py"):
        if not Path(plugin).expanduser().is_file():
            raise ConfigError(f"plugin file {plugin!r} does not exist")
        import_plugins([plugin])
        module, imports = f"memzoo_suite_plugin_{Path(plugin).stem}", [str(Path(plugin).expanduser().resolve())]
    elif plugin in points:
        points[plugin].load()
        module, imports = points[plugin].module, []  # installed: every worker discovers it
    else:
        try:
            import_plugins([plugin])
        except ModuleNotFoundError as err:
            raise ConfigError(f"{plugin!r} is no .py file, importable module or {ENTRY_POINT_GROUP} entry point "
                              f"({err})") from None
        module, imports = plugin, [plugin]
    names = [n for n, spec in registered().items() if spec.source == module or spec.source.startswith(module + ".")]
    if not names:
        raise ConfigError(f"{plugin!r} registers no memory (no @register_memory ran when it was imported)")
    return names, imports


def suite_methods(suite: DictConfig) -> list[str]:
    from memzoo.core.plugins import registered

    import_plugins(list(suite.imports))
    known = registered()
    names = list(known) if suite.methods == "all" else list(suite.methods)
    for name in names:
        if name not in known:
            raise ConfigError(f"suite method {name!r} is not registered; registered: {', '.join(known)}")
    return [n for n in names if n not in set(suite.exclude)]


def _grid_points(grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
    if not grid:
        return [{}]
    keys = list(grid)
    return [dict(zip(keys, values)) for values in itertools.product(*(list(grid[k]) for k in keys))]


def _run_name(method: str, point: dict[str, Any], seed: int, sweep: Optional[dict[str, Any]] = None) -> str:
    tag = "".join(f"-{k.rsplit('.', 1)[-1]}{v}" for k, v in {**point, **(sweep or {})}.items())
    return f"{method}{tag}-s{seed}"


def sweep_points(suite: DictConfig) -> list[dict[str, Any]]:
    """Every combination of the suite's run-config sweep ({} when there is none); keys are checked
    against the run-config schema."""
    sweep = OmegaConf.to_container(suite.sweep, resolve=True) if suite.sweep else {}
    schema = OmegaConf.structured(RunConfig)
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
        for point, sweep in itertools.product(_grid_points(dict(suite.grid.get(method, {}) or {})), sweep_points(suite)):
            for seed in suite.seeds:
                name = _run_name(method, point, seed, sweep)
                cfg = OmegaConf.merge(base, suite.run or {})
                _apply_run_keys(cfg, {**sweep, **point})
                cfg.memory = {"name": method, **options, **{k: v for k, v in point.items() if "." not in k}}
                cfg.methods = {}
                cfg.seed, cfg.name, cfg.out_dir = int(seed), name, str(root / "runs")
                cfg = resolve(_merge_checked(OmegaConf.structured(RunConfig), cfg, where=f"suite run {name}"))
                if cfg.log.group is None:  # a tracker shows the suite's runs together, each under its run name
                    cfg.log.group = str(suite.name)
                if suite.token_budget:
                    per_step = cfg.train.batch_size * cfg.train.window_segments * cfg.model.segment_len
                    cfg.train.steps = max(1, int(suite.token_budget) // per_step)
                pretrain, stages = None, []
                if suite.backbone:  # the first stage starts from the shared backbone
                    cfg.task.init_from, cfg.task.init_backbone_only = str(root / "runs" / backbone_name(seed)), True
                overrides = stage_overrides(suite.finetune) if suite.finetune else []
                if overrides and suite.stop_at_reach:
                    overrides = stages_within_reach(cfg, overrides)
                if overrides:
                    pretrain, *stages, cfg = finetune_chain(cfg, overrides, root, name)
                specs.append(RunSpec(name, method, int(seed), cfg, point, pretrain, sweep, stages))
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ConfigError("two suite runs share a name; check the grid and seeds for duplicates")
    return specs


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
        cfg = resolve(_merge_checked(OmegaConf.structured(RunConfig), cfg, where="suite backbone"))
        if cfg.log.group is None:
            cfg.log.group = str(suite.name)
        if cfg.task.name != "lm":
            raise ConfigError(f"suite.backbone trains a language model; got task.name={cfg.task.name!r}")
        specs.append(RunSpec(cfg.name, str(cfg.memory.name), int(seed), cfg, {}))
    return specs


def evaluation_config(options: dict[str, Any]) -> Any:
    """One `longrange:` entry as its config: DistanceConfig for task distance, BabilongConfig for task
    babilong, else LongRangeConfig."""
    from memzoo.running.babilong import BabilongConfig
    from memzoo.running.distance import DistanceConfig
    from memzoo.running.longrange import LongRangeConfig

    kinds = {"distance": DistanceConfig, "babilong": BabilongConfig}
    return kinds.get(options.get("task"), LongRangeConfig)(**options)


def run_evaluation(run_dir: Path, options: dict[str, Any]) -> None:
    """One `longrange:` entry on a trained run, resuming what it already measured."""
    from memzoo.running.babilong import evaluate_babilong
    from memzoo.running.distance import evaluate_distance
    from memzoo.running.longrange import evaluate_longrange

    cfg = evaluation_config(options)
    evaluate = {"distance": evaluate_distance, "babilong": evaluate_babilong}.get(cfg.task, evaluate_longrange)
    evaluate(run_dir, cfg, resume=True, progress=False)


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


def _stages_signature(longrange: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The long-range stages as recorded when done (thread counts do not change results)."""
    return [{k: v for k, v in stage.items() if k != "threads"} for stage in longrange]


def is_finished(spec: RunSpec, stages: list[dict[str, Any]]) -> bool:
    """Trained and evaluated, and exactly these long-range `stages` (`_stages_signature`) are done
    (a stage added or changed since makes the run unfinished; its worker then evaluates only what
    is missing)."""
    if not all(finished(Path(c.out_dir) / c.name, c) for c in spec.chain):  # every training stage, as configured
        return False
    if not stages:
        return True
    done = spec.run_dir / "longrange-done.json"
    return done.is_file() and json.loads(done.read_text()) == stages


def parameter_counts(specs: list[RunSpec]) -> dict[str, int]:
    """Parameters of each run's model (built, not trained)."""
    from memzoo.running.configure import build_model

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


def result_row(run_dir: Path, spec_grid: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """A finished run's result.json as a flat table row (bpb by segment as bpb_seg_<i> columns too)."""
    row = json.loads((run_dir / "result.json").read_text())
    for i, value in enumerate(row.get("bpb_by_segment") or []):
        row[f"bpb_seg_{i}"] = value
    row["gates_json"] = json.dumps(row.pop("gates", {}))
    for task in ("passkey", "recall", "distance", "babilong"):  # long-range rows: one JSON list per run (memzoo.analysis.longrange_table)
        if task in row:
            row[f"{task}_json"] = json.dumps(row.pop(task))
    row["run_dir"] = str(run_dir)
    for key, value in (spec_grid or {}).items():  # grid_mem_len, ...; a run-config key by its last part
        row[f"grid_{key.rsplit('.', 1)[-1]}"] = value
    return row


def write_table(root: Path, specs: list[RunSpec]) -> pd.DataFrame:
    """results.parquet (and .csv) from every finished run of the suite, written atomically. A run
    folder trained under another config (a stale one, not yet re-run) gives no row."""
    rows = []
    for s in specs:
        if (s.run_dir / "result.json").is_file() and config_matches(s.run_dir, s.cfg):
            row = result_row(s.run_dir, s.grid)
            row["suite"] = root.name
            # before fine-tuning (what it cost the LM), the answer loss over the stages, the gates before
            pre = Path(s.pretrain.out_dir) / s.pretrain.name if s.pretrain is not None else None
            row.update(stage_columns(pre, [Path(c.out_dir) / c.name for c in [*s.stages, s.cfg]], row))
            rows.append(row)
    df = pd.DataFrame(rows)
    if rows:
        tmp = root / "results.parquet.tmp"
        df.to_parquet(tmp, index=False)
        os.replace(tmp, root / "results.parquet")
        tmp_csv = root / "results.csv.tmp"
        lists = [c for c in df.columns if df[c].map(lambda v: isinstance(v, (list, tuple))).any()]
        df.drop(columns=lists).to_csv(tmp_csv, index=False)  # per-segment, per-document lists: parquet only
        os.replace(tmp_csv, root / "results.csv")
    return df


def _worker(spec_yaml: dict[str, Optional[str]], run_dir: str, threads: int, imports: list[str],
            longrange: list[dict[str, Any]], share: Optional[tuple[int, int]] = None) -> dict[str, Any]:
    """Every stage of one run in this (fresh) process: pretraining (if any), training or the
    fine-tuning stages in order, long-range evaluations. Each stage resumes or is skipped when
    already done; a stale one is moved aside and trained again (memzoo.running.curriculum). Progress goes
    to run_dir/progress.json. `share` = (jobs, suite pid): threads sized again now, at most `threads`
    (a suite started since is counted; memzoo.suites.threads)."""
    import torch

    from memzoo.running.train import train

    if share is not None:
        threads = min(threads, suite_threads(share[0], suite_pid=share[1], warn=False, count_load=False))
        longrange = [{**lr, "threads": threads} for lr in longrange]
    if threads:
        torch.set_num_threads(threads)
    import_plugins(imports)
    path = Path(run_dir)
    stages = [(stage, _load_yaml_config(text)) for stage, text in spec_yaml.items() if text is not None]
    todo = []  # before anything is written: stale folders (the run's own included) are moved aside
    for _, cfg in stages:
        todo.append(prepare_stage(Path(cfg.out_dir) / cfg.name, cfg, upstream_retrained=any(todo)))
    path.mkdir(parents=True, exist_ok=True)
    done_before = 0
    total = sum(int(cfg.train.steps) for _, cfg in stages)
    for (stage, cfg), needed in zip(stages, todo):
        (path / f"suite-{stage}-config.yaml").write_text(spec_yaml[stage])
        stage_dir = Path(cfg.out_dir) / cfg.name

        def progress(step: int, offset: int = done_before) -> None:
            (path / "progress.json").write_text(json.dumps({"step": offset + step, "steps": total}))

        if needed:
            train(cfg, run_dir=stage_dir, on_step=progress, progress=False)
        done_before += int(cfg.train.steps)
    for options in longrange:
        run_evaluation(path, options)
    if longrange:
        (path / "longrange-done.json").write_text(json.dumps(_stages_signature(longrange)))
    return json.loads((path / "result.json").read_text())


def _load_yaml_config(text: str) -> DictConfig:
    """A stage's resolved run config from its YAML text (validated as `memzoo train` would)."""
    return resolve(_merge_checked(OmegaConf.structured(RunConfig), OmegaConf.create(text), where="suite stage"))


def _stage_yaml(spec: RunSpec) -> dict[str, Optional[str]]:
    """Every training stage's config as YAML, in order: pretrain, stage1, stage2, ..., run."""
    stages = {"pretrain": to_yaml(spec.pretrain) if spec.pretrain is not None else None}
    stages.update({f"stage{i + 1}": to_yaml(c) for i, c in enumerate(spec.stages)})
    return {**stages, "run": to_yaml(spec.cfg)}


def _progress_of(run_dir: Path) -> int:
    try:
        return int(json.loads((run_dir / "progress.json").read_text())["step"])
    except (FileNotFoundError, ValueError, KeyError):
        return 0


def _worker_args(spec: RunSpec, suite: DictConfig, threads: int, longrange: list[dict[str, Any]]) -> tuple:
    """`_worker`'s arguments for one run, whichever launcher runs it."""
    return (_stage_yaml(spec), str(spec.run_dir), threads, list(suite.imports),
            [{**lr, "threads": threads} for lr in longrange])


def collect_suite(suite: DictConfig) -> pd.DataFrame:
    """results.parquet from whatever runs of the suite have finished (`memzoo compare --collect`)."""
    root = suite_dir(suite)
    root.mkdir(parents=True, exist_ok=True)
    return write_table(root, expand(suite))


def run_suite(suite: DictConfig, jobs: Optional[int] = None, progress: bool = True, launcher: Optional[str] = None,
              wait: bool = True) -> pd.DataFrame:
    """Run every unfinished run of the suite; returns the results table. `launcher`: None for local
    worker processes, or one submitit job per run (`slurm`, `submitit-local`; memzoo.suites.launchers)."""
    root = suite_dir(suite)
    root.mkdir(parents=True, exist_ok=True)
    specs = expand(suite)
    for tracker in sorted({str(c.log.tracker) for s in specs for c in s.chain}):
        check_tracker(tracker)  # a missing tensorboard or wandb fails here, before any run starts
    counts = parameter_counts(specs)
    spread = check_parameter_spread_by_width(specs, counts, suite.max_param_spread)
    (root / "suite.yaml").write_text(OmegaConf.to_yaml(suite))
    (root / "params.json").write_text(json.dumps({"counts": counts, "spread": spread}, indent=1))
    if progress:
        print(f"suite {suite.name}: {len(specs)} runs; parameters {min(counts.values()):,}..{max(counts.values()):,} "
              f"(spread {spread:.1%}); folder {root}")

    longrange = [dataclasses.asdict(c) for c in longrange_configs(suite)]
    todo = [s for s in specs if not is_finished(s, _stages_signature(longrange))]
    backbones = [b for b in backbone_specs(suite) if not is_finished(b, [])]
    jobs = jobs or suite.jobs
    if launcher is not None:  # one job per run on a cluster (or submitit's local executor), the same worker
        from memzoo.suites.launchers import launcher_config, run_jobs

        threads = suite.threads_per_job or launcher_config(suite.launcher).cpus_per_task
        if backbones:  # first, and alone: every run starts from them
            failed = run_jobs(launcher, suite, root, backbones, _worker, lambda s: _worker_args(s, suite, threads, []),
                              lambda s: is_finished(s, []), lambda s: None, wait=True, progress=progress)
            if failed:
                raise RuntimeError(f"suite backbone failed: {failed}; its checkpoint is kept, re-run to resume")
        failures = run_jobs(launcher, suite, root, todo, _worker, lambda s: _worker_args(s, suite, threads, longrange),
                            lambda s: is_finished(s, _stages_signature(longrange)), lambda s: write_table(root, specs),
                            wait=wait, progress=progress)
        return _finish(root, specs, failures)
    with Claim(jobs):  # other suites started meanwhile count this one's workers (memzoo.suites.threads)
        return _run_local(suite, root, specs, todo, backbones, longrange, jobs, progress)


def _run_local(suite: DictConfig, root: Path, specs: list[RunSpec], todo: list[RunSpec], backbones: list[RunSpec],
               longrange: list[dict[str, Any]], jobs: int, progress: bool) -> pd.DataFrame:
    """`run_suite`'s local worker processes; threads per worker: suite.threads_per_job, or a share of
    the cores that other suites and programs leave free."""
    threads = suite.threads_per_job or suite_threads(jobs, warn=progress)
    share = None if suite.threads_per_job else (jobs, os.getpid())
    if backbones:  # first, one at a time, with every worker's threads: every run starts from them
        with cf.ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as one:
            for spec in backbones:
                if progress:
                    print(f"suite {suite.name}: training the shared backbone {spec.name} ({spec.steps} steps)")
                one.submit(_worker, *_worker_args(spec, suite, threads * jobs, [])).result()
    total_steps = sum(s.steps for s in specs)
    done_steps = sum(s.steps for s in specs if s not in todo)
    bar = SuiteProgress(suite.name, total_steps, done_steps, len(specs), len(specs) - len(todo), progress)
    failures: dict[str, str] = {}
    ctx = multiprocessing.get_context("spawn")
    pool = cf.ProcessPoolExecutor(max_workers=jobs, mp_context=ctx, max_tasks_per_child=1)
    try:
        futures = {pool.submit(_worker, *_worker_args(s, suite, threads, longrange), share): s for s in todo}
        pending = set(futures)
        finished_steps = done_steps
        while pending:
            done, pending = cf.wait(pending, timeout=1.0, return_when=cf.FIRST_COMPLETED)
            for fut in done:
                spec = futures[fut]
                try:
                    fut.result()
                except Exception as err:  # one failed run must not lose the others
                    failures[spec.name] = f"{type(err).__name__}: {err}"
                    bar.write(f"run {spec.name} failed: {failures[spec.name]} (its checkpoint is kept; re-run to resume)")
                finished_steps += spec.steps
                write_table(root, specs)
                bar.run_finished(spec.name, spec.name not in failures)
            active = [futures[f] for f in pending if f.running()]
            bar.update(finished_steps, {s.name: (_progress_of(s.run_dir), s.steps) for s in active})
    except KeyboardInterrupt:
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    finally:
        bar.close()
        pool.shutdown(wait=True, cancel_futures=True)
    return _finish(root, specs, failures)


class SuiteProgress:
    """A suite's progress: a redrawn bar on a terminal; written to a file or a pipe, one line per
    finished run and a summary every `every` seconds (a redrawn bar there leaves megabytes of
    carriage returns)."""

    def __init__(self, name: str, total_steps: int, done_steps: int, runs: int, runs_done: int, enabled: bool,
                 every: float = 60.0, stream=None):
        self.name, self.total, self.runs, self.runs_done, self.every = name, total_steps, runs, runs_done, every
        self.stream = stream if stream is not None else sys.stderr
        self.enabled, self.start, self.last = enabled, time.monotonic(), time.monotonic()
        self.tty = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
        self.bar = tqdm(total=total_steps, initial=done_steps, desc=f"suite {name}", unit="step", file=self.stream,
                        dynamic_ncols=True) if self.tty else None
        self.steps = done_steps

    def _line(self, text: str) -> None:
        if self.enabled:
            print(f"suite {self.name} [{time.monotonic() - self.start:,.0f} s]: {text}", file=self.stream, flush=True)

    def write(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(text)
        else:
            self._line(text)

    def run_finished(self, name: str, ok: bool) -> None:
        self.runs_done += 1
        if self.bar is None:
            self._line(f"run {name} {'finished' if ok else 'failed'} ({self.runs_done}/{self.runs} runs)")

    def update(self, finished_steps: int, running: dict[str, tuple[int, int]]) -> None:
        """finished_steps: steps of finished runs; running: {run: (step, steps)} of the active ones."""
        self.steps = finished_steps + sum(step for step, _ in running.values())
        if self.bar is not None:
            self.bar.n = self.steps
            self.bar.set_postfix_str(" ".join(f"{n}:{s}/{t}" for n, (s, t) in running.items())[:200])
            self.bar.refresh()
        elif time.monotonic() - self.last >= self.every:
            self.last = time.monotonic()
            active = ", ".join(f"{n} {s}/{t}" for n, (s, t) in running.items())
            self._line(f"{self.steps:,}/{self.total:,} steps, {self.runs_done}/{self.runs} runs done; running: {active}")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _finish(root: Path, specs: list[RunSpec], failures: dict[str, str]) -> pd.DataFrame:
    """The final table; failed runs listed in failures.json and raised (their checkpoints are kept)."""
    df = write_table(root, specs)
    if failures:
        (root / "failures.json").write_text(json.dumps(failures, indent=1))
        raise RuntimeError(f"{len(failures)} of {len(specs)} runs failed: {', '.join(failures)}; see {root}/failures.json")
    return df
