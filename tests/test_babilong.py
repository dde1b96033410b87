"""BABILong evaluation: the reader on fixtures in the released schema that the tests write, both
scorers rule by rule, streaming within --segments-per-call, the reset ablation on a hand-built model
whose only route to the answer is its state, resuming, the CLI and the offline hub error."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
import torch
from torch import nn

os.environ["HF_DATASETS_OFFLINE"] = "1"  # before datasets is imported: no test may touch the network
os.environ["HF_HUB_OFFLINE"] = "1"

import memzoo.evaluations.babilong as babilong  # noqa: E402
from memzoo.core.config import ConfigError, to_yaml  # noqa: E402
from memzoo.data.babilong import Sample, label_chance, read_samples, score_exact, score_official  # noqa: E402
from memzoo.evaluations.babilong import BabilongConfig, evaluate_babilong, evaluate_cell  # noqa: E402

ROWS = [
    {"input": "Mary went to the kitchen. Some text.", "question": "Where is Mary?", "target": "kitchen"},
    {"input": "John took the milk. John went to the garden.", "question": "Where is the milk?", "target": "garden"},
]
QA5 = {"input": "Fred gave the football to Jeff.", "question": "Who gave the football to Jeff?", "target": "Fred"}


def write_fixture(root: Path) -> Path:
    """The released schema in the three local layouts: a JSON list, JSON lines, hub parquet shards."""
    (root / "1k").mkdir(parents=True)
    (root / "1k" / "qa1.json").write_text(json.dumps(ROWS))
    (root / "1k" / "qa5.jsonl").write_text(json.dumps(QA5) + "\n" + json.dumps({**QA5, "extra": 1}) + "\n")
    (root / "qa2").mkdir()
    pd.DataFrame(ROWS).to_parquet(root / "qa2" / "0k-00000-of-00001.parquet")  # RMT-team/babilong's layout
    return root


def test_the_reader_takes_every_local_layout(tmp_path: Path) -> None:
    root = write_fixture(tmp_path / "data")
    assert read_samples(str(root), "qa1", "1k") == [Sample(**r) for r in ROWS]
    assert read_samples(str(root), "qa5", "1k", limit=1) == [Sample(**QA5)]
    assert read_samples(str(root), "qa2", "0k") == [Sample(**r) for r in ROWS]
    with pytest.raises(FileNotFoundError, match="no qa3 samples of length 1k"):
        read_samples(str(root), "qa3", "1k")
    (root / "1k" / "qa4.json").write_text(json.dumps([{"input": "x", "question": "y"}]))
    with pytest.raises(ConfigError, match="row 0 has no target"):
        read_samples(str(root), "qa4", "1k")


@pytest.mark.parametrize("output, target, question, task, official, exact", [
    (" kitchen.", "kitchen", "Where is Mary?", "qa1", True, True),
    (" office.", "kitchen", "Where is Mary?", "qa1", False, False),  # another label
    (" kitchen or office.", "kitchen", "Where is Mary?", "qa1", False, False),  # two labels remain
    (" Kitchen.", "kitchen", "Where is Mary?", "qa1", True, False),  # case: official lower-cases
    (" the garden. Then Mary went to the office.", "garden", "Where is Mary?", "qa1", True, False),  # after "."
    (" garden. office", "garden", "Where is Mary?", "qa1", True, True),
    (" garden\nQuestion", "garden", "Where is Mary?", "qa1", True, True),
    # a label that is also in the question is never counted
    (" kitchen, no: garden.", "garden", "Where was the apple before the kitchen?", "qa3", True, False),
    (" kitchen.", "kitchen", "Where was the apple before the kitchen?", "qa3", False, True),
    # qa5: people and objects are labels; the question's are not counted
    (" Fred.", "Fred", "Who gave the football to Jeff?", "qa5", True, True),
    (" fred gave the football.", "Fred", "Who gave the football to Jeff?", "qa5", True, False),
    (" Jeff.", "Fred", "Who gave the football to Jeff?", "qa5", False, False),
    (" Fred and Bill.", "Fred", "Who gave the football to Jeff?", "qa5", False, False),
    (" milk.", "milk", "What did Fred give to Jeff?", "qa5", True, True),
])
def test_each_scorer_rule(output: str, target: str, question: str, task: str, official: bool, exact: bool) -> None:
    assert score_official(output, target, question, task) is official
    assert score_exact(output, target) is exact


@pytest.mark.parametrize("context, question, target, task, chance", [
    ("Mary went to the kitchen. John went to the garden.", "Where is Mary?", "kitchen", "qa1", 0.5),
    # a label named twice counts once; a label only in the question is no candidate
    ("Mary went to the kitchen. Mary went to the kitchen. John went to the office.",
     "Where was the apple before the office?", "kitchen", "qa3", 1.0),
    ("John went to the garden. John went to the hallway. Sandra went to the office.", "Where is Mary?",
     "bathroom", "qa1", 0.0),  # the answer is nowhere in the context: a guesser from it never scores
])
def test_label_chance_guesses_among_the_contexts_labels(context: str, question: str, target: str, task: str,
                                                        chance: float) -> None:
    assert label_chance(Sample(context, question, target), task) == chance


def test_a_cell_reports_both_scorers_side_by_side(monkeypatch) -> None:
    """The cell's task picks the official scorer's labels; both accuracies are counted apart."""
    answers = iter([" Kitchen.", " garden.", " fred.", " Fred.", " Jeff."])
    monkeypatch.setattr(babilong, "answer_sample", lambda *a, **k: next(answers))
    model = nn.Linear(1, 1)
    row = evaluate_cell(model, [Sample(**r) for r in ROWS], "qa1", "1k", BabilongConfig(data="x", lengths=["1k"]))
    assert (row["accuracy_official"], row["accuracy_exact"], row["n"]) == (1.0, 0.5, 2)
    assert row["label_chance"] == 1.0  # one place in each context
    assert row["generated"] == [" Kitchen.", " garden."] and row["tokens_per_s"] > 0 and row["peak_rss_mb"] > 0
    cfg = BabilongConfig(data="x", tasks=["qa5"], lengths=["1k"])
    row = evaluate_cell(model, [Sample(**QA5)] * 3, "qa5", "1k", cfg)
    assert (row["correct_official"], row["correct_exact"], row["n"]) == (2, 1, 3)


N = 64
FACT = re.compile(r"(Mary|John|Daniel|Sandra) (?:moved|went|travelled|journeyed|went back) to the (\w+)\.")
ASKED = re.compile(r"Question: Where is (\w+)\?\nAnswer:( ?)(\w*)$")


class FactsInState(nn.Module):
    """A causal byte model that answers qa1 from its state only: at the end of each segment the
    state takes the facts of the committed text (the previous 40 bytes carried too, for facts
    across a boundary); within a segment it reads the question but never a fact. Reset rows start
    empty; an unknown person gets "nowhere"."""

    def __init__(self) -> None:
        super().__init__()
        self.cfg = SimpleNamespace(segment_len=N, vocab_size=256)
        self.anchor = nn.Parameter(torch.zeros(()))
        self.calls: list[int] = []  # segments per call

    def initial_state(self, batch_size: int, device=None) -> list[tuple[dict, str]]:
        return [({}, "")] * batch_size

    @staticmethod
    def _next(places: dict, context: str) -> int:
        asked = ASKED.search(context)
        if asked is None:
            return ord("x")
        if not asked.group(2):
            return ord(" ")
        answer = places.get(asked.group(1), "nowhere")
        done = len(asked.group(3))
        return ord(answer[done]) if done < len(answer) else ord(".")

    def forward(self, tokens: torch.Tensor, state=None, reset=None) -> SimpleNamespace:
        b, s, n = tokens.shape  # [B, S, N]
        self.calls.append(s)
        state = list(state if state is not None else self.initial_state(b))
        logits = torch.full((b, s, n, 256), -1.0)  # [B, S, N, V]
        for row in range(b):
            places, tail = state[row]
            for seg in range(s):
                if reset is not None and bool(reset[row, seg]):
                    places, tail = {}, ""
                text = bytes(tokens[row, seg].tolist()).decode("latin-1")
                for t in range(n):
                    logits[row, seg, t, self._next(places, tail + text[: t + 1])] = 1.0
                places = {**places, **dict(FACT.findall(tail + text))}
                tail = (tail + text)[-40:]
            state[row] = (places, tail)
        return SimpleNamespace(logits=logits, state=state)


def generated(depth: list[float], **kw) -> BabilongConfig:
    return BabilongConfig(data="generate", tasks=["qa1"], lengths=["2k"], max_samples=6, depth=depth, isolate=False,
                          **kw)


def test_the_reset_ablation_removes_what_the_state_carried() -> None:
    model = FactsInState()
    samples = babilong.load_samples(generated([0.0, 0.5]), "qa1", "2k")  # every fact >= 1000 bytes back
    plain = evaluate_cell(model, samples, "qa1", "2k", generated([0.0, 0.5]))
    ablated = evaluate_cell(model, samples, "qa1", "2k", generated([0.0, 0.5], reset_before_question=True))
    assert (plain["accuracy_official"], plain["accuracy_exact"]) == (1.0, 1.0)
    assert (ablated["accuracy_official"], ablated["accuracy_exact"]) == (0.0, 0.0)
    assert ablated["reset_before_question"] is True and all(g.startswith(" nowhere") for g in ablated["generated"])


def test_the_input_is_streamed_within_segments_per_call() -> None:
    model = FactsInState()
    cfg = generated([0.0, 1.0], segments_per_call=3)
    (sample,) = babilong.load_samples(BabilongConfig(**{**cfg.__dict__, "max_samples": 1}), "qa1", "2k")
    babilong.answer_sample(model, sample, cfg)
    whole = len(sample.prompt()) // N  # segments committed while streaming the prompt
    windows = -(-whole // 3)
    assert whole >= 30 and max(model.calls) == 3, "never more than --segments-per-call segments of activations"
    assert model.calls[:windows] == [3] * (whole // 3) + ([whole % 3] if whole % 3 else []), "the input, in windows"
    assert model.calls[windows:] == [1] * cfg.answer_bytes, "then the partial segment, and one call per answer byte"


def make_run(root: Path, overrides: tuple[str, ...] = ()) -> Path:
    """A run folder (config and untrained checkpoint) of a tiny local model, without training."""
    from memzoo.runs.checkpoints import save_checkpoint
    from memzoo.runs.configure import build_model, load_config

    cfg = load_config("local", ["model.d_model=16", "model.n_layers=1", "model.n_heads=2", "model.segment_len=32",
                                "name=tiny", f"out_dir={root}", *overrides])
    run = root / "tiny"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(to_yaml(cfg))
    model = build_model(cfg)
    save_checkpoint(run, model, torch.optim.SGD(model.parameters(), lr=0.0), 0)
    return run


def test_rows_are_kept_beside_the_run_and_finished_cells_skipped(tmp_path: Path, monkeypatch) -> None:
    run = make_run(tmp_path / "runs")
    data = write_fixture(tmp_path / "data")
    calls = []
    real = babilong.evaluate_cell
    monkeypatch.setattr(babilong, "evaluate_cell", lambda m, s, t, n, *a, **k: calls.append((t, n)) or real(m, s, t, n, *a, **k))
    cfg = BabilongConfig(data=str(data), tasks=["qa1", "qa5"], lengths=["1k"], isolate=False, answer_bytes=4)
    rows = evaluate_babilong(run, cfg, progress=False)
    assert calls == [("qa1", "1k"), ("qa5", "1k")] and [r["n"] for r in rows] == [2, 2]
    evaluate_babilong(run, cfg, progress=False)
    assert len(calls) == 2, "a finished (task, length) was measured again"
    reset = BabilongConfig(**{**cfg.__dict__, "reset_before_question": True, "tasks": ["qa1"]})
    evaluate_babilong(run, reset, progress=False)
    evaluate_babilong(run, BabilongConfig(**{**cfg.__dict__, "answer_bytes": 5, "tasks": ["qa1"]}), progress=False)
    assert calls[2:] == [("qa1", "1k"), ("qa1", "1k")], "the ablation and other settings are measured apart"
    kept = [json.loads(line) for line in (run / "babilong.jsonl").read_text().splitlines()]
    assert [(r["task"], r["reset_before_question"]) for r in kept] == [("qa1", False), ("qa1", True), ("qa5", False)]
    result = json.loads((run / "result.json").read_text())["babilong"]
    assert len(result) == 3 and "generated" not in result[0] and result[0]["method"] == "local"
    assert {r["trained_length"] for r in kept} == {None}  # never fine-tuned on stories


def test_rows_name_the_longest_story_the_run_trained_on(tmp_path: Path) -> None:
    run = make_run(tmp_path / "runs", ("task.name=babilong", "task.lengths=[0,1024,512]", "task.loss=answer"))
    cfg = BabilongConfig(data=str(write_fixture(tmp_path / "data")), lengths=["1k"], isolate=False, answer_bytes=4)
    (row,) = evaluate_babilong(run, cfg, progress=False)
    assert row["trained_length"] == 1024


def test_cli_errors_are_one_line(tmp_path: Path, capsys) -> None:
    from memzoo.cli import main

    run = make_run(tmp_path / "runs")
    for argv, expected in [
        (["--data", str(tmp_path / "none")], "is neither hf:NAME nor a folder"),
        (["--data", "generate", "--tasks", "qa4"], "task 'qa4' with data=generate"),
        (["--data", "generate", "--lengths", "4q"], "BABILong length '4q'"),
        (["--data", "generate", "--tasks", "qa9"], "BABILong task 'qa9'"),
        (["--data", "generate", "--facts", "3,2"], "story facts=[3, 2]"),
    ]:
        assert main(["babilong", str(run), "--no-isolate", *argv]) == 2
        *where, err = capsys.readouterr().err.splitlines()  # the line saying where it evaluates, then the error
        assert len(where) == 1 and where[0].startswith("memzoo babilong: evaluating on ")
        assert err.startswith("memzoo: error:") and expected in err, err


def test_the_cli_hands_the_generator_settings_to_the_evaluation(tmp_path: Path, capsys) -> None:
    from memzoo.cli import main

    run = make_run(tmp_path / "runs")
    argv = ["babilong", str(run), "--no-isolate", "--data", "generate", "--lengths", "0", "--max-samples", "2",
            "--facts", "2,3", "--seed", "5", "--json"]
    assert main(argv) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert (row["facts"], row["seed"], row["n"]) == ([2, 3], 5, 2)


def test_hub_layout_through_datasets_and_the_offline_error(tmp_path: Path) -> None:
    """A folder in the hub's layout (config = length, split = task) loads through datasets; a hub
    name that cannot be reached says how to download it and point --data at the files."""
    pytest.importorskip("datasets")
    root = write_fixture(tmp_path / "hub")
    (root / "README.md").write_text("---\nconfigs:\n- config_name: 1k\n  data_files:\n  - split: qa1\n"
                                    "    path: 1k/qa1.json\n---\n")
    assert read_samples(f"hf:{root}", "qa1", "1k") == [Sample(**r) for r in ROWS]
    with pytest.raises(ConfigError) as err:
        read_samples("hf:memzoo-tests/no-such-babilong", "qa1", "1k")
    text = str(err.value)
    assert "\n" not in text and "huggingface-cli download --repo-type dataset memzoo-tests/no-such-babilong" in text
    assert "--data DIR" in text and "'1k'" in text and "'qa1'" in text
