"""Comparison suites: one config names the methods, the shared backbone and data, seeds, an optional
grid of memory options and one token budget; `run_suite` trains and evaluates every run in worker
processes and keeps `results.parquet` (one row per finished run) up to date.

Resumable by construction: a run with a `result.json` is finished and skipped; an unfinished run
resumes from its checkpoint; the table is rewritten atomically from the finished runs' rows after
each run, so a killed suite loses no finished result and never leaves a half-written row.
"""
from __future__ import annotations

import concurrent.futures as cf
import itertools
import json
import multiprocessing
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import pandas as pd
from omegaconf import DictConfig, OmegaConf
from tqdm.auto import tqdm

from memzoo.config import ConfigError, RunConfig, _merge_checked, load_config, preset_path, resolve, to_yaml


@dataclass
class SuiteConfig:
    name: str = "suite"
    base: str = "small"  # the run preset every run starts from; "{method}" in it is replaced per method
    run: Any = field(default_factory=dict)  # overrides of the run config shared by every run
    methods: Any = "all"  # "all": every registered method (plugins from other packages too), or a list
    exclude: list[str] = field(default_factory=list)
    options: Any = field(default_factory=dict)  # {method: {memory option: value}}
    grid: Any = field(default_factory=dict)  # {method: {memory option: [values, ...]}}: one run per combination
    seeds: list[int] = field(default_factory=lambda: [0])
    token_budget: Optional[int] = None  # training bytes per run, the same for every method (sets train.steps)
    imports: list[str] = field(default_factory=list)  # modules or .py files to import first (notebook plugins)
    jobs: int = 1  # worker processes
    threads_per_job: int = 0  # torch threads per worker; 0 = cores // jobs
    max_param_spread: float = 0.10  # (max - min) / min of the parameter counts across runs
    out_dir: str = "results"  # the suite's folder is out_dir/name


@dataclass
class RunSpec:
    name: str
    method: str
    seed: int
    cfg: DictConfig
    grid: dict[str, Any]


def load_suite(name_or_path: Optional[str] = "quick", overrides: Optional[list[str]] = None) -> DictConfig:
    """Schema <- suite YAML (configs/suites/NAME.yaml or a path) <- key=value overrides."""
    schema = OmegaConf.structured(SuiteConfig)
    path = Path(name_or_path) if name_or_path else None
    if path is None or not path.is_file():
        path = preset_path(f"suites/{name_or_path or 'quick'}")
    layers: list[Any] = [OmegaConf.load(path)]
    if overrides:
        for item in overrides:
            if "=" not in item:
                raise ConfigError(f"override {item!r} is not of the form key=value")
        layers.append(OmegaConf.from_dotlist(list(overrides)))
    suite = _merge_checked(schema, *layers, where="suite")
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


def suite_methods(suite: DictConfig) -> list[str]:
    from memzoo.plugins import registered

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


def _run_name(method: str, point: dict[str, Any], seed: int) -> str:
    tag = "".join(f"-{k}{v}" for k, v in point.items())
    return f"{method}{tag}-s{seed}"


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
        for point in _grid_points(dict(suite.grid.get(method, {}) or {})):
            for seed in suite.seeds:
                name = _run_name(method, point, seed)
                cfg = OmegaConf.merge(base, suite.run or {})
                cfg.memory = {"name": method, **options, **point}
                cfg.methods = {}
                cfg.seed, cfg.name, cfg.out_dir = int(seed), name, str(root / "runs")
                cfg = resolve(_merge_checked(OmegaConf.structured(RunConfig), cfg, where=f"suite run {name}"))
                if suite.token_budget:
                    per_step = cfg.train.batch_size * cfg.train.window_segments * cfg.model.segment_len
                    cfg.train.steps = max(1, int(suite.token_budget) // per_step)
                specs.append(RunSpec(name, method, int(seed), cfg, point))
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ConfigError("two suite runs share a name; check the grid and seeds for duplicates")
    return specs


def parameter_counts(specs: list[RunSpec]) -> dict[str, int]:
    """Parameters of each run's model (built, not trained)."""
    from memzoo.train import build_model

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


def result_row(run_dir: Path, spec_grid: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """A finished run's result.json as a flat table row (bpb by segment as bpb_seg_<i> columns too)."""
    row = json.loads((run_dir / "result.json").read_text())
    for i, value in enumerate(row.get("bpb_by_segment") or []):
        row[f"bpb_seg_{i}"] = value
    row["gates_json"] = json.dumps(row.pop("gates", {}))
    row["run_dir"] = str(run_dir)
    for key, value in (spec_grid or {}).items():
        row[f"grid_{key}"] = value
    return row


def write_table(root: Path, specs: list[RunSpec]) -> pd.DataFrame:
    """results.parquet (and .csv) from every finished run of the suite, written atomically."""
    rows = []
    for s in specs:
        run_dir = Path(s.cfg.out_dir) / s.name
        if (run_dir / "result.json").is_file():
            rows.append(result_row(run_dir, s.grid))
    df = pd.DataFrame(rows)
    if rows:
        tmp = root / "results.parquet.tmp"
        df.to_parquet(tmp, index=False)
        os.replace(tmp, root / "results.parquet")
        tmp_csv = root / "results.csv.tmp"
        df.drop(columns=["bpb_by_segment"], errors="ignore").to_csv(tmp_csv, index=False)
        os.replace(tmp_csv, root / "results.csv")
    return df


def _worker(cfg_yaml: str, run_dir: str, threads: int, imports: list[str]) -> dict[str, Any]:
    """Train and evaluate one run in this (fresh) process; progress goes to run_dir/progress.json."""
    import torch

    from memzoo.config import load_config as _load
    from memzoo.train import train

    if threads:
        torch.set_num_threads(threads)
    import_plugins(imports)
    path = Path(run_dir)
    path.mkdir(parents=True, exist_ok=True)
    cfg_file = path / "suite-config.yaml"
    cfg_file.write_text(cfg_yaml)
    cfg = _load(str(cfg_file))

    def progress(step: int) -> None:
        (path / "progress.json").write_text(json.dumps({"step": step, "steps": int(cfg.train.steps)}))

    train(cfg, run_dir=path, on_step=progress, progress=False)
    return json.loads((path / "result.json").read_text())


def _progress_of(run_dir: Path) -> int:
    try:
        return int(json.loads((run_dir / "progress.json").read_text())["step"])
    except (FileNotFoundError, ValueError, KeyError):
        return 0


def run_suite(suite: DictConfig, jobs: Optional[int] = None, progress: bool = True) -> pd.DataFrame:
    """Run every unfinished run of the suite; returns the results table."""
    root = suite_dir(suite)
    root.mkdir(parents=True, exist_ok=True)
    specs = expand(suite)
    counts = parameter_counts(specs)
    spread = check_parameter_spread(counts, suite.max_param_spread)
    (root / "suite.yaml").write_text(OmegaConf.to_yaml(suite))
    (root / "params.json").write_text(json.dumps({"counts": counts, "spread": spread}, indent=1))
    if progress:
        print(f"suite {suite.name}: {len(specs)} runs; parameters {min(counts.values()):,}..{max(counts.values()):,} "
              f"(spread {spread:.1%}); folder {root}")

    todo = [s for s in specs if not (Path(s.cfg.out_dir) / s.name / "result.json").is_file()]
    jobs = jobs or suite.jobs
    threads = suite.threads_per_job or max(1, (os.cpu_count() or 1) // jobs)
    total_steps = sum(int(s.cfg.train.steps) for s in specs)
    done_steps = sum(int(s.cfg.train.steps) for s in specs if s not in todo)
    bar = tqdm(total=total_steps, initial=done_steps, desc=f"suite {suite.name}", unit="step", disable=not progress,
               dynamic_ncols=True)
    failures: dict[str, str] = {}
    ctx = multiprocessing.get_context("spawn")
    pool = cf.ProcessPoolExecutor(max_workers=jobs, mp_context=ctx, max_tasks_per_child=1)
    try:
        futures = {
            pool.submit(_worker, to_yaml(s.cfg), str(Path(s.cfg.out_dir) / s.name), threads, list(suite.imports)): s
            for s in todo
        }
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
                finished_steps += int(spec.cfg.train.steps)
                write_table(root, specs)
            active = [futures[f] for f in pending if f.running()]
            running = {s.name: _progress_of(Path(s.cfg.out_dir) / s.name) for s in active}
            bar.n = finished_steps + sum(running.values())
            bar.set_postfix_str(" ".join(f"{s.name}:{running[s.name]}/{s.cfg.train.steps}" for s in active)[:200])
            bar.refresh()
    except KeyboardInterrupt:
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    finally:
        bar.close()
        pool.shutdown(wait=True, cancel_futures=True)
    df = write_table(root, specs)
    if failures:
        (root / "failures.json").write_text(json.dumps(failures, indent=1))
        raise RuntimeError(f"{len(failures)} of {len(specs)} runs failed: {', '.join(failures)}; see {root}/failures.json")
    return df
