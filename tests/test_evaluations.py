"""The evaluation registry (memzoo.evaluations.registry): every kind registered once with a config,
a run function, its table columns and its command, which the suites and the CLI read; and the
worked example of docs/evaluations.md, run as printed."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from memzoo.cli import build_parser, main
from memzoo.core.config import ConfigError
from memzoo.runs.configure import load_config
from memzoo.evaluations.registry import (Evaluation, evaluation_config, evaluations, get_evaluation, register_evaluation,
                                        run_evaluation, table_columns, unregister_evaluation)
from memzoo.training.train import train
from memzoo.suites.results import result_row

ROOT = Path(__file__).resolve().parent.parent
TINY = ["model.d_model=32", "model.n_layers=2", "model.n_heads=2", "model.segment_len=16", "train.batch_size=2",
        "train.window_segments=2", "train.bptt_segments=1", "train.warmup_steps=1", "eval.max_docs=2",
        "eval.max_segments_per_doc=2", "data.max_docs=30", "train.steps=2"]


def test_every_kind_is_registered_once_with_its_config_and_command() -> None:
    known = evaluations()
    assert list(known)[:6] == ["lm", "memory-ablation", "passkey", "recall", "distance", "babilong"]
    for name, evaluation in known.items():
        assert evaluation.config(task=name).task == name, f"{name}: its config does not take its own name"
    for command in {e.command.name or e.name for e in known.values() if e.command}:
        with pytest.raises(SystemExit) as done:  # --help exits 0 for a command the parser has, 2 for an unknown one
            build_parser().parse_args([command, "--help"])
        assert done.value.code == 0, command


def test_a_longrange_entry_is_its_kinds_config_and_a_bad_one_is_named() -> None:
    assert type(evaluation_config({"task": "distance", "gaps": [1, 2]})).__name__ == "DistanceConfig"
    assert evaluation_config({"lengths": [4096]}).task == "passkey"  # no task: passkey, as before the registry
    with pytest.raises(ConfigError, match="task='nope' is not registered; registered: lm, memory-ablation, passkey, recall"):
        evaluation_config({"task": "nope"})
    with pytest.raises(ConfigError, match="task='lm' runs at the end of training"):
        evaluation_config({"task": "lm"})
    with pytest.raises(ValueError, match="gaps=\\[0\\]"):
        evaluation_config({"task": "distance", "gaps": [0]})


def test_table_columns_of_every_kind() -> None:
    row = table_columns({"bpb_by_segment": [2.0, 1.5], "gates": {"0": [0.5]}, "passkey": [{"length": 4}],
                         "distance": [{"gap_segments": 1}], "valid_bpb": 1.7})
    assert row == {"bpb_by_segment": [2.0, 1.5], "bpb_seg_0": 2.0, "bpb_seg_1": 1.5, "gates_json": '{"0": [0.5]}',
                   "passkey_json": '[{"length": 4}]', "distance_json": '[{"gap_segments": 1}]', "valid_bpb": 1.7}


def test_a_name_another_module_registered_is_refused() -> None:
    passkey = get_evaluation("passkey")
    with pytest.raises(ConfigError, match="'passkey' is registered twice"):
        register_evaluation(Evaluation("passkey", passkey.config, lambda *a, **k: [], module="elsewhere"))
    assert get_evaluation("passkey") is passkey


def example_code() -> str:
    page = (ROOT / "docs" / "evaluations.md").read_text()
    return re.search(r"## A worked example.*?```python\n(.*?)```", page, flags=re.S).group(1)


@pytest.fixture(scope="module")
def copy_kind(tmp_path_factory):
    """The page's example as a file, imported as a suite's `imports:` imports it; its kind removed afterwards."""
    from memzoo.suites.suite_plugins import import_plugins

    path = tmp_path_factory.mktemp("example") / "copy_eval.py"
    path.write_text(example_code())
    import_plugins([str(path)])
    yield get_evaluation("copy").run.__globals__  # the module's namespace
    unregister_evaluation("copy")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    return train(load_config("local", TINY + ["name=tiny", f"out_dir={tmp_path_factory.mktemp('runs')}"]),
                 progress=False)


class Copier:
    """Stands in for StreamingDecoder with a perfect copy: at each position it predicts the byte one
    copy back of the next one, so a correct example scores 1.0 (one reading the wrong positions would not)."""

    length = 0

    def __init__(self, model, batch_size, segments_per_call=8, precision="fp32"):
        self.seen = torch.zeros(batch_size, 0, dtype=torch.long)

    def feed(self, tokens, return_logits=False):
        self.seen = torch.cat([self.seen, tokens], 1)
        logits = torch.zeros(*tokens.shape, 256)
        for p in range(self.seen.shape[1] - tokens.shape[1], self.seen.shape[1]):
            if p + 1 >= self.length and p + 1 - self.length < self.seen.shape[1]:
                logits[:, p - (self.seen.shape[1] - tokens.shape[1])].scatter_(1, self.seen[:, p + 1 - self.length, None], 1.0)
        return logits


FRESH_PROCESS = """
import sys
from memzoo.cli import main
try:
    main(["copy", sys.argv[1]])
except SystemExit as stop:
    print(f"without --import: exit {stop.code}", file=sys.stderr)
sys.exit(main(["--import", sys.argv[2], "copy", sys.argv[1], "--length", "40", "--trials", "3", "--json"]))
"""


def test_the_worked_example_runs_through_a_suite_stage_the_table_and_the_cli(copy_kind, run_dir, capsys,
                                                                            monkeypatch) -> None:
    assert list(evaluations())[-1] == "copy"
    from memzoo.suites.compare import load_suite, longrange_configs  # a suite's entry, with the runner's threads

    suite = load_suite("quick", ["longrange=[{task: copy, length: 8}]"])
    assert [(c.task, c.length, c.trials) for c in longrange_configs(suite, threads=2)] == [("copy", 8, 4)]
    rows = run_evaluation(run_dir, {"task": "copy", "length": 40, "trials": 3})  # a suite's `longrange:` entry
    assert len(rows) == 1 and 0.0 <= rows[0]["accuracy"] <= 1.0 and rows[0]["trials"] == 3
    assert json.loads((run_dir / "copy.json").read_text()) == rows
    row = result_row(run_dir)
    assert json.loads(row["copy_json"]) == rows and "copy" not in row
    assert row["valid_bpb"] > 0  # the training's own columns stay

    parser = build_parser()  # the command the kind registered
    assert parser.parse_args(["copy", str(run_dir), "--length", "8"]).evaluation == "copy"
    assert main(["copy", str(run_dir), "--length", "40", "--trials", "3", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == rows
    assert main(["copy", str(run_dir), "--length", "0"]) == 2
    assert "copy length=0, trials=4; expected both >= 1" in capsys.readouterr().err

    from memzoo.publishing.report import write_report  # the kind's own report section and figure

    pd.DataFrame([row]).to_parquet(run_dir.parent / "results.parquet")
    md, _ = write_report(run_dir.parent)
    text = md.read_text()
    assert "## Copying: next-byte accuracy over the second copy (mean over seeds)" in text
    assert "| local | 40 | " in text and "## Copying: accuracy over the second copy, per method" in text
    assert (run_dir.parent / "copy.png").is_file() and "![copy](copy.png)" in text

    # A fresh process (one start: each costs seconds): the command is unknown there, then exists through --import.
    out = subprocess.run([sys.executable, "-c", FRESH_PROCESS, str(run_dir), copy_kind["__file__"]], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "without --import: exit 2" in out.stderr and "invalid choice: 'copy'" in out.stderr
    assert json.loads(out.stdout)[0]["accuracy"] == rows[0]["accuracy"]

    from memzoo.publishing.scorecard import suite_score  # the kind's scorecard metric ranks a suite that runs it

    score = suite_score("quick", ["longrange=[{task: copy, length: 8}]", "scorecard=null"])
    assert (score.name, score.higher_is_better) == ("copy_accuracy", True)
    assert score.of_row(pd.Series(row)) == rows[0]["accuracy"]

    monkeypatch.setattr(Copier, "length", 24)
    monkeypatch.setitem(copy_kind, "StreamingDecoder", Copier)
    (perfect,) = run_evaluation(run_dir, {"task": "copy", "length": 24, "trials": 2})
    assert perfect["accuracy"] == 1.0


def test_an_installed_packages_kind_registers_through_its_entry_point(monkeypatch) -> None:
    """The memzoo.evaluations entry point's module is imported (its kind then has a command), and one that
    fails to import is an error naming the entry point."""
    from importlib import metadata

    from memzoo.evaluations.registry import load_entry_points

    class Point:
        def __init__(self, name: str, load) -> None:
            self.name, self.value, self.load = name, f"pkg.{name}", load

    def good():
        register_evaluation(Evaluation("entry-kind", get_evaluation("passkey").config, lambda *a, **k: [], module="pkg.good"))

    def bad():
        raise ImportError("no module named pkg.bad")

    seen = []
    monkeypatch.setattr(metadata, "entry_points", lambda group: seen.append(group) or [Point("good", good)])
    try:
        load_entry_points(again=True)
        assert seen == ["memzoo.evaluations"] and "entry-kind" in evaluations()
    finally:
        unregister_evaluation("entry-kind")
    monkeypatch.setattr(metadata, "entry_points", lambda group: [Point("bad", bad)])
    with pytest.raises(ConfigError, match="entry point 'bad' \\(pkg.bad\\) failed to import: ImportError"):
        load_entry_points(again=True)


def test_the_registry_names_the_evaluation_that_ends_training() -> None:
    """Recall across segments ends with capacity, any other run with lm; two kinds claiming one run is an error."""
    from omegaconf import OmegaConf

    from memzoo.evaluations.registry import end_of_training

    recall = OmegaConf.create({"task": {"name": "recall", "gap_segments": 2}})
    assert end_of_training(recall).name == "capacity"
    assert end_of_training(OmegaConf.create({"task": {"name": "recall", "gap_segments": 0}})).name == "lm"
    assert end_of_training(OmegaConf.create({"task": {"name": "lm", "gap_segments": 0}})).name == "lm"
    register_evaluation(Evaluation("greedy", get_evaluation("passkey").config, lambda *a, **k: [], module="x",
                                   ends_training=lambda cfg: True, finish=lambda *a: {}))
    try:
        with pytest.raises(ConfigError, match="all claim to end this run's training"):
            end_of_training(recall)
    finally:
        unregister_evaluation("greedy")


def test_each_kind_declares_its_part_of_the_report_and_may_replace_another(tmp_path: Path) -> None:
    """The report asks the registry which kinds a results table holds (`holds`) and shows each one's
    notes and sections, less those of a kind another replaces: a throwaway kind that holds capacity rows
    and replaces `capacity` takes its place, and the capacity part returns when it is gone."""
    from memzoo.evaluations.registry import reported
    from memzoo.publishing.report import write_report
    from test_stats import capacity_rows

    capacity_rows().to_parquet(tmp_path / "results.parquet")
    assert list(reported(capacity_rows())) == ["capacity"]
    register_evaluation(Evaluation(
        "probe-kind", get_evaluation("passkey").config, lambda *a, **k: [], module="tests",
        holds=lambda df: "recall_accuracy" in df, replaces=("capacity",), notes=lambda df: ["probe: its note."],
        section=lambda df: [("Probe: its section", pd.DataFrame({"method": ["xl"], "accuracy": [0.5]}))]))
    try:
        assert list(reported(capacity_rows())) == ["probe-kind"]
        text = write_report(tmp_path, figures=False)[0].read_text()
        assert "- probe: its note." in text and "## Probe: its section" in text and "| xl | 0.500 |" in text
        assert "Capacity:" not in text and "- capacity:" not in text
    finally:
        unregister_evaluation("probe-kind")
    text = write_report(tmp_path, figures=False)[0].read_text()
    assert "## Capacity: accuracy by method and state (best lr per cell)" in text and "- capacity:" in text
