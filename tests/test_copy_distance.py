"""memzoo.evaluations.copy_distance: the second copy sits exactly `distance` bytes after the first, the
row is streamed across segments with the state carried, and the bits of each copy are read where
they are (a model that copies from exactly that lag has ~0 bits on the second copy only)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

import memzoo.evaluations.copy_distance as cd

TEXTS = [bytes(range(97, 123)) * 40, b"The quick brown fox jumps over the lazy dog. " * 30]


class HistoryCopier(nn.Module):
    """Keeps every byte streamed so far (its state) and predicts at each position the byte `lag` back
    from the next one, with certainty; uniform (8 bits) where there is none."""

    def __init__(self, lag: int, segment_len: int):
        super().__init__()
        self.lag, self.w = lag, nn.Parameter(torch.zeros(1))
        self.cfg = SimpleNamespace(segment_len=segment_len)

    def initial_state(self, batch: int, device: torch.device) -> torch.Tensor:
        return torch.zeros(batch, 0, dtype=torch.long)

    def forward(self, tokens: torch.Tensor, state: torch.Tensor, reset: torch.Tensor) -> SimpleNamespace:
        b, _, n = tokens.shape  # [B, 1, N]
        history = torch.cat([state, tokens[:, 0]], dim=1)  # [B, P + N]
        p = state.shape[1]
        logits = torch.zeros(b, 1, n, 256)
        for t in range(n):
            src = p + t + 1 - self.lag  # the next byte's position minus the lag
            if src >= 0:
                logits[:, 0, t].scatter_(-1, history[:, src, None], 100.0)
        return SimpleNamespace(logits=logits, state=history)


@pytest.mark.parametrize("kind", cd.KINDS)
def test_rows_hold_the_chunk_again_exactly_distance_bytes_later(kind):
    seq = cd.probe_rows(TEXTS, 100, 16, kind, rows=4)
    assert seq.shape == (4, 100 + 16 + 1)
    assert torch.equal(seq[:, :16], seq[:, 100:116])
    assert not torch.equal(seq[:, :16], seq[:, 50:66])


@pytest.mark.parametrize("distance", [40, 300])  # within one segment of 64, and across five
def test_a_model_copying_from_the_distance_gets_the_second_copy_free_and_another_lag_does_not(distance):
    seq = cd.probe_rows(TEXTS, distance, 16, "random", rows=3)
    first, second = cd.copy_bits(HistoryCopier(distance, 64), seq, distance, 16)
    assert second < 0.01 and first > 7.9  # the first copy has nothing to copy: uniform, 8 bits
    _, wrong = cd.copy_bits(HistoryCopier(distance + 1, 64), seq, distance, 16)
    assert wrong > 7.9


def test_overlapping_copies_are_refused():
    with pytest.raises(ValueError, match="distance=8 is shorter than the chunk"):
        cd.probe_rows(TEXTS, 8, 16, "text", rows=1)
