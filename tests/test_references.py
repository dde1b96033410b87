"""The shipped reference rows: every row's config is the run its suite makes today, `freeze` ships
only such rows, and the tables load from an installed package in any working folder."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from memzoo.core.config import ConfigError
from omegaconf import OmegaConf

from memzoo.training.curriculum import config_hash
from memzoo.suites.compare import expand, load_suite
from memzoo.publishing.references import (DEVICE, HOURS, SHIPPED_SUITES, freeze, hours_label, load_index, load_references, stale_rows,
                                      training_hours)
from memzoo.publishing.scorecard import suite_score


@pytest.mark.parametrize("suite", SHIPPED_SUITES)
def test_every_shipped_row_is_the_run_its_suite_makes(suite: str) -> None:
    """A change to a suite's config (or to a default it inherits) that changes what its runs
    train makes the shipped rows stale: re-run them and freeze again."""
    assert stale_rows(suite) == {}
    rows = load_references(suite)
    if not rows.empty:
        meta = load_index()[suite]
        assert meta["rows"] == len(rows) and sorted(rows["method"].unique()) == meta["methods"]


def test_quick_references_are_shipped_with_controls() -> None:
    rows = load_references("quick")
    assert {"local", "full"} <= set(rows["method"]), "the quick references lack their controls"
    assert rows.groupby("method")["seed"].nunique().min() >= 3


def _fake_results(tmp_path: Path, specs, lr: float | None) -> Path:
    """A suite folder with one finished row per spec; `lr` rewrites the saved config of the first."""
    root = tmp_path / "quick"
    rows = []
    for i, spec in enumerate(specs):
        run = root / "runs" / spec.name
        run.mkdir(parents=True)
        cfg = spec.cfg.copy()
        if i == 0 and lr is not None:
            cfg.train.lr = lr
        (run / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
        rows.append({"name": spec.name, "method": spec.method, "seed": spec.seed, "valid_bpb": 4.0 + i,
                     "run_dir": str(run), "train_tokens": 1000, "train_tokens_per_s": 10.0})
    pd.DataFrame(rows).to_parquet(root / "results.parquet", index=False)
    return root


def test_freeze_ships_matching_rows_and_refuses_a_changed_config(tmp_path: Path) -> None:
    specs = expand(load_suite("quick", ["methods=[local]"]))
    results = _fake_results(tmp_path, specs, lr=0.123)
    out = tmp_path / "refs"
    frozen = freeze(results, "quick", out)
    assert frozen.rows == len(specs) - 1
    assert list(frozen.refused) == [specs[0].name] and "differs" in frozen.refused[specs[0].name]
    shipped = pd.read_parquet(out / "quick.parquet")
    assert "run_dir" not in shipped.columns
    assert set(shipped["config_hash"]) == {config_hash(s.cfg) for s in specs[1:]}
    index = json.loads((out / "index.json").read_text())["quick"]
    assert index["rows"] == len(specs) - 1 and index["methods"] == ["local"]
    # the keys the readers (memzoo references, the scorecard's footer) use: those of the shipped index
    # (rounding_sensitive is written only where a shipped method's card has the mark; local's has none)
    optional = {"rounding_sensitive"}
    assert HOURS in index and "rounding_sensitive" not in index
    assert set(index) - optional == set(load_index()["quick"]) - optional


def _freeze_the_first_run(tmp_path: Path, suite: str):
    """`local`'s runs of `suite` as a finished folder, its first run alone frozen into tmp_path/refs;
    the folder then holds every run again, for a `--add`."""
    specs = expand(load_suite(suite, ["methods=[local]"]))
    results = _fake_results(tmp_path, specs, lr=None)
    out = tmp_path / "refs"
    table = pd.read_parquet(results / "results.parquet")
    table.iloc[:1].to_parquet(results / "results.parquet", index=False)
    assert freeze(results, suite, out).rows == 1
    table.to_parquet(results / "results.parquet", index=False)
    return specs, results, out


def test_freeze_add_keeps_the_shipped_rows_and_refuses_a_shipped_run(tmp_path: Path) -> None:
    specs, results, out = _freeze_the_first_run(tmp_path, "quick")
    frozen = freeze(results, "quick", out, add=True)
    assert frozen.rows == len(specs) and list(frozen.refused) == [specs[0].name]
    assert "already shipped" in frozen.refused[specs[0].name]
    shipped = pd.read_parquet(out / "quick.parquet")
    assert sorted(shipped["name"]) == sorted(s.name for s in specs)
    assert json.loads((out / "index.json").read_text())["quick"]["rows"] == len(specs)


def test_freeze_records_the_device_its_runs_trained_on(tmp_path: Path) -> None:
    """The index names the runs' train.device, so GPU process hours are not read as CPU hours; --add
    keeps the devices of the rows already shipped."""
    specs, results, out = _freeze_the_first_run(tmp_path, "lm-stream-gpu")
    index = json.loads((out / "index.json").read_text())
    assert index["lm-stream-gpu"][DEVICE] == "cuda"
    index["lm-stream-gpu"][DEVICE] = "cpu"  # as if the first rows had come from a CPU
    (out / "index.json").write_text(json.dumps(index))
    assert freeze(results, "lm-stream-gpu", out, add=True).rows == len(specs)
    assert json.loads((out / "index.json").read_text())["lm-stream-gpu"][DEVICE] == "cpu, cuda"


def test_hours_are_labelled_with_the_device() -> None:
    assert hours_label({HOURS: 1.5}) == "1.5 training hours"  # entries from before the key: the CPU
    assert hours_label({HOURS: 1.5, DEVICE: "cpu"}) == "1.5 training hours"
    gpu = hours_label({HOURS: 1.73, DEVICE: "cuda"})
    assert gpu.startswith("1.73 training hours on cuda") and "process hours" in gpu
    assert hours_label({HOURS: 2.0, DEVICE: "auto"}) == "2.0 training hours (train.device auto)"
    assert all(DEVICE in meta for meta in load_index().values())


def test_the_scorecard_has_a_metric_for_every_shipped_suite_from_its_evaluations() -> None:
    """Each shipped suite is ranked by a score its evaluation kinds declare (memzoo.evaluations.registry):
    the bits-per-byte suites after segment 0, quick (its `scorecard` key) on whole documents, capacity by
    recall, distance by recall past its trained gaps; a name no kind declares is an error listing them."""
    scores = {suite: suite_score(suite) for suite in SHIPPED_SUITES}
    assert {s: (v.name, v.higher_is_better) for s, v in scores.items()} == {
        "lm-window": ("bpb_after_segment_0", False), "lm-window-copy": ("bpb_after_segment_0", False),
        "lm-window-rope": ("bpb_after_segment_0", False), "lm-window-rope3": ("bpb_after_segment_0", False),
        "lm-window-pairs": ("bpb_after_segment_0", False), "lm-window-conv": ("bpb_after_segment_0", False),
        "lm-window-conv3": ("bpb_after_segment_0", False), "lm-window-conv4": ("bpb_after_segment_0", False),
        "lm-window-conv5": ("bpb_after_segment_0", False), "lm-window-conv6": ("bpb_after_segment_0", False),
        "lm-stream": ("bpb_after_segment_0", False),
        "lm-stream-sotu": ("bpb_after_segment_0", False), "lm-stream-gpu": ("bpb_after_segment_0", False),
        "quick": ("valid_bpb", False), "capacity-top": ("recall_accuracy", True),
        "distance": ("recall_past_training", True)}
    with pytest.raises(ConfigError, match=r"scorecard='recall_accuracy' is no score of its evaluations; expected one of "
                                          r"\['bpb_after_segment_0', 'valid_bpb'\]"):
        suite_score("quick", ["scorecard=recall_accuracy"])


def test_training_hours_follow_each_run_back_through_its_stages(tmp_path: Path) -> None:
    """A curriculum run's hours include the stages it started from (its init_from chain), each counted once."""
    spec = expand(load_suite("quick", ["methods=[local]"]))[0]

    def stage(name: str, seconds: float, parent: Path | None) -> Path:
        run = tmp_path / name
        run.mkdir()
        cfg = spec.cfg.copy()
        cfg.task.init_from = str(parent) if parent else None
        (run / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
        (run / "result.json").write_text(json.dumps({"train_tokens": 100.0 * seconds, "train_tokens_per_s": 100.0}))
        return run

    c0 = stage("c0", 1800, None)
    a = stage("a", 3600, stage("c1", 1800, c0))
    b = stage("b", 3600, c0)  # shares c0 with a: counted once
    assert training_hours([a]) == 2.0
    assert training_hours([a, b]) == 3.0
    (c0 / "result.json").unlink()
    assert training_hours([a]) is None  # a stage without its result: unknown, not undercounted


def test_config_hash_ignores_folders_but_not_what_is_trained() -> None:
    spec = expand(load_suite("quick", ["methods=[local]"]))[0]
    moved = spec.cfg.copy()
    moved.out_dir, moved.train.threads, moved.train.log_every = "/elsewhere", 7, 3
    assert config_hash(moved) == config_hash(spec.cfg)
    changed = spec.cfg.copy()
    changed.train.steps += 1
    assert config_hash(changed) != config_hash(spec.cfg)


def test_references_load_from_the_installed_package_anywhere(elsewhere) -> None:
    """After `pip install .` the tables are package data: a fresh interpreter in an empty folder
    finds the same rows (the checkout is not on its path)."""
    assert elsewhere["quick_rows"] == len(load_references("quick")) > 0
