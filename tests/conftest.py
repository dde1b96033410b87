"""Shared fixtures: the registered methods, their option variants (CASES) and the tiny backbone for CPU tests."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any, Callable, Optional

import pytest
import torch

# Test models are tiny: one thread is faster than two (no fork-join overhead per small op) and
# leaves a core free for the suite tests' worker processes.
os.environ["OMP_NUM_THREADS"] = "1"
torch.set_num_threads(1)

from memzoo.core.plugins import registered  # noqa: E402
# The tiny model and per-method options live in the package: `memzoo check` builds the same ones.
from memzoo.conformance.tiny import TINY_OPTIONS, tiny_memory_config, tiny_model, tiny_model_config  # noqa: E402, F401

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
    ("compressive-kv", "compressive", {"mem_len": 8, "cmem_len": 4, "compression_rate": 2, "cache": "kv"}),
    ("memorizing-small-store", "memorizing", {"store_size": 12, "mem_len": 0, "top_k": 2}),
    ("rmt-learned-write", "rmt", {"n_mem_tokens": 2, "write_slots": "learned"}),
    ("rmt-causal-mask", "rmt", {"n_mem_tokens": 2, "memory_mask": "causal"}),
    ("infty-former-sticky", "infty-former", {"n_basis": 8, "mem_len": 12, "kv_weights": "layer", "sticky_memories": True}),
    ("infty-former-no-stm", "infty-former", {"n_basis": 8, "mem_len": 0}),
    ("infty-former-kv", "infty-former", {"n_basis": 8, "mem_len": 12, "cache": "kv"}),
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


class Killed(BaseException):
    """A kill in the middle of a training step (nothing in memzoo catches a BaseException)."""


def spy_train(monkeypatch, calls: list, kill: tuple[str, int] | None = None,
              record: Callable[[Any, Optional[int]], Any] = lambda cfg, first: (cfg.name, first)) -> None:
    """Record every memzoo.training.train.train call as record(stage config, first step run) (default:
    the stage's name and its first step); with `kill`, raise Killed in the stage whose name ends with
    kill[0] once step kill[1] is done."""
    import memzoo.training.train as module

    real = getattr(module.train, "real_train", module.train)  # a second spy in one test wraps the real train

    def train(cfg, run_dir=None, on_step=None, **kw):
        seen: list[int] = []

        def step(i: int) -> None:
            seen.append(i)
            if on_step:
                on_step(i)
            if kill and cfg.name.endswith(kill[0]) and i == kill[1]:
                raise Killed()

        try:
            return real(cfg, run_dir=run_dir, on_step=step, **kw)
        finally:
            calls.append(record(cfg, seen[0] if seen else None))

    train.real_train = real
    monkeypatch.setattr(module, "train", train)


# Run by the installed console script (`memzoo --import PROBE list`) started in an empty folder.
ELSEWHERE_PROBE = """
import json
from memzoo.publishing.references import load_references
from memzoo.runs.configure import load_config
from memzoo.training.backbones import load_shipped_backbone, shipped_dir
weights = load_shipped_backbone("backbone:small-stdlib", load_config("local").model)
print("elsewhere:", json.dumps({"shipped_dir": str(shipped_dir()), "tensors": len(weights),
                                "numbers": sum(t.numel() for t in weights.values()),
                                "quick_rows": len(load_references("quick"))}))
"""


@pytest.fixture(scope="session")
def elsewhere(tmp_path_factory) -> dict[str, Any]:
    """What the installed `memzoo` console script finds when started in an empty folder, the checkout
    off its path: the shipped backbones' folder, the small backbone's tensors and numbers, the rows of
    the shipped `quick` suite, and (`listed`) what `memzoo list` printed. One process for the tests of
    test_cli, test_references and test_backbones: each start of an interpreter costs seconds."""
    exe = shutil.which("memzoo")
    assert exe is not None, "the memzoo console script is not on PATH"
    probe = tmp_path_factory.mktemp("probe") / "elsewhere_probe.py"
    probe.write_text(ELSEWHERE_PROBE)
    out = subprocess.run([exe, "--import", str(probe), "list"], cwd=tmp_path_factory.mktemp("elsewhere"),
                         capture_output=True, text=True, check=True).stdout
    (line,) = [x for x in out.splitlines() if x.startswith("elsewhere: ")]
    return {**json.loads(line.removeprefix("elsewhere: ")), "listed": out}
