"""Which bytes of a document a model could copy, and from where, and bits per byte by copy class and
within-segment position band: what attention can reach against what only a memory can (the `lm-window` suite).

Index convention: every mask here is aligned to the document's bytes as TARGETS. mask[t] is about
byte t, the byte the logits at position t-1 predict (byte 0 is never a target). In the corpus's
layout (memzoo.data.corpus: segment s holds inputs doc[sN .. sN+N-1] and targets doc[sN+1 .. sN+N])
byte t is the target in segment (t-1) // N, slot (t-1) % N; `target_layout` does that reshaping.

Visibility: predicting byte t, the query at position t-1 sees the bytes
  window W > 0 (sliding; query p attends keys p-W+1..p): t-W .. t-1 (clipped at the document start);
  window 0 (segment-local): from its own segment's start, ((t-1) // N) * N .. t-1.
(The query's segment is that of position t-1, not of t: byte t = sN is predicted from the last slot
of segment s-1, which sees that whole segment.)

Copyable: byte t (t >= k) is copyable when its (k+1)-gram doc[t-k .. t] (the k bytes before it and the
byte itself) occurs earlier, ending at some j < t (j is the copy's source). Within-window when some
earlier occurrence ends inside the visible span, beyond-window when every earlier occurrence ends
before it; the rest (no earlier occurrence, or t < k) is not copyable. The three partition the
document. Default k = 8 (a 9-gram: long enough that a repeat is rarely chance in source text).

Bands: nll_bits [B, S, N] in that layout; slot (s, n) is predicted by the query at within-segment
position n (it sees n + 1 bytes of its own segment), and a band is a range of n. Bits per byte = mean
NLL in bits over the target bytes counted (a mask leaves out padded slots, or picks a copy class).
"""
from __future__ import annotations

from typing import NamedTuple, Optional, Sequence, Union

import torch
from torch import Tensor

DEFAULT_K = 8  # bytes of context before the copied byte: the copy is a (k+1)-gram repeat
DEFAULT_EDGES = (0, 8, 16, 32, 64)  # within-segment position bands: 0-7, 8-15, 16-31, 32-63, 64-(N-1)


class CopyClasses(NamedTuple):
    """Three disjoint bool masks [..., L] aligned to target bytes that together cover the document."""

    beyond: Tensor  # [..., L] copyable only from beyond the visible span
    within: Tensor  # [..., L] copyable from inside the visible span
    none: Tensor  # [..., L] not copyable (no earlier occurrence, or t < k)


def as_ids(doc: Union[Tensor, bytes]) -> Tensor:
    """A document as int64 token ids: bytes -> [L], a Tensor [L] or [B, L] kept in shape."""
    if isinstance(doc, (bytes, bytearray)):
        return torch.frombuffer(bytearray(doc), dtype=torch.uint8).long() if len(doc) else torch.zeros(0, dtype=torch.long)
    if doc.dim() not in (1, 2):
        raise ValueError(f"doc of shape {tuple(doc.shape)}; expected [L] or [B, L]")
    return doc.long()


def last_earlier_occurrence(doc: Union[Tensor, bytes], k: int = DEFAULT_K) -> Tensor:
    """[..., L] int64: the end position j < t of the latest earlier occurrence of the (k+1)-gram
    ending at t (same row), -1 where none or t < k. Exact: grams are grouped by a sort (torch.unique
    over rows), O(L log L), so no hash collision can fake a copy."""
    if k < 0:
        raise ValueError(f"k={k}; expected k >= 0")
    ids = as_ids(doc)
    rows = ids[None] if ids.dim() == 1 else ids  # [B, L]
    b, length = rows.shape
    prev = torch.full((b, length), -1, dtype=torch.long)  # [B, L]
    g = length - k  # grams per row; gram i ends at position i + k
    if g > 0:
        grams = rows.unfold(1, k + 1, 1)  # [B, G, k+1]
        row_id = torch.arange(b)[:, None, None].expand(b, g, 1)  # [B, G, 1]: a gram repeats only in its own row
        _, gram_id = torch.unique(torch.cat((row_id, grams), -1).reshape(b * g, k + 2), dim=0, return_inverse=True)  # [B G]
        order = torch.argsort(gram_id, stable=True)  # [B G]: grouped by gram, flat index (so position) rising within
        same = gram_id[order[1:]] == gram_id[order[:-1]]  # [B G - 1]: the previous in order is the same gram
        prev_flat = torch.full((b * g,), -1, dtype=torch.long)  # [B G]
        prev_flat[order[1:]] = torch.where(same, order[:-1], -1)
        prev[:, k:] = torch.where(prev_flat >= 0, prev_flat % g + k, -1).view(b, g)
    return prev.view(ids.shape)


def visible_start(length: int, window: int, segment_len: Optional[int] = None) -> Tensor:
    """[L] int64: the first byte the model sees when predicting byte t (the span ends at t-1); see the
    module docstring. window > 0: max(t - window, 0); window 0: ((t-1) // segment_len) * segment_len."""
    t = torch.arange(length)  # [L]
    if window > 0:
        return (t - window).clamp(min=0)
    if window < 0 or segment_len is None or segment_len <= 0:
        raise ValueError(f"window={window}, segment_len={segment_len}: window > 0, or window 0 with segment_len > 0")
    return (t - 1).clamp(min=0) // segment_len * segment_len


def copy_classes(doc: Union[Tensor, bytes], k: int = DEFAULT_K, window: int = 0,
                 segment_len: Optional[int] = None) -> CopyClasses:
    """Beyond-window, within-window and not copyable bytes of doc [L] or [B, L] (per row), aligned to
    target bytes; window and segment_len as in `visible_start`."""
    prev = last_earlier_occurrence(doc, k)  # [..., L]
    start = visible_start(prev.shape[-1], window, segment_len)  # [L]
    copyable = prev >= 0
    within = copyable & (prev >= start)  # the latest source is visible: some source is
    return CopyClasses(beyond=copyable & ~within, within=within, none=~copyable)


def beyond_window_copyable(doc: Union[Tensor, bytes], k: int = DEFAULT_K, window: int = 0,
                           segment_len: Optional[int] = None) -> Tensor:
    """[..., L] bool: bytes whose every earlier (k+1)-gram occurrence ends before the visible span."""
    return copy_classes(doc, k, window, segment_len).beyond


def within_window_copyable(doc: Union[Tensor, bytes], k: int = DEFAULT_K, window: int = 0,
                           segment_len: Optional[int] = None) -> Tensor:
    """[..., L] bool: bytes with an earlier (k+1)-gram occurrence ending inside the visible span."""
    return copy_classes(doc, k, window, segment_len).within


def target_layout(mask: Tensor, segment_len: int) -> Tensor:
    """A target-aligned mask [..., L] in the corpus's segment layout [..., S, N]: slot (s, n) holds byte
    s*N + n + 1; slots past the document's end are False. S = ceil((L-1) / N), as samplers.num_segments."""
    targets = mask[..., 1:]  # [..., L-1]: byte 0 is never a target
    s = -(-targets.shape[-1] // segment_len)
    pad = s * segment_len - targets.shape[-1]
    padded = torch.cat((targets, targets.new_zeros(*targets.shape[:-1], pad)), dim=-1)  # [..., S N]
    return padded.view(*targets.shape[:-1], s, segment_len)


def position_bands(segment_len: int, edges: Sequence[int] = DEFAULT_EDGES) -> list[tuple[str, slice]]:
    """(label "a-b", slice of within-segment positions a..b) per band: band i runs from edges[i] to
    edges[i+1] - 1, the last to segment_len - 1; edges at or past segment_len are dropped."""
    if not edges or edges[0] != 0 or any(b <= a for a, b in zip(edges, edges[1:])):
        raise ValueError(f"edges={tuple(edges)}: expected strictly increasing edges starting at 0")
    if segment_len <= 0:
        raise ValueError(f"segment_len={segment_len}; expected > 0")
    starts = [e for e in edges if e < segment_len]
    ends = [*starts[1:], segment_len]
    return [(f"{a}-{b - 1}", slice(a, b)) for a, b in zip(starts, ends)]


def bpb_on_mask(nll_bits: Tensor, mask: Tensor) -> float:
    """Mean of nll_bits over the True entries of mask (same shape); nan when mask is empty."""
    if mask.shape != nll_bits.shape:
        raise ValueError(f"mask {tuple(mask.shape)} and nll_bits {tuple(nll_bits.shape)} differ in shape")
    count = int(mask.sum())
    return float(nll_bits[mask.bool()].double().sum() / count) if count else float("nan")


def bpb_by_band(nll_bits: Tensor, mask: Optional[Tensor] = None,
                edges: Sequence[int] = DEFAULT_EDGES) -> dict[str, float]:
    """{band label: bits per byte} over nll_bits [B, S, N], counting only mask [B, S, N] (None: every
    slot; pass the batch's mask so padded slots are left out, or it & a copy class)."""
    keep = torch.ones_like(nll_bits, dtype=torch.bool) if mask is None else mask.bool()  # [B, S, N]
    band_mask = torch.zeros_like(keep)  # [B, S, N]
    out = {}
    for label, positions in position_bands(nll_bits.shape[-1], edges):
        band_mask.zero_()
        band_mask[..., positions] = True
        out[label] = bpb_on_mask(nll_bits, keep & band_mask)
    return out
