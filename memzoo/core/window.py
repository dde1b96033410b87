"""The backbone's sliding window (`model.attention_span` = W > 0): what a query sees beyond its segment.

With W > 0 the query at position t sees exactly the W positions t-W+1 .. t (itself included, as
Mistral's and Titans' sliding windows count them): its own segment's causal past within W, and the
tail of the previous segment. Only the previous segment's last C = W - 1 positions can ever be seen
(the segment's first query reaches t-W+1 = -(W-1)), so that is what is carried per layer, as
BACKBONE state (`ModelState.window`), apart from any memory's state:

    {"k": [B, C, H, D], "v": [B, C, H, D], "valid": [B, C]}    keys without positional encoding

Slot i of C sits at position i - C relative to the next segment's first token (RoPE at attention
time, as XL's prefix). A row reset at a document boundary loses its window (`valid` cleared: masked,
never attended as zeros). W = 0 is segment-local attention, exactly as before the window existed:
no window state and no window in any attention.

Gradient: the window's keys and values carry gradient like the segment's own. Within one
multi-segment call segment s's window is segment s-1's tail (not detached); across calls the
carried window is detached only where the caller detaches the state (`ModelState.detach`, the
truncated-BPTT horizon), so streaming equals one call in values and in gradients.

Dtype: the window keeps the keys' own dtype (bf16 under bf16 autocast, as the segment's keys are in
one call); it is activations carried, not memory state, so the memory's float32 floor does not apply.

Segment-major models (a model-level memory wraps each segment: RMT's read/write slots, ARMT's memory
tokens): the window holds the previous segment's REAL token positions only (memory-token positions
never enter it), and only real token queries see it; the band (t - W < key <= t) applies between
token positions, counted in tokens, while attention to and from memory slots stays as the memory's
mask has it. Window keys get RoPE positions relative to the wrapped segment's first real token, so
a query-key offset is the distance in tokens.

A memory opts out with `uses_window = False` (the `full` baseline, which already sees the whole
document): its layers get plain segment-local attention and carry no window.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

WindowState = dict[str, Tensor]


def check_span(span: int, segment_len: int) -> None:
    """0 <= attention_span <= segment_len, else a ValueError naming the value."""
    if isinstance(span, bool) or not isinstance(span, int) or not 0 <= span <= segment_len:
        raise ValueError(f"model.attention_span={span!r}; expected an integer in [0, model.segment_len={segment_len}] "
                         "(0 = segment-local attention, W > 0 = each query sees the W positions up to itself)")


def carried_len(span: int) -> int:
    """C: positions of the previous segment a window of span W can show (W - 1; 0 when W = 0)."""
    return max(span - 1, 0)


def beyond_window_delay(span: int, beyond_window: bool, uses_window: bool = True) -> int:
    """Slots of a cache's delay line when it holds what has LEFT a window of span W (`beyond_window`):
    the W - 1 newest positions it keeps but never attends, since the window shows them; else 0."""
    return carried_len(span) if beyond_window and uses_window else 0


def window_init(batch_size: int, span: int, n_heads: int, d_head: int, device: torch.device,
                dtype: torch.dtype) -> WindowState:
    """An empty window for `batch_size` rows: C slots of keys and values, all invalid."""
    c = carried_len(span)
    return {
        "k": torch.zeros(batch_size, c, n_heads, d_head, device=device, dtype=dtype),  # [B, C, H, D]
        "v": torch.zeros(batch_size, c, n_heads, d_head, device=device, dtype=dtype),  # [B, C, H, D]
        "valid": torch.zeros(batch_size, c, dtype=torch.bool, device=device),  # [B, C]
    }


def window_footprint(span: int, n_heads: int, d_head: int, layers: int) -> dict[str, int]:
    """Numbers the backbone's window holds per sequence: 2 x H x D x (W - 1) x layers (keys and values)."""
    c = carried_len(span)
    return {"total": 2 * n_heads * d_head * c * layers, "positions": c, "layers": layers}


@dataclass
class SlidingWindow:
    """The window each of S segments sees, handed to attention: keys/values of the C positions
    before each segment (no positional encoding), their validity, and the band's span W."""

    span: int  # W
    k: Tensor  # [B, S, H, C, D]
    v: Tensor  # [B, S, H, C, D]
    valid: Tensor  # [B, S, C] bool
    # Segment-major: the token index of each query position of the wrapped segment (-1: a memory slot),
    # and the wrapped position of its first token (the window keys' RoPE origin). None: position = token.
    query_token: Optional[Tensor] = None  # [N'] long
    first: int = 0

    def at(self, s: int) -> "SlidingWindow":
        """The window of segment s alone (S = 1)."""
        return SlidingWindow(self.span, self.k[:, s : s + 1], self.v[:, s : s + 1], self.valid[:, s : s + 1],
                             self.query_token, self.first)

    def rows(self, batch: int) -> tuple[Tensor, Tensor, Tensor]:
        """k, v [batch, H, C, D] and valid [batch, C] for attention over `batch` rows: B x S segments
        flattened batch-major (as `(b s)`), or B rows when S = 1."""
        b, s = self.valid.shape[:2]
        if batch == b * s:
            return self.k.flatten(0, 1), self.v.flatten(0, 1), self.valid.flatten(0, 1)
        raise ValueError(f"attention over {batch} rows with a window for {b} rows x {s} segments "
                         "(call it per segment, or with the segments flattened batch-major)")

    def positions(self, device: torch.device) -> Tensor:
        """RoPE positions of the C window slots: first - C .. first - 1. [C]"""
        c = self.valid.shape[-1]
        return torch.arange(-c, 0, device=device) + self.first

    def tokens(self, n: int, device: torch.device) -> Tensor:
        """Token index of each of the n query positions (-1: not a token). [n]"""
        if self.query_token is None:
            return torch.arange(n, device=device)
        if self.query_token.shape[0] != n:
            raise ValueError(f"window token map has {self.query_token.shape[0]} positions for a segment of {n}")
        return self.query_token.to(device)

    def visible(self, n: int, valid: Tensor, q_pos: Optional[Tensor] = None) -> Tensor:
        """Which window slot each query may see: valid, a token, and within W (t - p < W). [B', n, C]
        q_pos [n]: the queries' token positions when given explicitly (`with_mask`)."""
        tok = self.tokens(n, valid.device) if q_pos is None else q_pos.to(valid.device)  # [n]
        rel = torch.arange(-valid.shape[-1], 0, device=valid.device)  # [C] slot positions in tokens
        near = (tok[:, None] >= 0) & (tok[:, None] - rel[None, :] < self.span)  # [n, C]
        return valid[:, None, :] & near[None]

    def band(self, n: int, device: torch.device) -> Tensor:
        """Within the segment: token pairs more than W - 1 apart are cut; pairs with a memory slot kept. [n, n]"""
        tok = self.tokens(n, device)
        far = (tok[:, None] - tok[None, :] >= self.span) & (tok[:, None] >= 0) & (tok[None, :] >= 0)
        return ~far

    def band_by_position(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """The band for explicit positions (`with_mask`): keys at positions >= 0 (the segment's own
        positions) more than W - 1 before the query are cut; keys at negative positions (a memory's
        own prefix) are left to the memory's mask. [Nq, Nk]"""
        if self.query_token is not None or q_pos.dim() != 1 or k_pos.dim() != 1:
            raise ValueError("a windowed with_mask takes 1-d positions in a layer-major model")
        return (k_pos[None, :] < 0) | (q_pos[:, None] - k_pos[None, :] < self.span)


def token_map(token_mask: Tensor) -> tuple[Tensor, int]:
    """From a wrapped segment's token mask [N'] bool: each position's token index (-1: a memory slot)
    and the position of the first token."""
    index = torch.cumsum(token_mask.long(), 0) - 1  # [N']
    first = int(token_mask.long().argmax()) if bool(token_mask.any()) else 0
    return torch.where(token_mask, index, torch.full_like(index, -1)), first


def slide(state: WindowState, k: Tensor, v: Tensor, reset: Tensor, span: int,
          token_mask: Optional[Tensor] = None) -> tuple[SlidingWindow, WindowState]:
    """The window of each of S segments and the window after the last.

    k, v: [B, S, H, N', D] the layer's keys/values (no positional encoding); reset: [B, S] bool.
    Segment s sees the last C positions of [window before s-1; segment s-1] (segment 0: the carried
    window), masked for rows that reset at s. No detach: gradient flows as through one sequence.
    """
    c = carried_len(span)
    if token_mask is not None:  # only the real tokens' keys enter the window
        k, v = k[..., token_mask, :], v[..., token_mask, :]
    b, s, _, n, _ = k.shape
    wk = state["k"].transpose(1, 2).to(k.dtype)  # [B, H, C, D]
    wv = state["v"].transpose(1, 2).to(v.dtype)
    ok = state["valid"]  # [B, C]
    ks, vs, oks = [], [], []
    fresh = torch.ones(b, n, dtype=torch.bool, device=ok.device)
    for i in range(s):
        ok = ok & ~reset[:, i, None]  # a document start: the window is another document's
        ks.append(wk), vs.append(wv), oks.append(ok)
        joined_k, joined_v = torch.cat((wk, k[:, i]), dim=2), torch.cat((wv, v[:, i]), dim=2)  # [B, H, C+n, D]
        cut = joined_k.shape[2] - c
        wk, wv, ok = joined_k[:, :, cut:], joined_v[:, :, cut:], torch.cat((ok, fresh), dim=1)[:, cut:]
    query_token, first = token_map(token_mask) if token_mask is not None else (None, 0)
    window = SlidingWindow(span, torch.stack(ks, 1), torch.stack(vs, 1), torch.stack(oks, 1), query_token, first)
    return window, {"k": wk.transpose(1, 2), "v": wv.transpose(1, 2), "valid": ok}
