"""Training precision (train.precision): fp32, bf16 autocast, or auto, never silently slow.

A CPU without bf16 matrix units (x86 without AVX512-BF16 or AMX, ARM without BF16) runs bf16
matrix products in software, tens of times slower than fp32 (an AVX2 machine: about 1 GFLOP/s
against 150-180). There `bf16` warns once, naming the measured slowdown and the fix (fp32), and
`auto` resolves to fp32. `auto` picks bf16 only on a CUDA device that supports it.
"""
from __future__ import annotations

import contextlib
import functools
import time
import warnings
from pathlib import Path
from typing import Optional

import torch

PRECISIONS = ("fp32", "bf16", "auto")
BF16_CPU_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})  # x86 /proc/cpuinfo flags; aarch64 Features
_warned = False  # the slow-bf16 warning is given once per process


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> Optional[frozenset[str]]:
    """The CPU's feature flags from /proc/cpuinfo (x86 `flags`, aarch64 `Features`); None where unreadable."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return None


def bf16_matmul_speeds(size: int = 192, repeats: int = 3) -> tuple[float, float]:
    """(fp32, bf16) GFLOP/s of a size x size matrix product on this CPU, best of `repeats` (tens of ms)."""
    speeds = []
    for dtype in (torch.float32, torch.bfloat16):
        a, b = torch.randn(size, size).to(dtype), torch.randn(size, size).to(dtype)
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            a @ b
            best = min(best, time.perf_counter() - start)
        speeds.append(2 * size**3 / max(best, 1e-9) / 1e9)
    return speeds[0], speeds[1]


@functools.lru_cache(maxsize=None)
def cpu_has_bf16_units() -> bool:
    """Whether this CPU multiplies bf16 matrices in hardware: its flags, or (no flags readable) a timing."""
    flags = cpu_flags()
    if flags is not None:
        return bool(flags & BF16_CPU_FLAGS)
    fp32, bf16 = bf16_matmul_speeds()
    return bf16 * 2 >= fp32  # software bf16 is many times slower; hardware is about as fast or faster


def warn_slow_bf16() -> None:
    """Warn (once per process) that bf16 on this CPU is slow, with the measured slowdown and the fix."""
    global _warned
    if _warned:
        return
    _warned = True
    fp32, bf16 = bf16_matmul_speeds()
    warnings.warn(
        f"train.precision=bf16 on a CPU without bf16 matrix units (no AVX512-BF16, AMX or ARM BF16): a bf16 matrix "
        f"product measured {fp32 / max(bf16, 1e-9):.0f}x slower than fp32 here ({bf16:.1f} against {fp32:.1f} "
        f"GFLOP/s), so training and evaluation run many times slower. Use train.precision=fp32 (or auto, which "
        f"picks fp32 on this machine).",
        RuntimeWarning,
        stacklevel=3,
    )


def resolve_precision(precision: str, device: torch.device) -> str:
    """fp32 or bf16 for `precision` on `device`: auto -> bf16 only on a bf16-capable CUDA device;
    bf16 on a CPU without bf16 units is kept (the user asked for it) but warns once."""
    if precision not in PRECISIONS:
        raise ValueError(f"train.precision={precision!r}; expected one of {PRECISIONS}")
    if precision == "auto":
        return "bf16" if device.type == "cuda" and torch.cuda.is_bf16_supported() else "fp32"
    if precision == "bf16" and device.type == "cpu" and not cpu_has_bf16_units():
        warn_slow_bf16()
    return precision


def autocast_context(precision: str, device: torch.device):
    """No autocast for fp32, bf16 autocast for bf16; `auto` and the slow-CPU warning: resolve_precision."""
    if resolve_precision(precision, device) == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
