"""Titans-MAC's route through attention, taken apart: four diagnostic variants, not methods.

Titans-MAC recalls 0.5 in `capacity-top` where Titans-MAG, with the same memory, recalls 1.0, and
its within-segment accuracy (0.82-0.90) is below `local`'s 1.0, which attention alone reaches.
What only MAC has: the old memory's read r = M_{s-1}(q̃) as extra keys and values in the segment's
attention (used directly as both, the card's stated choice), and the write of the attention's
output y instead of the segment's keys and values. Each variant changes one thing:
- `titans-mac-no-context` attends over [persistent ‖ segment] only;
- `titans-mac-projected` passes the retrieved tokens through the layer's own W_K, W_V, as the paper's
  Attn(S̃) projects every token of [persistent ‖ h ‖ segment] and as the persistent tokens already are
  (heads concatenated into a d_model vector first, so it needs H x D = d_model);
- `titans-mac-writes-kv` writes the segment's own keys and values (as MAG does), not y;
- `titans-mac-mixed-heads` writes y, but each head's write key, value and query see every head's
  output (the paper's y_t is a d_model vector), not its own head's alone.
Run them through a suite as a plugin:

    memzoo compare capacity-top "imports=[experiments/titans/titans_mac_ablation.py]" \
        "methods=[titans-mac-no-context,titans-mac-projected,titans-mac-writes-kv,titans-mac-mixed-heads]" "seeds=[0]"
"""
from __future__ import annotations

import math
from typing import Optional

import torch
from einops import einsum, rearrange
from torch import Tensor, nn

from memzoo.core.attention import KVPrefix
from memzoo.core.config import ModelConfig
from memzoo.core.memory import SegmentInputs, State
from memzoo.core.plugins import register_memory
from memzoo.memories.titans import Titans, TitansConfig


@register_memory("titans-mac-no-context", config=TitansConfig, defaults={"variant": "mac"})
class TitansMACWithoutContext(Titans):
    """MAC whose attention does not see the retrieved tokens (the memory acts only through the gate)."""

    def attend_with_context(self, x: SegmentInputs, retrieved: Tensor, prefix: Optional[KVPrefix]) -> Tensor:
        return x.attend(x.q, x.k, x.v, prefix=prefix)  # [B, H, N, D]


@register_memory("titans-mac-projected", config=TitansConfig, defaults={"variant": "mac"})
class TitansMACProjectedContext(Titans):
    """MAC whose retrieved tokens enter attention through the layer's W_K, W_V (as the paper's Attn(S̃))."""

    def context_kv(self, x: SegmentInputs, retrieved: Tensor) -> tuple[Tensor, Tensor]:
        b, h, n, d = x.q.shape
        if h * d != x.h.shape[-1]:
            raise ValueError(f"titans-mac-projected needs n_heads x d_head = d_model; got {h} x {d} != {x.h.shape[-1]}")
        return x.project_kv(rearrange(retrieved.to(x.q.dtype), "b h n d -> b n (h d)"))  # 2 x [B, H, N, D]


@register_memory("titans-mac-writes-kv", config=TitansConfig, defaults={"variant": "mac"})
class TitansMACWritingKeysValues(Titans):
    """MAC that writes the segment's own keys and values (the backbone's q, k, v through the conv, as
    MAG does) instead of the attention's output y; the read into context and the gate are MAC's."""

    def mac_segment(self, x: SegmentInputs, state: State, q_read: Tensor, gates: tuple[Tensor, Tensor, Tensor],
                    prefix: Optional[KVPrefix]) -> tuple[Tensor, State]:
        retrieved = self.retrieve(state, q_read)  # M_{t−1}, before any write of this segment
        y = self.attend_with_context(x, retrieved, prefix)  # [B, H, N, D]
        q, k, v = self.features(x.q, x.k, x.v)
        m, state = self.write_memory(state, k, v, q, gates)
        return self.combine(y, m), state


@register_memory("titans-mac-mixed-heads", config=TitansConfig, defaults={"variant": "mac"})
class TitansMACMixedHeads(Titans):
    """MAC writing y as the paper's d_model vector: each head's write key, value and gating query are
    maps of every head's output (three H·D x H·D matrices), not of its own head's y alone (D x D shared)."""

    def __init__(self, cfg: TitansConfig, model: ModelConfig, layer_index: int):
        super().__init__(cfg, model, layer_index)
        width = self.n_heads * self.d_head
        self.y_mix = nn.Parameter(torch.randn(3, width, width) / math.sqrt(width))  # [3, out, in]

    def y_features(self, y: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        flat = rearrange(y.to(self.state_dtype()), "b h n d -> b n (h d)")
        yqkv = einsum(flat, self.y_mix.to(self.state_dtype()), "b n i, t o i -> t b n o")
        return self.features(*rearrange(yqkv, "t b n (h d) -> t b h n d", h=self.n_heads).unbind(0))
