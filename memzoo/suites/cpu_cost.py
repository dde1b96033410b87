"""CPU cost of a suite's methods, measured side by side: one training window (forward and backward,
`memzoo.training.windows.train_window`, as training calls it) of every variant the suite trains, timed
in one process on one thread, in interleaved rounds (round r times every variant once, in order), the
median per variant, and its speed against `local` measured in the same rounds (local's median seconds
over the variant's: below 1 is slower than the floor).

The models are the suite's own run configs (`memzoo.suites.expansion.expand`, seed 0), built as
training builds them (`build_model`, the shipped backbone loaded where the run starts from it), and a
window is the suite's: `train.batch_size` rows of `train.window_segments` segments, `train.bptt_segments`
segments a call, in the run's precision. A window starts after `carried` bytes of the same documents
already streamed through the model (its state carried, as `train.carry_state` carries it), so a memory
whose cost grows with what it holds (`full`'s cache of the whole document) is timed at each of those
positions; 0 is a document's first window. The documents are the suite's training documents long
enough for the longest position and a window (the first ones in corpus order: every variant reads
the same bytes).

    memzoo.suites.cpu_cost.measure("lm-window") -> rows    (benchmarks/speed/cpu_cost.py writes them)

The rows are shipped as memzoo/references/cpu-cost.csv (`memzoo.publishing.references.MEASURED`);
`memzoo figures` draws their table and figure.
"""
from __future__ import annotations

import os
import platform
import statistics
import time
from dataclasses import dataclass
from datetime import date
from typing import Any, Callable, Hashable, Iterable, Optional, Sequence

import pandas as pd
import torch
from omegaconf import DictConfig

from memzoo.analysis.results import variant_labels
from memzoo.core.model import ModelState
from memzoo.data.corpus import Batch, load_documents, split_documents
from memzoo.runs.checkpoints import load_backbone
from memzoo.runs.configure import build_model
from memzoo.training.backbones import is_shipped, load_shipped_backbone
from memzoo.training.windows import train_window
from memzoo.suites.compare import expand, load_suite
from memzoo.suites.expansion import grid_columns

REFERENCE = "local"  # the variant every speed is taken against (the window floor in lm-window)
CARRIED = (0, 1024, 3072)  # bytes streamed before the timed window: a document's first window, its second, its fourth
# The clocks a window is timed on: this process's CPU seconds (the speeds are taken from them: another job
# on the machine's other core slows them little, where it stretches a wall clock), and the wall clock.
CLOCKS = (time.process_time, time.perf_counter)
COLUMNS = ["suite", "method", "variant", "carried_bytes", "median_s", "local_median_s", "speed_vs_local", "min_s",
           "max_s", "wall_median_s", "clock", "rounds", "threads", "batch_size", "window_segments", "segment_len", "bptt_segments", "machine",
           "torch", "memzoo_version", "date", "load_before", "load_after", "note"]


# ---- the timing, independent of what is timed (a test drives it with a fake clock) -------------

def interleaved(tasks: dict[Hashable, Callable[[], Any]], rounds: int, warmup: int = 1,
                order: Optional[list[Hashable]] = None,
                progress: Callable[[int, dict[Hashable, list[Any]]], None] = lambda done, times: None
                ) -> dict[Hashable, list[Any]]:
    """What every task returns (its own seconds) in each of `rounds` rounds, round r running every task
    once in the dict's order, after `warmup` untimed calls of each (first calls allocate and dispatch).
    A shared, noisy machine slows every task of a round alike, so their ratios hold where the absolute
    times drift. `order` (optional) collects the keys as they run."""
    if rounds < 1:
        raise ValueError(f"rounds={rounds}; expected at least one round")
    for key, task in tasks.items():
        for _ in range(warmup):
            task()
    times: dict[Hashable, list[Any]] = {key: [] for key in tasks}
    for done in range(1, rounds + 1):
        for key, task in tasks.items():
            times[key].append(task())
            if order is not None:
                order.append(key)
        progress(done, times)
    return times


def speeds(times: dict[tuple[str, int], list[float]], reference: str = REFERENCE) -> pd.DataFrame:
    """(variant, carried bytes) -> seconds per round, as one row per key: the median, the reference's
    median at the same carried bytes, and speed_vs_local = the reference's median / the variant's
    (< 1: slower than the reference). Every carried position needs the reference measured there."""
    rows = []
    for (variant, carried), seconds in times.items():
        if (reference, carried) not in times:
            raise ValueError(f"no {reference!r} timed at {carried} carried bytes: every speed is against it, "
                             f"measured in the same rounds")
        ref = statistics.median(times[(reference, carried)])
        med = statistics.median(seconds)
        rows.append({"variant": variant, "carried_bytes": int(carried), "median_s": med, "local_median_s": ref,
                     "speed_vs_local": ref / med, "min_s": min(seconds), "max_s": max(seconds),
                     "rounds": len(seconds)})
    return pd.DataFrame(rows)


# ---- what is timed: the suite's variants, their documents, their carried states -----------------

@dataclass
class Variant:
    label: str  # as the suite's tables name it (memzoo.analysis.variant_labels): "xl mem_len=33"
    method: str
    cfg: DictConfig  # the run config the suite trains (seed 0)


def suite_variants(suite: str, overrides: Sequence[str] = (), methods: Optional[Iterable[str]] = None) -> list[Variant]:
    """Every (method, grid point) the suite trains, at seed 0, labelled as its tables label it; the
    reference first (`methods`: only these methods, the reference always kept)."""
    specs = expand(load_suite(suite, ["seeds=[0]", *overrides]))
    keep = None if methods is None else {*methods, REFERENCE}
    specs = [s for s in specs if keep is None or s.method in keep]
    grid = pd.DataFrame([{"method": s.method, **grid_columns(s.grid)} for s in specs])
    labels = variant_labels(grid).tolist()
    variants = [Variant(label, s.method, s.cfg) for label, s in zip(labels, specs)]
    return sorted(variants, key=lambda v: v.method != REFERENCE)  # stable: the suite's order after the reference


def long_documents(cfg: DictConfig, segments: int, rows: int) -> Batch:
    """`rows` training documents that fill `segments` whole segments (the first such in corpus order), their
    first `segments` segments as one batch [rows, segments, N], a reset at segment 0 only."""
    n = int(cfg.model.segment_len)
    need = segments * n + 1  # every segment whole, its last byte's target included
    docs = [d for d in split_documents(load_documents(cfg.data), cfg.data)["train"] if len(d.data) >= need][:rows]
    if len(docs) < rows:
        raise ValueError(f"only {len(docs)} training documents hold {segments} segments of {n} bytes; {rows} needed")
    data = torch.stack([torch.frombuffer(bytearray(d.data[:need]), dtype=torch.uint8).long() for d in docs])
    reset = torch.zeros(rows, segments, dtype=torch.bool)
    reset[:, 0] = True
    return Batch(tokens=data[:, :-1].reshape(rows, segments, n), targets=data[:, 1:].reshape(rows, segments, n),
                 mask=torch.ones(rows, segments, n, dtype=torch.bool), reset=reset,
                 seg_index=torch.arange(segments).expand(rows, -1).clone())


def model_of(cfg: DictConfig) -> torch.nn.Module:
    """The run's model as training builds it: its seed, its weights, the shipped backbone where it starts from one."""
    torch.manual_seed(int(cfg.seed))
    model = build_model(cfg)
    if is_shipped(cfg.task.init_from):
        load_backbone(model, load_shipped_backbone(cfg.task.init_from, cfg.model, rebase_rope=cfg.task.rebase_rope), cfg.task.init_from)
    return model.train()


@torch.no_grad()
def streamed_state(model: torch.nn.Module, batch: Batch, segments: int) -> ModelState:
    """The state after streaming the batch's first `segments` segments one at a time (as evaluation
    streams; streaming equals one call, an invariant), detached as training carries it."""
    state = model.initial_state(batch.tokens.shape[0], batch.tokens.device)
    for s in range(segments):
        blk = batch.segments(s, s + 1)
        state = model(blk.tokens, state, blk.reset).state
    return state.detach()


def clone_state(state: ModelState) -> ModelState:
    """A copy no window can write into (each timed window starts from the same carried state)."""
    copy = lambda s: {k: v.clone() for k, v in s.items()}  # noqa: E731
    return ModelState([copy(s) for s in state.layers], copy(state.model), [copy(s) for s in state.window])


def window_task(model: torch.nn.Module, cfg: DictConfig, batch: Batch, state: ModelState,
                clocks: Sequence[Callable[[], float]] = CLOCKS) -> Callable[[], tuple[float, ...]]:
    """One timed training window from `state` (a fresh copy each call): its seconds on each clock,
    gradients cleared after the clocks stop."""
    tc = cfg.train

    def run() -> tuple[float, ...]:
        start_state = clone_state(state)
        start = [clock() for clock in clocks]
        train_window(model, batch, int(tc.bptt_segments), float(tc.aux_loss_weight), str(tc.precision), state=start_state)
        seconds = tuple(clock() - s for clock, s in zip(clocks, start))
        model.zero_grad(set_to_none=True)
        return seconds
    return run


def machine() -> str:
    """The CPU's model name (/proc/cpuinfo), else platform.processor(), else the architecture."""
    try:
        for line in open("/proc/cpuinfo").read().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def package_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("memzoo")
    except metadata.PackageNotFoundError:
        return "unknown"


def load_average() -> float:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return float("nan")


def measure(suite: str = "lm-window", rounds: int = 3, carried: Sequence[int] = CARRIED,
            methods: Optional[Iterable[str]] = None, overrides: Sequence[str] = (), threads: int = 1,
            note: str = "", log: Callable[[str], None] = lambda line: None,
            save: Callable[[list[dict[str, Any]]], None] = lambda rows: None) -> list[dict[str, Any]]:
    """Every variant of the suite at every carried position, timed in interleaved rounds (see the module
    docstring); one row per (variant, carried bytes) with the columns of COLUMNS. `save(rows)` is given
    the rows of the rounds so far after each round (a run cut off keeps what it measured)."""
    torch.set_num_threads(threads)
    variants = suite_variants(suite, overrides, methods)
    first = variants[0].cfg
    tc, n = first.train, int(first.model.segment_len)
    window = int(tc.window_segments)
    if any(c % n for c in carried):
        raise ValueError(f"carried bytes {list(carried)}: each a multiple of the segment length {n}")
    lead = [c // n for c in carried]
    batch = long_documents(first, max(lead) + window, int(tc.batch_size))
    tasks: dict[tuple[str, int], Callable[[], tuple[float, ...]]] = {}
    for v in variants:
        if (v.cfg.model.segment_len, v.cfg.train.batch_size, v.cfg.train.window_segments) != (n, tc.batch_size, window):
            raise ValueError(f"{v.label}: another window shape than {variants[0].label}'s; a suite times one shape")
        model = model_of(v.cfg)
        for c, s in zip(carried, lead):
            state = streamed_state(model, batch, s)
            tasks[(v.label, c)] = window_task(model, v.cfg, batch.segments(s, s + window), state)
        log(f"built {v.label}")
    method = {v.label: v.method for v in variants}
    common = {"suite": suite, "clock": "process CPU seconds", "threads": torch.get_num_threads(),
              "batch_size": int(tc.batch_size), "window_segments": window, "segment_len": n,
              "bptt_segments": int(tc.bptt_segments), "machine": machine(), "torch": torch.__version__,
              "memzoo_version": package_version(), "date": date.today().isoformat(), "load_before": load_average(),
              "note": note}

    def rows_of(times: dict) -> list[dict[str, Any]]:
        table = speeds({key: [t[0] for t in seconds] for key, seconds in times.items()})  # CPU seconds
        table["wall_median_s"] = [statistics.median(t[1] for t in times[(v, c)])
                                  for v, c in zip(table["variant"], table["carried_bytes"])]
        rounded = ("median_s", "local_median_s", "min_s", "max_s", "wall_median_s", "speed_vs_local")
        rows = [{**common, **r, **{k: round(float(r[k]), 4) for k in rounded}, "method": method[r["variant"]],
                 "carried_bytes": int(r["carried_bytes"]), "rounds": int(r["rounds"]), "load_after": load_average()}
                for r in table.to_dict("records")]
        return [{k: r[k] for k in COLUMNS} for r in rows]

    def after_round(done: int, times: dict) -> None:
        log(f"round {done} of {rounds} done")
        save(rows_of(times))

    return rows_of(interleaved(tasks, rounds, progress=after_round))


def profile_window(suite: str, variant: str, carried: int = 0, overrides: Sequence[str] = (), threads: int = 1,
                   row_limit: int = 25) -> list[dict[str, Any]]:
    """torch.profiler over one training window of `local` and of `variant` (a label of the suite's, or a
    method: its first variant), after one untimed window each: per model its CPU and wall seconds, the
    profiler's matrix-product FLOPs (mm, bmm, addmm, baddbmm: what the arithmetic needs, in those
    products), the aten calls made and the table of the operators that took the most time."""
    from torch.profiler import ProfilerActivity, profile

    torch.set_num_threads(threads)
    method = variant.split(" ", 1)[0]
    variants = suite_variants(suite, overrides, [method])
    picked = [v for v in variants if v.label == REFERENCE]
    picked += [next(v for v in variants if v.label == variant or (v.method == variant and v.method != REFERENCE))]
    tc = picked[0].cfg.train
    n, window = int(picked[0].cfg.model.segment_len), int(tc.window_segments)
    lead = carried // n
    batch = long_documents(picked[0].cfg, lead + window, int(tc.batch_size))
    out = []
    for v in picked:
        model = model_of(v.cfg)
        task = window_task(model, v.cfg, batch.segments(lead, lead + window), streamed_state(model, batch, lead))
        task()
        with profile(activities=[ProfilerActivity.CPU], with_flops=True) as prof:
            cpu_s, wall_s = task()
        events = prof.key_averages()
        out.append({"variant": v.label, "cpu_s": cpu_s, "wall_s": wall_s,
                    "matmul_gflop": sum(e.flops for e in events) / 1e9,
                    "aten_calls": sum(e.count for e in events if e.key.startswith("aten::")),
                    "table": events.table(sort_by="self_cpu_time_total", row_limit=row_limit, max_name_column_width=48)})
    return out
