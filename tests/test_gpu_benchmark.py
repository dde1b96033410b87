"""benchmarks/gpu/gpu.py: its FLOP count equals what torch's FLOP counter measures for the matrix
multiplies, and without CUDA it says so in one line and exits 0."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from conftest import tiny_model

import benchmarks.gpu.gpu as gpu


def counted_flops(method: str) -> tuple[int, int]:
    """(FLOPs torch's counter sees in one forward + backward on CPU, the benchmark's matmul count)."""
    model = tiny_model(method)
    model.train()
    x = torch.randint(0, 256, (2, 3, 8), generator=torch.Generator().manual_seed(0))
    with FlopCounterMode(display=False) as counter:
        model(x).logits.float().sum().backward()
    return counter.get_total_flops(), gpu.matmul_flops_per_token(model) * x.numel()


@pytest.mark.parametrize("method", ["local", "full"])
def test_matmul_flops_per_token_match_the_flop_counter(method: str) -> None:
    """On CPU the counter does not see sdpa, only the matrix multiplies: 6 x the Linear weights
    (the tied head included) per token must be exactly what it counts."""
    counted, ours = counted_flops(method)
    assert counted == ours


def test_memory_reads_are_not_in_the_model_flops() -> None:
    """Infini's memory read and write (einsums over M) are extra work the model-FLOP count leaves out."""
    counted, ours = counted_flops("infini-linear")
    assert counted > ours


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA path")
def test_without_cuda_one_line_and_exit_zero(capsys, tmp_path: Path) -> None:
    assert gpu.main(["--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "no CUDA" in out
    assert not any(tmp_path.iterdir())


def test_kernels_option_times_each_deltanet_path_once_and_leaves_the_others() -> None:
    configs = gpu.method_configs(["run.data.max_docs=4"])
    variants = gpu.with_kernels(configs, ["torch", "fla"])
    assert "gated-deltanet" not in variants and variants["gated-deltanet[fla]"].memory.kernel == "fla"
    assert variants["deltanet[torch]"].memory.kernel == "torch" and configs["deltanet"].memory.kernel == "auto"
    assert variants["local"] is configs["local"] and len(variants) == len(configs) + 2
    assert list(gpu.with_kernels(configs, ["auto"])) == list(configs)
    with pytest.raises(SystemExit, match="'triton'"):
        gpu.with_kernels(configs, ["triton"])
