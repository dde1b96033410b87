"""Bits per byte by within-segment position and by copy class, per document: what attention within its
span predicts against what only a memory can (the `lm-window` suite; the classes are memzoo.data.copyable's).

The language-model evaluation hands over every streamed segment's per-byte bits; this module sums
them per document (so that methods pair by document as well as by seed) into:
- position bands of segments >= 1 (a segment's first bytes see least of it: `local`'s weakest);
- copy classes over all segments: bytes whose (k+1)-gram occurred earlier in the document ending
  beyond what the byte's query sees through the protocol's attention span (`model.attention_span`:
  the sliding window, or the segment for 0), ending within it, or never.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from memzoo.data.copyable import DEFAULT_EDGES, DEFAULT_K, copy_classes, position_bands, target_layout
from memzoo.data.corpus import Document

CLASSES = ("beyond", "within", "none")


def segment_classes(doc: Document, segment_len: int, span: int, k: int, segments: int | None = None) -> dict[str, Tensor]:
    """{class: [S, N] bool} in the corpus's target layout, for one document (every segment, or its first
    `segments`: a byte's class depends only on the bytes up to it, so the document's head is enough)."""
    data = doc.data if segments is None else doc.data[:segments * segment_len + 1]
    ids = torch.frombuffer(bytearray(data), dtype=torch.uint8).long()  # [L]
    classes = copy_classes(ids, k=k, window=span, segment_len=segment_len)
    return {name: target_layout(getattr(classes, name), segment_len) for name in CLASSES}


def byte_class_columns(docs: list[Document], bits: Tensor, mask: Tensor, seg: Tensor, doc: Tensor, segment_len: int,
                       span: int, k: int = DEFAULT_K, edges: tuple[int, ...] = DEFAULT_EDGES) -> dict[str, Any]:
    """Per-document bits and counts by band (segments >= 1) and by copy class, and bits per byte by
    within-segment position (segments >= 1, pooled). bits, mask: [R, N] (float bits, bool: a real
    target) for R streamed rows; seg, doc: [R] (segment index and document index, -1 for empty rows)."""
    n_docs, n = len(docs), segment_len
    bands = position_bands(n, edges)
    out_bits = {f"band_{label}": torch.zeros(n_docs, dtype=torch.float64) for label, _ in bands}
    out_bits |= {f"copy_{name}": torch.zeros(n_docs, dtype=torch.float64) for name in CLASSES}
    out_count = {key: torch.zeros(n_docs, dtype=torch.float64) for key in out_bits}
    pos_bits = torch.zeros(n, dtype=torch.float64)  # [N]: segments >= 1, pooled over documents
    pos_count = torch.zeros(n, dtype=torch.float64)
    layouts: dict[int, dict[str, Tensor]] = {}
    bits, real = bits.double() * mask, mask.double()  # [R, N]
    for r in range(bits.shape[0]):
        d, s = int(doc[r]), int(seg[r])
        if d < 0 or s < 0:
            continue
        if s >= 1:
            pos_bits += bits[r]
            pos_count += real[r]
            for label, positions in bands:
                out_bits[f"band_{label}"][d] += bits[r, positions].sum()
                out_count[f"band_{label}"][d] += real[r, positions].sum()
        if d not in layouts:  # up to the document's last streamed segment (evaluations read a head of it)
            layouts[d] = segment_classes(docs[d], n, span, k, int(seg[doc == d].max()) + 1)
        for name in CLASSES:
            chosen = layouts[d][name][s].double() * real[r]  # [N]
            out_bits[f"copy_{name}"][d] += (bits[r] * chosen).sum()
            out_count[f"copy_{name}"][d] += chosen.sum()
    used = pos_count > 0
    return {
        "bpb_by_position": torch.where(used, pos_bits / pos_count.clamp(min=1), float("nan")).tolist(),
        "bits_by_doc_class": {key: value.tolist() for key, value in out_bits.items()},
        "tokens_by_doc_class": {key: value.long().tolist() for key, value in out_count.items()},
        "copy_k": k,
        "attention_span": span,
    }
