"""Fresh worker processes (memzoo.core.processes): each task in a process of its own, forked from a
server that imported torch once, yet seeing the submitter's working directory, environment and import
path as they are at submission, as a spawned process would."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from memzoo.core.processes import FreshProcessPool


def _where() -> tuple[int, str, str | None, bool]:
    return os.getpid(), os.getcwd(), os.environ.get("MEMZOO_TEST_MARK"), "/nowhere/on/purpose" in sys.path


def test_each_task_runs_in_a_new_process_in_the_submitters_folder_environment_and_path(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with FreshProcessPool(1) as pool:
        first = pool.submit(_where).result(timeout=120)  # the server starts with the parent as it is now
        monkeypatch.chdir(tmp_path)
        monkeypatch.setenv("MEMZOO_TEST_MARK", "set after the server started")
        monkeypatch.syspath_prepend("/nowhere/on/purpose")
        second = pool.submit(_where).result(timeout=120)
    assert first[0] != second[0] and os.getpid() not in (first[0], second[0])  # one process a task
    assert first[1:] == (os.path.realpath(first[1]), None, False) and first[1] != str(tmp_path)
    assert second[1:] == (str(tmp_path), "set after the server started", True)


def _fails() -> None:
    raise ValueError("a task's error reaches the submitter")


def test_a_tasks_error_is_raised_in_the_submitter() -> None:
    with FreshProcessPool(1) as pool:
        with pytest.raises(ValueError, match="reaches the submitter"):
            pool.submit(_fails).result(timeout=120)
