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


def test_also_adds_a_memory_variant_and_a_training_setting_and_refuses_an_unknown_option() -> None:
    configs = gpu.method_configs(["run.data.max_docs=4"])
    rows = gpu.with_variants(configs, ["gated-deltanet:chunk_size=16,train.tf32=true"])
    variant = rows["gated-deltanet[chunk_size=16,train.tf32=true]"]
    assert variant.memory.chunk_size == 16 and variant.train.tf32 is True
    assert configs["gated-deltanet"].train.tf32 is False and configs["gated-deltanet"].memory.chunk_size != 16
    with pytest.raises(SystemExit, match="no option 'train.nope'"):
        gpu.with_variants(configs, ["local:train.nope=1"])


def test_tf32_follows_the_run_config_on_cuda_only() -> None:
    """use_tf32 sets both switches to train.tf32 for a CUDA run and leaves them for a CPU run."""
    from omegaconf import OmegaConf

    from memzoo.runs.configure import use_tf32

    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        use_tf32(OmegaConf.create({"train": {"tf32": True}}), torch.device("cuda"))
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
        use_tf32(OmegaConf.create({"train": {"tf32": False}}), torch.device("cpu"))
        assert torch.backends.cuda.matmul.allow_tf32, "a CPU run must not touch CUDA's switches"
        use_tf32(OmegaConf.create({"train": {"tf32": False}}), torch.device("cuda"))
        assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before
