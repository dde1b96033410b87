"""Shared fixtures: the registered methods, their option variants (CASES) and the tiny backbone for CPU tests."""
from __future__ import annotations

import os

import pytest
import torch

# Test models are tiny: one thread is faster than two (no fork-join overhead per small op) and
# leaves a core free for the suite tests' worker processes.
os.environ["OMP_NUM_THREADS"] = "1"
torch.set_num_threads(1)

from memzoo.core.plugins import registered  # noqa: E402
# The tiny model and per-method options live in the package: `memzoo check` builds the same ones.
from memzoo.suites.invariants import TINY_OPTIONS, tiny_memory_config, tiny_model, tiny_model_config  # noqa: E402, F401

METHODS = sorted(registered())

# Option variants that take different code paths; the invariants run on each of them too.
VARIANTS: list[tuple[str, str, dict]] = [
    ("full-window", "full", {"max_len": 12}),
    ("xl-kv", "xl", {"mem_len": 12, "cache": "kv"}),
    ("infini-linear-loop", "infini-linear", {"vectorized": False}),
    ("infini-delta-skip", "infini-delta", {"first_read": "skip"}),
    ("infini-delta-gamma", "infini-delta", {"normalizer": "gamma"}),
    ("compressive-mean", "compressive", {"mem_len": 8, "cmem_len": 4, "compression_rate": 2, "compression": "mean"}),
    ("compressive-dconv", "compressive", {"mem_len": 4, "cmem_len": 4, "compression_rate": 2,
                                          "compression": "depthwise-conv"}),
    ("memorizing-small-store", "memorizing", {"store_size": 12, "mem_len": 0, "top_k": 2}),
    ("rmt-learned-write", "rmt", {"n_mem_tokens": 2, "write_slots": "learned"}),
    ("rmt-causal-mask", "rmt", {"n_mem_tokens": 2, "memory_mask": "causal"}),
    ("infty-former-sticky", "infty-former", {"n_basis": 8, "mem_len": 12, "kv_weights": "layer", "sticky_memories": True}),
    ("infty-former-no-stm", "infty-former", {"n_basis": 8, "mem_len": 0}),
    ("gated-deltanet-chunk3", "gated-deltanet", {"chunk_size": 3}),  # 3 chunks per 8-token segment, the last partial
    ("gated-deltanet-loop", "gated-deltanet", {"chunkwise": False}),  # the per-token reference
    ("deltanet-chunk5-no-conv", "deltanet", {"chunk_size": 5, "conv_size": 0}),
    ("titans-mac-linear-chunk3", "titans-mac", {"depth": 1, "chunk_size": 3, "n_persistent": 0}),
    ("titans-mag-deep-chunk3", "titans-mag", {"depth": 3, "expansion": 2, "chunk_size": 3, "conv_kernel": 1}),
    ("armt-nu1", "armt", {"n_mem_tokens": 3, "d_mem": 3, "nu": 1, "w_v_init_std": 0.2}),
]
# (id, method, options): every registered method at its tiny options, then the variants.
CASES = [(m, m, TINY_OPTIONS.get(m, {})) for m in METHODS] + [v for v in VARIANTS if v[1] in METHODS]


@pytest.fixture(params=METHODS)
def method(request) -> str:
    return request.param
