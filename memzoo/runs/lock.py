"""One process at a time per run folder: FOLDER/lock, created exclusively (O_CREAT|O_EXCL) and holding
JSON {host, pid, started, job}, is removed when the run ends, whether it finishes, fails or is interrupted.

A process that finds a run held says so in one line naming the holder, and does not train it: `memzoo
train` refuses (RunLockedError), and a suite skips it and gathers its rows when the holder is done (its
worker waits for the lock, then finds the run finished, or resumes what the holder left). Waiting,
not skipping for good, because a suite's final table needs every run's row, and the holder's rows
are the same rows this suite would have trained.

A lock whose holder is dead (this host, and no live process with its pid: os.kill(pid, 0) raises
ProcessLookupError, or the pid now belongs to a process started later) is taken over, with one line
saying so. A lock from another host cannot be checked from here and counts as held; if no process
there trains the run any more (the machine rebooted, the job was killed), remove FOLDER/lock by hand.
A SLURM job writes its id as `job`, and a suite re-run removes the lock of a job that has ended
(memzoo.suites.launchers). Lock checks and takeovers on one host are serialised by flock on the folder.
"""
from __future__ import annotations

import itertools
import json
import os
import socket
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional

from memzoo.runs.disk import writing

try:
    import fcntl
except ImportError:  # not POSIX: checks and takeovers go unserialised
    fcntl = None

LOCK = "lock"
POLL_S = 1.0  # seconds between looks at a held lock while waiting for it
WAITING = "not trained here; its rows are gathered when it ends"  # what a suite does with a held run
_HELD: dict[str, "Holder"] = {}  # lock path -> this process's hold on it (a nested hold is a no-op)


def say(message: str) -> None:
    """One line on stderr."""
    print(f"memzoo: {message}", file=sys.stderr, flush=True)


def slurm_job() -> Optional[str]:
    """This process's SLURM job id as submitit spells it (ARRAY_TASK in an array), None outside SLURM."""
    array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    return f"{array}_{task}" if array and task else os.environ.get("SLURM_JOB_ID")


def _process_start(pid: int) -> Optional[float]:
    """When process `pid` started (seconds since the epoch, from /proc), None where /proc cannot tell;
    float('inf') for a zombie (dead, not yet reaped)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        boot = next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime"))
    except (OSError, IndexError, StopIteration, ValueError):
        return None
    return float("inf") if fields[0] == "Z" else boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Holder:
    """Who holds a run folder: the host and pid of the process, when it took the lock, its SLURM job."""

    host: str
    pid: int
    started: float
    job: Optional[str] = None

    @classmethod
    def me(cls) -> "Holder":
        return cls(socket.gethostname(), os.getpid(), time.time(), slurm_job())

    def describe(self) -> str:
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.started))
        job = f", SLURM job {self.job}" if self.job else ""
        return f"pid {self.pid} on host {self.host} (since {since}{job})"

    def alive(self) -> Optional[bool]:
        """True or False on this host; None for another host's lock, which cannot be checked from here."""
        if self.host != socket.gethostname():
            return None
        if self.pid == os.getpid():  # this process, or a dead one's that had its pid
            return self in _HELD.values()
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # another user's process
            pass
        start = _process_start(self.pid)
        return start is None or start <= self.started + 1.0  # a later start: the pid was reused


class RunLockedError(Exception):
    """A run folder held by another process; its message is the one line the user sees."""


def read_holder(path: Path) -> Optional[Holder]:
    """The holder a lock file names; None when there is no lock. An unreadable one (being written on
    another host, or damaged) names host "unknown", which counts as held."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return None
    try:
        data = json.loads(text)
        return Holder(str(data["host"]), int(data["pid"]), float(data["started"]), data.get("job"))
    except (ValueError, KeyError, TypeError):
        return Holder("unknown", -1, Path(path).stat().st_mtime)


def live_holder(run_dir: Path) -> Optional[Holder]:
    """The process holding `run_dir` now (alive, or on another host), None when it is free or its holder dead."""
    holder = read_holder(Path(run_dir) / LOCK)
    return holder if holder is not None and holder.alive() is not False else None


def held_message(run_dir: Path, holder: Holder, doing: str) -> str:
    """One line: who holds the folder, what this process `doing` about it, and how to remove a lock it cannot check."""
    lock = Path(run_dir) / LOCK
    if holder.host == "unknown":
        return f"{run_dir} has an unreadable lock: {doing}; if no process trains this run, remove {lock}"
    elsewhere = (f"; another host's lock cannot be checked from here: if no process there trains it any more, "
                 f"remove {lock}") if holder.alive() is None else ""
    return f"{run_dir} is held by {holder.describe()}: {doing}{elsewhere}"


@contextmanager
def _serialised(run_dir: Path) -> Iterator[None]:
    """Hold flock on the folder (released by the kernel if this process dies) so that two processes
    of this host never check and take over the same lock at once."""
    fd = os.open(run_dir, os.O_RDONLY)
    try:
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            except OSError:  # a file system without flock
                pass
        yield
    finally:
        os.close(fd)


class RunLock:
    """Hold a run folder for a `with` block (re-entrant within a process). Held by another process:
    RunLockedError, or with `wait`, one line and a wait until it is free. A dead holder's lock is taken over."""

    def __init__(self, run_dir: Path, wait: bool = False, announce: bool = True, tell: Callable[[str], None] = say,
                 enabled: bool = True):
        self.run_dir, self.path = Path(run_dir), Path(run_dir) / LOCK
        self.wait, self.announce, self.tell, self.enabled = wait, announce, tell, enabled
        self.holder: Optional[Holder] = None  # ours, while held
        self.made: list[Path] = []  # folders made for the lock, deepest first
        self.key = str(self.path.resolve())

    def __enter__(self) -> "RunLock":
        held = _HELD.get(self.key)
        if not self.enabled or (held is not None and held.pid == os.getpid()):
            return self
        self.made = list(itertools.takewhile(lambda p: not p.exists(), (self.run_dir, *self.run_dir.parents)))
        self.run_dir.mkdir(parents=True, exist_ok=True)
        told = False
        while (other := self._take()) is not None:
            if not self.wait:
                self._drop_folder()
                raise RunLockedError(held_message(self.run_dir, other, "not trained here; wait for it to end"))
            if self.announce and not told:
                self.tell(held_message(self.run_dir, other, WAITING))
                told = True
            time.sleep(POLL_S)
        _HELD[self.key] = self.holder
        return self

    def __exit__(self, *exc: object) -> None:
        if self.holder is None:
            return
        _HELD.pop(self.key, None)
        if read_holder(self.path) == self.holder:
            self.path.unlink(missing_ok=True)
        self.holder = None
        self._drop_folder()

    def _drop_folder(self) -> None:
        """Remove the folders made only for the lock again (a run stopped before writing anything)."""
        for folder in self.made:
            try:
                folder.rmdir()
            except OSError:  # something was written: keep it, and the folders above it
                break

    def _take(self) -> Optional[Holder]:
        """Create the lock (a dead holder's is taken over); the live (or uncheckable) holder keeping it, else None."""
        with _serialised(self.run_dir):
            while True:
                try:
                    fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
                except FileExistsError:
                    other = read_holder(self.path)
                    if other is None:  # released meanwhile
                        continue
                    if other.alive() is not False:
                        return other
                    self.path.unlink(missing_ok=True)
                    self.tell(f"{self.run_dir}: the lock of {other.describe()} is stale (that process has ended): taken over")
                    continue
                mine = Holder.me()
                try:
                    with writing(self.run_dir, f"the lock ({LOCK})"), os.fdopen(fd, "w") as f:
                        f.write(json.dumps(asdict(mine)))
                except BaseException:
                    self.path.unlink(missing_ok=True)
                    raise
                self.holder = mine
                return None

    def ensure(self) -> None:
        """Hold the folder again after it was moved away whole (a stale stage moved aside, memzoo.training.curriculum):
        the moved copy of this lock is removed and a fresh one made here."""
        if self.holder is None or read_holder(self.path) == self.holder:
            return
        for moved in self.run_dir.parent.glob(f"{self.run_dir.name}.stale-*/{LOCK}"):
            if read_holder(moved) == self.holder:
                moved.unlink()
        self.holder, self.made = None, []
        self.run_dir.mkdir(parents=True, exist_ok=True)
        other = self._take()
        if other is not None:
            _HELD.pop(self.key, None)
            raise RunLockedError(held_message(self.run_dir, other, "taken while this process moved its stale folder aside"))
        _HELD[self.key] = self.holder


def remove_if_job(run_dir: Path, job: str) -> Optional[Holder]:
    """Remove `run_dir`'s lock when SLURM job `job` (one that has ended) holds it; returns that holder."""
    holder = read_holder(Path(run_dir) / LOCK)
    if holder is None or holder.job != str(job):
        return None
    (Path(run_dir) / LOCK).unlink(missing_ok=True)
    return holder
