"""Backbone properties independent of any one memory."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from conftest import METHODS, tiny_memory_config, tiny_model, tiny_model_config
from memzoo.core.attention import LocalAttention, rope
from memzoo.core.model import MemoryModel
from memzoo.memories.reference import rope_complex


def test_backbone_names_no_method() -> None:
    """No method name and no method-specific branch in the backbone's files."""
    import memzoo

    root = Path(memzoo.__file__).parent
    from memzoo.core.plugins import registered

    classes = {spec.cls.__name__ for spec in registered().values()} - {"NoMemory"}
    for name in ("core/model.py", "core/attention.py", "core/memory.py", "core/losses.py", "training/train.py",
                 "runs/configure.py", "runs/checkpoints.py", "evaluations/lm.py", "evaluations/run_result.py",
                 "data/corpus.py", "suites/compare.py"):
        text = (root / name).read_text()
        for method in METHODS:
            assert not re.search(rf"[\"']{re.escape(method)}[\"']", text), f"{name} names the method {method!r}"
        for cls in classes:
            assert not re.search(rf"\b{cls}\b", text), f"{name} refers to the plugin class {cls}"
        assert "memzoo.memories." not in text, f"{name} imports a plugin module"


@pytest.mark.parametrize("method", ["infini-delta", "full"])
def test_activation_checkpointing_gives_the_same_gradients(method: str) -> None:
    x = torch.randint(0, 256, (2, 3, 8), generator=torch.Generator().manual_seed(0))
    grads = []
    for ckpt in (False, True):
        torch.manual_seed(0)
        model = MemoryModel(tiny_model_config(checkpoint_activations=ckpt), method, tiny_memory_config(method))
        model.train()
        model(x).logits.square().mean().backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    assert torch.allclose(grads[0], grads[1], atol=1e-6)


def test_xformers_backend_on_cpu_is_a_clear_error() -> None:
    model = tiny_model("local", attention_backend="xformers")
    with pytest.raises(RuntimeError, match="needs a CUDA device"):
        model(torch.zeros(1, 1, 8, dtype=torch.long))


def test_auto_backend_uses_sdpa_on_cpu() -> None:
    assert LocalAttention(10000.0, "auto").use_xformers(torch.zeros(1, 1, 2, 4)) is False


def fake_xformers(monkeypatch, attention) -> None:
    """Install a stand-in `xformers.ops` whose memory_efficient_attention is `attention`."""
    import sys
    import types

    import memzoo.core.attention as module

    ops = types.ModuleType("xformers.ops")
    ops.memory_efficient_attention = attention
    ops.LowerTriangularMask = lambda: None
    pkg = types.ModuleType("xformers")
    pkg.ops = ops
    monkeypatch.setitem(sys.modules, "xformers", pkg)
    monkeypatch.setitem(sys.modules, "xformers.ops", ops)
    monkeypatch.setattr(module, "XFORMERS_RUNS", {})


def test_auto_skips_an_xformers_whose_kernels_do_not_run(monkeypatch) -> None:
    """Seen on an H200: an xformers wheel built for another torch imports, then every call raises
    NotImplementedError ('xFormers wasn't built with CUDA support'). `auto` must probe and fall back
    to sdpa with one warning naming the error, once per device and dtype; a working one is used."""
    from memzoo.core.attention import xformers_runs

    calls = []

    def broken(q, k, v, attn_bias=None):
        calls.append(q.dtype)
        raise NotImplementedError("No operator found for `memory_efficient_attention_forward`")

    fake_xformers(monkeypatch, broken)
    with pytest.warns(RuntimeWarning, match="does not run on cpu for torch.bfloat16.*NotImplementedError: No operator"):
        assert xformers_runs(torch.device("cpu"), torch.bfloat16) is False
    assert xformers_runs(torch.device("cpu"), torch.bfloat16) is False  # cached: probed once
    assert calls == [torch.bfloat16]

    fake_xformers(monkeypatch, lambda q, k, v, attn_bias=None: q)
    assert xformers_runs(torch.device("cpu"), torch.bfloat16) is True


def test_auto_without_xformers_installed_is_sdpa(monkeypatch) -> None:
    import sys

    import memzoo.core.attention as module
    from memzoo.core.attention import xformers_runs

    monkeypatch.setitem(sys.modules, "xformers", None)  # import raises ImportError
    monkeypatch.setitem(sys.modules, "xformers.ops", None)
    monkeypatch.setattr(module, "XFORMERS_RUNS", {})
    assert xformers_runs(torch.device("cpu"), torch.float32) is False


def test_rope_matches_complex_rotation_and_is_relative() -> None:
    x = torch.randn(1, 1, 5, 8)
    pos = torch.arange(5)
    assert torch.allclose(rope(x, pos, 100.0)[0, 0], rope_complex(x[0, 0], 100.0), atol=1e-5)
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)
    d1 = (rope(q, torch.tensor([7]), 100.0) * rope(k, torch.tensor([3]), 100.0)).sum()
    d2 = (rope(q, torch.tensor([-1]), 100.0) * rope(k, torch.tensor([-5]), 100.0)).sum()
    assert torch.allclose(d1, d2, atol=1e-5)  # depends on the offset only


def test_segments_longer_than_segment_len_are_refused() -> None:
    model = tiny_model("local")
    with pytest.raises(ValueError, match="segment_len=8"):
        model(torch.zeros(1, 1, 9, dtype=torch.long))
