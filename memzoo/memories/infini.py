"""Infini-attention (Munkhdalai, Faruqui, Gopal 2024, arXiv 2404.07143).

Per layer, head and batch row: a compressive memory M [d_key, d_value] and normaliser z [d_key].
For segment s with queries Q, keys K, values V (no positional encoding) and σ(x) = ELU(x) + 1:

    A_mem = σ(Q) M_{s-1} / (σ(Q) z_{s-1})                   (one scalar denominator per token)
    linear: M_s = M_{s-1} + σ(K)ᵀ V
    delta:  M_s = M_{s-1} + σ(K)ᵀ (V − σ(K) M_{s-1} / (σ(K) z_{s-1}))
            z_s = z_{s-1} + Σ_t σ(K_t)
    A      = sigmoid(β) ⊙ A_mem + (1 − sigmoid(β)) ⊙ A_dot      (β: one learned scalar per head)

Order: retrieve from M_{s-1}, local attention (RoPE only there), gate, then update to M_s.

First segment (the paper is silent): with M = 0 and z = 0 the read is 0/0. `first_read="zeros"`
(default) defines it as A_mem = 0 for a row/head whose memory has never been written, so the
first segment's output is (1 − sigmoid(β)) A_dot; `first_read="skip"` uses A = A_dot there. The
delta rule's inner read σ(K) M / (σ(K) z) follows the same rule, so the first delta write equals
the linear one. Memory state is float32 whatever the autocast dtype.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from einops import einsum
from torch import Tensor

from memzoo.config import ModelConfig
from memzoo.memory import HeadGate, LayerInputs, LayerMemory, State, zero_loss
from memzoo.plugins import register_memory

RULES = ("linear", "delta")
FIRST_READS = ("zeros", "skip")


@dataclass
class InfiniConfig:
    rule: str = "linear"  # linear | delta
    first_read: str = "zeros"  # zeros | skip: what an empty memory returns (see module docstring)
    gate_init: float = 0.0  # β at initialisation; 0 -> sigmoid 0.5, far from saturation
    gate_lr_mult: float = 1.0  # learning-rate multiplier for β (large reproductions raised it)
    gate_weight_decay: float = 0.0  # weight decay on β (decay pulls gates to 0.5; off by default)
    vectorized: bool = True  # linear rule: all segments' memories by a cumulative sum (same values)


def sigma(x: Tensor) -> Tensor:
    """The paper's non-linearity σ(x) = ELU(x) + 1 (positive, so the denominator is positive)."""
    return F.elu(x) + 1.0


def is_empty(z: Tensor) -> Tensor:
    """[B, H] True where nothing was ever written (z is a sum of positive terms)."""
    return (z == 0).all(dim=-1)


def retrieve(sq: Tensor, mem: Tensor, z: Tensor) -> Tensor:
    """σ(Q) M / (σ(Q) z). sq: [B, H, N, Dk], mem: [B, H, Dk, Dv], z: [B, H, Dk] -> [B, H, N, Dv]."""
    num = einsum(sq, mem, "b h n k, b h k v -> b h n v")
    den = einsum(sq, z, "b h n k, b h k -> b h n")[..., None]  # one scalar per token
    den = torch.where(is_empty(z)[..., None, None], torch.ones_like(den), den)  # empty memory reads 0
    return num / den


def update_linear(mem: Tensor, z: Tensor, sk: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """M + σ(K)ᵀ V, z + Σ_t σ(K_t)."""
    return mem + einsum(sk, v, "b h n k, b h n v -> b h k v"), z + sk.sum(dim=-2)


def update_delta(mem: Tensor, z: Tensor, sk: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """M + σ(K)ᵀ (V − σ(K) M / (σ(K) z)): writes only what the memory does not already return."""
    stored = retrieve(sk, mem, z)  # [B, H, N, Dv]
    return mem + einsum(sk, v - stored, "b h n k, b h n v -> b h k v"), z + sk.sum(dim=-2)


@register_memory("infini-linear", config=InfiniConfig, defaults={"rule": "linear"})
@register_memory("infini-delta", config=InfiniConfig, defaults={"rule": "delta"})
class InfiniAttention(LayerMemory):
    """Local softmax attention gated with a linear-attention compressive memory, per head."""

    def __init__(self, cfg: InfiniConfig, model: ModelConfig, layer_index: int):
        super().__init__(cfg, model, layer_index)
        if cfg.rule not in RULES:
            raise ValueError(f"infini rule={cfg.rule!r}; expected one of {RULES}")
        if cfg.first_read not in FIRST_READS:
            raise ValueError(f"infini first_read={cfg.first_read!r}; expected one of {FIRST_READS}")
        self.n_heads, self.d_head = model.n_heads, model.d_head
        self.gate = HeadGate(model.n_heads, cfg.gate_init, cfg.gate_lr_mult, cfg.gate_weight_decay)  # β per head

    def initial_state(self, batch_size: int, device: torch.device) -> State:
        h, d = self.n_heads, self.d_head
        return {
            "M": torch.zeros(batch_size, h, d, d, device=device, dtype=torch.float32),  # [B, H, Dk, Dv]
            "z": torch.zeros(batch_size, h, d, device=device, dtype=torch.float32),  # [B, H, Dk]
        }

    @classmethod
    def footprint(cls, cfg: InfiniConfig, model: ModelConfig, tokens_seen: int) -> dict[str, int]:
        per_layer = model.d_head * (model.d_head + 1) * model.n_heads  # d_key × (d_value + 1) × H
        return {"total": per_layer * model.n_layers}

    def gate_values(self) -> Tensor:
        """sigmoid(β) per head: 0 = local only, 1 = memory only."""
        return self.gate.values()

    def forward(self, x: LayerInputs, state: State) -> tuple[Tensor, State, Tensor]:
        # Local causal attention does not depend on memory: all segments at once, RoPE inside.
        a_dot = x.local_attention()  # [B, S, H, N, D]

        with torch.autocast(device_type=x.q.device.type, enabled=False):
            sq, sk, v = sigma(x.q.float()), sigma(x.k.float()), x.v.float()  # memory path: no RoPE
            if self.cfg.rule == "linear" and self.cfg.vectorized:
                a_mem, empty, state = self._linear_all_segments(sq, sk, v, x.reset, state)
            else:
                a_mem, empty, state = self._segment_loop(sq, sk, v, x.reset, state)

        out = self.gate(a_mem, a_dot)  # [B, S, H, N, D]
        if self.cfg.first_read == "skip":
            out = torch.where(empty[..., None, None], a_dot, out)
        return out, state, zero_loss(x.q)

    def _segment_loop(self, sq: Tensor, sk: Tensor, v: Tensor, reset: Tensor, state: State):
        """Retrieve then update, one segment at a time (the paper's recurrence)."""
        update = update_delta if self.cfg.rule == "delta" else update_linear
        reads, empties = [], []
        for s in range(sq.shape[1]):
            state = self.reset_rows(state, reset[:, s])
            mem, z = state["M"], state["z"]
            reads.append(retrieve(sq[:, s], mem, z))  # from M_{s-1}: before the update
            empties.append(is_empty(z))
            mem, z = update(mem, z, sk[:, s], v[:, s])
            state = {"M": mem, "z": z}
        return torch.stack(reads, 1), torch.stack(empties, 1), state

    def _linear_all_segments(self, sq: Tensor, sk: Tensor, v: Tensor, reset: Tensor, state: State):
        """The linear rule for all S segments without a loop.

        M_{s-1} = (no reset yet ? M_init : 0) + Σ of the segment updates since the last reset,
        taken as differences of an exclusive cumulative sum. Same values as the loop.
        """
        b, s = sq.shape[:2]
        du = einsum(sk, v, "b s h n k, b s h n v -> b s h k v")  # each segment's σ(K)ᵀ V
        dz = sk.sum(dim=-2)  # [B, S, H, Dk]
        cum_u = torch.cumsum(du, dim=1) - du  # exclusive: Σ_{j<s}
        cum_z = torch.cumsum(dz, dim=1) - dz
        idx = torch.arange(s, device=sq.device).expand(b, s)
        last_reset = torch.where(reset, idx, torch.full_like(idx, -1)).cummax(dim=1).values  # [B, S]
        started = last_reset >= 0
        gather = last_reset.clamp(min=0)

        def before(cum: Tensor, init: Tensor) -> Tensor:
            at_reset = torch.gather(cum, 1, gather.view(b, s, *([1] * (cum.dim() - 2))).expand_as(cum))
            mask = started.view(b, s, *([1] * (cum.dim() - 2)))
            return torch.where(mask, cum - at_reset, init[:, None] + cum)

        mem_before, z_before = before(cum_u, state["M"]), before(cum_z, state["z"])  # [B, S, H, ...]
        a_mem = einsum(sq, mem_before, "b s h n k, b s h k v -> b s h n v")
        den = einsum(sq, z_before, "b s h n k, b s h k -> b s h n")[..., None]
        empty = is_empty(z_before)  # [B, S, H]
        a_mem = a_mem / torch.where(empty[..., None, None], torch.ones_like(den), den)
        new_state = {"M": mem_before[:, -1] + du[:, -1], "z": z_before[:, -1] + dz[:, -1]}
        return a_mem, empty, new_state
