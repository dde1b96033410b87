"""Can the backbone learn to copy? The classic induction test, through the real training step.

A tiny backbone from scratch reads a random printable string written twice in one segment. The first
copy cannot be predicted (log2(95) = 6.6 bits a byte at best); a model that learned to look up what it
has seen predicts the second copy for a fraction of a bit. Measured here (2-layer, d_model 48, batch 16,
lr 1e-2): the second copy falls under 1 bit by step ~150, through memzoo.training.windows.train_window
and the run's AdamW groups. The string sits at the same offset in every row, so one head that looks a
fixed distance back suffices: this holds the model and the training step to learning *positional*
copying, and fails when positions are lost (RoPE positions all 0). Copying by content, at a distance
that varies from row to row (what text needs), forms far more slowly: the same kind of model had barely
started after 1,500 steps (docs/protocols/backbone.md).
"""
from __future__ import annotations

import math

import pytest
import torch
from omegaconf import OmegaConf

from memzoo.core.config import ConfigError, ModelConfig, TrainConfig
from memzoo.core.losses import token_nll
from memzoo.core.model import MemoryModel
from memzoo.data.copy_reads import PRINTABLE, CopyReads
from memzoo.data.corpus import Batch
from memzoo.data.samplers import StreamSampler
from memzoo.training.train import build_optimizer, lr_at
from memzoo.training.windows import train_window

L = 12  # the string's length; one segment holds it twice
STEPS = 200


def copy_batch(rows: int, gen: torch.Generator) -> Batch:
    """[rows, 1, 2L] bytes: a random printable string of L bytes, then the same string again."""
    reads = torch.stack([CopyReads(1.0, L, L).make(2 * L + 1, gen) for _ in range(rows)])  # [B, 2L + 1]
    n = 2 * L
    return Batch(tokens=reads[:, None, :n], targets=reads[:, None, 1:], mask=torch.ones(rows, 1, n, dtype=torch.bool),
                 reset=torch.ones(rows, 1, dtype=torch.bool), seg_index=torch.zeros(rows, 1, dtype=torch.long))


def copy_bits(model: MemoryModel, batch: Batch) -> tuple[float, float]:
    """Bits per byte on the first copy (its first byte left out) and on the second."""
    with torch.no_grad():
        bits = token_nll(model(batch.tokens).logits, batch.targets)[:, 0] / math.log(2)  # [B, 2L]
    return float(bits[:, : L - 1].mean()), float(bits[:, L:].mean())


def test_a_tiny_backbone_learns_to_copy_a_random_string_at_a_fixed_distance_from_scratch():
    torch.manual_seed(0)
    model = MemoryModel(ModelConfig(d_model=48, n_layers=2, n_heads=4, segment_len=2 * L), "local",
                        OmegaConf.create({"name": "local"}), seed=0)
    tc = TrainConfig(steps=STEPS, lr=1e-2, warmup_steps=10, min_lr_ratio=0.5)
    opt = build_optimizer(model, tc)
    gen = torch.Generator().manual_seed(1)
    before = copy_bits(model, copy_batch(64, torch.Generator().manual_seed(99)))
    for step in range(STEPS):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, tc) * group.get("lr_mult", 1.0)
        opt.zero_grad()
        train_window(model, copy_batch(16, gen), bptt_segments=1)
        torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
        opt.step()
    first, second = copy_bits(model, copy_batch(64, torch.Generator().manual_seed(99)))
    assert before[1] > 7.0  # untrained: about 8 bits on both copies
    assert first > 6.0, first  # the first copy is random: nothing predicts it
    assert second < 0.5, (first, second)  # the second is copied


def test_copy_reads_are_periodic_and_printable():
    gen = torch.Generator().manual_seed(0)
    reads = CopyReads(1.0, 16, 4095)
    for _ in range(20):
        x = reads.make(5000, gen)
        period = next(d for d in range(1, 5000) if torch.equal(x[d:], x[:-d]))
        assert 16 <= period <= 4095
        assert bool(torch.isin(x, PRINTABLE).all())
        assert len(set(x[:period].tolist())) > min(period, 95) // 2  # random, not a short pattern


def test_copy_distances_are_log_uniform():
    gen = torch.Generator().manual_seed(0)
    d = torch.tensor([CopyReads(1.0, 16, 4095).distance(gen) for _ in range(4000)], dtype=torch.float64)
    assert int(d.min()) >= 16 and int(d.max()) <= 4095
    # log-uniform: as many draws in [16, 256) as in [256, 4096) (each is a factor of 16)
    low = float((d < 256).double().mean())
    assert 0.45 < low < 0.55, low


def test_uniform_copy_distances_make_long_pairs_common():
    gen = torch.Generator().manual_seed(0)
    d = torch.tensor([CopyReads(1.0, 16, 4095, draw="uniform").distance(gen) for _ in range(4000)], dtype=torch.float64)
    assert int(d.min()) >= 16 and int(d.max()) <= 4095
    # uniform: about 15% at 3,500 bytes or more (log-uniform: 3%), and about half below 2,056
    assert 0.12 < float((d >= 3500).double().mean()) < 0.18
    assert 0.45 < float((d < 2056).double().mean()) < 0.55
    with pytest.raises(ConfigError, match="train.copy_draw='gaussian'; expected one of log-uniform, uniform"):
        CopyReads(1.0, 16, 4095, draw="gaussian")


def test_the_stream_sampler_mixes_copy_reads_at_the_share_asked(tmp_path):
    from memzoo.data.corpus import Document

    docs = [Document(f"d{i}", bytes([97 + i % 26]) * 3000) for i in range(10)]  # constant letters: no printable noise
    n, cap = 32, 8
    sampler = StreamSampler(docs, n, seed=0, max_doc_segments=cap, copy=CopyReads(0.5, 4, 64))
    plain = StreamSampler(docs, n, seed=0, max_doc_segments=cap)
    batch = sampler.sample(0, 200, cap)  # [200, 8, 32]: each row is one whole read
    rows = batch.tokens.flatten(1)  # [200, 256]
    copy = torch.tensor([len(set(r.tolist())) > 1 for r in rows])
    assert 0.4 < float(copy.double().mean()) < 0.6
    assert bool(batch.reset[:, 0].all())
    again = sampler.sample(0, 200, cap)
    assert torch.equal(again.tokens, batch.tokens)  # deterministic in (seed, step)
    # a read that is not a copy read is the document the sampler without them reads there, exactly
    assert torch.equal(plain.sample(0, 200, cap).tokens[~copy], batch.tokens[~copy])


def test_pair_reads_write_each_chunk_twice_d_apart_into_the_text():
    gen = torch.Generator().manual_seed(0)
    text = torch.full((4097,), 0, dtype=torch.long)  # byte 0 is not printable: every chunk byte shows
    reads = CopyReads(1.0, 16, 4095, layout="pairs")
    for _ in range(10):
        x = reads.write_pairs(text, gen)
        written = x != 0
        assert 0.3 < float(written.double().mean()) <= 0.5 + 128 / 4097  # about half, never much more
        assert bool(torch.isin(x[written], PRINTABLE).all())
        # the written bytes are runs of 16..64; each run is the one before it at some distance d >= 16,
        # found as the first earlier run with the same bytes, and nothing else is touched
        edges = torch.diff(written.long(), prepend=torch.zeros(1, dtype=torch.long), append=torch.zeros(1, dtype=torch.long))
        starts, ends = torch.nonzero(edges == 1).flatten().tolist(), torch.nonzero(edges == -1).flatten().tolist()
        runs = [x[a:b] for a, b in zip(starts, ends)]
        assert len(runs) % 2 == 0 or any(len(r) > 64 for r in runs)  # adjacent chunks may touch and merge
        singles = [(a, r) for a, r in zip(starts, runs) if 16 <= len(r) <= 64]
        paired = sum(any(torch.equal(r, q) and b != a for b, q in singles) for a, r in singles)
        assert paired >= 0.8 * len(singles), (paired, len(singles))
    assert torch.equal(text, torch.zeros(4097, dtype=torch.long))  # the document itself is not written to


def test_pair_reads_keep_the_document_around_the_chunks(tmp_path):
    from memzoo.data.corpus import Document

    docs = [Document(f"d{i}", bytes([97 + i % 26]) * 3000) for i in range(10)]
    n, cap = 32, 8
    sampler = StreamSampler(docs, n, seed=0, max_doc_segments=cap, copy=CopyReads(1.0, 4, 64, "pairs", 4, 8))
    plain = StreamSampler(docs, n, seed=0, max_doc_segments=cap)
    rows, text = sampler.sample(0, 50, cap).tokens.flatten(1), plain.sample(0, 50, cap).tokens.flatten(1)  # [50, 256]
    changed = rows != text
    assert 0.3 < float(changed.double().mean()) <= 0.5 + 16 / 257  # chunks written over about half of each read
    assert bool((rows[~changed] == text[~changed]).all()) and bool(torch.isin(rows[changed], PRINTABLE).all())
    with pytest.raises(ConfigError, match="train.copy_layout='spiral'; expected one of periodic, pairs"):
        CopyReads(1.0, 4, 64, layout="spiral")


def test_text_pairs_cut_each_chunk_from_the_donor_and_write_it_twice_d_apart():
    """Each written chunk is a run of the donor's bytes, its second copy exactly d >= 16 after the
    first; the read's own bytes stay elsewhere; without a donor the layout refuses."""
    gen = torch.Generator().manual_seed(1)
    text = torch.zeros(4097, dtype=torch.long)  # byte 0: every written byte shows
    donor = torch.arange(1, 3001)  # [3000] no zero, every value once: a chunk's bytes name where it was cut
    reads = CopyReads(1.0, 16, 4095, layout="text-pairs")
    x, segments = reads.read(text, 32, 32, 128, gen, donor)
    assert segments == 32
    written = (x != 0).nonzero().flatten().tolist()
    assert 0.2 < len(written) / len(x) <= 0.5 + 128 / 4097
    runs: dict[int, list[tuple[int, int]]] = {}  # the chunk's first donor byte -> (where written, length)
    for p in [p for p in written if p == 0 or x[p - 1] == 0]:
        m = 1
        while p + m < len(x) and x[p + m] == x[p + m - 1] + 1:  # consecutive donor bytes
            m += 1
        runs.setdefault(int(x[p]), []).append((p, m))
    assert len(runs) >= 10 and all(m >= 16 for v in runs.values() for _, m in v)  # donor runs of 16..64
    pairs = [v for v in runs.values() if len(v) == 2]
    assert len(pairs) >= 0.8 * len(runs)
    for (a, m), (b, n) in pairs:
        assert b - a >= 16 and torch.equal(x[a:a + min(m, n)], x[b:b + min(m, n)])
    # layout "pairs" never takes a donor's bytes, given one or not
    plain = CopyReads(1.0, 16, 4095, layout="pairs").read(text, 32, 32, 128, torch.Generator().manual_seed(1), donor)[0]
    assert bool(torch.isin(plain[plain != 0], PRINTABLE).all())
    with pytest.raises(ValueError, match="text-pairs.*donor"):
        reads.read(text, 32, 32, 128, gen)


def test_text_pair_reads_in_the_sampler_copy_another_documents_bytes():
    from memzoo.data.corpus import Document

    docs = [Document(f"d{i}", bytes([97 + i]) * 3000) for i in range(10)]  # document i: one letter
    n, cap = 32, 8
    sampler = StreamSampler(docs, n, seed=0, max_doc_segments=cap, copy=CopyReads(1.0, 4, 64, "text-pairs", 4, 8))
    plain = StreamSampler(docs, n, seed=0, max_doc_segments=cap)
    rows, text = sampler.sample(0, 50, cap).tokens.flatten(1), plain.sample(0, 50, cap).tokens.flatten(1)  # [50, 256]
    changed = rows != text
    assert 0.15 < float(changed.double().mean()) <= 0.5 + 16 / 257  # other documents' chunks (a donor may be the read)
    assert bool(torch.isin(rows, torch.arange(97, 107)).all())  # every byte is some document's letter
