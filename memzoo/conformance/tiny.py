"""The tiny model every invariant runs on: its backbone, each in-tree method's options at that size,
random bytes and document boundaries, and the comparisons the failure messages quote."""
from __future__ import annotations

from typing import Any, Optional

import torch

from memzoo.core.config import ModelConfig
from memzoo.core.model import MemoryModel
from memzoo.core.plugins import get_memory

# Options that make each in-tree method's memory matter at the tiny size (mem_len = one segment,
# etc.). They live here, not in the tests, because `memzoo check` starts from them too.
TINY_OPTIONS: dict[str, dict[str, Any]] = {
    "xl": {"mem_len": 8},
    "compressive": {"mem_len": 8, "cmem_len": 4, "compression_rate": 2},
    "memorizing": {"store_size": 32, "mem_len": 8, "top_k": 4},
    "rmt": {"n_mem_tokens": 2},
    "infty-former": {"n_basis": 8, "mem_len": 8},
    "titans-mac": {"chunk_size": 4, "n_persistent": 2},
    "titans-mag": {"chunk_size": 4, "n_persistent": 2},
    # W_V starts at zero in the paper (a silent memory, no reach and no gradient through the state
    # until W_V learns); the untrained tiny model needs it nonzero for the invariants to see the memory.
    "armt": {"n_mem_tokens": 2, "d_mem": 4, "w_v_init_std": 0.2},
}

B, S, N, V = 2, 4, 8, 256  # batch rows, segments, segment length (tiny_model_config's), vocabulary


class NotApplicable(Exception):
    """An invariant that cannot be checked for this memory (reported as SKIP, never as a pass)."""


def tiny_model_config(**kw: Any) -> ModelConfig:
    """The tiny backbone the invariants run on: 2 layers, d_model 32, 2 heads, segments of 8."""
    base = dict(d_model=32, n_layers=2, n_heads=2, segment_len=N, mlp_ratio=2.0)
    base.update(kw)
    return ModelConfig(**base)


def tiny_memory_config(method: str, options: Optional[dict[str, Any]] = None) -> Any:
    """The method's config from `options` (None: its TINY_OPTIONS)."""
    return get_memory(method).config(**(TINY_OPTIONS.get(method, {}) if options is None else options))


def tiny_model(method: str, seed: int = 0, options: Optional[dict[str, Any]] = None, **kw: Any) -> MemoryModel:
    """A tiny model of `method` in eval mode, its weights drawn from `seed`."""
    torch.manual_seed(seed)
    model = MemoryModel(tiny_model_config(**kw), method, tiny_memory_config(method, options))
    model.eval()
    return model


def tokens(seed: int = 1, s: int = S) -> torch.Tensor:
    """Random bytes [B, s, N] from a fixed seed."""
    return torch.randint(0, V, (B, s, N), generator=torch.Generator().manual_seed(seed))


def boundary(row: int, segment: int) -> torch.Tensor:
    """Document starts [B, S]: only `row` starts a new document, at `segment`."""
    reset = torch.zeros(B, S, dtype=torch.bool)
    reset[row, segment] = True
    return reset


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max())


def first_over(a: torch.Tensor, b: torch.Tensor, tol: float, unit: str = "position") -> str:
    """Where |a - b| first exceeds tol along dim 1 (a position or a segment), for failure messages."""
    over = ((a - b).abs() > tol).flatten(2).any(-1).any(0)  # [L]
    return f"first at {unit} {int(over.nonzero()[0])}" if bool(over.any()) else "nowhere"


def streamed(model: MemoryModel, x: torch.Tensor, reset: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Logits [B, S, N, V] of tokens x [B, S, N] fed one segment per call through the state API (the
    other side of every streaming = one-shot comparison); reset [B, S] marks document starts."""
    state, parts = model.initial_state(x.shape[0]), []
    for s in range(x.shape[1]):
        out = model(x[:, s : s + 1], state, None if reset is None else reset[:, s : s + 1])
        state = out.state
        parts.append(out.logits)
    return torch.cat(parts, dim=1)
