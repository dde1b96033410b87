"""Training precision (train.precision): fp32, bf16 autocast, or auto, never silently slow.

A CPU without bf16 matrix units (x86 without AVX512-BF16 or AMX, ARM without BF16) runs bf16
matrix products in software, tens of times slower than fp32 (an AVX2 machine: about 1 GFLOP/s
against 150-180). There `bf16` warns once, naming the measured slowdown and the fix (fp32).

`auto` picks bf16 on a CUDA device that supports it, and on a Linux CPU only when /proc/cpuinfo
names bf16 units (avx512_bf16, amx_bf16; aarch64 bf16) and a short timed 256 x 256 matrix product
runs faster in bf16 than in fp32; fp32 everywhere else. `precision_choice` says which and why (the
run's result row records both).

The memories' precision policy (`working_dtype`) is the one rule every memory's state and recurrence
follow: a float64 model computes in float64 throughout (the oracle the pins and the CUDA check rely
on); anything narrower (fp32 weights, bf16 or fp16 weights or autocast) computes the state in float32,
or in the narrowest dtype a plugin declares (`_Memory.state_floor`, see docs/plugins.md).
"""
from __future__ import annotations

import contextlib
import functools
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

PRECISIONS = ("fp32", "bf16", "auto")
FLOATS = (torch.float64, torch.float32, torch.bfloat16, torch.float16)  # the dtypes the policy knows
BF16_CPU_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})  # x86 /proc/cpuinfo flags; aarch64 Features
warned = False  # the slow-bf16 warning is given once per process


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
    """(fp32, bf16) GFLOP/s of a size x size matrix product on this CPU, best of `repeats` after one
    untimed product (tens of ms on bf16 units; software bf16 at 256: about 0.2 s)."""
    speeds = []
    for dtype in (torch.float32, torch.bfloat16):
        a, b = torch.randn(size, size).to(dtype), torch.randn(size, size).to(dtype)  # [size, size] each
        a @ b  # warm-up: first-call dispatch and allocation are not the kernel's speed
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
    global warned
    if warned:
        return
    warned = True
    fp32, bf16 = bf16_matmul_speeds()
    warnings.warn(
        f"train.precision=bf16 on a CPU without bf16 matrix units (no AVX512-BF16, AMX or ARM BF16): a bf16 matrix "
        f"product measured {fp32 / max(bf16, 1e-9):.0f}x slower than fp32 here ({bf16:.1f} against {fp32:.1f} "
        f"GFLOP/s), so training and evaluation run many times slower. Use train.precision=fp32 (or auto, which "
        f"picks fp32 on this machine).",
        RuntimeWarning,
        stacklevel=3,
    )


@dataclass(frozen=True)
class PrecisionChoice:
    """What train.precision resolved to on a device (fp32 or bf16) and why, in one line."""

    precision: str
    reason: str


AUTO_MATMUL_SIZE, AUTO_MATMUL_REPEATS = 256, 5  # auto's timed product on a CPU with bf16 units


@functools.lru_cache(maxsize=None)
def auto_cpu_choice() -> PrecisionChoice:
    """`auto` on this CPU, decided once per process: bf16 only on Linux, with bf16 units named in
    /proc/cpuinfo, and a timed matrix product faster in bf16 than in fp32 (no timing without units)."""
    if not sys.platform.startswith("linux"):
        return PrecisionChoice("fp32", f"auto on CPU: fp32 (bf16 units are read from Linux /proc/cpuinfo; "
                                       f"this is {sys.platform})")
    flags = cpu_flags()
    if flags is None:
        return PrecisionChoice("fp32", "auto on CPU: fp32 (/proc/cpuinfo has no readable CPU flags)")
    units = sorted(flags & BF16_CPU_FLAGS)
    if not units:
        return PrecisionChoice("fp32", "auto on CPU: fp32 (no bf16 units: /proc/cpuinfo names neither avx512_bf16 "
                                       "nor amx_bf16)")
    fp32, bf16 = bf16_matmul_speeds(AUTO_MATMUL_SIZE, AUTO_MATMUL_REPEATS)
    n = AUTO_MATMUL_SIZE
    timing = f"a {n}x{n} matrix product ran at {bf16:.1f} GFLOP/s in bf16 against {fp32:.1f} in fp32"
    if bf16 > fp32:
        return PrecisionChoice("bf16", f"auto on CPU: bf16 ({'+'.join(units)}; {timing})")
    return PrecisionChoice("fp32", f"auto on CPU: fp32 ({'+'.join(units)} present, but {timing})")


def precision_choice(precision: str, device: torch.device) -> PrecisionChoice:
    """fp32 or bf16 for `precision` on `device`, with the reason (no warning: see resolve_precision)."""
    if precision not in PRECISIONS:
        raise ValueError(f"train.precision={precision!r}; expected one of {PRECISIONS}")
    if precision != "auto":
        slow = precision == "bf16" and device.type == "cpu" and not cpu_has_bf16_units()
        return PrecisionChoice(precision, f"train.precision={precision} as set" +
                               (" (this CPU has no bf16 units: bf16 runs in software, many times slower)" if slow else ""))
    if device.type == "cuda":
        if torch.cuda.is_bf16_supported():
            return PrecisionChoice("bf16", "auto on CUDA: bf16 (the device supports it)")
        return PrecisionChoice("fp32", "auto on CUDA: fp32 (the device does not support bf16)")
    if device.type == "cpu":
        return auto_cpu_choice()
    return PrecisionChoice("fp32", f"auto on {device.type}: fp32")


def resolve_precision(precision: str, device: torch.device) -> str:
    """fp32 or bf16 for `precision` on `device` (auto: precision_choice); bf16 on a CPU without bf16
    units is kept (the user asked for it) but warns once."""
    choice = precision_choice(precision, device)
    if precision == "bf16" and device.type == "cpu" and not cpu_has_bf16_units():
        warn_slow_bf16()
    return choice.precision


def autocast_context(precision: str, device: torch.device):
    """No autocast for fp32, bf16 autocast for bf16; `auto` and the slow-CPU warning: resolve_precision."""
    if resolve_precision(precision, device) == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


def working_dtype(x: torch.Tensor | torch.dtype, floor: torch.dtype = torch.float32) -> torch.dtype:
    """A memory's state and recurrence dtype for inputs or weights of `x`'s dtype: float64 stays
    float64 (the reference), anything narrower is widened to `floor` (float32 unless a plugin
    declares a narrower state)."""
    dtype = x if isinstance(x, torch.dtype) else x.dtype
    if dtype not in FLOATS or floor not in FLOATS:
        raise ValueError(f"working_dtype of {dtype} with floor {floor}; expected floating dtypes among {FLOATS}")
    if dtype == floor or dtype == torch.float64:
        return dtype
    # torch.promote_types in plain Python (it is a dispatched op, called at every layer and segment):
    return torch.float64 if floor == torch.float64 else torch.float32  # float32 wins; bf16 with fp16 meet there
