"""benchmarks/gpu/titans_speed.py: runs parse into memory options, the bytes saved for backward count each
storage once and no parameter, a run that fails is a row while the others are measured, and without
CUDA a CUDA run says so in one line."""
from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch
from torch import nn

import benchmarks.gpu.titans_speed as ts


def test_parse_run_reads_yaml_scalars_and_names_a_bad_item() -> None:
    assert ts.parse_run("titans-mag:chunk_size=64,compile=default,checkpoint=false") == (
        "titans-mag", {"chunk_size": 64, "compile": "default", "checkpoint": False})
    assert ts.parse_run("local") == ("local", {})
    with pytest.raises(ValueError, match="'chunk_size'"):
        ts.parse_run("titans-mag:chunk_size")


def test_saved_bytes_counts_each_storage_once_and_no_parameter() -> None:
    """tanh(x Wᵀ) then a view of it squared: autograd saves x (for W's gradient), tanh's output (for
    its own backward) and the view (the same storage): x + one output, W excluded."""

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(8, 6, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = torch.tanh(self.lin(x))  # [5, 6]
            return y.view(30).square()

    net, peak = Net(), [0]
    x = torch.randn(5, 8, requires_grad=True)
    with ts.saved_bytes(net, peak):
        net(x).sum().backward()
    assert peak[0] == (5 * 8 + 5 * 6) * 4


def test_a_failing_run_is_a_row_and_the_others_are_measured(tmp_path: Path) -> None:
    tiny = ["run.model.n_layers=1", "run.model.d_model=32", "run.model.n_heads=1", "run.model.segment_len=16",
            "run.train.window_segments=4"]
    assert ts.main(["--device", "cpu", "--batch-size", "1", "--steps", "1", "--out", str(tmp_path), "--set", *tiny,
                    "--runs", "local", "titans-mag:bogus=1", "titans-mag:compile=eager"]) == 0
    rows = list(csv.DictReader(open(tmp_path / "titans_speed.csv")))
    assert [r["run"] for r in rows] == ["local", "titans-mag:bogus=1", "titans-mag:compile=eager"]
    assert rows[0]["status"] == "ok" and float(rows[0]["x_local"]) == 1.0
    assert "bogus" in rows[1]["status"] and rows[1]["status"] != "ok"
    assert rows[2]["status"] == "ok" and 0 < float(rows[2]["x_local"]) and float(rows[2]["saved_mb"]) > 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA path")
def test_cuda_without_cuda_one_line_and_exit_zero(capsys, tmp_path: Path) -> None:
    assert ts.main(["--device", "cuda", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "no CUDA" in out
    assert not any(tmp_path.iterdir())
