"""Passkey retrieval and associative recall at one length: what to measure (`LongRangeConfig`), and one
length's rows, every depth x trial streamed as one batch through `StreamingDecoder` under a budget.
memzoo.evaluations.longrange runs the lengths (in worker processes, resumably) and registers both kinds."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from memzoo.core.model import MemoryModel
from memzoo.data.passkey import key_segment, key_segments_back, passkey_digit_scores, passkey_fixed_bytes, passkey_prompt, random_key, score_passkey
from memzoo.data.recall import recall_example
from memzoo.data.tasks import bytes_to_tensor
from memzoo.evaluations.generate import StreamingDecoder
from memzoo.evaluations.harness import Meter, OutOfBudget, default_budget, measurements, stream


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
