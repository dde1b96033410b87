"""Local causal attention with rotary positions: the path every memory mixes with.

Positions are relative to the current segment's first token (memory prefixes get negative
positions), so RoPE sees the same offsets whether a sequence is streamed or run in one call.
"""
from __future__ import annotations

import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from memzoo.core.precision import working_dtype
from memzoo.core.window import SlidingWindow


@contextmanager
def cudnn_sdpa_off() -> Iterator[None]:
    """sdpa's cuDNN backend switched off for the block, then restored as it was."""
    before = torch.backends.cuda.cudnn_sdp_enabled()
    torch.backends.cuda.enable_cudnn_sdp(False)
    try:
        yield
    finally:
        torch.backends.cuda.enable_cudnn_sdp(before)


def sdpa(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor] = None) -> Tensor:
    """Softmax attention, causal when `mask` (bool, True = may attend) is None, never on cuDNN's backend.

    On an H100 (torch 2.11, cuDNN 9.19) cuDNN's backward gave Memorizing's bf16 gradients 0.1 off (NaN in
    some runs) and then a failed cuBLAS call: right for the first output-gradient layout of a shape, about
    100% off for another (its kNN layer's gate hands attention a dense gradient, an XL layer a strided
    one). Flash, memory-efficient and math were right on the same inputs; checks/cudnn_sdpa_check.py
    says whether a GPU's cuDNN still does this.
    """
    with cudnn_sdpa_off():
        if mask is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def rope(x: Tensor, pos: Tensor, base: float) -> Tensor:
    """Rotate pairs (x[..., :D/2], x[..., D/2:]) by angle pos * base^(-2i/D).

    x: [B, H, L, D]; pos: [L] or [B, L] (integer or float positions).
    """
    d = x.shape[-1]
    half = d // 2
    dtype = working_dtype(x)  # tables and rotation in float32, or float64 for a float64 x (the policy)
    inv_freq = base ** (-torch.arange(half, device=x.device, dtype=dtype) / half)  # [D/2]
    angle = pos.to(dtype)[..., None] * inv_freq  # [L, D/2] or [B, L, D/2]
    if angle.dim() == 3:
        angle = angle[:, None]  # [B, 1, L, D/2]
    cos, sin = angle.cos(), angle.sin()
    x1, x2 = x[..., :half].to(dtype), x[..., half:].to(dtype)
    out = torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return out.to(x.dtype)


XFORMERS_RUNS: dict[tuple[str, torch.dtype], bool] = {}


def xformers_runs(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether xformers is installed and its attention kernel runs on `device` for `dtype`, probed once
    per (device, dtype). An installed xformers built for another torch or CUDA (or without CUDA) imports
    fine and fails at the first call: `auto` must then fall back to sdpa, not crash mid-run."""
    key = (str(device), dtype)
    if key not in XFORMERS_RUNS:
        try:
            import xformers.ops as xops

            x = torch.ones(1, 8, 1, 16, device=device, dtype=dtype)  # [B, N, H, D]
            xops.memory_efficient_attention(x, x, x, attn_bias=xops.LowerTriangularMask())
            XFORMERS_RUNS[key] = True
        except ImportError:
            XFORMERS_RUNS[key] = False
        except Exception as err:  # installed but unusable here: say so once, use sdpa
            first = str(err).strip().splitlines()[0] if str(err).strip() else ""
            warnings.warn(f"attention_backend='auto': xformers is installed but does not run on {device} for {dtype} "
                          f"({type(err).__name__}: {first}); using sdpa", RuntimeWarning, stacklevel=2)
            XFORMERS_RUNS[key] = False
    return XFORMERS_RUNS[key]


@dataclass
class KVPrefix:
    """Extra keys/values placed before the segment (XL caches, compressed memories, full history).

    Keys are stored without positional encoding; `pos` gives each slot's position relative to the
    segment's first token (negative), and `valid` masks empty slots, so an empty memory is masked,
    never attended as zero vectors.
    """

    k: Tensor  # [B, H, M, D]
    v: Tensor  # [B, H, M, D]
    pos: Tensor  # [M] or [B, M]
    valid: Tensor  # [B, M] bool


class LocalAttention:
    """Causal softmax attention over [prefix; segment] with RoPE; backend sdpa or xformers (CUDA).

    `segment_mask` [N, N] (True = may attend), when set, replaces the causal mask within the segment:
    a model-level memory whose slots see each other both ways (RMT) sets it for its wrapped segment.

    `window` (the backbone's sliding window, memzoo.core.window; None when model.attention_span = 0),
    when set, is prepended before any prefix the memory passes: its keys are visible only to queries
    within W positions, and within the segment the causal mask is cut to the same band. The memory's
    own prefix stays visible as its `valid` says. The backbone sets it; memories call attention as
    before and compose with it without knowing it is there.
    """

    def __init__(self, rope_base: float, backend: str = "auto", segment_mask: Optional[Tensor] = None,
                 window: Optional[SlidingWindow] = None):
        self.rope_base = rope_base
        self.backend = backend
        self.segment_mask = segment_mask  # [N, N] bool or None (causal)
        self.window = window  # the backbone's sliding window of each segment, or None (segment-local)

    def with_segment_mask(self, mask: Optional[Tensor]) -> "LocalAttention":
        """The same attention with `mask` [N, N] (True = may attend) within the segment; None = causal."""
        if mask is not None and (mask.dim() != 2 or mask.shape[0] != mask.shape[1] or mask.dtype != torch.bool):
            raise ValueError(f"segment_mask must be a square bool [N, N] tensor; got {mask.dtype} {list(mask.shape)}")
        return LocalAttention(self.rope_base, self.backend, mask, self.window)

    def with_window(self, window: Optional[SlidingWindow]) -> "LocalAttention":
        """The same attention over [window; prefix; segment] (None: segment-local)."""
        return LocalAttention(self.rope_base, self.backend, self.segment_mask, window)

    def at_segment(self, s: int) -> "LocalAttention":
        """The attention of segment s of a multi-segment call (its own window); itself without a window."""
        return self if self.window is None else self.with_window(self.window.at(s))

    def use_xformers(self, x: Tensor) -> bool:
        """xformers when asked for, or under `auto` on CUDA where its kernel runs for x's dtype."""
        device = x.device
        if self.backend == "sdpa":
            return False
        if self.backend == "xformers":
            if device.type != "cuda":
                raise RuntimeError(
                    "attention_backend='xformers' needs a CUDA device (xformers has no CPU kernels); "
                    "use attention_backend='sdpa' or 'auto'"
                )
            return True
        return device.type == "cuda" and xformers_runs(device, x.dtype)

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, prefix: Optional[KVPrefix] = None) -> Tensor:
        """q, k, v: [B, H, N, D] without positional encoding; returns [B, H, N, D]."""
        if self.window is not None:
            return self._windowed(q, k, v, prefix)
        n = q.shape[-2]
        pos = torch.arange(n, device=q.device)
        q_r, k_r = rope(q, pos, self.rope_base), rope(k, pos, self.rope_base)
        within = self.segment_mask
        if within is not None and within.shape != (n, n):
            raise ValueError(f"segment_mask is {list(within.shape)} for a segment of {n} positions")
        if prefix is None:
            if within is not None:
                return self._masked(q_r, k_r, v, within)
            if self.use_xformers(q):
                return self._xformers(q_r, k_r, v, None)
            return sdpa(q_r, k_r, v)
        pk = rope(prefix.k.to(q.dtype), prefix.pos, self.rope_base)
        k_all = torch.cat((pk, k_r), dim=-2)  # [B, H, M+N, D]
        v_all = torch.cat((prefix.v.to(q.dtype), v), dim=-2)
        causal = torch.ones(n, n, dtype=torch.bool, device=q.device).tril() if within is None else within  # [N, N]
        mask = torch.cat(
            (prefix.valid[:, None, :].expand(-1, n, -1), causal.expand(q.shape[0], -1, -1)), dim=-1
        )[:, None]  # [B, 1, N, M+N]
        if self.use_xformers(q):
            return self._xformers(q_r, k_all, v_all, mask)
        return sdpa(q_r, k_all, v_all, mask)

    def _windowed(self, q: Tensor, k: Tensor, v: Tensor, prefix: Optional[KVPrefix]) -> Tensor:
        """Attention over [window; prefix; segment]: window keys within W of the query, the prefix as
        its `valid` says, the segment causal (or `segment_mask`) cut to the band. [B, H, N, D]"""
        assert self.window is not None
        n, dev = q.shape[-2], q.device
        pos = torch.arange(n, device=dev)
        wk, wv, wvalid = self.window.rows(q.shape[0])  # [B', H, C, D], [B', C]
        within = torch.ones(n, n, dtype=torch.bool, device=dev).tril() if self.segment_mask is None else self.segment_mask
        if within.shape != (n, n):
            raise ValueError(f"segment_mask is {list(within.shape)} for a segment of {n} positions")
        within = within.to(dev) & self.window.band(n, dev)  # [N, N]
        ks = [rope(wk.to(q.dtype), self.window.positions(dev), self.rope_base)]
        vs, masks = [wv.to(q.dtype)], [self.window.visible(n, wvalid)]  # [B', N, C]
        if prefix is not None:
            ks.append(rope(prefix.k.to(q.dtype), prefix.pos, self.rope_base))
            vs.append(prefix.v.to(q.dtype))
            masks.append(prefix.valid[:, None, :].expand(-1, n, -1))  # [B', N, M]
        ks.append(rope(k, pos, self.rope_base))
        vs.append(v)
        masks.append(within.expand(q.shape[0], -1, -1))
        mask = torch.cat(masks, dim=-1)[:, None]  # [B', 1, N, C+M+N]
        q_r = rope(q, pos, self.rope_base)
        k_all, v_all = torch.cat(ks, dim=-2), torch.cat(vs, dim=-2)
        if self.use_xformers(q):
            return self._xformers(q_r, k_all, v_all, mask)
        return sdpa(q_r, k_all, v_all, mask)

    def with_mask(self, q: Tensor, k: Tensor, v: Tensor, q_pos: Tensor, k_pos: Tensor, mask: Tensor) -> Tensor:
        """General form: explicit positions and a boolean mask [B, 1, Nq, Nk] (True = may attend).

        With the backbone's window: its keys are prepended (visible within W of each query) and keys
        at positions >= 0 (the segment's own positions) are cut to the band; keys at negative
        positions are the memory's own prefix and keep the memory's mask."""
        if self.window is not None:
            wk, wv, wvalid = self.window.rows(q.shape[0])  # [B', H, C, D], [B', C]
            band = self.window.band_by_position(q_pos.to(q.device), k_pos.to(q.device))  # [Nq, Nk]
            seen = self.window.visible(q.shape[-2], wvalid, q_pos)[:, None]  # [B', 1, Nq, C]
            mask = mask & band  # [B, 1, Nq, Nk]
            rows = max(mask.shape[0], seen.shape[0])
            mask = torch.cat((seen.expand(rows, -1, -1, -1), mask.expand(rows, -1, -1, -1)), dim=-1)
            k, v = torch.cat((wk.to(k.dtype), k), dim=-2), torch.cat((wv.to(v.dtype), v), dim=-2)
            k_pos = torch.cat((self.window.positions(q.device), k_pos.to(q.device)))
        q_r, k_r = rope(q, q_pos, self.rope_base), rope(k, k_pos, self.rope_base)
        if self.use_xformers(q):
            return self._xformers(q_r, k_r, v, mask)
        return sdpa(q_r, k_r, v, mask)

    def _masked(self, q_r: Tensor, k_r: Tensor, v: Tensor, mask: Tensor) -> Tensor:
        """Rotated q, k [B, H, N, D] under an explicit mask [N, N] (True = may attend)."""
        mask = mask.to(q_r.device)
        if self.use_xformers(q_r):
            return self._xformers(q_r, k_r, v, mask)
        return sdpa(q_r, k_r, v, mask)

    @staticmethod
    def _xformers(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor]) -> Tensor:
        import xformers.ops as xops  # lazy: optional extra, CUDA only

        bias = None
        if mask is None:
            bias = xops.LowerTriangularMask()
        else:
            bias = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill(~mask, float("-inf"))
            bias = bias.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])
        out = xops.memory_efficient_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_bias=bias)
        return out.transpose(1, 2)
