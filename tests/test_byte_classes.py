"""memzoo.evaluations.byte_classes: bits per document by position band and copy class, worked by hand on
a small document, and on a real evaluation the classes partition each document's bits and the bands
with segment 0 do too."""
from __future__ import annotations

import math

import pytest
import torch

from conftest import tiny_model
from memzoo.data.corpus import Document
from memzoo.evaluations.byte_classes import byte_class_columns
from memzoo.evaluations.lm import evaluate_model


def test_bands_and_copy_classes_by_hand() -> None:
    """doc "ababab" + "Xab" (t = 0..8; N = 4, window 4, k = 1: 2-grams doc[t-1..t]). t = 1 "ab" and t = 2
    "ba" are first seen: none; t = 3, 4, 5 repeat the gram ending at t - 2 (visible t - 4 .. t - 1):
    within; t = 6 "bX" and t = 7 "Xa" are new: none; t = 8 "ab", last seen ending at 5 (visible 4..7):
    within. With window 2, t = 8's source 5 is outside 6..7: beyond."""
    doc = Document("d", b"ababab" + b"Xab")
    n = 4
    # rows as the stream gives them: segment 0 holds targets t = 1..4, segment 1 t = 5..8, segment 2 none
    bits = torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]])  # [R, N] bits of targets t = 1..8
    mask = torch.ones(2, n, dtype=torch.bool)
    seg, idx = torch.tensor([0, 1]), torch.tensor([0, 0])
    cols = byte_class_columns([doc], bits, mask, seg, idx, n, span=4, k=1, edges=(0, 2))
    by = cols["bits_by_doc_class"]
    count = cols["tokens_by_doc_class"]
    # bands of segment 1 only: positions 0-1 (t = 5, 6) and 2-3 (t = 7, 8)
    assert by["band_0-1"] == [5.0 + 6.0] and by["band_2-3"] == [7.0 + 8.0]
    assert count["band_0-1"] == [2] and count["band_2-3"] == [2]
    assert by["copy_within"] == [3.0 + 4.0 + 5.0 + 8.0] and by["copy_beyond"] == [0.0]
    assert by["copy_none"] == [1.0 + 2.0 + 6.0 + 7.0]
    assert cols["bpb_by_position"] == [5.0, 6.0, 7.0, 8.0] and cols["attention_span"] == 4 and cols["copy_k"] == 1
    narrow = byte_class_columns([doc], bits, mask, seg, idx, n, span=2, k=1, edges=(0, 2))["bits_by_doc_class"]
    assert narrow["copy_beyond"] == [8.0] and narrow["copy_within"] == [3.0 + 4.0 + 5.0]


def test_padded_slots_and_empty_rows_count_nothing() -> None:
    doc = Document("d", b"abcabc")
    bits = torch.tensor([[1.0, 1.0, 1.0, 1.0], [2.0, 9.0, 9.0, 9.0], [9.0, 9.0, 9.0, 9.0]])
    mask = torch.tensor([[True] * 4, [True, False, False, False], [False] * 4])
    cols = byte_class_columns([doc], bits, mask, torch.tensor([0, 1, -1]), torch.tensor([0, 0, -1]), 4, span=0, k=2)
    assert sum(v[0] for k, v in cols["bits_by_doc_class"].items() if k.startswith("copy_")) == 6.0
    assert cols["bpb_by_position"][0] == 2.0 and all(math.isnan(x) for x in cols["bpb_by_position"][1:])


@pytest.mark.parametrize("method", ["local", "xl"])
def test_on_a_real_evaluation_classes_and_bands_partition_each_documents_bits(method: str) -> None:
    """Copy classes sum to each document's bits; bands (segments >= 1) plus segment 0 do too; the
    pooled by-position curve, weighted by counts, is the bits per byte of segments >= 1."""
    model = tiny_model(method)
    gen = torch.Generator().manual_seed(0)
    phrase = bytes(torch.randint(97, 123, (12,), generator=gen).tolist())  # repeats 2 segments later: copyable
    docs = [Document("d0", phrase + b"-" * 20 + phrase), Document("d1", phrase * 2 + b"."), Document("d2", b"short doc")]
    res = evaluate_model(model, docs, batch_size=2, max_segments_per_doc=None, progress=False)
    by, count = res["bits_by_doc_class"], res["tokens_by_doc_class"]
    for d in range(len(docs)):
        classes = sum(by[f"copy_{c}"][d] for c in ("beyond", "within", "none"))
        assert classes == pytest.approx(res["bits_by_doc"][d], rel=1e-6)
        assert sum(count[f"copy_{c}"][d] for c in ("beyond", "within", "none")) == res["tokens_by_doc"][d]
    bands = sum(sum(v) for k, v in by.items() if k.startswith("band_"))
    seg0 = res["bpb_by_segment"][0] * res["tokens_by_segment"][0]
    later = sum(b * t for b, t in zip(res["bpb_by_segment"][1:], res["tokens_by_segment"][1:]))
    assert bands == pytest.approx(later, rel=1e-6) and bands + seg0 == pytest.approx(sum(res["bits_by_doc"]), rel=1e-6)
    assert sum(count["copy_beyond"]) > 0 and sum(count["copy_within"]) > 0  # both classes occur here


def test_the_memory_only_reset_keeps_the_window_and_the_full_reset_is_todays_ablation() -> None:
    """With a sliding window the ablation forgets the memory and keeps the window: `local` (no memory)
    then reads exactly as without the ablation, and XL does not. forget_memory keeps the window's
    tensors and gives fresh memory states; at window 0 the ablation resets everything as before."""
    gen = torch.Generator().manual_seed(1)
    docs = [Document(f"d{i}", bytes(torch.randint(97, 123, (n,), generator=gen).tolist())) for i, n in enumerate((41, 30))]
    floor = tiny_model("local", attention_span=6)
    plain = evaluate_model(floor, docs, 2, None, progress=False)
    ablated = evaluate_model(floor, docs, 2, None, progress=False, reset_memory=True)
    assert ablated["bits_by_doc"] == plain["bits_by_doc"]
    xl = tiny_model("xl", attention_span=6)
    assert evaluate_model(xl, docs, 2, None, progress=False, reset_memory=True)["bpb"] != \
        evaluate_model(xl, docs, 2, None, progress=False)["bpb"]
    state = xl(torch.randint(0, 256, (2, 2, 8), generator=gen)).state
    kept = xl.forget_memory(state, 2)
    assert kept.window is state.window and all(bool(w["valid"].any()) for w in kept.window)
    fresh = xl.initial_state(2)
    assert all(torch.equal(a[k], b[k]) for a, b in zip(kept.layers, fresh.layers) for k in a)
    local = tiny_model("local")  # window 0: the whole state resets, so local's ablation changes nothing either
    assert evaluate_model(local, docs, 2, None, progress=False, reset_memory=True)["bits_by_doc"] == \
        evaluate_model(local, docs, 2, None, progress=False)["bits_by_doc"]
