"""`memzoo scorecard` end to end on a one-step quick suite: the plugin's row is ranked beside the
shipped references, the report holds both, and a second run trains nothing."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pandas as pd
import pytest

from memzoo.cli import main
from memzoo.core.plugins import unregister_memory
from memzoo.publishing.references import load_references
from memzoo.evaluations.distance import recall_past_training
from memzoo.publishing.scorecard import SuiteScore, rank_table, score_table
from test_readme import readme_plugin_source

# One step of a one-layer model on 40 documents: the plumbing, not the numbers.
TINY = ["token_budget=64", "run.model.d_model=32", "run.model.n_layers=1", "run.model.n_heads=2", "run.model.segment_len=16",
        "run.train.batch_size=2", "run.train.window_segments=2", "run.train.bptt_segments=2", "run.train.warmup_steps=1",
        "run.data.max_docs=40", "run.eval.max_docs=2", "run.eval.max_segments_per_doc=2"]


@pytest.fixture
def plugin_file(tmp_path: Path):
    path = tmp_path / "decay_plugin.py"
    path.write_text(readme_plugin_source())
    yield path
    unregister_memory("my-decay")


def test_scorecard_ranks_the_plugin_beside_the_references_and_resumes(tmp_path: Path, plugin_file: Path, capsys) -> None:
    out = tmp_path / "card"
    args = ["scorecard", str(plugin_file), *TINY, "--suites", "quick", "--seeds", "1", "--out", str(out), "--jobs", "1",
            "--no-figures"]  # the figures are the report tests'; here the rows beside each other
    assert main(args) == 0
    text = (out / "scorecard.md").read_text()
    assert "**my-decay**" in text and "NOT comparable" in text  # overrides: said so
    combined = pd.read_parquet(out / "quick-scorecard" / "results.parquet")
    shipped = load_references("quick")
    assert set(combined.query("source == 'shipped'")["method"]) == set(shipped["method"])
    assert set(combined.query("source == 'plugin'")["method"]) == {"my-decay"}
    assert (combined["seed"] == 0).all()
    ranks = re.findall(r"^\| (\d+) \| ([^|]+) \|", text, flags=re.M)
    assert len(ranks) == combined["method"].nunique() and [int(r) for r, _ in ranks] == list(range(1, len(ranks) + 1))
    assert "my-decay" in (out / "quick-scorecard" / "report.md").read_text()
    result = out / "quick" / "runs" / "my-decay-s0" / "result.json"
    stamp = result.stat().st_mtime_ns
    capsys.readouterr()
    assert main(args) == 0
    assert result.stat().st_mtime_ns == stamp, "the second scorecard trained the finished run again"


def test_scorecard_names_a_plugin_that_registers_nothing(tmp_path: Path, capsys) -> None:
    empty = tmp_path / "nothing.py"
    empty.write_text("x = 1\n")
    assert main(["scorecard", str(empty), "--out", str(tmp_path / "o")]) == 2
    assert "registers no memory" in capsys.readouterr().err


def test_distance_is_scored_on_what_a_memory_carries_past_its_training_gap_per_variant(tmp_path: Path) -> None:
    """Every memory is near 1.0 at its trained gaps, so `distance` ranks on the mean recall over the
    streamed gaps beyond them (reset rows and out-of-budget gaps left out); a grid inside a method
    (infini-delta's two normalisers) is ranked as two entries, not pooled."""
    rows = [{"gap_segments": g, "trained_gap": 8, "reset_after_pairs": reset, "recall_accuracy": acc}
            for g, acc in ((4, 1.0), (8, 1.0), (16, 0.5), (64, 0.25), (256, None)) for reset in (False, True)]
    for r in rows:
        if r["reset_after_pairs"] and r["recall_accuracy"] is not None:
            r["recall_accuracy"] = 0.9  # the ablation never counts
    assert recall_past_training(json.dumps(rows)) == pytest.approx(0.375)
    assert math.isnan(recall_past_training(json.dumps(rows[:4])))  # nothing past the trained gap
    shipped = load_references("distance")
    table, paired = score_table("distance", shipped)
    ranked = rank_table(SuiteScore("distance", table, tmp_path), ["infini-delta"])
    order = list(ranked["variant"])
    variants = shipped["name"].str.replace(r"-s\d+$", "", regex=True).nunique()  # seeds of a variant: one entry
    assert paired and len(order) == len(set(order)) == variants
    # below `local` only memories that carry nothing past their trained gap (XL, Compressive and
    # Memorizing by construction, the ∞-former here), at its level
    means = dict(zip(ranked["variant"], ranked["mean"]))
    assert all(abs(means[v] - means["local"]) < 0.05 for v in order[order.index("local") + 1 :])
    assert order.index("local") > order.index("deltanet")
    assert order.index("infini-delta normalizer=paper") < order.index("infini-delta normalizer=gamma")


def test_lm_stream_is_scored_on_segments_after_the_first() -> None:
    """On lm-stream a plugin is ranked by bits per byte where a memory can have been read (segments >= 1,
    token-weighted), not by the whole document: segment 0 is the weights' alone."""
    import pandas as pd

    from memzoo.publishing.scorecard import score_table

    rows = pd.DataFrame([
        {"method": m, "seed": s, "backbone_init": "split", "bpb_by_segment": [b0, b1, b2], "tokens_by_segment": [10, 10, 30]}
        for s in (0, 1) for m, b0, b1, b2 in (("local", 2.0, 2.0, 2.0), ("mine", 1.0, 2.0, 1.8 + 0.1 * s))])
    table, paired = score_table("lm-stream", rows)
    mine = table.set_index("method").loc["mine"]
    assert paired and mine["mean"] == pytest.approx(((2.0 + 3 * 1.8) / 4 + (2.0 + 3 * 1.9) / 4) / 2)  # 1.8875, not 1.5x
    assert mine["diff_vs_local"] == pytest.approx(1.8875 - 2.0)
