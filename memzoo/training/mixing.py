"""A fine-tune that keeps the language model: each step's loss is

    (1 - f) x task loss + f x corpus LM loss,   f = task.lm_fraction,

the corpus loss taken on a corpus batch of the task batch's shape ([B, S, N], the same step).

Why one mixed step and not interleaved batches: every optimizer step then sees exactly the
fraction f of each objective, so AdamW's moments track one fixed objective, and f = 0 or 1 is
exactly a pure task or a pure LM step (tests hold both). The price is two forward/backward passes
per step when 0 < f < 1.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, ContextManager, Optional

import torch
from omegaconf import DictConfig

from memzoo.data.corpus import Batch, load_documents, split_documents
from memzoo.data.samplers import WindowSampler
from memzoo.core.model import MemoryModel
from memzoo.training.windows import train_window

CORPUS_SEED_OFFSET = 104_729  # corpus windows of a task run: a stream of their own, not the task's


@dataclass
class MixedResult:
    task_nll: float  # nats summed over the task's targets (0 when f = 1: not computed)
    task_tokens: int
    lm_nll: float  # nats summed over the corpus targets (0 when f = 0: not computed)
    lm_tokens: int
    aux: float
    answer_nll: float = 0.0  # nats over the task's answer targets (see WindowResult)
    answer_tokens: int = 0


def corpus_batches(cfg: DictConfig) -> Callable[[int, int, int], Batch]:
    """(step, rows, segments) -> a corpus batch [rows, segments, N] from the training split,
    deterministic in (seed, step) so that a resumed run sees the same batches."""
    docs = split_documents(load_documents(cfg.data), cfg.data)
    sampler = WindowSampler(docs["train"], cfg.model.segment_len, int(cfg.seed) + CORPUS_SEED_OFFSET)
    return lambda step, rows, segments: sampler.sample(step, rows, segments)


def mixed_window(model: MemoryModel, task: Batch, corpus: Batch, fraction: float, bptt_segments: int,
                 aux_weight: float = 1.0, precision: str = "fp32", task_denominator: Optional[float] = None,
                 corpus_denominator: Optional[float] = None,
                 block_context: Optional[Callable[[bool], ContextManager]] = None) -> MixedResult:
    """Forward and backward of (1 - f) x task loss + f x corpus loss (gradients accumulate; the
    caller steps the optimizer). Each loss is its batch's mean NLL per target; the task's blocks
    end at its answer (`align_end`), the corpus's start at its first segment, as in an LM run.
    A part with weight 0 is not computed, so f = 0 and f = 1 are the pure steps exactly."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"lm_fraction={fraction}; expected a fraction in [0, 1]")
    if task.tokens.shape != corpus.tokens.shape:
        raise ValueError(f"the corpus batch {list(corpus.tokens.shape)} must have the task batch's shape "
                         f"{list(task.tokens.shape)}")
    device = task.tokens.device
    parts = []  # (name, batch, weight, denominator, align_end)
    if fraction < 1.0:
        parts.append(("task", task, 1.0 - fraction, task_denominator, True))
    if fraction > 0.0:
        parts.append(("lm", corpus, fraction, corpus_denominator, False))
    out = {"task": (0.0, 0), "lm": (0.0, 0)}  # a part not computed counts no targets
    answer = (0.0, 0)
    aux = 0.0
    for i, (name, batch, weight, denominator, align_end) in enumerate(parts):
        total = denominator if denominator is not None else float(batch.mask.sum().clamp(min=1))
        last = i == len(parts) - 1

        def sync(block_last: bool, _last: bool = last) -> ContextManager:
            # DDP: gradients are all-reduced once, in the last block of the last part.
            if block_context is None:
                return contextlib.nullcontext()
            return block_context(block_last and _last)

        res = train_window(model, batch, bptt_segments, aux_weight * weight, precision,
                           state=_initial_state(model, batch.tokens.shape[0], device), align_end=align_end,
                           denominator=total / weight, block_context=sync)
        out[name] = (res.nll_sum, res.tokens)
        if name == "task":
            answer = (res.answer_nll, res.answer_tokens)
        aux += weight * res.aux
    return MixedResult(out["task"][0], out["task"][1], out["lm"][0], out["lm"][1], aux, *answer)


def _initial_state(model, batch_size: int, device: torch.device):
    inner = getattr(model, "module", model)  # DDP wraps the model
    return inner.initial_state(batch_size, device)
