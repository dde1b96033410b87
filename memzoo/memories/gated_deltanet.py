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

from memzoo.core.causal_conv import causal_conv
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
                         reset: Tensor, chunk_size: int, decay: bool = True) -> tuple[Tensor, Tensor]:
    """The same recurrence in chunks of C tokens (WY/UT form): everything inside a chunk as batched
    matrix products over all chunks at once; across chunks only the state pass, one affine map a chunk,

        S_next = S (e^{G_C} I − Wᵀ K̃) + Uᵀ K̃,   K̃ = diag(e^{G_C − G}) K   (= e^{G_C} S + Eᵀ K̃, E = U − W Sᵀ)

    (one batched product a chunk), then every chunk's read from the state at its start in one product,
    O = (Q̃ − (Q Kᵀ ⊙ D) W) S_startᵀ + (Q Kᵀ ⊙ D) U with Q̃ = diag(e^G) Q. Same arguments and results
    as `delta_rule_loop`. A last partial chunk is padded with k = v = q = 0, β = 0, g = 0 (α = 1):
    padded tokens leave the state exactly as it was, and their outputs are dropped.

    `decay=False` is DeltaNet's α ≡ 1 (g is not read; the values are those of g = 0 exactly: every
    decay factor e^0 = 1 is left out rather than multiplied in). The chunks are a view of each head's
    tokens ([B, S, H, nC, C, D]: no copy in either pass), and β scales the keys once ([C, D]) rather
    than the chunk's [C, C] products.
    """
    b, s, h, n, dv = v.shape
    dk = k.shape[-1]
    c = max(1, min(chunk_size, n))
    pad = (-n) % c
    if pad:
        q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
        beta = F.pad(beta, (0, pad))
        g = F.pad(g, (0, pad)) if decay else g
    nc = (n + pad) // c
    q, k, v = (t.unflatten(3, (nc, c)) for t in (q, k, v))  # [B, S, H, nC, C, D]
    beta = beta.unflatten(3, (nc, c))  # [B, S, H, nC, C]
    k_beta = beta[..., None] * k  # [.., C, Dk] β_r k_r
    k_t = k.transpose(-1, -2)
    eye_k = torch.eye(dk, dtype=k.dtype, device=k.device)
    if decay:
        big_g = g.unflatten(3, (nc, c)).cumsum(dim=-1)  # [B, S, H, nC, C] G_r: log of the decay from the chunk's start through r
        causal = torch.ones(c, c, dtype=torch.bool, device=q.device).tril()  # i <= r
        dmat = torch.exp((big_g[..., :, None] - big_g[..., None, :]).masked_fill(~causal, -math.inf))  # [.., C, C] e^{G_r − G_i}
        a = (k_beta @ k_t) * dmat  # [.., C, C] β_r e^{G_r − G_i} k_r·k_i (the solve reads its strict lower triangle)
        e_g = big_g.exp()[..., None]  # [.., C, 1] e^{G_r}
        rhs = torch.cat((beta[..., None] * v, e_g * k_beta), dim=-1)  # [.., C, Dv + Dk]
        qk = (q @ k_t) * dmat  # [.., C, C] (Q Kᵀ ⊙ D), diagonal included
        q_decayed = e_g * q  # Q̃ = diag(e^G) Q
        k_to_end = (big_g[..., -1:] - big_g).exp()[..., None] * k  # [.., C, Dk] K̃ = e^{G_C − G_i} k_i
        keep = (big_g[..., -1].exp()[..., None, None] * eye_k).flatten(0, -3)  # e^{G_C} I
    else:  # α ≡ 1: D is the causal mask, e^G = 1
        a = k_beta @ k_t
        rhs = torch.cat((beta[..., None] * v, k_beta), dim=-1)
        qk = (q @ k_t).tril()
        q_decayed, k_to_end, keep = q, k, eye_k
    # (I + A) [U | W] = rhs, A strictly lower: the solve reads only A's strict lower triangle (unitriangular:
    # I is implied) and gives A's gradient there alone, so neither I nor a mask is added
    u, w = torch.linalg.solve_triangular(a, rhs, upper=False, unitriangular=True).split([dv, dk], dim=-1)
    flat = lambda t: t.flatten(0, -3)  # noqa: E731  [.., C, D] -> [B·S·H·nC, C, D], a view
    q_read = torch.baddbmm(flat(q_decayed), flat(qk), flat(w), alpha=-1)  # [.., C, Dk] Q̃ − (Q Kᵀ ⊙ D) W: what reads S_start
    o_within = torch.bmm(flat(qk), flat(u))  # [.., C, Dv] the chunk's own writes, read
    carry = torch.baddbmm(keep, flat(w).transpose(1, 2), flat(k_to_end), alpha=-1).view(b, s, h, nc, dk, dk)  # e^{G_C} I − Wᵀ K̃
    written = torch.bmm(flat(u).transpose(1, 2), flat(k_to_end)).view(b, s, h, nc, dv, dk)  # Uᵀ K̃

    state, starts = s0, []  # state [B, H, Dv, Dk]
    for carry_s, written_s, fresh in zip(carry.unbind(1), written.unbind(1), reset.unbind(1)):  # [B, H, nC, ..], [B]
        state = torch.where(fresh[:, None, None, None], torch.zeros_like(state), state)
        chunk_starts = []
        for carry_c, written_c in zip(carry_s.unbind(2), written_s.unbind(2)):  # [B, H, Dk, Dk], [B, H, Dv, Dk]
            chunk_starts.append(state)
            state = torch.baddbmm(written_c.flatten(0, 1), state.flatten(0, 1), carry_c.flatten(0, 1)).view_as(state)
        starts.append(torch.stack(chunk_starts, dim=2))  # [B, H, nC, Dv, Dk]
    s_start = torch.stack(starts, dim=1)  # [B, S, H, nC, Dv, Dk]
    o = torch.baddbmm(o_within, q_read, s_start.transpose(-1, -2).flatten(0, -3))
    o = o.view(b, s, h, nc * c, dv)  # [B, S, H, N (+ padding), Dv]
    return o[..., :n, :], state


class ShortConv(nn.Module):
    """Depthwise causal convolution over time, kernel K, one filter per channel; the last K − 1 inputs
    are carried as state so that a segment's first tokens see the previous segment's last ones."""

    def __init__(self, channels: int, size: int):
        super().__init__()
        self.size = size
        bound = 1.0 / math.sqrt(size)  # nn.Conv1d's default for a depthwise filter (fan-in K)
        self.weight = nn.Parameter(torch.empty(channels, size).uniform_(-bound, bound))  # [C, K]

    def taps(self, streams: int, heads: int) -> Tensor:
        """The filter as [K, T, 1, 1, H, 1, D] taps for inputs [T, B, S, H, N, D] (channel c = (t, h, d))."""
        return self.weight.t().reshape(self.size, streams, 1, 1, heads, 1, -1)

    def forward(self, x: Tensor, cache: Tensor, reset: Tensor) -> tuple[Tensor, Tensor]:
        """x [T, B, S, H, N, D] (T streams; channel c = (t, h, d) of C = T·H·D), cache [B, K-1, C], reset [B, S]
        -> (y like x, cache after the last segment). One padded copy of the input, then the taps
        (memzoo.core.causal_conv: the backward written out)."""
        t, b, s, h, n, d = x.shape
        keep = self.size - 1
        history = cache.view(b, keep, t, h, d).permute(2, 0, 3, 1, 4)  # [T, B, H, K-1, D], oldest first
        prefixes = []
        for x_s, fresh in zip(x.unbind(2), reset.unbind(1)):  # [T, B, H, N, D], [B]
            history = torch.where(fresh[None, :, None, None, None], torch.zeros_like(history), history)  # a new document: zero padding
            prefixes.append(history)
            history = torch.cat((history, x_s[..., -keep:, :]), dim=-2)[..., -keep:, :]  # the last K-1 inputs (also when N < K-1)
        padded = torch.cat((torch.stack(prefixes, dim=2), x), dim=-2)  # [T, B, S, H, K-1+N, D]
        y = causal_conv(padded, self.taps(t, h), pad=0)  # y_t = Σ_j w_j x_{t-K+1+j}
        return y, history.permute(1, 3, 0, 2, 4).reshape(b, keep, t * h * d)


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
            o, new_state["S"] = delta_rule_chunkwise(q, k, v, g, beta, s0, reset, self.cfg.chunk_size, self.cfg.gated)
        elif self.cfg.chunkwise:
            torch_form = functools.partial(delta_rule_chunkwise, chunk_size=self.cfg.chunk_size, decay=self.cfg.gated)
            o, new_state["S"] = fla_kernels.chunkwise(self.cfg.kernel, self.cfg.gated, torch_form, q, k, v, g, beta, s0, reset)
        else:
            o, new_state["S"] = delta_rule_loop(q, k, v, g, beta, s0, reset)
        if not fused:  # the recurrence's inputs and the state it leaves, for a measure that takes the state apart
            probe("gated-deltanet.recurrence", layer=self.layer_index, q=q, k=k, v=v, g=g, beta=beta, s0=s0,
                  reset=reset, state=new_state["S"], chunk_size=self.cfg.chunk_size)
        o = F.rms_norm(o, (o.shape[-1],), self.norm_weight, self.cfg.norm_eps)  # RMSNorm per head: o / √(mean o² + ε) ⊙ w
        out_gate = rearrange(self.out_gate(hidden), "b s n (h d) -> b s h n d", h=self.n_heads)
        return o * F.silu(out_gate), new_state  # [B, S, H, N, D]

    def short_conv(self, q: Tensor, k: Tensor, v: Tensor, reset: Tensor, state: State):
        """The short causal conv over q, k, v together (3·H·D channels), its cache carried in the state."""
        new_state: State = {}
        if self.conv is None:
            return q, k, v, new_state
        qkv = torch.stack((q, k, v))  # [3, B, S, H, N, D]: channel (three, h, d) of the 3·H·D
        if self.cfg.conv_size > 1:
            qkv, new_state["conv"] = self.conv(qkv, state["conv"].to(qkv.dtype), reset)
        else:  # a kernel of 1 keeps no history
            qkv = qkv * self.conv.taps(3, self.n_heads)[0]
        q, k, v = qkv.unbind(0)
        return q, k, v, new_state
