"""Comparison suites end to end on tiny runs: the results table, the report, resuming after a killed
worker, and a plugin from outside the package taking part without any change to memzoo."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

from memzoo.analysis import longrange_table
from memzoo.core.config import ConfigError
from memzoo.runs.checkpoints import load_checkpoint
from memzoo.runs.configure import load_config
from memzoo.suites.compare import check_parameter_spread, expand, load_suite, parameter_counts, run_suite, write_table
from memzoo.publishing.report import write_report

TINY_RUN = """
threads_per_job: 1
run:
  model: {d_model: 32, n_layers: 2, n_heads: 2, segment_len: 16}
  data: {max_docs: 60}
  train: {batch_size: 2, window_segments: 4, bptt_segments: 2, warmup_steps: 2, checkpoint_every: 5, log_every: 5}
  eval: {batch_size: 2, max_docs: 3, max_segments_per_doc: 3}
"""


def write_suite(tmp_path: Path, body: str, name: str = "tiny") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(f"name: {name}\nbase: small\nout_dir: {tmp_path / 'results'}\n" + TINY_RUN + textwrap.dedent(body))
    return path


def test_tiny_suite_writes_the_table_and_the_report(tmp_path: Path, capsys) -> None:
    suite = load_suite(str(write_suite(tmp_path, """
        methods: [local, infini-linear]
        seeds: [0, 1]
        token_budget: 768   # 6 steps of 2 x 4 x 16 bytes
        jobs: 2
    """)))
    df = run_suite(suite, progress=True)
    err = capsys.readouterr().err  # not a terminal: no redrawn bar, one line per finished run
    assert "\r" not in err and sum("finished (" in line for line in err.splitlines()) == 4, err
    root = tmp_path / "results" / "tiny"
    table = pd.read_parquet(root / "results.parquet")
    assert len(table) == 4 == len(df)
    assert sorted(zip(table["method"], table["seed"])) == [("infini-linear", 0), ("infini-linear", 1), ("local", 0), ("local", 1)]
    for col in ("method", "seed", "params", "footprint_analytic", "footprint_measured", "valid_bpb", "tokens_per_s",
                "peak_rss_mb", "bpb_seg_0", "bpb_seg_2", "train_steps"):
        assert col in table.columns, col
    assert (table["train_steps"] == 6).all()  # the same token budget for every method
    infini = table[table["method"] == "infini-linear"].iloc[0]
    assert infini["footprint_measured"] == infini["footprint_analytic"] == 16 * 17 * 2 * 2
    assert (table[table["method"] == "local"]["footprint_measured"] == 0).all()
    assert table["valid_bpb"].between(0.5, 8.5).all()
    assert table["bpb_seg_0"].notna().all()

    md, html = write_report(root)
    pngs = ("footprint_vs_gain.png", "gain_by_segment.png", "footprint_vs_bpb.png", "bpb_by_segment.png", "cost.png",
            "gates.png")
    for png in pngs:
        assert (root / png).stat().st_size > 1000, png
        assert f"]({png})" in md.read_text()
    text = html.read_text()
    assert text.count("data:image/png;base64,") == len(pngs) and "infini-linear" in text
    assert "paired by seed" in md.read_text() and "Summary, unpaired (Welch)" in md.read_text()

    # A run folder trained under another config (stale, not yet re-run) gives no row.
    stale = root / "runs" / "local-s1" / "config.yaml"
    stale.write_text(stale.read_text().replace("lr: 0.002", "lr: 0.005"))
    left = write_table(root, expand(suite))
    assert sorted(zip(left["method"], left["seed"])) == [("infini-linear", 0), ("infini-linear", 1), ("local", 0)]


def test_parameter_counts_must_match(tmp_path: Path) -> None:
    suite = load_suite(str(write_suite(tmp_path, """
        methods: [local, compressive]
        options: {compressive: {mem_len: 16, cmem_len: 8, compression: conv}}
    """)))
    counts = parameter_counts(expand(suite))
    with pytest.raises(ConfigError, match="max_param_spread"):
        check_parameter_spread(counts, 0.10)


def test_unknown_suite_method_lists_registered(tmp_path: Path) -> None:
    suite = load_suite(str(write_suite(tmp_path, "methods: [local, infini-cubic]\n")))
    with pytest.raises(ConfigError, match="infini-cubic.*registered: .*infini-linear"):
        expand(suite)


def test_killed_suite_resumes_without_losing_or_changing_results(tmp_path: Path) -> None:
    """Kill the whole suite (workers included) in the middle of its second run; re-running finishes
    it from the checkpoint with exactly the weights of an uninterrupted suite, and the finished run
    is not run again."""
    body = """
        methods: [local, infini-linear]
        token_budget: 7680   # 60 steps
        jobs: 1
    """
    path = write_suite(tmp_path, body)
    runs = tmp_path / "results" / "tiny" / "runs"
    # Started outside the checkout so that `-m` imports the installed package, as the console script does.
    proc = subprocess.Popen([sys.executable, "-m", "memzoo.cli", "compare", str(path), "--no-report"], cwd=tmp_path,
                            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 240
    while not (runs / "infini-linear-s0" / "checkpoint.pt").is_file():
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        assert time.time() < deadline, "the second run never checkpointed"
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    killed_at = load_checkpoint(runs / "infini-linear-s0")["step"]
    assert 0 < killed_at < 60
    assert not (runs / "infini-linear-s0" / "result.json").exists()
    finished = runs / "local-s0" / "result.json"
    stamp = finished.stat().st_mtime_ns

    table = run_suite(load_suite(str(path)), progress=False)
    assert len(table) == 2 and finished.stat().st_mtime_ns == stamp  # kept, not re-run
    steps = [int(line.split('"step": ')[1].split(",")[0])
             for line in (runs / "infini-linear-s0" / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(set(steps)) and steps[-1] == 60  # no duplicated or lost rows

    reference = load_suite(str(path), [f"out_dir={tmp_path / 'reference'}", "methods=[infini-linear]"])
    run_suite(reference, progress=False)
    a = load_checkpoint(runs / "infini-linear-s0")["model"]
    b = load_checkpoint(tmp_path / "reference" / "tiny" / "runs" / "infini-linear-s0")["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_sigterm_to_the_suite_alone_stops_its_worker_with_the_checkpoint_kept_and_the_lock_released(tmp_path: Path) -> None:
    """A `kill` of the suite's process (not its group, as a scheduler or `kill PID` sends it) stops it
    as Ctrl-C does: its worker stops too (no orphan trains on), the run keeps its checkpoint and no
    lock is left; before, the worker trained the run to its end after the suite had gone."""
    path = write_suite(tmp_path, """
        methods: [local]
        token_budget: 12800000   # 100,000 steps: never finished here
        jobs: 1
    """)
    run = tmp_path / "results" / "tiny" / "runs" / "local-s0"
    proc = subprocess.Popen([sys.executable, "-m", "memzoo", "compare", str(path), "--no-report"], cwd=tmp_path,
                            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 240
    try:
        while not (run / "checkpoint.pt").is_file():
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            assert time.time() < deadline, "the run never checkpointed"
            time.sleep(0.02)
        worker = json.loads((run / "lock").read_text())["pid"]
        assert worker != proc.pid
        os.kill(proc.pid, signal.SIGTERM)  # the suite's process only
        assert proc.wait(60) == 130
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    err = proc.stderr.read().decode()
    assert [line for line in err.splitlines() if line.startswith("memzoo")] == [
        "memzoo: interrupted; the run folder keeps its last checkpoint (run the same command to resume)"], err[-2000:]
    with pytest.raises(ProcessLookupError):
        os.kill(worker, 0)  # the worker has ended with the suite
    assert not (run / "lock").exists()
    assert load_checkpoint(run)["step"] >= 1


PLUGIN = '''
from dataclasses import dataclass
import torch
from memzoo import LayerMemory, register_memory


@dataclass
class MeanConfig:
    weight: float = 0.5


@register_memory("outside-mean", config=MeanConfig)
class OutsideMean(LayerMemory):
    """Adds the running mean of past values to local attention (a plugin memzoo has never seen)."""

    def initial_state(self, batch_size, device):
        h, d = self.model_cfg.n_heads, self.model_cfg.d_head
        return {"sum": torch.zeros(batch_size, h, d, device=device), "n": torch.zeros(batch_size, 1, 1, device=device)}

    def segment(self, x, state):
        mean = state["sum"] / state["n"].clamp(min=1)
        out = x.attend(x.q, x.k, x.v) + self.cfg.weight * mean[:, :, None]
        return out, {"sum": state["sum"] + x.v.sum(2), "n": state["n"] + x.v.shape[2]}, torch.zeros(())

    @classmethod
    def footprint(cls, cfg, model, tokens_seen):
        return {"total": (model.n_heads * model.d_head + 1) * model.n_layers}
'''


def test_a_plugin_from_outside_the_package_runs_in_a_suite(tmp_path: Path) -> None:
    plugin = tmp_path / "outside_plugin.py"
    plugin.write_text(PLUGIN)
    suite = load_suite(str(write_suite(tmp_path, f"""
        methods: [local, outside-mean]
        imports: [{plugin}]
        token_budget: 256
    """)))
    table = run_suite(suite, progress=False)
    row = table[table["method"] == "outside-mean"].iloc[0]
    assert row["footprint_measured"] == row["footprint_analytic"] == (2 * 16 + 1) * 2


def test_longrange_suite_pretrains_finetunes_and_streams(tmp_path: Path) -> None:
    """A suite with a fine-tuning stage and a passkey stage: the pretrained run is kept beside the
    fine-tuned one, the passkey rows reach the table and the report, and a suite interrupted
    after training re-runs only what is missing."""
    suite = load_suite(str(write_suite(tmp_path, """
        methods: [local, infini-linear]
        token_budget: 768
        jobs: 2
        finetune:
          task: {name: passkey, lengths: [300]}
          train: {steps: 3}
        longrange:
          - {task: passkey, lengths: [300, 600], depths: [0, 1], isolate: false}
          - {task: recall, lengths: [200], pairs: 4, queries: 2}   # in a process of its own, inside the worker
          - {task: passkey, lengths: [300], depths: [0], isolate: false, reset_after_key: true}
    """)))
    table = run_suite(suite, progress=False)
    root = tmp_path / "results" / "tiny"
    runs = root / "runs"
    for method in ("local", "infini-linear"):
        lm = json.loads((runs / f"{method}-s0-lm" / "result.json").read_text())
        assert lm["train_steps"] == 6
        cfg = load_config(str(runs / f"{method}-s0" / "config.yaml"))
        assert cfg.task.name == "passkey" and cfg.task.init_from == str(runs / f"{method}-s0-lm")
    assert (table["train_steps"] == 3).all()
    assert table["valid_bpb_pretrain"].tolist() == [
        json.loads((runs / f"{m}-s0-lm" / "result.json").read_text())["valid_bpb"] for m in table["method"]]
    pk = longrange_table(table, "passkey")
    assert len(pk) == 8 and set(zip(pk["length"], pk["depth"])) == {(300, 0), (300, 1), (600, 0), (600, 1)}
    assert (pk["status"] == "ok").all() and pk["accuracy"].between(0, 1).all() and (pk["peak_rss_mb"] > 0).all()
    recall = longrange_table(table, "recall")
    assert len(recall) == 2 and recall["rss_isolated"].all()

    md, html = write_report(root)
    text = md.read_text()
    assert "## Passkey retrieval" in text and (root / "passkey.png").stat().st_size > 1000
    assert "## Streaming cost against length" in text and "| 600 / 300 |" in text
    assert (root / "cost_vs_length.png").stat().st_size > 1000
    for png in ("passkey_vs_length.png", "answer_loss.png"):  # accuracy against length; answer loss over steps
        assert (root / png).stat().st_size > 1000 and f"]({png})" in text
    assert "## Passkey accuracy by the key's segment, counted back from the question" in text
    assert "## Validation bits per byte before and after fine-tuning" in text
    assert (table["valid_bpb_ratio"] == table["valid_bpb"] / table["valid_bpb_pretrain"]).all()
    reset_rows = longrange_table(table, "passkey", reset=True)
    assert len(reset_rows) == 2 and reset_rows["reset_after_key"].all()

    run = runs / "infini-linear-s0"
    (run / "longrange-done.json").unlink()
    (run / "passkey.json").unlink()
    stamp = (run / "checkpoint.pt").stat().st_mtime_ns
    run_suite(suite, progress=False)
    assert (run / "checkpoint.pt").stat().st_mtime_ns == stamp, "a finished stage was trained again"
    assert len(json.loads((run / "passkey.json").read_text())) == 5  # 4 plain rows and the reset ablation's

    more = load_suite(str(tmp_path / "tiny.yaml"), ["longrange=[{task: passkey, lengths: [300, 600, 900], depths: [0, 1], isolate: false}]"])
    run_suite(more, progress=False)  # a changed stage: only the new length is measured, nothing is trained
    assert (run / "checkpoint.pt").stat().st_mtime_ns == stamp
    rows = json.loads((run / "passkey.json").read_text())
    assert sorted(r["length"] for r in rows if not r.get("reset_after_key")) == [300, 300, 600, 600, 900, 900]


def test_bad_longrange_stage_fails_before_training(tmp_path: Path) -> None:
    suite = load_suite(str(write_suite(tmp_path, """
        methods: [local]
        longrange:
          - {task: passkey, lengths: [4096], depths: [0, 2]}
    """)))
    with pytest.raises(ConfigError, match=r"suite.longrange\[0\]: depths=\[0, 2\]"):
        run_suite(suite, progress=False)
    assert not (tmp_path / "results" / "tiny" / "runs").exists()


@pytest.mark.parametrize("name", ["quick", "presets", "paper-gpu", "longrange", "longrange-gpu", "longrange-answer-only",
                                  "capacity", "babilong", "lm-stream", "lm-stream-sotu", "lm-stream-gpu"])
def test_shipped_suites_expand(name: str) -> None:
    """Every shipped suite resolves into valid run configs (and long-range stages) for every method
    (capacity-gpu's 1,656 runs take a minute to resolve, so it is left out here)."""
    from memzoo.core.plugins import registered
    from memzoo.suites.compare import longrange_configs

    in_tree = {m for m, spec in registered().items() if spec.cls.__module__.startswith("memzoo.memories.")}
    others = sorted(set(registered()) - in_tree)  # plugins other tests registered in this process
    every = ["methods=all"] if name.startswith("lm-stream") else []  # its file names local and full: expand every method
    suite = load_suite(name, every + ([f"exclude=[{','.join(others)}]"] if others else []))
    specs = expand(suite)
    # capacity runs every method but infini-linear, the same model as infini-delta at its G = 1
    expected = in_tree - {"infini-linear"} if name == "capacity" else in_tree
    assert {s.method for s in specs} == expected
    stages = longrange_configs(suite)
    if name.startswith("longrange"):
        assert all(s.pretrain is not None and s.cfg.task.name == "passkey" for s in specs)
        assert max(max(st.lengths) for st in stages) == 1048576 and all(st.depths == [0, 0.5, 1] for st in stages)
        assert all(s.pretrain.train.steps * s.pretrain.train.batch_size * s.pretrain.train.window_segments
                   * s.pretrain.model.segment_len <= suite.token_budget for s in specs)
        if name != "longrange-gpu":  # the CPU suites train on examples of at most 2,048 bytes (the long-range recipe)
            assert max(max(c.task.lengths) for s in specs for c in s.chain[1:]) <= 2048
    elif name == "babilong":  # stories trained up to 1,024 bytes, streamed to 16x that, with the reset ablation
        from memzoo.data.babilong import length_bytes

        assert all(c.task.name == "babilong" and c.task.loss == "answer" for s in specs for c in s.chain[1:])
        assert max(max(c.task.lengths) for s in specs for c in s.chain[1:]) == 1024
        assert max(length_bytes(n) for st in stages for n in st.lengths) == 16 * 1024
        assert [st.reset_before_question for st in stages] == [False, True] and all(st.data == "generate" for st in stages)
    elif name.startswith("lm-stream"):  # from the shipped backbone, state carried, the memory ablation as its stage
        assert all(s.pretrain is None and s.cfg.task.init_from == "backbone:small-stdlib" and s.cfg.train.carry_state
                   for s in specs)
        assert [st.task for st in stages] == ["memory-ablation"]
    else:
        assert all(s.pretrain is None for s in specs) and stages == []


def test_the_gpu_stream_suite_is_lm_stream_at_a_larger_budget() -> None:
    """lm-stream-gpu changes only the batch, the steps, the precision, the device and where a read of a
    document starts (at 8x the bytes the heads alone would be read 6.6 times): each of its runs is
    lm-stream's run of the same method and seed in every other key (backbone, carried state, evaluation)."""
    from omegaconf import OmegaConf

    cpu = {(s.method, s.seed): s.cfg for s in expand(load_suite("lm-stream", ["methods=all"]))}
    gpu = expand(load_suite("lm-stream-gpu"))
    assert {s.method for s in gpu} >= {"local", "full"}
    scaled = {"train.batch_size": 32, "train.steps": 800, "train.precision": "bf16", "train.device": "cuda",
              "train.checkpoint_every": 100, "train.log_every": 50, "eval.batch_size": 16, "train.doc_start": "random"}
    for spec in gpu:
        mine = OmegaConf.to_container(spec.cfg)
        theirs = OmegaConf.to_container(cpu[(spec.method, spec.seed)])
        for key, value in scaled.items():
            group, name = key.split(".")
            assert mine[group].pop(name) == value, (spec.name, key)
            theirs[group].pop(name)
        for key in ("out_dir", "log"):  # where the run is written and the tracker group: the suite's name
            mine.pop(key), theirs.pop(key)
        assert mine == theirs, spec.name
    # 8x lm-stream's training bytes a run
    assert 800 * 32 == 8 * cpu[("full", 0)].train.steps * cpu[("full", 0)].train.batch_size


@pytest.mark.parametrize("name", ["longrange", "longrange-gpu"])
def test_longrange_suites_are_the_curriculum(name: str) -> None:
    """The shipped long-range suites follow the long-range recipe: stages over a growing key gap that all
    keep gap 0, the corpus loss mixed in, no weight decay, and every example inside one BPTT block."""
    suite = load_suite(name)
    for spec in expand(suite):
        stages = spec.chain[1:]  # the fine-tuning stages, after pretraining
        assert len(stages) >= 3, spec.name
        gaps = [max(c.task.key_segments_back) for c in stages]
        assert gaps == sorted(gaps) and gaps[0] == 0 and gaps[-1] >= 7, (spec.name, gaps)
        for c in stages:
            assert 0 in c.task.key_segments_back and c.task.lm_fraction > 0 and c.train.weight_decay == 0
            assert c.train.bptt_segments * c.model.segment_len >= max(c.task.lengths), (spec.name, c.name)
    assert len(suite.seeds) >= 2  # differences carry intervals over seeds


def test_suite_progress_without_a_terminal_prints_lines_not_redraws() -> None:
    import io

    from memzoo.suites.compare import SuiteProgress

    out = io.StringIO()
    bar = SuiteProgress("s", total_steps=20, done_steps=0, runs=2, runs_done=0, enabled=True, every=0.0, stream=out)
    bar.update(0, {"a-s0": (3, 10)})
    bar.run_finished("a-s0", True)
    bar.update(10, {"b-s0": (4, 10)})
    bar.run_finished("b-s0", False)
    bar.close()
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue() and len(lines) == 4
    assert "3/20 steps" in lines[0] and "a-s0 3/10" in lines[0] and "run a-s0 finished (1/2 runs)" in lines[1]
    assert "14/20 steps" in lines[2] and "run b-s0 failed (2/2 runs)" in lines[3]
    quiet = io.StringIO()
    SuiteProgress("s", 20, 0, 2, 0, enabled=False, stream=quiet).run_finished("a", True)
    assert quiet.getvalue() == ""


def test_overrides_reach_into_a_suite_list_by_index() -> None:
    """`longrange.0.trials=32` (the cheaper stream the distance suite's file suggests) sets that
    entry's key and keeps the rest of the entry; an index past the list, or an unreadable value, is
    one error naming the override."""
    base = load_suite("distance")
    suite = load_suite("distance", ["longrange.0.trials=32", "longrange.0.gaps=[1,4]", "seeds=[0]"])
    entry = dict(suite.longrange[0])
    assert entry == {**dict(base.longrange[0]), "trials": 32, "gaps": [1, 4]}
    assert list(suite.seeds) == [0] and list(suite.methods) == list(base.methods)
    with pytest.raises(ConfigError, match=r"longrange\.9\.trials=3.*existing entry"):
        load_suite("distance", ["longrange.9.trials=3"])
    with pytest.raises(ConfigError, match=r"longrange\.0\.trials=\[1"):
        load_suite("distance", ["longrange.0.trials=[1"])
