"""The overview table (the README's and docs/results.md's `<!-- generated:overview -->`): one row per
method from five sources, sorted by the window suite's bits per byte, a dash where a source has no row
of the method, each column's best memory in bold and the controls never. Built here from hand-made
rows: subsets of the shipped suites (one method moved) and made-up speed measurements."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from memzoo.publishing.overview import LM_SUITE, overview_table
from memzoo.publishing.references import load_references
from memzoo.publishing.shipped import shipped_rows


def some(suite: str, methods: list[str]) -> pd.DataFrame:
    rows = load_references(suite)
    return rows[rows["method"].isin(methods)].reset_index(drop=True)


@pytest.fixture(scope="module")
def sources() -> dict[str, pd.DataFrame]:
    window = some("lm-window", ["local", "gated-deltanet", "rmt", "xl"])  # xl: mem_len 33 and 128
    rmt = window["method"] == "rmt"  # 0.05 below the floor at every seed and segment: the best, after Holm
    window.loc[rmt, "bpb_by_segment"] = window.loc[rmt, "bpb_by_segment"].map(lambda b: [x - 0.05 for x in b])
    gpu = pd.DataFrame([("T4", m, o, t, 100.0) for m, o, t in [
        ("local", "", 100.0), ("xl", "", 50.0), ("rmt", "compile=eager", 40.0), ("rmt", "compile=default", 70.0),
        ("full", "", 90.0)]], columns=["card", "method", "options", "tokens_per_s", "local_tokens_per_s"])
    cpu = pd.DataFrame([("lm-window", m, v, c, s) for m, v, c, s in [
        ("local", "local", 0, 1.0), ("xl", "xl mem_len=33", 0, 0.6), ("xl", "xl mem_len=128", 0, 0.8),
        ("gated-deltanet", "gated-deltanet", 0, 0.4), ("gated-deltanet", "gated-deltanet", 1024, 0.95)]],
        columns=["suite", "method", "variant", "carried_bytes", "speed_vs_local"])
    return {LM_SUITE: window, "capacity-top": some("capacity-top", ["local", "deltanet", "titans-mac"]),
            "distance": some("distance", ["local", "infini-delta", "xl", "rmt"]), "gpu-speed": gpu, "cpu-cost": cpu}


def cells(table: str) -> tuple[list[str], dict[str, dict[str, str]]]:
    """The table's header and, per method (its first cell, backticks dropped), its cells by column."""
    lines = table.strip().splitlines()
    header = [c.strip() for c in lines[0].strip("|").split(" | ")]
    rows = [[c.strip() for c in line.strip().strip("|").split(" | ")] for line in lines[2:]]
    return header, {r[0].replace("`", ""): dict(zip(header, r)) for r in rows}


COLUMNS = {"state": "memory's state numbers (LM)", "cpu": "CPU step speed vs local",
           "lm": "bits per byte vs window floor, segments ≥ 1", "recall": "recall at its state",
           "reach": "recall ≥ 0.5 up to (gap)", "gpu": "GPU step speed vs local (T4)", "seeds": "seeds (LM / recall / reach)"}


@pytest.fixture(scope="module")
def overview(sources: dict[str, pd.DataFrame]) -> tuple[list[str], dict[str, dict[str, str]]]:
    return cells(overview_table(sources))


def test_one_row_per_method_sorted_by_the_window_suite_best_first(overview) -> None:
    header, rows = overview
    assert header == ["method", *(COLUMNS[k] for k in ("seeds", "state", "cpu", "lm", "recall", "reach", "gpu"))]
    assert list(rows) == ["rmt", "gated-deltanet", "local", "xl mem_len=33", "full (lm-stream's rows)",
                          "deltanet", "infini-delta", "titans-mac"]  # no window row: last, by name
    assert rows["local"][COLUMNS["lm"]] == "ref (the floor)"
    # the lm-window table's difference and interval; Holm over this fixture's five comparisons: significant
    assert rows["gated-deltanet"][COLUMNS["lm"]] == "−0.007 ± 0.003 *"


def test_each_column_marks_its_best_memory_and_never_a_control(overview) -> None:
    _, rows = overview
    bold = {key: sorted(m for m, r in rows.items() if r[col].startswith("**")) for key, col in COLUMNS.items()}
    assert bold == {"state": ["rmt"], "cpu": ["xl mem_len=33"], "lm": ["rmt"], "recall": ["deltanet"],
                    "reach": ["infini-delta"], "gpu": ["rmt"], "seeds": []}
    lm = rows["rmt"][COLUMNS["lm"]]
    assert lm.startswith("**−0.0") and lm.endswith("** *"), lm  # significant after Holm: the mark outside the bold
    assert rows["local"][COLUMNS["state"]] == "0" and rows["full (lm-stream's rows)"][COLUMNS["gpu"]] == "0.90"


def test_each_cell_comes_from_its_source_and_a_missing_row_is_a_dash(overview) -> None:
    _, rows = overview
    assert rows["xl mem_len=33"][COLUMNS["cpu"]] == "**0.60**"  # its own variant's row, not mem_len=128's faster one
    assert rows["gated-deltanet"][COLUMNS["cpu"]] == "0.40"  # a window after 1,024 carried bytes is not the step
    assert rows["rmt"][COLUMNS["cpu"]] == "–" and rows["local"][COLUMNS["cpu"]] == "ref"
    assert rows["rmt"][COLUMNS["gpu"]] == "**0.70 (compile=default)**"  # the fastest of its two, named
    assert rows["xl mem_len=33"][COLUMNS["gpu"]] == "0.50"
    assert rows["deltanet"][COLUMNS["recall"]] == "**1.00 at 6,336**"
    assert rows["titans-mac"][COLUMNS["recall"]] == "0.50 at 8,192" and rows["rmt"][COLUMNS["recall"]] == "–"
    assert rows["infini-delta"][COLUMNS["reach"]] == "**256 (normalizer=paper)**"  # the farther of its two
    assert rows["xl mem_len=33"][COLUMNS["reach"]] == "1" and rows["local"][COLUMNS["reach"]] == "none"
    assert rows["gated-deltanet"][COLUMNS["reach"]] == "–"
    assert rows["rmt"][COLUMNS["seeds"]] == "3 / – / 1" and rows["deltanet"][COLUMNS["seeds"]] == "– / 3 / –"


def test_a_source_with_no_rows_gives_a_column_of_dashes(sources: dict[str, pd.DataFrame]) -> None:
    header, rows = cells(overview_table({**sources, "capacity-top": pd.DataFrame(), "gpu-speed": pd.DataFrame()}))
    assert header[-1] == "GPU step speed vs local"  # no card to name
    assert {r[COLUMNS["recall"]] for r in rows.values()} == {"–"} and {r[header[-1]] for r in rows.values()} == {"–"}
    assert "deltanet" not in rows and "titans-mac" not in rows  # methods only capacity-top measured
    assert rows["rmt"][COLUMNS["seeds"]] == "3 / – / 1"


def test_cpu_cost_rows_are_read_once_shipped(tmp_path: Path, monkeypatch) -> None:
    """Before memzoo/references/cpu-cost.csv exists its column is dashes; once there, its rows are read."""
    import memzoo.publishing.references as references

    monkeypatch.setattr(references, "references_dir", lambda: tmp_path)
    assert shipped_rows("cpu-cost").empty
    pd.DataFrame({"method": ["xl"], "variant": ["xl"], "carried_bytes": [0], "speed_vs_local": [0.5]}).to_csv(
        tmp_path / "cpu-cost.csv", index=False)
    assert shipped_rows("cpu-cost")["speed_vs_local"].tolist() == [0.5]


def test_a_cpu_cell_reads_the_nearest_measured_variant_and_names_it() -> None:
    """The CPU cost suite measures fewer variants than a window suite runs: a window variant without its own
    row reads the variant sharing most of its options and no other, named ("defaults" for one with none); its
    own row, unnamed; a variant with no such row, the method's fastest, named."""
    from memzoo.publishing.overview import speed_cells

    rows = pd.DataFrame({"method": ["local", "xl", "xl", "xl"],
                         "variant": ["local", "xl mem_len=128", "xl mem_len=33", "xl mem_len=128, cache=kv"],
                         "ratio": [1.0, 0.8, 0.9, 0.85]})
    name = lambda r: r["variant"][3:]  # noqa: E731

    def cell(preferred: str, keep: list[int]) -> str:
        part = rows.iloc[keep]
        return speed_cells(part, part["ratio"], lambda m: preferred, name)["xl"].text

    assert cell("xl mem_len=128, cache=kv", [0, 1, 2, 3]) == "0.85"  # its own row
    assert cell("xl mem_len=128, cache=kv", [0, 1, 2]) == "0.80 (mem_len=128)"  # the nearest, not the fastest
    assert cell("xl mem_len=64, cache=kv", [0, 1, 2]) == "0.90 (mem_len=33)"  # none shares: the fastest
    both = pd.DataFrame({"method": ["local", "xl", "xl"], "variant": ["local", "xl", "xl mem_len=128"], "ratio": [1.0, 0.9, 0.8]})
    assert speed_cells(both, both["ratio"], lambda m: "xl mem_len=128, cache=kv", name)["xl"].text == "0.80 (mem_len=128)"
    lone = pd.DataFrame({"method": ["local", "xl"], "variant": ["local", "xl"], "ratio": [1.0, 0.7]})
    assert speed_cells(lone, lone["ratio"], lambda m: "xl cache=kv", name)["xl"].text == "0.70 (defaults)"
    assert speed_cells(lone, lone["ratio"], lambda m: "xl", name)["xl"].text == "0.70"
