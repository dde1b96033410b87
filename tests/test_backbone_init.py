"""A memory added to a pretrained transformer (`task.init_backbone_only`): every method starts from
one shared backbone's weights, its own memory parameters at their initialisation."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from memzoo.core.config import ConfigError
from memzoo.core.plugins import registered
from memzoo.core.model import is_memory_name
from memzoo.runs.checkpoints import load_checkpoint
from memzoo.runs.configure import build_model, load_config
from memzoo.training.train import train

TINY = ["model.d_model=32", "model.n_layers=2", "model.n_heads=2", "model.segment_len=16", "train.batch_size=2",
        "train.window_segments=2", "train.bptt_segments=2", "train.warmup_steps=1", "train.log_every=1",
        "data.max_docs=20", "eval.max_docs=2", "eval.max_segments_per_doc=2", "eval.batch_size=2"]


@pytest.fixture(scope="module")
def backbone(tmp_path_factory) -> Path:
    """A `local` run trained 3 steps: a pretrained transformer with no memory."""
    out = tmp_path_factory.mktemp("backbone")
    return train(load_config("local", TINY + ["train.steps=3", "name=bb", f"out_dir={out}"]), progress=False,
                 evaluate_at_end=False)


@pytest.mark.parametrize("method", sorted(registered()))
def test_every_method_starts_from_the_backbone_with_its_memory_at_init(backbone: Path, tmp_path: Path,
                                                                        method: str) -> None:
    extra = TINY + [f"out_dir={tmp_path}", "name=m", "train.steps=1", "train.lr=0", "train.warmup_steps=0",
                    f"task.init_from={backbone}", "task.init_backbone_only=true"]
    cfg = load_config(method, extra)
    torch.manual_seed(cfg.seed)
    fresh = build_model(cfg).state_dict()  # what train() initialises before loading (same seed)
    run = train(cfg, progress=False, evaluate_at_end=False)  # lr 0: the weights are the loaded ones
    got, source = load_checkpoint(run)["model"], load_checkpoint(backbone)["model"]
    for name, tensor in got.items():
        if is_memory_name(name):
            assert torch.equal(tensor, fresh[name]), f"{method}: memory parameter {name} is not at its init"
        else:
            assert torch.equal(tensor, source[name]), f"{method}: backbone weight {name} was not loaded"
    assert any(not is_memory_name(n) and not torch.equal(fresh[n], source[n]) for n in got)  # a real load


def test_a_strict_init_from_another_memory_is_refused_and_backbone_only_is_not(backbone: Path, tmp_path: Path) -> None:
    extra = TINY + [f"out_dir={tmp_path}", "train.steps=1", f"task.init_from={backbone}"]
    with pytest.raises(ValueError, match="holds weights of another model or memory config"):
        train(load_config("infini-delta", extra + ["name=strict"]), progress=False, evaluate_at_end=False)
    train(load_config("infini-delta", extra + ["name=loose", "task.init_backbone_only=true"]), progress=False,
          evaluate_at_end=False)


def test_another_backbone_is_refused_naming_the_weight(backbone: Path, tmp_path: Path) -> None:
    wider = TINY + ["model.d_model=64", f"out_dir={tmp_path}", "train.steps=1", "name=w",
                    f"task.init_from={backbone}", "task.init_backbone_only=true"]
    with pytest.raises(ValueError, match=r"has shape \[.*\], this model \[.*\]: another backbone"):
        train(load_config("rmt", wider), progress=False, evaluate_at_end=False)
    with pytest.raises(ConfigError, match="init_backbone_only=True needs task.init_from"):
        load_config("rmt", TINY + ["task.init_backbone_only=true"])


SUITE = """
name: bb
base: small
threads_per_job: 1
methods: [infini-delta, rmt]
token_budget: 512   # 1 LM step of 2 x 4 x 64 bytes per method, from the backbone
jobs: 2   # the two methods side by side, after the backbone
run:
  model: {d_model: 32, n_layers: 2, n_heads: 2, segment_len: 64}
  data: {max_docs: 30}
  train: {batch_size: 2, window_segments: 4, bptt_segments: 2, warmup_steps: 1, checkpoint_every: 1, log_every: 1,
          lr: 0.0}
  eval: {batch_size: 2, max_docs: 2, max_segments_per_doc: 2}
backbone:
  train: {steps: 2, lr: 0.01}
finetune:
  task: {name: passkey, lengths: [300], key_digits: 2}
  train: {steps: 1}
"""


def test_a_suite_backbone_is_trained_once_and_every_method_starts_from_it(tmp_path: Path, monkeypatch) -> None:
    import memzoo.training.train as train_module
    from memzoo.suites.compare import backbone_specs, expand, load_suite, run_suite

    path = tmp_path / "bb.yaml"
    path.write_text(f"out_dir: {tmp_path / 'results'}\n" + SUITE)
    suite = load_suite(str(path))
    runs = tmp_path / "results" / "bb" / "runs"
    (bb,) = backbone_specs(suite)
    assert bb.name == "backbone-s0" and bb.cfg.memory.name == "local" and bb.cfg.train.steps == 2
    for spec in expand(suite):
        lm, last = spec.chain[0].task, spec.chain[-1].task
        assert (lm.init_from, lm.init_backbone_only) == (str(runs / "backbone-s0"), True)
        assert (last.init_from, last.init_backbone_only) == (str(runs / f"{spec.name}-lm"), False)  # its own memory

    run_suite(suite, progress=False)
    source = load_checkpoint(runs / "backbone-s0")["model"]
    for method in ("infini-delta", "rmt"):  # lr 0 after the backbone: the backbone's weights, unchanged
        got = load_checkpoint(runs / f"{method}-s0")["model"]
        assert all(torch.equal(t, source[n]) for n, t in got.items() if not is_memory_name(n)), method
    stamp = (runs / "backbone-s0" / "result.json").stat().st_mtime_ns
    run_suite(load_suite(str(path)), progress=False)  # finished: nothing is trained again
    assert (runs / "backbone-s0" / "result.json").stat().st_mtime_ns == stamp
