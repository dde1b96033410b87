"""Titans-MAG's output path, taken apart: two diagnostic variants for the `quick` suite, not methods.

In `quick` (three seeds) Titans-MAG is 0.47 bits per byte worse than `local`, and as much in
segment 0 (an empty memory) as after it. The reading to test: the cost is the paper's ⊗ output,
o = (w_y ⊙ rmsnorm(y)) ⊙ sigmoid(w_m ⊙ rmsnorm(m)), not what the memory holds. Each variant changes
only how attention's output y and the memory's read m combine:
- `titans-mag-constant-gate`: the gate sees no memory, o = (w_y ⊙ rmsnorm(y)) ⊙ sigmoid(0): the
  normalisation and the halving kept, the memory's content removed from the output;
- `titans-mag-additive`: o = y + w_m ⊙ m: the memory's read added to attention's output, no
  normalisation, no gate.
If the constant gate costs as much as MAG, the output path is the cost; if the additive variant
closes the gap to `local`, the memory's content is not what hurts. `titans-mac-additive` is the same
change to Titans-MAC, whose retrieved tokens stay in attention's context. Run them beside MAG:

    memzoo compare quick "imports=[experiments/titans/titans_gate_ablation.py]" \
        "methods=[titans-mag-constant-gate,titans-mag-additive]" "seeds=[0,1,2]"
"""
from __future__ import annotations

from torch import Tensor

from memzoo.core.config import ModelConfig
from memzoo.core.plugins import register_memory
from memzoo.memories.titans import GateCombine, Titans, TitansConfig, rmsnorm


class ConstantGate(GateCombine):
    """o = (w_y ⊙ rmsnorm(y)) ⊙ sigmoid(0): MAG's output path without the memory's read."""

    def forward(self, y: Tensor, m: Tensor) -> Tensor:
        return (0.5 * self.w_y * rmsnorm(y.float())).to(y.dtype)


class AdditiveRead(GateCombine):
    """o = y + w_m ⊙ m: the read added, no normalisation, no gate (w_y unused)."""

    def forward(self, y: Tensor, m: Tensor) -> Tensor:
        return y + (self.w_m * m.float()).to(y.dtype)


@register_memory("titans-mag-constant-gate", config=TitansConfig, defaults={"variant": "mag"})
class TitansMAGConstantGate(Titans):
    """MAG whose output gate is sigmoid(0) everywhere: y normalised and halved, the memory unread."""

    def __init__(self, cfg: TitansConfig, model: ModelConfig, layer_index: int):
        super().__init__(cfg, model, layer_index)
        self.combine = ConstantGate(self.n_heads, self.d_head)


@register_memory("titans-mag-additive", config=TitansConfig, defaults={"variant": "mag"})
class TitansMAGAdditive(Titans):
    """MAG whose memory read is added to attention's output instead of gating it."""

    def __init__(self, cfg: TitansConfig, model: ModelConfig, layer_index: int):
        super().__init__(cfg, model, layer_index)
        self.combine = AdditiveRead(self.n_heads, self.d_head)


@register_memory("titans-mac-additive", config=TitansConfig, defaults={"variant": "mac"})
class TitansMACAdditive(TitansMAGAdditive):
    """MAC whose gating read is added to attention's output instead of gating it (its retrieved tokens
    stay in attention's context): what MAC loses to the output combination, apart from its route."""
