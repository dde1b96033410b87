"""One truncated-BPTT window, forward and backward: the step that training and the mixed
task + corpus fine-tune (memzoo.training.mixing) share."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, ContextManager, Optional


from memzoo.core.losses import token_nll
from memzoo.core.model import MemoryModel, ModelState
from memzoo.core.precision import autocast_context
from memzoo.data.corpus import Batch


@dataclass
class WindowResult:
    nll_sum: float  # nats over the masked targets
    tokens: int
    aux: float
    state: ModelState
    answer_nll: float = 0.0  # nats over the batch's answer targets (batch.answer; none in an LM batch)
    answer_tokens: int = 0


def train_window(model: MemoryModel, batch: Batch, bptt_segments: int, aux_weight: float = 1.0,
                 precision: str = "fp32", state: Optional[ModelState] = None, align_end: bool = False,
                 denominator: Optional[float] = None,
                 block_context: Optional[Callable[[bool], ContextManager]] = None) -> WindowResult:
    """Forward and backward one window, k = bptt_segments segments per model call.

    The state is detached between calls: gradient from a block's last segment reaches that block's
    first segment (s - k + 1) and nothing earlier. Each block is backpropagated as soon as it is
    computed, so at most k segments of graph are alive. Blocks start at segment 0; with
    `align_end` the last block ends at the last segment instead (the first block is the short one),
    so a loss at the end of an example (a task's answer) reaches k whole segments back.

    The summed NLL is divided by `denominator` (default: this batch's target count; a distributed
    run passes its global count / world). `block_context(last)` wraps each block (DDP: no_sync but
    in the last block, so gradients are all-reduced once per window).
    """
    device = batch.tokens.device
    b, s, _ = batch.tokens.shape
    state = state if state is not None else model.initial_state(b, device)
    total = denominator if denominator is not None else int(batch.mask.sum().clamp(min=1))
    nll_sum, aux_sum, answer_sum = 0.0, 0.0, 0.0
    first = (s % bptt_segments or bptt_segments) if align_end else bptt_segments
    starts = [0, *range(first, s, bptt_segments)]
    for start in starts:
        blk = batch.segments(start, min(s, first if start == 0 else start + bptt_segments))
        sync = block_context(start == starts[-1]) if block_context is not None else contextlib.nullcontext()
        with sync:
            with autocast_context(precision, device):
                out = model(blk.tokens, state, blk.reset)
            per_target = token_nll(out.logits, blk.targets)  # [B, k, N]
            nll = per_target * blk.mask
            loss = nll.sum() / total + aux_weight * out.aux_loss
            if loss.requires_grad:
                loss.backward()
        nll_sum += float(nll.sum().detach())
        if blk.answer is not None:
            answer_sum += float((per_target.detach() * blk.answer).sum())
        aux_sum += float(out.aux_loss.detach())
        state = out.state.detach()
    answer_tokens = 0 if batch.answer is None else int(batch.answer.sum())
    return WindowResult(nll_sum, int(batch.mask.sum()), aux_sum, state, answer_sum, answer_tokens)
