"""Pinned logits: each method built at the invariants' tiny size, every parameter overwritten from its
NAME (a generator seeded by a hash of the name, so the values depend neither on the order in which
modules are initialised nor on how MemoryModel.__init__ seeds them), and fixed tokens run in float64.
tests/test_hook_pin.py holds them to a fixture, so that growing the interface leaves every method built
before it bit-identical; experiments/precision/pin_spread.py measures how far a CPU's kernels move them.
"""
from __future__ import annotations

import hashlib
import math

import torch

from memzoo.conformance.tiny import tiny_model

# The nine methods that existed before the per-layer hooks (the pin is about them; new methods are not in it).
PINNED = ["compressive", "full", "infini-delta", "infini-linear", "infty-former", "local", "memorizing", "rmt", "xl"]
B, S, N = 2, 3, 8
COLUMNS = slice(None, None, 32)  # 8 of the 256 vocabulary columns: every hidden change reaches them (tied head)
# Every op is float64 (the `precision` invariant records it). Float64 logits (|max| 4.2, an ulp 8.9e-16)
# still move with the reduction order of a CPU's kernels: `experiments/precision/pin_spread.py` measured 0 at 1
# and 2 threads on an AVX512-FP16 Xeon, and at most 3.6e-15 (4 ulps) there with ATen's AVX2 or plain
# kernels and MKL limited to AVX2 (what an AVX2-only CPU runs). 1e-12 is 280 times that, and a 1e-9
# nudge of one weight moves the logits past it (the control in tests/test_hook_pin.py).
TOLERANCE = 1e-12


def name_generator(name: str) -> torch.Generator:
    """A generator seeded from a parameter's name only."""
    return torch.Generator().manual_seed(int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little") >> 1)


@torch.no_grad()
def set_parameters_from_names(model: torch.nn.Module) -> None:
    """Every parameter from its name: matrices ~ N(0, 1/fan_in), norm weights 1 + N(0, 0.1²), other vectors N(0, 0.1²)."""
    for name, p in model.named_parameters():
        values = torch.randn(p.shape, generator=name_generator(name), dtype=torch.float64)
        if p.dim() >= 2:
            values = values / math.sqrt(p.shape[-1])
        elif name.split(".")[-2].startswith("norm") and name.endswith("weight"):
            values = 1.0 + 0.1 * values
        else:
            values = 0.1 * values
        p.copy_(values.to(p.dtype))


def pinned_logits(method: str) -> torch.Tensor:
    """Logits [B, S, N, 8] of `method` at its tiny options, parameters from names, float64, one reset."""
    model = tiny_model(method).double()
    set_parameters_from_names(model)
    tokens = torch.randint(0, 256, (B, S, N), generator=torch.Generator().manual_seed(7))
    reset = torch.zeros(B, S, dtype=torch.bool)
    reset[1, 2] = True
    with torch.no_grad():
        logits = model(tokens, reset=reset).logits
    return logits[..., COLUMNS]
