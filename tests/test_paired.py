"""Comparisons that share their randomness: at a seed every method starts from the same backbone
weights and sees the same batches (common random numbers), and differences are paired by seed."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from memzoo.analysis import memory_gain, pairing_gain, segment_differences, summary_table
from memzoo.analysis.stats import paired_t
from memzoo.analysis.bootstrap import bootstrap_versus, paired_bootstrap
from memzoo.core.memory import LayerInputs, LayerMemory, State, zero_loss
from memzoo.core.model import is_memory_name
from memzoo.core.plugins import register_memory, registered, unregister_memory
from memzoo.runs.checkpoints import load_checkpoint
from memzoo.runs.configure import build_model, load_config, load_run_config
from memzoo.training.train import batch_source, train

TINY = ["model.d_model=32", "model.n_layers=2", "model.n_heads=2", "model.segment_len=16", "train.batch_size=2",
        "train.window_segments=4", "train.bptt_segments=2", "train.warmup_steps=1", "train.log_every=1",
        "train.checkpoint_every=2", "data.max_docs=40", "eval.max_docs=4", "eval.max_segments_per_doc=3",
        "eval.batch_size=2"]


def backbone(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v for k, v in model.state_dict().items() if not is_memory_name(k)}


@pytest.mark.parametrize("method", sorted(m for m in registered() if m != "local"))
def test_every_method_starts_from_local_backbone_at_a_seed(method: str) -> None:
    """Every shared backbone tensor equals `local`'s at the same seed, bit for bit, whatever the
    memory draws; another seed gives another backbone (the comparison is not vacuous)."""
    torch.manual_seed(1234)  # the global generator's state must not matter: the run's seed decides
    ref = backbone(build_model(load_config("local", TINY + ["seed=3"])))
    torch.manual_seed(99)
    got = backbone(build_model(load_config(method, TINY + ["seed=3"])))
    assert set(ref) <= set(got), f"{method} lacks backbone tensors {sorted(set(ref) - set(got))[:3]}"
    for name, tensor in ref.items():
        assert torch.equal(got[name], tensor), f"{method}: backbone tensor {name} differs from local's at seed 3"
    other = backbone(build_model(load_config(method, TINY + ["seed=4"])))
    assert not torch.equal(other["embed.weight"], ref["embed.weight"])


def test_shared_streams_reproduce_the_old_initialisation() -> None:
    """init_streams=shared is the former construction (memory first, one global stream), so run folders
    made before the split build the same model; under it RMT's memory shifts the backbone's draws."""
    cfg = load_config("rmt", TINY + ["seed=3", "model.init_streams=shared"])
    torch.manual_seed(3)
    a = build_model(cfg)
    local = backbone(build_model(load_config("local", TINY + ["seed=3", "model.init_streams=shared"])))
    assert not torch.equal(backbone(a)["embed.weight"], local["embed.weight"])
    torch.manual_seed(3)
    b = build_model(cfg)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


@pytest.mark.parametrize("task", [[], ["task.name=recall", "task.gap_segments=1", "task.pairs=4", "task.queries=4",
                                      "task.local_queries=2", "task.alphabet=8"]])
def test_the_batches_at_a_seed_are_the_same_for_every_method(task: list[str]) -> None:
    """Corpus windows and task examples are drawn from (seed, step) alone, never from the model."""
    first = {m: batch_source(load_config(m, TINY + task + ["seed=5"])) for m in ("local", "rmt", "infini-delta")}
    for step in (0, 7):
        ref = first["local"](step)
        for method in ("rmt", "infini-delta"):
            got = first[method](step)
            assert torch.equal(got.tokens, ref.tokens) and torch.equal(got.mask, ref.mask), (method, step)
    assert not torch.equal(first["local"](0).tokens, first["local"](1).tokens)


@dataclass
class _NoConfig:
    pass


class StatefulLocal(LayerMemory):
    """Carries a running sum of the values as state but returns local attention unchanged: its
    difference from `local` must be exactly 0 at every seed."""

    def initial_state(self, batch_size: int, device: torch.device) -> State:
        return {"sum": torch.zeros(batch_size, self.model_cfg.n_heads, self.model_cfg.d_head, device=device)}

    def forward(self, x: LayerInputs, state: State):
        total = state["sum"] + x.v.float().sum(dim=(1, 3))  # [B, H, D]
        return x.local_attention(), {"sum": total}, zero_loss(x.q)

    @classmethod
    def footprint(cls, cfg, model, tokens_seen: int) -> dict[str, int]:
        return {"total": model.n_heads * model.d_head * model.n_layers}


def test_a_memory_that_changes_nothing_has_a_paired_difference_of_exactly_zero(tmp_path: Path) -> None:
    register_memory("stateful-local", config=_NoConfig)(StatefulLocal)
    try:
        rows = []
        for method in ("local", "stateful-local"):
            for seed in (0, 1):
                cfg = load_config("local", TINY + [f"memory.name={method}", f"seed={seed}", "train.steps=3",
                                                   f"name={method}-{seed}", f"out_dir={tmp_path}"])
                run = train(cfg, progress=False)
                rows.append(json.loads((run / "result.json").read_text()))
    finally:
        unregister_memory("stateful-local")
    df = pd.DataFrame(rows)
    by = df.set_index(["method", "seed"])["valid_bpb"]
    assert by["stateful-local", 0] == by["local", 0] and by["stateful-local", 1] == by["local", 1]
    assert by["local", 0] != by["local", 1]  # the seeds differ: the zero is the pairing's, not a constant
    row = summary_table(df).set_index("method").loc["stateful-local"]
    assert row["diff_vs_local"] == 0.0 and row["ci_vs_local"] == 0.0 and row["p_vs_local"] == 1.0
    assert not row["sig_vs_local"] and row["n_vs_local"] == 2
    assert (df["backbone_init"] == "split").all()
    assert all(sum(r["tokens_by_doc"]) == sum(r["tokens_by_segment"]) for r in rows)
    for r in rows:  # the per-document bits add up to the overall bits per byte
        assert sum(r["bits_by_doc"]) / sum(r["tokens_by_doc"]) == pytest.approx(r["valid_bpb"], rel=1e-9)


def _shared_seed_effect(margin: float, seeds: int = 3, seed_sd: float = 0.15, noise: float = 0.005) -> pd.DataFrame:
    """Every method shares a large per-seed offset; `better` is lower than local by `margin` at every seed."""
    rng = np.random.default_rng(0)
    rows = []
    for s in range(seeds):
        shared = rng.normal(0, seed_sd)
        for method, mu in (("local", 3.0), ("better", 3.0 - margin), ("same", 3.0)):
            rows.append({"method": method, "seed": s, "valid_bpb": mu + shared + rng.normal(0, noise)})
    return pd.DataFrame(rows)


def test_paired_test_marks_a_known_margin_that_the_unpaired_one_drowns() -> None:
    df = _shared_seed_effect(margin=0.05)
    paired = summary_table(df).set_index("method")
    unpaired = summary_table(df, paired=False).set_index("method")
    assert paired.loc["better", "sig_vs_local"] and paired.loc["better", "diff_vs_local"] == pytest.approx(-0.05, abs=0.02)
    assert not unpaired.loc["better", "sig_vs_local"] and unpaired.loc["better", "p_vs_local"] > 0.3
    assert paired.loc["better", "ci_vs_local"] * 10 < unpaired.loc["better", "ci_vs_local"]
    assert not paired.loc["same", "sig_vs_local"] and paired.loc["better", "n_vs_local"] == 3
    assert unpaired.loc["better", "n_vs_local"] == 0
    gain = pairing_gain(df).set_index("method")
    assert gain.loc["better", "ratio"] == pytest.approx(unpaired.loc["better", "ci_vs_local"] / paired.loc["better", "ci_vs_local"])
    assert gain.loc["better", "sig_paired"] and "local" not in gain.index


def test_paired_t_by_hand() -> None:
    mean, half, p = paired_t([0.015, 0.010, 0.036])  # the quick suite's infini-delta - local: ±0.034, p 0.13
    assert mean == pytest.approx(0.020333, abs=1e-6) and half == pytest.approx(0.03427, abs=1e-4)
    assert p == pytest.approx(0.1253, abs=1e-3)
    assert paired_t([0.5, 0.5, 0.5])[2] == 0.0 and paired_t([0.0, 0.0])[2] == 1.0


def test_paired_bootstrap_against_a_direct_loop() -> None:
    """The vectorised replicates equal a loop that resamples documents and recomputes the difference
    of bits per byte per seed; identical models give exactly 0."""
    rng = np.random.default_rng(1)
    tokens = rng.integers(50, 500, size=(2, 12)).astype(float)
    tokens[1] = tokens[0]
    a = tokens * rng.uniform(2.0, 4.0, size=(2, 12))
    b = a + tokens * rng.normal(0.05, 0.02, size=(2, 12))
    obs, lo, hi, p = paired_bootstrap(a, b, tokens, n_boot=500, seed=7)
    counts = np.random.default_rng(7).multinomial(12, np.full(12, 1 / 12), size=500)
    loop = [np.mean([(c * (a[s] - b[s])).sum() / (c * tokens[s]).sum() for s in range(2)]) for c in counts]
    assert obs == pytest.approx(np.mean([(a[s] - b[s]).sum() / tokens[s].sum() for s in range(2)]), rel=1e-12)
    assert (lo, hi) == pytest.approx(tuple(np.quantile(loop, [0.025, 0.975])), rel=1e-10)
    assert hi < 0 and p == pytest.approx(1 / 500)
    assert paired_bootstrap(a, a, tokens)[:3] == (0.0, 0.0, 0.0)
    runs = pd.DataFrame({"seed": [0], "bits_by_doc": [list(a[0])], "tokens_by_doc": [list(tokens[0])]})
    other = runs.assign(tokens_by_doc=[list(tokens[0] + 1)])  # another evaluation set: not paired
    assert np.isnan(bootstrap_versus(runs, other, "bits_by_doc", "tokens_by_doc")[0])


def test_memory_gain_and_segment_differences_pair_by_seed() -> None:
    """Segment 0 identical (no memory read yet); later segments lower by 0.1 for `mem` at every seed."""
    rows = []
    for s in range(3):
        base = [4.0 + 0.3 * s, 3.8 + 0.3 * s, 3.7 + 0.3 * s]
        for method, gain in (("local", 0.0), ("mem", 0.1)):
            bpb = [base[0]] + [v - gain for v in base[1:]]
            rows.append({"method": method, "seed": s, "bpb_by_segment": bpb, "tokens_by_segment": [100, 100, 50],
                         "valid_bpb": float(np.average(bpb, weights=[100, 100, 50]))})
    df = pd.DataFrame(rows)
    gain = memory_gain(df).set_index("method")
    assert gain.loc["mem", "diff_after_vs_local"] == pytest.approx(-0.1) and gain.loc["mem", "ci_after_vs_local"] < 1e-9
    assert gain.loc["mem", "diff_all_vs_local"] == pytest.approx(-0.1 * 150 / 250)
    seg = segment_differences(df).set_index("segment")
    assert seg.loc[0, "diff"] == 0.0 and seg.loc[1, "diff"] == pytest.approx(-0.1) and (seg["n"] == 3).all()


def test_memory_gain_marks_significance_after_holm_over_every_method() -> None:
    """Three methods against local on segments >= 1: `a` lower by 0.1 with almost no spread, `b` and `c`
    by 0.1 +- 0.03 (p about 0.029 each, under 0.05 alone but over Holm's 0.05 / 2 at rank 2): only `a`
    is significant in the family."""
    rows = []
    for s in range(3):
        for method, gain in (("local", 0.0), ("a", 0.1 + 0.001 * (s - 1)), ("b", 0.1 + 0.03 * (s - 1)),
                             ("c", 0.1 - 0.03 * (s - 1))):
            bpb = [4.0 + s, 3.8 + s - gain]
            rows.append({"method": method, "seed": s, "bpb_by_segment": bpb, "tokens_by_segment": [100, 100],
                         "valid_bpb": float(np.mean(bpb))})
    gain = memory_gain(pd.DataFrame(rows)).set_index("method")
    assert 0.025 < gain.loc["b", "p_after_vs_local"] < 0.05 and 0.025 < gain.loc["c", "p_after_vs_local"] < 0.05
    assert gain.loc["a", "p_after_vs_local"] < 0.05 / 3
    assert gain["sig_after_vs_local"].to_dict() == {"local": False, "a": True, "b": False, "c": False}


def test_a_run_folder_from_before_the_split_resumes_under_its_own_initialisation(tmp_path: Path) -> None:
    """A config.yaml without model.init_streams was made under the shared stream: resuming keeps it,
    loading builds it, and its row records it."""
    cfg = load_config("rmt", TINY + ["train.steps=4", "name=old", f"out_dir={tmp_path}"])

    class Stop(Exception):
        pass

    def stop(step: int) -> None:
        if step == 2:
            raise Stop()

    with pytest.raises(Stop):
        train(load_config("rmt", TINY + ["train.steps=4", "name=old", f"out_dir={tmp_path}",
                                         "model.init_streams=shared"]), on_step=stop, progress=False)
    path = tmp_path / "old" / "config.yaml"
    path.write_text("\n".join(line for line in path.read_text().splitlines() if "init_streams" not in line))
    assert load_run_config(tmp_path / "old").model.init_streams == "shared"
    run = train(cfg, progress=False)  # today's default config: resumes, does not refuse or re-initialise
    assert load_checkpoint(run)["step"] == 4
    assert json.loads((run / "result.json").read_text())["backbone_init"] == "shared"
    assert load_run_config(run).model.init_streams == "shared"
