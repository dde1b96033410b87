"""Streaming long-range evaluation (memzoo passkey / recall) and passkey fine-tuning on tiny runs:
the bookkeeping of accuracy per depth, the budget, resuming, the isolated worker and the CLI."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import memzoo.evaluations.longrange as longrange
import memzoo.evaluations.passkey_recall as passkey_recall
from memzoo.runs.checkpoints import load_run
from memzoo.runs.configure import load_config
from memzoo.evaluations.longrange import evaluate_longrange
from memzoo.evaluations.passkey_recall import LongRangeConfig, passkey_length
from memzoo.training.train import train

TINY = ["model.d_model=32", "model.n_layers=2", "model.n_heads=2", "model.segment_len=32", "train.batch_size=2",
        "train.window_segments=2", "train.bptt_segments=1", "train.warmup_steps=1", "eval.max_docs=2",
        "eval.max_segments_per_doc=2", "data.max_docs=30"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("runs")
    cfg = load_config("infini-linear", TINY + ["train.steps=2", "name=lm", f"out_dir={out}"])
    return train(cfg, progress=False)


def copy_run(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for name in ("config.yaml", "checkpoint.pt", "result.json"):
        (dst / name).write_bytes((src / name).read_bytes())
    return dst


def test_accuracy_is_counted_per_depth(run_dir: Path, monkeypatch) -> None:
    """Rows are depth-major in the batch; a fake decoder answers right exactly where told."""
    _, model = load_run(run_dir)
    cfg = LongRangeConfig(lengths=[600], depths=[0.0, 0.5, 1.0], trials=2, isolate=False)
    seen: dict[str, list[str]] = {}

    def fake_generate(self, max_new_tokens, **kw):
        keys = seen["keys"]
        right = [True, True, True, False, False, False]  # depth 0: 2/2, depth 0.5: 1/2, depth 1: 0/2
        texts = [f" {k}." if ok else " 00000." for k, ok in zip(keys, right)]
        return torch.tensor([list(t.encode()[:max_new_tokens].ljust(max_new_tokens)) for t in texts])

    real_prompt = passkey_recall.passkey_prompt

    def spy_prompt(length, depth, key):
        seen.setdefault("keys", []).append(key)
        return real_prompt(length, depth, key)

    monkeypatch.setattr(passkey_recall.StreamingDecoder, "generate", fake_generate)
    monkeypatch.setattr(passkey_recall, "passkey_prompt", spy_prompt)
    rows = passkey_length(model, 600, cfg, progress=False)
    assert [r["depth"] for r in rows] == [0.0, 0.5, 1.0]
    assert [r["accuracy"] for r in rows] == [1.0, 0.5, 0.0]
    assert [r["keys"] for r in rows] == [seen["keys"][0:2], seen["keys"][2:4], seen["keys"][4:6]]
    assert all(r["status"] == "ok" and r["tokens_per_s"] > 0 and r["peak_rss_mb"] > 0 for r in rows)


def test_budget_gives_rows_not_a_crash(run_dir: Path) -> None:
    _, model = load_run(run_dir)
    rows = passkey_length(model, 3000, LongRangeConfig(lengths=[3000], depths=[0, 1], time_limit_s=1e-9,
                                                       segments_per_call=1, isolate=False), progress=False)
    assert len(rows) == 2 and all(r["accuracy"] is None for r in rows)
    assert all(r["status"].startswith("out of budget: time limit") for r in rows)
    assert 0 < rows[0]["tokens_done"] < rows[0]["tokens"]
    rows = passkey_recall.recall_length(model, 3000, LongRangeConfig(task="recall", lengths=[3000], memory_limit_mb=1,
                                                                     isolate=False), progress=False)
    assert rows[0]["status"].startswith("out of budget: memory limit 1 MB") and rows[0]["accuracy"] is None


def test_rows_are_kept_and_finished_lengths_skipped(run_dir: Path, tmp_path: Path, monkeypatch) -> None:
    run = copy_run(run_dir, tmp_path / "run")
    calls = []
    real = longrange.evaluate_length

    def counting(model, length, cfg, *args, **kw):
        calls.append(length)
        return real(model, length, cfg, *args, **kw)

    monkeypatch.setattr(longrange, "evaluate_length", counting)
    cfg = LongRangeConfig(lengths=[400, 700], depths=[0.0, 1.0], isolate=False)
    rows = evaluate_longrange(run, cfg, progress=False)
    assert calls == [400, 700] and [(r["length"], r["depth"]) for r in rows] == [(400, 0), (400, 1), (700, 0), (700, 1)]
    result = json.loads((run / "result.json").read_text())
    assert result["valid_bpb"] > 0, "the run's other columns are kept"
    assert [(r["length"], r["depth"], r["method"]) for r in result["passkey"]][0] == (400, 0.0, "infini-linear")
    evaluate_longrange(run, LongRangeConfig(lengths=[400, 1000], depths=[0.0, 1.0], isolate=False), progress=False)
    assert calls == [400, 700, 1000], "a finished length was evaluated again"
    evaluate_longrange(run, LongRangeConfig(lengths=[400], depths=[0.0, 1.0], trials=2, isolate=False), progress=False)
    assert calls[-1] == 400, "other settings must not reuse rows"
    stored = json.loads((run / "passkey.json").read_text())
    assert sorted(r["length"] for r in stored) == [400, 400, 700, 700, 1000, 1000]


def test_isolated_worker_gives_the_same_rows(run_dir: Path, tmp_path: Path) -> None:
    """Each length in a fresh process: same answers as in-process, and its own peak memory."""
    cfg = dict(lengths=[500], depths=[0.0, 1.0], trials=2, threads=1)
    a = evaluate_longrange(copy_run(run_dir, tmp_path / "a"), LongRangeConfig(**cfg, isolate=True), progress=False)
    b = evaluate_longrange(copy_run(run_dir, tmp_path / "b"), LongRangeConfig(**cfg, isolate=False), progress=False)
    assert [r["generated"] for r in a] == [r["generated"] for r in b]
    assert [r["rss_isolated"] for r in a] == [True, True] and [r["rss_isolated"] for r in b] == [False, False]


def cli(argv: list[str], capsys) -> tuple[int, str, str]:
    """`memzoo ARGV` in this process (the console entry's main): exit status, stdout, stderr."""
    from memzoo.cli import main

    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as exit:  # argparse's own errors
        code = exit.code
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_prints_json_rows(run_dir: Path, tmp_path: Path, monkeypatch, capsys) -> None:
    run = copy_run(run_dir, tmp_path / "run")
    monkeypatch.chdir(tmp_path)
    code, out, _ = cli(["passkey", str(run), "--lengths", "300,600", "--depths", "0,0.5,1", "--no-isolate", "--json"],
                       capsys)
    assert code == 0
    rows = json.loads(out)
    assert [(r["length"], r["depth"]) for r in rows] == [(l, d) for l in (300, 600) for d in (0.0, 0.5, 1.0)]
    for r in rows:
        assert {"length", "depth", "accuracy", "tokens_per_s", "peak_rss_mb"} <= set(r)
        assert 0.0 <= r["accuracy"] <= 1.0
    code, _, err = cli(["passkey", str(run), "--lengths", "100"], capsys)
    assert code == 2 and "100 is shorter than the shortest passkey example" in err
    code, out, _ = cli(["recall", str(run), "--lengths", "200", "--pairs", "4", "--queries", "2", "--trials", "3",
                        "--no-isolate", "--json"], capsys)
    assert code == 0
    (row,) = json.loads(out)
    assert row["task"] == "recall" and row["accuracy"] in {i / 6 for i in range(7)}


def test_finetuning_starts_from_the_trained_run(run_dir: Path, tmp_path: Path) -> None:
    _, base = load_run(run_dir)
    cfg = load_config("infini-linear", TINY + ["train.steps=1", "train.lr=1e-9", "train.weight_decay=0", "name=pk",
                                               f"out_dir={tmp_path}", "task.name=passkey", f"task.init_from={run_dir}",
                                               "task.lengths=[300]"])
    _, tuned = load_run(train(cfg, progress=False, evaluate_at_end=False))
    for (name, a), b in zip(base.state_dict().items(), tuned.state_dict().values()):
        assert torch.allclose(a, b, atol=1e-6), name
    other = load_config("infini-linear", TINY + ["model.d_model=64", "train.steps=1", "name=bad", f"out_dir={tmp_path}",
                                                 "task.name=passkey", f"task.init_from={run_dir}", "task.lengths=[300]"])
    with pytest.raises(ValueError, match="task.init_from=.*another model"):
        train(other, progress=False, evaluate_at_end=False)


def test_cli_generate_continues_the_prompt_greedily(run_dir: Path, tmp_path: Path, monkeypatch, capsys) -> None:
    from memzoo.data.tasks import bytes_to_tensor
    from memzoo.evaluations.generate import StreamingDecoder

    prompt = "def main():\n    return " * 4  # 96 bytes: three segments of 32, the last one complete
    monkeypatch.chdir(tmp_path)
    code, out, _ = cli(["generate", str(run_dir), "--prompt", prompt, "--max-new-tokens", "40"], capsys)
    assert code == 0
    _, model = load_run(run_dir)
    decoder = StreamingDecoder(model, 1)
    decoder.feed(bytes_to_tensor(prompt.encode())[None])
    expected = bytes(decoder.generate(40)[0].tolist()).decode("utf-8", errors="replace")
    assert out == expected + "\n"


def _child_peak() -> float:
    from memzoo.evaluations.run_result import peak_rss_mb

    return peak_rss_mb()


def test_a_fresh_process_reports_its_own_peak_memory() -> None:
    """A worker process (forked from the fork server, as runs and isolated evaluations are) does not
    inherit its parent's peak (getrusage's ru_maxrss would)."""
    from memzoo.core.processes import FreshProcessPool
    from memzoo.evaluations.run_result import peak_rss_mb

    ballast = torch.ones(300 * 2**20 // 4)  # the parent holds 300 MB more than the child will
    with FreshProcessPool(1) as pool:
        child_peak = pool.submit(_child_peak).result(timeout=120)
    assert peak_rss_mb() - child_peak > 250, (peak_rss_mb(), child_peak)
    del ballast


class OracleDecoder:
    """Stands in for StreamingDecoder with a perfect memory of everything fed: it answers the
    passkey from its history and predicts each recall value from the pairs it saw, so a correct
    harness must score it 1.0 (and a harness reading the wrong positions would not)."""

    def __init__(self, model, batch_size, segments_per_call=8, precision="fp32"):
        self.n, self.segments_per_call = 32, segments_per_call
        self.history = [bytearray() for _ in range(batch_size)]

    def feed(self, tokens, return_logits=False):
        from memzoo.data.recall import KEY_BASE, VALUE_BASE

        logits = torch.full((*tokens.shape, 256), -1.0)
        for b, row in enumerate(tokens.tolist()):
            for i, tok in enumerate(row):
                self.history[b].append(tok)
                pairs = {self.history[b][j]: self.history[b][j + 1] for j in range(0, 2 * 64, 2)
                         if j + 1 < len(self.history[b]) and KEY_BASE <= self.history[b][j] < VALUE_BASE}
                if tok in pairs and len(self.history[b]) > 2 * len(pairs):
                    logits[b, i, pairs[tok]] = 1.0
        return logits if return_logits else None

    def generate(self, max_new_tokens, **kw):
        import re

        keys = [re.search(rb"The pass key is (\d+)\.", bytes(h)).group(1) for h in self.history]
        return torch.tensor([list((b" " + k + b".")[:max_new_tokens].ljust(max_new_tokens)) for k in keys])


def test_a_perfect_memory_scores_one(run_dir: Path, monkeypatch) -> None:
    """The whole scoring path (prompt, streaming in chunks, answer length, exact match; recall's
    answer positions) gives accuracy 1.0 to a decoder that remembers everything."""
    _, model = load_run(run_dir)
    monkeypatch.setattr(passkey_recall, "StreamingDecoder", OracleDecoder)
    rows = passkey_length(model, 1500, LongRangeConfig(lengths=[1500], depths=[0.0, 0.5, 1.0], trials=2, isolate=False),
                          progress=False)
    assert [r["accuracy"] for r in rows] == [1.0, 1.0, 1.0]
    (row,) = passkey_recall.recall_length(model, 700, LongRangeConfig(task="recall", lengths=[700], pairs=12, queries=5,
                                                                      trials=3, isolate=False), progress=False)
    assert row["accuracy"] == 1.0 and row["exact"] == 1.0
