"""One run over two CPU processes (torchrun, gloo, DDP) against the same run in one process: the
same losses and weights, and a rank killed mid-run resumes on every rank from the last checkpoint."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import torch

from memzoo.data.corpus import load_documents, split_documents
from memzoo.data.samplers import WindowSampler
from memzoo.runs.checkpoints import load_checkpoint
from memzoo.runs.configure import load_config
from memzoo.runs.distributed import DistInfo, shard_rows
from memzoo.training.train import train

STEPS = 4
OVERRIDES = [
    "model.d_model=32", "model.n_layers=2", "model.n_heads=2", "model.segment_len=16",
    f"train.steps={STEPS}", "train.batch_size=4", "train.window_segments=4", "train.bptt_segments=2",
    "train.warmup_steps=1", "train.checkpoint_every=1", "train.log_every=1", "train.threads=1", "train.device=cpu",
    "eval.max_docs=2", "eval.max_segments_per_doc=2", "eval.batch_size=2",
]
# Two processes sum the same numbers in another order: losses agree to float32 rounding.
LOSS_RTOL, WEIGHT_ATOL = 1e-5, 1e-5

KILLER = """
import os, signal, sys
from memzoo.runs.configure import load_config
from memzoo.training.train import train

def die(step):  # rank 0 dies at step 2, after that step's checkpoint; torchrun then stops rank 1
    if step == 2 and os.environ["RANK"] == "0":
        os.kill(os.getpid(), signal.SIGKILL)

train(load_config("infini-delta", sys.argv[1:]), on_step=die, progress=False)
"""


def torchrun(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", *args]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=240)


def short_documents(root: Path) -> list[str]:
    """40 documents of 40 to 200 bytes (cut from this file): rows often cross a document's end, so
    the ranks' rows hold different numbers of targets."""
    text = Path(__file__).read_bytes()
    (root / "corpus").mkdir()
    for i in range(40):
        (root / "corpus" / f"doc{i:02d}.txt").write_bytes(text[i * 50 : i * 50 + 40 + (i * 37) % 160])
    return [f"data.source={root / 'corpus'}", "data.min_doc_bytes=16"]


def test_rank_rows_differ_in_target_count(tmp_path: Path) -> None:
    """The check below is only sharp if the ranks' rows hold different numbers of targets (so a
    per-rank mean would weight them wrongly): true for these batches."""
    cfg = load_config("infini-delta", [*OVERRIDES, *short_documents(tmp_path)])
    sampler = WindowSampler(split_documents(load_documents(cfg.data), cfg.data)["train"], 16, 0)
    counts = []
    for step in range(STEPS):
        batch = sampler.sample(step, 4, 4)
        counts.append([int(shard_rows(batch, DistInfo(r, 2)).mask.sum()) for r in (0, 1)])
        halves = torch.cat([shard_rows(batch, DistInfo(r, 2)).tokens for r in (0, 1)])
        assert torch.equal(halves, batch.tokens)  # the ranks' rows are the global batch, in order
    assert any(a != b for a, b in counts), counts


def test_two_processes_match_one_and_resume_after_a_kill(tmp_path: Path) -> None:
    data = short_documents(tmp_path)
    one = train(load_config("infini-delta", [*OVERRIDES, *data, f"out_dir={tmp_path}", "name=one"]), progress=False)

    run = [*OVERRIDES, *data, f"out_dir={tmp_path}", "name=two"]
    (tmp_path / "killer.py").write_text(textwrap.dedent(KILLER))
    killed = torchrun([str(tmp_path / "killer.py"), *run], tmp_path)
    assert killed.returncode != 0, killed.stderr[-2000:]
    two = tmp_path / "two"
    assert load_checkpoint(two)["step"] == 2 and not (two / "result.json").exists()

    resumed = torchrun(["-m", "memzoo", "train", "infini-delta", *run], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]

    rows = [json.loads(line) for line in (two / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))  # resumed at 3, not restarted at 1
    ref = [json.loads(line) for line in (one / "metrics.jsonl").read_text().splitlines()]
    for a, b in zip(rows, ref):
        assert abs(a["train_bpb"] - b["train_bpb"]) <= LOSS_RTOL * b["train_bpb"], (a, b)
        assert abs(a["grad_norm"] - b["grad_norm"]) <= LOSS_RTOL * b["grad_norm"], (a, b)
    w1, w2 = load_checkpoint(one)["model"], load_checkpoint(two)["model"]
    assert load_checkpoint(two)["step"] == STEPS
    for key in w1:
        assert torch.allclose(w1[key], w2[key], atol=WEIGHT_ATOL, rtol=0), key
    assert resumed.stdout.count("run folder:") == 1  # only rank 0 reports (and writes) the run
    assert json.loads((two / "result.json").read_text())["valid_bpb"] > 0
