"""BABILong-style samples generated locally: qa1-qa3 stories (one, two and three supporting facts)
from a small world simulation, their facts placed in order between background sentences.

The world (memzoo.data.babi_world): bAbI's four people move between its six places and pick up and
drop its three objects.
Questions are bAbI's: qa1 "Where is Mary?", qa2 "Where is the football?", qa3 "Where was the
football before the kitchen?"; the answer is read off the simulated world, never off the text.

The background is sentences of a corpus (the embedded standard library's docstrings and comments, or
any `data.source`: a file, a folder, `hf:pg19`, its first HUB_DOCUMENTS documents), with every sentence that names a person, place or
object of the world (or says "question"/"answer") dropped, so the facts are the only route to the
answer. The facts sit in story order at sorted random byte depths within `depth` (fractions of the
background); an input of `length` bytes holds them and as many whole background sentences as fit
(length 0: the facts alone, as the released 0k).

Train and test never meet: their seeds are drawn from disjoint streams (the split is part of what is
hashed), their background comes from disjoint documents, and a story (facts and question) belongs to
one split by a hash of its text, so a test story is never generated for training even by chance.
"""
from __future__ import annotations

import hashlib
import json
import random
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Optional

from memzoo.core.config import ConfigError, DataConfig
from memzoo.data.babi_world import DEFAULT_FACTS, OBJECTS, PEOPLE, SPLITS, STORY_TASKS, Story, longest_fact, simulate
from memzoo.data.babilong import PLACES, TASK_LABELS, Sample, length_bytes, write_samples

HUB_DOCUMENTS = 200  # documents read from an hf: background (PG-19 books: tens of MB)
# Every word a background sentence must not contain (whole words, any case).
_FORBIDDEN = re.compile(r"\b(" + "|".join((*PEOPLE, *PLACES, *OBJECTS, *TASK_LABELS["qa5"], "question", "answer"))
                        + r")\b", re.IGNORECASE)


@dataclass
class StorySettings:
    """How stories are generated (beside task, length, split and index)."""

    facts: Optional[tuple[int, int]] = None  # (fewest, most) facts per story; None: DEFAULT_FACTS of the task
    depth: tuple[float, float] = (0.0, 1.0)  # the facts' byte depths within the background, as fractions
    background: str = "stdlib"  # a data.source: stdlib, a file, a folder, a glob, hf:NAME[:CONFIG][:SPLIT]
    seed: int = 0

    def facts_of(self, task: str) -> tuple[int, int]:
        return tuple(self.facts) if self.facts is not None else DEFAULT_FACTS[task]

    def check(self, tasks: list[str], lengths: list[int]) -> None:
        """Raise naming the bad value: unknown tasks, depths outside [0, 1], lengths too short for the facts."""
        for task in tasks:
            if task not in STORY_TASKS:
                raise ConfigError(f"story task {task!r}; the generator writes {', '.join(STORY_TASKS)}")
        if len(self.depth) != 2 or not 0.0 <= self.depth[0] <= self.depth[1] <= 1.0:
            raise ConfigError(f"story depth={list(self.depth)}; expected [lo, hi] with 0 <= lo <= hi <= 1")
        if self.facts is not None and (len(self.facts) != 2 or not 1 <= self.facts[0] <= self.facts[1]):
            raise ConfigError(f"story facts={list(self.facts)}; expected [fewest, most] with 1 <= fewest <= most")
        for task in tasks:
            need = self.facts_of(task)[1] * (longest_fact() + 1)
            short = [n for n in lengths if 0 < n < need]
            if short:
                raise ConfigError(f"story length {short[0]} bytes cannot hold {task}'s up to {self.facts_of(task)[1]} "
                                  f"facts; expected 0 (facts only) or >= {need} bytes, or fewer facts")


def _sentences(text: str) -> list[str]:
    """Background sentences of a text: whitespace collapsed, ASCII, 16-200 bytes, capitalised, ending
    in '.', naming nothing of the world."""
    flat = " ".join(text.split())
    out = []
    for s in re.split(r"(?<=[.!?])\s+", flat):
        if (16 <= len(s) <= 200 and s.isascii() and s[0].isupper() and s.endswith(".")
                and not _FORBIDDEN.search(s)):
            out.append(s)
    return out


_DOCSTRING = re.compile(r'"""(.*?)"""', re.S)
_COMMENT = re.compile(r"^[ \t]*#[ \t]?(.*)$", re.M)


def _prose(name: str, data: bytes, source: str) -> str:
    """The prose of a document: a Python file's docstrings and comments (stdlib), else the text."""
    text = data.decode("utf-8", errors="replace")
    if source == "stdlib" or name.endswith(".py"):
        return "\n".join(_DOCSTRING.findall(text) + [" " + c for c in _COMMENT.findall(text)])
    return text


@lru_cache(maxsize=8)
def background_pool(source: str, split: str) -> tuple[str, ...]:
    """The background sentences of a split: documents split as the corpus splits them; test takes
    the valid and test documents (train the rest), so the two never share a document."""
    from memzoo.data.corpus import load_documents, split_documents

    # a hub corpus (hf:pg19) is streamed: its first documents are plenty of sentences
    cfg = DataConfig(source=source, min_doc_bytes=1, max_docs=HUB_DOCUMENTS if source.startswith("hf:") else None)
    parts = split_documents(load_documents(cfg), cfg)
    docs = parts["train"] if split == "train" else parts["valid"] + parts["test"]
    pool = tuple(s for d in docs for s in _sentences(_prose(d.name, d.data, source)))
    if len(pool) < 2:
        raise ConfigError(f"story background={source!r} has {len(pool)} usable sentences in its {split} documents; "
                          "expected a corpus of English prose (sentences naming the story's people, places or objects "
                          "are left out)")
    return pool


def _fill(pool: tuple[str, ...], budget: int, rng: random.Random) -> list[str]:
    """Consecutive background sentences from a random start, as many as fit `budget` bytes (each
    followed by a space); a sentence that does not fit is passed over."""
    out: list[str] = []
    used, i, misses = 0, rng.randrange(len(pool)), 0
    while budget - used >= 17 and misses < 64:
        s = pool[i % len(pool)]
        i += 1
        if used + len(s) + 1 <= budget:
            out.append(s)
            used += len(s) + 1
            misses = 0
        else:
            misses += 1
    return out


def place_facts(facts: list[str], background: list[str], depth: tuple[float, float],
                rng: random.Random) -> tuple[str, list[int]]:
    """The facts inserted in order between background sentences at sorted random byte depths in
    [lo, hi] of the background; returns (text, each fact's byte offset in it)."""
    ends, total = [], 0
    for s in background:
        total += len(s) + 1
        ends.append(total)
    marks = sorted(rng.uniform(*depth) * total for _ in facts)
    gaps = [sum(1 for e in ends if e <= m) for m in marks]  # background sentences before each fact
    pieces: list[str] = []
    offsets, at, k = [], 0, 0
    for g, fact in zip(gaps, facts):
        while k < g:
            pieces.append(background[k])
            at += len(background[k]) + 1
            k += 1
        offsets.append(at)
        pieces.append(fact)
        at += len(fact) + 1
    pieces.extend(background[k:])
    return " ".join(pieces), offsets


@dataclass
class GeneratedSample:
    sample: Sample  # the released schema
    story: Story
    fact_offsets: list[int]  # byte offset of each fact in sample.input
    background_bytes: int  # bytes of background sentences in sample.input (with their spaces)


def story_seed(*parts: object) -> int:
    """A 64-bit seed from its parts (the split among them: disjoint streams per split)."""
    return int.from_bytes(hashlib.sha256("/".join(map(str, parts)).encode()).digest()[:8], "big")


def generate(task: str, length: int, split: str, index: int, settings: StorySettings) -> GeneratedSample:
    """Sample `index` of (task, length bytes of input, split): deterministic in its arguments."""
    if split not in SPLITS:
        raise ConfigError(f"story split {split!r}; expected train or test")
    rng = random.Random(story_seed(split, settings.seed, task, length, index))
    story = simulate(task, rng, settings.facts_of(task), split)
    facts_bytes = sum(len(f) + 1 for f in story.facts) - 1
    if length == 0:
        text, background = " ".join(story.facts), 0
        offsets = [sum(len(f) + 1 for f in story.facts[:i]) for i in range(len(story.facts))]
    else:
        if facts_bytes > length:
            raise ConfigError(f"story length {length} bytes is shorter than its {facts_bytes} bytes of facts; expected "
                              f"0 (facts only) or >= {facts_bytes}")
        filler = _fill(background_pool(settings.background, split), length - facts_bytes - 1, rng)
        text, offsets = place_facts(story.facts, filler, settings.depth, rng)
        background = sum(len(s) + 1 for s in filler)
    return GeneratedSample(Sample(text, story.question, story.target), story, offsets, background)


def write_generated(out_dir: Path, tasks: list[str], lengths: list[str], samples: int, split: str,
                    settings: StorySettings) -> list[Path]:
    """OUT_DIR/LENGTH/TASK.jsonl in the released schema (the reader's local layout), samples 0..samples-1
    of each (task, length), and OUT_DIR/generator.json with the settings that made them."""
    if samples < 1:
        raise ConfigError(f"--samples {samples}; expected >= 1")
    if split not in SPLITS:
        raise ConfigError(f"--split {split!r}; expected train or test")
    settings.check(tasks, [length_bytes(n) for n in lengths])
    out_dir = Path(out_dir)
    paths = []
    for length in lengths:
        for task in tasks:
            rows = (generate(task, length_bytes(length), split, i, settings).sample for i in range(samples))
            paths.append(write_samples(rows, out_dir / length / f"{task}.jsonl"))
    meta = {"tasks": tasks, "lengths": lengths, "samples": samples, "split": split, "seed": settings.seed,
            "facts": {t: list(settings.facts_of(t)) for t in tasks}, "depth": list(settings.depth),
            "background": settings.background}
    (out_dir / "generator.json").write_text(json.dumps(meta, indent=1))
    return paths
