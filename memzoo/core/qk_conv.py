"""The backbone's short convolution over time on every layer's queries and keys (`model.qk_conv` = K > 0).

    q'_t = Σ_j a_j ⊙ q_{t−K+1+j},   k'_t = Σ_j b_j ⊙ k_{t−K+1+j},   j = 0 … K−1   (one filter per head channel)

Why it is the backbone's: a key made of the K bytes up to a position lets one attention match what came
before the current byte, where an induction head otherwise needs two layers (the DeltaNets give their keys
the same convolution). In the stage-X pilot (docs/protocols/backbone.md) it made copying by content learn
five times sooner and copy random chunks at 2,048 bytes. As backbone it is there for every method, the
window floor and the `full` ceiling included, so no comparison gains or loses it.

The taps start as the identity (a_{K−1} = b_{K−1} = 1, the rest 0): the model starts as it would without.
The last K − 1 raw queries and keys are carried per layer as backbone state, beside the sliding window
(`ModelState.window`, key "qk_tail", [B, 2, H, K−1, D]), and cleared at a document start, so streaming
equals one call. Segment-major models (RMT's, ARMT's memory slots) convolve their real tokens only; a
memory slot's query and key pass unchanged. Keys a memory projects itself from hidden states
(`project_kv`: XL's and the Compressive's caches, the ∞-former's, Titans' persistent slots) are not
convolved: the K − 1 positions before a cache are not kept, and convolving it with zeros there would make
one call differ from streaming (a multi-segment call projects a longer run of states). So those caches
read keys of another function than the window's: a cost of this backbone to them. With `cache: kv`, XL, the
Compressive Transformer and the ∞-former's short-term memory keep the keys their layer attended, convolved,
and read as the window does (test_qk_conv.py).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from memzoo.core.causal_conv import causal_conv

TAIL = "qk_tail"  # the per-layer backbone state key of the carried raw queries and keys


def check_qk_conv(k: int) -> None:
    """0 <= model.qk_conv, an int, else a ValueError naming the value."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise ValueError(f"model.qk_conv={k!r}; expected an integer >= 0 (0 = no convolution, K > 0 = K taps "
                         "over time on every layer's queries and keys)")


def identity_taps(k: int, n_heads: int, d_head: int) -> Tensor:
    """Taps that leave queries and keys unchanged: 1 on the current position, 0 before. [K, 2, H, 1, D]"""
    taps = torch.zeros(k, 2, n_heads, 1, d_head)
    taps[-1] = 1.0
    return taps


def tail_init(batch_size: int, k: int, n_heads: int, d_head: int, device: torch.device,
              dtype: torch.dtype) -> Tensor:
    """No history: K − 1 rows of zeros per row, for queries and keys. [B, 2, H, K−1, D]"""
    return torch.zeros(batch_size, 2, n_heads, k - 1, d_head, device=device, dtype=dtype)


def tail_numbers(k: int, n_heads: int, d_head: int, layers: int) -> int:
    """Numbers the carried history holds per sequence: 2 x H x D x (K − 1) x layers."""
    return 2 * n_heads * d_head * max(k - 1, 0) * layers


def convolve_qk(q: Tensor, k: Tensor, taps: Tensor, tail: Tensor, reset: Tensor,
                token_mask: Optional[Tensor] = None) -> tuple[Tensor, Tensor, Tensor]:
    """Queries and keys of S segments convolved over time, each segment after the history carried before
    it (zeros at a document start). q, k: [B, S, H, N, D]; taps [K, 2, H, 1, D]; tail [B, 2, H, K−1, D];
    reset [B, S] bool; token_mask [N] bool: the positions convolved (None: all). Returns q', k' and the
    last K − 1 raw rows of the real tokens."""
    qk = torch.stack((q, k), dim=1)  # [B, 2, S, H, N, D]
    real = qk if token_mask is None else qk[..., token_mask, :]  # [B, 2, S, H, n, D]
    tail, c = tail.to(qk.dtype), taps.shape[0] - 1
    outs = []
    for s in range(qk.shape[2]):
        history = tail * ~reset[:, s].view(-1, 1, 1, 1, 1)  # a document start sees zeros before it
        joined = torch.cat((history, real[:, :, s]), dim=-2)  # [B, 2, H, K−1+n, D]
        outs.append(causal_conv(joined, taps.to(qk.dtype), pad=0))  # [B, 2, H, n, D]
        tail = joined[..., joined.shape[-2] - c:, :]
    out = torch.stack(outs, dim=2)  # [B, 2, S, H, n, D]
    if token_mask is not None:  # memory slots keep their own queries and keys
        out = qk.index_copy(qk.dim() - 2, token_mask.nonzero().squeeze(-1).to(qk.device), out)
    q, k = out.unbind(1)
    return q, k, tail
