"""What every streamed evaluation (passkey, recall, distance, BABILong) shares: a time and memory
budget checked between model calls (`Meter`), feeding a stream chunk by chunk (`stream`), one piece
of work in a fresh process (`run_isolated`), the run's weights fingerprint and the rule for reusing
a stored row (`reusable`), and atomic writes of the rows into the run folder (`atomic_json`,
`merge_into_result`), so that an interrupted evaluation resumes from what it kept.
"""
from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import time
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any, Callable, Optional, Protocol, TypeVar

import torch
from tqdm.auto import tqdm

from memzoo.core.model import MemoryModel
from memzoo.core.processes import FreshProcessPool, preload_in_workers
from memzoo.runs.disk import atomic_text as _atomic_text
from memzoo.evaluations.run_result import peak_rss_mb
from memzoo.evaluations.generate import StreamingDecoder

T = TypeVar("T")
WORKER_DIED = "out of budget: the worker process died (killed, most likely for memory)"

preload_in_workers(__name__)  # what an isolated evaluation's process imports, once in the fork server


class Budgeted(Protocol):
    """An evaluation config with a budget: its time limit and `budget()` (the limits a row was measured under)."""

    time_limit_s: Optional[float]

    def budget(self) -> dict[str, Optional[float]]: ...

    def settings(self) -> dict[str, Any]: ...


def total_memory_mb() -> float:
    """Physical memory of this machine."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20


def current_rss_mb() -> float:
    """Resident memory of this process now (Linux /proc; falls back to the peak elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return peak_rss_mb()


def default_budget(time_limit_s: Optional[float], memory_limit_mb: Optional[float]) -> dict[str, Optional[float]]:
    """The limits as recorded in a row: the memory limit defaults to 60% of physical memory."""
    return {"time_limit_s": time_limit_s, "memory_limit_mb": memory_limit_mb or round(0.6 * total_memory_mb())}


class OutOfBudget(Exception):
    """A stream passed (or is sure to pass) its time or memory limit."""


class Meter:
    """Checks the time and memory budget between model calls. `project=False` stops only at the
    limits themselves (a stream that yields results on the way is worth running to its limit)."""

    def __init__(self, cfg: Budgeted, project: bool = True):
        self.project = project
        self.start = time.perf_counter()
        self.time_limit = cfg.time_limit_s
        self.memory_limit = cfg.budget()["memory_limit_mb"]
        self.done = 0
        self.marks: list[tuple[int, float]] = [(0, self.start)]  # (tokens done, time)

    def check(self, done: int, total: int) -> None:
        """Stop when the time limit is passed, or is sure to be: after 2% of the tokens, when the
        time so far plus the rest at the rate of the latest half of the work exceeds 1.5 x the
        limit (a lower bound when the state grows, as the rate only gets worse; the margin keeps a
        slow patch on a busy machine from stopping a stream that would have finished)."""
        now = time.perf_counter()
        elapsed = now - self.start
        self.done = done
        self.marks.append((done, now))
        half_done, half_time = next(m for m in self.marks if m[0] >= done // 2)
        rate = (now - half_time) / max(done - half_done, 1)  # seconds per token
        projected = elapsed + rate * (total - done)
        if self.time_limit is not None and done < total:
            if elapsed > self.time_limit:
                raise OutOfBudget(f"time limit {self.time_limit:.0f} s reached after {done:,} of {total:,} tokens per row")
            if self.project and done >= 0.02 * total and projected > 1.5 * self.time_limit:
                raise OutOfBudget(f"time limit {self.time_limit:.0f} s: projected {projected:,.0f} s after {done:,} of "
                                  f"{total:,} tokens per row")
        rss = current_rss_mb()
        if rss > self.memory_limit and done < total:
            raise OutOfBudget(f"memory limit {self.memory_limit:,.0f} MB reached ({rss:,.0f} MB) after {done:,} of {total:,} tokens per row")


def stream(decoder: StreamingDecoder, data: torch.Tensor, meter: Meter, desc: str, progress: bool,
           offset: int = 0, total: Optional[int] = None) -> float:
    """Feed data [B, L] (uint8) chunk by chunk, checking the budget after each; returns the seconds it
    took. `offset` and `total`: where this piece starts in a longer stream and that stream's length
    (what the budget's projection is over; default this piece alone)."""
    chunk = decoder.segments_per_call * decoder.n
    length = data.shape[1]
    total = total if total is not None else offset + length
    start = time.perf_counter()
    with tqdm(total=length, desc=desc, unit="B", unit_scale=True, disable=not progress, dynamic_ncols=True, leave=False) as bar:
        for a in range(0, length, chunk):
            b = min(length, a + chunk)
            decoder.feed(data[:, a:b].long())
            bar.update(b - a)
            meter.check(offset + b, total)
    return time.perf_counter() - start


def measurements(device: torch.device) -> dict[str, Optional[float]]:
    """The process's peak resident memory, and the device's peak allocation on CUDA."""
    cuda = device.type == "cuda"
    return {"peak_rss_mb": peak_rss_mb(), "peak_cuda_mb": torch.cuda.max_memory_allocated(device) / 2**20 if cuda else None}


def run_isolated(worker: Callable[..., T], args: tuple, died: Callable[[], T]) -> T:
    """`worker(*args)` in a fresh process (memzoo.core.processes), so that its peak resident memory is its own and
    an out-of-memory kill loses only it; `died()` is the result when the process dies. The worker
    must be a module-level function and its arguments picklable; its module should call
    `memzoo.core.processes.preload_in_workers(__name__)` so that the fork server imports it once."""
    with FreshProcessPool(1) as pool:
        try:
            return pool.submit(worker, *args).result()
        except BrokenProcessPool:
            return died()


def atomic_text(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file and a rename: a reader never sees half of it; a
    full disk is one DiskFullError line naming the rows' file, the temporary file removed (memzoo.runs.disk)."""
    _atomic_text(path, text, f"the rows ({Path(path).name})")


def forget_before_segment(model: MemoryModel, state: Any, reset: torch.Tensor, batch_size: int) -> tuple[Any, torch.Tensor]:
    """The memory ablation before a segment, (state, reset): with the backbone's sliding window, every
    memory's state fresh and the window kept (what a memory buys beyond the window); without one, the
    whole state reset as at a document start."""
    if model.cfg.attention_span:
        return model.forget_memory(state, batch_size), reset
    return state, torch.ones_like(reset)


def atomic_json(path: Path, obj: Any) -> None:
    """`obj` as indented JSON, written atomically (`atomic_text`)."""
    atomic_text(path, json.dumps(obj, indent=1))


def atomic_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    """Rows as CSV with every column any row has, in first-seen order, written atomically (a benchmark
    rewrites its file after each row, so one cut off keeps what it measured)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fields = list(dict.fromkeys(k for r in rows for k in r))
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=fields)
    writer.writeheader()
    writer.writerows(rows)
    atomic_text(path, text.getvalue())


def method_of(run_dir: Path) -> str:
    """The memory a run folder was trained with (its config.yaml's memory.name)."""
    from omegaconf import OmegaConf

    return str(OmegaConf.load(Path(run_dir) / "config.yaml").memory.name)


def merge_into_result(run_dir: Path, task: str, rows: list[dict[str, Any]]) -> None:
    """result.json (the run's table row) gains the task's rows under its name, without their
    generated texts and keys; nothing else in it changes."""
    path = Path(run_dir) / "result.json"
    row = json.loads(path.read_text()) if path.is_file() else {"name": Path(run_dir).name, "method": method_of(run_dir)}
    row[task] = [{k: v for k, v in r.items() if k not in ("generated", "keys")} for r in rows]
    atomic_json(path, row)


def weights_id(run_dir: Path) -> str:
    """A fingerprint of the run's checkpoint: rows measured with other weights are not reused."""
    digest = hashlib.sha1()
    with open(Path(run_dir) / "checkpoint.pt", "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()[:12]


def trained_run(run_dir: str | Path) -> tuple[Path, str]:
    """The run folder, checked to hold a config and a checkpoint, and its weights' fingerprint."""
    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").is_file():
        raise FileNotFoundError(f"{run_dir} is not a run folder (no config.yaml)")
    if not (run_dir / "checkpoint.pt").is_file():
        raise FileNotFoundError(f"{run_dir} has no checkpoint.pt: train the run before evaluating it")
    return run_dir, weights_id(run_dir)


def in_process(run_dir: Path, isolate: bool, threads: int, model: Optional[MemoryModel]) -> tuple[Any, Optional[MemoryModel]]:
    """(run config, model) to evaluate in this process, torch threads set; (None, model) when every
    piece runs in its own process. `model`: evaluate it instead of the run's trained one."""
    from memzoo.runs.checkpoints import load_trained

    if isolate:
        return None, model
    run_cfg, loaded = load_trained(run_dir)
    if threads:
        torch.set_num_threads(threads)
    return run_cfg, model or loaded


def reusable(row: dict[str, Any], cfg: Budgeted, weights: str) -> bool:
    """A stored row measured with `cfg.settings()` and these weights, and not out of a budget smaller
    than `cfg.budget()` (an out-of-budget row is tried again under larger limits)."""
    if row.get("weights") != weights or any(row.get(k) != v for k, v in cfg.settings().items()):
        return False
    if row.get("status") == "ok":
        return True
    inf = float("inf")
    return all((row.get(k) or inf) >= (v or inf) for k, v in cfg.budget().items())
