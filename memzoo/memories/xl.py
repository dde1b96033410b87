"""Transformer-XL (Dai, Yang, Yang, Carbonell, Le, Salakhutdinov 2019, arXiv 1901.02860).

Segment-level recurrence. Per layer and batch row, a memory of the last `mem_len` positions
before the current segment. For segment s of that layer, with SG = stop-gradient:

    memory_s     = SG(last mem_len positions of [memory_{s-1}; segment s-1])
    A            = softmax(Q [K_mem; K]ᵀ / sqrt(d) + causal mask) [V_mem; V]   (per head)
    memory_{s+1} = SG(last mem_len positions of [memory_s; segment s])

Every query of the segment sees the whole memory plus the segment's causal past, so layer l
reaches l × mem_len positions back (effective context grows with depth).

What the memory holds (`cache`):
* "hidden" (default): the layer's (normed) input hidden states, with keys and values recomputed by
  the current W_K, W_V at each segment, as the paper's equations (k = [SG(h_{τ-1}) ∘ h_τ] W_k) and
  the original code: d_model × mem_len × l numbers ("table1" still reports the K/V count).
* "kv": the layer's keys and values, without positional encoding, as Table 1 of the Infini paper
  counts them: (d_key + d_value) × H × mem_len × l numbers. Same forward values, but W_K, W_V get
  no gradient from the memory slots; in the capacity suite that held XL's recall at 0.48 where
  "hidden" reaches 0.99 (README). Either way no gradient reaches the previous segment's inputs.

Positions: rotary embeddings over the concatenation [memory; segment] in place of the original's
sinusoid relative encoding with learned u, v biases. Positions are relative to the segment's
first token, so memory slot i of C sits at i − C (negative) and RoPE sees the same query-key
offsets whether the input is streamed or run in one call.

With the backbone's sliding window (model.attention_span = W > 0, memzoo.core.window) the window
already shows the previous segment's last W - 1 positions. `beyond_window` (default True) makes the
cache hold what has LEFT the window instead of duplicating it: the mem_len positions before the
window, -(W-1)-mem_len .. -W relative to the segment's first token, so the segment's first query
reaches W + mem_len - 1 positions back. The W - 1 newest positions pushed wait in a delay line (the
same FIFO, capacity mem_len + W - 1, its newest W - 1 slots never attended) until they leave the
window: that line duplicates the window's positions in storage (counted in the footprint as
"window_delay"), never in attention. Queries later in the segment see a gap: positions that left the
window within this segment (-W+1 .. t-W) are in neither. beyond_window=False keeps the cache as
without a window (the last mem_len positions, which the window's keys then repeat in the softmax).
With W = 0 both are the plain XL cache.

Documents: the memory is emptied at a document boundary (the original never does). An empty
slot is masked through `valid`, never attended as a zero vector. State follows the precision
policy (float32 whatever the autocast dtype, float64 in a float64 model); `valid` is bool bookkeeping.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from memzoo.core.attention import KVPrefix
from memzoo.core.config import ModelConfig
from memzoo.core.fifo import (delayed, fifo_init, fifo_push, fifo_reset, hidden_prefix, kv_prefix, kv_slot_numbers,
                              kv_slot_shapes, push_kv, shifted)
from memzoo.core.memory import LayerMemory, SegmentInputs, State, zero_loss
from memzoo.core.plugins import register_memory
from memzoo.core.window import beyond_window_delay

CACHES = ("kv", "hidden")


@dataclass
class XLConfig:
    mem_len: int = 2048  # positions kept per layer (the paper's M; Table 1 uses 2048 = N)
    cache: str = "hidden"  # hidden | kv: cache hidden states (the paper, original code) or keys/values (Table 1)
    beyond_window: bool = True  # with model.attention_span W > 0: the cache holds the mem_len positions before the window


@register_memory("xl", config=XLConfig)
class TransformerXL(LayerMemory):
    """Attention over [stop-gradient memory of the last mem_len positions; segment], per layer."""

    gradient_through_state = False  # the cache is SG(·) by definition
    # folders saved before the option: no window, where beyond_window changes nothing (hashed as absent)
    legacy_options = {"beyond_window": True}

    def __init__(self, cfg: XLConfig, model: ModelConfig, layer_index: int):
        super().__init__(cfg, model, layer_index)
        if int(cfg.mem_len) < 1:
            raise ValueError(f"xl mem_len={cfg.mem_len}; expected a positive int (use method 'local' for no memory)")
        if cfg.cache not in CACHES:
            raise ValueError(f"xl cache={cfg.cache!r}; expected one of {CACHES}")
        self.n_heads, self.d_head = model.n_heads, model.d_head

    def _slot_shapes(self) -> dict[str, tuple[int, ...]]:
        """What one memory slot holds: a key and a value per head, or one hidden state."""
        if self.cfg.cache == "kv":
            return kv_slot_shapes(self.n_heads, self.d_head)
        return {"h": (self.model_cfg.d_model,)}

    @classmethod
    def delay(cls, cfg: XLConfig, model: ModelConfig) -> int:
        """Slots of the delay line before the attended cache: W - 1 with the window and beyond_window, else 0."""
        return beyond_window_delay(model.attention_span, cfg.beyond_window, cls.uses_window)

    def initial_state(self, batch_size: int, device: torch.device) -> State:
        """mem_len + delay empty slots per row ([B, C, H, D] or [B, C, d_model], the policy's state dtype) and `valid` [B, C]."""
        capacity = self.cfg.mem_len + self.delay(self.cfg, self.model_cfg)
        return fifo_init(batch_size, capacity, self._slot_shapes(), device, self.state_dtype())

    def reset_rows(self, state: State, rows: Tensor) -> State:
        """A document start empties the row's memory (its slots become invalid, hence masked)."""
        return fifo_reset(state, rows)

    @classmethod
    def lookback(cls, cfg: XLConfig, model: ModelConfig) -> list[int]:
        # each layer's cache of the last mem_len positions (beyond the window's W - 1 with beyond_window)
        return [int(cfg.mem_len) + cls.delay(cfg, model)] * model.n_layers

    @classmethod
    def footprint(cls, cfg: XLConfig, model: ModelConfig, tokens_seen: int) -> dict[str, int]:
        """Fixed-size buffers: the count does not depend on tokens_seen. With the window's delay line
        (beyond_window, W > 0) "total" adds its W - 1 slots per layer ("window_delay"); "table1" stays
        the paper's mem_len count."""
        table1 = (model.d_head + model.d_head) * model.n_heads * cfg.mem_len * model.n_layers
        per_slot = kv_slot_numbers(model.n_heads, model.d_head) if cfg.cache == "kv" else model.d_model
        delay = per_slot * cls.delay(cfg, model) * model.n_layers
        if cfg.cache == "kv" and not delay:
            return {"total": table1}
        return {"total": per_slot * cfg.mem_len * model.n_layers + delay, "table1": table1, "window_delay": delay}

    def memory_prefix(self, x: SegmentInputs, state: State) -> KVPrefix | None:
        """The memory as keys/values before the segment (no positional encoding stored): the oldest
        mem_len slots, shifted before the window by the delay line's length."""
        delay = self.delay(self.cfg, self.model_cfg)
        state = delayed(state, self.cfg.mem_len, delay)  # the delay line is not attended
        if self.cfg.cache == "kv":
            return shifted(kv_prefix(state), delay)
        return shifted(hidden_prefix(state, x.project_kv, x.h.dtype), delay)  # current W_K, W_V on the cached states

    def segment(self, x: SegmentInputs, state: State) -> tuple[Tensor, State, Tensor]:
        """Attend over [memory_s; segment] (causal), then push the segment into the memory (SG)."""
        out = x.attend(x.q, x.k, x.v, prefix=self.memory_prefix(x, state))  # [B, H, N, D]
        with torch.autocast(device_type=x.q.device.type, enabled=False):
            if self.cfg.cache == "kv":
                state, _evicted = push_kv(state, x.k, x.v)  # keep the newest mem_len slots
            else:
                state, _evicted = fifo_push(state, {"h": x.h.detach()})  # [B, N, d_model]
        return out, state, zero_loss(x.q)
