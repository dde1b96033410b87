"""Shared fixtures: a tiny backbone and per-method options small enough for CPU tests."""
from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("OMP_NUM_THREADS", "2")
torch.set_num_threads(max(1, min(2, torch.get_num_threads())))

from memzoo.config import ModelConfig  # noqa: E402
from memzoo.plugins import get_memory, registered  # noqa: E402

# Options that make each method's memory matter at the tiny size (mem_len = one segment, etc.).
TINY_OPTIONS: dict[str, dict] = {
    "xl": {"mem_len": 8},
    "compressive": {"mem_len": 8, "cmem_len": 4, "compression_rate": 2},
    "memorizing": {"store_size": 32, "mem_len": 8, "top_k": 4},
    "rmt": {"n_mem_tokens": 2},
    "infty-former": {"n_basis": 8},
}

METHODS = sorted(registered())


def tiny_model_config(**kw) -> ModelConfig:
    base = dict(d_model=32, n_layers=2, n_heads=2, segment_len=8, mlp_ratio=2.0)
    base.update(kw)
    return ModelConfig(**base)


def tiny_memory_config(method: str):
    return get_memory(method).config(**TINY_OPTIONS.get(method, {}))


def tiny_model(method: str, seed: int = 0, **kw):
    from memzoo.model import MemoryModel

    torch.manual_seed(seed)
    model = MemoryModel(tiny_model_config(**kw), method, tiny_memory_config(method))
    model.eval()
    return model


@pytest.fixture(params=METHODS)
def method(request) -> str:
    return request.param
