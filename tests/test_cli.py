"""The command line: catalogue, footprint at the paper's setting, and errors that name the problem."""
from __future__ import annotations

import json
import sys

from memzoo.cli import main


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_list_json_has_every_card_and_the_implemented_flag(capsys) -> None:
    code, out, _ = run(capsys, "list", "--json")
    assert code == 0
    rows = {r["name"]: r for r in json.loads(out)}
    for name in ("infini-linear", "infini-delta", "xl", "compressive", "memorizing", "rmt", "infty-former", "local", "full"):
        assert name in rows, name
        assert {"name", "paper", "footprint_formula", "implemented"} <= set(rows[name])
    assert rows["infini-linear"]["implemented"] is True
    assert "2404.07143" in rows["infini-linear"]["paper"]


def test_footprint_table1_infini_is_the_papers_count(capsys) -> None:
    code, out, _ = run(capsys, "footprint", "paper/table1", "--json", "--no-measure")
    assert code == 0
    rows = {r["method"]: r for r in json.loads(out)}
    for name in ("infini-linear", "infini-delta"):
        assert rows[name]["analytic"] == 1_585_152
        assert rows[name]["card"] == 1_585_152


def test_footprint_measures_a_real_state(capsys) -> None:
    code, out, _ = run(capsys, "footprint", "infini-delta", "--json", "model.n_layers=2", "model.segment_len=16")
    assert code == 0
    (row,) = json.loads(out)
    assert row["measured"] == row["analytic"] == row["card"] == 32 * 33 * 4 * 2


def test_unknown_method_is_an_error_listing_registered(capsys) -> None:
    code, _, err = run(capsys, "train", "infini-linear", "memory.name=infini-quadratic")
    assert code == 2
    assert "infini-quadratic" in err and "infini-linear" in err and "local" in err


def test_unknown_config_key_names_the_key(capsys) -> None:
    code, _, err = run(capsys, "train", "infini-linear", "train.stepz=3")
    assert code == 2 and "train.stepz" in err
    code, _, err = run(capsys, "train", "infini-linear", "memory.rulez=delta")
    assert code == 2 and "rulez" in err


def test_wrong_type_names_the_key(capsys) -> None:
    code, _, err = run(capsys, "footprint", "infini-linear", "model.n_layers=many")
    assert code == 2 and "model.n_layers" in err


def test_unknown_preset_lists_presets(capsys) -> None:
    code, _, err = run(capsys, "train", "no-such-preset")
    assert code == 2 and "infini-linear" in err


def test_console_script_is_installed(elsewhere) -> None:
    assert "infini-delta" in elsewhere["listed"]  # `memzoo list` through the console script, in an empty folder


TINY_TRAIN = ["model.d_model=32", "model.n_layers=2", "model.n_heads=2", "model.segment_len=16", "train.steps=2",
              "train.batch_size=2", "train.window_segments=2", "train.bptt_segments=2", "train.warmup_steps=1",
              "data.max_docs=20", "eval.max_docs=2", "eval.max_segments_per_doc=2", "eval.batch_size=2"]


def test_an_empty_data_folder_is_one_line_naming_the_key(capsys, tmp_path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    code, _, err = run(capsys, "train", "local", *TINY_TRAIN, f"data.source={empty}", f"out_dir={tmp_path}")
    assert code == 2 and err.count("\n") == 1 and err.startswith("memzoo: error: data.source=")
    assert "Traceback" not in err and "data.min_doc_bytes" in err


def test_a_damaged_checkpoint_is_one_line_and_loses_nothing(capsys, tmp_path) -> None:
    args = ("train", "local", *TINY_TRAIN, f"out_dir={tmp_path}", "name=r")
    assert run(capsys, *args)[0] == 0
    ckpt = tmp_path / "r" / "checkpoint.pt"
    ckpt.write_bytes(ckpt.read_bytes()[:300])  # truncated, as by a full disk
    before = {p.name: p.read_bytes() for p in (tmp_path / "r").iterdir()}
    code, _, err = run(capsys, *args[:-1], "train.steps=3", "name=r")
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert "checkpoint.pt cannot be read" in err and "move it aside" in err
    assert {p.name: p.read_bytes() for p in (tmp_path / "r").iterdir()} == before  # nothing lost or rewritten


def test_evaluation_runs_where_the_run_trained_unless_device_says(capsys, tmp_path, monkeypatch) -> None:
    """eval (and every evaluation command, through one helper) runs on the run's train.device, says where
    on stderr, falls back to the CPU for a run trained on CUDA on a machine without, and --device wins."""
    import pytest
    import torch

    from memzoo.runs.checkpoints import EVAL_DEVICE_ENV

    if torch.cuda.is_available():
        pytest.skip("the fallback is checked on a machine without CUDA")
    monkeypatch.delenv(EVAL_DEVICE_ENV, raising=False)  # restored after: --device sets it for the workers
    assert run(capsys, "train", "local", *TINY_TRAIN, f"out_dir={tmp_path}", "name=r", "train.device=cpu")[0] == 0
    run_dir = str(tmp_path / "r")
    code, out, err = run(capsys, "eval", run_dir, "--json")
    assert code == 0 and err.splitlines()[0] == "memzoo eval: evaluating on cpu (the run's train.device=cpu)"
    bpb = json.loads(out)["valid_bpb"]

    config = tmp_path / "r" / "config.yaml"
    config.write_text(config.read_text().replace("device: cpu", "device: cuda"))
    code, out, err = run(capsys, "eval", run_dir, "--json")
    assert code == 0 and json.loads(out)["valid_bpb"] == bpb
    assert err.splitlines()[0] == "memzoo eval: evaluating on cpu (the run trained on train.device=cuda; no CUDA device here, so the CPU)"

    code, _, err = run(capsys, "eval", run_dir, "--device", "cuda")
    assert code == 2 and err == "memzoo: error: --device='cuda' but no CUDA device is available; use 'cpu' or 'auto'\n"
    code, _, err = run(capsys, "generate", run_dir, "--prompt", "ab", "--max-new-tokens", "2", "--device", "cpu")
    assert code == 0 and err.splitlines()[0] == "memzoo generate: evaluating on cpu (--device cpu)"
    import os

    assert os.environ[EVAL_DEVICE_ENV] == "cpu"  # what isolated passkey/recall/babilong workers load with
