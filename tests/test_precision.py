"""train.precision: bf16 on a CPU without bf16 units warns once with the measured slowdown and the fix;
auto picks fp32 on CPUs; bad values are clear errors; the CPU flags are read right. The memories'
precision policy: float64 stays float64, narrower becomes float32 (or a plugin's declared floor),
and a memory's state dtype follows the model's dtype."""
from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

import memzoo.core.precision as precision
from memzoo.core.config import ConfigError
from memzoo.core.precision import autocast_context
from memzoo.runs.configure import load_config

CPU = torch.device("cpu")


@pytest.fixture
def cpu_without_bf16(monkeypatch):
    """A CPU with no bf16 units whose bf16 matrix product is 40x slower (160 vs 4 GFLOP/s), whatever
    CPU the tests run on: its flags (what `auto` reads) and the cached `auto` choice are faked too."""
    monkeypatch.setattr(precision, "cpu_flags", lambda: frozenset({"avx2", "fma"}))
    monkeypatch.setattr(precision, "cpu_has_bf16_units", lambda: False)
    monkeypatch.setattr(precision, "bf16_matmul_speeds", lambda size=192, repeats=3: (160.0, 4.0))
    monkeypatch.setattr(precision, "warned", False)
    precision.auto_cpu_choice.cache_clear()
    yield
    precision.auto_cpu_choice.cache_clear()


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
    monkeypatch.setattr(precision, "warned", False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert autocast_dtype("bf16") == torch.bfloat16
    assert not caught


@pytest.mark.parametrize("text,units", [
    ("processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n", False),  # AVX2 only (this project's CPU machine)
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


@pytest.fixture
def cpu_caps(monkeypatch):
    """Mock this CPU's bf16 capability for `auto`: set(flags, speeds); records whether it timed."""
    timed: list[int] = []

    def set_caps(flags: frozenset[str] | None, speeds: tuple[float, float] = (100.0, 50.0)) -> list[int]:
        monkeypatch.setattr(precision.sys, "platform", "linux")
        monkeypatch.setattr(precision, "cpu_flags", lambda: flags)
        monkeypatch.setattr(precision, "bf16_matmul_speeds", lambda size, repeats: timed.append(size) or speeds)
        precision.auto_cpu_choice.cache_clear()
        return timed

    yield set_caps
    precision.auto_cpu_choice.cache_clear()


def test_auto_on_a_cpu_with_bf16_units_and_faster_bf16_picks_bf16(cpu_caps) -> None:
    timed = cpu_caps(frozenset({"avx2", "avx512_bf16"}), speeds=(100.0, 250.0))
    choice = precision.precision_choice("auto", CPU)
    assert choice.precision == "bf16" and precision.resolve_precision("auto", CPU) == "bf16"
    assert "avx512_bf16" in choice.reason and "250.0 GFLOP/s in bf16 against 100.0" in choice.reason
    assert timed == [256], "timed once (256 x 256), then cached"
    assert autocast_dtype("auto") == torch.bfloat16


def test_auto_on_a_cpu_with_bf16_units_but_slower_bf16_picks_fp32(cpu_caps) -> None:
    timed = cpu_caps(frozenset({"amx_bf16"}), speeds=(100.0, 90.0))
    choice = precision.precision_choice("auto", CPU)
    assert choice.precision == "fp32" and "amx_bf16 present, but" in choice.reason and timed == [256]
    assert autocast_dtype("auto") == torch.float32


@pytest.mark.parametrize("flags", [frozenset({"avx2", "fma"}), None])
def test_auto_without_bf16_units_picks_fp32_without_timing(cpu_caps, flags) -> None:
    timed = cpu_caps(flags, speeds=(1.0, 1000.0))  # a timing would say bf16: it must not be taken
    choice = precision.precision_choice("auto", CPU)
    assert choice.precision == "fp32" and timed == []
    assert ("no bf16 units" if flags is not None else "no readable CPU flags") in choice.reason


def test_auto_off_linux_picks_fp32_without_reading_flags(cpu_caps, monkeypatch) -> None:
    timed = cpu_caps(frozenset({"avx512_bf16"}), speeds=(1.0, 1000.0))
    monkeypatch.setattr(precision.sys, "platform", "darwin")
    choice = precision.precision_choice("auto", CPU)
    assert choice.precision == "fp32" and "darwin" in choice.reason and timed == []


def test_this_machine_without_bf16_units_resolves_auto_to_fp32() -> None:
    """This project's CPU machine (AVX2 only): auto is fp32, with the reason; skipped on a bf16-capable CPU."""
    flags = precision.cpu_flags()
    if flags is None or flags & precision.BF16_CPU_FLAGS:
        pytest.skip("this CPU has bf16 units (or no readable flags): the AVX2-only case does not apply")
    precision.auto_cpu_choice.cache_clear()
    try:
        choice = precision.precision_choice("auto", CPU)
    finally:
        precision.auto_cpu_choice.cache_clear()
    assert choice.precision == "fp32" and "no bf16 units" in choice.reason


def test_state_stays_float32_when_auto_picks_bf16(cpu_caps) -> None:
    """auto -> bf16 (mocked bf16 units, faster): autocast is on (logits in bf16) and every memory's
    floating state stays float32."""
    from conftest import METHODS, tiny_model

    cpu_caps(frozenset({"amx_bf16"}), speeds=(100.0, 300.0))
    x = torch.randint(0, 256, (2, 2, 8))  # [B, segments, N]
    with_state = 0
    for method in METHODS:
        model = tiny_model(method)
        with torch.no_grad(), autocast_context("auto", CPU):
            out = model(x)
        assert out.logits.dtype == torch.bfloat16, f"{method}: autocast did not run in bf16"
        floats = {k: v.dtype for st in out.state.all() for k, v in st.items() if v.is_floating_point()}
        assert set(floats.values()) <= {torch.float32}, (method, floats)
        with_state += bool(floats)
    assert with_state >= len(METHODS) - 2  # every method but the two without memory (local, full) holds a state


def test_the_result_row_records_the_precision_and_why(tmp_path: Path) -> None:
    import json

    from memzoo.training.train import train

    corpus = tmp_path / "doc.txt"
    corpus.write_bytes(Path(__file__).read_bytes() * 2)  # one file: split 90/5/5 by bytes (memzoo.data.corpus)
    cfg = load_config("local", [f"data.source={corpus}", "model.d_model=32", "model.n_layers=1", "model.n_heads=2", "model.segment_len=16",
                                "train.steps=1", "train.batch_size=2", "train.window_segments=1", "train.bptt_segments=1",
                                "train.precision=auto", "train.device=cpu", "eval.max_docs=1",
                                "eval.max_segments_per_doc=1", "eval.batch_size=1", f"out_dir={tmp_path}"])
    precision.auto_cpu_choice.cache_clear()
    try:
        row = json.loads((train(cfg, progress=False) / "result.json").read_text())
        expected = precision.precision_choice("auto", CPU)
    finally:
        precision.auto_cpu_choice.cache_clear()
    assert row["precision"] == expected.precision and row["precision_reason"] == expected.reason
    assert row["precision_reason"].startswith("auto on CPU: ")


@pytest.mark.parametrize("dtype, floor, expected", [
    (torch.float64, torch.float32, torch.float64),
    (torch.float32, torch.float32, torch.float32),
    (torch.bfloat16, torch.float32, torch.float32),
    (torch.float16, torch.float32, torch.float32),
    (torch.bfloat16, torch.bfloat16, torch.bfloat16),  # a plugin that declares bf16 state
    (torch.float64, torch.bfloat16, torch.float64),
])
def test_working_dtype_keeps_float64_and_widens_the_rest_to_the_floor(dtype, floor, expected) -> None:
    assert precision.working_dtype(dtype, floor) == expected
    assert precision.working_dtype(torch.zeros(1, dtype=dtype), floor) == expected


def test_working_dtype_of_a_non_float_is_an_error_naming_it() -> None:
    with pytest.raises(ValueError, match="working_dtype of torch.int64"):
        precision.working_dtype(torch.int64)


def test_a_memorys_state_dtype_follows_the_model_even_without_parameters() -> None:
    """XL holds no parameter: its state dtype still follows model.double() and bf16 weights."""
    from conftest import tiny_model

    model = tiny_model("xl")
    assert [m.state_dtype() for m in model.memories] == [torch.float32] * 2
    model.double()
    assert model.initial_state(2).layers[0]["h"].dtype == torch.float64
    model.to(torch.bfloat16)
    assert model.initial_state(2).layers[0]["h"].dtype == torch.float32  # the policy's floor
    assert "_model_dtype" not in "".join(model.state_dict())  # not saved in checkpoints
