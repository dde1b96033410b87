"""Titans: learning to memorize at test time (Behrouz, Zhong, Mirrokni 2025, arXiv 2501.00663).

A neural long-term memory per layer and head: an MLP M over the head width D (depth L, hidden
width expansion × D; L = 1 is a D × D matrix), whose weights are the state, written at test time
by gradient descent with momentum and forgetting on the associative loss

    ℓ(M; x_t) = ‖M(k_t) − v_t‖²
    S_t = η_t S_{t−1} − θ_t ∇ℓ(M_{t−1}; x_t)         (surprise, with momentum η_t ∈ [0, 1])
    M_t = (1 − α_t) M_{t−1} + S_t                    (forgetting α_t ∈ [0, 1])

read by a forward pass M*(q). Carried state per layer: the weights and the momentum, 2·|θ_M|
numbers per head, float32 (float64 in a float64 model). M_0 is a learned parameter (shared by the
heads), not state.

Keys, values, queries: the backbone's q, k, v (no positional encoding), each through a causal
depthwise convolution (kernel `conv_kernel`, zero-padded at every segment start: no conv cache is
carried) and SiLU; q and k are ℓ2-normalised. α_t = sigmoid, η_t = sigmoid, θ_t (below) of
per-head linear maps of the layer's normed hidden state h_t,
θ_t = θ_max · sigmoid (θ_max = 0.01, init 0.005; the paper asks only θ_t > 0): with θ/(1 − η) near 1 the
chunked form's outer gradient explodes (10⁵ at initialisation with θ 0.1, η 0.9, chunks of 16).

Chunked parallel form (`scan_memory`): a segment is cut into chunks of `chunk_size` tokens from its
first token (the last chunk is whatever is left, so a segment shorter than a chunk still writes);
inside a chunk every gradient is taken at the chunk's starting weights W⁰, so token j's gradient of
layer l is the outer product δ_j a_jᵀ of the hand-written backward, and the state after token i is

    W_i = A_i W⁰ + s_i S⁰ − Σ_{j≤i} C_ij θ_j δ_j a_jᵀ,   A_i = Π_{m≤i}(1 − α_m), E_i = Π_{m≤i} η_m,
    C_ij = Σ_{j≤m≤i} (A_i / A_m)(E_m / E_j),           s_i = Σ_{m≤i} (A_i / A_m) E_m,

so a read of W_i at token i is W⁰ and S⁰ products plus a masked [chunk × chunk] matrix (the
"dual form"); across chunks the recurrence is sequential. Everything is explicit (no create_graph),
so the outer loss differentiates through every write (full BPTT within the block).

Numerical guard (titans-pytorch #29): each token's inner gradient is rescaled to Frobenius norm
at most `grad_clip` (over all the MLP's layers; a per-token scalar, so the chunked form keeps).

MAC (memory as context), per segment: r = M_{s−1}(q̃) read with the old memory; attention over
[persistent ‖ r ‖ segment], r_i used as a key and a value at position i, visible to queries j ≥ i
(causal); y its output; y is written into the memory (keys/values/queries of y by shared D × D maps,
conv, SiLU, norm), and o_i = y_i ⊗ M_i(q_y,i), where M_i is the memory after the writes of tokens
≤ i of this segment (not the whole segment's write: that would let token i see later tokens).
MAG (memory as gate): y = local attention over [persistent ‖ segment], m_i = M_i(q̃_i) with M_i the
memory after token i's write, o = y ⊗ m. With model.attention_span = 0 the "sliding window" of the
paper's MAG is the segment itself (segment-local attention); with W > 0 the backbone's window
(memzoo.core.window) makes y the paper's sliding-window attention: token t sees t-W+1 .. t across the
segment boundary, plus the persistent tokens. MAC's attention takes the same window before its
[persistent ‖ retrieved ‖ segment] (the retrieved tokens, at the segment's positions, cut to the band). ⊗: (w_y ⊙ rmsnorm(y)) ⊙ sigmoid(w_m ⊙ rmsnorm(m)), learned
vectors w per head. Persistent memory: `n_persistent` learned d_model vectors through the layer's
own W_K, W_V (`project_kv`), at positions −N_p … −1.

Probes (memzoo.core.probe, for measures that look inside; a listener runs the chunk step eagerly):
`titans.scan` (a segment's keys, values, queries, gates, the state before and after, the reads),
`titans.inner_grad` (δ and a of every memory layer, per token) and `titans.l2n` (what is normalised).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from einops import einsum, rearrange
from torch import Tensor, nn

from memzoo.core.attention import KVPrefix
from memzoo.core.causal_conv import causal_conv
from memzoo.core.compiled import check_compile_mode, compiled
from memzoo.core.config import ModelConfig
from memzoo.core.memory import LayerInputs, LayerMemory, SegmentInputs, State, zero_loss
from memzoo.core.plugins import register_memory
from memzoo.core.precision import working_dtype
from memzoo.core.probe import listening, probe

VARIANTS = ("mac", "mag")


@dataclass
class TitansConfig:
    variant: str = "mac"  # mac | mag
    depth: int = 2  # L_M: layers of the memory MLP (1 = a D x D matrix per head)
    expansion: int = 1  # hidden width of the memory MLP = expansion x D
    chunk_size: int = 16  # tokens per chunk of the parallel form (gradients at the chunk's start)
    n_persistent: int = 4  # N_p learned persistent tokens (0 = none)
    conv_kernel: int = 4  # depthwise causal conv on q, k, v (1 = no mixing over time)
    grad_clip: float = 1.0  # per-token inner-gradient norm bound (0 = off)
    alpha_init: float = 0.01  # forgetting α at initialisation (the gate's bias)
    eta_init: float = 0.9  # momentum η at initialisation
    theta_init: float = 0.005  # inner learning rate θ at initialisation
    theta_max: float = 0.01  # θ = theta_max · sigmoid(·): the chunked form diverges when θ/(1 − η) nears 1 (README)
    # Speed and memory only (values and gradients unchanged up to float rounding):
    compile: str = "eager"  # eager | default | reduce-overhead | max-autotune-no-cudagraphs: torch.compile of the chunk step (~190 small kernels a chunk, eager)
    checkpoint: bool = False  # recompute the scan, convolutions, reads and gating in backward: keeps their inputs only


# ------------------------------------------------------------------------------------------
# The memory MLP, its hand-written backward, and the chunked update


def silu_grad(z: Tensor, silu_z: Tensor) -> Tensor:
    """d SiLU(z) / dz = σ(z)(1 + z(1 − σ(z))) = σ(z) + SiLU(z)(1 − σ(z)), from SiLU(z) already computed."""
    s = torch.sigmoid(z)
    return torch.addcmul(s, silu_z, 1 - s)


def matmul(a: Tensor, b: Tensor) -> Tensor:
    """a @ b; torch.bmm where both are 3-d (the scan's [B·H, n, ·] tensors): matmul's broadcasting path would
    add an expand and two reshapes, each an autograd node, to every product of a chunk step."""
    return torch.bmm(a, b) if a.dim() == 3 and b.dim() == 3 else a @ b


def mlp_forward(weights: list[Tensor], x: Tensor) -> tuple[list[Tensor], list[Tensor]]:
    """Inputs a_l and pre-activations z_l of every layer. weights[l]: [..., out, in]; x: [..., n, D]
    ([B, H, ...] or the scan's flattened [B·H, ...])."""
    acts, pre = [], []
    a = x
    for l, w in enumerate(weights):
        acts.append(a)  # [..., n, in]
        z = matmul(a, w.transpose(-1, -2))  # [..., n, out]
        pre.append(z)
        a = F.silu(z) if l < len(weights) - 1 else z
    return acts, pre


def mlp_read(weights: list[Tensor], x: Tensor) -> Tensor:
    """M(x) = W_L SiLU(… SiLU(W_1 x)): [B, H, n, D] -> [B, H, n, D]."""
    acts, pre = mlp_forward(weights, x)
    return pre[-1]


def inner_grad(weights: list[Tensor], keys: Tensor, values: Tensor) -> tuple[list[Tensor], list[Tensor]]:
    """The backward of ℓ = ‖M(k) − v‖² per token: ∇_{W_l} ℓ_j = δ_l,j a_l,jᵀ. Returns (δ, a) per layer,
    δ_l: [..., n, out_l], a_l: [..., n, in_l]."""
    acts, pre = mlp_forward(weights, keys)
    deltas: list[Tensor] = [keys.new_empty(0)] * len(weights)  # placeholders in keys' dtype
    delta = 2 * (pre[-1] - values)  # dℓ/dz_L
    for l in range(len(weights) - 1, -1, -1):
        deltas[l] = delta
        if l > 0:
            delta = matmul(delta, weights[l]) * silu_grad(pre[l - 1], acts[l])
    probe("titans.inner_grad", deltas=deltas, acts=acts)  # per token: ‖∇ℓ‖² = Σ_l ‖δ_l‖² ‖a_l‖²
    return deltas, acts


def decay_matrix(cum: Tensor) -> Tensor:
    """[..., n] cumulative log-factors -> [..., n, n] with exp(cum_i − cum_m) for i ≥ m, else 0
    (masked before exp: no overflow above the diagonal)."""
    n = cum.shape[-1]
    upper = torch.ones(n, n, dtype=torch.bool, device=cum.device).triu(1)
    return (cum[..., :, None] - cum[..., None, :]).masked_fill(upper, -math.inf).exp()


def chunk_coefficients(log_keep: Tensor, log_eta: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The chunk's linear recurrences in closed form, from log(1 − α), log η [..., n]:
    A_i, s_i [..., n], −C_ij [..., n, n], −E_n / E_j [..., n] (negated here, for all chunks at once: the
    update's sign), and the map of (W⁰, S⁰) to the chunk's end, [[A_n, s_n], [0, E_n]] [..., 2, 2]."""
    la, le = log_keep.cumsum(-1), log_eta.cumsum(-1)  # log A_i, log E_i
    p, q = decay_matrix(la), decay_matrix(le)  # A_i / A_m, E_m / E_j
    c = p @ q  # C_ij = Σ_{j≤m≤i} (A_i/A_m)(E_m/E_j)
    s_coef = (p @ le.exp()[..., None])[..., 0]  # s_i = Σ_{m≤i} (A_i/A_m) E_m
    a_coef, e_end = la.exp(), le[..., -1].exp()
    carry = torch.stack((a_coef[..., -1], s_coef[..., -1], torch.zeros_like(e_end), e_end), -1).unflatten(-1, (2, 2))
    return a_coef, s_coef, -c, -q[..., -1, :], carry


def chunk_step(states: list[Tensor], keys: Tensor, values: Tensor, queries: Tensor, coefs: tuple[Tensor, ...],
               lr: Tensor, grad_clip: float, scores: Tensor, key_norm2: Tensor) -> tuple[Tensor, list[Tensor]]:
    """One chunk of n tokens: reads M_i(q_i) after each token's write, and the state after the chunk.

    Batch and heads are one axis here (the scan flattens them, so every product is one bmm):
    states: per layer W⁰ and S⁰ stacked, [B·H, 2, out, in]; keys, values, queries: [B·H, n, D];
    lr = θ: [B·H, n]; coefs: `chunk_coefficients` of the chunk. scores = q kᵀ [B·H, n, n] and
    key_norm2 = ‖k‖² [B·H, n] do not depend on the state (computed for all chunks at once).
    """
    a_coef, s_coef, neg_c, neg_q_end, carry = coefs
    deltas, acts = inner_grad([st[:, 0] for st in states], keys, values)
    if grad_clip > 0:  # ‖δ aᵀ‖_F = ‖δ‖ ‖a‖ per layer
        a_norm2 = [key_norm2] + [(a * a).sum(-1) for a in acts[1:]]
        norm2 = sum((d * d).sum(-1) * a2 for d, a2 in zip(deltas, a_norm2))  # [B·H, n]
        lr = lr / torch.clamp(torch.sqrt(norm2 + 1e-30) / grad_clip, min=1.0)
    cl = neg_c * lr[:, None, :]  # −C_ij θ_j (the sign on the small factor: the big terms below are added, and
    # their backward needs no negation)
    a_col, s_col = a_coef[..., None], s_coef[..., None]  # [B·H, n, 1]
    # Reads at W_i = A_i W⁰ + s_i S⁰ − Σ_j C_ij θ_j δ_j a_jᵀ, layer by layer (the dual form: no per-token
    # weights are materialised).
    r = queries
    for l, st in enumerate(states):
        out = st.shape[-2]
        both = torch.bmm(r, st.flatten(1, 2).transpose(1, 2))  # r W⁰ᵀ ‖ r S⁰ᵀ in one product: [B·H, n, 2 out]
        rw, rs = both.split(out, dim=-1)
        r_a = scores if l == 0 else torch.bmm(r, acts[l].transpose(1, 2))  # r_i · a_j: [B·H, n, n]
        z = torch.baddbmm(torch.addcmul(a_col * rw, s_col, rs), cl * r_a, deltas[l])  # A_i rW + s_i rS − Σ_j C_ij θ_j (r_i·a_j) δ_j
        r = F.silu(z) if l < len(states) - 1 else z
    # The state after the chunk's last token: W = A_n W⁰ + s_n S⁰ − Σ_j C_nj θ_j ∇_j, S = E_n S⁰ − Σ_j (E_n/E_j) θ_j ∇_j:
    # the carry of (W⁰, S⁰) is one [2 x 2] product; both sums are one [2 out × n] @ [n × in] product per row
    # and head, added to the carry in the same call (no broadcast copy of a_j, no separate addition).
    upd = torch.stack((cl[:, -1, :], neg_q_end * lr), dim=-1)[..., None]  # [B·H, n, 2, 1], negated
    new = []
    for st, d, a in zip(states, deltas, acts):
        bh, two, out, width = st.shape
        carried = torch.bmm(carry, st.flatten(2)).view(bh, two * out, width)  # [B·H, 2 out, in]
        u = (upd * d[:, :, None, :]).flatten(2)  # [B·H, n, 2 out]: (C_nj θ_j δ_j ‖ (E_n/E_j) θ_j δ_j), negated
        new.append(torch.baddbmm(carried, u.transpose(1, 2), a).view_as(st))  # carry − Σ_j (…) θ_j δ_j a_jᵀ
    return r, new


def scan_memory(weights: list[Tensor], momentum: list[Tensor], keys: Tensor, values: Tensor, queries: Tensor,
                log_keep: Tensor, log_eta: Tensor, lr: Tensor, chunk_size: int, grad_clip: float,
                step: Callable[..., tuple[Tensor, list[Tensor]]] = chunk_step
                ) -> tuple[Tensor, list[Tensor], list[Tensor]]:
    """Write a segment's tokens chunk by chunk (chunks from the segment's first token; the last one
    is what is left) and read M_i(q_i) after each token's write. Returns (reads [B, H, n, D], W, S).

    The chunks' decay/momentum coefficients do not depend on the state: computed for all full chunks
    at once. Inputs are cut by split (one gradient concatenation in backward, not a zero tensor of
    the whole segment per chunk). Batch and heads are flattened into one axis for the chunk loop, so
    each product is one bmm; inside the loop each layer's W and S travel stacked, so one product reads
    both and one product carries both."""
    b, h, n = keys.shape[:3]
    flat = lambda t: t.flatten(0, 1)  # noqa: E731  [B, H, ...] -> [B·H, ...]
    sizes = [chunk_size] * (n // chunk_size) + ([n % chunk_size] if n % chunk_size else [])
    full = (n // chunk_size) * chunk_size
    coefs: list[tuple[Tensor, ...]] = []
    if full:
        per = lambda t: t[..., :full].unflatten(-1, (full // chunk_size, chunk_size))  # noqa: E731  [B, H, nc, c]
        coefs += list(zip(*(flat(t).unbind(1) for t in chunk_coefficients(per(log_keep), per(log_eta)))))
    if full < n:
        coefs.append(tuple(flat(t) for t in chunk_coefficients(log_keep[..., full:], log_eta[..., full:])))
    keys, values, queries, lr = flat(keys), flat(values), flat(queries), flat(lr)  # [B·H, n, D], [B·H, n]
    scores, key_norm2 = [], []  # q kᵀ within each chunk and ‖k‖², state-independent
    if full:
        per_chunk = lambda t: t[:, :full, :].unflatten(1, (full // chunk_size, chunk_size))  # noqa: E731
        q_c, k_c = per_chunk(queries), per_chunk(keys)  # [B·H, nc, c, D]
        scores += (q_c @ k_c.transpose(-1, -2)).unbind(1)
        key_norm2 += (k_c * k_c).sum(-1).unbind(1)
    if full < n:
        scores.append(torch.bmm(queries[:, full:, :], keys[:, full:, :].transpose(1, 2)))
        key_norm2.append((keys[:, full:, :] ** 2).sum(-1))
    states_before = (weights, momentum)
    states = [torch.stack((w, s), dim=2).flatten(0, 1) for w, s in zip(weights, momentum)]  # [B·H, 2, out, in]
    reads = []
    parts = zip(keys.split(sizes, 1), values.split(sizes, 1), queries.split(sizes, 1), lr.split(sizes, -1), coefs,
                scores, key_norm2)
    for k, v, q, theta, coef, qk, k2 in parts:
        r, states = step(states, k, v, q, coef, theta, grad_clip, qk, k2)
        reads.append(r)
    weights, momentum = zip(*(st.unflatten(0, (b, h)).unbind(2) for st in states))
    reads = torch.cat(reads, dim=1).unflatten(0, (b, h))  # [B, H, n, D]
    if listening():  # a segment's write: its inputs, gates and the state it leaves (experiments/precision listens)
        unflat = lambda t: t.unflatten(0, (b, h))  # noqa: E731
        probe("titans.scan", keys=unflat(keys), values=unflat(values), queries=unflat(queries), log_keep=log_keep,
              log_eta=log_eta, lr=unflat(lr), grad_clip=grad_clip, states_before=states_before, reads=reads,
              weights=list(weights), momentum=list(momentum))
    return reads, list(weights), list(momentum)


# ------------------------------------------------------------------------------------------
# Small modules: convolution, gates, the ⊗ combination


class CausalConv(nn.Module):
    """Depthwise causal conv over time + SiLU for `streams` inputs at once ([T, B, H, n, D], one weight
    per stream and channel), zero history before each call (segment): y_t = SiLU(b + Σ_j w_j x_{t−K+1+j})."""

    def __init__(self, streams: int, n_heads: int, d_head: int, kernel: int):
        super().__init__()
        self.kernel = kernel
        # [T, K, H, 1, D]: tap K−1 is the current token, initialised to 1 (near the identity), the past small
        weight = torch.randn(streams, kernel, n_heads, 1, d_head) * 0.02
        weight[:, -1] += 1.0
        self.weight = nn.Parameter(weight)
        self.bias = nn.Parameter(torch.zeros(streams, n_heads, 1, d_head))

    def forward(self, x: Tensor) -> Tensor:
        """x: [T, B, H, n, D] -> [T, B, H, n, D]: shifted products with a written-out backward
        (memzoo.core.causal_conv; cheaper than grouped Conv1d on CPU), zero history before the segment."""
        taps = self.weight.transpose(0, 1)[:, :, None]  # [K, T, 1, H, 1, D]: tap K−1−j looks j tokens back
        return F.silu(causal_conv(x, taps, self.bias[:, None]))


class Gates(nn.Module):
    """α_t = sigmoid, η_t = sigmoid, θ_t = θ_max · sigmoid of per-head linear maps of h: returned as
    log(1 − α), log η, θ, each [B, H, n]."""

    def __init__(self, d_model: int, n_heads: int, cfg: TitansConfig):
        super().__init__()
        self.proj = nn.Linear(d_model, 3 * n_heads)
        with torch.no_grad():
            self.proj.weight.normal_(0.0, 0.02)
            inv_sig = lambda p: math.log(p / (1 - p))  # noqa: E731
            bias = [inv_sig(cfg.alpha_init), inv_sig(cfg.eta_init), inv_sig(cfg.theta_init / cfg.theta_max)]
            self.proj.bias.copy_(torch.tensor(bias).repeat_interleave(n_heads))
        self.theta_max = cfg.theta_max

    def forward(self, h: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """h: [..., n, d_model] -> 3 x [..., H, n]."""
        za, ze, zt = rearrange(self.proj(h), "... n (three h) -> three ... h n", three=3)
        return F.logsigmoid(-za), F.logsigmoid(ze), self.theta_max * torch.sigmoid(zt)


def rmsnorm(x: Tensor, eps: float = 1e-6) -> Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


class GateCombine(nn.Module):
    """o = (w_y ⊙ rmsnorm(y)) ⊙ sigmoid(w_m ⊙ rmsnorm(m)), w_y, w_m learned [H, D]."""

    def __init__(self, n_heads: int, d_head: int):
        super().__init__()
        self.w_y = nn.Parameter(torch.ones(n_heads, 1, d_head))
        self.w_m = nn.Parameter(torch.ones(n_heads, 1, d_head))

    def forward(self, y: Tensor, m: Tensor) -> Tensor:
        """y, m: [..., H, n, D]."""
        dtype = working_dtype(y)  # the precision policy: float64 stays, narrower norms in float32
        gate = torch.sigmoid(self.w_m * rmsnorm(m.to(dtype)))
        return (self.w_y * rmsnorm(y.to(dtype)) * gate).to(y.dtype)


def l2n(x: Tensor) -> Tensor:
    probe("titans.l2n", x=x)  # the norms normalised away (experiments/precision: the smallest)
    return F.normalize(x, dim=-1, eps=1e-6)


# ------------------------------------------------------------------------------------------
# The plugin


@register_memory("titans-mac", config=TitansConfig, defaults={"variant": "mac"})
@register_memory("titans-mag", config=TitansConfig, defaults={"variant": "mag"})
class Titans(LayerMemory):
    """A neural memory (MLP written by momentum SGD at test time) with local attention: MAC or MAG."""

    # folders saved before these options ran the eager, storing scan
    legacy_options = {"compile": "eager", "checkpoint": False}

    def __init__(self, cfg: TitansConfig, model: ModelConfig, layer_index: int):
        super().__init__(cfg, model, layer_index)
        if cfg.variant not in VARIANTS:
            raise ValueError(f"titans variant={cfg.variant!r}; expected one of {VARIANTS}")
        if not 0 < cfg.theta_init < cfg.theta_max:
            raise ValueError(f"titans theta_init={cfg.theta_init}, theta_max={cfg.theta_max}; expected 0 < theta_init < theta_max")
        check_compile_mode("titans", cfg.compile)
        if cfg.depth < 1 or cfg.expansion < 1 or cfg.chunk_size < 1 or cfg.conv_kernel < 1 or cfg.n_persistent < 0:
            raise ValueError(f"titans: depth, expansion, chunk_size, conv_kernel must be >= 1, n_persistent >= 0; got {cfg}")
        h, d = model.n_heads, model.d_head
        self.n_heads, self.d_head = h, d
        self.m0 = nn.ParameterList(  # M_0, shared by the heads: [out, in] per layer
            nn.Parameter(torch.randn(o, i) / math.sqrt(i)) for o, i in self.layer_shapes(cfg, d)
        )
        self.conv_qkv = CausalConv(3, h, d, cfg.conv_kernel)  # MAG: the backbone's q, k, v; MAC: y's q, k, v
        self.gates = Gates(model.d_model, h, cfg)
        self.combine = GateCombine(h, d)
        self.persistent = nn.Parameter(torch.randn(cfg.n_persistent, model.d_model) * 0.02)  # [N_p, d_model]
        if cfg.variant == "mac":  # q, k, v of the attention output y, for its write and its gating read
            self.y_qkv = nn.Parameter(torch.randn(3, d, d) / math.sqrt(d))  # shared by the heads
            self.conv_read = CausalConv(1, h, d, cfg.conv_kernel)  # the backbone's q, for the read of the old memory

    @staticmethod
    def layer_shapes(cfg: TitansConfig, d: int) -> list[tuple[int, int]]:
        """(out, in) of each memory layer: D -> hidden -> … -> D, or D -> D for depth 1."""
        widths = [d] + [cfg.expansion * d] * (cfg.depth - 1) + [d]
        return [(widths[l + 1], widths[l]) for l in range(cfg.depth)]

    def initial_state(self, batch_size: int, device: torch.device) -> State:
        """W_l = M_0's layers per row and head, momentum S_l = 0: [B, H, out, in] each."""
        state: State = {}
        for l, w in enumerate(self.m0):
            w = w.to(device=device, dtype=self.state_dtype())
            state[f"W{l}"] = w.expand(batch_size, self.n_heads, *w.shape).clone()
            state[f"S{l}"] = torch.zeros_like(state[f"W{l}"])
        return state

    @classmethod
    def footprint(cls, cfg: TitansConfig, model: ModelConfig, tokens_seen: int) -> dict[str, int]:
        per_head = sum(o * i for o, i in cls.layer_shapes(cfg, model.d_head))  # |θ_M| per head
        return {"total": 2 * per_head * model.n_heads * model.n_layers}

    def _unpack(self, state: State) -> tuple[list[Tensor], list[Tensor]]:
        depth = self.cfg.depth
        return [state[f"W{l}"] for l in range(depth)], [state[f"S{l}"] for l in range(depth)]

    def _pack(self, weights: list[Tensor], momentum: list[Tensor]) -> State:
        return {**{f"W{l}": w for l, w in enumerate(weights)}, **{f"S{l}": s for l, s in enumerate(momentum)}}

    def persistent_prefix(self, x_project_kv, batch: int, device: torch.device) -> Optional[KVPrefix]:
        """The N_p persistent tokens' keys/values via the layer's W_K, W_V, at positions −N_p … −1."""
        n_p = self.cfg.n_persistent
        if n_p == 0:
            return None
        k, v = x_project_kv(self.persistent[None])  # [1, H, N_p, D]
        pos = torch.arange(-n_p, 0, device=device)
        valid = torch.ones(batch, n_p, dtype=torch.bool, device=device)
        return KVPrefix(k.expand(batch, -1, -1, -1), v.expand(batch, -1, -1, -1), pos, valid)

    def write_memory(self, state: State, keys: Tensor, values: Tensor, queries: Tensor,
               gates: tuple[Tensor, Tensor, Tensor]) -> tuple[Tensor, State]:
        """Chunked write of one segment (float32), reading M_i(q_i) after each token's write.
        gates: log(1 − α), log η, θ, each [B, H, n]."""
        dt, cfg = self.state_dtype(), self.cfg
        step = compiled(chunk_step, "eager" if listening() else cfg.compile)  # a listener cannot be called from a graph
        with torch.autocast(device_type=keys.device.type, enabled=False):
            weights, momentum = self._unpack(state)
            args = (weights, momentum, keys.to(dt), values.to(dt), queries.to(dt), *gates, cfg.chunk_size, cfg.grad_clip, step)
            reads, weights, momentum = self._recompute(scan_memory, *args)
        return reads, self._pack(weights, momentum)

    def _recompute(self, fn: Callable, *args):
        """fn(*args); with `checkpoint` (and gradient on) recomputed in backward, so autograd keeps its
        inputs, not its intermediates. An output that is a view is copied: it would hold its whole base."""
        if not (self.cfg.checkpoint and torch.is_grad_enabled()):
            return fn(*args)
        out = torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False)
        copy = lambda t: t.clone() if isinstance(t, Tensor) and t._base is not None else t  # noqa: E731
        return tuple(copy(t) for t in out) if isinstance(out, tuple) else copy(out)

    def features(self, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Conv + SiLU of each ([..., H, n, D], state dtype), q and k ℓ2-normalised."""
        qc, kc, vc = self.conv_qkv(torch.stack((q, k, v)).to(self.state_dtype())).unbind(0)
        return l2n(qc), l2n(kc), vc

    def gate_values_of(self, h: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """log(1 − α), log η, θ from h [..., n, d_model] (state dtype): 3 x [..., H, n]."""
        with torch.autocast(device_type=h.device.type, enabled=False):
            return self.gates(h.to(self.state_dtype()))

    # -- MAG: attention for all segments at once, then the memory segment by segment

    def forward(self, x: LayerInputs, state: State) -> tuple[Tensor, State, Tensor]:
        if self.cfg.variant == "mac":
            return self.mac_forward(x, state)
        b, s, h, n, d = x.q.shape
        flat = lambda t: rearrange(t, "b s h n d -> (b s) h n d")  # noqa: E731  segments independent here
        y = x.attend(flat(x.q), flat(x.k), flat(x.v), prefix=self.persistent_prefix(x.project_kv, b * s, x.q.device))
        unflat = lambda t: rearrange(t, "(b s) h n d -> b s h n d", b=b)  # noqa: E731
        feats = self._recompute(self.features, flat(x.q), flat(x.k), flat(x.v))  # conv restarts per segment
        qs, ks, vs = (unflat(t).unbind(1) for t in feats)
        gates = [g.unbind(1) for g in self.gate_values_of(x.h)]  # 3 x S x [B, H, N]
        reads = []
        for i, reset in enumerate(x.reset.unbind(1)):
            state = self.reset_rows(state, reset)
            m, state = self.write_memory(state, ks[i], vs[i], qs[i], tuple(g[i] for g in gates))
            reads.append(m)
        out = self._recompute(self.combine, unflat(y), torch.stack(reads, dim=1))  # [B, S, H, N, D]
        return out, state, zero_loss(x.q)

    # -- MAC: segment by segment in the paper's order (what does not depend on the state: all at once)

    def mac_forward(self, x: LayerInputs, state: State) -> tuple[Tensor, State, Tensor]:
        b, s = x.q.shape[:2]
        q_read = self._recompute(self.read_queries, rearrange(x.q, "b s h n d -> (b s) h n d"))  # conv restarts per segment
        q_read = rearrange(q_read, "(b s) h n d -> b s h n d", b=b).unbind(1)
        gates = [g.unbind(1) for g in self.gate_values_of(x.h)]  # 3 x S x [B, H, N]
        prefix = self.persistent_prefix(x.project_kv, b, x.q.device)
        outs = []
        for i, (seg, reset) in enumerate(zip(x.segments(), x.reset.unbind(1))):
            state = self.reset_rows(state, reset)
            out, state = self.mac_segment(seg, state, q_read[i], tuple(g[i] for g in gates), prefix)
            outs.append(out)
        return torch.stack(outs, dim=1), state, zero_loss(x.q)

    def read_queries(self, q: Tensor) -> Tensor:
        """q̃ = ℓ2(SiLU(conv(q))) of the backbone's queries [..., H, n, D], for the read of the old memory."""
        return l2n(self.conv_read(q[None].to(self.state_dtype()))[0])

    def retrieve(self, state: State, q_read: Tensor) -> Tensor:
        """h_t = M*_{t−1}(q̃_t): the old memory read at the segment's queries. [B, H, N, D]."""
        weights, _ = self._unpack(state)
        return mlp_read(weights, q_read)

    def attend_with_context(self, x: SegmentInputs, retrieved: Tensor, prefix: Optional[KVPrefix]) -> Tensor:
        """Attention over [persistent ‖ retrieved ‖ segment]; retrieved token i is key and value at
        position i, visible to queries j ≥ i (as the segment's own token i). [B, H, N, D]."""
        b, h, n, d = x.q.shape
        dev = x.q.device
        k_r, v_r = self.context_kv(x, retrieved)
        ks, vs, poss = [k_r, x.k], [v_r, x.v], [torch.arange(n, device=dev)] * 2
        causal = torch.ones(n, n, dtype=torch.bool, device=dev).tril()  # [query, key]
        vis = [causal, causal]
        if prefix is not None:
            ks.insert(0, prefix.k.to(x.q.dtype))
            vs.insert(0, prefix.v.to(x.q.dtype))
            poss.insert(0, prefix.pos)
            vis.insert(0, torch.ones(n, prefix.pos.shape[0], dtype=torch.bool, device=dev))
        mask = torch.cat(vis, dim=-1)[None, None].expand(b, 1, -1, -1)  # [B, 1, N, N_p + 2N]
        return x.attend.with_mask(x.q, torch.cat(ks, -2), torch.cat(vs, -2), torch.arange(n, device=dev),
                                  torch.cat(poss), mask)

    def context_kv(self, x: SegmentInputs, retrieved: Tensor) -> tuple[Tensor, Tensor]:
        """The retrieved tokens' keys and values in attention: r itself for both (the card's choice). [B, H, N, D] x 2."""
        r = retrieved.to(x.q.dtype)
        return r, r

    def y_features(self, y: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Query, key, value of the attention output y [B, H, N, D] for the memory: shared D x D maps,
        then conv + SiLU (query and key ℓ2-normalised)."""
        yqkv = einsum(y.to(self.state_dtype()), self.y_qkv.to(self.state_dtype()), "b h n i, t o i -> t b h n o")
        return self.features(*yqkv.unbind(0))

    def mac_segment(self, x: SegmentInputs, state: State, q_read: Tensor, gates: tuple[Tensor, Tensor, Tensor],
                    prefix: Optional[KVPrefix]) -> tuple[Tensor, State]:
        """Read the old memory, attend, write y, gate y with the new memory's read."""
        retrieved = self._recompute(self.retrieve, state, q_read)  # M_{t−1}, before any write of this segment
        y = self.attend_with_context(x, retrieved, prefix)  # [B, H, N, D]
        yq, yk, yv = self._recompute(self.y_features, y)
        m, state = self.write_memory(state, yk, yv, yq, gates)  # M_i(q_y,i) after the writes of tokens ≤ i
        return self._recompute(self.combine, y, m), state
