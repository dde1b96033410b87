"""Torch threads for a suite's local workers, sized so that suites started side by side share the
cores instead of starving each other (OpenMP threads spin while they wait: two suites of two threads
each on two cores ran about 40 times slower than one).

Each running suite leaves a claim (its number of workers) in a folder of the temporary directory;
a suite sizes its threads from the cores this process may use (`os.sched_getaffinity`), the other
suites' claims and the cores other programs keep busy (sampled from /proc/stat, not the load average,
which lags: a run started a minute before read as 0.9 and a worker of two threads then ran its
steps six times slower beside it), and each worker sizes them again when it starts (a suite started
at the same moment is then seen).
"""
from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Optional

CLAIMS = Path(tempfile.gettempdir()) / "memzoo-workers"


def share_threads(cores: int, jobs: int, other_workers: int, load: float) -> int:
    """Threads per worker for `jobs` workers on `cores` cores that other suites' `other_workers`
    workers and `load` busy cores (other programs, measured) already use: the free cores split evenly
    among the jobs, at least 1 each. Each other worker, and each busy core to the nearest whole, takes one core."""
    if cores < 1 or jobs < 1 or other_workers < 0 or load < 0:
        raise ValueError(f"share_threads(cores={cores}, jobs={jobs}, other_workers={other_workers}, load={load}); "
                         f"expected cores >= 1, jobs >= 1, other_workers >= 0, load >= 0")
    busy = max(other_workers, round(load))  # the busy cores count the other suites' workers too
    return max(1, (cores - busy) // jobs)


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask; os.cpu_count where there is none)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def other_workers(folder: Path = CLAIMS, me: Optional[int] = None) -> int:
    """The workers claimed by the other live suites (claims of ended processes are removed)."""
    me = os.getpid() if me is None else me
    total = 0
    for path in folder.glob("*.json") if folder.is_dir() else []:
        try:
            pid, jobs = int(path.stem), int(json.loads(path.read_text())["jobs"])
        except (ValueError, KeyError, OSError):
            continue
        if pid == me:
            continue
        if _alive(pid):
            total += jobs
        else:
            path.unlink(missing_ok=True)
    return total


class Claim:
    """This suite's claim of `jobs` workers while it runs (a context manager)."""

    def __init__(self, jobs: int, folder: Path = CLAIMS):
        self.path = folder / f"{os.getpid()}.json"
        self.jobs = jobs

    def __enter__(self) -> "Claim":
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text(json.dumps({"jobs": self.jobs}))
        except OSError:  # a read-only temporary folder: no claim, the sizing still counts the load
            pass
        return self

    def __exit__(self, *exc) -> None:
        self.path.unlink(missing_ok=True)


def busy_from_stat(before: str, after: str, cpus: Optional[set[int]] = None) -> float:
    """Cores busy between two readings of /proc/stat: the sum over its "cpuN" lines (those in `cpus`,
    every one when None) of the share of time not idle (idle and iowait are idle)."""
    def times(text: str) -> dict[int, tuple[int, int]]:
        out = {}
        for line in text.splitlines():
            name, *values = line.split()
            if name.startswith("cpu") and name[3:].isdigit():
                v = [int(x) for x in values[:8]]  # user nice system idle iowait irq softirq steal
                out[int(name[3:])] = (sum(v), v[3] + v[4])
        return out
    t0, t1 = times(before), times(after)
    busy = 0.0
    for cpu in t0.keys() & t1.keys():
        elapsed, idle = t1[cpu][0] - t0[cpu][0], t1[cpu][1] - t0[cpu][1]
        if (cpus is None or cpu in cpus) and elapsed > 0:
            busy += 1.0 - idle / elapsed
    return busy


def busy_cores(interval: float = 0.25) -> float:
    """Cores of this process's affinity that other programs keep busy now, sampled over `interval`
    seconds from /proc/stat (this process sleeps meanwhile); the 1-minute load average where there is none."""
    stat = Path("/proc/stat")
    try:
        cpus = os.sched_getaffinity(0)
        before = stat.read_text()
        time.sleep(interval)
        return busy_from_stat(before, stat.read_text(), cpus)
    except (OSError, ValueError, AttributeError):
        return os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0


def suite_threads(jobs: int, suite_pid: Optional[int] = None, warn: bool = True, count_load: bool = True) -> int:
    """Threads per worker now, from this machine's usable cores, the other suites' claims and (with
    `count_load`; a worker's own suite is in it once running) the cores other programs keep busy;
    one line on stderr when the workers must share cores."""
    cores, others = usable_cores(), other_workers(me=suite_pid)
    load = busy_cores() if count_load else 0.0
    threads = share_threads(cores, jobs, others, load)
    if warn and threads * jobs + max(others, round(load)) > cores:
        import sys

        print(f"memzoo: {cores} usable cores, {others} workers of other suites and {load:.1f} busy cores: "
              f"{jobs} worker(s) of {threads} thread(s) share them; expect less than full speed", file=sys.stderr)
    return threads
