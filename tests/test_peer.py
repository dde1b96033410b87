"""benchmarks/peers/peer.py: memzoo's side is `memzoo train`'s step, not a loop of its own."""
from __future__ import annotations


import pytest
import torch

from memzoo.runs.configure import build_model
from memzoo.training.train import train

TINY = ["model.d_model=32", "model.n_layers=2", "model.n_heads=2", "model.segment_len=16",
        "train.window_segments=4", "train.batch_size=2", "data.max_docs=20"]


def load_peer():
    import benchmarks.peers.peer as peer
    return peer


@pytest.mark.parametrize("rule", ["delta", "linear"])
def test_memzoo_side_trains_what_memzoo_train_does(tmp_path, rule):
    """One step of the benchmark's memzoo side leaves the weights `train` leaves after its first step."""
    peer = load_peer()
    step, model = peer.memzoo_step(rule, threads=1, overrides=TINY)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    step()
    cfg = peer.memzoo_config(rule, 1, [*TINY, "train.steps=1", f"out_dir={tmp_path}", "name=one"])
    run = train(cfg, evaluate_at_end=False, progress=False)
    trained = build_model(cfg)
    trained.load_state_dict(torch.load(run / "checkpoint.pt", weights_only=True)["model"])
    moved = 0
    for key, value in trained.state_dict().items():
        assert torch.equal(model.state_dict()[key], value), key  # the same ops in the same order: bitwise
        moved += int(not torch.equal(before[key], value))
    assert moved > 0  # the step changed the weights (the comparison is not of two untouched models)
    assert cfg.train.bptt_segments == 2 and cfg.model.segment_len == 16


def test_matmul_flops_counts_what_the_profiler_records() -> None:
    """--breakdown's GFLOP: 2 M K N per product, from the shapes the profiler records for mm, for
    addmm (bias first, scalars last) and for bmm (times the batch)."""
    peer = load_peer()
    assert peer.matmul_flops("aten::mm", [[2048, 256], [256, 1024]]) == 2 * 2048 * 256 * 1024
    assert peer.matmul_flops("aten::addmm", [[1364], [1024, 256], [256, 1364], [], []]) == 2 * 1024 * 256 * 1364
    assert peer.matmul_flops("aten::bmm", [[16, 256, 64], [16, 64, 1]]) == 2 * 16 * 256 * 64


def test_precision_reaches_both_sides_and_the_worker(monkeypatch) -> None:
    """--precision bf16: memzoo's step trains under train.precision=bf16, the port's runs under bf16
    autocast, and each worker process is given the flag."""
    import argparse
    import json
    import warnings

    import memzoo.training.train as train_module

    peer = load_peer()
    seen: list[str] = []
    real = train_module.train_window
    monkeypatch.setattr(train_module, "train_window", lambda *a, **k: seen.append(a[4]) or real(*a, **k))
    step, _ = peer.memzoo_step("linear", threads=1, overrides=TINY, precision="bf16")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # bf16 on a CPU without bf16 units warns that it is slow
        step()
    assert seen == ["bf16"]
    with peer.autocast("bf16"):
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16
    with peer.autocast("fp32"):
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32

    commands: list[list[str]] = []

    def fake_run(cmd, **kwargs):
        commands.append(cmd)
        return argparse.Namespace(stdout=json.dumps({"side": "memzoo", "seconds": [1.0]}) + "\n")

    monkeypatch.setattr(peer.subprocess, "run", fake_run)
    args = argparse.Namespace(rule="delta", steps=1, warmup=0, threads=1, precision="bf16", set=[])
    assert peer.run_side("memzoo", args) == [1.0]
    (cmd,) = commands
    assert cmd[cmd.index("--precision") + 1] == "bf16"
