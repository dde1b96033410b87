"""Does a memory's read depend on the query? Read contrast, per head:

    between reads  = mean cosine between the reads of two different queries (same batch row and head)
    to mean value  = mean cosine between each read and the mean of the values written before it

A memory that collapsed to a document average returns about the same vector to every query, that
average: both near 1. A read that retrieves query-specific values has a lower first number. Reads
of norm 0 (an empty memory reads 0) have no direction and are left out, as are zero mean values.
Numbers are pooled over rows (every pair, every read counted once) and kept with their counts, so
several calls or segments pool by `pool`.

`infini_read_contrast` runs an Infini-attention model (infini-linear, infini-delta) over a batch and
takes each layer's read from the plugin's documented probe "infini.memory" (`read` = σ(Q) M_{s-1} /
(σ(Q) z_{s-1}), 0 while the memory is empty; `v` = the values it writes), memzoo.core.probe.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import Tensor

from memzoo.core.probe import recording
from memzoo.memories.infini import InfiniAttention


@dataclass
class ReadContrast:
    """Per-head read contrast and the counts it averages over (pairs of reads, reads)."""

    between_reads: Tensor  # [H] mean cosine between two different queries' reads; nan with no pair
    to_mean_value: Tensor  # [H] mean cosine between a read and the mean written value; nan with no read
    pairs: Tensor  # [H] ordered pairs (i, j), i != j, behind between_reads
    reads: Tensor  # [H] reads behind to_mean_value

    @property
    def mean_between_reads(self) -> float:
        """The heads' mean of between_reads (each head counts once)."""
        return float(self.between_reads.nanmean())

    @property
    def mean_to_mean_value(self) -> float:
        """The heads' mean of to_mean_value (each head counts once)."""
        return float(self.to_mean_value.nanmean())


def unit(x: Tensor) -> tuple[Tensor, Tensor]:
    """x [..., D] scaled to norm 1 in float64, and [...] True where its norm is above 0."""
    x = x.double()
    norm = x.norm(dim=-1)
    return x / norm.clamp(min=torch.finfo(torch.float64).tiny)[..., None], norm > 0


def contrast_to(reads: Tensor, mean_value: Tensor, read_mask: Optional[Tensor] = None) -> ReadContrast:
    """Read contrast of reads [B, H, N, D] against mean_value [B, H, D]; read_mask [B, N] (None: all)
    counts only those queries. The pairwise sum is |Σ u_i|² - n per row and head: O(N D), no N x N."""
    u, valid = unit(reads)  # [B, H, N, D], [B, H, N]
    if read_mask is not None:
        valid = valid & read_mask[:, None, :].bool()
    u = u * valid[..., None]  # left-out reads add nothing
    n = valid.sum(-1).double()  # [B, H]
    total = u.sum(-2)  # [B, H, D]
    pair_sum = (total.square().sum(-1) - n).sum(0)  # [H]: Σ over rows of Σ_{i != j} u_i·u_j
    pairs = (n * (n - 1)).sum(0)  # [H]
    m, m_valid = unit(mean_value)  # [B, H, D], [B, H]
    cos = torch.einsum("bhnd,bhd->bhn", u, m)  # [B, H, N]: 0 where the read is left out
    counted = (valid & m_valid[..., None]).double()  # [B, H, N]
    read_count = counted.sum((0, 2))  # [H]
    return ReadContrast(between_reads=pair_sum / pairs, to_mean_value=(cos * counted).sum((0, 2)) / read_count,
                        pairs=pairs, reads=read_count)


def read_contrast(reads: Tensor, values: Tensor, read_mask: Optional[Tensor] = None,
                  value_mask: Optional[Tensor] = None) -> ReadContrast:
    """Read contrast of reads [B, H, N, D] against the mean of the written values [B, H, M, D] (per row
    and head); read_mask [B, N] and value_mask [B, M] (None: all) pick the queries and values counted."""
    keep = torch.ones(values.shape[0], values.shape[2], dtype=torch.double) if value_mask is None \
        else value_mask.double()  # [B, M]
    mean_value = torch.einsum("bhmd,bm->bhd", values.double(), keep) / keep.sum(-1).clamp(min=1)[:, None, None]  # [B, H, D]
    return contrast_to(reads, mean_value, read_mask)


def pool(parts: list[ReadContrast]) -> ReadContrast:
    """Several contrasts as one: each number weighted by its count (every pair, every read once)."""
    pairs = sum(p.pairs for p in parts)
    reads = sum(p.reads for p in parts)
    between = sum(torch.nan_to_num(p.between_reads) * p.pairs for p in parts) / pairs
    to_mean = sum(torch.nan_to_num(p.to_mean_value) * p.reads for p in parts) / reads
    return ReadContrast(between_reads=between, to_mean_value=to_mean, pairs=pairs, reads=reads)


@torch.no_grad()
def infini_reads(model: torch.nn.Module, tokens: Tensor) -> dict[int, dict[str, Tensor]]:
    """{layer index: {"read", "v", "sq": [B, S, H, N, D]}} as the "infini.memory" probe shows them,
    for tokens [B, S, N] run in one call from a fresh state (each row one document from its start)."""
    layers = [m.layer_index for m in model.modules() if isinstance(m, InfiniAttention)]
    if not layers:
        raise ValueError("the model has no Infini-attention layer (methods infini-linear, infini-delta)")
    seen: dict[int, dict[str, Tensor]] = {}

    def record(name: str, values: dict[str, Any]) -> None:
        seen[values["layer"]] = {key: values[key].detach() for key in ("read", "v", "sq")}

    with recording(record, {"infini.memory"}):
        model(tokens)
    return {i: seen[i] for i in layers}


def segment_contrast(read: Tensor, v: Tensor) -> ReadContrast:
    """Read contrast of one layer's reads [B, S, H, N, D] of segments 1..S-1, each against the mean of
    the values [B, S, H, N, D] of the segments before it (what M_{s-1} was written from; no resets)."""
    b, s, h, n, d = v.shape
    written = v.double().sum(3).cumsum(1)[:, :-1]  # [B, S-1, H, D]: Σ of the values of segments < s
    mean_value = written / (n * torch.arange(1, s, dtype=torch.double))[None, :, None, None]  # [B, S-1, H, D]
    return contrast_to(read[:, 1:].flatten(0, 1), mean_value.flatten(0, 1))  # rows: (b, s >= 1)


def infini_read_contrast(model: torch.nn.Module, tokens: Tensor) -> dict[int, ReadContrast]:
    """{layer index: read contrast} of an Infini-attention model on tokens [B, S, N] (S >= 2; segment 0
    reads an empty memory), each segment's reads against the values written before it."""
    if tokens.dim() != 3 or tokens.shape[1] < 2:
        raise ValueError(f"tokens of shape {tuple(tokens.shape)}; expected [B, S >= 2, N]")
    return {i: segment_contrast(r["read"], r["v"]) for i, r in infini_reads(model, tokens).items()}
