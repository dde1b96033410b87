"""Titans-MAC with its retrieved tokens taken out of attention's context: a diagnostic, not a method.

Titans-MAC recalls 0.5 in `capacity-top` where Titans-MAG, with the same memory, recalls 1.0, and
its within-segment accuracy (0.82-0.90) is below `local`'s 1.0, which attention alone reaches.
What only MAC has is the old memory's read r = M_{s-1}(q̃) as extra keys and values in the
segment's attention. This variant attends over [persistent ‖ segment] only, everything else as MAC
(the write of y, the gating read of the new memory). Run it through a suite as a plugin:

    memzoo compare capacity-top "imports=[benchmarks/titans_mac_ablation.py]" \
        "methods=[titans-mac-no-context]" "seeds=[0]"
"""
from __future__ import annotations

from typing import Optional

from torch import Tensor

from memzoo.core.attention import KVPrefix
from memzoo.core.memory import SegmentInputs
from memzoo.core.plugins import register_memory
from memzoo.memories.titans import Titans, TitansConfig


@register_memory("titans-mac-no-context", config=TitansConfig, defaults={"variant": "mac"})
class TitansMACWithoutContext(Titans):
    """MAC whose attention does not see the retrieved tokens (the memory acts only through the gate)."""

    def attend_with_context(self, x: SegmentInputs, retrieved: Tensor, prefix: Optional[KVPrefix]) -> Tensor:
        return x.attend(x.q, x.k, x.v, prefix=prefix)  # [B, H, N, D]
