"""memzoo.evaluations.copy_distance: the second copy sits exactly `distance` bytes after the first, the
row is streamed across segments with the state carried, and the bits of each copy are read where
they are (a model that copies from exactly that lag has ~0 bits on the second copy only)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

import memzoo.evaluations.copy_distance as cd

TEXTS = [bytes(range(97, 123)) * 40, b"The quick brown fox jumps over the lazy dog. " * 30]


class HistoryCopier(nn.Module):
    """Keeps every byte streamed so far (its state) and predicts at each position the byte `lag` back
    from the next one, with certainty; uniform (8 bits) where there is none."""

    def __init__(self, lag: int, segment_len: int):
        super().__init__()
        self.lag, self.w = lag, nn.Parameter(torch.zeros(1))
        self.cfg = SimpleNamespace(segment_len=segment_len, attention_span=0)
        self.calls = 0

    def initial_state(self, batch: int, device: torch.device) -> torch.Tensor:
        return torch.zeros(batch, 0, dtype=torch.long)

    def forward(self, tokens: torch.Tensor, state: torch.Tensor, reset: torch.Tensor) -> SimpleNamespace:
        self.calls += 1
        if bool(reset.all()):  # a document starts: nothing seen
            state = state[:, :0]
        b, _, n = tokens.shape  # [B, 1, N]
        history = torch.cat([state, tokens[:, 0]], dim=1)  # [B, P + N]
        p = state.shape[1]
        logits = torch.zeros(b, 1, n, 256)
        for t in range(n):
            src = p + t + 1 - self.lag  # the next byte's position minus the lag
            if src >= 0:
                logits[:, 0, t].scatter_(-1, history[:, src, None], 100.0)
        return SimpleNamespace(logits=logits, state=history)


@pytest.mark.parametrize("kind", cd.KINDS)
def test_rows_hold_the_chunk_again_exactly_distance_bytes_later(kind):
    seq = cd.probe_rows(TEXTS, 100, 16, kind, rows=4)
    assert seq.shape == (4, 100 + 16 + 1)
    assert torch.equal(seq[:, :16], seq[:, 100:116])
    assert not torch.equal(seq[:, :16], seq[:, 50:66])


@pytest.mark.parametrize("distance", [40, 300])  # within one segment of 64, and across five
def test_a_model_copying_from_the_distance_gets_the_second_copy_free_and_another_lag_does_not(distance):
    seq = cd.probe_rows(TEXTS, distance, 16, "random", rows=3)
    first, second = cd.copy_bits(HistoryCopier(distance, 64), seq, distance, 16)
    assert second < 0.01 and first > 7.9  # the first copy has nothing to copy: uniform, 8 bits
    _, wrong = cd.copy_bits(HistoryCopier(distance + 1, 64), seq, distance, 16)
    assert wrong > 7.9


def test_overlapping_copies_are_refused():
    with pytest.raises(ValueError, match="distance=8 is shorter than the chunk"):
        cd.probe_rows(TEXTS, 8, 16, "text", rows=1)


def test_the_memory_ablation_arm_forgets_before_each_segment():
    """With the state reset before every segment, a copy within one segment (40 < 64) is still made and
    one five segments back (300) is not: what is copied across segments is what the state carried."""
    near, far = cd.probe_rows(TEXTS, 40, 16, "random", rows=2), cd.probe_rows(TEXTS, 300, 16, "random", rows=2)
    assert cd.copy_bits(HistoryCopier(40, 64), near, 40, 16, reset_memory=True)[1] < 0.01
    assert cd.copy_bits(HistoryCopier(300, 64), far, 300, 16, reset_memory=True)[1] > 7.9
    assert cd.copy_bits(HistoryCopier(300, 64), far, 300, 16, reset_memory=False)[1] < 0.01


@pytest.fixture
def run_folder(tmp_path, monkeypatch):
    """A run folder whose 'trained model' copies from 300 bytes back, on TEXTS as its held-out split."""
    import memzoo.data.corpus as corpus
    import memzoo.runs.checkpoints as checkpoints

    (tmp_path / "config.yaml").write_text("name: r\nmemory: {name: copier}\n")
    (tmp_path / "checkpoint.pt").write_bytes(b"weights one")
    model = HistoryCopier(300, 64)
    cfg = SimpleNamespace(data=None, eval=SimpleNamespace(split="valid"))
    monkeypatch.setattr(checkpoints, "load_trained", lambda run: (cfg, model))
    monkeypatch.setattr(corpus, "load_documents", lambda data: TEXTS)
    monkeypatch.setattr(corpus, "split_documents", lambda docs, data: {"valid": [SimpleNamespace(data=t) for t in docs]})
    return tmp_path, model


def test_the_suite_stage_keeps_its_rows_and_measures_only_what_is_missing(run_folder):
    import json

    run, model = run_folder
    cfg = cd.CopyDistanceConfig(distances=[40, 300], kinds=["random"], chunk_len=16, rows=2)
    rows = cd.evaluate_copy_distance(run, cfg, progress=False)
    got = {(r["distance"], r["reset_memory"]): r["second_bits"] for r in rows}
    assert got[(300, False)] < 0.01 and got[(300, True)] > 7.9 and got[(40, False)] > 7.9  # it copies at 300 only
    assert json.loads((run / "copy-distance.json").read_text()) == rows
    assert json.loads((run / "result.json").read_text())["copy-distance"] == rows
    calls = model.calls
    assert cd.evaluate_copy_distance(run, cfg, progress=False) == rows and model.calls == calls  # kept, not measured
    cd.evaluate_copy_distance(run, cd.CopyDistanceConfig(distances=[40, 300, 600], kinds=["random"], chunk_len=16,
                                                         rows=2), progress=False)
    assert model.calls > calls and len(json.loads((run / "copy-distance.json").read_text())) == 6
    (run / "checkpoint.pt").write_bytes(b"weights two")  # other weights: every row measured again
    again = cd.evaluate_copy_distance(run, cfg, progress=False)
    assert len(again) == 4 and {r["weights"] for r in again} != {r["weights"] for r in rows}


def test_bad_options_are_refused_naming_them():
    from memzoo.core.config import ConfigError

    with pytest.raises(ConfigError, match=r"kinds=\['words'\]"):
        cd.CopyDistanceConfig(kinds=["words"])
    with pytest.raises(ConfigError, match=r"distances=\[8\] are shorter than chunk_len=32"):
        cd.CopyDistanceConfig(distances=[8, 64])


def test_the_table_means_over_seeds_and_reach_stops_at_the_first_distance_that_fails():
    """Two seeds of a variant: second-copy bits 1 and 3 at distance 32 (mean 2 ± t(1) x 1), 7 and 7 at 256;
    the first copy 7 throughout: it copies (below half the first) up to 32, not at 256."""
    import json

    import pandas as pd

    from memzoo.analysis.copy_distance import copy_distance_long, copy_distance_summary, copy_reach

    def cell(seconds):
        return json.dumps([{"kind": "random", "distance": d, "reset_memory": False, "first_bits": 7.0,
                            "second_bits": b} for d, b in seconds.items()])

    df = pd.DataFrame([{"method": "m", "seed": 0, "copy-distance_json": cell({32: 1.0, 256: 7.0})},
                       {"method": "m", "seed": 1, "copy-distance_json": cell({32: 3.0, 256: 7.0})}])
    long = copy_distance_long(df).set_index("distance")
    assert long.loc[32, "second"] == 2.0 and long.loc[32, "second_ci"] == pytest.approx(12.706204736174696)  # t(1) x sd 2 ** 0.5 / 2 ** 0.5
    assert copy_reach(df)["m"] == 32
    assert copy_distance_summary(df).iloc[0]["256"] == "7.00 ± 0.00"


def test_wrong_matches_count_earlier_keys_followed_by_a_wrong_byte():
    """Hand-counted on 'abcabd' written twice (distance 6): a lookup by 'b' alone is misled where 'b'
    was followed by another byte; by the three bytes 'cab' it is not."""
    import numpy as np

    from memzoo.analysis.copy_distance import wrong_matches

    row = np.frombuffer(b"abcabdabcabdz", dtype=np.uint8)
    by1 = wrong_matches(row, distance=6, k=1, chunk_len=6, skip=0)
    assert by1 == {1: 0, 2: 1, 3: 0, 4: 0, 5: 2}  # p=2 'c' after 'b': 'b'->'d' once; p=5 'd': 'b'->'c' twice
    assert wrong_matches(row, 6, 2, 6, skip=0)[5] == 2  # 'ab' -> 'c' at 0 and 6
    assert wrong_matches(row, 6, 3, 6, skip=0)[5] == 0  # 'cab' -> 'd' only
    assert set(wrong_matches(row, 6, 3, 6, skip=4)) == {4, 5}
    # two filler bytes between the copies (distance 8 != chunk_len 6): 'ab' -> 'd' at 3 misleads p=2 ('c');
    # 'ab' -> 'c' at 0 and 8 mislead p=5 ('d')
    gap = np.frombuffer(b"abcabdxyabcabdz", dtype=np.uint8)
    assert wrong_matches(gap, distance=8, k=2, chunk_len=6, skip=0) == {2: 1, 3: 0, 4: 0, 5: 2}
