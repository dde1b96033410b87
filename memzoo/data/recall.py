"""Multi-query associative recall (zoology's MQAR), byte-level: P distinct (key, value) byte pairs, a
gap of filler, then Q of the keys again, each followed by its value. Keys and values are bytes >= 128,
so they never occur in the filler. Scored by teacher-forced accuracy at the answer positions (as zoology
does). Across segments (the capacity and distance suites) see memzoo.data.tasks' docstring."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
import torch
from torch import Tensor
from memzoo.data.passkey import FILLER



@dataclass
class RecallExample:
    tokens: bytes  # the whole sequence: pairs, gap, queries with their answers
    answer_positions: list[int]  # positions whose *next* byte is an answer (the query positions)
    answers: bytes  # the answers, in order


KEY_BASE, VALUE_BASE, ALPHABET = 128, 192, 64


def recall_example(gen: torch.Generator, length: int, pairs: int, queries: int) -> RecallExample:
    """P distinct keys with random values, filler up to `length`, then Q distinct keys asked again."""
    if not 1 <= pairs <= ALPHABET:
        raise ValueError(f"recall pairs={pairs}; expected 1..{ALPHABET} (one byte per key)")
    if not 1 <= queries <= pairs:
        raise ValueError(f"recall queries={queries}; expected 1..pairs={pairs}")
    gap = length - 2 * pairs - 2 * queries
    if gap < 0:
        raise ValueError(f"recall length={length} is shorter than {2 * (pairs + queries)} bytes of pairs and queries")
    keys = torch.randperm(ALPHABET, generator=gen)[:pairs] + KEY_BASE
    values = torch.randint(0, ALPHABET, (pairs,), generator=gen) + VALUE_BASE
    asked = torch.randperm(pairs, generator=gen)[:queries]
    filler = (FILLER * math.ceil(gap / len(FILLER) + 1)).encode()[:gap]
    head = bytes(torch.stack((keys, values), 1).flatten().tolist()) + filler
    tail = bytes(torch.stack((keys[asked], values[asked]), 1).flatten().tolist())
    positions = [len(head) + 2 * i for i in range(queries)]
    return RecallExample(head + tail, positions, bytes(values[asked].tolist()))


@dataclass
class SegmentRecallExample:
    """One example of recall across segments; positions index the flat byte sequence."""

    tokens: bytes  # (rewrites + gap_segments + 1) x segment_len bytes
    answer_positions: list[int]  # every position whose next byte is an answer (the loss in training)
    scored_positions: list[int]  # the cross-segment queries: first time their key is asked in the query segment
    values: bytes  # every value written (the pairs', then each rewrite's): recall_chance guesses among them
    query_segment: int  # index of the segment that holds the queries (the last)
    pairs_segment: int = 0  # index of the segment that holds the pairs (query_segment - rewrites - gap)
    rewrites: int = 0  # segments after the pairs' that rewrite every key
    stale: list[bytes] = field(default_factory=list)  # per scored position, its key's earlier values (rewrites)

    @property
    def answers(self) -> bytes:
        """The expected byte after each scored position (the latest value of its key)."""
        return bytes(self.tokens[p + 1] for p in self.scored_positions)

    @property
    def gap(self) -> int:
        """Segments from the last write of the answers (the pairs', or the last rewrite's) to the queries'."""
        return self.query_segment - self.pairs_segment - self.rewrites


def filler_bytes(length: int) -> bytes:
    return (FILLER * math.ceil(length / len(FILLER) + 1)).encode()[:length]


@dataclass
class SegmentRecallBatch:
    """A batch of recall-across-segments examples as tensors (the training path; no Python loop per row)."""

    tokens: Tensor  # [B, (rewrites + gap_segments + 1) * segment_len] byte ids
    answer: Tensor  # [B, L] bool: positions whose next byte is an answer (the loss in training)
    scored: Tensor  # [B, L] bool: the cross-segment queries, first time their key is asked in the query segment
    values: Tensor  # [B, (R + 1) P] every value written, the pairs' first (in pair order), then each rewrite's
    query_segment: int
    keys: Tensor  # [B, P] the keys, in pair order
    history: Tensor  # [B, P, R + 1] each key's values in the order written (the last is the answer)
    pairs_segment: Tensor  # [B] the segment holding each row's pairs

    @property
    def rewrites(self) -> int:
        return self.history.shape[2] - 1

    def example(self, row: int) -> SegmentRecallExample:
        """Row `row` as a SegmentRecallExample (evaluation works per example)."""
        tokens = bytes(self.tokens[row].tolist())
        scored = self.scored[row].nonzero()[:, 0].tolist()
        slot = {k: j for j, k in enumerate(self.keys[row].tolist())}  # key -> pair index
        stale = [bytes(self.history[row, slot[tokens[p]], :-1].tolist()) for p in scored] if self.rewrites else []
        return SegmentRecallExample(tokens, self.answer[row].nonzero()[:, 0].tolist(), scored,
                                    bytes(self.values[row].tolist()), self.query_segment,
                                    int(self.pairs_segment[row]), self.rewrites, stale)


def segment_recall_batch(gen: torch.Generator, batch_size: int, segment_len: int, pairs: int, queries: int,
                         gap_segments: int, local_queries: int = 0, alphabet: int = ALPHABET,
                         min_gap_segments: int = 0, rewrites: int = 0) -> SegmentRecallBatch:
    """B examples: P distinct keys with random values at the start of the pairs' segment (then
    `local_queries` of them asked again there, for training), `rewrites` segments that each give every
    key a new value (and ask `local_queries` of them again), filler, and Q queries drawn with
    replacement at the start of the last segment, `gap` segments after the last write. The gap is
    `gap_segments`, or with `min_gap_segments` >= 1 drawn per row in [min_gap_segments, gap_segments],
    the rows with shorter gaps opening with filler segments. Keys and values come from the first
    `alphabet` bytes of their ranges. Without the two options the draws are those of the fixed layout."""
    check_segment_recall(segment_len, pairs, queries, gap_segments, local_queries, alphabet, min_gap_segments, rewrites)
    b, n = batch_size, segment_len
    keys = torch.rand(b, alphabet, generator=gen).argsort(1)[:, :pairs] + KEY_BASE  # [B, P] distinct per row
    values = torch.randint(0, alphabet, (b, pairs), generator=gen) + VALUE_BASE  # [B, P]
    local = torch.randint(0, pairs, (b, local_queries), generator=gen)  # [B, Q_local] with replacement
    asked = torch.randint(0, pairs, (b, queries), generator=gen)  # [B, Q] with replacement
    # The options draw after the fixed layout's draws, so without them every example is as before.
    gap = (torch.randint(min_gap_segments, gap_segments + 1, (b,), generator=gen) if min_gap_segments
           else torch.full((b,), gap_segments))  # [B]
    history = values[:, :, None]  # [B, P, R + 1]
    order = torch.arange(pairs).expand(b, 1 + rewrites, pairs)  # [B, R + 1, P]: pair order in each write segment
    locals_ = local[:, None]  # [B, R + 1, Q_local]
    if rewrites:
        perm = torch.rand(b, pairs, alphabet, generator=gen).argsort(-1) + VALUE_BASE  # [B, P, A]
        # each key's fresh values: a permutation of the alphabet without its first value, so all R + 1 differ
        fresh = perm.gather(-1, (perm == values[..., None]).long().argsort(dim=-1, stable=True))[..., :rewrites]  # [B, P, R]
        history = torch.cat((history, fresh), 2)
        order = torch.cat((order[:, :1], torch.rand(b, rewrites, pairs, generator=gen).argsort(-1)), 1)
        locals_ = torch.cat((locals_, torch.randint(0, pairs, (b, rewrites, local_queries), generator=gen)), 1)

    def interleave(idx: Tensor, r: int) -> Tensor:  # [B, m] pair indices -> [B, 2m] key, value (write r), ...
        return torch.stack((keys.gather(1, idx), history[:, :, r].gather(1, idx)), 2).flatten(1)

    segments = rewrites + gap_segments + 1
    length = segments * n
    tokens = torch.frombuffer(bytearray(filler_bytes(length)), dtype=torch.uint8).long().expand(b, length).clone()  # [B, L]
    answer = torch.zeros(b, length, dtype=torch.bool)
    pairs_segment = gap_segments - gap  # [B]: the queries fill the last segment whatever the row's gap
    rows = torch.arange(b)[:, None]
    local_offsets = torch.arange(local_queries) * 2 + 2 * pairs  # [Q_local]: within a write segment
    for r in range(rewrites + 1):  # the pairs' segment, then each rewrite's
        head = torch.cat((interleave(order[:, r], r), interleave(locals_[:, r], r)), 1)  # [B, 2P + 2 Q_local]
        start = (pairs_segment + r) * n  # [B]
        tokens[rows, start[:, None] + torch.arange(head.shape[1])] = head
        answer[rows, start[:, None] + local_offsets] = True
    start = (segments - 1) * n
    latest = torch.stack((keys.gather(1, asked), history[:, :, -1].gather(1, asked)), 2).flatten(1)  # [B, 2Q]
    tokens[:, start : start + 2 * queries] = latest
    query_pos = torch.arange(queries) * 2 + start  # [Q]
    answer[:, query_pos] = True
    seen_before = (asked[:, :, None] == asked[:, None, :]).tril(-1).any(2)  # [B, Q]: asked earlier in the segment
    scored = torch.zeros(b, length, dtype=torch.bool)
    scored[:, query_pos] = ~seen_before
    written = history.transpose(1, 2).flatten(1)  # [B, (R + 1) P]: the pairs' values first, as before
    return SegmentRecallBatch(tokens, answer, scored, written, segments - 1, keys, history, pairs_segment)


def segment_recall_example(gen: torch.Generator, segment_len: int, pairs: int, queries: int, gap_segments: int,
                           local_queries: int = 0, alphabet: int = ALPHABET, min_gap_segments: int = 0,
                           rewrites: int = 0) -> SegmentRecallExample:
    """One example of `segment_recall_batch` (the same layout and distribution)."""
    return segment_recall_batch(gen, 1, segment_len, pairs, queries, gap_segments, local_queries, alphabet,
                                min_gap_segments, rewrites).example(0)


def check_segment_recall(segment_len: int, pairs: int, queries: int, gap_segments: int, local_queries: int,
                         alphabet: int = ALPHABET, min_gap_segments: int = 0, rewrites: int = 0) -> None:
    """Raise naming the bad value: the pairs (and local queries) and the queries must fit a segment."""
    if not 1 <= alphabet <= ALPHABET:
        raise ValueError(f"recall alphabet={alphabet}; expected 1..{ALPHABET} (key and value bytes to draw from)")
    if not 1 <= pairs <= alphabet:
        raise ValueError(f"recall pairs={pairs}; expected 1..alphabet={alphabet} (one byte per key)")
    if queries < 1:
        raise ValueError(f"recall queries={queries}; expected >= 1 (drawn with replacement across segments)")
    if gap_segments < 1:
        raise ValueError(f"recall gap_segments={gap_segments}; expected >= 1 (1 = the queries in the next segment)")
    if not 0 <= min_gap_segments <= gap_segments:
        raise ValueError(f"recall min_gap_segments={min_gap_segments}; expected 0 (every row at gap_segments) or "
                         f"1..gap_segments={gap_segments} (each row's gap drawn in [min_gap_segments, gap_segments])")
    if not 0 <= rewrites < alphabet:
        raise ValueError(f"recall rewrites={rewrites}; expected 0..alphabet-1={alphabet - 1} (each key's values "
                         f"must all differ)")
    if local_queries < 0:
        raise ValueError(f"recall local_queries={local_queries}; expected >= 0")
    if 2 * (pairs + local_queries) > segment_len:
        raise ValueError(f"recall pairs={pairs} and local_queries={local_queries} take {2 * (pairs + local_queries)} "
                         f"bytes; expected them to fit one segment of segment_len={segment_len}")
    if 2 * queries > segment_len:
        raise ValueError(f"recall queries={queries} take {2 * queries} bytes; expected them to fit one segment of "
                         f"segment_len={segment_len}")


def recall_chance(example: SegmentRecallExample) -> list[float]:
    """Per scored query, the accuracy of guessing uniformly among the stored values (the best
    strategy that knows the values but not their keys): the share of written values equal to its
    answer (of the pairs, without rewrites)."""
    values = list(example.values)
    return [values.count(a) / len(values) for a in example.answers]


def stale_chance(example: SegmentRecallExample) -> list[float]:
    """Per scored query, how often the same uniform guess among the written values lands on an
    earlier value of its key (recall_stale's chance level; empty without rewrites)."""
    values = list(example.values)
    return [sum(v in set(old) for v in values) / len(values) for old in example.stale]
