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

import torch
from torch import Tensor

from memzoo.core.config import ConfigError
from memzoo.data.babi_stories import StorySettings, generate
from memzoo.data.corpus import Batch
from memzoo.data.passkey import passkey_prompt, passkey_prompt_back, random_key
from memzoo.data.recall import check_segment_recall, recall_example, segment_recall_batch

TASKS = ("lm", "passkey", "recall", "babilong")


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
