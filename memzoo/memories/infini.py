"""Infini-attention (Munkhdalai, Faruqui, Gopal 2024, arXiv 2404.07143).

Per layer, head and batch row: a compressive memory M [d_key, d_value] and normaliser z [d_key].
For segment s with queries Q, keys K, values V (no positional encoding) and σ(x) = ELU(x) + 1:

    A_mem = σ(Q) M_{s-1} / (σ(Q) z_{s-1})                   (one scalar denominator per token)
    linear: M_s = M_{s-1} + σ(K)ᵀ V
    delta:  M_s = M_{s-1} + σ(K)ᵀ (V − σ(K) M_{s-1} / (σ(K) z_{s-1}))
            z_s = z_{s-1} + Σ_t σ(K_t)
    A      = sigmoid(β) ⊙ A_mem + (1 − sigmoid(β)) ⊙ A_dot      (β: one learned scalar per head)

Order: retrieve from M_{s-1}, local attention (RoPE only there), gate, then update to M_s.

Normaliser (`normalizer`, delta rule only). "paper" (default): z_s = z_{s-1} + Σ_t σ(K_t), as above.
"gamma" (NOT the paper's method): ARMT's correction (Rodkin et al. 2024, arXiv 2407.04841) carried
over to Infini's delta rule,

    γ_t = clip(1 − z_{s-1}ᵀ σ(K_t) / ‖σ(K_t)‖², 0, 1), detached;   z_s = z_{s-1} + Σ_t γ_t σ(K_t)

Infini writes a whole segment at once from M_{s-1}, z_{s-1}, as ARMT writes its m memory tokens
at once from the same A, z: each of the segment's N keys gets its own γ_t, measured against
z_{s-1} (not against the earlier keys of its own segment), as each ARMT memory token's γ_i is
measured against the z before the write. A key the normaliser already covers (z_{s-1}ᵀσ(K_t) ≥
‖σ(K_t)‖²) adds nothing to z; one it has never seen adds σ(K_t) in full. An empty memory (z = 0)
gives γ_t = 1, so the first write equals the paper's. Infini has no ε: ‖σ(K_t)‖² is floored at
DEN_FLOOR (a key whose σ underflowed has γ_t = 1 and adds 0). The linear rule never erases a value,
so its z has nothing to correct: normalizer="gamma" with rule="linear" is refused.

First segment (the paper is silent): with M = 0 and z = 0 the read is 0/0. `first_read="zeros"`
(default) defines it as A_mem = 0 for a row/head whose memory has never been written, so the
first segment's output is (1 − sigmoid(β)) A_dot; `first_read="skip"` uses A = A_dot there. The
delta rule's inner read σ(K) M / (σ(K) z) follows the same rule, so the first delta write equals
the linear one. Memory state and arithmetic follow the precision policy (float32 whatever the
autocast dtype, float64 in a float64 model).

σ is computed exactly, as x + 1 for x > 0 and exp(x) otherwise: `elu(x) + 1` cancels to 0 in
float32 below about −16.6, and one such token made a 0/0 read (or, in the delta rule's inner
read, poisoned M until the next reset). Exact σ is positive until exp(x) underflows (x < −103 in
float32); for that range every denominator σ(·) z is floored at DEN_FLOOR, so a token whose σ
vanishes reads 0 (and writes nothing) instead of 0/0. The floor changes no read whose denominator
exceeds it (for z of order 1: any query coordinate above about −69).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from einops import einsum
from torch import Tensor
from torch.autograd.function import once_differentiable

from memzoo.core.config import ModelConfig
from memzoo.core.memory import LayerInputs, LayerMemory, State, zero_loss
from memzoo.core.head_gate import HeadGate
from memzoo.core.plugins import register_memory
from memzoo.core.probe import probe

RULES = ("linear", "delta")
FIRST_READS = ("zeros", "skip")
NORMALIZERS = ("paper", "gamma")


@dataclass
class InfiniConfig:
    rule: str = "linear"  # linear | delta
    first_read: str = "zeros"  # zeros | skip: what an empty memory returns (see module docstring)
    gate_init: float = 0.0  # β at initialisation; 0 -> sigmoid 0.5, far from saturation
    gate_lr_mult: float = 1.0  # learning-rate multiplier for β (large reproductions raised it)
    gate_weight_decay: float = 0.0  # weight decay on β (decay pulls gates to 0.5; off by default)
    vectorized: bool = True  # linear rule: all segments' memories by a segmented prefix sum (same values)
    normalizer: str = "paper"  # paper | gamma: z's update; gamma = ARMT's γ-corrected z, delta rule only (module docstring)


DEN_FLOOR = 1e-30  # floor of σ(·) z: 0/0 never happens, and 1/DEN_FLOOR² stays finite in float32 backward


def sigma(x: Tensor) -> Tensor:
    """σ(x) = ELU(x) + 1, exactly: x + 1 for x > 0, exp(x) otherwise (positive until exp underflows).

    exp of min(x, 0), so the unused branch never overflows (an inf there would make inf * 0 = NaN
    in backward). The gradient is 1 for x > 0 and exp(x) for x <= 0 (1 at x = 0 from both sides).
    """
    return Sigma.apply(x)


class Sigma(torch.autograd.Function):
    """σ with its derivative written out: dσ/dx = min(σ(x), 1) (1 where x > 0, σ = exp(x) elsewhere),
    so backward is one product with the saved output instead of autograd's where/exp/clamp chain."""

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        y = torch.exp(torch.clamp(x, max=0.0)) + torch.clamp(x, min=0.0)  # exp(0) + x = x + 1 where x > 0
        ctx.save_for_backward(y)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        (y,) = ctx.saved_tensors
        return grad * y.clamp(max=1.0)


def is_empty(z: Tensor) -> Tensor:
    """[B, H] True where nothing was ever written (z is a sum of positive terms)."""
    return (z == 0).all(dim=-1)


def retrieve(sq: Tensor, mem: Tensor, z: Tensor) -> Tensor:
    """σ(Q) M / (σ(Q) z). sq: [B, H, N, Dk], mem: [B, H, Dk, Dv], z: [B, H, Dk] -> [B, H, N, Dv].

    Numerator and denominator come from one product with [M | z] (a one-column product of its own
    costs as much as the numerator's, and its backward more)."""
    both = einsum(sq, torch.cat((mem, z[..., None]), dim=-1), "b h n k, b h k v -> b h n v")  # [B, H, N, Dv + 1]
    num, den = both[..., :-1], both[..., -1:]  # den: one scalar per token
    return num / guard(den, is_empty(z)[..., None, None])


def guard(den: Tensor, empty: Tensor) -> Tensor:
    """The denominator σ(Q) z, made safe: 1 where the memory is empty (it reads 0, see `first_read`),
    at least DEN_FLOOR elsewhere (a query or key whose σ underflowed reads 0, not 0/0)."""
    return torch.where(empty, torch.ones_like(den), den.clamp(min=DEN_FLOOR))


def update_linear(mem: Tensor, z: Tensor, sk: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """M + σ(K)ᵀ V, z + Σ_t σ(K_t)."""
    return mem + einsum(sk, v, "b h n k, b h n v -> b h k v"), z + sk.sum(dim=-2)


def update_delta(mem: Tensor, z: Tensor, sk: Tensor, v: Tensor, normalizer: str = "paper") -> tuple[Tensor, Tensor]:
    """M + σ(K)ᵀ (V − σ(K) M / (σ(K) z)): writes only what the memory does not already return.
    z + Σ_t σ(K_t) ("paper"), or z + Σ_t γ_t σ(K_t) with ARMT's γ ("gamma", see `gamma_normalizer`)."""
    stored = retrieve(sk, mem, z)  # [B, H, N, Dv]
    mem = mem + einsum(sk, v - stored, "b h n k, b h n v -> b h k v")
    if normalizer == "gamma":
        return mem, z + (gamma_normalizer(sk, z) * sk).sum(dim=-2)
    return mem, z + sk.sum(dim=-2)


def gamma_normalizer(sk: Tensor, z: Tensor) -> Tensor:
    """γ_t = clip(1 − zᵀσ(K_t) / ‖σ(K_t)‖², 0, 1), detached: [B, H, N, 1] for sk [B, H, N, Dk], z [B, H, Dk].
    z = 0 (an empty memory) gives γ = 1."""
    covered = einsum(sk, z, "b h n k, b h k -> b h n")[..., None]  # zᵀσ(K_t)
    norm2 = sk.square().sum(dim=-1, keepdim=True).clamp(min=DEN_FLOOR)  # ‖σ(K_t)‖²
    return (1 - covered / norm2).clamp(0.0, 1.0).detach()


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
        if cfg.normalizer not in NORMALIZERS:
            raise ValueError(f"infini normalizer={cfg.normalizer!r}; expected one of {NORMALIZERS}")
        if cfg.normalizer == "gamma" and cfg.rule != "delta":
            raise ValueError(f"infini normalizer={cfg.normalizer!r} corrects the delta rule's z (an erased value's key "
                             f"stays in z); the {cfg.rule!r} rule erases nothing: use normalizer='paper' or rule='delta'")
        self.n_heads, self.d_head = model.n_heads, model.d_head
        self.gate = HeadGate(model.n_heads, cfg.gate_init, cfg.gate_lr_mult, cfg.gate_weight_decay)  # β per head

    def initial_state(self, batch_size: int, device: torch.device) -> State:
        h, d = self.n_heads, self.d_head
        return {
            "M": torch.zeros(batch_size, h, d, d, device=device, dtype=self.state_dtype()),  # [B, H, Dk, Dv]
            "z": torch.zeros(batch_size, h, d, device=device, dtype=self.state_dtype()),  # [B, H, Dk]
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

        dtype = self.working_dtype(x.q)  # the precision policy: float64 stays, narrower becomes float32
        with torch.autocast(device_type=x.q.device.type, enabled=False):
            sq, sk, v = sigma(x.q.to(dtype)), sigma(x.k.to(dtype)), x.v.to(dtype)  # memory path: no RoPE
            if self.cfg.rule == "linear" and self.cfg.vectorized:
                a_mem, empty, state = self.linear_all_segments(sq, sk, v, x.reset, state)
            else:
                a_mem, empty, state = self.segment_loop(sq, sk, v, x.reset, state)
            # what the memory path read and wrote: σ(q), σ(k), v and the read σ(q) M / σ(q) z, [B, S, H, N, D] each
            probe("infini.memory", layer=self.layer_index, sq=sq, sk=sk, v=v, read=a_mem)

        out = self.gate(a_mem, a_dot)  # [B, S, H, N, D]
        if self.cfg.first_read == "skip":
            out = torch.where(empty[..., None, None], a_dot, out)
        return out, state, zero_loss(x.q)

    def segment_loop(self, sq: Tensor, sk: Tensor, v: Tensor, reset: Tensor, state: State):
        """Retrieve then update, one segment at a time (the paper's recurrence)."""
        if self.cfg.rule == "delta":
            update = lambda m, z, k, v: update_delta(m, z, k, v, self.cfg.normalizer)  # noqa: E731
        else:
            update = update_linear
        reads, empties = [], []
        # unbind, not [:, s]: each index's backward would write a zero tensor of all S segments
        for sq_s, sk_s, v_s, reset_s in zip(sq.unbind(1), sk.unbind(1), v.unbind(1), reset.unbind(1)):
            state = self.reset_rows(state, reset_s)
            mem, z = state["M"], state["z"]
            reads.append(retrieve(sq_s, mem, z))  # from M_{s-1}: before the update
            empties.append(is_empty(z))
            mem, z = update(mem, z, sk_s, v_s)
            state = {"M": mem, "z": z}
        return torch.stack(reads, 1), torch.stack(empties, 1), state

    def linear_all_segments(self, sq: Tensor, sk: Tensor, v: Tensor, reset: Tensor, state: State):
        """The linear rule for all S segments without a loop.

        M_{s-1} is a running sum of the segment updates σ(K)ᵀV that restarts from 0 at each reset
        (from the carried M where no reset has happened yet): a segmented prefix sum, so the sum
        after a late reset is taken afresh, never as a difference of two long sums (which in
        float32 loses the history's magnitude times 1e-7). Same values as the loop.
        """
        du = einsum(sk, v, "b s h n k, b s h n v -> b s h k v")  # [B, S, H, Dk, Dv] each segment's σ(K)ᵀ V
        dz = sk.sum(dim=-2)  # [B, S, H, Dk]
        mem_before, mem_last = sums_before(du, state["M"], reset)  # M_{s-1} for every s, and M_S
        z_before, z_last = sums_before(dz, state["z"], reset)
        a_mem = einsum(sq, mem_before, "b s h n k, b s h k v -> b s h n v")
        den = einsum(sq, z_before, "b s h n k, b s h k -> b s h n")[..., None]
        empty = is_empty(z_before)  # [B, S, H]
        a_mem = a_mem / guard(den, empty[..., None, None])
        return a_mem, empty, {"M": mem_last, "z": z_last}


def sums_before(delta: Tensor, init: Tensor, reset: Tensor) -> tuple[Tensor, Tensor]:
    """The state before each segment and after the last, for a state that adds `delta` [B, S, ...]
    each segment, starts from `init` [B, ...] and restarts from 0 where `reset` [B, S] is set.

    before[s] = 0 if reset[s]; else init + Σ_{j<s} delta_j (no reset in [0, s]); else Σ_{r<=j<s}
    delta_j from the last reset r. Returns (before [B, S, ...], after the last segment [B, ...]).
    """
    keep = ~reset.view(*reset.shape, *([1] * (delta.dim() - 2)))  # [B, S, 1...]
    first = delta[:, :1] + torch.where(keep[:, :1], init[:, None], torch.zeros_like(init[:, None]))
    after = segmented_cumsum(torch.cat((first, delta[:, 1:]), dim=1), reset)  # state after segment s
    before = torch.cat((init[:, None], after[:, :-1]), dim=1)  # state after s-1 (init before 0)
    return torch.where(keep, before, torch.zeros_like(before)), after[:, -1]


def segmented_cumsum(x: Tensor, start: Tensor) -> Tensor:
    """Inclusive prefix sum of x [B, S, ...] along S that restarts at every s where start [B, S] is
    True: out[s] = Σ x_j over j from the last start <= s (from 0 if none) to s.

    Hillis-Steele scan with the associative step (a, f_a) ∘ (b, f_b) = (b if f_b else a + b, f_a or f_b):
    log2(S) vectorised steps, and every sum is taken only over its own run (no cancellation).
    """
    s = x.shape[1]
    if not bool(start[:, 1:].any()):
        return torch.cumsum(x, dim=1)  # one run per row: the plain prefix sum
    flag = start.view(*start.shape, *([1] * (x.dim() - 2)))  # [B, S, 1...]
    d = 1
    while d < s:
        add = torch.where(flag[:, d:], 0.0, x[:, :-d])  # x[i-d] unless a run starts in (i-d, i]
        x = torch.cat((x[:, :d], x[:, d:] + add), dim=1)
        flag = torch.cat((flag[:, :d], flag[:, d:] | flag[:, :-d]), dim=1)
        d *= 2
    return x
