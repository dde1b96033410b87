"""The synthetic long-range tasks: the passkey prompt in the paper's exact format, its scoring,
associative recall, and the fine-tuning batches (loss only where the answer is)."""
from __future__ import annotations

import pytest
import torch

from memzoo.core.config import ConfigError, TaskConfig
from memzoo.data.passkey import FILLER, PREAMBLE, QUESTION, passkey_digit_scores, passkey_fixed_bytes, passkey_prompt, score_passkey
from memzoo.data.recall import KEY_BASE, VALUE_BASE, recall_example
from memzoo.data.tasks import TaskSampler
from memzoo.runs.configure import load_config


def test_passkey_prompt_is_the_papers_text() -> None:
    p = passkey_prompt(2000, 0.5, "90541")
    text = p.prompt.decode()
    assert text.startswith(
        "There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. "
        "I will quiz you about the important information there. The grass is green. The sky is blue. "
        "The sun is yellow. Here we go. There and back again."
    )
    assert text.count(" The pass key is 90541. Remember it. 90541 is the pass key.") == 1
    assert text.endswith("There and back again. What is the pass key? The pass key is")
    assert text.count(FILLER) == p.fillers_before + p.fillers_after
    assert 2000 - len(FILLER) < len(p.prompt) <= 2000
    assert p.answer == b" 90541."


@pytest.mark.parametrize("depth", [0.0, 0.25, 0.5, 1.0])
def test_passkey_depth_places_the_key(depth: float) -> None:
    p = passkey_prompt(10_000, depth, "12345")
    fillers = p.fillers_before + p.fillers_after
    assert p.fillers_before == round(depth * fillers)
    text = p.prompt.decode()
    assert text.index("The pass key is 12345") == p.key_start + 1
    if depth == 0.0:
        assert p.key_start == len(PREAMBLE)  # right after the preamble
    if depth == 1.0:
        assert text.endswith("12345 is the pass key." + QUESTION)  # right before the question
    assert abs(p.key_start / len(p.prompt) - depth) < 0.03


def test_passkey_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="depth=1.5"):
        passkey_prompt(4096, 1.5, "12345")
    with pytest.raises(ValueError, match=f"length=100 .*{passkey_fixed_bytes(5)}"):
        passkey_prompt(100, 0.0, "12345")


@pytest.mark.parametrize("generated,ok", [
    (b" 12345.", True), (b"12345", True), (b"  12345 is", True), (b" 1234.", False), (b" 123456", False),
    (b"x12345", False), (b" 12346", False), (b"", False),
])
def test_passkey_scoring_is_exact_match(generated: bytes, ok: bool) -> None:
    assert score_passkey(generated, "12345") is ok


@pytest.mark.parametrize("generated,in_place,from_key", [
    (b" 65172.", 1.0, 1.0),  # exact
    (b" 16276.", 0.2, 1.0),  # the key's digits, out of order (only the 7 in place)
    (b" 90000.", 0.0, 0.0),  # a constant guess with no digit of the key
    (b" 6517", 0.8, 0.8),  # stopped early: the missing digit counts against both
    (b" ee431.", 0.0, 0.2),  # letters are never "from the key"; 1 is
    (b"", 0.0, 0.0),
])
def test_passkey_digit_scores_separate_content_from_order(generated: bytes, in_place: float, from_key: float) -> None:
    assert passkey_digit_scores(generated, "65172") == (pytest.approx(in_place), pytest.approx(from_key))


def test_recall_example_pairs_then_queries() -> None:
    ex = recall_example(torch.Generator().manual_seed(3), 300, pairs=10, queries=4)
    seq = ex.tokens
    assert len(seq) == 300
    pairs = {seq[2 * i]: seq[2 * i + 1] for i in range(10)}
    assert len(pairs) == 10  # distinct keys
    assert all(KEY_BASE <= k < VALUE_BASE <= v for k, v in pairs.items())
    assert all(b < 128 for b in seq[20:-8])  # the gap is plain text
    for pos, answer in zip(ex.answer_positions, ex.answers):
        assert seq[pos] in pairs and pairs[seq[pos]] == answer == seq[pos + 1]
    assert len(set(seq[p] for p in ex.answer_positions)) == 4  # distinct queries
    with pytest.raises(ValueError, match="queries=11"):
        recall_example(torch.Generator(), 300, pairs=10, queries=11)


@pytest.mark.parametrize("task", ["passkey", "recall"])
def test_task_batches_mask_only_the_answers(task: str) -> None:
    cfg = TaskConfig(name=task, lengths=[400, 700])
    sampler = TaskSampler(cfg, segment_len=64, seed=5)
    batch = sampler.sample(7, 3)
    again = sampler.sample(7, 3)
    assert torch.equal(batch.tokens, again.tokens) and torch.equal(batch.mask, again.mask)  # deterministic in step
    assert not torch.equal(batch.tokens, sampler.sample(8, 3).tokens)
    b, s, n = batch.tokens.shape
    flat_tokens, flat_targets = batch.tokens.view(b, -1), batch.targets.view(b, -1)
    assert torch.equal(flat_tokens[:, 1:], flat_targets[:, :-1])  # targets are the next bytes
    assert batch.reset[:, 0].all() and not batch.reset[:, 1:].any()
    for row in range(b):
        answer = bytes(flat_targets[row][batch.mask[row].view(-1)].tolist())
        text = bytes(flat_tokens[row].tolist())
        if task == "passkey":
            key = answer.decode().strip(" .")
            assert answer == f" {key}.".encode() and len(key) == 5
            assert f"The pass key is {key}. Remember it.".encode() in text
        else:
            assert len(answer) == cfg.queries and all(v >= VALUE_BASE for v in answer)


def test_task_section_is_checked() -> None:
    with pytest.raises(ConfigError, match="task.name='pass-key'.*lm, passkey, recall"):
        load_config("local", ["task.name=pass-key"])
    with pytest.raises(ConfigError, match="task.lenghts"):
        load_config("local", ["task.lenghts=[100]"])
    with pytest.raises(ConfigError, match="length=50"):
        load_config("local", ["task.name=passkey", "task.lengths=[50]"])
    with pytest.raises(ConfigError, match="task.loss"):
        load_config("local", ["task.name=recall", "task.loss=some"])


@pytest.mark.parametrize("back", [1, 2, 4])
def test_key_segments_back_places_the_key(back: int) -> None:
    """Every row's key (its last digit nearest the question) is exactly `back` segments before the
    segment of the prompt's last byte, read off the bytes of the batch."""
    n = 128
    cfg = TaskConfig(name="passkey", lengths=[700, 1000], key_digits=2, key_segments_back=[back])
    sampler = TaskSampler(cfg, segment_len=n, seed=1)
    for step in range(4):
        batch = sampler.sample(step, 8)
        flat_tokens, flat_targets, flat_mask = (t.view(8, -1) for t in (batch.tokens, batch.targets, batch.mask))
        for row in range(8):
            text = bytes(flat_tokens[row].tolist())
            question_end = int(flat_mask[row].nonzero()[0])  # predicts the answer's first byte
            key = bytes(flat_targets[row][flat_mask[row]].tolist()).strip(b" .")
            last_digit = text.rindex(key + b" is the pass key.") + len(key) - 1
            assert question_end // n - last_digit // n == back
    # Whole fillers (89 bytes) move the key in steps: 700 bytes cannot hold it in the question's segment.
    with pytest.raises(ValueError, match=r"key_segments_back=0: no prompt of length=700.*expected one of \[1, 2, 3, 4\]"):
        TaskSampler(TaskConfig(name="passkey", lengths=[700], key_digits=2, key_segments_back=[0]), n, 0)
