"""Titans-MAC's route through attention, taken apart: two diagnostic variants, not methods.

Titans-MAC recalls 0.5 in `capacity-top` where Titans-MAG, with the same memory, recalls 1.0, and
its within-segment accuracy (0.82-0.90) is below `local`'s 1.0, which attention alone reaches.
What only MAC has is the old memory's read r = M_{s-1}(q̃) as extra keys and values in the
segment's attention, used directly as both key and value (the card's stated choice). Everything
else is as MAC (the write of y, the gating read of the new memory):
- `titans-mac-no-context` attends over [persistent ‖ segment] only;
- `titans-mac-projected` passes the retrieved tokens through the layer's own W_K, W_V, as the paper's
  Attn(S̃) projects every token of [persistent ‖ h ‖ segment] and as the persistent tokens already are
  (heads concatenated into a d_model vector first, so it needs H x D = d_model);
- `titans-mac-writes-kv` writes the segment's own keys and values (as MAG does), not y.
Run them through a suite as a plugin:

    memzoo compare capacity-top "imports=[benchmarks/titans_mac_ablation.py]" \
        "methods=[titans-mac-no-context,titans-mac-projected,titans-mac-writes-kv]" "seeds=[0]"
"""
from __future__ import annotations

from typing import Optional

from einops import rearrange
from torch import Tensor

from memzoo.core.attention import KVPrefix
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
        m, state = self._write(state, k, v, q, gates)
        return self.combine(y, m), state
