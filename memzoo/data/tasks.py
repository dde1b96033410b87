"""Synthetic long-range tasks, byte-level: passkey retrieval in the Infini paper's format and
multi-query associative recall (zoology's MQAR), plus the sampler that turns either into training
batches for fine-tuning.

Passkey (Infini-attention appendix B): a preamble, the filler repeated x times, the key sentence,
the filler repeated y times, the question. x / (x + y) is the key's depth: 0 puts the key right
after the preamble, 1 right before the question. The answer is " NNNNN." and is scored by exact
match of the generated digits.

Associative recall: P distinct (key, value) byte pairs, a gap of filler, then Q of the keys again,
each followed by its value. Keys and values are bytes >= 128, so they never occur in the filler.
Scored by teacher-forced accuracy at the answer positions (as zoology does).

Associative recall across segments (the capacity suite, `task.gap_segments` >= 1): the pairs fill
the start of segment 0 and the queries the start of segment g, so every scored answer has to come
through the memory state. Queries are drawn with replacement, so a model that knows which values
are stored but not which key holds which gains nothing over guessing among them; a key asked a
second time is answerable from the segment itself and is trained on but not scored.

Two options of that layout (the `distance` suite). `min_gap_segments`: each row draws its gap
uniformly in [min_gap_segments, gap_segments] (ARMT's vary_n_segments); every row keeps the window of
the largest gap and its queries in the last segment, so a row with a shorter gap opens with segments
of filler before its pairs. `rewrites`: R segments after the pairs' segment each give every key a new
value (in a new order, each value unlike the key's earlier ones); the answer is the latest value and
the gap is counted from the last rewrite, so every scored answer was written exactly gap segments
before its query and every stale value 1 to R segments earlier still.

BABILong stories (`babilong`, memzoo.data.babi_stories): a generated qa1-qa3 story of `length` bytes
of input, the question, and the answer " kitchen." (memzoo.data.babilong's templates); the story's
task is drawn per example from task.babilong.tasks, and its seed from the step's stream, in the
generator's train split.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
import torch
from torch import Tensor

from memzoo.core.config import ConfigError
from memzoo.data.babi_stories import StorySettings, generate
from memzoo.data.corpus import Batch

PREAMBLE = (
    "There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. "
    "I will quiz you about the important information there."
)
FILLER = " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
KEY_SENTENCE = " The pass key is {key}. Remember it. {key} is the pass key."
QUESTION = " What is the pass key? The pass key is"
ANSWER = " {key}."

TASKS = ("lm", "passkey", "recall", "babilong")


@dataclass
class PasskeyPrompt:
    prompt: bytes  # everything up to and including "The pass key is"
    key: str  # the digits
    key_start: int  # byte offset of the key sentence in the prompt
    fillers_before: int  # x
    fillers_after: int  # y

    @property
    def answer(self) -> bytes:
        return ANSWER.format(key=self.key).encode()


def passkey_fixed_bytes(key_digits: int) -> int:
    """Bytes of a passkey prompt that are not filler."""
    return len(PREAMBLE) + len(KEY_SENTENCE.format(key="0" * key_digits)) + len(QUESTION)


def passkey_prompt(length: int, depth: float, key: str) -> PasskeyPrompt:
    """The paper's prompt with as many whole fillers as fit in `length` bytes, the key at `depth`.

    The prompt is at most `length` bytes (shorter by less than one filler, 89 bytes).
    """
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"passkey depth={depth}; expected a fraction in [0, 1] (0 = start, 1 = end)")
    if not key.isdigit():
        raise ValueError(f"passkey key={key!r}; expected digits")
    fixed = passkey_fixed_bytes(len(key))
    if length < fixed:
        raise ValueError(f"passkey length={length} is shorter than the prompt without filler ({fixed} bytes)")
    fillers = (length - fixed) // len(FILLER)
    return _passkey_split(fillers, round(depth * fillers), key)


def _passkey_split(fillers: int, before: int, key: str) -> PasskeyPrompt:
    """The prompt with `before` of its `fillers` fillers ahead of the key sentence."""
    head = PREAMBLE + FILLER * before
    text = head + KEY_SENTENCE.format(key=key) + FILLER * (fillers - before) + QUESTION
    return PasskeyPrompt(text.encode(), key, len(head), before, fillers - before)


def key_last_byte(key_digits: int) -> int:
    """Offset, within the key sentence, of the key's last digit nearest the question (its second mention)."""
    sentence = KEY_SENTENCE.format(key="0" * key_digits)
    return sentence.rindex("0" * key_digits) + key_digits - 1


def key_segment(prompt: PasskeyPrompt, segment_len: int) -> int:
    """The segment (counted from the prompt's first byte) holding the key's last digit."""
    return (prompt.key_start + key_last_byte(len(prompt.key))) // segment_len


def key_segments_back(prompt: PasskeyPrompt, segment_len: int) -> int:
    """How many segments before the question's segment (that of the prompt's last byte) the key's
    last digit lies, segments counted from the prompt's first byte: 0 = the same segment (local
    attention sees it), k >= 1 = only a memory carried across k segment boundaries can."""
    return (len(prompt.prompt) - 1) // segment_len - key_segment(prompt, segment_len)


def _splits_back(length: int, segments_back: int, key_digits: int, segment_len: int) -> list[int]:
    """The filler counts before the key that put it `segments_back` segments before the question."""
    fixed = passkey_fixed_bytes(key_digits)
    fillers = (length - fixed) // len(FILLER)
    prompt_len = fixed + fillers * len(FILLER)
    question = (prompt_len - 1) // segment_len
    last = len(PREAMBLE) + key_last_byte(key_digits)
    return [x for x in range(fillers + 1) if question - (last + x * len(FILLER)) // segment_len == segments_back]


def passkey_prompt_back(length: int, segments_back: int, key: str, segment_len: int,
                        gen: torch.Generator) -> PasskeyPrompt:
    """The paper's prompt (as many whole fillers as fit in `length` bytes) with the key's last digit
    exactly `segments_back` segments before the question's segment; among the filler splits that
    do that, one drawn from `gen`."""
    if not key.isdigit():
        raise ValueError(f"passkey key={key!r}; expected digits")
    if length < passkey_fixed_bytes(len(key)):
        raise ValueError(f"passkey length={length} is shorter than the prompt without filler "
                         f"({passkey_fixed_bytes(len(key))} bytes)")
    splits = _splits_back(length, segments_back, len(key), segment_len)
    if not splits:
        raise ValueError(f"passkey key_segments_back={segments_back}: no prompt of length={length} with "
                         f"segment_len={segment_len} puts the key that many segments before the question; "
                         f"expected one of {_feasible_back(length, len(key), segment_len)}")
    fillers = (length - passkey_fixed_bytes(len(key))) // len(FILLER)
    return _passkey_split(fillers, splits[int(torch.randint(len(splits), (1,), generator=gen))], key)


def _feasible_back(length: int, key_digits: int, segment_len: int) -> list[int]:
    """Every key_segments_back a prompt of `length` bytes can have."""
    return [k for k in range(length // segment_len + 1) if _splits_back(length, k, key_digits, segment_len)]


def random_key(gen: torch.Generator, digits: int) -> str:
    """A key of exactly `digits` digits (no leading zero)."""
    low = 10 ** (digits - 1)
    return str(int(torch.randint(low, 10 * low, (1,), generator=gen)))


def score_passkey(generated: bytes, key: str) -> bool:
    """Exact match: the first run of digits the model wrote (after optional spaces) equals the key."""
    match = re.match(rb"\s*(\d+)", generated)
    return bool(match) and match.group(1).decode() == key


def passkey_digit_scores(generated: bytes, key: str) -> tuple[float, float]:
    """Partial credit for an answer (after optional spaces), as fractions of the key's length:
    (digits written in their place, digits written that occur anywhere in the key). A memory that
    retrieves the key's digits but not their order scores high on the second and near chance
    (0.1) on the first; a constant guess scores low on both."""
    written = generated.lstrip()[: len(key)].decode("latin-1")
    in_place = sum(a == b for a, b in zip(written, key))
    from_key = sum(c.isdigit() and c in key for c in written)
    return in_place / len(key), from_key / len(key)


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


def check_task(task, segment_len: int | None = None) -> None:
    """Raise naming the bad key (task is a TaskConfig or its DictConfig)."""
    if task.name not in TASKS:
        raise ValueError(f"task.name={task.name!r}; expected one of {', '.join(TASKS)}")
    if task.loss not in ("answer", "all"):
        raise ValueError(f"task.loss={task.loss!r}; expected answer or all")
    shortest = 0 if task.name == "babilong" else 1  # babilong: 0 = the facts alone
    if task.name != "lm" and (not task.lengths or min(task.lengths) < shortest):
        raise ValueError(f"task.lengths={list(task.lengths or [])}; expected a non-empty list of "
                         f"{'byte counts >= 0' if shortest == 0 else 'positive lengths'}")
    if not 1 <= task.key_digits <= 18:
        raise ValueError(f"task.key_digits={task.key_digits}; expected 1..18")
    if task.init_backbone_only and not task.init_from:
        raise ValueError("task.init_backbone_only=True needs task.init_from (the run whose backbone to start from)")
    if not 0.0 <= task.lm_fraction <= 1.0:
        raise ValueError(f"task.lm_fraction={task.lm_fraction}; expected a fraction in [0, 1] (0 = task loss only)")
    if task.lm_fraction and task.name == "lm":
        raise ValueError(f"task.lm_fraction={task.lm_fraction} mixes the corpus into a task's loss; task.name is 'lm'")
    back = list(task.key_segments_back)
    if back and task.name != "passkey":
        raise ValueError(f"task.key_segments_back={back} is for task.name=passkey; got {task.name!r}")
    if any(k < 0 for k in back):
        raise ValueError(f"task.key_segments_back={back}; expected segment counts >= 0")
    if task.name == "passkey":
        passkey_prompt(min(task.lengths), 0.0, "1" * task.key_digits)  # raises if too short
        for length in task.lengths if segment_len is not None else []:
            for k in back:  # raises naming the impossible (length, k)
                passkey_prompt_back(length, k, "1" * task.key_digits, segment_len, torch.Generator().manual_seed(0))
    if task.name == "babilong":
        try:
            story_settings(task).check(list(task.babilong.tasks), list(task.lengths))
        except ConfigError as err:
            raise ValueError(f"task.babilong: {err}") from None
    if task.name == "recall" and task.gap_segments:
        if segment_len is not None:
            check_segment_recall(segment_len, task.pairs, task.queries, task.gap_segments, task.local_queries,
                                 task.alphabet, task.min_gap_segments, task.rewrites)
    elif task.min_gap_segments or task.rewrites:
        raise ValueError(f"task.min_gap_segments={task.min_gap_segments}, task.rewrites={task.rewrites} are for "
                         f"recall across segments; expected task.name=recall with task.gap_segments >= 1, got "
                         f"task.name={task.name!r}, gap_segments={task.gap_segments}")
    elif task.name == "recall":
        if task.local_queries:
            raise ValueError(f"task.local_queries={task.local_queries} needs task.gap_segments >= 1 (recall across segments)")
        recall_example(torch.Generator().manual_seed(0), min(task.lengths), task.pairs, task.queries)
    elif task.gap_segments:
        raise ValueError(f"task.gap_segments={task.gap_segments} is for task.name=recall; got {task.name!r}")


def story_settings(task, seed: int = 0) -> StorySettings:
    """The generator's settings from a task config's `babilong` section."""
    b = task.babilong
    return StorySettings(tuple(b.facts) if b.facts is not None else None, tuple(b.depth), str(b.background), seed)


class TaskSampler:
    """Fine-tuning batches of a synthetic task, deterministic in (seed, step) like WindowSampler.

    One length per step (all rows equal); each row has its own key and depth (passkey, depth
    uniform in [0, 1]) or pairs (recall). The sequence is cut into segments of N bytes, the last
    padded and masked; `loss: answer` masks every target except the answer bytes.
    """

    def __init__(self, task, segment_len: int, seed: int):
        check_task(task, segment_len)
        self.task, self.n, self.seed = task, segment_len, seed
        # recall across segments reads its config once: OmegaConf access costs more than the batch itself
        self._story = story_settings(task, seed) if task.name == "babilong" else None
        self._recall_args = ((task.pairs, task.queries, task.gap_segments, task.local_queries, task.alphabet, task.loss,
                              task.min_gap_segments, task.rewrites)
                             if task.name == "recall" and task.gap_segments else None)

    def example(self, gen: torch.Generator, length: int) -> tuple[bytes, list[int]]:
        """(sequence bytes, positions whose next byte is an answer byte)."""
        if self._story is not None:
            stories = list(self.task.babilong.tasks)
            qa = stories[int(torch.randint(len(stories), (1,), generator=gen))]
            index = int(torch.randint(2**62, (1,), generator=gen))  # the story's seed within the train split
            sample = generate(qa, length, "train", index, self._story).sample
            prompt = sample.prompt()
            seq = prompt + sample.answer()
            return seq, list(range(len(prompt) - 1, len(seq) - 1))
        if self.task.name == "passkey":
            if self.task.key_segments_back:
                back = list(self.task.key_segments_back)
                k = back[int(torch.randint(len(back), (1,), generator=gen))]
                p = passkey_prompt_back(length, k, random_key(gen, self.task.key_digits), self.n, gen)
            else:
                depth = float(torch.rand((), generator=gen))
                p = passkey_prompt(length, depth, random_key(gen, self.task.key_digits))
            seq = p.prompt + p.answer
            return seq, list(range(len(p.prompt) - 1, len(seq) - 1))
        ex = recall_example(gen, length, self.task.pairs, self.task.queries)
        return ex.tokens, ex.answer_positions

    def sample(self, step: int, batch_size: int) -> Batch:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        if self._recall_args is not None:  # recall across segments: built as one batch of tensors
            return self._segment_recall(gen, batch_size)
        lengths = list(self.task.lengths)
        length = lengths[int(torch.randint(len(lengths), (1,), generator=gen))]
        examples = [self.example(gen, length) for _ in range(batch_size)]
        longest = max(len(seq) for seq, _ in examples)
        s = -(-(longest - 1) // self.n)
        tokens = torch.zeros(batch_size, s * self.n + 1, dtype=torch.long)
        mask = torch.zeros(batch_size, s * self.n, dtype=torch.bool)
        answer = torch.zeros(batch_size, s * self.n, dtype=torch.bool)
        for b, (seq, answer_pos) in enumerate(examples):
            tokens[b, : len(seq)] = torch.frombuffer(bytearray(seq), dtype=torch.uint8).long()
            answer[b, answer_pos] = True
            if self.task.loss == "all":
                mask[b, : len(seq) - 1] = True
        if self.task.loss != "all":
            mask = answer.clone()
        reset = torch.zeros(batch_size, s, dtype=torch.bool)
        reset[:, 0] = True
        return Batch(
            tokens[:, :-1].reshape(batch_size, s, self.n), tokens[:, 1:].reshape(batch_size, s, self.n),
            mask.view(batch_size, s, self.n), reset, torch.arange(s).expand(batch_size, s).clone(),
            answer.view(batch_size, s, self.n),
        )

    def _segment_recall(self, gen: torch.Generator, batch_size: int) -> Batch:
        """Recall across segments, generated as one batch of tensors (the capacity suite's hot path)."""
        pairs, queries, gap, local, alphabet, loss, min_gap, rewrites = self._recall_args
        ex = segment_recall_batch(gen, batch_size, self.n, pairs, queries, gap, local, alphabet, min_gap, rewrites)
        s = rewrites + gap + 1  # the queries fill the last segment of every row
        tokens = torch.cat((ex.tokens, ex.tokens.new_zeros(batch_size, 1)), 1)  # [B, s N + 1]: padded last target
        mask = ex.answer.clone()  # [B, s N]
        if loss == "all":
            mask = torch.ones_like(mask)
            mask[:, -1] = False  # the last position's target is padding
        reset = torch.zeros(batch_size, s, dtype=torch.bool)
        reset[:, 0] = True
        return Batch(
            tokens[:, :-1].reshape(batch_size, s, self.n), tokens[:, 1:].reshape(batch_size, s, self.n),
            mask.view(batch_size, s, self.n), reset, torch.arange(s).expand(batch_size, s).clone(),
            ex.answer.view(batch_size, s, self.n),
        )


def bytes_to_tensor(data: bytes, dtype: torch.dtype = torch.long) -> Tensor:
    """Bytes as token ids [len(data)] (uint8 keeps long prompts at one byte per token)."""
    out = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.zeros(0, dtype=torch.uint8)
    return out if dtype == torch.uint8 else out.to(dtype)
