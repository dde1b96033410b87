"""Statistics over seeds (t intervals, Welch tests, Holm) and the capacity recipes, on synthetic tables
whose answers can be checked by hand."""
from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from memzoo.analysis import capacity_curves, capacity_table, capacity_thresholds, pareto_front, summary_table  # noqa: E402
from memzoo.analysis.stats import holm, mean_interval, welch_p  # noqa: E402


def test_t_interval_by_hand() -> None:
    mean, lo, hi = mean_interval([1.0, 2.0, 3.0])  # sd 1, n 3: t_{0.975, 2} = 4.302653
    assert mean == 2.0 and hi - mean == pytest.approx(4.302653 / math.sqrt(3), rel=1e-6)
    assert lo == pytest.approx(2.0 - 2.484138, rel=1e-6)
    one = mean_interval([2.5])
    assert one[0] == 2.5 and math.isnan(one[1]) and math.isnan(one[2])


def test_welch_equals_the_textbook_formula() -> None:
    a, b = [1.0, 2.0, 3.0, 4.0], [2.0, 4.0, 9.0]
    # t = (2.5 - 5) / sqrt(1.6667/4 + 13/3) = -1.1471; Welch df = 4.75² / (0.41667²/3 + 4.3333²/2) = 2.3884
    from scipy import stats

    t = (2.5 - 5.0) / math.sqrt((5 / 3) / 4 + 13 / 3)
    df = ((5 / 3) / 4 + 13 / 3) ** 2 / (((5 / 3) / 4) ** 2 / 3 + (13 / 3) ** 2 / 2)
    assert df == pytest.approx(2.3884, abs=1e-3)
    assert welch_p(a, b) == pytest.approx(2 * stats.t.sf(abs(t), df), rel=1e-9)
    assert welch_p(a, b) == pytest.approx(stats.ttest_ind(a, b, equal_var=False).pvalue, rel=1e-9)
    assert math.isnan(welch_p([1.0], [2.0, 3.0]))


def test_welch_is_calibrated_and_has_power() -> None:
    """Same distribution: about 5% of 3-seed pairs come out p < 0.05; a margin of 5 sd: nearly all."""
    rng = np.random.default_rng(0)
    same = [welch_p(rng.normal(3.0, 0.02, 3), rng.normal(3.0, 0.02, 3)) for _ in range(2000)]
    rate = float(np.mean(np.array(same) < 0.05))
    assert 0.02 <= rate <= 0.07, rate  # Welch with n = 3 is slightly conservative
    apart = [welch_p(rng.normal(3.0, 0.02, 3), rng.normal(2.9, 0.02, 3)) for _ in range(200)]
    assert np.mean(np.array(apart) < 0.05) > 0.9


def test_holm_step_down() -> None:
    assert holm([0.01, 0.04, 0.03]) == [True, False, False]  # 0.01 <= 0.05/3; 0.03 > 0.05/2 stops
    assert holm([0.01, 0.02, 0.04]) == [True, True, True]  # 0.0167, 0.025, 0.05
    assert holm([float("nan"), 0.04]) == [False, True]  # NaN is not a test: a family of one


def _lm_rows(means: dict[str, float], seeds: int, sd: float = 0.02, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame([{"method": m, "seed": s, "valid_bpb": mu + rng.normal(0, sd), "params": 821504,
                          "footprint_measured": 0 if m == "local" else 16896, "tokens_per_s": 14900.4,
                          "train_tokens_per_s": 8263.0, "peak_rss_mb": 954.074}
                         for m, mu in means.items() for s in range(seeds)])


def test_summary_marks_a_known_margin_and_not_a_shared_distribution() -> None:
    df = _lm_rows({"local": 3.0, "better": 2.9, "same": 3.0}, seeds=3)
    t = summary_table(df).set_index("method")
    assert list(t.index) == ["better", "local", "same"] or list(t.index) == ["better", "same", "local"]
    assert t.loc["better", "sig_vs_local"] and t.loc["better", "diff_vs_local"] == pytest.approx(-0.1, abs=0.04)
    assert not t.loc["same", "sig_vs_local"] and t.loc["same", "p_vs_local"] > 0.05
    assert t.loc["better", "is_best"] and t.loc["local", "sig_vs_best"] and t.loc["same", "sig_vs_best"]
    assert t.loc["better", "bpb_ci"] > 0 and t.loc["better", "bpb_lo"] < t.loc["better", "bpb_mean"] < t.loc["better", "bpb_hi"]
    one = summary_table(df[df["seed"] == 0]).set_index("method")  # one seed: no interval, nothing marked
    assert one["bpb_ci"].isna().all() and not one["sig_vs_local"].any() and not one["sig_vs_best"].any()


def test_report_tables_format_per_column() -> None:
    from memzoo.evaluations.reporting import summary_display  # the lm kind's report section

    shown = summary_display(_lm_rows({"local": 3.0, "better": 2.9}, seeds=3)).set_index("method")
    assert shown.loc["local", "footprint"] == "0" and shown.loc["better", "footprint"] == "16,896"
    assert shown.loc["local", "peak_rss_mb"] == "954" and shown.loc["local", "params"] == "821,504"
    assert shown.loc["local", "tokens_per_s"] == "14,900"
    assert shown.loc["better", "valid_bpb"].count(" ± ") == 1 and len(shown.loc["better", "valid_bpb"].split(" ± ")[0]) == 5
    assert shown.loc["local", "vs local"] == "ref" and shown.loc["better", "vs best"] == "ref"
    assert shown.loc["better", "vs local"].startswith("-0.") and shown.loc["better", "vs local"].endswith(" *")
    from memzoo.analysis.cells import format_value
    from memzoo.publishing.sections import console_table  # what `memzoo compare` prints at the end

    assert format_value("params", np.int64(821504)) == "821,504" and format_value("lr", 3e-4) == "0.0003"
    assert format_value("valid_bpb", np.float32(3.8374)) == "3.837" and format_value("p_vs_local", np.nan) == ""

    xl = console_table(capacity_rows()).set_index(["gap_segments", "method", "state"]).loc[("1", "xl", "2,048")]
    assert xl["accuracy"] == "0.950 ± 0.124" and xl["vs best"] == "-0.050 ± 0.124 (p 0.23)"  # 0.95 against 1.0: not significant


def capacity_rows() -> pd.DataFrame:
    """4 pairs (chance 0.25), gaps 1 and 2, two learning rates, three seeds. At gap 1, xl's mean
    accuracy by (state, lr): 512: 0.55 at 1e-3, 0.40 at 1e-2; 1024: 0.60 (1e-2); 2048: 0.95 (1e-2).
    Best of lr per cell, so xl reaches 0.5 at 512 (not at 1024, as pooling the lrs would say) and 0.9 at 2048."""
    cells = {  # (method, mem_len, state, gap, lr): accuracies of seeds 0, 1, 2
        ("xl", 16, 512, 1, 1e-3): [0.55, 0.55, 0.55], ("xl", 16, 512, 1, 1e-2): [0.3, 0.4, 0.5],
        ("xl", 32, 1024, 1, 1e-3): [0.2, 0.2, 0.2], ("xl", 32, 1024, 1, 1e-2): [0.5, 0.6, 0.7],
        ("xl", 64, 2048, 1, 1e-3): [0.5, 0.5, 0.5], ("xl", 64, 2048, 1, 1e-2): [0.9, 0.95, 1.0],
        ("xl", 64, 2048, 2, 1e-2): [0.3, 0.3, 0.3],
        ("full", None, 4096, 1, 1e-2): [1.0, 1.0, 1.0], ("full", None, 4096, 2, 1e-2): [0.95, 1.0, 1.0],
        ("local", None, 0, 1, 1e-2): [0.25, 0.2, 0.3], ("local", None, 0, 2, 1e-2): [0.25, 0.25, 0.2],
    }
    return pd.DataFrame([{"method": m, "grid_mem_len": mem, "footprint_measured": state, "gap_segments": gap, "lr": lr,
                          "seed": s, "pairs": 4, "d_model": 64, "recall_accuracy": acc, "recall_chance": 0.25,
                          "recall_accuracy_reset": 0.25, "recall_queries": 64, "suite": "capacity"}
                         for (m, mem, state, gap, lr), accs in cells.items() for s, acc in enumerate(accs)])


def test_capacity_thresholds_take_the_best_lr_per_cell() -> None:
    t = capacity_thresholds(capacity_rows()).set_index(["gap_segments", "method"])
    assert t.loc[(1, "xl"), "state_at_0.5"] == 512 and t.loc[(1, "xl"), "state_at_0.9"] == 2048
    assert t.loc[(2, "xl"), "state_at_0.5"] == "not reached"
    assert t.loc[(1, "full"), "state_at_0.9"] == 4096 and t.loc[(2, "local"), "state_at_0.5"] == "not reached"


def test_capacity_table_intervals_ablation_and_tests() -> None:
    t = capacity_table(capacity_rows()).set_index(["gap_segments", "method", "state"])
    top = t.loc[(1, "xl", 2048)]
    assert top["lr"] == 1e-2 and top["runs"] == 3 and top["accuracy"] == pytest.approx(0.95)
    assert top["accuracy_ci"] == pytest.approx(4.302653 * 0.05 / math.sqrt(3), rel=1e-6)
    assert top["reset"] == 0.25 and top["chance"] == 0.25 and top["sig_vs_local"]
    assert t.loc[(1, "full", 4096), "is_best"] and not t.loc[(2, "xl", 2048), "is_best"]
    assert t.loc[(2, "xl", 2048), "diff_vs_local"] == pytest.approx(0.3 - 0.7 / 3)


def test_pareto_front_by_hand() -> None:
    pts = pd.DataFrame({"state": [1, 512, 1024, 2048, 4096, 4096], "accuracy": [0.25, 0.55, 0.5, 0.95, 1.0, 0.9]})
    front = pareto_front(pts)
    assert list(zip(front["state"], front["accuracy"])) == [(1, 0.25), (512, 0.55), (2048, 0.95), (4096, 1.0)]


def test_capacity_figure_and_report(tmp_path: Path) -> None:
    from memzoo.publishing.report import write_report

    df = capacity_rows()
    fig = capacity_curves(df)
    axes = [ax for ax in fig.axes if ax.get_title()]
    assert [ax.get_title() for ax in axes] == ["4 pairs, 1 segment back", "4 pairs, 2 segments back"]
    assert all(ax.get_xscale() == "log" for ax in axes)
    from matplotlib.collections import PathCollection

    hollow = [c for c in axes[0].collections if isinstance(c, PathCollection) and c.get_facecolors().size == 0]
    assert sorted(float(y) for c in hollow for _, y in c.get_offsets()) == [0.25] * 5  # one reset point per cell
    assert any(list(line.get_ydata()) == [0.25, 0.25] for line in axes[0].get_lines())  # chance
    df.to_parquet(tmp_path / "results.parquet")
    md, html = write_report(tmp_path)
    text = md.read_text()
    assert (tmp_path / "capacity.png").stat().st_size > 1000 and "](capacity.png)" in text
    assert "| 4 | 1 | xl | 512 | 2,048 |" in text  # thresholds: pairs, gap, method, 0.5, 0.9
    assert "| 4 | 1 | xl | 2,048 | 64 | 64 | 0.01 | 3 | 0.950 ± 0.124 |" in text
    assert "## Summary" not in text and html.read_text().count("data:image/png;base64,") == 1


def test_passkey_accuracy_interval_is_over_seeds() -> None:
    import json

    from memzoo.evaluations.reporting import passkey_summary

    def rows(depth0: float) -> str:  # depth 0 at `depth0`, depth 1 always right: the seed's mean is (depth0 + 1) / 2
        return json.dumps([{"length": 4096, "depth": d, "accuracy": depth0 if d == 0 else 1.0, "tokens_per_s": 1000.0,
                            "peak_rss_mb": 500.0, "status": "ok"} for d in (0, 1)])

    df = pd.DataFrame([{"method": "xl", "seed": s, "passkey_json": rows(a)} for s, a in enumerate([0.0, 1.0, 0.5])])
    row = passkey_summary(df).iloc[0]  # seed means 0.5, 1.0, 0.75: sd 0.25 over 3 seeds
    assert row["accuracy"] == 0.75 and row["accuracy_ci"] == pytest.approx(4.302653 * 0.25 / math.sqrt(3), rel=1e-6)


def babilong_rows() -> pd.DataFrame:
    """Two methods x three seeds; infini's qa1 accuracy at 0 / 1k / 4k bytes is (1.0, 0.8, x) with x = 0.2,
    0.5, 0.8 by seed; its reset arm is 0.3 at 1k; local is 0.3 everywhere, never reset."""
    import json

    def cell(task: str, length: str, acc: float, reset: bool = False) -> dict:
        return {"task": task, "length": length, "reset_before_question": reset, "status": "ok",
                "accuracy_official": acc, "accuracy_exact": acc - 0.1, "label_chance": 0.31, "n": 100,
                "trained_length": 1024}

    out = []
    for seed, far in enumerate([0.2, 0.5, 0.8]):
        infini = [cell("qa1", "0", 1.0), cell("qa1", "1k", 0.8), cell("qa1", "4k", far), cell("qa1", "1k", 0.3, True)]
        out.append({"method": "infini-delta", "seed": seed, "babilong_json": json.dumps(infini)})
        out.append({"method": "local", "seed": seed,
                    "babilong_json": json.dumps([cell("qa1", n, 0.3) for n in ("0", "1k", "4k")])})
    return pd.DataFrame(out)


def test_babilong_summary_figure_and_report(tmp_path: Path) -> None:
    """Means and t intervals over seeds per (method, task, length), lengths ordered in bytes, the reset
    arm merged beside its plain row; the figure draws one line per method and the label chance."""
    from memzoo.analysis import babilong_curves, babilong_summary
    from memzoo.publishing.report import write_report

    df = babilong_rows()
    s = babilong_summary(df)
    infini = s[s["method"] == "infini-delta"]
    assert list(infini["length_bytes"]) == [0, 1024, 4096]  # "1k" < "4k" < ... by bytes, not by name
    far = infini.iloc[2]
    assert far["accuracy"] == pytest.approx(0.5) and far["runs"] == 3
    assert far["accuracy_ci"] == pytest.approx(4.302653 * 0.3 / math.sqrt(3), rel=1e-6)  # sd 0.3 over 3 seeds
    assert far["exact"] == pytest.approx(0.4) and far["label_chance"] == pytest.approx(0.31)
    assert infini.iloc[1]["reset"] == pytest.approx(0.3) and np.isnan(infini.iloc[0]["reset"])
    assert s[s["method"] == "local"]["reset"].isna().all() and (s["trained_length"] == 1024).all()
    fig = babilong_curves(df)
    (ax,) = [a for a in fig.axes if a.get_title() == "qa1"]
    ys = [list(line.get_ydata()) for line in ax.get_lines()]
    assert [0.31, 0.31, 0.31] in [[round(v, 2) for v in y] for y in ys]  # the label chance
    assert [0.3] in [[round(v, 2) for v in y] for y in ys]  # infini's reset arm, at 1k only
    df.to_parquet(tmp_path / "results.parquet")
    md, _ = write_report(tmp_path)
    text = md.read_text()
    assert (tmp_path / "babilong.png").stat().st_size > 1000 and "](babilong.png)" in text
    assert "| infini-delta | qa1 | 4,096 | 3 | 0.500 ± 0.745 |" in text
