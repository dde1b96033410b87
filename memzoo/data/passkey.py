"""Passkey retrieval in the Infini paper's format (appendix B), byte-level: a preamble, the filler
repeated x times, the key sentence, the filler repeated y times, the question. x / (x + y) is the key's
depth: 0 puts the key right after the preamble, 1 right before the question. The answer is " NNNNN."
and is scored by exact match of the generated digits (memzoo.data.tasks samples it for training)."""
from __future__ import annotations

import re
from dataclasses import dataclass
import torch



PREAMBLE = (
    "There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. "
    "I will quiz you about the important information there."
)


FILLER = " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."


KEY_SENTENCE = " The pass key is {key}. Remember it. {key} is the pass key."


QUESTION = " What is the pass key? The pass key is"


ANSWER = " {key}."


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
