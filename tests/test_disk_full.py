"""A full disk: a write of a run or a suite that runs out of space is one `memzoo: error:` line naming
the folder, what was being written and the space left; the previous checkpoint stays whole, no
temporary file is left behind, and the same command run again resumes from that checkpoint."""
from __future__ import annotations

import errno
import os
import re
import shutil
import subprocess
import textwrap
from pathlib import Path

import pandas as pd
import pytest
import torch

from conftest import spy_train
from memzoo.cli import main
from memzoo.runs.checkpoints import load_checkpoint

TINY = ["model.d_model=32", "model.n_layers=2", "model.n_heads=2", "model.segment_len=16", "train.batch_size=2",
        "train.window_segments=2", "train.bptt_segments=2", "train.warmup_steps=1", "train.checkpoint_every=2",
        "train.log_every=1", "data.max_docs=20", "eval.max_docs=2", "eval.max_segments_per_doc=2", "eval.batch_size=2"]
# What torch.save raises when its file takes fewer bytes than it wrote (no errno reaches Python).
TORCH_SHORT_WRITE = "[enforce fail at inline_container.cc:672] . unexpected pos 6192000 vs 6191892"


def train_args(out: Path, steps: int) -> list[str]:
    return ["train", "local", *TINY, f"out_dir={out}", "name=r", f"train.steps={steps}"]


def one_error_line(capsys) -> str:
    """The one line memzoo printed on stderr (beside progress bars and a suite's per-run progress lines)."""
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("memzoo")]
    assert len(lines) == 1 and lines[0].startswith("memzoo: error: no space left"), err
    assert "Traceback" not in err, err
    return lines[0]


def test_a_full_disk_while_checkpointing_keeps_the_checkpoint_and_the_rerun_resumes(tmp_path, capsys, monkeypatch) -> None:
    assert main(train_args(tmp_path, 2)) == 0
    run = tmp_path / "r"
    before = (run / "checkpoint.pt").read_bytes()
    capsys.readouterr()

    real_save = torch.save

    def short_write(obj, f, *args, **kwargs) -> None:  # the first 4 KiB fit, then the disk is full
        Path(f).write_bytes(b"\0" * 4096)
        raise RuntimeError(TORCH_SHORT_WRITE)

    monkeypatch.setattr(torch, "save", short_write)
    assert main(train_args(tmp_path, 4)) == 2
    line = one_error_line(capsys)
    assert f"the checkpoint (checkpoint.pt) in {run} (" in line and " free when it failed" in line
    assert "4.0 KiB of it written, then removed" in line
    assert (run / "checkpoint.pt").read_bytes() == before  # the step-2 checkpoint, whole
    assert not list(tmp_path.rglob("*.tmp")) and not (run / "lock").exists()

    monkeypatch.setattr(torch, "save", real_save)  # space freed
    calls: list = []
    spy_train(monkeypatch, calls)
    assert main(train_args(tmp_path, 4)) == 0
    assert calls == [("r", 3)]  # resumed after the kept checkpoint's 2 steps, not started again
    assert load_checkpoint(run)["step"] == 4


def test_a_full_disk_while_writing_the_result_row_keeps_the_previous_row(tmp_path, capsys, monkeypatch) -> None:
    assert main(train_args(tmp_path, 2)) == 0
    run = tmp_path / "r"
    before = (run / "result.json").read_text()
    capsys.readouterr()

    real_write = Path.write_text

    def no_space(self: Path, text: str, *args, **kwargs) -> int:  # half of the row fits, then ENOSPC
        if self.name != "result.json.tmp":
            return real_write(self, text, *args, **kwargs)
        real_write(self, text[: len(text) // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(Path, "write_text", no_space)
    assert main(train_args(tmp_path, 4)) == 2
    line = one_error_line(capsys)
    assert f"the result row (result.json) in {run} (" in line and " free when it failed" in line
    assert (run / "result.json").read_text() == before
    assert not list(tmp_path.rglob("*.tmp")) and not (run / "lock").exists()

    monkeypatch.setattr(Path, "write_text", real_write)
    assert main(train_args(tmp_path, 4)) == 0
    assert '"train_steps": 4' in (run / "result.json").read_text()


FULL_DISK_PLUGIN = '''
"""Fill the disk under the run folder that $MEMZOO_TEST_FULL_RUN names: its checkpoints are cut short."""
import os
import torch

_save = torch.save


def _short_write(obj, f, *args, **kwargs):
    if os.environ.get("MEMZOO_TEST_FULL_RUN") and f"/{os.environ['MEMZOO_TEST_FULL_RUN']}/" in str(f):
        with open(f, "wb") as out:
            out.write(bytes(1000))
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 1000 vs 512")
    return _save(obj, f, *args, **kwargs)


torch.save = _short_write
'''


def test_a_full_disk_stops_a_suite_in_one_line_keeping_the_finished_rows(tmp_path, capsys, monkeypatch) -> None:
    plugin = tmp_path / "full_disk.py"
    plugin.write_text(FULL_DISK_PLUGIN)
    suite = tmp_path / "tiny.yaml"
    suite.write_text(f"name: tiny\nbase: small\nout_dir: {tmp_path / 'results'}\n" + textwrap.dedent(f"""
        methods: [local]
        seeds: [0, 1, 2]
        token_budget: 512
        jobs: 1
        threads_per_job: 1
        imports: [{plugin}]
        run:
          model: {{d_model: 32, n_layers: 2, n_heads: 2, segment_len: 16}}
          data: {{max_docs: 40}}
          train: {{batch_size: 2, window_segments: 4, bptt_segments: 2, warmup_steps: 2, checkpoint_every: 2, log_every: 2}}
          eval: {{batch_size: 2, max_docs: 2, max_segments_per_doc: 2}}
    """))
    monkeypatch.setenv("MEMZOO_TEST_FULL_RUN", "local-s1")  # the workers inherit it
    assert main(["compare", str(suite), "--no-report"]) == 2
    line = one_error_line(capsys)
    runs = tmp_path / "results" / "tiny" / "runs"
    assert f"the checkpoint (checkpoint.pt) in {runs / 'local-s1'} (" in line and " free when it failed" in line
    assert "the suite stopped: 1 run(s) failed, 1 not started" in line
    table = pd.read_parquet(tmp_path / "results" / "tiny" / "results.parquet")
    assert list(table["name"]) == ["local-s0"]  # the finished run's row is kept
    assert not (runs / "local-s2").exists()  # a full disk fails every later run too: not started
    assert not list((tmp_path / "results").rglob("*.tmp")) and not list(runs.rglob("lock"))


@pytest.fixture
def small_disk(tmp_path: Path):
    """A real 6 MiB file system (a tmpfs, mounted as root); skipped where mounting is not permitted."""
    where = tmp_path / "disk"
    where.mkdir()
    if shutil.which("mount") is None or os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root and mount(8)")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(where)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def test_a_real_full_disk_is_one_line_and_the_rerun_resumes(small_disk: Path, capsys, monkeypatch) -> None:
    assert main(train_args(small_disk, 2)) == 0
    run = small_disk / "r"
    before = (run / "checkpoint.pt").read_bytes()
    filler = small_disk / "filler"
    free = shutil.disk_usage(small_disk).free
    filler.write_bytes(bytes(free - len(before) // 2))  # room for the metrics, not for another checkpoint
    capsys.readouterr()

    assert main(train_args(small_disk, 4)) == 2
    line = one_error_line(capsys)
    assert f"the checkpoint (checkpoint.pt) in {run} (" in line
    assert re.search(r"\((\d+ B|[\d.]+ KiB) free when it failed", line), line  # the small disk's space, not another's
    assert (run / "checkpoint.pt").read_bytes() == before
    assert not list(small_disk.rglob("*.tmp")) and not (run / "lock").exists()

    filler.unlink()
    calls: list = []
    spy_train(monkeypatch, calls)
    assert main(train_args(small_disk, 4)) == 0
    assert calls == [("r", 3)] and load_checkpoint(run)["step"] == 4
