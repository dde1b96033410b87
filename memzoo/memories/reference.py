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
                     first_read: str = "zeros", rope_base: float = 10000.0,
                     normalizer: str = "paper") -> tuple[Tensor, Tensor, Tensor]:
    """Infini-attention for q, k, v [B, S, H, N, D], gate β [H], reset [B, S].

    normalizer="gamma" (delta rule; not the paper's): z_s = z_{s-1} + Σ_t γ_t σ(K_t) with
    γ_t = clip(1 − z_{s-1}ᵀσ(K_t) / ‖σ(K_t)‖², 0, 1) a constant (no gradient), key by key.

    Returns (A [B, S, H, N, D], M [B, H, D, D], z [B, H, D]) after the last segment, computed in
    float64 (the oracle) and returned in q's dtype.
    σ(x) = ELU(x) + 1 is evaluated exactly (x + 1 or exp(x)), as `elu(x) + 1` is 0 below about −16.6.
    """
    sig = lambda x: torch.where(x > 0, x + 1, torch.exp(x.clamp(max=0)))  # noqa: E731  σ = ELU + 1, exactly
    read = lambda sx, M, z: (sx @ M) / (sx @ z).clamp(min=INFINI_DEN_FLOOR)  # noqa: E731  σ(·)M / σ(·)z, one token
    b_, s_, h_, n_, d_ = q.shape
    f64 = dict(dtype=torch.float64)
    rows_out, rows_m, rows_z = [], [], []
    for b in range(b_):
        mems = [torch.zeros(d_, d_, **f64) for _ in range(h_)]
        zs = [torch.zeros(d_, **f64) for _ in range(h_)]
        segs_out = []
        for s in range(s_):
            if reset[b, s]:
                mems = [torch.zeros(d_, d_, **f64) for _ in range(h_)]
                zs = [torch.zeros(d_, **f64) for _ in range(h_)]
            heads = []
            for h in range(h_):
                Q, K, Vv = q[b, s, h].double(), k[b, s, h].double(), v[b, s, h].double()
                M, z = mems[h], zs[h]
                empty = bool((z == 0).all())
                # Retrieve from M_{s-1} (no positional encoding on the memory path).
                if empty:
                    a_mem = torch.zeros(n_, d_, **f64)
                else:
                    a_mem = torch.stack([read(sig(Q[t]), M, z) for t in range(n_)])
                a_dot = causal_softmax_attention(Q, K, Vv, rope_base)
                g = torch.sigmoid(beta[h].double())
                a = a_dot if (empty and first_read == "skip") else g * a_mem + (1 - g) * a_dot
                heads.append(a)
                # Update to M_s after the read.
                if rule == "linear":
                    M = M + sig(K).T @ Vv
                else:
                    stored = torch.zeros(n_, d_, **f64) if empty else torch.stack(
                        [read(sig(K[t]), M, z) for t in range(n_)]
                    )
                    M = M + sig(K).T @ (Vv - stored)
                if normalizer == "gamma":
                    dz = torch.zeros(d_, **f64)
                    for t in range(n_):
                        sk = sig(K[t])
                        gamma = min(max(1 - float((z @ sk).detach()) / float((sk @ sk).detach()), 0.0), 1.0)
                        dz = dz + gamma * sk
                    mems[h], zs[h] = M, z + dz
                else:
                    mems[h], zs[h] = M, z + sig(K).sum(dim=0)
            segs_out.append(torch.stack(heads))
        rows_out.append(torch.stack(segs_out))
        rows_m.append(torch.stack(mems))
        rows_z.append(torch.stack(zs))
    return tuple(torch.stack(rows).to(q.dtype) for rows in (rows_out, rows_m, rows_z))


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


def dpfp_reference(x: Tensor, nu: int) -> Tensor:
    """DPFP-ν of one vector x [d], entry by entry: r = [relu(x), relu(−x)] [2d]; φ[(j−1)·2d + p] = r[p] r[(p − j) mod 2d]."""
    r = torch.cat((x.clamp(min=0), (-x).clamp(min=0)))
    n = r.shape[0]
    return torch.stack([r[p] * r[(p - j) % n] for j in range(1, nu + 1) for p in range(n)])


def armt_read_reference(h: Tensor, A: Tensor, z: Tensor, W_Q: Tensor, nu: int, eps: float, empty: Tensor,
                        floor: float = 0.0, cos_floor: float = 0.0) -> Tensor:
    """ARMT's read at a layer's input, position by position: h_t + A φ / max(zᵀ φ + ε, floor ‖φ‖², cos_floor ‖z‖ ‖φ‖),
    φ = φ(W_Q h_t).

    h [B, T, d]; A [B, d_key, d] (stored as Aᵀ of the paper's d × d_key matrix); z [B, d_key];
    W_Q [d_mem, d]; empty [B] bool: such a row reads nothing (h unchanged).
    """
    rows = []
    for b in range(h.shape[0]):
        if bool(empty[b]):
            rows.append(h[b])
            continue
        A_paper = A[b].T  # [d, d_key]
        out = []
        for t in range(h.shape[1]):
            q = dpfp_reference(W_Q @ h[b, t], nu)
            den = max(z[b] @ q + eps, floor * (q @ q), cos_floor * torch.sqrt(z[b] @ z[b]) * torch.sqrt(q @ q))
            out.append(h[b, t] + (A_paper @ q) / den)
        rows.append(torch.stack(out))
    return torch.stack(rows)


def armt_write_reference(A: Tensor, z: Tensor, mem: Tensor, W_K: Tensor, W_V: Tensor, w_beta: Tensor, b_beta: Tensor,
                         nu: int, eps: float, empty: Tensor, floor: float = 0.0,
                         write_norm: str = "none", cos_floor: float = 0.0) -> tuple[Tensor, Tensor]:
    """ARMT's write (Eqs. 1–3) from the memory tokens' outputs mem [B, m, d], token by token, every
    token reading the same A, z from before the write (the paper's sum; the authors' code):

        k_i = φ(W_K m_i), v_i = W_V m_i, β_i = sigmoid(w_β · m_i + b_β)
        v̄_i = A k_i / max(zᵀ k_i + ε, floor ‖k_i‖², cos_floor ‖z‖ ‖k_i‖)   (0 for an empty row)
        γ_i = clip(1 − (zᵀ k_i + ε) / (‖k_i‖² + ε), 0, 1), a constant (1 for an empty row)
        A ← A + Σ_i β_i (v_i − v̄_i) k_iᵀ,   z ← z + Σ_i γ_i k_i

    A [B, d_key, d] (the paper's matrix transposed), z [B, d_key]; returns (A', z') in that layout.
    write_norm (not in the paper): "rms" divides every m_i by sqrt(Σ_j m_ij² / d + 1e-6) first; "rms-kv"
    does so for k_i and v_i only, β_i keeps the raw m_i.
    """
    new_a, new_z = [], []
    for b in range(mem.shape[0]):
        A_paper, zb = A[b].T, z[b]  # [d, d_key], [d_key]
        dA, dz = torch.zeros_like(A_paper), torch.zeros_like(zb)
        for i in range(mem.shape[1]):
            m_i = mem[b, i]
            scaled = m_i / torch.sqrt((m_i @ m_i) / m_i.numel() + 1e-6)
            m_kv = m_i if write_norm == "none" else scaled
            m_beta = scaled if write_norm == "rms" else m_i
            k, v = dpfp_reference(W_K @ m_kv, nu), W_V @ m_kv
            beta = 1 / (1 + torch.exp(-(w_beta @ m_beta + b_beta)))
            if bool(empty[b]):
                v_bar, gamma = torch.zeros_like(v), 1.0
            else:
                v_bar = (A_paper @ k) / max(zb @ k + eps, floor * (k @ k), cos_floor * torch.sqrt(zb @ zb) * torch.sqrt(k @ k))
                gamma = min(max(1 - float(((zb @ k + eps) / (k @ k + eps)).detach()), 0.0), 1.0)  # a number: no gradient
            dA = dA + beta * torch.outer(v - v_bar, k)
            dz = dz + gamma * k
        new_a.append((A_paper + dA).T)
        new_z.append(zb + dz)
    return torch.stack(new_a), torch.stack(new_z)
