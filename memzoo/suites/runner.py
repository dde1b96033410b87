"""Running a suite: every unfinished run in a fresh worker process (`worker`: its training stages in
order, then its long-range stages), locally in a process pool or one job per run through a launcher;
the results table rewritten after each run.

A worker holds its run folder (memzoo.runs.lock). A run another process holds (the same suite started
twice) is not trained here: the suite says so in one line, starts it last, and its worker waits for
the holder to end, then gathers the run's rows (or resumes what the holder left unfinished). A write
that runs out of space stops the suite with one DiskFullError line: every later run would fail too;
runs not started are cancelled, the finished runs keep their rows."""
from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import json
import os
import signal
from pathlib import Path
from typing import Any, Optional

import pandas as pd
from omegaconf import DictConfig, OmegaConf

from memzoo.core.config import run_schema, to_yaml
from memzoo.core.interrupt import Terminated
from memzoo.core.overrides import merge_checked
from memzoo.core.processes import FreshProcessPool, preload_in_workers
from memzoo.runs.configure import resolve
from memzoo.runs.disk import DiskFullError, atomic_text, disk_full, is_disk_full, writing
from memzoo.runs.lock import WAITING, RunLock, held_message, live_holder, say
from memzoo.training.curriculum import prepare_stage
from memzoo.evaluations.registry import run_evaluation
from memzoo.runs.tracking import check_tracker
from memzoo.suites.expansion import RunSpec, backbone_specs, expand, suite_dir
from memzoo.suites.params import check_parameter_spread_by_width, parameter_counts
from memzoo.suites.progress import SuiteProgress
from memzoo.suites.stages import is_finished, longrange_configs, stages_signature
from memzoo.suites.suite_plugins import import_plugins
from memzoo.suites.results import write_table
from memzoo.suites.threads import Claim, suite_threads

# What every run's process imports, done once in the fork server: torch._dynamo (torch.optim's first
# optimizer imports it, about 5 s) and this module with what it imports.
preload_in_workers("torch._dynamo", __name__)


def worker(spec_yaml: dict[str, Optional[str]], run_dir: str, threads: int, imports: list[str],
           longrange: list[dict[str, Any]], share: Optional[tuple[int, int]] = None,
           announce: bool = True) -> dict[str, Any]:
    """Every stage of one run in this (fresh) process: pretraining (if any), training or the
    fine-tuning stages in order, long-range evaluations. Each stage resumes or is skipped when
    already done; a stale one is moved aside and trained again (memzoo.training.curriculum). Progress goes
    to run_dir/progress.json. `share` = (jobs, suite pid): threads sized again now, at most `threads`
    (a suite started since is counted; memzoo.suites.threads). The run folder is held throughout; one
    held elsewhere is waited for, with one line unless `announce` is False (the suite said so already)."""
    import torch

    from memzoo.training.train import train

    if share is not None:
        threads = min(threads, suite_threads(share[0], suite_pid=share[1], warn=False, count_load=False))
        longrange = [{**lr, "threads": threads} for lr in longrange]
    if threads:
        torch.set_num_threads(threads)
    import_plugins(imports)
    path = Path(run_dir)
    with RunLock(path, wait=True, announce=announce) as lock:
        stages = [(stage, _load_yaml_config(text)) for stage, text in spec_yaml.items() if text is not None]
        todo = []  # before anything is written: stale folders (the run's own included) are moved aside
        for _, cfg in stages:
            todo.append(prepare_stage(Path(cfg.out_dir) / cfg.name, cfg, upstream_retrained=any(todo)))
        lock.ensure()  # the run's own folder, moved aside, took its lock along
        done_before = 0
        total = sum(int(cfg.train.steps) for _, cfg in stages)
        for (stage, cfg), needed in zip(stages, todo):
            with writing(path, f"the suite's stage config (suite-{stage}-config.yaml)"):
                (path / f"suite-{stage}-config.yaml").write_text(spec_yaml[stage])
            stage_dir = Path(cfg.out_dir) / cfg.name

            def progress(step: int, offset: int = done_before) -> None:
                with writing(path, "the run's progress (progress.json)"):
                    (path / "progress.json").write_text(json.dumps({"step": offset + step, "steps": total}))

            if needed:
                train(cfg, run_dir=stage_dir, on_step=progress, progress=False)
            done_before += int(cfg.train.steps)
        for options in longrange:
            run_evaluation(path, options)
        if longrange:
            atomic_text(path / "longrange-done.json", json.dumps(stages_signature(longrange)),
                        "the long-range stages done (longrange-done.json)")
        return json.loads((path / "result.json").read_text())


def _load_yaml_config(text: str) -> DictConfig:
    """A stage's resolved run config from its YAML text (validated as `memzoo train` would)."""
    return resolve(merge_checked(run_schema(), OmegaConf.create(text), where="suite stage"))


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


def worker_args(spec: RunSpec, suite: DictConfig, threads: int, longrange: list[dict[str, Any]]) -> tuple:
    """`worker`'s arguments for one run, whichever launcher runs it."""
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
    atomic_text(root / "suite.yaml", OmegaConf.to_yaml(suite), "the suite config (suite.yaml)")
    atomic_text(root / "params.json", json.dumps({"counts": counts, "spread": spread}, indent=1),
                "the parameter counts (params.json)")
    if progress:
        print(f"suite {suite.name}: {len(specs)} runs; parameters {min(counts.values()):,}..{max(counts.values()):,} "
              f"(spread {spread:.1%}); folder {root}")

    longrange = [dataclasses.asdict(c) for c in longrange_configs(suite)]
    todo = [s for s in specs if not is_finished(s, stages_signature(longrange))]
    backbones = [b for b in backbone_specs(suite) if not is_finished(b, [])]
    jobs = jobs or suite.jobs
    if launcher is not None:  # one job per run on a cluster (or submitit's local executor), the same worker
        from memzoo.suites.launchers import launcher_config, run_jobs

        threads = suite.threads_per_job or launcher_config(suite.launcher).cpus_per_task
        if backbones:  # first, and alone: every run starts from them
            failed = run_jobs(launcher, suite, root, backbones, worker, lambda s: worker_args(s, suite, threads, []),
                              lambda s: is_finished(s, []), lambda s: None, wait=True, progress=progress)
            if failed:
                raise RuntimeError(f"suite backbone failed: {failed}; its checkpoint is kept, re-run to resume")
        failures = run_jobs(launcher, suite, root, todo, worker, lambda s: worker_args(s, suite, threads, longrange),
                            lambda s: is_finished(s, stages_signature(longrange)), lambda s: write_table(root, specs),
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
        with FreshProcessPool(1) as one:
            for spec in backbones:
                if progress:
                    print(f"suite {suite.name}: training the shared backbone {spec.name} ({spec.steps} steps)")
                one.submit(worker, *worker_args(spec, suite, threads * jobs, [])).result()
    held = {s.name: h for s in todo if (h := live_holder(s.run_dir)) is not None}
    for spec in todo:  # skipped now, started last: their workers wait for the holders, then gather the rows
        if spec.name in held:
            say(held_message(spec.run_dir, held[spec.name], WAITING))
    todo = [s for s in todo if s.name not in held] + [s for s in todo if s.name in held]
    total_steps = sum(s.steps for s in specs)
    done_steps = sum(s.steps for s in specs if s not in todo)
    bar = SuiteProgress(suite.name, total_steps, done_steps, len(specs), len(specs) - len(todo), progress)
    failures: dict[str, str] = {}
    full: Optional[str] = None  # a full disk's one line: the suite stops
    pool = FreshProcessPool(jobs)
    queue = list(todo)  # submitted `jobs` at a time, so that a stop leaves the rest unstarted
    futures: dict[cf.Future, RunSpec] = {}
    try:
        finished_steps = done_steps
        while queue or futures:
            while queue and full is None and len(futures) < jobs:
                spec = queue.pop(0)
                futures[pool.submit(worker, *worker_args(spec, suite, threads, longrange), share, spec.name not in held)] = spec
            if full is not None and not futures:
                break
            done, _ = cf.wait(futures, timeout=1.0, return_when=cf.FIRST_COMPLETED)
            for fut in done:
                spec = futures.pop(fut)
                try:
                    fut.result()
                except Exception as err:  # one failed run must not lose the others
                    failures[spec.name] = f"{type(err).__name__}: {err}"
                    if is_disk_full(err):  # every later run would fail too: none is started
                        full = full or str(err if isinstance(err, DiskFullError) else disk_full(spec.run_dir, f"a file ({err})"))
                    else:
                        bar.write(f"run {spec.name} failed: {failures[spec.name]} (its checkpoint is kept; re-run to resume)")
                finished_steps += spec.steps
                try:
                    write_table(root, specs)
                except DiskFullError as err:
                    full = full or str(err)
                bar.run_finished(spec.name, spec.name not in failures)
            bar.update(finished_steps, {s.name: (_progress_of(s.run_dir), s.steps) for s in futures.values()})
    except KeyboardInterrupt as stop:
        if isinstance(stop, Terminated):  # only this process was signalled: its workers are told as by Ctrl-C
            interrupt_workers(pool)
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    finally:
        bar.close()
        pool.shutdown(wait=True, cancel_futures=True)
    left = len(queue)  # not started: the suite stopped for a full disk
    return _finish(root, specs, failures, full, left)


def interrupt_workers(pool: cf.ProcessPoolExecutor) -> None:
    """SIGINT to every live worker of the pool: each run stops as on Ctrl-C, its checkpoint kept and
    its lock released, instead of training on as an orphan after the suite has stopped."""
    for process in list((getattr(pool, "_processes", None) or {}).values()):
        if process.is_alive() and process.pid:
            try:
                os.kill(process.pid, signal.SIGINT)
            except ProcessLookupError:
                pass


FULL = f"{DiskFullError.__name__}: "  # how a run that failed for a full disk is listed (a job's log too)


def _finish(root: Path, specs: list[RunSpec], failures: dict[str, str], full: Optional[str] = None,
            left: int = 0) -> pd.DataFrame:
    """The final table; failed runs listed in failures.json and raised (their checkpoints are kept). A
    full disk (`full`, or a run's failure) is one DiskFullError line, `left` runs not started."""
    full = full or next((text.split(FULL, 1)[1] for text in failures.values() if FULL in text), None)
    try:
        df = write_table(root, specs)
        if failures:
            atomic_text(root / "failures.json", json.dumps(failures, indent=1), "the failed runs (failures.json)")
    except DiskFullError:
        if full is None:
            raise
    if full is not None:
        raise DiskFullError(f"{full}; the suite stopped: {len(failures)} run(s) failed, {left} not started, "
                            "the finished runs keep their rows")
    if failures:
        raise RuntimeError(f"{len(failures)} of {len(specs)} runs failed: {', '.join(failures)}; see {root}/failures.json")
    return df
