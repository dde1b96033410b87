"""Long-range evaluation by streaming: passkey retrieval and associative recall at lengths up to
1M bytes, fed segment by segment through the state API (`StreamingDecoder`), with a time and
memory budget per length.

Every row of one length is streamed as one batch (all depths x trials; the prompts have equal
length), in a fresh worker process by default so that `peak_rss_mb` is that length's own peak
(a process's peak resident memory only grows). A length that runs past its budget, or whose
worker dies, gives rows with status "out of budget: ..." and no accuracy, not a crash.

Results go to RUN_DIR/passkey.json (or recall.json), written after each length, and into the
run's result.json under "passkey" ("recall"); an interrupted evaluation keeps finished lengths
and skips them when run again.
"""
from __future__ import annotations

import concurrent.futures as cf
import hashlib
import json
import multiprocessing
import os
import time
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch
from tqdm.auto import tqdm

from memzoo.core.model import MemoryModel
from memzoo.data.tasks import (bytes_to_tensor, key_segment, key_segments_back, passkey_digit_scores, passkey_fixed_bytes,
                               passkey_prompt, random_key, recall_example, score_passkey)
from memzoo.running.evaluate import peak_rss_mb
from memzoo.running.generate import StreamingDecoder


def total_memory_mb() -> float:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20


def current_rss_mb() -> float:
    """Resident memory of this process now (Linux /proc; falls back to the peak elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return peak_rss_mb()


@dataclass
class LongRangeConfig:
    """What to measure and the budget per length."""

    task: str = "passkey"  # passkey | recall
    lengths: list[int] = field(default_factory=lambda: [4096, 32768, 262144, 1048576])
    depths: list[float] = field(default_factory=lambda: [0.0, 0.5, 1.0])  # passkey
    trials: int = 1  # examples per (length, depth); different keys
    key_digits: int = 5  # passkey
    pairs: int = 16  # recall
    queries: int = 8  # recall
    # recall: free = P pairs, filler up to the length, Q queries (pairs, queries above); training = the
    # run's own recall-across-segments layout (the capacity suite: its pairs, local queries,
    # alphabet) with length // segment_len segments between pairs and queries (memzoo.running.recall_stream)
    layout: str = "free"
    seed: int = 0
    segments_per_call: int = 8  # segments per model call while streaming (bounds the live activations)
    time_limit_s: Optional[float] = 900.0  # per length; None = no limit
    memory_limit_mb: Optional[float] = None  # resident memory; None = 60% of physical memory
    isolate: bool = True  # each length in a fresh process (per-length peak RSS; survives an OOM kill)
    threads: int = 0  # torch threads in the worker; 0 = torch's default
    # passkey: the memory-reset ablation: each row's state is reset right after the segment holding
    # the key (rows whose key shares the question's segment are not reset); rows are marked
    # `reset_after_key` and kept beside the plain ones. Where the memory carried the key, accuracy
    # must fall to chance.
    reset_after_key: bool = False

    def __post_init__(self) -> None:
        if self.task not in ("passkey", "recall"):
            raise ValueError(f"long-range task={self.task!r}; expected passkey or recall")
        if not self.lengths or min(self.lengths) < 1:
            raise ValueError(f"lengths={self.lengths}; expected positive byte counts")
        if self.task == "passkey" and any(not 0 <= d <= 1 for d in self.depths):
            raise ValueError(f"depths={self.depths}; expected fractions in [0, 1]")
        if self.trials < 1:
            raise ValueError(f"trials={self.trials}; expected >= 1")
        if self.task == "passkey" and not self.depths:
            raise ValueError("depths=[]; expected at least one key depth")
        if not 1 <= self.key_digits <= 18:
            raise ValueError(f"key_digits={self.key_digits}; expected 1..18")
        if self.task == "recall" and not 1 <= self.queries <= self.pairs <= 64:
            raise ValueError(f"pairs={self.pairs}, queries={self.queries}; expected 1 <= queries <= pairs <= 64")
        shortest = passkey_fixed_bytes(self.key_digits) if self.task == "passkey" else 2 * (self.pairs + self.queries)
        if min(self.lengths) < shortest:
            raise ValueError(f"lengths={self.lengths}: {min(self.lengths)} is shorter than the shortest {self.task} "
                             f"example ({shortest} bytes)")
        if self.segments_per_call < 1:
            raise ValueError(f"segments_per_call={self.segments_per_call}; expected >= 1")
        if self.layout not in ("free", "training") or (self.layout == "training" and self.task != "recall"):
            raise ValueError(f"layout={self.layout!r} with task={self.task!r}; expected free, or training for task=recall")
        if self.reset_after_key and self.task != "passkey" and self.layout != "training":
            raise ValueError(f"reset_after_key=True is for task=passkey or task=recall with layout=training; got "
                             f"task={self.task!r}, layout={self.layout!r}")

    def settings(self) -> dict[str, Any]:
        """The options that change results (rows with other settings are not reused)."""
        if self.layout == "training":  # the pairs and queries are the run's own
            keys = ("trials", "seed", "layout")
        else:
            keys = ("trials", "seed", "key_digits") if self.task == "passkey" else ("trials", "seed", "pairs", "queries")
        # reset_after_key only where set: rows measured before the option existed stay reusable
        return {k: getattr(self, k) for k in keys} | ({"reset_after_key": True} if self.reset_after_key else {})

    def budget(self) -> dict[str, Optional[float]]:
        """The limits a row was measured under (an out-of-budget row is retried under larger ones)."""
        return {"time_limit_s": self.time_limit_s, "memory_limit_mb": self.memory_limit_mb or round(0.6 * total_memory_mb())}


class OutOfBudget(Exception):
    pass


class _Meter:
    """Checks the time and memory budget between model calls. `project=False` stops only at the
    limits themselves (a stream that yields results on the way is worth running to its limit)."""

    def __init__(self, cfg: LongRangeConfig, project: bool = True):
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


def _stream(decoder: StreamingDecoder, data: torch.Tensor, meter: _Meter, desc: str, progress: bool,
            offset: int = 0, total: Optional[int] = None) -> float:
    """Feed data [B, L] (uint8) chunk by chunk; returns the seconds it took. `offset` and `total`:
    where this piece starts in a longer stream and that stream's length (what the budget's
    projection is over; default this piece alone)."""
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


def _measurements(device: torch.device) -> dict[str, Optional[float]]:
    cuda = device.type == "cuda"
    return {"peak_rss_mb": peak_rss_mb(), "peak_cuda_mb": torch.cuda.max_memory_allocated(device) / 2**20 if cuda else None}


def passkey_length(model: MemoryModel, length: int, cfg: LongRangeConfig, precision: str = "fp32",
                   progress: bool = True) -> list[dict[str, Any]]:
    """Rows (one per depth) for one length: every depth x trial streamed as one batch."""
    gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + length)
    prompts = [passkey_prompt(length, d, random_key(gen, cfg.key_digits)) for d in cfg.depths for _ in range(cfg.trials)]
    data = torch.stack([bytes_to_tensor(p.prompt, torch.uint8) for p in prompts])  # [B, L]: 1 byte per token
    keys = [p.key for p in prompts]
    n = model.cfg.segment_len
    back = [key_segments_back(p, n) for p in prompts]  # the key's segment, counted back from the question's
    key_at = [key_segment(p, n) for p in prompts]  # the key's segment, counted from the prompt's start
    del prompts  # only `data` (B x L bytes) stays alive while streaming
    device = next(model.parameters()).device
    decoder = StreamingDecoder(model, len(keys), cfg.segments_per_call, precision)
    if cfg.reset_after_key:  # the state forgets everything up to the key's segment (not a key in the question's)
        decoder.reset_at = torch.tensor([s + 1 if k > 0 else -1 for s, k in zip(key_at, back)])
    meter = _Meter(cfg)
    base = {"task": "passkey", "length": length, "tokens": data.shape[1], "rows_in_batch": len(keys),
            **cfg.settings(), **cfg.budget()}
    try:
        seconds = _stream(decoder, data, meter, f"passkey {length:,}", progress)
        generated = decoder.generate(cfg.key_digits + 2, feed_last=False).cpu()  # " NNNNN."
    except OutOfBudget as err:
        return [{**base, "depth": d, "status": f"out of budget: {err}", "accuracy": None, "tokens_done": meter.done,
                 "tokens_per_s": None, **_measurements(device)} for d in cfg.depths]
    texts = [bytes(row.tolist()) for row in generated]
    rows = []
    for i, depth in enumerate(cfg.depths):
        idx = range(i * cfg.trials, (i + 1) * cfg.trials)
        correct = sum(score_passkey(texts[j], keys[j]) for j in idx)
        digits = [passkey_digit_scores(texts[j], keys[j]) for j in idx]  # partial credit per trial
        rows.append({**base, "depth": depth, "status": "ok", "accuracy": correct / cfg.trials, "correct": correct,
                     "digits_in_place": sum(d[0] for d in digits) / cfg.trials,
                     "digits_from_key": sum(d[1] for d in digits) / cfg.trials,
                     "key_segments_back": back[idx[0]],
                     "tokens_done": data.shape[1], "tokens_per_s": data.numel() / max(seconds, 1e-9),
                     "seconds": seconds, **_measurements(device),
                     "keys": [keys[j] for j in idx], "generated": [texts[j].decode("latin-1") for j in idx]})
    return rows


def recall_length(model: MemoryModel, length: int, cfg: LongRangeConfig, precision: str = "fp32",
                  progress: bool = True, task: Any = None) -> list[dict[str, Any]]:
    """One row for one length: `trials` examples streamed as one batch; the pairs and the queries
    are `length` bytes apart at most; teacher-forced accuracy at the answer positions. With
    layout=training, the run's own layout (`task`, memzoo.running.recall_stream)."""
    if cfg.layout == "training":
        from memzoo.running.recall_stream import segment_recall_length

        meter, device = _Meter(cfg), next(model.parameters()).device
        base = {"task": "recall", "length": length, "depth": None, "rows_in_batch": cfg.trials, **cfg.settings(),
                **cfg.budget()}
        try:
            rows = segment_recall_length(model, length, cfg, task, precision, meter, _stream, progress)
        except OutOfBudget as err:
            return [{**base, "status": f"out of budget: {err}", "accuracy": None, "tokens_done": meter.done,
                     "tokens_per_s": None, **_measurements(device)}]
        return [{**base, **r, **_measurements(device)} for r in rows]
    gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + length)
    examples = [recall_example(gen, length, cfg.pairs, cfg.queries) for _ in range(cfg.trials)]
    data = torch.stack([bytes_to_tensor(e.tokens, torch.uint8) for e in examples])  # [B, L]
    answers = torch.stack([bytes_to_tensor(e.answers) for e in examples])  # [B, Q]
    del examples
    tail = 2 * cfg.queries  # the queries, each followed by its answer, end the sequence
    device = next(model.parameters()).device
    decoder = StreamingDecoder(model, data.shape[0], cfg.segments_per_call, precision)
    meter = _Meter(cfg)
    base = {"task": "recall", "length": length, "depth": None, "tokens": data.shape[1], "rows_in_batch": data.shape[0],
            **cfg.settings(), **cfg.budget()}
    try:
        seconds = _stream(decoder, data[:, :-tail], meter, f"recall {length:,}", progress)
        logits = decoder.feed(data[:, -tail:].long(), return_logits=True)  # [B, 2Q, V]
    except OutOfBudget as err:
        return [{**base, "status": f"out of budget: {err}", "accuracy": None, "tokens_done": meter.done,
                 "tokens_per_s": None, **_measurements(device)}]
    predicted = logits[:, 0::2].argmax(-1).cpu()  # [B, Q]: the prediction after each query key
    hits = predicted == answers
    return [{**base, "status": "ok", "accuracy": float(hits.float().mean()), "exact": float(hits.all(1).float().mean()),
             "tokens_done": data.shape[1], "tokens_per_s": data.numel() / max(seconds, 1e-9), "seconds": seconds,
             **_measurements(device)}]


def evaluate_length(model: MemoryModel, length: int, cfg: LongRangeConfig, precision: str = "fp32",
                    progress: bool = True, task: Any = None) -> list[dict[str, Any]]:
    """`task`: the run's task config (recall with layout=training streams its layout)."""
    if next(model.parameters()).device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    if cfg.task == "passkey":
        return passkey_length(model, length, cfg, precision, progress)
    return recall_length(model, length, cfg, precision, progress, task)


def _length_worker(run_dir: str, length: int, cfg_dict: dict[str, Any], progress: bool) -> list[dict[str, Any]]:
    """One length in this (fresh) process."""
    from memzoo.running.checkpoints import load_trained

    cfg = LongRangeConfig(**cfg_dict)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    run_cfg, model = load_trained(run_dir)
    rows = evaluate_length(model, length, cfg, run_cfg.train.precision, progress, run_cfg.task)
    for r in rows:
        r["rss_isolated"] = True
    return rows


def _run_isolated(run_dir: Path, length: int, cfg: LongRangeConfig, progress: bool) -> list[dict[str, Any]]:
    ctx = multiprocessing.get_context("spawn")
    with cf.ProcessPoolExecutor(max_workers=1, mp_context=ctx, max_tasks_per_child=1) as pool:
        future = pool.submit(_length_worker, str(run_dir), length, asdict(cfg), progress)
        try:
            return future.result()
        except BrokenProcessPool:
            depths = cfg.depths if cfg.task == "passkey" else [None]
            return [{"task": cfg.task, "length": length, "depth": d, **cfg.settings(), **cfg.budget(), "accuracy": None,
                     "tokens_per_s": None, "peak_rss_mb": None, "rss_isolated": True,
                     "status": "out of budget: the worker process died (killed, most likely for memory)"}
                    for d in depths]


def _atomic_json(path: Path, obj: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1))
    os.replace(tmp, path)


def weights_id(run_dir: Path) -> str:
    """A fingerprint of the run's checkpoint: rows measured with other weights are not reused."""
    digest = hashlib.sha1()
    with open(run_dir / "checkpoint.pt", "rb") as f:
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
    length runs in its own process. `model`: evaluate it instead of the run's trained one."""
    from memzoo.running.checkpoints import load_trained

    if isolate:
        return None, model
    run_cfg, loaded = load_trained(run_dir)
    if threads:
        torch.set_num_threads(threads)
    return run_cfg, model or loaded


def _reusable(row: dict[str, Any], cfg: LongRangeConfig, weights: str) -> bool:
    """Measured with these settings and weights, the same arm of the reset ablation, and not out of
    a budget smaller than this one."""
    return bool(row.get("reset_after_key", False)) == cfg.reset_after_key and reusable(row, cfg, weights)


def reusable(row: dict[str, Any], cfg: Any, weights: str) -> bool:
    """A stored row measured with `cfg.settings()` and these weights, and not out of a budget smaller
    than `cfg.budget()` (the long-range and the distance evaluations alike)."""
    if row.get("weights") != weights or any(row.get(k) != v for k, v in cfg.settings().items()):
        return False
    if row.get("status") == "ok":
        return True
    inf = float("inf")
    return all((row.get(k) or inf) >= (v or inf) for k, v in cfg.budget().items())


def _done(rows: list[dict[str, Any]], length: int, cfg: LongRangeConfig, weights: str) -> bool:
    """Rows for every depth at this length that can be reused are already there."""
    mine = [r for r in rows if r["length"] == length and _reusable(r, cfg, weights)]
    want = set(cfg.depths) if cfg.task == "passkey" else {None}
    return want <= {r.get("depth") for r in mine}


def evaluate_longrange(run_dir: str | Path, cfg: LongRangeConfig, resume: bool = True, progress: bool = True,
                       model: Optional[MemoryModel] = None) -> list[dict[str, Any]]:
    """Every length of `cfg` for the trained run in `run_dir`; returns this evaluation's rows (one
    per (length, depth) for passkey, per length for recall), keeping them in RUN_DIR/TASK.json and
    the run's result.json after each length. `model`: evaluate this model in-process instead of
    loading the run (with isolate off)."""
    run_dir, weights = trained_run(run_dir)
    store = run_dir / f"{cfg.task}.json"
    kept: list[dict[str, Any]] = json.loads(store.read_text()) if store.is_file() else []
    run_cfg, model = in_process(run_dir, cfg.isolate, cfg.threads, model)
    method = _method_of(run_dir)
    for length in tqdm(cfg.lengths, desc=f"{cfg.task} {run_dir.name}", disable=not progress, dynamic_ncols=True):
        if resume and _done(kept, length, cfg, weights):
            continue
        if cfg.isolate:
            rows = _run_isolated(run_dir, length, cfg, progress)
        else:
            rows = evaluate_length(model, length, cfg, run_cfg.train.precision, progress, run_cfg.task)
            for r in rows:
                r["rss_isolated"] = False
        for r in rows:
            r.update(method=method, weights=weights)
        keys = {_row_key(r) for r in rows}
        kept = [r for r in kept if _row_key(r) not in keys] + rows
        kept.sort(key=lambda r: (r["length"], -1 if r.get("depth") is None else r["depth"], _row_key(r)[2]))
        _atomic_json(store, kept)
        _merge_into_result(run_dir, cfg.task, kept)
    wanted = set(cfg.lengths)
    return [r for r in kept if r["length"] in wanted and _reusable(r, cfg, weights)]


def _row_key(row: dict[str, Any]) -> tuple:
    """What one stored row stands for: (length, depth, reset ablation or not)."""
    return row["length"], row.get("depth"), bool(row.get("reset_after_key", False))


def _method_of(run_dir: Path) -> str:
    from omegaconf import OmegaConf

    return str(OmegaConf.load(run_dir / "config.yaml").memory.name)


def _merge_into_result(run_dir: Path, task: str, rows: list[dict[str, Any]]) -> None:
    """result.json (the run's table row) gains the task's rows under its name; nothing else changes."""
    path = run_dir / "result.json"
    row = json.loads(path.read_text()) if path.is_file() else {"name": run_dir.name, "method": _method_of(run_dir)}
    row[task] = [{k: v for k, v in r.items() if k not in ("generated", "keys")} for r in rows]
    _atomic_json(path, row)
