"""Curriculum stages (memzoo.training.curriculum): fine-tuning stages run in order, each from the previous
stage's weights; a killed stage resumes from its checkpoint, a finished one is never re-run, a
changed one is moved aside and trained again; the long-range evaluation reads the last stage."""
from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from conftest import Killed, spy_train
from memzoo.suites.compare import expand, is_finished, load_suite, worker, worker_args
from memzoo.core.config import ConfigError
from memzoo.evaluations.harness import weights_id
from memzoo.runs.checkpoints import load_checkpoint

SUITE = """
name: cur
base: small
threads_per_job: 1
methods: [infini-linear]
token_budget: 1024   # 2 pretraining steps of 2 x 4 x 64 bytes
jobs: 1
run:
  model: {d_model: 32, n_layers: 2, n_heads: 2, segment_len: 64}
  data: {max_docs: 30}
  train: {batch_size: 2, window_segments: 4, bptt_segments: 2, warmup_steps: 1, checkpoint_every: 1, log_every: 1}
  eval: {batch_size: 2, max_docs: 2, max_segments_per_doc: 2}
finetune:
  - task: {name: passkey, lengths: [440], key_digits: 2, key_segments_back: [1]}
    train: {steps: 3, bptt_segments: 8}
  - task: {key_segments_back: [2]}   # merged onto stage 1: passkey, 440 bytes, 2 digits
    train: {steps: 2}
longrange:
  - {task: passkey, lengths: [440], depths: [1], isolate: false}
"""


def _suite(tmp_path: Path, extra: str = "") -> Path:
    path = tmp_path / "cur.yaml"
    path.write_text(f"out_dir: {tmp_path / 'results'}\n" + SUITE + textwrap.dedent(extra))
    return path


def _steps(run: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines() if "train_bpb" in line]


def test_stages_run_in_order_resume_after_a_kill_and_feed_the_evaluation(tmp_path: Path, monkeypatch) -> None:
    suite = load_suite(str(_suite(tmp_path)))
    (spec,) = expand(suite)
    runs = tmp_path / "results" / "cur" / "runs"
    assert [c.name for c in spec.chain] == ["infini-linear-s0-lm", "infini-linear-s0-c1", "infini-linear-s0"]
    assert [c.task.init_from for c in spec.chain] == [None, str(runs / "infini-linear-s0-lm"), str(runs / "infini-linear-s0-c1")]
    last = spec.chain[-1].task
    assert (last.name, list(last.lengths), last.key_digits, list(last.key_segments_back)) == ("passkey", [440], 2, [2])
    longrange = [{"task": "passkey", "lengths": [440], "depths": [1], "isolate": False}]
    args = worker_args(spec, suite, 1, longrange)

    calls: list = []
    spy_train(monkeypatch, calls, kill=("-c1", 2))
    with pytest.raises(Killed):
        worker(*args)
    lm, c1, final = (runs / c.name for c in spec.chain)
    assert calls == [(lm.name, 1), (c1.name, 1)]
    assert load_checkpoint(c1)["step"] == 2 and not (c1 / "result.json").exists()
    assert not (final / "checkpoint.pt").exists()
    lm_stamp = (lm / "result.json").stat().st_mtime_ns

    calls.clear()
    spy_train(monkeypatch, calls)
    worker(*args)
    assert calls == [(c1.name, 3), (final.name, 1)]  # the finished stage is not re-run; the killed one resumes
    assert (lm / "result.json").stat().st_mtime_ns == lm_stamp
    assert _steps(c1) == [1, 2, 3] and _steps(final) == [1, 2]
    assert (lm / "result.json").stat().st_mtime_ns < (c1 / "result.json").stat().st_mtime_ns \
        < (final / "result.json").stat().st_mtime_ns
    (row,) = json.loads((final / "passkey.json").read_text())
    assert row["weights"] == weights_id(final) != weights_id(c1)  # the last stage's weights were evaluated

    # A changed last stage is detected: it alone is moved aside and trained again.
    c1_stamp = (c1 / "result.json").stat().st_mtime_ns
    path = _suite(tmp_path)
    path.write_text(path.read_text().replace("train: {steps: 2}", "train: {steps: 3}"))
    changed = load_suite(str(path))
    (spec2,) = expand(changed)
    assert not is_finished(spec2, []) and is_finished(spec, [])
    calls.clear()
    worker(*worker_args(spec2, changed, 1, longrange))
    assert calls == [(final.name, 1)]
    assert _steps(final) == [1, 2, 3] and (c1 / "result.json").stat().st_mtime_ns == c1_stamp
    assert _steps(final.with_name(final.name + ".stale-1")) == [1, 2]

    # The results folder moved elsewhere (out_dir and every init_from change): nothing is stale, nothing trains.
    (tmp_path / "results").rename(tmp_path / "moved")
    path.write_text(path.read_text().replace(f"out_dir: {tmp_path / 'results'}", f"out_dir: {tmp_path / 'moved'}"))
    moved = load_suite(str(path))
    (spec3,) = expand(moved)
    assert is_finished(spec3, [])
    calls.clear()
    worker(*worker_args(spec3, moved, 1, longrange))
    assert calls == [] and not list((tmp_path / "moved").rglob("*.stale-2"))


def test_finetune_must_be_a_mapping_or_a_list_of_them(tmp_path: Path) -> None:
    suite = load_suite(str(_suite(tmp_path)), ["finetune=[3]"])
    with pytest.raises(ConfigError, match=r"suite.finetune=\[3\]; expected run-config overrides"):
        expand(suite)


def test_every_seed_gets_the_chain_one_seed_would_and_a_stage_keeps_a_seed_it_sets(tmp_path: Path) -> None:
    """expand resolves a run's chain once for all its seeds: each seed's chain equals the one built for
    that seed alone (names, folders, the seed in every stage), and a stage whose overrides set `seed`
    keeps it, as do the stages after it."""
    from omegaconf import OmegaConf

    from memzoo.training.curriculum import finetune_chain

    path = tmp_path / "cur.yaml"
    path.write_text(f"out_dir: {tmp_path / 'results'}\nseeds: [3, 5]\n"
                    + SUITE.replace("    train: {steps: 3, bptt_segments: 8}\n", "    train: {steps: 3, bptt_segments: 8}\n    seed: 11\n"))
    suite = load_suite(str(path))
    specs = expand(suite)
    assert [s.seed for s in specs] == [3, 5]
    for spec in specs:
        assert [int(c.seed) for c in spec.chain] == [spec.seed, 11, 11]
        pretrain = spec.chain[0].copy()
        alone = finetune_chain(pretrain, suite.finetune, tmp_path / "results" / "cur", spec.name)
        assert [OmegaConf.to_yaml(c) for c in alone] == [OmegaConf.to_yaml(c) for c in spec.chain]
    assert specs[0].chain[1].task.init_from != specs[1].chain[1].task.init_from
