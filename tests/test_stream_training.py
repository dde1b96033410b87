"""Training whose state matches evaluation (train.carry_state): windows follow documents from their
first byte, each row's memory state carries from one step to the next, resets where a document
starts, and survives an interruption exactly."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import memzoo.training.train as train_module
from memzoo.core.config import ConfigError
from memzoo.data.corpus import Document
from memzoo.data.samplers import StreamSampler
from memzoo.runs.checkpoints import load_checkpoint
from memzoo.training.train import train

from test_train import config, cut_off_after  # tests/ is on pytest's path (the small training config every training test uses)

N = 4  # segment length of the sampler tests


def documents() -> list[Document]:
    """Five documents of distinct bytes and lengths 9..41 (3..10 segments of 4)."""
    return [Document(f"d{i}", bytes((16 * i + t) % 251 for t in range(9 + 8 * i))) for i in range(5)]


def read_rows(sampler: StreamSampler, steps: int, batch: int, window: int) -> list[list[bytes]]:
    """Per row, the documents read over `steps` windows: each a bytes object of the targets in order."""
    rows: list[list[bytes]] = [[] for _ in range(batch)]
    for step in range(steps):
        b = sampler.sample(step, batch, window)
        for r in range(batch):
            for s in range(window):
                if b.reset[r, s]:
                    rows[r].append(b"")
                assert rows[r], "a row's first segment must start a document"
                rows[r][-1] += bytes(b.targets[r, s][b.mask[r, s]].tolist())
    return rows


@pytest.mark.parametrize("cap", [None, 3])
def test_windows_follow_each_document_from_its_first_byte(cap) -> None:
    docs = documents()
    rows = read_rows(StreamSampler(docs, N, seed=1, max_doc_segments=cap), steps=12, batch=3, window=4)
    for row in rows:
        for read in row[:-1]:  # the last document of a row may be cut by the last window
            match = [d.data for d in docs if d.data[1:1 + len(read)] == read]
            assert match, "a document was not read contiguously from its first byte"
            expected = len(match[0]) - 1 if cap is None else min(len(match[0]) - 1, cap * N)
            assert len(read) == expected, "a document was read past its end or its cap, or stopped early"
    assert len({tuple(r) for r in rows}) > 1, "rows must read their own documents"


def test_random_starts_read_full_stretches_from_anywhere_in_a_document() -> None:
    """doc_start="random": each read is `cap` consecutive segments of one document (all of it when
    shorter), beginning at a segment boundary that is not always the first, with the reset flag and
    seg_index 0 at the read's first segment."""
    gen = torch.Generator().manual_seed(0)  # bytes drawn at random: no stretch of one document is in another
    docs = [Document(f"r{i}", bytes(torch.randint(0, 256, (9 + 8 * i,), generator=gen).tolist())) for i in range(5)]
    cap = 3
    sampler = StreamSampler(docs, N, seed=1, max_doc_segments=cap, doc_start="random")
    rows = read_rows(sampler, steps=40, batch=3, window=4)
    starts = set()
    for row in rows:
        for read in row[:-1]:
            where = [(d.data, o) for d in docs for o in range(0, len(d.data), N) if d.data[1 + o:1 + o + len(read)] == read]
            assert where, "a read is not a contiguous stretch of one document from a segment boundary"
            data, offset = where[0]
            assert len(read) == min(len(data) - 1 - offset, cap * N) == min(len(data) - 1, cap * N), "not a full read"
            starts.add((len(data), offset))
    assert {0, N} <= {o for _, o in starts}
    last = {(n, (((n - 1 + N - 1) // N) - cap) * N) for n, _ in starts}  # each long document's last full start
    assert any(pair in starts for pair in last if pair[1] > 0), "the last full read is never drawn"
    a = StreamSampler(docs, N, seed=1, max_doc_segments=cap, doc_start="random")
    for step in range(7):
        a.sample(step, 3, 4)
    b = StreamSampler(docs, N, seed=1, max_doc_segments=cap, doc_start="random")
    assert torch.equal(a.sample(7, 3, 4).tokens, b.sample(7, 3, 4).tokens)  # the same windows alone: resumable
    b = StreamSampler(docs, N, seed=1, max_doc_segments=cap, doc_start="random").sample(0, 3, 4)
    assert torch.equal(b.reset, b.seg_index == 0)
    assert int(b.seg_index.max()) < cap


def test_first_starts_are_the_reads_from_before_the_option() -> None:
    """The default reads exactly what the sampler read before doc_start existed (shipped rows stay
    reproducible): step 5's first byte and segment index per row, as the sampler of ea6882e gave them."""
    a = StreamSampler(documents(), N, seed=2, max_doc_segments=3).sample(5, 3, 4)
    b = StreamSampler(documents(), N, seed=2, max_doc_segments=3, doc_start="first").sample(5, 3, 4)
    assert a.tokens[:, :, 0].tolist() == [[72, 64, 68, 72], [32, 36, 40, 64], [40, 16, 20, 24]]
    assert a.seg_index.tolist() == [[2, 0, 1, 2], [0, 1, 2, 0], [2, 0, 1, 2]]
    for name in ("tokens", "targets", "mask", "reset", "seg_index"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    c = StreamSampler(documents(), N, seed=2, max_doc_segments=3, doc_start="random").sample(5, 3, 4)
    assert not torch.equal(a.tokens, c.tokens)


def test_a_bad_doc_start_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="doc_start='middle'; expected one of first, random"):
        StreamSampler(documents(), N, seed=0, doc_start="middle")
    with pytest.raises(ConfigError, match="doc_start='random' applies to train.carry_state=true only"):
        train(config(tmp_path, "local", "train.doc_start=random"), progress=False, evaluate_at_end=False)


def test_a_window_is_the_same_read_in_order_or_alone() -> None:
    docs = documents()
    ordered = StreamSampler(docs, N, seed=3)
    for step in range(9):
        ordered.sample(step, 2, 4)
    fresh = StreamSampler(docs, N, seed=3)
    a, b = ordered.sample(9, 2, 4), fresh.sample(9, 2, 4)
    for name in ("tokens", "targets", "mask", "reset", "seg_index"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert torch.equal(ordered.sample(2, 2, 4).tokens, StreamSampler(docs, N, seed=3).sample(2, 2, 4).tokens)


def test_a_negative_cap_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match="max_doc_segments=0"):
        StreamSampler(documents(), N, seed=0, max_doc_segments=0)


def test_each_step_starts_from_the_state_the_last_one_ended_with(tmp_path: Path, monkeypatch) -> None:
    seen: list[tuple] = []
    real = train_module.train_window

    def spy(model, batch, *args, state=None, **kw):
        res = real(model, batch, *args, state=state, **kw)
        seen.append((state, res.state, batch.reset.clone()))
        return res

    monkeypatch.setattr(train_module, "train_window", spy)
    train(config(tmp_path, "xl", "name=carry", "train.carry_state=true", "train.steps=3"), progress=False,
          evaluate_at_end=False)
    for (_, ended, _), (started, _, _) in zip(seen, seen[1:]):
        for before, after in zip(ended.all(), started.all()):
            for key in before:
                assert before[key] is after[key], f"step's input state {key} is not the last step's output"


@pytest.mark.parametrize("method", ["xl", "infini-delta"])
def test_resume_with_a_carried_state_gives_the_same_weights(tmp_path: Path, method: str) -> None:
    extra = ("train.carry_state=true", "train.max_doc_segments=6")
    straight = train(config(tmp_path, method, "name=straight", *extra), progress=False, evaluate_at_end=False)
    cfg = config(tmp_path, method, "name=broken", *extra)
    cut_off_after(cfg, 3)
    assert "carried" in load_checkpoint(tmp_path / "broken"), "the interrupted run must keep its carried state"
    resumed = train(cfg, progress=False, evaluate_at_end=False)
    a, b = load_checkpoint(straight)["model"], load_checkpoint(resumed)["model"]
    for key in a:
        assert torch.equal(a[key], b[key]), f"{key} differs after resume"


@pytest.mark.parametrize("extra, message", [
    (("task.name=recall", "train.carry_state=true"), "carry_state=true follows corpus documents"),
    (("train.max_doc_segments=4",), "max_doc_segments=4 applies to train.carry_state=true only"),
])
def test_settings_that_cannot_carry_are_refused(tmp_path: Path, extra, message) -> None:
    with pytest.raises(ConfigError, match=message):
        train(config(tmp_path, "xl", "name=x", *extra), progress=False, evaluate_at_end=False)
