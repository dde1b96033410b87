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

import argparse
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch
from tqdm.auto import tqdm

from memzoo.core.model import MemoryModel
from memzoo.data.passkey import key_segment, key_segments_back, passkey_digit_scores, passkey_fixed_bytes, passkey_prompt, random_key, score_passkey
from memzoo.data.recall import recall_example
from memzoo.data.tasks import bytes_to_tensor
from memzoo.evaluations.registry import Command, Evaluation, add_stream_options, fmt, numbers, register_evaluation
from memzoo.evaluations.generate import StreamingDecoder
from memzoo.evaluations.harness import (WORKER_DIED, Meter, OutOfBudget, atomic_json, default_budget, in_process,
                                    measurements, merge_into_result, method_of, reusable, run_isolated, stream,
                                    trained_run)


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
    # alphabet) with length // segment_len segments between pairs and queries (memzoo.evaluations.recall_stream)
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
        return default_budget(self.time_limit_s, self.memory_limit_mb)


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
    meter = Meter(cfg)
    base = {"task": "passkey", "length": length, "tokens": data.shape[1], "rows_in_batch": len(keys),
            **cfg.settings(), **cfg.budget()}
    try:
        seconds = stream(decoder, data, meter, f"passkey {length:,}", progress)
        generated = decoder.generate(cfg.key_digits + 2, feed_last=False).cpu()  # " NNNNN."
    except OutOfBudget as err:
        return [{**base, "depth": d, "status": f"out of budget: {err}", "accuracy": None, "tokens_done": meter.done,
                 "tokens_per_s": None, **measurements(device)} for d in cfg.depths]
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
                     "seconds": seconds, **measurements(device),
                     "keys": [keys[j] for j in idx], "generated": [texts[j].decode("latin-1") for j in idx]})
    return rows


def recall_length(model: MemoryModel, length: int, cfg: LongRangeConfig, precision: str = "fp32",
                  progress: bool = True, task: Any = None) -> list[dict[str, Any]]:
    """One row for one length: `trials` examples streamed as one batch; the pairs and the queries
    are `length` bytes apart at most; teacher-forced accuracy at the answer positions. With
    layout=training, the run's own layout (`task`, memzoo.evaluations.recall_stream)."""
    if cfg.layout == "training":
        from memzoo.evaluations.recall_stream import segment_recall_length

        meter, device = Meter(cfg), next(model.parameters()).device
        base = {"task": "recall", "length": length, "depth": None, "rows_in_batch": cfg.trials, **cfg.settings(),
                **cfg.budget()}
        try:
            rows = segment_recall_length(model, length, cfg, task, precision, meter, stream, progress)
        except OutOfBudget as err:
            return [{**base, "status": f"out of budget: {err}", "accuracy": None, "tokens_done": meter.done,
                     "tokens_per_s": None, **measurements(device)}]
        return [{**base, **r, **measurements(device)} for r in rows]
    gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + length)
    examples = [recall_example(gen, length, cfg.pairs, cfg.queries) for _ in range(cfg.trials)]
    data = torch.stack([bytes_to_tensor(e.tokens, torch.uint8) for e in examples])  # [B, L]
    answers = torch.stack([bytes_to_tensor(e.answers) for e in examples])  # [B, Q]
    del examples
    tail = 2 * cfg.queries  # the queries, each followed by its answer, end the sequence
    device = next(model.parameters()).device
    decoder = StreamingDecoder(model, data.shape[0], cfg.segments_per_call, precision)
    meter = Meter(cfg)
    base = {"task": "recall", "length": length, "depth": None, "tokens": data.shape[1], "rows_in_batch": data.shape[0],
            **cfg.settings(), **cfg.budget()}
    try:
        seconds = stream(decoder, data[:, :-tail], meter, f"recall {length:,}", progress)
        logits = decoder.feed(data[:, -tail:].long(), return_logits=True)  # [B, 2Q, V]
    except OutOfBudget as err:
        return [{**base, "status": f"out of budget: {err}", "accuracy": None, "tokens_done": meter.done,
                 "tokens_per_s": None, **measurements(device)}]
    predicted = logits[:, 0::2].argmax(-1).cpu()  # [B, Q]: the prediction after each query key
    hits = predicted == answers
    return [{**base, "status": "ok", "accuracy": float(hits.float().mean()), "exact": float(hits.all(1).float().mean()),
             "tokens_done": data.shape[1], "tokens_per_s": data.numel() / max(seconds, 1e-9), "seconds": seconds,
             **measurements(device)}]


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
    from memzoo.runs.checkpoints import load_trained

    cfg = LongRangeConfig(**cfg_dict)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    run_cfg, model = load_trained(run_dir)
    rows = evaluate_length(model, length, cfg, run_cfg.train.precision, progress, run_cfg.task)
    for r in rows:
        r["rss_isolated"] = True
    return rows


def _died(length: int, cfg: LongRangeConfig) -> list[dict[str, Any]]:
    """The rows of a length whose worker process died."""
    depths = cfg.depths if cfg.task == "passkey" else [None]
    return [{"task": cfg.task, "length": length, "depth": d, **cfg.settings(), **cfg.budget(), "accuracy": None,
             "tokens_per_s": None, "peak_rss_mb": None, "rss_isolated": True, "status": WORKER_DIED} for d in depths]


def _reusable(row: dict[str, Any], cfg: LongRangeConfig, weights: str) -> bool:
    """Measured with these settings and weights, the same arm of the reset ablation, and not out of
    a budget smaller than this one."""
    return bool(row.get("reset_after_key", False)) == cfg.reset_after_key and reusable(row, cfg, weights)


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
    method = method_of(run_dir)
    for length in tqdm(cfg.lengths, desc=f"{cfg.task} {run_dir.name}", disable=not progress, dynamic_ncols=True):
        if resume and _done(kept, length, cfg, weights):
            continue
        if cfg.isolate:
            rows = run_isolated(_length_worker, (str(run_dir), length, asdict(cfg), progress),
                                lambda: _died(length, cfg))
        else:
            rows = evaluate_length(model, length, cfg, run_cfg.train.precision, progress, run_cfg.task)
            for r in rows:
                r["rss_isolated"] = False
        for r in rows:
            r.update(method=method, weights=weights)
        keys = {_row_key(r) for r in rows}
        kept = [r for r in kept if _row_key(r) not in keys] + rows
        kept.sort(key=lambda r: (r["length"], -1 if r.get("depth") is None else r["depth"], _row_key(r)[2]))
        atomic_json(store, kept)
        merge_into_result(run_dir, cfg.task, kept)
    wanted = set(cfg.lengths)
    return [r for r in kept if r["length"] in wanted and _reusable(r, cfg, weights)]


def _row_key(row: dict[str, Any]) -> tuple:
    """What one stored row stands for: (length, depth, reset ablation or not)."""
    return row["length"], row.get("depth"), bool(row.get("reset_after_key", False))


def _add_arguments(s: argparse.ArgumentParser, default_lengths: str) -> None:
    """The options passkey and recall share."""
    s.add_argument("run_dir", help="a trained run folder (e.g. fine-tuned with task.name=passkey)")
    s.add_argument("--lengths", type=numbers(int, "--lengths"), default=numbers(int, "")(default_lengths),
                   help=f"prompt lengths in bytes, comma-separated (default {default_lengths})")
    s.add_argument("--trials", type=int, default=1, help="examples per length (and depth); one batch per length")
    s.add_argument("--no-isolate", action="store_true", help="run every length in this process (peak RSS is then cumulative)")
    add_stream_options(s, segments_per_call=8, time_limit="seconds per length before 'out of budget' (0: none)")


def _passkey_arguments(s: argparse.ArgumentParser) -> None:
    _add_arguments(s, "4096,32768,262144,1048576")
    s.add_argument("--depths", type=numbers(float, "--depths"), default=[0.0, 0.5, 1.0],
                   help="key depths as fractions, comma-separated (0 start, 1 end; default 0,0.5,1)")
    s.add_argument("--key-digits", type=int, default=5)
    s.add_argument("--reset-after-key", action="store_true",
                   help="the memory-reset ablation: reset the state right after the key's segment (rows kept apart)")


def _recall_arguments(s: argparse.ArgumentParser) -> None:
    _add_arguments(s, "1024,4096,32768")
    s.add_argument("--pairs", type=int, default=16)
    s.add_argument("--queries", type=int, default=8)
    s.add_argument("--layout", choices=["free", "training"], default="free",
                   help="training: the run's own recall-across-segments layout, queries LENGTH bytes after the pairs")
    s.add_argument("--reset-after-key", action="store_true",
                   help="with --layout training: reset the state right after the pairs' segment (the ablation)")


def _options(args: argparse.Namespace) -> dict[str, Any]:
    options = dict(task=args.command, lengths=args.lengths, trials=args.trials, seed=args.seed,
                   segments_per_call=args.segments_per_call, time_limit_s=args.time_limit or None,
                   memory_limit_mb=args.memory_limit_mb, isolate=not args.no_isolate, threads=args.threads,
                   reset_after_key=args.reset_after_key)
    if args.command == "passkey":
        return {**options, "depths": args.depths, "key_digits": args.key_digits}
    return {**options, "pairs": args.pairs, "queries": args.queries, "layout": args.layout}


def _shown(r: dict[str, Any]) -> dict[str, Any]:
    return {"length": f"{r['length']:,}", "depth": "" if r.get("depth") is None else r["depth"],
            "segments_back": r.get("key_segments_back", ""), "accuracy": fmt(r.get("accuracy"), ".2f"),
            "tokens_per_s": fmt(r.get("tokens_per_s"), ",.0f"), "peak_rss_mb": fmt(r.get("peak_rss_mb"), ",.0f"),
            "status": r["status"][:90]}


_COLUMNS = ["length", "depth", "segments_back", "accuracy", "tokens_per_s", "peak_rss_mb", "status"]
register_evaluation(Evaluation("passkey", LongRangeConfig, evaluate_longrange, Command(
    "passkey retrieval by streaming: accuracy, tokens/s, peak memory per (length, depth)", _passkey_arguments,
    _options, _shown, _COLUMNS, "passkey.json")))
register_evaluation(Evaluation("recall", LongRangeConfig, evaluate_longrange, Command(
    "multi-query associative recall by streaming, per length", _recall_arguments, _options, _shown,
    [c for c in _COLUMNS if c != "segments_back"], "recall.json")))
