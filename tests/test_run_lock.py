"""One process at a time per run folder: a second process refuses (or, in a suite, waits for) a held
run in one line naming the holder, a dead holder's lock is taken over, and the lock goes with the
run however it ends."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pandas as pd
import pytest

from conftest import spy_train
from memzoo.cli import main
from memzoo.runs.checkpoints import load_checkpoint
from memzoo.runs.configure import load_config
from memzoo.runs.lock import Holder, RunLock, live_holder, read_holder
from memzoo.suites.compare import expand, load_suite, run_suite
from memzoo.suites.launchers import release_ended
from memzoo.training.curriculum import move_aside
from memzoo.training.train import train

TINY = ["model.d_model=32", "model.n_layers=2", "model.n_heads=2", "model.segment_len=16", "train.batch_size=2",
        "train.window_segments=2", "train.bptt_segments=2", "train.warmup_steps=1", "train.checkpoint_every=2",
        "train.log_every=1", "data.max_docs=20", "eval.max_docs=2", "eval.max_segments_per_doc=2", "eval.batch_size=2"]


def memzoo_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("memzoo")]


def write_lock(run: Path, **holder) -> None:
    run.mkdir(parents=True, exist_ok=True)
    (run / "lock").write_text(json.dumps({"host": socket.gethostname(), "started": time.time() - 60, **holder}))


def test_a_second_process_does_not_train_a_held_run_and_an_interrupt_releases_it(tmp_path, capsys, monkeypatch) -> None:
    args = ["train", "local", *TINY, f"out_dir={tmp_path}", "name=r", "train.steps=100000"]
    log = tmp_path / "first.err"
    first = subprocess.Popen([sys.executable, "-m", "memzoo.cli", *args], cwd=tmp_path, start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=log.open("w"))
    run, deadline = tmp_path / "r", time.time() + 180
    try:
        while not (run / "checkpoint.pt").is_file():  # the first process is training
            assert first.poll() is None, log.read_text()[-2000:]
            assert time.time() < deadline, "the first process never checkpointed"
            time.sleep(0.05)
        calls: list = []
        spy_train(monkeypatch, calls)
        assert main(args) == 2
        err = capsys.readouterr().err
        assert memzoo_lines(err) == [f"memzoo: error: {run} is held by pid {first.pid} on host {socket.gethostname()} "
                                     f"(since {err.split('(since ')[1].split(')')[0]}): not trained here; wait for it to end"]
        assert calls == [("r", None)]  # refused before its first step
        assert read_holder(run / "lock").pid == first.pid  # the first still holds it
    finally:
        first.send_signal(signal.SIGINT)  # Ctrl-C: interrupted, its checkpoint kept
        first.wait(60)
    assert first.returncode == 130, log.read_text()[-2000:]
    assert not (run / "lock").exists()
    assert load_checkpoint(run)["step"] >= 2


def test_the_lock_names_this_process_while_training_and_goes_with_an_interrupt(tmp_path) -> None:
    cfg = load_config("local", [*TINY, f"out_dir={tmp_path}", "name=r", "train.steps=6"])
    seen = []

    def interrupt(step: int) -> None:
        seen.append(read_holder(tmp_path / "r" / "lock"))
        if step == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(cfg, on_step=interrupt, progress=False, evaluate_at_end=False)
    assert [(h.pid, h.host) for h in seen] == [(os.getpid(), socket.gethostname())] * 3
    assert not (tmp_path / "r" / "lock").exists() and load_checkpoint(tmp_path / "r")["step"] == 3


def test_a_dead_holders_lock_is_taken_over_in_one_line(tmp_path, capsys) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # its pid names no process now
    run = tmp_path / "r"
    write_lock(run, pid=gone.pid)
    assert main(["train", "local", *TINY, f"out_dir={tmp_path}", "name=r", "train.steps=2"]) == 0
    lines = memzoo_lines(capsys.readouterr().err)
    assert len(lines) == 1 and lines[0].startswith(f"memzoo: {run}: the lock of pid {gone.pid} on host ")
    assert lines[0].endswith("is stale (that process has ended): taken over")
    assert load_checkpoint(run)["step"] == 2 and not (run / "lock").exists()


def test_another_hosts_lock_counts_as_held_and_says_how_to_remove_it(tmp_path, capsys) -> None:
    run = tmp_path / "r"
    write_lock(run, host="elsewhere", pid=4242, job="77_3")
    lock = (run / "lock").read_text()
    assert main(["train", "local", *TINY, f"out_dir={tmp_path}", "name=r", "train.steps=2"]) == 2
    lines = memzoo_lines(capsys.readouterr().err)
    assert len(lines) == 1 and f"is held by pid 4242 on host elsewhere" in lines[0] and "SLURM job 77_3" in lines[0]
    assert f"cannot be checked from here: if no process there trains it any more, remove {run / 'lock'}" in lines[0]
    assert (run / "lock").read_text() == lock and sorted(p.name for p in run.iterdir()) == ["lock"]  # nothing trained


def test_a_pid_reused_by_a_later_process_is_a_dead_holder(tmp_path) -> None:
    parent = os.getppid()  # alive, and started before now
    assert Holder(socket.gethostname(), parent, time.time()).alive() is True
    assert Holder(socket.gethostname(), parent, 1000.0).alive() is False  # its lock predates the process
    assert Holder("elsewhere", parent, time.time()).alive() is None


def test_a_folder_moved_aside_under_its_lock_is_held_again(tmp_path) -> None:
    run = tmp_path / "r"
    with RunLock(run) as lock:
        (run / "config.yaml").write_text("stale\n")
        moved = move_aside(run)  # as a suite worker's prepare_stage does to a stale run
        lock.ensure()
        assert read_holder(run / "lock").pid == os.getpid() and not (moved / "lock").exists()
    assert not (run / "lock").exists()


class Spec:
    def __init__(self, run_dir: Path):
        self.run_dir = run_dir


def test_a_suite_rerun_removes_the_lock_of_its_ended_slurm_job(tmp_path) -> None:
    run = tmp_path / "r"
    write_lock(run, host="node7", pid=123, job="55_1")
    release_ended(Spec(run), {"job_id": "55_2"}, progress=False)  # another job's lock: kept
    assert (run / "lock").exists()
    release_ended(Spec(run), {"job_id": "55_1"}, progress=False)
    assert not (run / "lock").exists()


def test_a_suite_waits_for_a_held_run_and_gathers_its_rows_without_training_it(tmp_path, capfd, monkeypatch) -> None:
    path = tmp_path / "tiny.yaml"
    path.write_text(f"name: tiny\nbase: small\nout_dir: {tmp_path / 'results'}\n" + textwrap.dedent("""
        methods: [local]
        seeds: [0]
        token_budget: 512
        jobs: 1
        threads_per_job: 1
        run:
          model: {d_model: 32, n_layers: 2, n_heads: 2, segment_len: 16}
          data: {max_docs: 40}
          train: {batch_size: 2, window_segments: 4, bptt_segments: 2, warmup_steps: 2, checkpoint_every: 2, log_every: 2}
          eval: {batch_size: 2, max_docs: 2, max_segments_per_doc: 2}
    """))
    suite = load_suite(str(path))
    spec = expand(suite)[0]
    import memzoo.suites.runner as runner

    held, said, trained = threading.Event(), threading.Event(), {}
    monkeypatch.setattr(runner, "say", lambda line: (print(f"memzoo: {line}", file=sys.stderr), said.set()))

    def holder() -> None:  # this process holds the run, as the same suite started before would
        with RunLock(spec.run_dir):
            held.set()
            said.wait(120)
            train(spec.cfg, run_dir=spec.run_dir, progress=False)
            trained.update({p.name: p.stat().st_mtime_ns for p in spec.run_dir.iterdir()})

    thread = threading.Thread(target=holder)
    thread.start()
    held.wait(60)
    try:
        table = run_suite(suite, progress=False)
    finally:
        thread.join()
    lines = memzoo_lines(capfd.readouterr().err)
    assert lines == [f"memzoo: {spec.run_dir} is held by pid {os.getpid()} on host {socket.gethostname()} "
                     f"(since {lines[0].split('(since ')[1].split(')')[0]}): not trained here; its rows are gathered "
                     "when it ends"]
    assert list(table["name"]) == [spec.name]
    assert list(pd.read_parquet(spec.run_dir.parent.parent / "results.parquet")["name"]) == [spec.name]
    after = {p.name: p.stat().st_mtime_ns for p in spec.run_dir.iterdir() if p.name in trained}
    assert after["checkpoint.pt"] == trained["checkpoint.pt"] and after["metrics.jsonl"] == trained["metrics.jsonl"]
    assert live_holder(spec.run_dir) is None and not (spec.run_dir / "lock").exists()
