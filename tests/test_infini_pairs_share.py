"""memzoo.diagnose.infini_pairs_share: the pairs' weight in the linear rule's read, by hand."""
from __future__ import annotations


import pytest
import torch

from memzoo.memories.infini import retrieve, sigma, update_linear

import memzoo.diagnose.infini_pairs_share as ips


def test_share_by_hand() -> None:
    sq = torch.tensor([1.0, 0.0])[None, None, None]  # [1, 1, 1, 2]
    z_pairs, z_all = torch.tensor([[[2.0, 0.0]]]), torch.tensor([[[5.0, 5.0]]])  # [1, 1, 2]
    assert torch.allclose(ips.pairs_share(sq, z_pairs, z_all), torch.tensor(0.4))  # 2 / (2 + 3)


def test_share_is_the_pairs_weight_in_the_read() -> None:
    """With the pairs' values all v_P and the filler's all v_F, the linear rule's read is
    share * v_P + (1 - share) * v_F exactly: the share is what the read takes from the pairs."""
    torch.manual_seed(0)
    b, h, n, d = 2, 3, 5, 4
    sk_pairs, sk_filler = sigma(torch.randn(b, h, n, d)), sigma(torch.randn(b, h, 7 * n, d))  # [B, H, T, D]
    v_pairs, v_filler = torch.tensor([1.0, 0.0, 0.0]), torch.tensor([0.0, 1.0, 0.0])
    mem, z = torch.zeros(b, h, d, 3), torch.zeros(b, h, d)
    mem, z = update_linear(mem, z, sk_pairs, v_pairs.expand(b, h, n, 3))
    z_pairs = z.clone()
    mem, z = update_linear(mem, z, sk_filler, v_filler.expand(b, h, 7 * n, 3))
    sq = sigma(torch.randn(b, h, n, d))
    read = retrieve(sq, mem, z)  # [B, H, N, 3]
    share = ips.pairs_share(sq, z_pairs, z)
    assert torch.allclose(read[..., 0], share, atol=1e-6) and torch.allclose(read[..., 1], 1 - share, atol=1e-6)
    assert 0.01 < float(share.min()) and float(share.max()) < 0.99  # a real mixture, not a degenerate case


def test_at_scored_pools_each_example_positions() -> None:
    x = torch.arange(2 * 2 * 4, dtype=torch.float).view(2, 2, 4)  # [B, H, N]
    pooled = ips.at_scored(x, [[0, 3], [1]])
    assert torch.equal(pooled, torch.tensor([[0.0, 3.0, 9.0], [4.0, 7.0, 13.0]]))


def test_gap_one_is_refused_before_anything_loads() -> None:
    """Gap 1 would be read after the selectivity's filler segment, i.e. at gap 2: refused, naming the gaps."""
    with pytest.raises(ValueError, match=r"gaps=\[1, 8\]"):
        ips.share_rows("no-such-run", [8, 1], trials=2)
