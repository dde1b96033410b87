"""memzoo.diagnose.filler_before: the training layout of a distance example keeps its pairs, gap and
answers, and only opens it with filler (the protocol check of the distance suite's short gaps)."""
from __future__ import annotations


import pytest

from memzoo.evaluations.distance import distance_batch

import memzoo.diagnose.filler_before as fb

LAYOUT = {"pairs": 4, "queries": 8, "local_queries": 4, "alphabet": 8, "rewrites": 0}


@pytest.mark.parametrize("gap,before", [(1, 7), (3, 5), (8, 0)])
def test_filler_before_keeps_the_example(gap: int, before: int) -> None:
    n = 16
    batch = distance_batch(LAYOUT, gap, 6, n, seed=0)
    for row in range(6):
        e = batch.example(row)
        shifted = fb.with_filler_before(e, before, n)
        assert len(shifted.tokens) == len(e.tokens) + before * n
        assert shifted.tokens[before * n:] == e.tokens  # the same bytes after the prefix
        assert max(shifted.tokens[: before * n], default=0) < 128  # the prefix is filler: no key or value byte
        assert shifted.gap == e.gap == gap and shifted.answers == e.answers
        assert [shifted.tokens[p] for p in shifted.scored_positions] == [e.tokens[p] for p in e.scored_positions]  # the same keys asked
        assert shifted.query_segment * n <= shifted.scored_positions[0] < (shifted.query_segment + 1) * n
        assert bytes(shifted.tokens[shifted.pairs_segment * n : (shifted.pairs_segment + 1) * n]) == \
            bytes(e.tokens[e.pairs_segment * n : (e.pairs_segment + 1) * n])
