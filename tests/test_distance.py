"""Recall against distance: the gap curriculum's layout, rewrites and their scoring, the
streamed evaluation's placement of the answers exactly G segments before the queries and its reset
ablation (on hand-built memories whose only route to an answer is their state), the reach that
stops a window memory's curriculum, and the distance suites' configs."""
from __future__ import annotations

import json
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Optional

import pytest
import torch
from torch import Tensor, nn

from conftest import Killed, spy_train
from memzoo.core.config import ModelConfig
from memzoo.data.recall import KEY_BASE, VALUE_BASE, segment_recall_batch, stale_chance
from memzoo.runs.checkpoints import load_checkpoint
from memzoo.training.curriculum import config_hash
import memzoo.evaluations.distance
from memzoo.evaluations.distance import DEFAULT_GAPS, DistanceConfig, distance_batch, evaluate_distance, gap_tokens, stream_gaps
from memzoo.evaluations.harness import Meter
from memzoo.evaluations.reach import max_reach_segments, reach_segments
from memzoo.suites.compare import (check_parameter_spread_by_width, expand, load_suite, parameter_counts, worker,
                                   worker_args)

LAYOUT = {"pairs": 4, "queries": 8, "local_queries": 4, "alphabet": 8, "rewrites": 0}
N = 16


class StateOracle(nn.Module):
    """A hand-built memory whose only route to an answer is its state: per row, every (key, value)
    written in earlier segments, with the segment it was written in. At a key inside a segment it
    predicts the key's `keep` value (latest or first) from the state as it was when the segment
    began, never from the segment itself; with `exact_gap` only a value written exactly that many
    segments back. A reset empties the row's state."""

    def __init__(self, keep: str = "latest", exact_gap: Optional[int] = None, carry: bool = True):
        super().__init__()
        self.cfg = ModelConfig(d_model=8, n_heads=2, segment_len=N)
        self.keep, self.exact_gap, self.carry = keep, exact_gap, carry
        self.dummy = nn.Parameter(torch.zeros(()))

    def initial_state(self, batch_size: int, device: torch.device) -> dict:
        return {"segment": 0, "rows": [{} for _ in range(batch_size)]}  # key -> [(value, segment written), ...]

    def forward(self, tokens: Tensor, state: dict, reset: Optional[Tensor] = None) -> SimpleNamespace:
        b, s, n = tokens.shape  # [B, S, N]
        logits = torch.zeros(b, s, n, 256)
        rows = [dict(r) for r in state["rows"]]
        for seg in range(s):
            now = state["segment"] + seg
            for row in range(b):
                if (reset is not None and bool(reset[row, seg])) or not self.carry:
                    rows[row] = {}
                flat = tokens[row, seg].tolist()
                for i, tok in enumerate(flat):
                    written = rows[row].get(tok, [])
                    if self.exact_gap is not None:
                        written = [w for w in written if w[1] == now - self.exact_gap]
                    if written and KEY_BASE <= tok < VALUE_BASE:
                        logits[row, seg, i, written[-1 if self.keep == "latest" else 0][0]] = 1.0
                new = dict(rows[row])  # the segment's pairs join the state after the segment, once each
                for i in range(0, n - 1):
                    if KEY_BASE <= flat[i] < VALUE_BASE <= flat[i + 1] and (flat[i + 1], now) not in new.get(flat[i], []):
                        new[flat[i]] = [*new.get(flat[i], []), (flat[i + 1], now)]
                rows[row] = new
        return SimpleNamespace(logits=logits, state={"segment": state["segment"] + s, "rows": rows})


def _streamed(model: nn.Module, gaps: list[int], rewrites: int = 0, trials: int = 3) -> dict[tuple[int, bool], dict]:
    """The distance rows of one stream, by (gap, reset)."""
    cfg = DistanceConfig(gaps=gaps, trials=trials, segments_per_call=5, time_limit_s=None)
    layout = {**LAYOUT, "rewrites": rewrites}
    return {(r["gap_segments"], r["reset_after_pairs"]): r for rows in stream_gaps(model, gaps, cfg, layout, Meter(cfg))
            for r in rows}


def _rows(model: nn.Module, gap: int, rewrites: int = 0, trials: int = 3) -> dict[bool, dict]:
    """The rows of one gap, by reset."""
    return {reset: row for (_, reset), row in _streamed(model, [gap], rewrites, trials).items()}


def test_gap_curriculum_rows_draw_their_gap_and_end_with_the_queries() -> None:
    """With min_gap_segments, each row's gap is uniform in [min, max]; every row has the largest
    gap's window, its queries in the last segment, filler before its pairs and between."""
    batch = segment_recall_batch(torch.Generator().manual_seed(0), 400, N, 4, 8, gap_segments=8, local_queries=4,
                                 alphabet=8, min_gap_segments=1)
    assert batch.tokens.shape == (400, 9 * N) and batch.query_segment == 8
    gaps = [batch.example(r).gap for r in range(400)]
    assert sorted(set(gaps)) == list(range(1, 9)) and all(25 <= gaps.count(g) <= 75 for g in range(1, 9))
    for r in range(0, 400, 7):
        e = batch.example(r)
        seq, start = e.tokens, e.pairs_segment * N
        assert e.pairs_segment == 8 - e.gap
        assert all(t < KEY_BASE for t in seq[:start])  # filler before the pairs
        assert all(t < KEY_BASE for t in seq[start + N : e.query_segment * N])  # and between
        pairs = {seq[start + 2 * i]: seq[start + 2 * i + 1] for i in range(4)}
        assert [pairs[seq[p]] for p in e.scored_positions] == list(e.answers)
        assert all(p // N == 8 for p in e.scored_positions)
        assert [p - start for p in e.answer_positions[:4]] == [8, 10, 12, 14]  # local queries follow the pairs
    fixed = segment_recall_batch(torch.Generator().manual_seed(0), 5, N, 4, 8, gap_segments=8)
    assert [fixed.example(r).gap for r in range(5)] == [8] * 5  # without the option: every row at the gap


def test_rewrites_give_every_key_new_values_and_the_answer_is_the_latest() -> None:
    batch = segment_recall_batch(torch.Generator().manual_seed(1), 50, N, 4, 8, gap_segments=3, local_queries=4,
                                 alphabet=8, rewrites=2)
    assert batch.query_segment == 2 + 3 and batch.history.shape == (50, 4, 3)
    for r in range(50):
        e = batch.example(r)
        seq = e.tokens
        written = [{seq[w * N + 2 * i]: seq[w * N + 2 * i + 1] for i in range(4)} for w in range(3)]
        assert all(set(w) == set(written[0]) for w in written)  # every key, in every write segment
        for key in written[0]:
            assert len({w[key] for w in written}) == 3  # three different values
        assert [written[-1][seq[p]] for p in e.scored_positions] == list(e.answers)
        assert [sorted(s) for s in e.stale] == [sorted([written[0][seq[p]], written[1][seq[p]]]) for p in e.scored_positions]
        assert sorted(e.values) == sorted(v for w in written for v in w.values())  # chance guesses among all 12
        assert all(c == sum(v in set(s) for v in e.values) / 12 for c, s in zip(stale_chance(e), e.stale))
        assert e.gap == 3 and all(t < KEY_BASE for t in seq[3 * N : 5 * N])


def test_the_streamed_evaluation_puts_the_answers_exactly_g_segments_before_the_queries() -> None:
    """On the generated examples of every gap: the last write is segment R, filler follows, the
    queries open segment R + G and ask for the last write's values. Streamed, one stream for every
    gap: a memory that answers only from values written exactly G segments back scores 1 at gap G
    and 0 at every other (so no probe of a shorter gap was written into the stream)."""
    for rewrites in (0, 1):
        batch = distance_batch({**LAYOUT, "rewrites": rewrites}, DEFAULT_GAPS[-1], 2, N, seed=0)
        e = batch.example(0)
        offsets = [p - e.query_segment * N for p in e.scored_positions]
        latest = {e.tokens[rewrites * N + 2 * i]: e.tokens[rewrites * N + 2 * i + 1] for i in range(4)}
        for gap in DEFAULT_GAPS:
            seq = bytes(gap_tokens(batch, gap, N)[0].tolist())
            assert len(seq) == (rewrites + gap + 1) * N
            assert all(KEY_BASE <= t for t in seq[rewrites * N : rewrites * N + 16 : 2])  # the last write
            assert all(t < KEY_BASE for t in seq[(rewrites + 1) * N : (rewrites + gap) * N])  # filler after it
            queries = [(rewrites + gap) * N + o for o in offsets]
            assert [latest[seq[p]] for p in queries] == [seq[p + 1] for p in queries] == list(e.answers)
    gaps = [1, 2, 3, 8, 64]
    for exact in (1, 3, 64):
        rows = _streamed(StateOracle(exact_gap=exact), gaps, trials=2)
        assert [rows[g, False]["recall_accuracy"] for g in gaps] == [float(g == exact) for g in gaps]
    rows = _streamed(StateOracle(exact_gap=1024), [256, 1024], trials=1)
    assert [rows[g, False]["recall_accuracy"] for g in (256, 1024)] == [0.0, 1.0]
    rows = _streamed(StateOracle(exact_gap=4), [1, 4, 9], rewrites=1, trials=2)  # counted from the rewrite
    assert [rows[g, False]["recall_accuracy"] for g in (1, 4, 9)] == [0.0, 1.0, 0.0]


def test_the_reset_ablation_removes_what_only_the_state_carried() -> None:
    """A memory whose only route to the answer is its state answers every query, and nothing once
    its state is reset after the last write (with rewrites too: the reset follows the rewrite, so
    the latest value is gone as well); a memory that carries nothing scores 0 either way. Both arms
    are scored on the same examples (the same chance)."""
    for gap, rewrites in ((1, 0), (5, 0), (2, 1)):
        rows = _rows(StateOracle(), gap, rewrites)
        assert rows[False]["recall_accuracy"] == 1.0 and rows[True]["recall_accuracy"] == 0.0
        assert rows[False]["recall_chance"] == rows[True]["recall_chance"] and 0 < rows[True]["recall_chance"] < 1
        assert rows[False]["recall_queries_by_example"] == rows[True]["recall_queries_by_example"]
        local = _rows(StateOracle(carry=False), gap, rewrites)
        assert local[False]["recall_accuracy"] == local[True]["recall_accuracy"] == 0.0


def test_rewrite_scoring_first_value_is_stale_and_latest_is_right() -> None:
    for rewrites in (1, 2):
        first = _rows(StateOracle(keep="first"), 3, rewrites, trials=6)[False]
        latest = _rows(StateOracle(keep="latest"), 3, rewrites, trials=6)[False]
        assert (first["recall_stale"], first["recall_accuracy"]) == (1.0, 0.0)
        assert (latest["recall_stale"], latest["recall_accuracy"]) == (0.0, 1.0)
        assert 0 < first["recall_stale_chance"] < 1 and first["recall_stale_chance"] == latest["recall_stale_chance"]
        assert sum(first["recall_queries_by_example"]) == first["scored"] and sum(latest["recall_hits_by_example"]) == \
            latest["scored"]
    assert "recall_stale" not in _rows(StateOracle(), 3)[False]  # no rewrites, no stale share


def test_reach_by_construction() -> None:
    assert reach_segments(None, 16) is None
    assert reach_segments([0, 0], 16) == 0
    assert reach_segments([16, 16], 16) == 2 and reach_segments([15, 15], 16) == 1 and reach_segments([17, 17], 16) == 3
    assert reach_segments([0, 16], 16) == 1 and reach_segments([32, 0, 0], 16) == 2
    with pytest.raises(ValueError, match=r"windows=\[-1\]"):
        reach_segments([-1], 16)


SUITE_REACH = {"full": None, "local": 0, "xl": 2, "memorizing": 1, "compressive": 2}


def test_distance_suite_expands_within_its_spread_with_the_stages_each_memory_can_reach() -> None:
    """Every run of `distance` (one seed; the others differ only in it) builds, parameter counts
    within max_param_spread; the curriculum doubles the largest gap from 1 to 8, each stage from the
    previous one's folder, with one BPTT block covering the window; a window memory stops at its
    reach, every other memory runs every stage."""
    suite = load_suite("distance", ["seeds=[0]"])
    assert list(suite.longrange[0].gaps) == DEFAULT_GAPS and suite.stop_at_reach
    specs = expand(suite)
    assert len(specs) == 15
    counts = parameter_counts(specs)
    assert check_parameter_spread_by_width(specs, counts, suite.max_param_spread) <= suite.max_param_spread
    for spec in specs:
        reach = max_reach_segments(spec.cfg)
        assert reach == SUITE_REACH.get(spec.method), spec.name
        gaps = [int(c.task.gap_segments) for c in spec.chain]
        expected = [g for g in (1, 2, 4, 8) if reach is None or g <= max(reach, 1)]
        assert gaps == expected, spec.name
        assert [int(c.task.min_gap_segments) for c in spec.chain] == [0] + [1] * (len(gaps) - 1)
        assert spec.chain[-1].name == spec.name and spec.chain[0].name == (spec.name if len(gaps) == 1 else
                                                                           f"{spec.name}-c0")
        for prev, stage in zip(spec.chain, spec.chain[1:]):
            assert Path(stage.task.init_from).name == prev.name
        for c in spec.chain:
            window = int(c.task.rewrites) + int(c.task.gap_segments) + 1
            assert int(c.train.bptt_segments) >= window + 1  # and room for the rewrites variant's segment
    infini = [s.cfg.memory.normalizer for s in specs if s.method == "infini-delta"]
    assert sorted(infini) == ["gamma", "paper"]


def test_rewrites_and_gpu_suites_validate() -> None:
    rewrites = load_suite("distance-rewrites", ["seeds=[0]", "methods=[rmt]"])
    (spec,) = expand(rewrites)
    assert [int(c.task.rewrites) for c in spec.chain] == [1] * 4 and spec.run_dir.parent.parent.name == "distance-rewrites"
    gpu = load_suite("distance-gpu", ["seeds=[0]", "methods=[xl]"])
    specs = expand(gpu)
    assert {(int(s.cfg.task.rewrites), int(s.cfg.memory.mem_len)) for s in specs} == {(0, 16), (0, 32), (1, 16), (1, 32)}
    assert max(len(s.chain) for s in specs) == 3  # xl at mem_len 32 reaches 4 segments: gaps 1, 2, 4
    assert DistanceConfig(**{k: v for k, v in dict(gpu.longrange[0]).items()}).gaps[-1] == 16384


def test_new_task_keys_change_the_hash_only_off_their_defaults() -> None:
    """Shipped reference rows are held to config_hash (tests/test_references.py): the keys added for
    this suite hash as if absent at their defaults, and count once set."""
    spec = expand(load_suite("quick", ["methods=[local]", "seeds=[0]"]))[0]
    for key, value in (("rewrites", 1), ("min_gap_segments", 1)):
        changed = spec.cfg.copy()
        changed.task[key] = value
        assert config_hash(changed) != config_hash(spec.cfg)


SUITE = """
name: dist
base: small
threads_per_job: 1
methods: [rmt]
jobs: 1
stop_at_reach: true
options: {rmt: {n_mem_tokens: 2}}
run:
  model: {d_model: 16, n_layers: 2, n_heads: 2, segment_len: 16, init: torch}
  task: {name: recall, pairs: 2, queries: 2, local_queries: 1, alphabet: 4, gap_segments: 1, loss: answer}
  train: {steps: 2, batch_size: 2, bptt_segments: 8, warmup_steps: 1, checkpoint_every: 1, log_every: 1, device: cpu}
  eval: {recall_examples: 2}
finetune:
  - task: {gap_segments: 2, min_gap_segments: 1}
    train: {steps: 3}
  - task: {gap_segments: 4}
    train: {steps: 2}
longrange:
  - {task: distance, gaps: [1, 4, 16], trials: 2, segments_per_call: 4}
"""


def stage_gap(cfg, first: Optional[int]) -> tuple:
    """What the curriculum test records of a train() call: the stage, its largest gap, its first step."""
    return cfg.name, int(cfg.task.gap_segments), first


def test_gap_curriculum_runs_in_order_resumes_after_a_kill_and_never_reruns_a_stage(tmp_path: Path,
                                                                                    monkeypatch, capsys) -> None:
    path = tmp_path / "dist.yaml"
    path.write_text(f"out_dir: {tmp_path / 'results'}\n" + textwrap.dedent(SUITE))
    suite = load_suite(str(path))
    (spec,) = expand(suite)
    c0, c1, final = (tmp_path / "results" / "dist" / "runs" / c.name for c in spec.chain)
    assert [p.name for p in (c0, c1, final)] == ["rmt-s0-c0", "rmt-s0-c1", "rmt-s0"]
    evaluation = [{"task": "distance", "gaps": [1, 4, 16], "trials": 2, "segments_per_call": 4}]
    args = worker_args(spec, suite, 1, evaluation)

    calls: list = []
    spy_train(monkeypatch, calls, kill=("-c1", 2), record=stage_gap)
    with pytest.raises(Killed):
        worker(*args)
    assert calls == [(c0.name, 1, 1), (c1.name, 2, 1)]  # stage 1 (gap 1) whole, stage 2 killed after step 2
    assert load_checkpoint(c1)["step"] == 2 and not (c1 / "result.json").exists()
    stamp = (c0 / "result.json").stat().st_mtime_ns

    calls.clear()
    spy_train(monkeypatch, calls, record=stage_gap)
    worker(*args)
    assert calls == [(c1.name, 2, 3), (final.name, 4, 1)]  # resumed at step 3; stage 1 not re-run
    assert (c0 / "result.json").stat().st_mtime_ns == stamp
    rows = json.loads((final / "distance.json").read_text())
    assert [(r["gap_segments"], r["reset_after_pairs"]) for r in rows] == [(g, r) for g in (1, 4, 16) for r in (False, True)]
    assert all(r["status"] == "ok" and r["trained_gap"] == 4 for r in rows)
    assert json.loads((final / "result.json").read_text())["distance"] == rows

    calls.clear()
    worker(*args)  # everything done: nothing trained, nothing measured again
    assert calls == [] and json.loads((final / "distance.json").read_text()) == rows

    # `memzoo distance RUN_DIR` with the suite's settings reads the same rows back, measuring nothing.
    from memzoo.cli import main
    assert main(["distance", str(final), "--gaps", "1,4,16", "--trials", "2", "--segments-per-call", "4", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == rows and json.loads((final / "distance.json").read_text()) == rows
    assert main(["distance", str(final), "--gaps", "4,0"]) == 2
    assert "gaps=[4, 0]" in capsys.readouterr().err

    # A stream past its budget keeps the gaps it reached; the rest are out of budget, and stay so.
    class Budget(Meter):
        def check(self, done: int, total: int) -> None:
            if done > 6 * 16:
                raise memzoo.evaluations.distance.OutOfBudget(f"stopped after {done} bytes")

    monkeypatch.setattr(memzoo.evaluations.distance, "Meter", Budget)
    other = DistanceConfig(gaps=[1, 4, 16], trials=2, seed=1, segments_per_call=1)
    status = {(r["gap_segments"], r["reset_after_pairs"]): r["status"] for r in evaluate_distance(final, other)}
    assert status == {(1, False): "ok", (1, True): "ok", (4, False): "ok", (4, True): "ok",
                      (16, False): "out of budget: stopped after 112 bytes", (16, True): "out of budget: stopped after 112 bytes"}
    monkeypatch.setattr(memzoo.evaluations.distance, "Meter", Meter)
    longer = DistanceConfig(gaps=[1, 4, 16, 64], trials=2, seed=1, segments_per_call=1)
    status = {r["gap_segments"]: r["status"] for r in evaluate_distance(final, longer) if not r["reset_after_pairs"]}
    assert status[16].startswith("out of budget: stopped") and status[64] == "out of budget: gap 16 ran out"
