"""Recall capacity (memzoo.evaluations.capacity): scoring only through the memory, the chance level of a model
that knows the stored values but not their keys, and the reset ablation."""
from __future__ import annotations

import textwrap
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
import torch
from torch import Tensor, nn

from memzoo.core.config import ModelConfig
from memzoo.data.recall import KEY_BASE, VALUE_BASE, recall_chance, segment_recall_example
from memzoo.data.tasks import TaskSampler
from memzoo.evaluations.capacity import accuracy, capacity_metrics, predict_scored, recall_examples, within_positions
from memzoo.runs.configure import load_config
from memzoo.suites.compare import load_suite, run_suite
from memzoo.publishing.report import write_report

TASK = SimpleNamespace(pairs=6, queries=8, gap_segments=2, local_queries=0)


class OracleRecall(nn.Module):
    """Stands in for a trained model whose memory carries the pairs: it predicts each value from
    the (key, value) pairs it has seen since the last reset. With `carry=False` it forgets at
    every segment boundary, as `local` does."""

    def __init__(self, segment_len: int, carry: bool = True):
        super().__init__()
        self.cfg = ModelConfig(d_model=8, n_heads=2, segment_len=segment_len)
        self.carry = carry
        self.dummy = nn.Parameter(torch.zeros(()))

    def forward(self, tokens: Tensor, state=None, reset: Tensor | None = None) -> SimpleNamespace:
        b, s, n = tokens.shape  # [B, S, N]
        logits = torch.zeros(b, s, n, 256)
        for row in range(b):
            seen: dict[int, int] = {}
            for seg in range(s):
                if (reset is not None and bool(reset[row, seg])) or not self.carry:
                    seen = {}
                flat = tokens[row, seg].tolist()
                for i, tok in enumerate(flat):
                    if tok in seen:
                        logits[row, seg, i, seen[tok]] = 1.0
                    if i + 1 < n and KEY_BASE <= tok < VALUE_BASE <= flat[i + 1]:
                        seen[tok] = flat[i + 1]
        return SimpleNamespace(logits=logits)


def test_scored_queries_lie_segments_after_their_pair() -> None:
    """No scored query shares a segment with its pair; the query segment is gap_segments later; a
    key asked twice in the query segment is scored once (its second answer is in the segment)."""
    n, gen = 32, torch.Generator().manual_seed(1)
    repeats = 0
    for gap in (1, 2, 4):
        for _ in range(50):
            ex = segment_recall_example(gen, n, pairs=8, queries=12, gap_segments=gap, local_queries=4)
            seq = ex.tokens
            assert len(seq) == (gap + 1) * n
            pair_pos = {seq[i]: i for i in range(0, 16, 2)}  # the pairs open segment 0
            assert len(pair_pos) == 8 and all(seq[i + 1] >= VALUE_BASE for i in pair_pos.values())
            asked = [seq[p] for p in ex.scored_positions]
            assert len(asked) == len(set(asked))  # first occurrences only
            for p in ex.scored_positions:
                key_seg, query_seg = pair_pos[seq[p]] // n, p // n
                assert query_seg == ex.query_segment == gap and query_seg - key_seg == gap
                assert seq[pair_pos[seq[p]] + 1] == seq[p + 1]  # the answer is the pair's value
                assert seq[p] not in seq[query_seg * n : p]  # not answerable from its own segment
            all_queries = [seq[gap * n + 2 * i] for i in range(12)]
            assert len(ex.scored_positions) == len(set(all_queries))
            repeats += len(all_queries) - len(set(all_queries))
            # trained (not scored): the local queries right after the pairs, and every query
            assert ex.answer_positions[:4] == [16, 18, 20, 22] and set(ex.scored_positions) <= set(ex.answer_positions)
            assert all(b < 128 for i, b in enumerate(seq) if 24 <= i < gap * n or i >= gap * n + 24)
    assert repeats > 0  # queries are drawn with replacement


def test_segment_recall_rejects_bad_input() -> None:
    gen = torch.Generator()
    with pytest.raises(ValueError, match="gap_segments=0"):
        segment_recall_example(gen, 32, 4, 4, gap_segments=0)
    with pytest.raises(ValueError, match="pairs=12 and local_queries=6 take 36 bytes.*segment_len=32"):
        segment_recall_example(gen, 32, 12, 4, gap_segments=1, local_queries=6)
    with pytest.raises(ValueError, match="queries=20 take 40 bytes"):
        segment_recall_example(gen, 32, 4, 20, gap_segments=1)
    with pytest.raises(ValueError, match="pairs=4; expected 1..alphabet=3"):
        segment_recall_example(gen, 32, 4, 4, gap_segments=1, alphabet=3)
    ex = segment_recall_example(gen, 32, 4, 8, gap_segments=1, alphabet=5)
    assert all(KEY_BASE <= k < KEY_BASE + 5 and VALUE_BASE <= v < VALUE_BASE + 5 for k, v in zip(ex.tokens[:8:2], ex.tokens[1:8:2]))


def test_knowing_the_values_but_not_the_keys_scores_chance() -> None:
    """A model that knows the stored values but not which key holds which, guessing one of them
    (uniformly at random, or always the first), scores recall_chance on the same examples. With 64
    pairs the values repeat often, so chance is well above 1/pairs: it counts the duplicates."""
    examples = recall_examples(SimpleNamespace(pairs=64, queries=32, gap_segments=1), 128, 300, seed=0)
    chance = [c for e in examples for c in recall_chance(e)]
    level = sum(chance) / len(chance)
    assert level > 1.5 / 64
    gen = torch.Generator().manual_seed(0)
    guess = [[e.values[int(torch.randint(len(e.values), (1,), generator=gen))] for _ in e.scored_positions]
             for e in examples]
    first = [[e.values[0]] * len(e.scored_positions) for e in examples]
    se = (level * (1 - level) / len(chance)) ** 0.5
    assert abs(accuracy(guess, examples) - level) < 4 * se
    assert abs(accuracy(first, examples) - level) < 4 * se


def test_reset_before_the_query_segment_removes_what_memory_carried() -> None:
    """A model whose memory carries the pairs answers every scored query, and falls to zero once
    its state is reset before the query segment; a model without memory is at zero either way."""
    examples = recall_examples(TASK, 32, 20, seed=3)
    memory = capacity_metrics(OracleRecall(32), examples)
    assert memory["recall_accuracy"] == 1.0 and memory["recall_accuracy_reset"] == 0.0
    assert memory["recall_queries"] == sum(len(e.scored_positions) for e in examples)
    assert 1 / 6 <= memory["recall_chance"] < 0.25
    local = capacity_metrics(OracleRecall(32, carry=False), examples)
    assert local["recall_accuracy"] == local["recall_accuracy_reset"] == 0.0
    # predictions are read at the scored positions (the byte after each scored key)
    assert predict_scored(OracleRecall(32), examples[:3]) == [list(e.answers) for e in examples[:3]]


def test_within_segment_accuracy_separates_association_from_memory() -> None:
    """A model that associates within a segment but carries nothing across scores 1 within and 0
    across; the within positions are exactly the local queries and the repeated keys."""
    task = SimpleNamespace(pairs=4, queries=8, gap_segments=1, local_queries=3, alphabet=8)
    examples = recall_examples(task, 16, 30, seed=4)
    local = capacity_metrics(OracleRecall(16, carry=False), examples)
    assert local["recall_accuracy"] == 0.0 and local["recall_accuracy_within"] == 1.0
    for e in examples:
        within = within_positions(e)
        assert within[:3] == [8, 10, 12] and all(16 <= p < 32 for p in within[3:])
        assert len(within) == 3 + 8 - len(e.scored_positions)


def test_tiny_capacity_suite_writes_the_schema_columns(tmp_path: Path) -> None:
    """A capacity suite end to end: one row per run with the shared schema's columns, the sweep
    over a run-config key applied to every method, a method's own grid and its measured state."""
    path = tmp_path / "cap.yaml"
    path.write_text(textwrap.dedent(f"""
        name: cap
        base: small
        out_dir: {tmp_path / 'results'}
        threads_per_job: 1
        jobs: 2
        run:
          model: {{d_model: 32, n_layers: 2, n_heads: 2, segment_len: 8}}
          task: {{name: recall, pairs: 2, queries: 3, local_queries: 1, gap_segments: 1}}
          train: {{steps: 3, batch_size: 4, bptt_segments: 8, warmup_steps: 1, checkpoint_every: 0, log_every: 1}}
          eval: {{recall_examples: 16}}
        methods: [xl]
        seeds: [0]
        sweep: {{train.lr: [0.004]}}
        grid: {{xl: {{mem_len: [4, 8]}}}}
    """))
    suite = load_suite(str(path))
    run_suite(suite, progress=False)
    table = pd.read_parquet(tmp_path / "results" / "cap" / "results.parquet")
    assert len(table) == 2
    for col in ("method", "seed", "params", "footprint_measured", "footprint_analytic", "lr", "d_model", "grid_mem_len",
                "pairs", "gap_segments", "recall_accuracy", "recall_chance", "recall_accuracy_reset", "recall_queries",
                "recall_accuracy_within", "suite"):
        assert col in table.columns, col
    assert (table["suite"] == "cap").all() and (table["lr"] == 0.004).all() and (table["d_model"] == 32).all()
    assert (table["gap_segments"] == 1).all() and (table["pairs"] == 2).all()
    xl = table[table["method"] == "xl"]
    # XL caches hidden states: d_model x mem_len x n_layers numbers
    assert sorted(zip(xl["grid_mem_len"], xl["footprint_measured"])) == [(4, 4 * 32 * 2), (8, 8 * 32 * 2)]
    assert table["recall_chance"].between(0.5, 1.0).all() and (table["recall_queries"] > 16).all()
    assert table["recall_accuracy"].between(0, 1).all() and table["recall_accuracy_reset"].between(0, 1).all()
    md, _html = write_report(tmp_path / "results" / "cap")
    text = md.read_text()
    assert "capacity.png" in text and (tmp_path / "results" / "cap" / "capacity.png").is_file()
    assert "smallest measured state reaching 0.5 and 0.9" in text and "accuracy by method and state" in text


def test_sweep_and_dotted_grid_keys_set_run_config_values(tmp_path: Path) -> None:
    """A suite's sweep sets run-config keys for every method; a dotted grid key (Infini's head width)
    sets one for that method only; a misspelt key is an error naming it."""
    from memzoo.core.config import ConfigError
    from memzoo.suites.compare import expand

    specs = expand(load_suite("capacity", ["methods=[local,infini-delta]", "sweep={train.lr: [0.001, 0.01]}",
                                           "seeds=[0]"]))
    def head_width(m) -> int:  # d_head: model.head_dim, else d_model // n_heads
        return m.head_dim or m.d_model // m.n_heads

    assert sorted((s.method, head_width(s.cfg.model), s.cfg.train.lr) for s in specs) == [
        ("infini-delta", 16, 0.001), ("infini-delta", 16, 0.01), ("infini-delta", 32, 0.001), ("infini-delta", 32, 0.01),
        ("local", 16, 0.001), ("local", 16, 0.01)]
    assert all(s.cfg.model.n_heads == 4 for s in specs)  # the head width grows, not the head count
    assert all("model.head_dim" not in s.cfg.memory for s in specs)
    assert {s.name for s in specs if s.method == "local"} == {"local-lr0.001-s0", "local-lr0.01-s0"}
    with pytest.raises(ConfigError, match="'train.lrr' is not a run-config key"):
        expand(load_suite("capacity", ["methods=[local]", "sweep={train.lrr: [0.001]}"]))


def test_a_null_grid_value_is_the_run_without_that_key() -> None:
    """lm-window-copy's `memorizing: {mem_len: [0], store_size: [null, 256, 64]}`: the null point is the run
    the grid made before store_size was added (the name and config of the shipped rows), and its rows carry
    the value the run has; a row shipped before the key gets it when rows are added (`freeze --add`), so
    the tables label all three sizes."""
    from memzoo.analysis.results import variant_labels
    from memzoo.publishing.references import load_references, with_grid_columns
    from memzoo.suites.compare import expand
    from memzoo.training.curriculum import config_hash

    specs = expand(load_suite("lm-window-copy", ["methods=[memorizing]", "seeds=[0]"]))
    assert [s.name for s in specs] == ["memorizing-mem_len0-s0", "memorizing-mem_len0-store_size256-s0",
                                       "memorizing-mem_len0-store_size64-s0"]
    assert [s.cfg.memory.store_size for s in specs] == [1024, 256, 64]
    assert [s.grid["store_size"] for s in specs] == [1024, 256, 64]  # the rows' grid columns: the value each run has
    shipped = load_references("lm-window-copy").set_index("name")
    assert config_hash(specs[0].cfg) == shipped.loc["memorizing-mem_len0-s0", "config_hash"]
    rows = pd.DataFrame([{"method": s.method, **{f"grid_{k}": v for k, v in s.grid.items()}} for s in specs])
    assert variant_labels(rows).tolist() == ["memorizing store_size=1024", "memorizing store_size=256",
                                             "memorizing store_size=64"]
    before = pd.DataFrame({"name": ["memorizing-mem_len0-s0", "local-s0"], "method": ["memorizing", "local"],
                           "grid_mem_len": [0, None]})  # shipped before the grid had store_size
    filled = with_grid_columns(before, "lm-window-copy")
    assert filled["grid_store_size"].tolist()[0] == 1024 and pd.isna(filled["grid_store_size"].tolist()[1])


def test_model_init_torch_uses_pytorchs_default_scales() -> None:
    """model.init=torch: embeddings N(0, 1) (the tied head with them), linears kaiming-uniform
    (std 1/sqrt(3 fan_in)); the default keeps normal(0.02); anything else is an error naming it."""
    from memzoo.core.config import ConfigError
    from memzoo.runs.configure import build_model, load_config

    torch.manual_seed(0)
    torch_init = build_model(load_config("local", ["model.init=torch", "model.d_model=64", "model.n_heads=2"]))
    small = build_model(load_config("local", ["model.d_model=64", "model.n_heads=2"]))
    assert abs(float(torch_init.embed.weight.detach().std()) - 1.0) < 0.05 and torch_init.head.weight is torch_init.embed.weight
    assert abs(float(torch_init.blocks[0].attn.qkv.weight.detach().std()) - (3 * 64) ** -0.5) < 0.01
    assert abs(float(small.embed.weight.detach().std()) - 0.02) < 0.002 and abs(float(small.blocks[0].attn.qkv.weight.detach().std()) - 0.02) < 0.002
    with pytest.raises(ConfigError, match="model.init='xavier'"):
        load_config("local", ["model.init=xavier"])


def test_held_out_examples_have_the_training_layout() -> None:
    """Evaluation examples carry the run's within-segment queries too (a model is scored on inputs
    laid out as in training), scored only across segments."""
    task = SimpleNamespace(pairs=4, queries=8, gap_segments=1, local_queries=4, alphabet=8)
    for e in recall_examples(task, 16, 20, seed=0):
        assert e.answer_positions[:4] == [8, 10, 12, 14] and all(p >= 16 for p in e.scored_positions)
        assert all(KEY_BASE <= b < KEY_BASE + 8 for b in e.tokens[8:16:2])


@pytest.mark.parametrize("loss", ["answer", "all"])
def test_sampler_batches_follow_the_example_layout(loss: str) -> None:
    """The training batch (built as tensors, no loop per row) is rows of the evaluated layout: same
    pairs/queries structure, loss on exactly the answer positions (or every real byte), one reset."""
    cfg = load_config("small", ["task.name=recall", "task.gap_segments=2", "task.pairs=4", "task.queries=6",
                                "task.local_queries=3", "task.alphabet=8", "model.segment_len=16", f"task.loss={loss}"])
    batch = TaskSampler(cfg.task, 16, seed=3).sample(step=7, batch_size=64)
    assert batch.tokens.shape == (64, 3, 16) and batch.reset[:, 0].all() and not batch.reset[:, 1:].any()
    tokens, targets, mask = batch.tokens.flatten(1), batch.targets.flatten(1), batch.mask.flatten(1)  # [B, 48]
    assert torch.equal(tokens[:, 1:], targets[:, :-1])
    answer_pos = [8, 10, 12] + [32 + 2 * i for i in range(6)]
    expected = torch.zeros(48, dtype=torch.bool)
    expected[answer_pos if loss == "answer" else slice(0, 47)] = True
    assert torch.equal(mask, expected.expand(64, 48))
    for row in range(64):
        seq = tokens[row].tolist() + [int(targets[row, -1])]
        pairs = dict(zip(seq[0:8:2], seq[1:8:2]))
        assert len(pairs) == 4 and all(KEY_BASE <= k < KEY_BASE + 8 and VALUE_BASE <= v < VALUE_BASE + 8
                                       for k, v in pairs.items())
        for p in answer_pos:
            assert pairs[seq[p]] == seq[p + 1]  # every trained answer is its key's stored value
    keys = tokens[:, 0:8:2]
    assert len({tuple(k) for k in keys.tolist()}) > 32  # rows differ
