"""Generation with memory, for every registered method and variant: decoding token by token
(re-running the partial segment from the committed state, folding it into memory when it fills)
gives the same logits and tokens as one call over the whole text."""
from __future__ import annotations

import pytest
import torch

from conftest import CASES, tiny_model
from memzoo.evaluations.generate import StreamingDecoder

B, V = 2, 256


def one_shot_logits(model, tokens: torch.Tensor) -> torch.Tensor:
    """Logits [B, T, V] of tokens [B, T] from one call (padded to whole segments; causality makes
    the padding irrelevant to the positions kept)."""
    n = model.cfg.segment_len
    t = tokens.shape[1]
    s = -(-t // n)
    padded = torch.zeros(tokens.shape[0], s * n, dtype=torch.long)
    padded[:, :t] = tokens
    with torch.no_grad():
        return model(padded.view(-1, s, n)).logits.flatten(1, 2)[:, :t]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_generation_equals_one_shot_greedy(case: tuple) -> None:
    _, method, options = case
    model = tiny_model(method, options=options)
    n = model.cfg.segment_len  # 8
    prefix = torch.randint(0, V, (B, 2 * n + 5), generator=torch.Generator().manual_seed(4))
    decoder = StreamingDecoder(model, B, segments_per_call=2)
    decoder.feed(prefix)
    new = decoder.generate(2 * n)  # crosses two segment boundaries: the partial segment is folded in twice
    text = torch.cat((prefix, new), dim=1)
    reference = one_shot_logits(model, text)  # [B, T, V]
    p = prefix.shape[1]
    assert torch.equal(new, reference[:, p - 1 : -1].argmax(-1)), "generated tokens differ from one-shot greedy decoding"
    assert torch.allclose(decoder.last_logits, reference[:, -1], atol=1e-4)
    # Not vacuous: inside the partial segment the memory matters, so a decoder that stopped reading
    # it there (fresh state for the unfinished segment) would have given other logits.
    if model.spec.cls.has_memory:
        partial = text[:, (text.shape[1] // n) * n :]
        with torch.no_grad():
            forgetful = model(partial[:, None]).logits[:, 0, -1]
        assert (forgetful - reference[:, -1]).abs().max() > 1e-4


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_feed_in_any_chunks_equals_one_shot(case: tuple) -> None:
    """Feeding 5, then 1, then 13, then 3 tokens returns the same logits as one call."""
    _, method, options = case
    model = tiny_model(method, options=options)
    tokens = torch.randint(0, V, (B, 22), generator=torch.Generator().manual_seed(9))
    decoder = StreamingDecoder(model, B, segments_per_call=1)
    parts, start = [], 0
    for size in (5, 1, 13, 3):
        parts.append(decoder.feed(tokens[:, start : start + size], return_logits=True))
        start += size
    assert torch.allclose(torch.cat(parts, dim=1), one_shot_logits(model, tokens), atol=1e-4)
    assert decoder.tokens_seen == 22 and decoder.pending.shape[1] == 22 % model.cfg.segment_len


def test_decoder_rejects_bad_input() -> None:
    model = tiny_model("local")
    decoder = StreamingDecoder(model, 2)
    with pytest.raises(ValueError, match="feed a prompt"):
        decoder.generate(3)
    with pytest.raises(ValueError, match=r"\[B=2, T\]"):
        decoder.feed(torch.zeros(3, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="segments_per_call=0"):
        StreamingDecoder(model, 2, segments_per_call=0)
