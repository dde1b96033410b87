"""The figure recipes read a results table as a user would in a notebook."""
from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

from memzoo.analysis import bpb_by_segment, footprint_vs_bpb, load_results, long_by_segment  # noqa: E402


def write_runs(root: Path) -> None:
    rows = [
        ("local", 0, 0, 3.0, [3.1, 3.0, 2.9]),
        ("infini-linear", 0, 16896, 2.8, [3.1, 2.8, 2.5]),
        ("infini-linear", 1, 16896, 2.9, [3.2, 2.9, 2.6]),
    ]
    for i, (m, seed, fp, bpb, by) in enumerate(rows):
        d = root / f"run{i}"
        d.mkdir(parents=True)
        (d / "result.json").write_text(json.dumps(
            {"method": m, "seed": seed, "footprint_measured": fp, "valid_bpb": bpb, "bpb_by_segment": by}))


def test_results_table_and_figures(tmp_path: Path) -> None:
    write_runs(tmp_path)
    df = load_results(tmp_path)
    assert len(df) == 3 and set(df["method"]) == {"local", "infini-linear"}
    long = long_by_segment(df)
    assert len(long) == 9
    sel = long[(long.method == "infini-linear") & (long.segment == 2)]["bpb"]
    assert sorted(sel.tolist()) == [2.5, 2.6]
    ax = footprint_vs_bpb(df)
    assert ax.get_xscale() == "log"
    ax2 = bpb_by_segment(df)
    assert len(ax2.get_lines()) >= 2


def test_passkey_recipes_read_json_rows_and_mark_out_of_budget() -> None:
    import pandas as pd

    from memzoo.analysis import cost_vs_length, longrange_table, passkey_heatmaps

    def rows(method_ok: bool) -> str:
        out = []
        for length in (4096, 1048576):
            for depth in (0.0, 1.0):
                ok = method_ok or length == 4096
                out.append({"length": length, "depth": depth, "accuracy": (1.0 if depth else 0.5) if ok else None,
                            "tokens_per_s": 1000.0 if ok else None, "peak_rss_mb": 500.0 + (length > 4096) if ok else None,
                            "status": "ok" if ok else "out of budget: time limit"})
        return json.dumps(out)

    df = pd.DataFrame([{"method": "infini-linear", "seed": 0, "passkey_json": rows(True)},
                       {"method": "full", "seed": 0, "passkey_json": rows(False)},
                       {"method": "local", "seed": 0}])  # a run without passkey rows
    table = longrange_table(df)
    assert len(table) == 8 and set(table["method"]) == {"infini-linear", "full"}
    assert table[(table.method == "infini-linear") & (table.length == 4096) & (table.depth == 0.0)]["accuracy"].item() == 0.5
    fig = passkey_heatmaps(df)
    texts = {ax.get_title(): [t.get_text() for t in ax.texts] for ax in fig.axes if ax.get_title()}
    assert texts["full"] == ["0.50", "1.00", "oob", "oob"]  # the values, then the out-of-budget cells (1M)
    full_ax = next(ax for ax in fig.axes if ax.get_title() == "full")
    assert [tuple(t.get_position()) for t in full_ax.texts if t.get_text() == "oob"] == [(1.5, 0.5), (1.5, 1.5)]  # 1M column
    assert texts["infini-linear"] == ["0.50", "0.50", "1.00", "1.00"]
    axes = cost_vs_length(df)
    assert axes[0].get_xscale() == "log" and len(axes[0].get_lines()) >= 2
    assert longrange_table(pd.DataFrame([{"method": "local", "seed": 0}])).empty
    # a passkey row's own "seed" (the one that drew its prompts) never hides its run's seed
    seeded = json.dumps([{**json.loads(rows(True))[0], "seed": 0}])
    two = longrange_table(pd.DataFrame([{"method": "rmt", "seed": s, "passkey_json": seeded} for s in (0, 1)]))
    assert two["seed"].tolist() == [0, 1] and two["prompt_seed"].tolist() == [0, 0]
    assert passkey_heatmaps(pd.DataFrame([{"method": "local", "seed": 0}])) is None


def test_length_cost_ratios_compare_equal_batches() -> None:
    import pandas as pd

    from memzoo.analysis import length_cost_table

    rows = [{"length": n, "depth": 0.0, "accuracy": 0.0, "status": "ok", "rows_in_batch": b, "peak_rss_mb": rss,
             "tokens_per_s": tps} for n, b, rss, tps in
            [(32768, 12, 600.0, 9000.0), (262144, 3, 400.0, 8000.0), (1048576, 3, 420.0, 8400.0)]]
    table = length_cost_table(pd.DataFrame([{"method": "rmt", "seed": 0, "passkey_json": json.dumps(rows)}]))
    row = table.iloc[0]
    assert row["ratio_of"] == "1M / 256K" and abs(row["rss_ratio"] - 1.05) < 1e-9  # not 420 / 600 (other batch)
    assert abs(row["tokens_per_s_ratio"] - 1.05) < 1e-9 and row["rss_mb_32K"] == 600.0


def test_gate_heatmaps_draw_one_panel_per_method_and_memory_size() -> None:
    """A method swept over its memory size has one set of gates per size (Infini over its head
    count: 4 or 2 heads); each size gets its own panel with its own heads, never a mixed grid."""
    import pandas as pd

    from memzoo.analysis.gates import gate_heatmaps, gate_table

    rows = []
    for state, heads in ((2176, 4), (4224, 2)):
        for seed in (0, 1):
            gates = {str(layer): [0.1 * (layer + 1) + 0.01 * h + 0.001 * seed for h in range(heads)] for layer in range(2)}
            rows.append({"method": "infini-delta", "seed": seed, "footprint_measured": state, "gates_json": json.dumps(gates)})
    df = pd.DataFrame(rows)
    table = gate_table(df)
    assert set(table["state"]) == {2176, 4224}
    assert len(table) == 2 * (2 * 4 + 2 * 2)  # two seeds x (2 layers x 4 heads + 2 layers x 2 heads)
    fig = gate_heatmaps(df)
    titles = [ax.get_title() for ax in fig.axes]
    assert titles == ["infini-delta, state 2,176", "infini-delta, state 4,224"]
    first = fig.axes[0].texts  # annotated cells of the 4-head panel: first seed only
    assert sorted(t.get_text() for t in first) == sorted(f"{0.1 * (l + 1) + 0.01 * h:.2f}" for l in range(2) for h in range(4))
