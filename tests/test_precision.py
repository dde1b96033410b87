"""train.precision: bf16 on a CPU without bf16 units warns once with the measured slowdown and the fix;
auto picks fp32 on CPUs; bad values are clear errors; the CPU flags are read right."""
from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

import memzoo.core.precision as precision
from memzoo.core.config import ConfigError
from memzoo.core.precision import autocast_context
from memzoo.running.configure import load_config

CPU = torch.device("cpu")


@pytest.fixture
def cpu_without_bf16(monkeypatch):
    """A CPU with no bf16 units whose bf16 matrix product is 40x slower (160 vs 4 GFLOP/s)."""
    monkeypatch.setattr(precision, "cpu_has_bf16_units", lambda: False)
    monkeypatch.setattr(precision, "bf16_matmul_speeds", lambda: (160.0, 4.0))
    monkeypatch.setattr(precision, "_warned", False)


def autocast_dtype(name: str) -> torch.dtype:
    """The dtype a matrix product gets inside autocast_context(name, cpu)."""
    with autocast_context(name, CPU):
        return (torch.ones(2, 2) @ torch.ones(2, 2)).dtype


def test_bf16_on_a_cpu_without_bf16_units_warns_once_with_slowdown_and_fix(cpu_without_bf16) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dtypes = [autocast_dtype("bf16") for _ in range(3)]
    assert dtypes == [torch.bfloat16] * 3, "bf16 was asked for: it is kept, not silently replaced"
    slow = [w for w in caught if "bf16" in str(w.message)]
    assert len(slow) == 1, [str(w.message) for w in caught]
    message = str(slow[0].message)
    assert "40x slower" in message and "4.0 against 160.0 GFLOP/s" in message
    assert "train.precision=fp32" in message


def test_auto_is_fp32_on_cpu_and_warns_nothing(cpu_without_bf16) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert autocast_dtype("auto") == torch.float32
        assert autocast_dtype("fp32") == torch.float32
    assert not caught
    assert precision.resolve_precision("auto", CPU) == "fp32"


def test_bf16_on_a_cpu_with_bf16_units_does_not_warn(monkeypatch) -> None:
    monkeypatch.setattr(precision, "cpu_has_bf16_units", lambda: True)
    monkeypatch.setattr(precision, "_warned", False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert autocast_dtype("bf16") == torch.bfloat16
    assert not caught


@pytest.mark.parametrize("text,units", [
    ("processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n", False),  # AVX2 only (the machine)
    ("flags\t\t: fpu avx2 avx512f avx512_bf16\n", True),
    ("flags\t\t: fpu avx2 amx_tile amx_bf16\n", True),
    ("Features\t: fp asimd sve bf16 i8mm\n", True),  # aarch64
    ("Features\t: fp asimd\n", False),
])
def test_cpu_flags_decide_the_bf16_units(tmp_path: Path, monkeypatch, text: str, units: bool) -> None:
    (tmp_path / "cpuinfo").write_text(text)
    flags = precision.cpu_flags(tmp_path / "cpuinfo")
    assert bool(flags & precision.BF16_CPU_FLAGS) is units
    assert precision.cpu_flags(tmp_path / "missing") is None
    monkeypatch.setattr(precision, "cpu_flags", lambda: flags)
    precision.cpu_has_bf16_units.cache_clear()
    try:
        assert precision.cpu_has_bf16_units() is units
    finally:
        precision.cpu_has_bf16_units.cache_clear()


def test_bad_precision_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match=r"train.precision='fp16'; expected fp32, bf16 or auto"):
        load_config("small", ["train.precision=fp16"])
    with pytest.raises(ValueError, match=r"train.precision='half'; expected one of \('fp32', 'bf16', 'auto'\)"):
        precision.resolve_precision("half", CPU)
    assert load_config("small", ["train.precision=auto"]).train.precision == "auto"
