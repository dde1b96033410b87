"""Methods whose quick result rounding decides are marked on their card (`rounding_sensitivity`), and
the mark reaches the frozen references' index and the report's notes."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from memzoo.conformance.catalog import load_cards, rounding_sensitive
from memzoo.suites.compare import expand, load_suite
from memzoo.publishing.references import freeze
from memzoo.publishing.report import write_report
from test_references import _fake_results


def test_marked_cards_are_the_measured_ones() -> None:
    cards = load_cards()
    assert rounding_sensitive(list(cards)) == ["armt", "titans-mag"]
    assert "0.033" in cards["armt"].rounding_sensitivity and cards["local"].rounding_sensitivity == ""


def test_freeze_lists_marked_methods_and_only_then(tmp_path: Path) -> None:
    for methods, expected in (("[armt,local]", ["armt"]), ("[local]", None)):
        specs = expand(load_suite("quick", [f"methods={methods}", "seeds=[0]"]))
        out = tmp_path / methods.strip("[]").replace(",", "-")
        results = _fake_results(out, specs, lr=None)
        freeze(results, "quick", out / "refs")
        index = json.loads((out / "refs" / "index.json").read_text())["quick"]
        assert index.get("rounding_sensitive") == expected


def test_report_names_marked_methods(tmp_path: Path) -> None:
    rows = [{"name": f"{m}-s{s}", "method": m, "seed": s, "valid_bpb": 4.0 + 0.01 * s, "params": 1, "footprint_measured": 1,
             "footprint_analytic": 1, "tokens_per_s": 1.0, "peak_rss_mb": 1.0} for m in ("armt", "local") for s in (0, 1)]
    pd.DataFrame(rows).to_parquet(tmp_path / "results.parquet", index=False)
    md, _ = write_report(tmp_path, figures=False)
    notes = [line for line in md.read_text().splitlines() if line.startswith("- rounding-sensitive")]
    assert notes == ["- rounding-sensitive: armt: a 1e-7 nudge of the initial weights moves one quick run by more than "
                     "0.01 bits per byte (the card's rounding_sensitivity says how much and why); read their seeds' "
                     "spread, not one seed."]
