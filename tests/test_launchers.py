"""Suites through submitit's local executor (the SLURM path with real pickling and job folders): a
job killed mid-run, --collect from what finished, and the re-run that resumes it; and the rule that
a run whose job is still queued or running is not submitted again."""
from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

pytest.importorskip("submitit")

from memzoo.cli import main  # noqa: E402
from memzoo.core.config import ConfigError  # noqa: E402
from memzoo.runs.checkpoints import load_checkpoint  # noqa: E402
from memzoo.training.train import train  # noqa: E402
from memzoo.suites.compare import expand, load_suite, run_suite  # noqa: E402
from memzoo.suites.launchers import job_active, launcher_config, make_executor, plan  # noqa: E402

STEPS = 20
SUITE = f"""
name: tiny
base: small
methods: [local, infini-linear]
seeds: [0]
token_budget: {STEPS * 2 * 4 * 16}
threads_per_job: 1
run:
  model: {{d_model: 32, n_layers: 2, n_heads: 2, segment_len: 16}}
  data: {{max_docs: 40}}
  train: {{batch_size: 2, window_segments: 4, bptt_segments: 2, warmup_steps: 2, checkpoint_every: 2, log_every: 5}}
  eval: {{batch_size: 2, max_docs: 2, max_segments_per_doc: 2}}
launcher:
  cpus_per_task: 1
  timeout_min: 10
"""


def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def _kill_after_first_checkpoint(root: Path, run: str, record: dict) -> None:
    """SIGKILL the worker process of `run`'s job once its first checkpoint exists."""
    ckpt, deadline = root / "runs" / run / "checkpoint.pt", time.time() + 180
    while time.time() < deadline:
        jobs = root / "jobs.json"
        if ckpt.is_file() and jobs.is_file():
            controller = int(json.loads(jobs.read_text())[run]["job_id"])
            workers = _children(controller)
            record["step"] = load_checkpoint(root / "runs" / run)["step"]
            for pid in workers:
                os.kill(pid, signal.SIGKILL)
            record["killed"] = workers
            return
        time.sleep(0.05)


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the job's worker process through /proc")
def test_submitit_local_suite_survives_a_killed_job(tmp_path: Path) -> None:
    path = tmp_path / "tiny.yaml"
    path.write_text(SUITE + f"out_dir: {tmp_path / 'results'}\n")
    root = tmp_path / "results" / "tiny"
    suite = load_suite(str(path), ["launcher.poll_s=0.2"])
    record: dict = {}
    killer = threading.Thread(target=_kill_after_first_checkpoint, args=(root, "infini-linear-s0", record))
    killer.start()
    with pytest.raises(RuntimeError, match="1 of 2 runs failed: infini-linear-s0"):
        run_suite(suite, launcher="submitit-local", progress=False)
    killer.join()
    assert record["killed"] and 0 < record["step"] < STEPS, record
    assert not (root / "runs" / "infini-linear-s0" / "result.json").exists()
    assert list((root / "jobs").iterdir()), "submitit's job folders"

    # --collect: the table from what finished, nothing submitted
    assert main(["compare", str(path), "--collect", "--no-report"]) == 0
    assert list(pd.read_parquet(root / "results.parquet")["method"]) == ["local"]

    # the re-run (a suite given by path, a launcher override) resubmits only the killed run, which resumes
    jobs_before = json.loads((root / "jobs.json").read_text())
    assert main(["compare", str(path), "launcher.poll_s=0.2", "--launcher", "submitit-local", "--no-report"]) == 0
    jobs_after = json.loads((root / "jobs.json").read_text())
    assert jobs_after["local-s0"] == jobs_before["local-s0"]  # finished: not submitted again
    assert jobs_after["infini-linear-s0"]["job_id"] != jobs_before["infini-linear-s0"]["job_id"]
    table = pd.read_parquet(root / "results.parquet")
    assert sorted(table["method"]) == ["infini-linear", "local"] and (table["train_steps"] == STEPS).all()

    # resumed, not restarted: metrics from step 1 once each, and exactly the weights of an uninterrupted run
    run_dir = root / "runs" / "infini-linear-s0"
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(5, STEPS + 1, 5))
    spec = next(s for s in expand(suite) if s.name == "infini-linear-s0")
    straight = train(spec.cfg, run_dir=tmp_path / "straight", progress=False, evaluate_at_end=False)
    a, b = load_checkpoint(straight)["model"], load_checkpoint(run_dir)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


class Spec:
    def __init__(self, name: str):
        self.name = name


def test_runs_with_live_jobs_are_not_submitted_again(tmp_path: Path) -> None:
    live = {"kind": "submitit-local", "job_id": str(os.getpid())}  # this process: alive
    dead = {"kind": "submitit-local", "job_id": "999999999"}
    assert job_active(live, tmp_path) and not job_active(dead, tmp_path)
    todo = [Spec("a"), Spec("b"), Spec("c")]
    submit, running = plan(todo, {"a": live, "b": dead}, lambda rec: job_active(rec, tmp_path))
    assert [s.name for s in submit] == ["b", "c"] and [s.name for s in running] == ["a"]


def test_launcher_section_is_checked() -> None:
    assert launcher_config({"partition": "gpu", "gpus_per_node": 1}).partition == "gpu"
    with pytest.raises(ConfigError, match="partitoin"):
        launcher_config({"partitoin": "gpu"})
    with pytest.raises(ConfigError, match="timeout_min"):
        launcher_config({"timeout_min": 0})


def test_slurm_settings_reach_the_sbatch_script(tmp_path: Path, monkeypatch) -> None:
    """The launcher section becomes #SBATCH lines (a stand-in `srun` on PATH: no cluster here)."""
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "srun").write_text("#!/bin/sh\n")
    (tmp_path / "bin" / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    cfg = launcher_config({"partition": "gpu", "account": "proj", "gpus_per_node": 2, "timeout_min": 90,
                           "additional": {"constraint": "a100"}, "setup": ["module load cuda"]})
    script = make_executor("slurm", tmp_path, cfg)._executor._make_submission_file_text("python -m x", "uid")
    for line in ("#SBATCH --partition=gpu", "#SBATCH --account=proj", "#SBATCH --gpus-per-node=2",
                 "#SBATCH --time=90", "#SBATCH --constraint=a100", "module load cuda"):
        assert line in script, line
