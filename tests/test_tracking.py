"""log.tracker: TensorBoard and W&B get what metrics.jsonl gets; a missing package is one line naming
the extra; only rank 0 logs; a suite's `run: log:` reaches every run under its run name."""
from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from memzoo.cli import main
from memzoo.runs.configure import load_config
from memzoo.runs.distributed import DistInfo
from memzoo.runs.tracking import make_tracker
from memzoo.training.train import train

HAS_TB = importlib.util.find_spec("tensorboard") is not None
HAS_WANDB = importlib.util.find_spec("wandb") is not None
TINY = ["model.d_model=32", "model.n_layers=1", "model.n_heads=2", "model.segment_len=16", "train.batch_size=2",
        "train.window_segments=2", "train.bptt_segments=2", "train.warmup_steps=1", "train.log_every=1",
        "train.checkpoint_every=0", "train.device=cpu", "eval.max_docs=1", "eval.max_segments_per_doc=2",
        "eval.batch_size=1"]


def corpus(tmp_path: Path) -> Path:
    """One small local document (split 90/5/5 by bytes): the stdlib corpus takes seconds to list."""
    path = tmp_path / "doc.txt"
    path.write_bytes(Path(__file__).read_bytes() * 3)
    return path


def tiny(tmp_path: Path, *extra: str):
    return load_config("local", [*TINY, f"data.source={corpus(tmp_path)}", f"out_dir={tmp_path / 'runs'}", *extra])


def jsonl(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


@pytest.mark.skipif(not HAS_TB, reason="tensorboard is not installed (pip install 'memzoo[tensorboard]')")
def test_tensorboard_scalars_equal_metrics_jsonl(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = tiny(tmp_path, "name=tb", "train.steps=3", "train.eval_every=2", "log.tracker=tensorboard")
    run = train(cfg, progress=False)
    rows = jsonl(run)
    assert [r["step"] for r in rows] == [1, 2, 2, 3] and "valid_bpb" in rows[2]  # three steps, one evaluation
    events = EventAccumulator(str(run))
    events.Reload()
    scalars = {tag: {e.step: e.value for e in events.Scalars(tag)} for tag in events.Tags()["scalars"]}
    logged = 0
    for row in rows:
        for key, value in row.items():
            if key != "step":
                assert scalars[key][row["step"]] == pytest.approx(value, rel=1e-6, abs=1e-6), (key, row)
                logged += 1
    assert logged >= 3 * 5 + 1 and {"train_bpb", "lr", "tokens_per_s", "valid_bpb"} <= set(scalars)
    result = json.loads((run / "result.json").read_text())
    assert scalars["valid_bpb"][3] == pytest.approx(result["valid_bpb"], rel=1e-6)  # the end-of-run summary
    assert "config/text_summary" in events.Tags()["tensors"]


@pytest.mark.skipif(not HAS_WANDB, reason="wandb is not installed (pip install 'memzoo[wandb]')")
def test_wandb_offline_writes_its_run_folder(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb-dir"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    (tmp_path / "wandb-dir").mkdir()
    import wandb

    real_init, calls = wandb.init, []
    monkeypatch.setattr(wandb, "init", lambda **kw: calls.append(kw) or real_init(**kw))
    run = train(tiny(tmp_path, "name=wb-run", "train.steps=2", "log.tracker=wandb", "log.group=g1"),
                progress=False, evaluate_at_end=False)
    run_id = (run / "wandb-id").read_text().strip()
    assert [(c["name"], c["group"], c["project"], c["id"]) for c in calls] == [("wb-run", "g1", "memzoo", run_id)]
    (folder,) = (tmp_path / "wandb-dir" / "wandb").glob(f"offline-run-*-{run_id}")
    needles = (b"wb-run", b"g1", b"train_bpb", b"tokens_per_s", b"lr")
    deadline = time.monotonic() + 20  # wandb's service process may finish writing just after finish() returns
    while not all(n in (data := (folder / f"run-{run_id}.wandb").read_bytes()) for n in needles):
        assert time.monotonic() < deadline, [n for n in needles if n not in data]
        time.sleep(0.1)
    assert [r["step"] for r in jsonl(run)] == [1, 2]  # metrics.jsonl is written beside it


@pytest.mark.parametrize("tracker,module", [("tensorboard", "tensorboard"), ("wandb", "wandb")])
def test_a_missing_package_is_one_line_naming_the_extra(tmp_path: Path, monkeypatch, capsys, tracker, module) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # `import MODULE` now fails as if it were not installed
    code = main(["train", "local", *TINY, "train.steps=1", f"data.source={corpus(tmp_path)}",
                 f"out_dir={tmp_path / 'runs'}", f"log.tracker={tracker}"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"memzoo: error: log.tracker={tracker} needs the {module} package")
    assert f"pip install 'memzoo[{tracker}]'" in err
    assert not (tmp_path / "runs").exists()  # stopped before the run folder was made


def test_an_unknown_tracker_is_a_config_error(capsys) -> None:
    code = main(["footprint", "local", "--no-measure", "log.tracker=mlflow"])
    assert code == 2 and "log.tracker='mlflow'; expected one of none, tensorboard, wandb" in capsys.readouterr().err


@pytest.mark.parametrize("tracker", ["none", "tensorboard"])
def test_only_rank_0_logs(tmp_path: Path, tracker: str) -> None:
    if tracker == "tensorboard" and not HAS_TB:
        pytest.skip("tensorboard is not installed (pip install 'memzoo[tensorboard]')")
    cfg = tiny(tmp_path, f"log.tracker={tracker}")
    for rank, world in ((1, 2), (0, 2)):
        folder = tmp_path / f"rank{rank}"
        folder.mkdir()
        t = make_tracker(cfg, folder, DistInfo(rank, world, rank))
        t.config({"a": 1})
        t.log(1, {"train_bpb": 2.0})
        t.summary(1, {"valid_bpb": 2.5})
        t.close()
    assert list((tmp_path / "rank1").iterdir()) == []  # rank 1 wrote nothing
    assert jsonl(tmp_path / "rank0") == [{"step": 1, "train_bpb": 2.0}]  # the summary is result.json's, not a row
    assert bool(list((tmp_path / "rank0").glob("events.out.tfevents.*"))) is (tracker == "tensorboard")


def test_a_suite_run_log_section_reaches_every_run_and_stage(tmp_path: Path) -> None:
    """`run: log: tracker:` of a suite is every run's (pretraining and fine-tuning stages too), under
    the suite's run name and grouped by the suite; changing it leaves finished runs finished."""
    from memzoo.training.curriculum import config_matches
    from memzoo.suites.compare import expand, load_suite

    suite_yaml = tmp_path / "s.yaml"
    suite_yaml.write_text(OmegaConf.to_yaml({
        "name": "tracked", "base": "small", "methods": ["infini-linear"], "seeds": [0, 1],
        "out_dir": str(tmp_path / "results"), "run": {"log": {"tracker": "wandb", "project": "p"}},
        "finetune": {"task": {"name": "passkey", "lengths": [256]}, "train": {"steps": 1}},
    }))
    specs = expand(load_suite(str(suite_yaml)))
    assert len(specs) == 2
    for spec in specs:
        for cfg in spec.chain:
            assert (cfg.log.tracker, cfg.log.project, cfg.log.group) == ("wandb", "p", "tracked")
        assert spec.cfg.name == spec.name and spec.pretrain.name == f"{spec.name}-lm"
    again = expand(load_suite(str(suite_yaml), ["run.log.tracker=none"]))
    assert {c.log.tracker for s in again for c in s.chain} == {"none"}
    spec = specs[0]
    spec.run_dir.mkdir(parents=True)
    (spec.run_dir / "config.yaml").write_text(OmegaConf.to_yaml(again[0].cfg))
    assert config_matches(spec.run_dir, spec.cfg)  # the tracker changed: still the same run
    spec.cfg.train.lr = 0.5
    assert not config_matches(spec.run_dir, spec.cfg)  # a real change is still seen
