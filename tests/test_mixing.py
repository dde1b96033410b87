"""The fine-tune that keeps the language model (memzoo.training.mixing): (1 - f) x task loss + f x corpus loss."""
from __future__ import annotations

import copy

import pytest
import torch

from memzoo.core.config import ConfigError
from memzoo.runs.configure import load_config
from memzoo.training.mixing import corpus_batches, mixed_window
from memzoo.data.tasks import TaskSampler
from memzoo.runs.configure import build_model
from memzoo.training.train import train_window

TINY = ["model.d_model=32", "model.n_layers=2", "model.n_heads=2", "model.segment_len=64", "data.max_docs=30",
        "task.name=passkey", "task.lengths=[300]", "task.key_digits=2", "train.bptt_segments=5"]


@pytest.fixture(scope="module")
def setup():
    cfg = load_config("infini-linear", TINY)
    torch.manual_seed(0)
    model = build_model(cfg)
    task = TaskSampler(cfg.task, cfg.model.segment_len, 0).sample(0, 2)  # [2, 5, 64]
    corpus = corpus_batches(cfg)(0, 2, task.tokens.shape[1])
    return model, task, corpus


def _step(model, fn) -> dict[str, torch.Tensor]:
    """One AdamW step of a copy of `model` on the gradients `fn(copy)` leaves; its new weights."""
    m = copy.deepcopy(model)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    fn(m)
    opt.step()
    return {k: v.clone() for k, v in m.state_dict().items()}


def _grads(model, fn) -> dict[str, torch.Tensor]:
    m = copy.deepcopy(model)
    fn(m)
    return {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}


def test_fraction_zero_is_a_task_step_and_one_an_lm_step(setup) -> None:
    model, task, corpus = setup
    pure_task = _step(model, lambda m: train_window(m, task, 5, align_end=True))
    pure_lm = _step(model, lambda m: train_window(m, corpus, 5))
    mixed0 = _step(model, lambda m: mixed_window(m, task, corpus, 0.0, 5))
    mixed1 = _step(model, lambda m: mixed_window(m, task, corpus, 1.0, 5))
    assert all(torch.equal(mixed0[k], pure_task[k]) for k in pure_task)  # bit-identical
    assert all(torch.equal(mixed1[k], pure_lm[k]) for k in pure_lm)
    assert any(not torch.equal(pure_task[k], pure_lm[k]) for k in pure_task)  # the two steps do differ


def test_the_mixed_gradient_is_the_weighted_sum(setup) -> None:
    model, task, corpus = setup
    g_task = _grads(model, lambda m: train_window(m, task, 5, align_end=True))
    g_lm = _grads(model, lambda m: train_window(m, corpus, 5))
    g_mix = _grads(model, lambda m: mixed_window(m, task, corpus, 0.25, 5))
    for name in g_task:
        assert torch.allclose(g_mix[name], 0.75 * g_task[name] + 0.25 * g_lm[name], atol=1e-6, rtol=1e-4), name


def test_lm_fraction_is_checked_and_logged(tmp_path) -> None:
    with pytest.raises(ConfigError, match=r"task.lm_fraction=1.5; expected a fraction in \[0, 1\]"):
        load_config("local", TINY + ["task.lm_fraction=1.5"])
    with pytest.raises(ConfigError, match="task.lm_fraction=0.5 mixes the corpus into a task's loss"):
        load_config("local", ["task.lm_fraction=0.5"])
    from memzoo.training.train import train
    import json

    cfg = load_config("local", TINY + ["task.lm_fraction=0.5", "train.steps=2", "train.batch_size=2", "train.log_every=1",
                                      "eval.max_docs=1", "eval.max_segments_per_doc=1", f"out_dir={tmp_path}"])
    run = train(cfg, progress=False)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and all(2 < r["lm_bpb"] < 9 and r["train_bpb"] > 0 for r in rows)


@pytest.mark.parametrize("fraction", [0.0, 0.5])
def test_the_answer_loss_is_measured_apart_whatever_the_loss_trains(setup, fraction: float) -> None:
    """Under task.loss=all the answer bytes' loss is still measured alone: it equals the task loss
    of the same batch under loss=answer (the answer loss curve stays comparable across recipes)."""
    model, _, corpus = setup
    cfg = load_config("infini-linear", TINY)
    answer_only = TaskSampler(cfg.task, 64, 0).sample(3, 2)
    cfg.task.loss = "all"
    every_byte = TaskSampler(cfg.task, 64, 0).sample(3, 2)
    assert torch.equal(every_byte.tokens, answer_only.tokens) and torch.equal(every_byte.answer, answer_only.mask)
    assert every_byte.mask.sum() > 10 * every_byte.answer.sum()  # the loss trains on every byte

    m = copy.deepcopy(model)
    ref = train_window(m, answer_only, 5)
    if fraction:
        got = mixed_window(copy.deepcopy(model), every_byte, corpus, fraction, 5)
        nll, n = got.answer_nll, got.answer_tokens
    else:
        got = train_window(copy.deepcopy(model), every_byte, 5)
        nll, n = got.answer_nll, got.answer_tokens
    assert n == ref.tokens == ref.answer_tokens
    assert nll == pytest.approx(ref.nll_sum, rel=1e-5)
    assert got.answer_nll < (got.task_nll if fraction else got.nll_sum)  # the answer is a part of the whole
