"""memzoo.diagnose.induction: a probe is one chunk written twice, and the bits on each copy are read
at the right positions (a model that copies from lag chunk_len has ~0 bits on the second copy only)."""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn

import memzoo.diagnose.induction as ind
from memzoo.runs.configure import load_config

CHUNK = 12


class Copier(nn.Module):
    """Predicts at position t the byte at t + 1 - lag, with certainty; uniform where there is none."""

    def __init__(self, lag: int):
        super().__init__()
        self.lag, self.w = lag, nn.Parameter(torch.zeros(1))

    def initial_state(self, batch: int, device: torch.device) -> None:
        return None

    def forward(self, tokens: torch.Tensor, state: None, reset: torch.Tensor) -> SimpleNamespace:
        b, _, n = tokens.shape  # [B, 1, N]
        logits = torch.zeros(b, 1, n, 256)
        for t in range(self.lag - 1, n):
            logits[:, 0, t].scatter_(-1, tokens[:, 0, t + 1 - self.lag, None], 100.0)
        return SimpleNamespace(logits=logits)


def probes(n: int = 32) -> torch.Tensor:
    chunk = torch.randint(97, 123, (3, CHUNK), generator=torch.Generator().manual_seed(0))
    return torch.cat([chunk, chunk, torch.full((3, n + 1 - 2 * CHUNK), 32)], dim=1)  # [C, N + 1]


def test_a_copier_has_no_bits_on_the_second_copy_and_uniform_bits_on_the_first() -> None:
    first, second = ind.copy_bits_on(Copier(CHUNK), probes(), CHUNK)
    assert math.isclose(first, 8.0, rel_tol=1e-6)  # log2 256: nothing to copy from yet
    assert second < 1e-6
    _, off_by_one = ind.copy_bits_on(Copier(CHUNK + 1), probes(), CHUNK)
    assert off_by_one > 100  # copies the wrong byte, certainly


def test_probe_batch_writes_a_held_out_chunk_twice_and_refuses_two_copies_that_do_not_fit() -> None:
    cfg = load_config("local", ["model.segment_len=32", "data.max_docs=20"])
    seq = ind.probe_batch(cfg, 4, CHUNK)
    assert seq.shape == (4, 33)
    assert torch.equal(seq[:, :CHUNK], seq[:, CHUNK:2 * CHUNK]) and (seq[:, 2 * CHUNK:] == 32).all()
    assert len({tuple(r) for r in seq[:, :CHUNK].tolist()}) > 1  # chunks drawn, not one chunk repeated
    with pytest.raises(ValueError, match="--chunk-len 16: two copies must fit in one segment of 32 bytes"):
        ind.probe_batch(cfg, 4, 16)
