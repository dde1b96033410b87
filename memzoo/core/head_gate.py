"""The learned per-head gate that mixes a memory's readout with local attention (Infini's β,
Memorizing's b, Gated DeltaNet's readout mix), with its own learning-rate multiplier and decay."""
from __future__ import annotations

import torch
from torch import Tensor, nn


class HeadGate(nn.Module):
    """A learned scalar per head mixing a memory readout with local attention:
    out = sigmoid(β) ⊙ A_mem + (1 − sigmoid(β)) ⊙ A_dot (Infini's β, Memorizing's b).

    β starts at `init` (0: sigmoid 0.5, unsaturated); its learning-rate multiplier and weight decay
    are separate optimiser settings (decay pulls gates towards 0.5).
    """

    def __init__(self, n_heads: int, init: float = 0.0, lr_mult: float = 1.0, weight_decay: float = 0.0):
        super().__init__()
        self.beta = nn.Parameter(torch.full((n_heads,), float(init)))  # [H]
        self.optim_overrides = {"beta": {"lr_mult": float(lr_mult), "weight_decay": float(weight_decay)}}

    def forward(self, a_mem: Tensor, a_dot: Tensor, head_dim: int = -3) -> Tensor:
        """Mix along the head axis `head_dim` of [..., H, N, D] tensors."""
        shape = [1] * a_dot.dim()
        shape[head_dim] = -1
        g = torch.sigmoid(self.beta).view(shape)
        return g * a_mem.to(a_dot.dtype) + (1 - g) * a_dot

    def values(self) -> Tensor:
        return torch.sigmoid(self.beta.detach())
