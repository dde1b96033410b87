"""`full-shortconv`: full attention whose queries and keys first pass a short causal convolution over
time, a pilot of the lever the stage-V note named (docs/protocols/backbone.md).

    q'_t = Σ_j a_j ⊙ q_{t−K+1+j},   k'_t = Σ_j b_j ⊙ k_{t−K+1+j},   j = 0 … K−1   (one filter per head channel)

An induction head keyed on one or two bytes is what pair reads taught every backbone; with the
convolution one attention can match a key made of the K bytes before a position (the DeltaNets give
their keys the same short convolution). The taps start as the identity (a_{K−1} = b_{K−1} = 1, the
rest 0), so the model starts as the `full` it is initialised from. The convolution's last K − 1 raw
queries and keys are carried across segments (cleared at a document start), so streaming equals one
call. A plugin, not a method: load it with `memzoo --import experiments/backbone/short_conv_full.py`.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from memzoo.core.causal_conv import causal_conv
from memzoo.core.config import ModelConfig
from memzoo.core.memory import LayerInputs, State
from memzoo.core.plugins import register_memory
from memzoo.memories.full import FullAttention, FullConfig


@dataclass
class ShortConvFullConfig(FullConfig):
    kernel: int = 4  # K: taps of the convolution on queries and keys (1: plain `full`)
    taps_lr_mult: float = 5.0  # the taps' learning rate over the run's


@register_memory("full-shortconv", config=ShortConvFullConfig)
class ShortConvFull(FullAttention):
    """`full` over queries and keys convolved along time with K taps per channel (identity at start)."""

    def __init__(self, cfg: ShortConvFullConfig, model: ModelConfig, layer_index: int):
        super().__init__(cfg, model, layer_index)
        if cfg.kernel < 1:
            raise ValueError(f"full-shortconv kernel={cfg.kernel}; expected an int >= 1")
        taps = torch.zeros(cfg.kernel, 2, model.n_heads, 1, model.d_head)  # [K, q|k, H, 1, D]
        taps[-1] = 1.0  # the identity: the current position only
        self.taps = nn.Parameter(taps)
        # New weights on a trained model: a faster rate than the backbone's, and no decay toward zero taps.
        self.optim_overrides = {"taps": {"lr_mult": cfg.taps_lr_mult, "weight_decay": 0.0}}

    def initial_state(self, batch_size: int, device: torch.device) -> State:
        h, d, c = self.model_cfg.n_heads, self.model_cfg.d_head, self.cfg.kernel - 1
        state = super().initial_state(batch_size, device)
        state["qk_tail"] = torch.zeros(batch_size, 2, h, c, d, device=device, dtype=self.state_dtype())  # [B, 2, H, K-1, D]
        return state

    def reset_rows(self, state: State, rows: Tensor) -> State:
        state = super().reset_rows(state, rows)
        return {**state, "qk_tail": state["qk_tail"] * ~rows.view(-1, 1, 1, 1, 1)}

    @classmethod
    def footprint(cls, cfg: ShortConvFullConfig, model: ModelConfig, tokens_seen: int) -> dict[str, int]:
        tail = 2 * model.n_heads * model.d_head * (cfg.kernel - 1) * model.n_layers
        return {"total": super().footprint(cfg, model, tokens_seen)["total"] + tail}

    def convolve(self, x: LayerInputs, tail: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Queries and keys of the S segments convolved (each segment after its carried history, zeroed
        at a document start): q', k' [B, S, H, N, D] and the last K − 1 raw rows [B, 2, H, K-1, D]."""
        qk = torch.stack((x.q, x.k), dim=1)  # [B, 2, S, H, N, D]
        tail = tail.to(qk.dtype)
        outs = []
        for s in range(qk.shape[2]):
            history = tail * ~x.reset[:, s].view(-1, 1, 1, 1, 1)  # a document start sees zeros before it
            joined = torch.cat((history, qk[:, :, s]), dim=-2)  # [B, 2, H, K-1+N, D]
            outs.append(causal_conv(joined, self.taps, pad=0))  # [B, 2, H, N, D]
            tail = joined[..., joined.shape[-2] - history.shape[-2]:, :]
        q, k = torch.stack(outs, dim=2).unbind(1)  # 2 x [B, S, H, N, D]
        return q, k, tail

    def forward(self, x: LayerInputs, state: State) -> tuple[Tensor, State, Tensor]:
        q, k, tail = self.convolve(x, state["qk_tail"])
        out, state, aux = super().forward(dataclasses.replace(x, q=q, k=k), state)
        return out, {**state, "qk_tail": tail.to(self.working_dtype(x.q))}, aux
