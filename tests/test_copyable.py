"""memzoo.data.copyable: copy classes worked out by hand, against a naive O(L^2) reference on random
strings, per row of a batch, in the corpus's segment layout; position bands and their bits per byte."""
from __future__ import annotations

import math

import pytest
import torch

from memzoo.data.copyable import (DEFAULT_EDGES, DEFAULT_K, beyond_window_copyable, bpb_by_band, bpb_on_mask,
                                  copy_classes, last_earlier_occurrence, position_bands, target_layout,
                                  visible_start, within_window_copyable)
from memzoo.data.corpus import Document
from memzoo.data.samplers import stream_documents


def classes(doc, k: int, window: int, segment_len: int | None = None) -> str:
    """One letter per byte: b(eyond), w(ithin) or n(ot copyable)."""
    c = copy_classes(doc, k, window, segment_len)
    assert torch.equal(c.beyond.int() + c.within.int() + c.none.int(), torch.ones_like(c.none, dtype=torch.int))
    return "".join("b" if b else "w" if w else "n" for b, w in zip(c.beyond.tolist(), c.within.tolist()))


# doc1, k = 2 (3-grams doc[t-2..t]):
#   pos  0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15
#   byte a b c d a b c d X Y Z  W  a  b  c  d
# repeats: t=6 "abc" (source 2), t=7 "bcd" (3), t=14 "abc" (2, 6; latest 6), t=15 "bcd" (3, 7; latest 7);
# every other 3-gram is new, and t < 2 never counts.
#   window 4 (sees t-4..t-1): t=6 sees 2..5 ∋ 2 -> w; t=7 sees 3..6 ∋ 3 -> w; t=14 sees 10..13 -> b; t=15 sees 11..14 -> b
#   window 3 (sees t-3..t-1): t=6 sees 3..5 -> b; t=7 sees 4..6 -> b; 14, 15 -> b
#   window 8 (sees t-8..t-1): t=14 sees 6..13 ∋ 6 -> w; t=15 sees 7..14 ∋ 7 -> w; 6, 7 -> w
#   window 0, N = 4 (sees ((t-1)//4)*4..t-1): t=6, 7 see 4.. -> b; t=14, 15 see 12.. -> b
DOC1 = b"abcdabcdXYZWabcd"
# doc2, k = 1 (2-grams), window 0, N = 4 (segments 0-3, 4-7):
#   pos  0 1 2 3 4 5 6 7
#   byte a b a b a b Q R
# t=3 "ab" (source 1) sees 0..2 -> w; t=4 "ba" (source 2) is predicted from position 3, the last slot of
# segment 0, so sees 0..3 -> w; t=5 "ab" (sources 1, 3) sees 4 only -> b; t=6, 7 new; t=1 "ab", t=2 "ba" first.
DOC2 = b"ababab" + b"QR"


@pytest.mark.parametrize("doc, k, window, segment_len, expected", [
    (DOC1, 2, 4, None, "nnnnnnwwnnnnnnbb"),
    (DOC1, 2, 3, None, "nnnnnnbbnnnnnnbb"),
    (DOC1, 2, 8, None, "nnnnnnwwnnnnnnww"),
    (DOC1, 2, 0, 4, "nnnnnnbbnnnnnnbb"),
    (DOC2, 1, 0, 4, "nnnwwbnn"),
])
def test_copy_classes_worked_by_hand(doc: bytes, k: int, window: int, segment_len, expected: str) -> None:
    assert classes(doc, k, window, segment_len) == expected
    ids = torch.tensor(list(doc))
    assert "".join("b" if x else "." for x in beyond_window_copyable(ids, k, window, segment_len).tolist()) \
        == expected.replace("w", ".").replace("n", ".")
    assert "".join("w" if x else "." for x in within_window_copyable(ids, k, window, segment_len).tolist()) \
        == expected.replace("b", ".").replace("n", ".")


def test_latest_source_and_defaults_by_hand() -> None:
    prev = last_earlier_occurrence(DOC1, 2)
    assert prev.tolist() == [-1] * 6 + [2, 3] + [-1] * 6 + [6, 7]
    assert DEFAULT_K == 8 and last_earlier_occurrence(DOC1).tolist() == [-1] * 16  # no 9-gram repeats
    # t=18 ends "012345678" (bytes 10..18), first seen ending at 8; every later byte repeats too, and with
    # segments of 8 each source lies 10 bytes back, before the query's segment
    assert classes(b"0123456789" * 3, DEFAULT_K, 0, 8) == "n" * 18 + "b" * 12
    assert visible_start(6, 0, 2).tolist() == [0, 0, 0, 2, 2, 4]  # byte t is seen from position t-1's segment
    assert visible_start(6, 2).tolist() == [0, 0, 0, 1, 2, 3]


def naive(doc: list[int], k: int, window: int, segment_len: int) -> str:
    """O(L^2) reference: every earlier (k+1)-gram occurrence, checked against the visible span."""
    out = []
    for t in range(len(doc)):
        sources = [j for j in range(k, t) if t >= k and doc[j - k: j + 1] == doc[t - k: t + 1]]
        query = t - 1  # the position whose logits predict byte t
        if window > 0:
            seen = range(max(0, query - window + 1), query + 1)  # query p attends keys p-W+1..p
        else:
            seen = range(max(0, query) // segment_len * segment_len, query + 1)  # its own segment up to itself
        out.append("n" if not sources else "w" if any(j in seen for j in sources) else "b")
    return "".join(out)


@pytest.mark.parametrize("k, window, segment_len, alphabet", [
    (0, 0, 4, 3), (1, 3, 4, 2), (2, 0, 5, 2), (2, 1, 4, 3), (3, 7, 8, 2), (4, 0, 8, 2), (8, 0, 16, 2), (2, 50, 4, 4),
])
def test_matches_the_naive_reference_on_random_strings(k: int, window: int, segment_len: int, alphabet: int) -> None:
    gen = torch.Generator().manual_seed(1000 * k + window + segment_len)
    docs = torch.randint(0, alphabet, (4, 97), generator=gen)  # [B, L]
    batch = copy_classes(docs, k, window, segment_len)
    for row in range(docs.shape[0]):
        expected = naive(docs[row].tolist(), k, window, segment_len)
        assert classes(docs[row], k, window, segment_len) == expected
        assert classes(bytes(docs[row].tolist()), k, window, segment_len) == expected  # bytes in, same answer
        got = "".join("b" if b else "w" if w else "n" for b, w in zip(batch.beyond[row].tolist(), batch.within[row].tolist()))
        assert got == expected  # a batch is classified per row


def test_a_batch_row_never_copies_from_another_row() -> None:
    docs = torch.tensor([list(b"abcdabcd"), list(b"XYZWabcd")])  # row 1's "abc" first occurs at 6 in its own row
    c = copy_classes(docs, 2, 0, 4)
    assert c.beyond[0].nonzero().flatten().tolist() == [6, 7] and not c.beyond[1].any() and not c.within.any()


def test_short_documents_and_bad_visibility() -> None:
    assert classes(b"", 2, 3) == "" and classes(b"ab", 2, 3) == "nn" and classes(b"aaa", 0, 0, 2) == "nww"
    with pytest.raises(ValueError):
        copy_classes(DOC1, 2, 0)  # window 0 needs segment_len
    with pytest.raises(ValueError):
        copy_classes(DOC1, 2, -1, 4)


def test_target_layout_is_the_corpus_layout() -> None:
    """Slot (s, n) of target_layout is the target slot of the corpus's stream batches."""
    data = b"the cat sat on the mat, the cat sat."  # 36 bytes: 35 targets in 5 segments of 8
    n = 8
    batches = list(stream_documents([Document("d", data)], 1, n))
    targets = torch.cat([b.targets for b in batches], dim=1)[0]  # [S, N]
    mask = torch.cat([b.mask for b in batches], dim=1)[0]  # [S, N]
    ids = torch.tensor(list(data))
    assert torch.equal(target_layout(torch.ones(len(data), dtype=torch.bool), n), mask)
    assert torch.equal(target_layout(ids, n)[mask], targets[mask])
    two = target_layout(torch.stack([ids, ids]), n)  # [B, S, N]
    assert two.shape == (2, *mask.shape) and torch.equal(two[1], target_layout(ids, n))


def test_position_bands_by_hand() -> None:
    assert position_bands(16, (0, 4, 8)) == [("0-3", slice(0, 4)), ("4-7", slice(4, 8)), ("8-15", slice(8, 16))]
    assert [label for label, _ in position_bands(128)] == ["0-7", "8-15", "16-31", "32-63", "64-127"]
    assert DEFAULT_EDGES == (0, 8, 16, 32, 64)
    assert [label for label, _ in position_bands(10)] == ["0-7", "8-9"]  # edges past the segment dropped
    for bad in [(1, 4), (0, 4, 4), ()]:
        with pytest.raises(ValueError):
            position_bands(16, bad)


def test_bits_per_byte_by_band_and_on_a_mask_by_hand() -> None:
    nll = (torch.arange(16.0) + 16 * torch.arange(2.0)[:, None])[None]  # [1, 2, 16]: slot (s, n) holds n + 16 s
    assert bpb_by_band(nll, edges=(0, 4, 8)) == {"0-3": (6 + 70) / 8, "4-7": (22 + 86) / 8, "8-15": (92 + 220) / 16}
    mask = torch.ones(1, 2, 16, dtype=torch.bool)
    mask[0, 1, 2:] = False  # segment 1 is padded after 2 targets
    # 0-3: 0, 1, 2, 3, 16, 17; 4-7: 4..7; 8-15: 8..15
    assert bpb_by_band(nll, mask, (0, 4, 8)) == {"0-3": 39 / 6, "4-7": 5.5, "8-15": 11.5}
    assert bpb_on_mask(torch.tensor([[1.0, 2.0], [3.0, 4.0]]), torch.tensor([[True, False], [False, True]])) == 2.5
    assert math.isnan(bpb_on_mask(nll, torch.zeros_like(mask)))
    assert math.isnan(bpb_by_band(nll[:, :, :4], mask[:, :, :4] & False, (0, 2))["2-3"])
