"""The memory ablation (`memzoo eval RUN --reset-memory`): the state reset before every segment, so
that what a memory buys is read apart from the weights it trained. `full` with its cache reset is
`local` with full's weights, segment by segment; `local` has nothing to reset."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from memzoo.runs.checkpoints import load_checkpoint, load_run
from memzoo.runs.configure import build_model
from memzoo.evaluations.lm import evaluate_run
from memzoo.cli import main
from memzoo.evaluations.lm import LmEvalConfig, evaluate_folder
from memzoo.training.train import train

from test_train import config  # tests/ is on pytest's path (the small training config every training test uses)


def test_full_with_its_cache_reset_is_local_with_fulls_weights(tmp_path: Path) -> None:
    run = train(config(tmp_path, "full", "name=full", "train.steps=3"), progress=False)
    before = json.loads((run / "result.json").read_text())
    main(["eval", str(run), "--reset-memory"])  # the command a user types
    row = json.loads((run / "result.json").read_text())
    assert {k: v for k, v in row.items() if not k.endswith("_reset")} == before  # the ablation only adds its columns
    assert {"valid_bpb_reset", "valid_bpb_by_segment_reset", "valid_bits_by_doc_copy_beyond_reset"} <= set(row)
    cfg, _ = load_run(run)
    as_local = build_model(config(tmp_path, "local", "name=local", "train.steps=3"))
    as_local.load_state_dict(load_checkpoint(run)["model"])  # full has no parameter of its own
    plain = evaluate_run(cfg, as_local.eval(), progress=False)
    assert row["valid_bpb_by_segment_reset"] == pytest.approx(plain["bpb_by_segment"], rel=1e-6, abs=0)
    assert row["valid_bpb_by_segment_reset"][0] == pytest.approx(before["bpb_by_segment"][0], rel=1e-6)
    later = zip(row["valid_bpb_by_segment_reset"][1:], before["bpb_by_segment"][1:])
    assert any(abs(a - b) > 1e-4 for a, b in later), "with its cache full must read the segments before"


def test_local_has_nothing_to_reset(tmp_path: Path) -> None:
    run = train(config(tmp_path, "local", "name=local", "train.steps=2"), progress=False)
    row = evaluate_folder(run, LmEvalConfig(reset_memory=True), progress=False)[0]
    assert row["valid_bpb_by_segment_reset"] == pytest.approx(row["bpb_by_segment"], rel=1e-9)
    assert (run / "eval-valid-reset.json").is_file()


def test_the_ablation_needs_the_runs_own_evaluation_first(tmp_path: Path) -> None:
    run = train(config(tmp_path, "xl", "name=xl", "train.steps=2"), progress=False, evaluate_at_end=False)
    with pytest.raises(FileNotFoundError, match="has no result.json"):
        evaluate_folder(run, LmEvalConfig(reset_memory=True), progress=False)


def test_a_suite_measures_the_ablation_as_a_stage_and_resumes_it(tmp_path: Path) -> None:
    """`longrange: [{task: memory-ablation}]`: each run's SPLIT_bpb_reset reaches the suite's table, equal
    to the reset evaluation done by hand; a finished ablation is kept, not measured again."""
    from test_compare import write_suite

    from memzoo.suites.compare import load_suite, run_suite
    from memzoo.publishing.report import write_report

    suite = load_suite(str(write_suite(tmp_path, """
        methods: [local, xl]
        seeds: [0]
        token_budget: 768
        jobs: 2   # local and xl side by side
        longrange: [{task: memory-ablation}]
    """)))
    table = run_suite(suite, progress=False).set_index("method")
    runs = tmp_path / "results" / "tiny" / "runs"
    cfg, model = load_run(runs / "xl-s0")
    by_hand = evaluate_run(cfg, model.eval(), progress=False, reset_memory=True)
    assert table.loc["xl", "valid_bpb_reset"] == pytest.approx(by_hand["bpb"], rel=1e-9)
    assert abs(table.loc["xl", "valid_bpb_reset"] - table.loc["xl", "valid_bpb"]) > 1e-4  # XL reads its cache
    assert table.loc["local", "valid_bpb_reset"] == pytest.approx(table.loc["local", "valid_bpb"], rel=1e-9)

    row = json.loads((runs / "xl-s0" / "result.json").read_text())
    buys = [(sum(b * t for b, t in zip(row[key][1:], row["tokens_by_segment"][1:])) / sum(row["tokens_by_segment"][1:]))
            for key in ("valid_bpb_by_segment_reset", "bpb_by_segment")]  # bits per byte on segments >= 1
    md, _ = write_report(tmp_path / "results" / "tiny")
    section = md.read_text().split("## What each memory buys: its state reset before every segment, minus read")[1]
    assert f"| xl | 1 | {buys[0] - buys[1]:+.3f} |" in section and "| local | 1 | +0.000 |" in section

    stamp = (runs / "xl-s0" / "eval-valid-reset.json").stat().st_mtime_ns
    (runs / "xl-s0" / "longrange-done.json").unlink()
    run_suite(suite, progress=False)
    assert (runs / "xl-s0" / "eval-valid-reset.json").stat().st_mtime_ns == stamp, "a done ablation was measured again"
    assert (runs / "xl-s0" / "longrange-done.json").is_file()
