"""Gated DeltaNet (Yang, Kautz, Hatamizadeh 2025, arXiv 2412.06464) and DeltaNet (Yang, Wang,
Zhang, Shen, Kim 2024, arXiv 2406.06484), as a segment memory beside local attention.

Per layer, head and batch row: a matrix state S [d_v, d_k], written and read at every token t:

    S_t = S_{t-1} (α_t (I − β_t k_t k_tᵀ)) + β_t v_t k_tᵀ
        = α_t S_{t-1} + β_t (v_t − α_t S_{t-1} k_t) k_tᵀ      (decay first, then the error)
    o_t = S_t q_t                                                (every token reads after its own write)

one step of test-time SGD on ½‖S k_t − v_t‖² (learning rate β_t) with weight decay α_t. DeltaNet is
α ≡ 1. The gates, per token and head, from the layer's normed input x_t (Mamba2's parameterisation):

    α_t = exp(g_t),  g_t = −exp(A_log) · softplus(W_a x_t + dt_bias),   β_t = sigmoid(W_b x_t)

q, k, v are the backbone's W_Q, W_K, W_V projections (no positional encoding), each through a short
depthwise causal convolution (kernel 4, its last 3 inputs carried across segments as state) and SiLU;
q and k are ℓ2-normalised. The readout is RMS-normed per head and gated, o ← RMSNorm(o) ⊙ SiLU(W_g x)
with W_g of low rank (parameter budget), then mixed with the segment's causal softmax attention
(RoPE) by one learned scalar per head, as Infini does: A = sigmoid(γ) ⊙ o + (1 − sigmoid(γ)) ⊙ A_dot.

Training form: chunkwise (WY/UT). In a chunk of C tokens with cumulative log-decay G_r = Σ_{i<=r} g_i,
state S_0 at its start and E the rows e_r = β_r (v_r − α_r S_{r-1} k_r):

    E = U − W S_0ᵀ,   (I + A) [U | W] = [diag(β) V | diag(β e^G) K],   A_ri = β_r e^{G_r − G_i} k_r·k_i (i < r)
    O = diag(e^G) Q S_0ᵀ + (Q Kᵀ ⊙ D) E,   D_ri = e^{G_r − G_i} (i <= r)
    S_C = e^{G_C} S_0 + Eᵀ diag(e^{G_C − G}) K

A per-token loop straight from the recurrence (`delta_rule_loop`) is the reference; `chunkwise=False`
runs it. On CUDA the chunkwise form runs through fla's fused kernels where they run (`kernel`, see
memzoo/memories/fla_kernels.py). State (S and the conv caches) is float32 under bf16/fp16 autocast (float64 stays float64).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from einops import einsum, rearrange
from torch import Tensor, nn

from memzoo.core.compiled import check_compile_mode, compiled
from memzoo.core.config import ModelConfig
from memzoo.core.memory import LayerInputs, LayerMemory, State, zero_loss
from memzoo.core.head_gate import HeadGate
from memzoo.core.plugins import register_memory
from memzoo.core.probe import listening, probe
from memzoo.memories import fla_kernels


@dataclass
class GatedDeltaNetConfig:
    gated: bool = True  # False: DeltaNet (α ≡ 1, no W_a, A_log, dt_bias)
    chunk_size: int = 64  # C of the chunkwise form (the segment length when that is shorter)
    chunkwise: bool = True  # False: the per-token loop (the reference; same values)
    kernel: str = "auto"  # the chunkwise form: fla's fused kernels on CUDA where they run, else PyTorch ("fla", "torch": force)
    compile: str = "eager"  # the memory read (conv, gates, PyTorch's chunkwise form, norm) through torch.compile: speed only
    conv_size: int = 4  # short depthwise causal conv on q, k, v (0: none); its last conv_size - 1 inputs are state
    gate_rank: int = 16  # rank of the output gate's W_g = W_up W_down (d_model -> r -> H·D)
    norm_eps: float = 1e-5  # RMSNorm of the readout, per head
    gate_init: float = 0.0  # mixing scalar γ per head at initialisation (sigmoid 0.5)
    gate_lr_mult: float = 1.0  # learning-rate multiplier for γ
    gate_weight_decay: float = 0.0  # weight decay on γ


def l2_normalise(x: Tensor, eps: float = 1e-6) -> Tensor:
    """x / ‖x‖ along the last axis (the delta rule needs ‖k‖ = 1 for I − β k kᵀ to be a contraction)."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def delta_rule_loop(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, s0: Tensor,
                    reset: Tensor) -> tuple[Tensor, Tensor]:
    """The recurrence, one token at a time: the reference for the chunkwise form.

    q, k: [B, S, H, N, Dk]; v: [B, S, H, N, Dv]; g (log α), beta: [B, S, H, N]; s0: [B, H, Dv, Dk];
    reset: [B, S] (fresh state before that segment). Returns (o [B, S, H, N, Dv], S after the last token).
    """
    state, segments = s0, []
    # unbind, not [:, s, :, t]: in backward every index would write a zero tensor of the whole input
    per_segment = zip(*(t.unbind(1) for t in (q, k, v, g, beta)), reset.unbind(1))
    for q_s, k_s, v_s, g_s, beta_s, fresh in per_segment:
        state = torch.where(fresh[:, None, None, None], torch.zeros_like(state), state)
        outs = []
        for q_t, k_t, v_t, g_t, beta_t in zip(*(t.unbind(2) for t in (q_s, k_s, v_s, g_s, beta_s))):  # [B, H, D], [B, H]
            state = torch.exp(g_t)[..., None, None] * state  # decay first ...
            error = beta_t[..., None] * (v_t - einsum(state, k_t, "b h v k, b h k -> b h v"))  # ... then the error of the decayed state
            state = state + einsum(error, k_t, "b h v, b h k -> b h v k")  # [B, H, Dv, Dk]
            outs.append(einsum(state, q_t, "b h v k, b h k -> b h v"))  # read after the write
        segments.append(torch.stack(outs, dim=2))  # [B, H, N, Dv]
    return torch.stack(segments, dim=1), state


def delta_rule_chunkwise(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, s0: Tensor,
                         reset: Tensor, chunk_size: int) -> tuple[Tensor, Tensor]:
    """The same recurrence in chunks of C tokens (WY/UT form): everything inside a chunk as batched
    matrix products over all chunks at once; across chunks only the state pass, one affine map a chunk,

        S_next = S (e^{G_C} I − Wᵀ K̃) + Uᵀ K̃,   K̃ = diag(e^{G_C − G}) K   (= e^{G_C} S + Eᵀ K̃, E = U − W Sᵀ)

    (one batched product a chunk), then every chunk's read from the state at its start in one product,
    O = (Q̃ − (Q Kᵀ ⊙ D) W) S_startᵀ + (Q Kᵀ ⊙ D) U with Q̃ = diag(e^G) Q. Same arguments and results
    as `delta_rule_loop`. A last partial chunk is padded with k = v = q = 0, β = 0, g = 0 (α = 1):
    padded tokens leave the state exactly as it was, and their outputs are dropped.
    """
    b, s, h, n, dv = v.shape
    dk = k.shape[-1]
    c = max(1, min(chunk_size, n))
    pad = (-n) % c
    if pad:
        q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
        g, beta = (F.pad(t, (0, pad)) for t in (g, beta))
    q, k, v = (rearrange(t, "b s h (c t) d -> b s c h t d", t=c) for t in (q, k, v))
    g, beta = (rearrange(t, "b s h (c t) -> b s c h t", t=c) for t in (g, beta))

    big_g = g.cumsum(dim=-1)  # [B, S, nC, H, C] G_r: log of the decay from the chunk's start through r
    causal = torch.ones(c, c, dtype=torch.bool, device=q.device).tril()  # i <= r
    decay = torch.exp((big_g[..., :, None] - big_g[..., None, :]).masked_fill(~causal, -math.inf))  # [.., C, C] e^{G_r − G_i}
    a = (beta[..., None] * decay * (k @ k.transpose(-1, -2))).tril(-1)  # [.., C, C] strictly lower
    rhs = torch.cat((beta[..., None] * v, (beta * big_g.exp())[..., None] * k), dim=-1)  # [.., C, Dv + Dk]
    eye = torch.eye(c, dtype=a.dtype, device=a.device)
    u, w = torch.linalg.solve_triangular(eye + a, rhs, upper=False, unitriangular=True).split([dv, dk], dim=-1)
    qk = (q @ k.transpose(-1, -2)) * decay  # [.., C, C] (Q Kᵀ ⊙ D), diagonal included
    q_read = big_g.exp()[..., None] * q - qk @ w  # [.., C, Dk] Q̃ − (Q Kᵀ ⊙ D) W: what reads S_start
    o_within = qk @ u  # [.., C, Dv] the chunk's own writes, read
    k_to_end = (big_g[..., -1:] - big_g).exp()[..., None] * k  # [.., C, Dk] K̃ = e^{G_C − G_i} k_i
    eye_k = torch.eye(dk, dtype=a.dtype, device=a.device)
    carry = big_g[..., -1].exp()[..., None, None] * eye_k - w.transpose(-1, -2) @ k_to_end  # [.., Dk, Dk]
    written = u.transpose(-1, -2) @ k_to_end  # [.., Dv, Dk] Uᵀ K̃

    state, starts = s0, []  # state [B, H, Dv, Dk]
    per_segment = zip(carry.unbind(1), written.unbind(1), reset.unbind(1))
    for carry_s, written_s, fresh in per_segment:  # [B, nC, H, Dk, Dk], [B, nC, H, Dv, Dk], [B]
        state = torch.where(fresh[:, None, None, None], torch.zeros_like(state), state)
        for carry_c, written_c in zip(carry_s.unbind(1), written_s.unbind(1)):
            starts.append(state)
            state = torch.baddbmm(written_c.flatten(0, 1), state.flatten(0, 1), carry_c.flatten(0, 1)).view_as(state)
    s_start = rearrange(torch.stack(starts, dim=1), "b (s c) h v k -> b s c h v k", s=s)  # [B, S, nC, H, Dv, Dk]
    o = q_read @ s_start.transpose(-1, -2) + o_within  # [B, S, nC, H, C, Dv]
    o = rearrange(o, "b s c h t d -> b s h (c t) d")
    return o[..., :n, :], state


class ShortConv(nn.Module):
    """Depthwise causal convolution over time, kernel K, one filter per channel; the last K − 1 inputs
    are carried as state so that a segment's first tokens see the previous segment's last ones."""

    def __init__(self, channels: int, size: int):
        super().__init__()
        self.size = size
        bound = 1.0 / math.sqrt(size)  # nn.Conv1d's default for a depthwise filter (fan-in K)
        self.weight = nn.Parameter(torch.empty(channels, size).uniform_(-bound, bound))  # [C, K]

    def forward(self, x: Tensor, cache: Tensor, reset: Tensor) -> tuple[Tensor, Tensor]:
        """x [B, S, N, C], cache [B, K-1, C], reset [B, S] -> (y [B, S, N, C], cache after the last segment)."""
        n, keep = x.shape[2], self.size - 1
        prefixes = []
        for x_s, fresh in zip(x.unbind(1), reset.unbind(1)):
            cache = torch.where(fresh[:, None, None], torch.zeros_like(cache), cache)  # a new document: zero padding
            prefixes.append(cache)
            cache = torch.cat((cache, x_s), dim=1)[:, -keep:]  # the last K-1 inputs (also when N < K-1)
        padded = torch.cat((torch.stack(prefixes, dim=1), x), dim=2)  # [B, S, K-1+N, C]
        y = sum(self.weight[:, j] * padded[:, :, j : j + n] for j in range(self.size))  # y_t = Σ_j w_j x_{t-K+1+j}
        return y, cache


class LowRankLinear(nn.Module):
    """W = W_up W_down of rank r: d_in -> r -> d_out, initialised so that W x has the variance of a full
    N(0, 0.02²) matrix (the backbone's init) on inputs of unit variance."""

    def __init__(self, d_in: int, d_out: int, rank: int):
        super().__init__()
        self.down = nn.Parameter(torch.randn(rank, d_in) / math.sqrt(d_in))  # [r, d_in]
        self.up = nn.Parameter(torch.randn(d_out, rank) * 0.02 * math.sqrt(d_in / rank))  # [d_out, r]

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(F.linear(x, self.down), self.up)


@register_memory("gated-deltanet", config=GatedDeltaNetConfig, defaults={"gated": True})
@register_memory("deltanet", config=GatedDeltaNetConfig, defaults={"gated": False})
class GatedDeltaNet(LayerMemory):
    """A gated delta-rule matrix memory read at every token, mixed per head with local attention."""

    # folders saved before the kernel option ran PyTorch's form, which `auto` still runs on a CPU; and eagerly
    legacy_options = {"kernel": "auto", "compile": "eager"}

    def __init__(self, cfg: GatedDeltaNetConfig, model: ModelConfig, layer_index: int):
        super().__init__(cfg, model, layer_index)
        if cfg.chunk_size < 1 or cfg.conv_size < 0 or cfg.gate_rank < 1:
            raise ValueError(f"gated-deltanet: chunk_size >= 1, conv_size >= 0, gate_rank >= 1 required; got {cfg}")
        if cfg.kernel not in fla_kernels.KERNELS or (cfg.kernel == "fla" and not cfg.chunkwise):
            raise ValueError(f"gated-deltanet: kernel must be one of {fla_kernels.KERNELS} (and 'fla' needs "
                             f"chunkwise=true); got kernel={cfg.kernel!r}, chunkwise={cfg.chunkwise}")
        check_compile_mode(fla_kernels.method_name(cfg.gated), cfg.compile)
        h, d, d_model = model.n_heads, model.d_head, model.d_model
        self.n_heads, self.d_head = h, d
        self.w_beta = nn.Linear(d_model, h, bias=False)  # W_b: β_t = sigmoid(W_b x_t)
        nn.init.normal_(self.w_beta.weight, 0.0, 0.02)
        if cfg.gated:
            self.w_alpha = nn.Linear(d_model, h, bias=False)  # W_a
            nn.init.normal_(self.w_alpha.weight, 0.0, 0.02)
            a = 16.0 * (1.0 - torch.rand(h))  # A ~ U(0, 16], never exactly 0 (log 0 = −inf)
            self.A_log = nn.Parameter(torch.log(a))  # [H]
            dt = torch.exp(torch.empty(h).uniform_(math.log(1e-3), math.log(0.1))).clamp(min=1e-4)  # dt ~ log U(1e-3, 0.1)
            self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # [H] softplus(dt_bias) = dt
            self.optim_overrides = {"A_log": {"weight_decay": 0.0}, "dt_bias": {"weight_decay": 0.0}}
        self.conv = ShortConv(3 * h * d, cfg.conv_size) if cfg.conv_size > 0 else None  # q, k, v channels
        self.norm_weight = nn.Parameter(torch.ones(d))  # RMSNorm of the readout, shared by the heads
        self.out_gate = LowRankLinear(d_model, h * d, cfg.gate_rank)  # W_g
        self.gate = HeadGate(h, cfg.gate_init, cfg.gate_lr_mult, cfg.gate_weight_decay)  # γ per head

    def initial_state(self, batch_size: int, device: torch.device) -> State:
        h, d = self.n_heads, self.d_head
        state = {"S": torch.zeros(batch_size, h, d, d, device=device, dtype=self.state_dtype())}  # [B, H, Dv, Dk]
        if self.cfg.conv_size > 1:
            state["conv"] = torch.zeros(batch_size, self.cfg.conv_size - 1, 3 * h * d, device=device,
                                        dtype=self.state_dtype())  # [B, K-1, 3·H·D] last inputs of q, k, v
        return state

    @classmethod
    def footprint(cls, cfg: GatedDeltaNetConfig, model: ModelConfig, tokens_seen: int) -> dict[str, int]:
        h, d = model.n_heads, model.d_head
        matrix = h * d * d  # S: d_v × d_k per head
        conv = 3 * h * d * max(cfg.conv_size - 1, 0)  # the conv caches of q, k, v
        return {"total": (matrix + conv) * model.n_layers, "matrix": matrix * model.n_layers, "conv": conv * model.n_layers}

    def gate_values(self) -> Tensor:
        """sigmoid(γ) per head: 0 = local only, 1 = memory only."""
        return self.gate.values()

    def gates(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """log α and β per token and head from the normed input x [B, S, N, d_model] -> 2 x [B, S, H, N]."""
        beta = torch.sigmoid(self.w_beta(x))  # [B, S, N, H]
        if self.cfg.gated:
            g = -self.A_log.exp() * F.softplus(self.w_alpha(x) + self.dt_bias)  # [B, S, N, H], <= 0
        else:
            g = torch.zeros_like(beta)  # DeltaNet: α ≡ 1
        return rearrange(g, "b s n h -> b s h n"), rearrange(beta, "b s n h -> b s h n")

    def forward(self, x: LayerInputs, state: State) -> tuple[Tensor, State, Tensor]:
        a_dot = x.local_attention()  # [B, S, H, N, D] causal softmax within the segment, RoPE inside
        dtype = self.working_dtype(x.q)  # the precision policy: float64 stays, narrower becomes float32
        with torch.autocast(device_type=x.q.device.type, enabled=False):
            if self.fused(x.q.device, dtype):
                o, new_state = compiled(GatedDeltaNet.memory_read, self.cfg.compile)(self, x.h, x.q, x.k, x.v, x.reset,
                                                                                    state, True)
            else:
                o, new_state = self.memory_read(x.h, x.q, x.k, x.v, x.reset, state, False)
        return self.gate(o, a_dot), new_state, zero_loss(x.q)

    def fused(self, device: torch.device, dtype: torch.dtype) -> bool:
        """Whether the memory read runs as one torch.compile'd function: `compile` asks for it, PyTorch's
        chunkwise form runs here (fla does not), and no probe listens (it would break the graph)."""
        if self.cfg.compile == "eager" or not self.cfg.chunkwise or listening():
            return False
        backward = torch.is_grad_enabled() and any(p.requires_grad for p in self.parameters())
        choice = fla_kernels.plan(self.cfg.kernel, self.cfg.gated, device, dtype, backward)
        if choice.run is not None:
            return False
        fla_kernels.say_once(f"{choice.line}, the whole memory read through torch.compile (mode={self.cfg.compile})")
        return True

    def memory_read(self, h: Tensor, q: Tensor, k: Tensor, v: Tensor, reset: Tensor, state: State,
                    fused: bool) -> tuple[Tensor, State]:
        """The memory's output o [B, S, H, N, D] (before the mixing gate) and its new state: short conv,
        features, gates, the recurrence, RMSNorm and the output gate, in the working dtype. `fused`: run
        inside torch.compile (PyTorch's chunkwise form called directly, no probe)."""
        dtype = self.working_dtype(q)
        hidden = h.to(dtype)  # [B, S, N, d_model]
        q, k, v, new_state = self.short_conv(q.to(dtype), k.to(dtype), v.to(dtype), reset, state)
        q, k, v = l2_normalise(F.silu(q)), l2_normalise(F.silu(k)), F.silu(v)  # [B, S, H, N, D]
        g, beta = self.gates(hidden)  # [B, S, H, N]
        s0 = state["S"].to(dtype)
        if fused:
            o, new_state["S"] = delta_rule_chunkwise(q, k, v, g, beta, s0, reset, self.cfg.chunk_size)
        elif self.cfg.chunkwise:
            torch_form = functools.partial(delta_rule_chunkwise, chunk_size=self.cfg.chunk_size)
            o, new_state["S"] = fla_kernels.chunkwise(self.cfg.kernel, self.cfg.gated, torch_form, q, k, v, g, beta, s0, reset)
        else:
            o, new_state["S"] = delta_rule_loop(q, k, v, g, beta, s0, reset)
        if not fused:  # the recurrence's inputs and the state it leaves, for a measure that takes the state apart
            probe("gated-deltanet.recurrence", layer=self.layer_index, q=q, k=k, v=v, g=g, beta=beta, s0=s0,
                  reset=reset, state=new_state["S"], chunk_size=self.cfg.chunk_size)
        o = o * torch.rsqrt(o.pow(2).mean(dim=-1, keepdim=True) + self.cfg.norm_eps) * self.norm_weight  # RMSNorm per head
        out_gate = rearrange(self.out_gate(hidden), "b s n (h d) -> b s h n d", h=self.n_heads)
        return o * F.silu(out_gate), new_state  # [B, S, H, N, D]

    def short_conv(self, q: Tensor, k: Tensor, v: Tensor, reset: Tensor, state: State):
        """The short causal conv over q, k, v together (3·H·D channels), its cache carried in the state."""
        new_state: State = {}
        if self.conv is None:
            return q, k, v, new_state
        qkv = rearrange(torch.stack((q, k, v)), "three b s h n d -> b s n (three h d)")  # [B, S, N, 3·H·D]
        if self.cfg.conv_size > 1:
            qkv, new_state["conv"] = self.conv(qkv, state["conv"].to(qkv.dtype), reset)
        else:  # a kernel of 1 keeps no history
            qkv = qkv * self.conv.weight[:, 0]
        q, k, v = rearrange(qkv, "b s n (three h d) -> three b s h n d", three=3, h=self.n_heads)
        return q, k, v, new_state
