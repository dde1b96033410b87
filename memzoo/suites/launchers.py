"""Suites as cluster jobs: every unfinished run of a suite becomes one submitit job (a SLURM job
array where the runs are submitted together) that runs the same worker as local worker processes
(memzoo.suites.compare passes it in).

`slurm` submits to SLURM; `submitit-local` runs the same path through submitit's local executor
(real pickling, real job folders; how it is tested). Submitted job ids are kept in the suite's
`jobs.json`, so a re-run waits on runs whose jobs are still queued or running instead of submitting
them twice, resumes the others from their checkpoints, and skips finished runs. A job killed on its
node leaves its run folders locked by a process no other host can check (memzoo.runs.lock): the re-run
removes the locks that name an ended job before submitting the run again.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from omegaconf import DictConfig, OmegaConf

from memzoo.core.config import ConfigError
from memzoo.core.overrides import merge_checked
from memzoo.runs.disk import atomic_text
from memzoo.runs.lock import remove_if_job, say

LAUNCHERS = ("local", "submitit-local", "slurm")
# SLURM states (sacct) in which a job may still produce its run; UNKNOWN: submitted, not yet listed.
ACTIVE_STATES = {"PENDING", "RUNNING", "REQUEUED", "CONFIGURING", "COMPLETING", "RESIZING", "SUSPENDED", "UNKNOWN"}


@dataclass
class LauncherConfig:
    """The suite's `launcher:` section (overridable as launcher.KEY=VALUE)."""

    partition: Optional[str] = None  # SLURM partition (None: the cluster's default)
    account: Optional[str] = None  # SLURM account to charge
    gpus_per_node: int = 0  # GPUs per job (one run per job)
    cpus_per_task: int = 2  # CPU cores per job; torch threads too unless suite.threads_per_job is set
    mem_gb: Optional[float] = None  # memory per job (None: the partition's default)
    timeout_min: int = 24 * 60  # wall-clock limit per job; a job cut off resumes when the suite is re-run
    array_parallelism: int = 64  # at most this many jobs of the array at once
    additional: dict[str, Any] = field(default_factory=dict)  # extra #SBATCH flags, e.g. {constraint: a100, qos: high}
    setup: list[str] = field(default_factory=list)  # shell lines run before each job (module load ..., source venv)
    poll_s: float = 10.0  # seconds between checks on the jobs while waiting
    folder: str = "jobs"  # submitit's job folders (pickles, logs), under the suite folder


def launcher_config(section: Any) -> LauncherConfig:
    """The suite's launcher section validated against LauncherConfig (an unknown key names itself)."""
    merged = merge_checked(OmegaConf.structured(LauncherConfig), section or {}, where="suite.launcher")
    cfg = OmegaConf.to_object(merged)
    if cfg.poll_s <= 0 or cfg.timeout_min < 1 or cfg.cpus_per_task < 1 or cfg.gpus_per_node < 0:
        raise ConfigError(f"suite.launcher: poll_s > 0, timeout_min >= 1, cpus_per_task >= 1 and gpus_per_node >= 0 "
                          f"expected; got {cfg}")
    return cfg


def _submitit():
    try:
        import submitit
    except ImportError:
        raise ConfigError("--launcher slurm/submitit-local needs submitit: pip install 'memzoo[slurm]'") from None
    return submitit


def make_executor(kind: str, folder: Path, cfg: LauncherConfig):
    """submitit's executor for `kind` (slurm or submitit-local) with the launcher section's settings."""
    submitit = _submitit()
    if kind not in ("slurm", "submitit-local"):
        raise ConfigError(f"launcher {kind!r}; expected one of {', '.join(LAUNCHERS)}")
    try:
        executor = submitit.AutoExecutor(folder=folder / "%j", cluster="slurm" if kind == "slurm" else "local")
    except RuntimeError as err:  # submitit looks for srun
        raise ConfigError(f"--launcher {kind}: {err} Run it on the cluster's login node, or use --launcher "
                          f"submitit-local to run the jobs on this machine") from None
    params: dict[str, Any] = dict(timeout_min=cfg.timeout_min, cpus_per_task=cfg.cpus_per_task, tasks_per_node=1,
                                  nodes=1, gpus_per_node=cfg.gpus_per_node)
    if cfg.mem_gb is not None:
        params["mem_gb"] = cfg.mem_gb
    if kind == "slurm":
        params.update(slurm_array_parallelism=cfg.array_parallelism,
                      slurm_additional_parameters=dict(cfg.additional), slurm_setup=list(cfg.setup))
        if cfg.partition:
            params["slurm_partition"] = cfg.partition
        if cfg.account:
            params["slurm_account"] = cfg.account
    executor.update_parameters(**params)
    return executor


def _pid_alive(pid: int) -> bool:
    """A process that exists and is not a zombie (a local job's controller)."""
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError, ValueError):
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def job_active(record: dict[str, Any], folder: Path) -> bool:
    """Whether a job recorded in jobs.json (by an earlier invocation) is still queued or running."""
    if record["kind"] == "submitit-local":
        return _pid_alive(int(record["job_id"]))
    return _submitit().SlurmJob(folder / str(record["job_id"]), str(record["job_id"])).state in ACTIVE_STATES


def plan(todo: list[Any], records: dict[str, dict[str, Any]], active) -> tuple[list[Any], list[Any]]:
    """Split the unfinished runs into (to submit, still queued or running: wait, do not resubmit)."""
    running = [s for s in todo if s.name in records and active(records[s.name])]
    return [s for s in todo if s not in running], running


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


def _write_json(path: Path, data: dict[str, Any]) -> None:
    """`data` as JSON, written atomically (a full disk: one DiskFullError line, memzoo.runs.disk)."""
    atomic_text(path, json.dumps(data, indent=1), f"the job ids ({path.name})")


def release_ended(spec: Any, record: dict[str, Any], progress: bool = True) -> None:
    """Remove the locks of `spec`'s run folders (the run's and each training stage's) that its ended
    job `record` left behind (a job killed on its node: no other host can tell that it has ended)."""
    folders = {Path(spec.run_dir), *(Path(c.out_dir) / c.name for c in getattr(spec, "chain", []))}
    for folder in sorted(folders):
        holder = remove_if_job(folder, record["job_id"])
        if holder is not None and progress:
            say(f"{folder}: the lock of {holder.describe()} is stale (its job has ended): removed")


def _failure_text(folder: Path, job_id: str) -> str:
    """The last line of a job's stderr log (submitit names it JOBID_0_log.err)."""
    err = folder / job_id / f"{job_id}_0_log.err"
    lines = [line for line in err.read_text(errors="replace").splitlines() if line.strip()] if err.is_file() else []
    return lines[-1][:300] if lines else f"job {job_id} ended without a result (killed?); see {err.parent}"


def run_jobs(kind: str, suite: DictConfig, root: Path, todo: list[Any], worker: Callable[..., Any], worker_args,
             finished, on_done, wait: bool = True, progress: bool = True) -> dict[str, str]:
    """Submit every run of `todo` not already queued or running as one job each (an array), then
    (with `wait`) poll until all are done. Each job runs `worker(*worker_args(spec))` (the suite's
    worker, the one local worker processes run); `finished(spec)`: whether the run is complete; `on_done(spec)` after each job ends. Returns
    {run name: failure} for runs whose job ended without finishing them."""
    cfg = launcher_config(suite.get("launcher"))
    folder = root / cfg.folder
    folder.mkdir(parents=True, exist_ok=True)
    executor = make_executor(kind, folder, cfg)
    records_path = root / "jobs.json"
    records = _read_json(records_path)
    fresh: dict[str, Any] = {}  # run name -> submitit Job submitted now (its process handle tells when it ends)
    submit, running = plan(todo, records, lambda rec: rec.get("kind") == kind and job_active(rec, folder))
    for spec in submit:
        if spec.name in records:
            release_ended(spec, records[spec.name], progress)
    if submit:
        with executor.batch():
            jobs = [executor.submit(worker, *worker_args(s)) for s in submit]
        for spec, job in zip(submit, jobs):
            fresh[spec.name] = job
            records[spec.name] = {"kind": kind, "job_id": str(job.job_id), "submitted": time.time()}
        _write_json(records_path, records)
    if progress:
        print(f"{kind}: submitted {len(submit)} job(s); {len(running)} still queued or running from before; "
              f"job folders in {folder}; ids in {records_path}")
    if not wait:
        return {}
    pending = {s.name: s for s in [*submit, *running]}
    failures: dict[str, str] = {}
    while pending:
        for name, spec in list(pending.items()):
            job = fresh.get(name)
            if (job is not None and not job.done()) or (job is None and job_active(records[name], folder)):
                continue
            del pending[name]
            if not finished(spec):
                failures[name] = _failure_text(folder, records[name]["job_id"])
                if progress:
                    print(f"run {name} failed: {failures[name]} (its checkpoint is kept; re-run to resume)")
            on_done(spec)
        if pending:
            time.sleep(cfg.poll_s)
    return failures
