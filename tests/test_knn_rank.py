"""memzoo.diagnose.knn_rank: the key slot's rank and its weight in the kNN read, by hand."""
from __future__ import annotations

import math

import pytest
import torch

import memzoo.diagnose.knn_rank as kr
from conftest import tiny_model


def test_rank_and_weight_by_hand() -> None:
    sims = torch.tensor([[0.9, 0.5, 0.7], [0.1, 0.2, 0.3]])  # [H, F]
    tau = torch.tensor([1.0, 2.0])
    rank, weight = kr.rank_and_weight(sims, 2, 2, tau)
    assert rank.tolist() == [1, 0]  # head 0: one slot more similar; head 1: the most similar
    e = math.exp
    assert torch.allclose(weight, torch.tensor([e(0.7) / (e(0.9) + e(0.7)), e(0.6) / (e(0.6) + e(0.4))]))
    rank, weight = kr.rank_and_weight(sims, 1, 2, tau)
    assert rank.tolist() == [2, 1] and weight[0] == 0.0  # head 0: outside the top 2, no weight


def test_a_run_without_one_knn_layer_is_refused() -> None:
    with pytest.raises(ValueError, match="expected a memorizing run with one kNN layer; found 0"):
        kr.knn_layer_of(tiny_model("local"))
