"""Long-range diagnostics on a hand-built model whose only route to the key is its state: the
memory-reset ablation removes exactly the answers the state carried, and accuracy by the key's
segment (counted back from the question) says where they came from. Plus the report's new parts."""
from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
import torch
from torch import nn

from memzoo.analysis import accuracy_by_key_segment, passkey_by_length, wilson_interval
from memzoo.evaluations.generate import StreamingDecoder
from memzoo.evaluations.passkey_recall import LongRangeConfig, passkey_length

N = 128
KEY_AT_END = re.compile(rb"Remember it\. (\d+)")  # the key's second mention, up to its last digit


class KeyInState(nn.Module):
    """A causal byte model that answers the passkey question from its state only: at the end of each
    segment its state keeps the last key seen (the text of the earlier segments and this one, the
    previous 40 bytes carried as state too); within a segment it reads nothing but that state and
    the segment's own bytes, and never the key in its own segment. Reset rows start empty."""

    def __init__(self) -> None:
        super().__init__()
        self.cfg = SimpleNamespace(segment_len=N, vocab_size=256)
        self.anchor = nn.Parameter(torch.zeros(()))  # for the device

    def initial_state(self, batch_size: int, device=None) -> list[tuple[bytes, bytes]]:
        return [(b"", b"")] * batch_size  # per row: (key digits, last 40 bytes)

    @staticmethod
    def _next(key: bytes, context: bytes) -> int:
        asked = re.search(rb"The pass key is( ?)(\d*)$", context)
        if asked is None or not key:
            return ord("x")
        if not asked.group(1):
            return ord(" ")
        done = len(asked.group(2))
        return key[done] if done < len(key) else ord(".")

    def forward(self, tokens: torch.Tensor, state=None, reset=None) -> SimpleNamespace:
        b, s, n = tokens.shape
        state = list(state if state is not None else self.initial_state(b))
        logits = torch.full((b, s, n, 256), -1.0)
        for row in range(b):
            key, tail = state[row]
            for seg in range(s):
                if reset is not None and bool(reset[row, seg]):
                    key, tail = b"", b""
                text = bytes(tokens[row, seg].tolist())
                for t in range(n):
                    logits[row, seg, t, self._next(key, tail + text[: t + 1])] = 1.0
                found = KEY_AT_END.findall(tail + text)
                key, tail = (found[-1] if found else key), (tail + text)[-40:]
            state[row] = (key, tail)
        return SimpleNamespace(logits=logits, state=state)


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    model = KeyInState()
    cfg = dict(lengths=[900], depths=[0.0, 0.5, 0.9, 1.0], trials=2, isolate=False, segments_per_call=3)
    plain = passkey_length(model, 900, LongRangeConfig(**cfg), progress=False)
    ablated = passkey_length(model, 900, LongRangeConfig(**cfg, reset_after_key=True), progress=False)
    return plain + ablated


def test_reset_after_the_key_removes_what_the_state_carried(rows) -> None:
    plain = [r for r in rows if not r.get("reset_after_key")]
    ablated = [r for r in rows if r.get("reset_after_key")]
    assert [r["key_segments_back"] for r in plain] == [5, 2, 1, 0]  # depths 0, 0.5, 0.9, 1 at 900 bytes
    # The state carries every key at least one segment back; a key in the question's own segment is
    # invisible to this model (it reads no key from its own segment).
    assert [r["accuracy"] for r in plain] == [1.0, 1.0, 1.0, 0.0]
    assert [r["accuracy"] for r in ablated] == [0.0, 0.0, 0.0, 0.0]
    assert all(r["reset_after_key"] is True for r in ablated)
    # partial credit agrees: every digit in place where the state had the key, none where it had none
    assert [(r["digits_in_place"], r["digits_from_key"]) for r in plain] == [(1.0, 1.0)] * 3 + [(0.0, 0.0)]
    assert [(r["digits_in_place"], r["digits_from_key"]) for r in ablated] == [(0.0, 0.0)] * 4


def test_accuracy_by_key_segment_attributes_the_answers(rows) -> None:
    df = pd.DataFrame([{"method": "key-in-state", "seed": 0, "passkey_json": json.dumps(rows)}])
    table = accuracy_by_key_segment(df)
    assert table["segments_back"].tolist() == ["0", "1", "2-3", "4-7"]
    assert table["accuracy"].tolist() == [0.0, 1.0, 1.0, 1.0]
    assert table["accuracy_reset"].tolist() == [0.0, 0.0, 0.0, 0.0]
    assert table["n"].tolist() == [2, 2, 2, 2]
    pooled = passkey_by_length(df)  # the plain rows only; depths pooled: 6 keys of 8
    assert pooled[["correct", "n"]].values.tolist() == [[6, 8]]
    assert (pooled["lo"].iloc[0], pooled["hi"].iloc[0]) == pytest.approx(wilson_interval(6, 8))


def test_the_decoder_reset_is_a_fresh_state_for_that_row() -> None:
    """With a real memory: after the reset, a row's logits equal those of a fresh decoder fed only
    the bytes from the reset segment on; the other row keeps its memory."""
    from conftest import tiny_model

    model = tiny_model("infini-linear")
    n = model.cfg.segment_len
    data = torch.randint(0, 256, (2, 5 * n + 3), generator=torch.Generator().manual_seed(0))
    dec = StreamingDecoder(model, 2, segments_per_call=2)
    dec.reset_at = torch.tensor([3, -1])
    out = dec.feed(data, return_logits=True)  # [2, T, V]
    fresh = StreamingDecoder(model, 1, segments_per_call=2).feed(data[:1, 3 * n :], return_logits=True)
    kept = StreamingDecoder(model, 2, segments_per_call=2).feed(data, return_logits=True)
    assert torch.allclose(out[0, 3 * n :], fresh[0], atol=1e-5)
    assert not torch.allclose(out[0, 3 * n :], kept[0, 3 * n :], atol=1e-3)
    assert torch.equal(out[1], kept[1])


def test_wilson_interval_known_values() -> None:
    assert wilson_interval(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    assert wilson_interval(0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)
    assert wilson_interval(10, 10) == pytest.approx((0.7225, 1.0), abs=1e-4)
    for n in range(1, 60):  # exact at the ends (a rounding residue there once broke the figure's error bars)
        assert wilson_interval(0, n)[0] == 0.0 and wilson_interval(n, n)[1] == 1.0
    with pytest.raises(ValueError, match="successes=11, trials=10"):
        wilson_interval(11, 10)
    with pytest.raises(ValueError, match="reset_after_key=True is for task=passkey"):
        LongRangeConfig(task="recall", lengths=[200], pairs=4, queries=2, reset_after_key=True)


class PairsInState(nn.Module):
    """Answers a recall query from its state only: the (key, value) byte pairs of committed segments."""

    def __init__(self, n: int = 16) -> None:
        super().__init__()
        self.cfg = SimpleNamespace(segment_len=n, vocab_size=256)
        self.anchor = nn.Parameter(torch.zeros(()))

    def initial_state(self, batch_size: int, device=None) -> list[dict]:
        return [{}] * batch_size

    def forward(self, tokens: torch.Tensor, state=None, reset=None) -> SimpleNamespace:
        b, s, n = tokens.shape
        state = list(state if state is not None else self.initial_state(b))
        logits = torch.full((b, s, n, 256), -1.0)
        for row in range(b):
            pairs = dict(state[row])
            for seg in range(s):
                if reset is not None and bool(reset[row, seg]):
                    pairs = {}
                text = tokens[row, seg].tolist()
                for t, byte in enumerate(text):
                    logits[row, seg, t, pairs.get(byte, ord("x"))] = 1.0
                pairs = pairs | {k: v for k, v in zip(text, text[1:]) if 128 <= k < 192 <= v}
            state[row] = pairs
        return SimpleNamespace(logits=logits, state=state)


def test_recall_streams_the_training_layout_and_its_reset_ablation() -> None:
    from memzoo.evaluations.passkey_recall import recall_length

    task = SimpleNamespace(name="recall", gap_segments=1, pairs=4, queries=6, local_queries=2, alphabet=8)
    model = PairsInState(16)
    cfg = dict(task="recall", layout="training", lengths=[160], trials=3, isolate=False, segments_per_call=4)
    (row,) = recall_length(model, 160, LongRangeConfig(**cfg), task=task, progress=False)
    (reset,) = recall_length(model, 160, LongRangeConfig(**cfg, reset_after_key=True), task=task, progress=False)
    assert row["gap_segments"] == 10 and row["tokens_done"] == 11 * 16  # the queries 10 segments after the pairs
    assert row["accuracy"] == 1.0 and reset["accuracy"] == 0.0 and 0 < row["chance"] < 1
    assert row["scored"] == reset["scored"] >= 3 and reset["reset_after_key"] is True
    assert (row["pairs"], row["local_queries"], row["alphabet"]) == (4, 2, 8)
    from memzoo.analysis import recall_generalisation

    table = recall_generalisation(pd.DataFrame([{"method": "m", "seed": 0, "recall_json": json.dumps([row, reset])}]))
    assert table[["length", "accuracy", "accuracy_reset"]].values.tolist() == [[160, 1.0, 0.0]]
    with pytest.raises(ValueError, match="layout=training needs a run trained with task.name=recall"):
        recall_length(model, 160, LongRangeConfig(**cfg), task=SimpleNamespace(name="passkey", gap_segments=0),
                      progress=False)


def test_the_report_has_the_long_range_diagnostics(rows, tmp_path: Path) -> None:
    """memzoo report on a long-range table: accuracy against length, the answer loss, accuracy by
    the key's segment with the reset ablation, bits per byte before and after, gates."""
    from memzoo.publishing.report import write_report

    loss = [{"step": s, "stage": 1 + (s > 4), "train_bpb": 3.0 - 0.3 * s} for s in range(1, 9)]
    table = pd.DataFrame([{"method": m, "seed": seed, "passkey_json": json.dumps(rows), "valid_bpb": 4.2,
                           "valid_bpb_pretrain": 4.0, "valid_bpb_ratio": 1.05, "answer_loss_json": json.dumps(loss),
                           "gates_json": json.dumps({"0": [0.05, 0.95]}), "gates_pretrain_json": json.dumps({"0": [0.5, 0.5]})}
                          for m in ("a", "b") for seed in (0, 1)])
    table.to_parquet(tmp_path / "results.parquet")
    md, _ = write_report(tmp_path)
    text = md.read_text()
    for png in ("passkey_vs_length.png", "answer_loss.png"):
        assert (tmp_path / png).stat().st_size > 1000 and f"]({png})" in text
    assert "95% Wilson score interval over the pooled keys" in text
    section = text.split("## Passkey accuracy by the key's segment", 1)[1].split("##", 1)[0]
    assert "| a | 1 | 1.000 | 4 | 0.000 | 4 |" in section and "| b | 0 | 0.000 | 4 | 0.000 | 4 |" in section
    assert "| a | 4.000 | 4.200 | 1.050 |" in text
    assert "| a | 2 | 0.500 | 0.500 | 0.500 | 0.500 |" in text  # gates: 2 heads, before, after, <0.1, >0.9


def test_answer_loss_curves_draw_each_run_not_a_mean() -> None:
    """Two seeds, one that learns and one that does not: each keeps its own line (a mean over seeds
    would draw a curve neither followed), and the stage boundary is marked."""
    from memzoo.analysis import answer_loss_curves

    curves = {0: [2.4, 2.4, 2.4, 2.4], 1: [2.4, 1.0, 0.1, 0.0]}
    table = pd.DataFrame([{"method": "rmt", "seed": seed, "answer_loss_json": json.dumps(
        [{"step": s + 1, "stage": 1 + (s >= 2), "train_bpb": v} for s, v in enumerate(values)])}
        for seed, values in curves.items()])
    ax = answer_loss_curves(table)
    drawn = sorted(tuple(line.get_ydata()) for line in ax.get_lines() if line.get_linestyle() == "-" and len(line.get_ydata()))
    assert drawn == sorted(tuple(v) for v in curves.values())
    assert [line.get_xdata()[0] for line in ax.get_lines() if line.get_linestyle() == ":"] == [3]
