"""Backbones shipped inside the package (`task.init_from=backbone:NAME`): every method fine-tuned from
one starts with exactly its weights and its own memory parameters, and a model of another config is
refused in one line naming both hashes."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from memzoo.core.config import ConfigError
from memzoo.core.model import is_memory_name
from memzoo.core.plugins import registered
from memzoo.training.backbones import backbone_hash, load_shipped_backbone, ship_backbone, shipped_dir
import memzoo.training.train as train_module
from memzoo.runs.checkpoints import load_backbone
from memzoo.runs.configure import build_model
from memzoo.training.train import train

from test_train import Interrupt, config  # tests/ is on pytest's path (the small training config every training test uses)


@pytest.fixture(scope="module")
def shipped(tmp_path_factory) -> Path:
    """A `local` run of two steps, shipped as backbone `tiny` into a folder of its own."""
    root = tmp_path_factory.mktemp("backbone")
    run = train(config(root, "local", "name=pre", "train.steps=2"), progress=False, evaluate_at_end=False)
    ship_backbone(run, "tiny", cost="2 steps (test)", dest=root / "shipped")
    return root / "shipped"


@pytest.fixture
def use_shipped(shipped, monkeypatch) -> Path:
    monkeypatch.setenv("MEMZOO_BACKBONES", str(shipped))
    return shipped


@pytest.mark.parametrize("method", sorted(registered()))
def test_every_method_starts_from_the_shipped_backbone_and_its_own_memory(use_shipped, tmp_path, method) -> None:
    cfg = config(tmp_path, method, "name=ft", "task.init_from=backbone:tiny", "task.init_backbone_only=true")
    torch.manual_seed(cfg.seed)
    fresh = build_model(cfg)  # the method as its seed draws it
    torch.manual_seed(cfg.seed)
    model = build_model(cfg)
    load_backbone(model, load_shipped_backbone(cfg.task.init_from, cfg.model), cfg.task.init_from)
    weights = torch.load(use_shipped / "tiny.pt", weights_only=True)
    for name, tensor in model.state_dict().items():
        if is_memory_name(name):  # the memory's own draw, untouched by the backbone
            assert torch.equal(tensor, fresh.state_dict()[name]), f"{method}: memory weight {name} changed"
        else:
            assert torch.equal(tensor, weights[name]), f"{method}: backbone weight {name} is not the shipped one"


def test_training_from_the_shipped_backbone_starts_from_it(use_shipped, tmp_path, monkeypatch) -> None:
    at_step_0: dict[str, torch.Tensor] = {}

    def first_step(model, *args, **kw):  # the weights the first training step sees, then stop
        at_step_0.update({k: v.clone() for k, v in model.state_dict().items()})
        raise Interrupt()

    monkeypatch.setattr(train_module, "train_window", first_step)
    with pytest.raises(Interrupt):
        train(config(tmp_path, "infini-delta", "name=ft0", "task.init_from=backbone:tiny", "task.init_backbone_only=true"),
              progress=False, evaluate_at_end=False)
    weights = torch.load(use_shipped / "tiny.pt", weights_only=True)
    assert weights and set(weights) < set(at_step_0)
    for name, tensor in weights.items():
        assert torch.equal(at_step_0[name], tensor), f"{name} at step 0 is not the shipped weight"


def test_a_model_of_another_config_is_refused_naming_both_hashes(use_shipped, tmp_path) -> None:
    cfg = config(tmp_path, "xl", "name=x", "model.d_model=64", "task.init_from=backbone:tiny", "task.init_backbone_only=true")
    shipped_hash = backbone_hash(config(tmp_path, "local").model)
    with pytest.raises(ConfigError) as err:
        train(cfg, progress=False, evaluate_at_end=False)
    message = str(err.value)
    assert shipped_hash in message and backbone_hash(cfg.model) in message and "d_model" in message
    assert "\n" not in message


@pytest.mark.parametrize("extra, message", [
    (("task.init_from=backbone:tiny",), "set task.init_backbone_only=true"),
    (("task.init_from=backbone:nothing", "task.init_backbone_only=true"), "no shipped backbone 'nothing'; shipped: \\['tiny'\\]"),
])
def test_wrong_uses_are_refused_by_name(use_shipped, tmp_path, extra, message) -> None:
    with pytest.raises(ConfigError, match=message):
        train(config(tmp_path, "xl", "name=w", *extra), progress=False, evaluate_at_end=False)


def test_the_shipped_folder_is_found_from_any_working_directory(elsewhere) -> None:
    folder = Path(elsewhere["shipped_dir"])  # the installed package's folder there, or this checkout's
    assert folder.parent.name == "memzoo" and (folder / "index.json").is_file()
    assert (folder / "index.json").read_text() == (shipped_dir() / "index.json").read_text()  # the same shipped backbones


def test_the_shipped_small_backbone_loads_from_any_folder_for_the_small_preset(elsewhere) -> None:
    tensors, numbers = elsewhere["tensors"], elsewhere["numbers"]
    # every weight of the small preset's local model: 821,504 parameters, the tied head a second name
    # for the embedding in the state dict (256 x 128 = 32,768 numbers counted twice)
    assert tensors > 10 and numbers == 821_504 + 256 * 128


def test_a_rope_base_change_loads_only_when_asked_and_only_alone(use_shipped, tmp_path) -> None:
    base = ("name=r", "model.rope_base=1000000", "task.init_from=backbone:tiny", "task.init_backbone_only=true")
    with pytest.raises(ConfigError, match="rope_base"):  # not asked: refused, naming the key
        load_shipped_backbone("backbone:tiny", config(tmp_path, "xl", *base).model)
    weights = load_shipped_backbone("backbone:tiny", config(tmp_path, "xl", *base).model, rebase_rope=True)
    assert all(torch.equal(t, w) for t, w in zip(weights.values(), torch.load(use_shipped / "tiny.pt", weights_only=True).values()))
    with pytest.raises(ConfigError, match="d_model"):  # asked, but another key differs as well: still refused
        load_shipped_backbone("backbone:tiny", config(tmp_path, "xl", *base, "model.d_model=64").model, rebase_rope=True)
