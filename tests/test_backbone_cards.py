"""The backbone page's probe table is the shipped cards' own numbers (memzoo/backbones/index.json): each
backbone's valid bits per byte, its convolution, and the second copy by chunk kind and distance."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from memzoo.publishing.figures import all_tables


def card(valid: float, bits: dict[str, list[float]], qk_conv: int = 0) -> dict:
    distances = (32, 128, 256, 512, 1024, 2048, 4000)
    return {"valid_bpb": valid, "steps": 10, "model": {"qk_conv": qk_conv},
            "copy_probe": [{"kind": kind, "distance": d, "first_bits": 7.0, "second_bits": b}
                           for kind, row in bits.items() for d, b in zip(distances, row)]}


def test_the_probe_table_reads_each_card(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    index = {"a": card(1.5, {"random": [0.1, 0.2, 9.9, 0.3, 0.4, 0.5, 0.6]}, qk_conv=4),
             "b": card(2.25, {"text": [1.0, 1.1, 9.9, 1.2, 1.3, 1.4, 1.5]})}
    (tmp_path / "index.json").write_text(json.dumps(index))
    monkeypatch.setenv("MEMZOO_BACKBONES", str(tmp_path))
    lines = all_tables(names=["backbone-probe"])["backbone-probe"].splitlines()
    assert lines[0] == "| backbone (training seed; valid) | chunk | 32 | 128 | 512 | 1,024 | 2,048 | 4,000 |"
    assert lines[2:] == ["| `a` (0; valid 1.500, 4 taps) | random | 0.10 | 0.20 | 0.30 | 0.40 | 0.50 | 0.60 |",
                         "| `b` (0; valid 2.250) | text | 1.00 | 1.10 | 1.20 | 1.30 | 1.40 | 1.50 |"]
