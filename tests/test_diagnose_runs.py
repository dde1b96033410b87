"""The measures of memzoo.diagnose end to end on tiny untrained run folders: each reads its memory
through the plugin's probe and gives numbers that hold whatever the weights (a probe that stopped
firing, or fired with other values, breaks them)."""
from __future__ import annotations


import pytest
import torch
from omegaconf import OmegaConf

import memzoo.diagnose.deltanet_retention as dr
import memzoo.diagnose.infini_pairs_share as ips
import memzoo.diagnose.infini_share as ish
import memzoo.diagnose.knn_rank as kr
from memzoo.runs.checkpoints import load_trained, save_checkpoint
from memzoo.runs.configure import build_model, load_config

TASK = ["task.name=recall", "task.pairs=4", "task.queries=8", "task.local_queries=4", "task.alphabet=8", "task.gap_segments=4"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, str]:
    """method -> a run folder: config and untrained checkpoint, d_model 32, 2 layers, segments of 16."""
    root = tmp_path_factory.mktemp("runs")
    out = {}
    for method in ("deltanet", "infini-linear", "memorizing"):
        cfg = load_config(method, ["model.d_model=32", "model.n_layers=2", "model.n_heads=2", "model.segment_len=16",
                                   "train.device=cpu", f"name={method}", f"out_dir={root}", *TASK])
        run = root / method
        run.mkdir()
        (run / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
        torch.manual_seed(0)
        model = build_model(cfg)
        save_checkpoint(run, model, torch.optim.SGD(model.parameters(), lr=0.0), 0)
        out[method] = str(run)
    return out


def test_the_linear_reads_pairs_share_falls_with_the_gap(runs: dict[str, str]) -> None:
    """σ > 0: every filler segment adds weight beside the pairs', so each head's share falls as G grows."""
    rows = ips.share_rows(runs["infini-linear"], [2, 4, 16], trials=4)
    assert len(rows) == 3 * 2 * 2  # gaps x layers x heads
    for layer in (0, 1):
        for head in (0, 1):
            share = [r["share_median"] for r in rows if r["layer"] == layer and r["head"] == head]
            assert 1 > share[0] > share[1] > share[2] > 0
    assert all(r["selectivity_median"] > 0 for r in rows)


def test_the_deltanet_split_adds_up_on_a_run(runs: dict[str, str]) -> None:
    rows = dr.retention_rows(runs["deltanet"], [1, 4], trials=4)
    assert [(r["gap_segments"], r["layer"]) for r in rows] == [(1, 0), (1, 1), (4, 0), (4, 1)]
    assert all(r["split_error"] < 1e-4 and 0 < r["retention_median"] <= 1 for r in rows)


def test_one_keys_share_and_selectivity_on_a_run(runs: dict[str, str]) -> None:
    share, sel, read = ish.key_share(runs["infini-linear"], 400, trials=1)  # [L, H] each
    assert share.shape == (2, 2) and ((share > 0) & (share < 1)).all()
    assert (sel > share).all() and (read > 0).all()  # selectivity = share x the keys written (> 1)


def test_knn_ranks_and_weights_on_a_run(runs: dict[str, str]) -> None:
    _, model = load_trained(runs["memorizing"])
    ranks, weights = kr.slot_ranks(model, 400, 3, trials=1)
    r, w = torch.tensor(ranks), torch.tensor(weights)  # [digits, H]
    assert r.shape == (5, model.cfg.n_heads) and (r >= 0).all() and ((w >= 0) & (w <= 1)).all()
    assert (w[r >= kr.knn_layer_of(model).cfg.top_k] == 0).all()  # outside the top k: no weight in the read
