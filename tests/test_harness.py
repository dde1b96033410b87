"""The evaluation harness (memzoo.evaluations.harness): the budget and its projection, streaming in
chunks, a worker in its own process (and its death), reusing stored rows, and the atomic merge of
rows into a run's result.json."""
from __future__ import annotations

import json
import operator
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import pytest
import torch

import memzoo.evaluations.harness as harness
from memzoo.evaluations.harness import (WORKER_DIED, Meter, OutOfBudget, atomic_json, merge_into_result, reusable,
                                    run_isolated, stream)


@dataclass
class Budget:
    """The least an evaluation config offers the harness."""

    time_limit_s: Optional[float] = 100.0
    memory_limit_mb: Optional[float] = 10**9
    trials: int = 2

    def budget(self) -> dict[str, Optional[float]]:
        return {"time_limit_s": self.time_limit_s, "memory_limit_mb": self.memory_limit_mb}

    def settings(self) -> dict[str, Any]:
        return {"trials": self.trials}


def test_time_budget_projection(monkeypatch) -> None:
    """A steady stream with one slow chunk stays in budget; a stream whose cost per token grows
    (a state that grows) is stopped early, long before the limit is actually reached."""
    clock = [0.0]
    monkeypatch.setattr(harness.time, "perf_counter", lambda: clock[0])
    cfg = Budget()

    steady = Meter(cfg)
    for i in range(1, 101):  # 100 chunks of 1s = 100 tokens each; total 90 s expected, one 5 s hiccup
        clock[0] += 5.0 if i == 30 else 0.86
        steady.check(i * 100, 10_000)

    clock[0] = 0.0
    growing = Meter(cfg)
    with pytest.raises(OutOfBudget, match="projected"):
        for i in range(1, 101):
            clock[0] += 0.05 * i  # chunk i costs 0.05 i seconds: 252 s in all
            growing.check(i * 100, 10_000)
    assert clock[0] < 0.6 * cfg.time_limit_s, "stopped no earlier than a plain limit check would have"

    clock[0] = 0.0
    patient = Meter(cfg, project=False)  # the same growing stream runs on to the limit itself
    with pytest.raises(OutOfBudget, match="time limit 100 s reached"):
        for i in range(1, 101):
            clock[0] += 0.05 * i
            patient.check(i * 100, 10_000)
    assert clock[0] > cfg.time_limit_s


def test_memory_limit_stops_a_stream(monkeypatch) -> None:
    monkeypatch.setattr(harness, "current_rss_mb", lambda: 500.0)
    Meter(Budget(memory_limit_mb=600)).check(10, 100)
    with pytest.raises(OutOfBudget, match="memory limit 400 MB reached \\(500 MB\\) after 10 of 100"):
        Meter(Budget(memory_limit_mb=400)).check(10, 100)
    Meter(Budget(memory_limit_mb=400)).check(100, 100)  # the stream's end: nothing left to stop


class RecordingDecoder:
    """Records what `stream` feeds it."""

    def __init__(self, n: int, segments_per_call: int):
        self.n, self.segments_per_call, self.fed = n, segments_per_call, []

    def feed(self, tokens: torch.Tensor) -> None:
        self.fed.append(tokens.clone())


class RecordingMeter:
    def __init__(self):
        self.checks: list[tuple[int, int]] = []

    def check(self, done: int, total: int) -> None:
        self.checks.append((done, total))


def test_stream_feeds_whole_calls_and_checks_the_budget_after_each() -> None:
    data = torch.arange(2 * 23, dtype=torch.uint8).reshape(2, 23)  # [B, L]
    decoder, meter = RecordingDecoder(n=4, segments_per_call=2), RecordingMeter()
    stream(decoder, data, meter, "test", progress=False, offset=10, total=50)
    assert [t.shape[1] for t in decoder.fed] == [8, 8, 7]
    assert all(t.dtype == torch.long for t in decoder.fed)
    assert torch.equal(torch.cat(decoder.fed, 1), data.long())
    assert meter.checks == [(18, 50), (26, 50), (33, 50)]  # counted in the longer stream this piece is part of
    meter = RecordingMeter()
    stream(RecordingDecoder(4, 2), data, meter, "test", progress=False)
    assert meter.checks == [(8, 23), (16, 23), (23, 23)]


def test_run_isolated_returns_the_workers_result_or_the_died_rows() -> None:
    assert run_isolated(operator.add, (2, 3), lambda: "died") == 5
    assert run_isolated(os.abort, (), lambda: [{"status": WORKER_DIED}]) == [{"status": WORKER_DIED}]


def test_reusable_rows() -> None:
    """Same weights and settings: an ok row is kept; an out-of-budget row only under no larger a budget."""
    cfg = Budget(time_limit_s=100.0, memory_limit_mb=1000)
    ok = {"weights": "w1", "trials": 2, "status": "ok", "time_limit_s": 10, "memory_limit_mb": 10}
    assert reusable(ok, cfg, "w1")
    assert not reusable(ok, cfg, "w2")
    assert not reusable({**ok, "trials": 3}, cfg, "w1")
    oob = {**ok, "status": "out of budget: time", "time_limit_s": 100.0, "memory_limit_mb": 1000}
    assert reusable(oob, cfg, "w1")  # the same budget would run out again
    assert not reusable({**oob, "time_limit_s": 50.0}, cfg, "w1")  # a larger time budget: try again
    assert not reusable(oob, Budget(time_limit_s=None, memory_limit_mb=1000), "w1")  # no limit now
    assert reusable({**oob, "time_limit_s": None}, Budget(time_limit_s=None, memory_limit_mb=1000), "w1")


def test_merge_into_result_keeps_the_row_and_drops_generated_texts(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("memory: {name: rmt}\n")
    rows = [{"length": 4, "accuracy": 1.0, "generated": ["x"], "keys": ["1"]}]
    merge_into_result(run, "passkey", rows)  # no result.json yet: one is started
    assert json.loads((run / "result.json").read_text()) == {"name": "run", "method": "rmt",
                                                             "passkey": [{"length": 4, "accuracy": 1.0}]}
    atomic_json(run / "result.json", {"name": "run", "valid_bpb": 2.5, "passkey": []})
    merge_into_result(run, "recall", [{"length": 8}])
    assert json.loads((run / "result.json").read_text()) == {"name": "run", "valid_bpb": 2.5, "passkey": [],
                                                             "recall": [{"length": 8}]}
    assert sorted(p.name for p in run.iterdir()) == ["config.yaml", "result.json"]  # no temporary file left
