"""memzoo.diagnose.infini_share: one key's share of the linear read and its selectivity, by hand."""
from __future__ import annotations

import torch

import memzoo.diagnose.infini_share as ish


def test_share_and_selectivity_by_hand() -> None:
    sq = torch.tensor([[1.0, 0.0], [1.0, 1.0]])  # [H, D]
    sk = torch.tensor([[1.0, 5.0], [3.0, 0.0], [0.0, 2.0]]).expand(2, 3, 2)  # [H, T, D]
    share, sel = ish.share_and_selectivity(sq, sk, 1)
    # head 0: similarities (1, 3, 0); head 1: (6, 3, 2)
    assert torch.allclose(share, torch.tensor([3 / 4, 3 / 11]))
    assert torch.allclose(sel, torch.tensor([3 / (4 / 3), 3 / (11 / 3)]))
    assert torch.allclose(sel, share * 3)  # the selectivity is the share times the keys written
