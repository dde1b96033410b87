"""Naive references written straight from the papers' equations: loops over rows, segments and
heads, plain matrix products, nothing shared with the fast paths. Tests hold the plugins to these
on values and gradients."""
from __future__ import annotations

import math

import torch
from torch import Tensor


def rope_complex(x: Tensor, base: float) -> Tensor:
    """RoPE as complex rotation: pair (x_i, x_{i+D/2}) -> (x_i + i x_{i+D/2}) e^{i p θ_i}. x: [N, D]."""
    n, d = x.shape
    half = d // 2
    theta = base ** (-torch.arange(half, dtype=torch.float64) / half)  # [D/2]
    phase = torch.polar(torch.ones(n, half, dtype=torch.float64), torch.arange(n, dtype=torch.float64)[:, None] * theta)
    z = torch.complex(x[:, :half].double(), x[:, half:].double()) * phase
    return torch.cat((z.real, z.imag), dim=-1).to(x.dtype)


def causal_softmax_attention(q: Tensor, k: Tensor, v: Tensor, rope_base: float) -> Tensor:
    """A_dot = softmax(QKᵀ / sqrt(d) + causal mask) V with RoPE on Q and K. q, k, v: [N, D]."""
    n, d = q.shape
    qr, kr = rope_complex(q, rope_base), rope_complex(k, rope_base)
    scores = qr @ kr.T / math.sqrt(d)
    scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


# Infini's stated guard (its card): a denominator σ(·)z below this is taken as this, so a token
# whose σ underflowed to 0 reads 0 instead of 0/0.
INFINI_DEN_FLOOR = 1e-30


def infini_reference(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, reset: Tensor, rule: str,
                     first_read: str = "zeros", rope_base: float = 10000.0) -> tuple[Tensor, Tensor, Tensor]:
    """Infini-attention for q, k, v [B, S, H, N, D], gate β [H], reset [B, S].

    Returns (A [B, S, H, N, D], M [B, H, D, D], z [B, H, D]) after the last segment.
    σ(x) = ELU(x) + 1 is evaluated exactly (x + 1 or exp(x)), as `elu(x) + 1` is 0 below about −16.6.
    """
    sig = lambda x: torch.where(x > 0, x + 1, torch.exp(x.clamp(max=0)))  # noqa: E731  σ = ELU + 1, exactly
    read = lambda sx, M, z: (sx @ M) / (sx @ z).clamp(min=INFINI_DEN_FLOOR)  # noqa: E731  σ(·)M / σ(·)z, one token
    b_, s_, h_, n_, d_ = q.shape
    rows_out, rows_m, rows_z = [], [], []
    for b in range(b_):
        mems = [torch.zeros(d_, d_) for _ in range(h_)]
        zs = [torch.zeros(d_) for _ in range(h_)]
        segs_out = []
        for s in range(s_):
            if reset[b, s]:
                mems = [torch.zeros(d_, d_) for _ in range(h_)]
                zs = [torch.zeros(d_) for _ in range(h_)]
            heads = []
            for h in range(h_):
                Q, K, Vv = q[b, s, h].float(), k[b, s, h].float(), v[b, s, h].float()
                M, z = mems[h], zs[h]
                empty = bool((z == 0).all())
                # Retrieve from M_{s-1} (no positional encoding on the memory path).
                if empty:
                    a_mem = torch.zeros(n_, d_)
                else:
                    a_mem = torch.stack([read(sig(Q[t]), M, z) for t in range(n_)])
                a_dot = causal_softmax_attention(Q, K, Vv, rope_base)
                g = torch.sigmoid(beta[h])
                a = a_dot if (empty and first_read == "skip") else g * a_mem + (1 - g) * a_dot
                heads.append(a)
                # Update to M_s after the read.
                if rule == "linear":
                    M = M + sig(K).T @ Vv
                else:
                    stored = torch.zeros(n_, d_) if empty else torch.stack(
                        [read(sig(K[t]), M, z) for t in range(n_)]
                    )
                    M = M + sig(K).T @ (Vv - stored)
                mems[h], zs[h] = M, z + sig(K).sum(dim=0)
            segs_out.append(torch.stack(heads))
        rows_out.append(torch.stack(segs_out))
        rows_m.append(torch.stack(mems))
        rows_z.append(torch.stack(zs))
    return torch.stack(rows_out), torch.stack(rows_m), torch.stack(rows_z)


def gated_delta_reference(q: Tensor, k: Tensor, v: Tensor, log_alpha: Tensor, beta: Tensor, s0: Tensor,
                          reset: Tensor) -> tuple[Tensor, Tensor]:
    """Gated DeltaNet's recurrence in the paper's product form, one row, head and token at a time:

        S_t = S_{t-1} (α_t (I − β_t k_t k_tᵀ)) + β_t v_t k_tᵀ,   o_t = S_t q_t

    q, k: [B, S, H, N, Dk]; v: [B, S, H, N, Dv]; log_alpha, beta: [B, S, H, N]; s0: [B, H, Dv, Dk];
    reset [B, S]: S = 0 before that segment. Returns (o [B, S, H, N, Dv], S [B, H, Dv, Dk] at the end).
    (The plugin's loop and chunkwise form use the expanded α S + β (v − α S k) kᵀ; this holds them to it.)
    """
    b_, s_, h_, n_, dk = k.shape
    eye = torch.eye(dk, dtype=k.dtype)
    rows_out, rows_state = [], []
    for b in range(b_):
        states = [s0[b, h] for h in range(h_)]
        segs = []
        for s in range(s_):
            if reset[b, s]:
                states = [torch.zeros_like(s0[b, h]) for h in range(h_)]
            heads = []
            for h in range(h_):
                outs = []
                for t in range(n_):
                    kt, vt = k[b, s, h, t], v[b, s, h, t]
                    alpha, bt = torch.exp(log_alpha[b, s, h, t]), beta[b, s, h, t]
                    states[h] = states[h] @ (alpha * (eye - bt * torch.outer(kt, kt))) + bt * torch.outer(vt, kt)
                    outs.append(states[h] @ q[b, s, h, t])
                heads.append(torch.stack(outs))
            segs.append(torch.stack(heads))
        rows_out.append(torch.stack(segs))
        rows_state.append(torch.stack(states))
    return torch.stack(rows_out), torch.stack(rows_state)
