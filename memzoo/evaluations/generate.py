"""Streaming and generation through the state API, for every memory alike.

`StreamingDecoder` feeds any number of tokens at a time. Whole segments are run and *committed*
(their state becomes the decoder's state); the bytes of an unfinished segment are kept and re-run
from the last committed state whenever logits are needed. So a token inside a partial segment
attends locally to the earlier bytes of its segment *and reads the memory* of every earlier
segment, and the segment is folded into memory exactly when it fills - the same computation as
one call over the whole text (a public Infini port stopped reading memory inside a partial
segment; tests hold this one to one-shot decoding). Re-running a partial segment costs O(n) per
generated token for n <= N bytes in it, and needs no cooperation from the plugin.

Only one window of `segments_per_call` segments of activations is alive at a time, so streaming
1M tokens through a bounded memory takes the memory of 1 window, not of 1M tokens.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from memzoo.core.model import MemoryModel, ModelState
from memzoo.core.precision import autocast_context


class StreamingDecoder:
    """One batch of B sequences advanced in lock-step: `feed` tokens, `generate` greedily."""

    def __init__(self, model: MemoryModel, batch_size: int, segments_per_call: int = 8, precision: str = "fp32"):
        if segments_per_call < 1:
            raise ValueError(f"segments_per_call={segments_per_call}; expected >= 1")
        self.model = model
        self.device = next(model.parameters()).device
        self.n = model.cfg.segment_len
        self.batch_size = batch_size
        self.segments_per_call = segments_per_call
        self.precision = precision
        self.state: ModelState = model.initial_state(batch_size, self.device)  # after the last whole segment
        self.pending = torch.zeros(batch_size, 0, dtype=torch.long, device=self.device)  # [B, n < N]
        self.last_logits: Optional[Tensor] = None  # [B, V] after the last fed token
        self.tokens_seen = 0
        self.segments_done = 0  # whole segments committed
        # [B] int64: each row's state is reset before this segment index (-1: never); the memory-reset
        # ablation of the long-range evaluation (memzoo.evaluations.longrange `reset_after_key`).
        self.reset_at: Optional[Tensor] = None

    def _reset(self, first: int, count: int) -> Optional[Tensor]:
        """[B, count] bool: which rows reset before segments first .. first + count - 1."""
        if self.reset_at is None:
            return None
        if self.reset_at.device != self.device:
            self.reset_at = self.reset_at.to(self.device)  # once, not a host-to-device copy per generated token
        index = torch.arange(first, first + count, device=self.device)  # [count]
        return self.reset_at[:, None] == index[None]

    def _call(self, tokens: Tensor) -> tuple[Tensor, ModelState]:
        """tokens [B, S, n] from the committed state (segments from `segments_done` on) -> (logits
        [B, S*n, V], the state after them)."""
        reset = self._reset(self.segments_done, tokens.shape[1])
        with torch.no_grad(), autocast_context(self.precision, self.device):
            out = self.model(tokens, self.state, reset) if reset is not None else self.model(tokens, self.state)
        return out.logits.float().flatten(1, 2), out.state

    def feed(self, tokens: Tensor, return_logits: bool = False) -> Optional[Tensor]:
        """Append tokens [B, T]; returns their logits [B, T, V] if asked (the prediction after each)."""
        if tokens.dim() != 2 or tokens.shape[0] != self.batch_size:
            raise ValueError(f"feed takes tokens [B={self.batch_size}, T]; got {list(tokens.shape)}")
        self.model.eval()
        t = tokens.shape[1]
        if t == 0:
            return tokens.new_zeros(self.batch_size, 0, self.model.cfg.vocab_size, dtype=torch.float) if return_logits else None
        buf = torch.cat((self.pending, tokens.to(self.device)), dim=1)  # [B, n + T]
        whole = buf.shape[1] // self.n
        parts: list[Tensor] = []
        for start in range(0, whole, self.segments_per_call):
            stop = min(whole, start + self.segments_per_call)
            chunk = buf[:, start * self.n : stop * self.n].view(self.batch_size, stop - start, self.n)
            logits, self.state = self._call(chunk)  # commit: these segments are complete
            self.segments_done += stop - start
            self.last_logits = logits[:, -1]
            if return_logits:
                parts.append(logits)
        self.pending = buf[:, whole * self.n :]
        if self.pending.shape[1]:
            logits, _ = self._call(self.pending[:, None])  # read memory, do not commit
            self.last_logits = logits[:, -1]
            if return_logits:
                parts.append(logits)
        self.tokens_seen += t
        return torch.cat(parts, dim=1)[:, -t:] if return_logits else None

    def peek(self, tokens: Tensor) -> Tensor:
        """Logits [B, T, V] of whole segments `tokens` [B, T] read from the committed state, which they
        leave as it was: a probe (the stream goes on as if they had never been fed)."""
        if self.pending.shape[1] or tokens.dim() != 2 or tokens.shape[0] != self.batch_size or tokens.shape[1] % self.n:
            raise ValueError(f"peek takes whole segments [B={self.batch_size}, T = k x {self.n}] after whole segments; "
                             f"got {list(tokens.shape)} with {self.pending.shape[1]} bytes pending")
        self.model.eval()
        logits, _ = self._call(tokens.to(self.device).view(self.batch_size, -1, self.n))
        return logits

    def generate(self, max_new_tokens: int, temperature: float = 0.0, generator: Optional[torch.Generator] = None,
                 feed_last: bool = True) -> Tensor:
        """Decode [B, max_new_tokens] tokens, feeding each back (greedy when temperature == 0).

        feed_last=False skips feeding the final token (one partial-segment call saved when the
        decoder will not continue)."""
        if self.last_logits is None:
            raise ValueError("feed a prompt of at least one token before generating")
        out = []
        for i in range(max_new_tokens):
            logits = self.last_logits
            if temperature > 0:
                probs = torch.softmax(logits / temperature, dim=-1)
                nxt = torch.multinomial(probs.cpu(), 1, generator=generator).to(self.device)  # [B, 1]
            else:
                nxt = logits.argmax(dim=-1, keepdim=True)  # [B, 1]
            out.append(nxt)
            if feed_last or i + 1 < max_new_tokens:
                self.feed(nxt)
        return torch.cat(out, dim=1)
