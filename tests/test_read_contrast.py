"""memzoo.diagnose.read_contrast: reads whose contrast is known by hand, a brute-force N x N reference,
and a tiny Infini-attention model whose probed reads equal σ(Q) M / (σ(Q) z) from its carried state."""
from __future__ import annotations

import math

import pytest
import torch

from conftest import tiny_model
from memzoo.diagnose.read_contrast import contrast_to, infini_read_contrast, infini_reads, pool, read_contrast


def brute(reads: torch.Tensor, mean_value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per head: every ordered pair's cosine and every read's cosine to the mean value, by loops."""
    b, h, n, _ = reads.shape
    between, to_mean = [], []
    for head in range(h):
        pair_cos, read_cos = [], []
        for row in range(b):
            r = [x.double() for x in reads[row, head] if x.norm() > 0]
            pair_cos += [float(torch.cosine_similarity(x, y, dim=0)) for i, x in enumerate(r) for j, y in enumerate(r) if i != j]
            read_cos += [float(torch.cosine_similarity(x, mean_value[row, head].double(), dim=0)) for x in r]
        between.append(sum(pair_cos) / len(pair_cos) if pair_cos else math.nan)
        to_mean.append(sum(read_cos) / len(read_cos) if read_cos else math.nan)
    return torch.tensor(between, dtype=torch.double), torch.tensor(to_mean, dtype=torch.double)


def test_identical_orthogonal_and_mean_reads_by_hand() -> None:
    values = torch.randn(2, 2, 5, 4, generator=torch.Generator().manual_seed(0))  # [B, H, M, D]
    mean = values.mean(2, keepdim=True)  # [B, H, 1, D]
    same = mean * torch.tensor([1.0, 2.0, 0.5])[:, None]  # [B, H, 3, D]: the mean value at three scales
    c = read_contrast(same, values)
    assert torch.allclose(c.between_reads, torch.ones(2, dtype=torch.double))  # identical directions -> 1
    assert torch.allclose(c.to_mean_value, torch.ones(2, dtype=torch.double))  # each read is the mean value -> 1
    assert c.pairs.tolist() == [12.0, 12.0] and c.reads.tolist() == [6.0, 6.0]  # 2 rows x 3 x 2 ordered pairs
    orthogonal = torch.eye(4).expand(1, 2, 4, 4)  # [B, H, N, D]: four orthogonal reads per head
    c = read_contrast(orthogonal, torch.eye(4)[:1].expand(1, 2, 1, 4))  # the mean value is read 0's direction
    assert torch.allclose(c.between_reads, torch.zeros(2, dtype=torch.double))
    assert torch.allclose(c.to_mean_value, torch.full((2,), 0.25, dtype=torch.double))  # cosines 1, 0, 0, 0
    # head 0: (1, 0), (0, 1), (1, 1): pair cosines 0, 1/√2, 1/√2 (each twice over 6 ordered pairs) -> √2/3;
    # head 1: three copies of (0, 3) -> 1. Mean value (1, 0): head 0 cosines 1, 0, 1/√2 -> (1 + 1/√2)/3
    reads = torch.tensor([[[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], [[0.0, 3.0]] * 3]])  # [1, 2, 3, 2]
    c = contrast_to(reads, torch.tensor([[[1.0, 0.0], [1.0, 0.0]]]))
    assert torch.allclose(c.between_reads, torch.tensor([math.sqrt(2) / 3, 1.0], dtype=torch.double))
    assert torch.allclose(c.to_mean_value, torch.tensor([(1 + 1 / math.sqrt(2)) / 3, 0.0], dtype=torch.double))
    assert c.mean_between_reads == pytest.approx((math.sqrt(2) / 3 + 1) / 2)
    assert c.mean_to_mean_value == pytest.approx((1 + 1 / math.sqrt(2)) / 6)


def test_matches_brute_force_with_zero_reads_and_masks() -> None:
    gen = torch.Generator().manual_seed(3)
    reads = torch.randn(3, 2, 6, 5, generator=gen)  # [B, H, N, D]
    reads[0, 1, 2] = 0.0  # an empty read: no direction, left out
    reads[2, :, :5] = 0.0  # row 2: one read per head, so no pair
    values = torch.randn(3, 2, 7, 5, generator=gen)  # [B, H, M, D]
    c = read_contrast(reads, values)
    between, to_mean = brute(reads, values.mean(2))
    assert torch.allclose(c.between_reads, between) and torch.allclose(c.to_mean_value, to_mean)
    assert c.pairs.tolist() == [60.0, 50.0] and c.reads.tolist() == [13.0, 12.0]
    read_mask = torch.ones(3, 6, dtype=torch.bool)
    read_mask[1, :3] = False
    value_mask = torch.ones(3, 7, dtype=torch.bool)
    value_mask[0, 4:] = False
    c = read_contrast(reads, values, read_mask, value_mask)
    masked = reads.clone()
    masked[1, :, :3] = 0.0
    mean_value = torch.stack([values[0, :, :4].mean(1), values[1].mean(1), values[2].mean(1)])  # [B, H, D]
    between, to_mean = brute(masked, mean_value)
    assert torch.allclose(c.between_reads, between) and torch.allclose(c.to_mean_value, to_mean)


def test_pooled_parts_equal_one_contrast_over_all_rows() -> None:
    gen = torch.Generator().manual_seed(5)
    reads, mean_value = torch.randn(4, 3, 5, 6, generator=gen), torch.randn(4, 3, 6, generator=gen)
    whole = contrast_to(reads, mean_value)
    parts = pool([contrast_to(reads[:1], mean_value[:1]), contrast_to(reads[1:], mean_value[1:])])
    assert torch.allclose(parts.between_reads, whole.between_reads) and torch.allclose(parts.to_mean_value, whole.to_mean_value)
    empty = contrast_to(torch.zeros(1, 3, 5, 6), mean_value[:1])  # all reads empty: nan, and pools as nothing
    assert empty.between_reads.isnan().all() and empty.to_mean_value.isnan().all()
    pooled = pool([whole, empty])
    assert torch.allclose(pooled.between_reads, whole.between_reads) and torch.allclose(pooled.to_mean_value, whole.to_mean_value)


def hand_read(sq: torch.Tensor, mem: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """σ(Q) M / (σ(Q) z), 0 where nothing was written: sq [B, H, N, D], mem [B, H, D, D], z [B, H, D]."""
    num = torch.einsum("bhnk,bhkv->bhnv", sq, mem)
    den = torch.einsum("bhnk,bhk->bhn", sq, z)[..., None]
    empty = (z == 0).all(-1)[..., None, None]  # [B, H, 1, 1]
    return torch.where(empty, torch.zeros_like(num), num / torch.where(empty, torch.ones_like(den), den))


@pytest.mark.parametrize("method", ["infini-linear", "infini-delta"])
def test_the_probed_read_is_the_papers_read_from_the_carried_state(method: str) -> None:
    """One call over three segments (the probe), against the same segments fed one at a time, each
    segment's read computed by hand from the state the previous call left."""
    model = tiny_model(method).double()
    tokens = torch.randint(0, 256, (2, 3, 8), generator=torch.Generator().manual_seed(11))  # [B, S, N]
    probed = infini_reads(model, tokens)
    assert sorted(probed) == list(range(model.cfg.n_layers))
    state = None
    with torch.no_grad():
        for s in range(tokens.shape[1]):
            for layer, seen in probed.items():
                if state is None:  # nothing written yet: the read is 0
                    assert float(seen["read"][:, s].abs().max()) == 0.0
                else:
                    mem, z = state.layers[layer]["M"], state.layers[layer]["z"]
                    expected = hand_read(seen["sq"][:, s], mem, z)  # [B, H, N, D]
                    assert torch.allclose(seen["read"][:, s], expected, atol=1e-12, rtol=1e-9)
                    assert float(expected.abs().max()) > 0
            state = model(tokens[:, s: s + 1], state=state).state
    contrast = infini_read_contrast(model, tokens)
    for layer, seen in probed.items():
        v = seen["v"]  # [B, S, H, N, D]: segment s's reads count against the mean of the values of segments < s
        parts = [contrast_to(seen["read"][:, s], v[:, :s].mean((1, 3))) for s in (1, 2)]
        assert torch.allclose(contrast[layer].between_reads, pool(parts).between_reads)
        assert torch.allclose(contrast[layer].to_mean_value, pool(parts).to_mean_value)
        whole_between, whole_mean = brute(seen["read"][:, 1:].flatten(0, 1),
                                          torch.stack([v[:, :1].mean((1, 3)), v[:, :2].mean((1, 3))], 1).flatten(0, 1))
        assert torch.allclose(contrast[layer].between_reads, whole_between)
        assert torch.allclose(contrast[layer].to_mean_value, whole_mean)


def test_a_model_without_infini_is_refused() -> None:
    with pytest.raises(ValueError, match="no Infini-attention layer"):
        infini_reads(tiny_model("xl"), torch.zeros(1, 2, 8, dtype=torch.long))
    with pytest.raises(ValueError, match="S >= 2"):
        infini_read_contrast(tiny_model("infini-linear"), torch.zeros(1, 1, 8, dtype=torch.long))
