"""Fresh worker processes: each task (a suite's run, an isolated evaluation) in a process of its own, so
that its peak memory is its own and a crash or an out-of-memory kill loses only it. Where the platform
has a fork server, each is forked from a server that imported torch and memzoo once, which saves the
3-4 s import of a spawned process; it then runs in the submitting process's working directory,
environment and import path, as a spawned one would. Elsewhere it is spawned."""
from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import os
import sys
from dataclasses import dataclass
from multiprocessing.context import BaseContext
from typing import Any, Callable, TypeVar

T = TypeVar("T")


PRELOAD: dict[str, None] = {"torch": None}  # imported once in the fork server, in this order


def preload_in_workers(*modules: str) -> None:
    """Have the fork server import `modules` (what a worker of the caller's kind imports anyway). One
    server serves a process, started by its first pool: modules named after that are imported by each
    worker itself, as a spawned one would."""
    PRELOAD.update(dict.fromkeys(modules))


def fresh_context() -> BaseContext:
    """The fork server's context (importing PRELOAD as it starts); spawn where there is no fork server."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(list(PRELOAD))
    return ctx


@dataclass(frozen=True)
class ParentState:
    """What a spawned process takes from its parent at the moment it starts, and a forked server's
    child would otherwise take from the server as it was when the server started."""

    cwd: str
    environ: dict[str, str]
    path: list[str]

    @classmethod
    def now(cls) -> "ParentState":
        return cls(os.getcwd(), dict(os.environ), list(sys.path))

    def enter(self) -> None:
        os.chdir(self.cwd)
        os.environ.clear()
        os.environ.update(self.environ)
        sys.path[:] = self.path


def _as_parent(state: ParentState, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    state.enter()
    return fn(*args, **kwargs)


class FreshProcessPool(cf.ProcessPoolExecutor):
    """A process pool that runs every task in a new process (`fresh_context`), in the submitter's
    working directory, environment and import path as they are when the task is submitted."""

    def __init__(self, max_workers: int = 1) -> None:
        super().__init__(max_workers=max_workers, mp_context=fresh_context(), max_tasks_per_child=1)

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> cf.Future:
        return super().submit(_as_parent, ParentState.now(), fn, *args, **kwargs)
