"""CPU cost measured side by side (memzoo.suites.cpu_cost, benchmarks/speed/cpu_cost.py): interleaved rounds
and medians on a fake clock, speeds against `local` at the same carried bytes, the suite's own runs and
labels, the documents a window reads, the shipped rows' schema, and the table, facts and figure drawn
from them (docs/cpu-cost.md)."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import torch

from memzoo.core.config import ConfigError
from memzoo.publishing.facts import all_facts, cpu_cost_facts
from memzoo.publishing.figures import FIGURES, ROWS_KEY, png_text, rows_stamp
from memzoo.publishing.references import MEASURED, load_measured, load_references
from memzoo.publishing.cpu_cost import cpu_cost_md
from memzoo.suites import cpu_cost as cc

ROOT = Path(__file__).resolve().parent.parent


class FakeClock:
    """A clock that moves only when a task says how long it ran."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def scripted(clock: FakeClock, seconds: list[float]):
    """A task that 'runs' for the next of `seconds` on `clock` and returns what the clock measured."""
    left = iter(seconds)

    def run() -> float:
        start = clock()
        clock.now += next(left)
        return clock() - start
    return run


def test_rounds_interleave_every_task_once_in_order_after_a_warmup_and_the_median_is_taken() -> None:
    """Round r times every (variant, carried) once, in order; the warm-up call is not kept; one slow round
    (the machine busy) moves no median, and each speed is local's median over the variant's."""
    clock = FakeClock()
    tasks = {("local", 0): scripted(clock, [50.0, 1.0, 9.0, 1.25]),  # warm-up 50 s, then a busy round (9 s)
             ("xl", 0): scripted(clock, [70.0, 2.0, 18.0, 2.5]),
             ("local", 1024): scripted(clock, [1.0, 1.0, 1.0, 1.0]),
             ("full", 1024): scripted(clock, [4.0, 4.0, 4.0, 4.0])}
    order: list = []
    times = cc.interleaved(tasks, rounds=3, warmup=1, order=order)
    assert order == list(tasks) * 3  # interleaved, not all rounds of one variant before the next
    assert times[("local", 0)] == [1.0, 9.0, 1.25] and times[("xl", 0)] == [2.0, 18.0, 2.5]
    table = cc.speeds(times).set_index(["variant", "carried_bytes"])
    assert table.loc[("local", 0), "median_s"] == 1.25 and table.loc[("xl", 0), "median_s"] == 2.5
    assert table.loc[("xl", 0), "speed_vs_local"] == pytest.approx(1.25 / 2.5)  # < 1: slower than the floor
    assert table.loc[("local", 0), "speed_vs_local"] == 1.0
    assert table.loc[("full", 1024), "speed_vs_local"] == pytest.approx(0.25)  # against local at the same bytes
    assert table.loc[("xl", 0), "min_s"] == 2.0 and table.loc[("xl", 0), "max_s"] == 18.0
    assert (table["rounds"] == 3).all()
    with pytest.raises(ValueError, match="rounds=0"):
        cc.interleaved(tasks, rounds=0)
    with pytest.raises(ValueError, match="no 'local' timed at 3072"):
        cc.speeds({("local", 0): [1.0], ("full", 3072): [2.0]})


def test_a_window_task_reads_each_clock_around_the_window_and_starts_from_the_same_state(monkeypatch) -> None:
    """window_task returns one duration per clock, read just before and after train_window; every call
    starts from a copy of the carried state (a window that wrote into it would time the next call on
    another state), and gradients are cleared after the clocks stop."""
    from omegaconf import OmegaConf

    from memzoo.core.model import ModelState

    seen, ticks = [], iter(range(100))

    def writes_into_its_state(model, batch, bptt, aux, precision, state):
        seen.append((next(ticks), float(state.layers[0]["S"].sum())))  # the clock's reading, the state's
        state.layers[0]["S"].add_(1.0)
        model.weight.grad = torch.ones_like(model.weight)

    monkeypatch.setattr(cc, "train_window", writes_into_its_state)
    model = torch.nn.Linear(2, 2)
    cfg = OmegaConf.create({"train": {"bptt_segments": 4, "aux_loss_weight": 1.0, "precision": "fp32"}})
    state = ModelState([{"S": torch.zeros(3)}], {}, [])
    task = cc.window_task(model, cfg, None, state, clocks=(lambda: 10.0 * next(ticks), lambda: 7.0))
    assert task() == (20.0, 0.0)  # ticks 0 and 2 around the window's tick 1; a constant clock reads 0
    assert task() == (20.0, 0.0)
    assert [value for _, value in seen] == [0.0, 0.0]  # the second window saw the state, not the first's write
    assert float(state.layers[0]["S"].sum()) == 0.0 and model.weight.grad is None


def test_the_variants_are_the_suites_runs_labelled_as_its_tables_with_local_first() -> None:
    """Every (method, grid point) lm-window trains, at seed 0 and with the suite's config (its hash), labelled
    as the shipped window table labels its rows; the reference first."""
    from memzoo.analysis import variant_labels
    from memzoo.publishing.references import suite_hashes
    from memzoo.training.curriculum import config_hash

    variants = cc.suite_variants("lm-window")
    assert variants[0].label == "local"
    shipped = load_references("lm-window")
    assert {v.label for v in variants} == set(variant_labels(shipped)) | {"full"}  # full's rows are lm-stream's there
    assert {"xl mem_len=33", "xl mem_len=128", "infini-delta gate_init=-4", "memorizing"} <= {v.label for v in variants}
    hashes = suite_hashes("lm-window")
    assert sorted(config_hash(v.cfg) for v in variants) == sorted(h for name, h in hashes.items() if name.endswith("-s0"))
    only = cc.suite_variants("lm-window", methods=["xl"])
    assert [v.label for v in only] == ["local", "xl mem_len=128", "xl mem_len=33"]


def test_a_window_reads_whole_consecutive_segments_of_long_documents() -> None:
    variants = cc.suite_variants("lm-window", methods=["local"])
    batch = cc.long_documents(variants[0].cfg, 32, 8)
    assert batch.tokens.shape == (8, 32, 128) and bool(batch.mask.all())
    assert torch.equal(batch.tokens[..., 1:], batch.targets[..., :-1])  # the next byte
    assert torch.equal(batch.targets[:, :-1, -1], batch.tokens[:, 1:, 0])  # segments follow each other
    assert batch.reset[:, 0].all() and not batch.reset[:, 1:].any()
    assert len({bytes(batch.tokens[b, 0, :32].tolist()) for b in range(8)}) == 8  # eight documents


# ---- the shipped rows and what is drawn from them ---------------------------------------------

@pytest.fixture(scope="module")
def rows() -> pd.DataFrame:
    return load_measured("cpu-cost")


def test_the_shipped_rows_are_every_lm_window_variant_timed_beside_local(rows: pd.DataFrame) -> None:
    """Columns the overview table reads (method, variant, speed_vs_local), every lm-window variant once at no
    bytes carried, `full` at 1,024 and 3,072 too, one thread, at least three rounds, and each speed is the
    local median of the same rows over the variant's."""
    assert "cpu-cost" in MEASURED
    assert set(cc.COLUMNS) <= set(rows.columns)
    first = rows[rows["carried_bytes"] == 0]
    labels = [v.label for v in cc.suite_variants("lm-window")]
    assert sorted(first["variant"]) == sorted(labels) and (first["suite"] == "lm-window").all()
    assert {0, 1024, 3072} <= set(rows.loc[rows["variant"] == "full", "carried_bytes"])
    assert (rows["threads"] == 1).all() and (rows["rounds"] >= 3).all()
    for carried, group in rows.groupby("carried_bytes"):
        local = group[group["variant"] == "local"].iloc[0]
        assert local["speed_vs_local"] == 1.0
        assert (group["local_median_s"] == local["median_s"]).all(), carried
        assert ((group["local_median_s"] / group["median_s"] - group["speed_vs_local"]).abs() < 1e-3).all(), carried
        assert ((group["min_s"] <= group["median_s"]) & (group["median_s"] <= group["max_s"])).all()
    assert set(first["method"]) == {label.split(" ")[0] for label in labels}


def test_the_table_facts_and_figure_follow_the_rows(rows: pd.DataFrame) -> None:
    """The generated table shows each variant's speed at no bytes carried and at 3,072; the facts quote
    them; a changed row moves both; two rows of one variant and position are refused; the figure
    carries the hash of the shipped CSV."""
    table = cpu_cost_md(rows)
    header = table.splitlines()[0]
    assert "rounds" in header and "3,072 bytes carried" in header and header.count("|") - 1 <= 8
    gdn = rows[(rows["variant"] == "gated-deltanet") & (rows["carried_bytes"] == 0)].iloc[0]
    line = next(l for l in table.splitlines() if l.startswith("| `gated-deltanet` |"))
    assert f"| {gdn['speed_vs_local']:.2f} |" in line and line.split(" | ")[1] == str(gdn["rounds"])
    facts = all_facts(suites=["cpu-cost"])
    assert facts["cpu-cost.gated-deltanet.speed"] == f"{gdn['speed_vs_local']:.2f}"
    full = rows[(rows["variant"] == "full") & (rows["carried_bytes"] == 3072)].iloc[0]
    assert facts["cpu-cost.full.seconds_3072"] == f"{full['median_s']:.2f}"
    assert "cpu-cost.local.speed" not in facts and "cpu-cost.local.seconds" in facts
    moved = rows.copy()
    at = (moved["variant"] == "gated-deltanet") & (moved["carried_bytes"] == 0)
    moved.loc[at, "speed_vs_local"] = 0.123
    assert cpu_cost_facts(moved)["gated-deltanet.speed"] == "0.12"
    assert "| 0.12 |" in next(l for l in cpu_cost_md(moved).splitlines() if l.startswith("| `gated-deltanet` |"))
    with pytest.raises(ConfigError, match="two rows of 'gated-deltanet' at 0"):
        cpu_cost_facts(pd.concat([rows, rows[at]]))
    assert FIGURES["cpu-cost/speed.png"] == "cpu-cost"
    assert png_text(ROOT / "docs" / "cpu-cost" / "speed.png")[ROWS_KEY] == rows_stamp("cpu-cost")
    page = (ROOT / "docs" / "cpu-cost.md").read_text()
    assert "<!-- generated:cpu-cost-table -->" in page and "cpu-cost/speed.png" in page

