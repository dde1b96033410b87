"""Threads per suite worker: a share of the cores that other suites and programs leave free."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from memzoo.suites.threads import Claim, busy_from_stat, other_workers, share_threads


@pytest.mark.parametrize("cores, jobs, others, load, expected", [
    (2, 1, 0, 0.0, 2),    # alone on an idle machine: every core
    (2, 2, 0, 0.0, 1),    # two workers of one suite: a core each
    (2, 1, 1, 0.0, 1),    # a second suite beside one of one worker: half each
    (2, 1, 0, 1.3, 1),    # another program on one core (1.3 busy cores count as one)
    (2, 1, 0, 0.9, 1),    # a run that keeps a core 90% busy counts as one (the lagging load average read 0.9 for it)
    (2, 1, 0, 0.4, 2),    # background noise does not
    (16, 2, 4, 2.0, 6),   # the other suites' workers, not the load they cause too, are the busy cores
    (16, 2, 1, 6.0, 5),   # a heavier load than the claims counts
    (2, 1, 3, 8.0, 1),    # overloaded: one thread each, never zero
])
def test_share_threads_splits_the_free_cores(cores: int, jobs: int, others: int, load: float, expected: int) -> None:
    assert share_threads(cores, jobs, others, load) == expected


@pytest.mark.parametrize("bad", [dict(cores=0), dict(jobs=0), dict(other_workers=-1), dict(load=-0.5)])
def test_share_threads_names_a_bad_value(bad: dict) -> None:
    args = {"cores": 2, "jobs": 1, "other_workers": 0, "load": 0.0, **bad}
    (name, value), = bad.items()
    with pytest.raises(ValueError, match=f"{name}={value}"):
        share_threads(**args)


def test_claims_of_live_suites_count_and_ended_ones_are_removed(tmp_path: Path) -> None:
    with Claim(3, folder=tmp_path):
        assert other_workers(tmp_path) == 0  # its own claim is not another suite's
        assert other_workers(tmp_path, me=-1) == 3  # seen from another process
    assert not list(tmp_path.iterdir())  # removed when the suite ends
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (tmp_path / f"{int(ended.stdout)}.json").write_text(json.dumps({"jobs": 2}))  # a killed suite's claim
    (tmp_path / f"{os.getppid()}.json").write_text(json.dumps({"jobs": 1}))  # a live process's
    assert other_workers(tmp_path) == 1
    assert sorted(p.stem for p in tmp_path.iterdir()) == [str(os.getppid())]


STAT = """cpu  {u0} 0 0 {i0} {w0} 0 0 0 0 0
cpu0 {u0} 0 0 {i0} 0 0 0 0 0 0
cpu1 0 0 0 0 {w0} 0 0 0 0 0
intr 1 2 3
"""


def test_busy_cores_by_hand() -> None:
    """cpu0 busy 300 of 400 ticks, cpu1 waiting on I/O all 400 (idle): 0.75 busy cores; the summed
    "cpu" line and the other lines are not cores."""
    before = STAT.format(u0=1000, i0=500, w0=700)
    after = STAT.format(u0=1300, i0=600, w0=1100)
    assert busy_from_stat(before, after) == pytest.approx(0.75)
    assert busy_from_stat(before, after, cpus={1}) == pytest.approx(0.0)  # only the cores this process may use
    assert busy_from_stat(before, before) == 0.0  # no time elapsed: nothing measured busy
