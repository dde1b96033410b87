"""Long-range evaluation by streaming: passkey retrieval and associative recall at lengths up to
1M bytes, fed segment by segment through the state API (`StreamingDecoder`), with a time and
memory budget per length.

Every row of one length is streamed as one batch (all depths x trials; the prompts have equal
length), in a fresh worker process by default so that `peak_rss_mb` is that length's own peak
(a process's peak resident memory only grows). A length that runs past its budget, or whose
worker dies, gives rows with status "out of budget: ..." and no accuracy, not a crash.

Results go to RUN_DIR/passkey.json (or recall.json), written after each length, and into the
run's result.json under "passkey" ("recall"); an interrupted evaluation keeps finished lengths
and skips them when run again. One length's rows are memzoo.evaluations.passkey_recall's.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any, Optional

import torch
from tqdm.auto import tqdm

from memzoo.core.model import MemoryModel
from memzoo.evaluations.passkey_recall import LongRangeConfig, evaluate_length
from memzoo.evaluations.registry import Command, Evaluation, add_stream_options, fmt, numbers, register_evaluation
from memzoo.evaluations.reporting import passkey_notes, passkey_sections, recall_sections
from memzoo.core.processes import preload_in_workers
from memzoo.evaluations.harness import (WORKER_DIED, atomic_json, in_process, merge_into_result, method_of, reusable,
                                        run_isolated, trained_run)

preload_in_workers(__name__)  # its run_isolated workers' module, imported once in the fork server


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
    _options, _shown, _COLUMNS, "passkey.json"), section=passkey_sections, notes=passkey_notes))
register_evaluation(Evaluation("recall", LongRangeConfig, evaluate_longrange, Command(
    "multi-query associative recall by streaming, per length", _recall_arguments, _options, _shown,
    [c for c in _COLUMNS if c != "segments_back"], "recall.json"), section=recall_sections))
