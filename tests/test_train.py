"""Training end to end on a small slice of the embedded corpus: learning happens, an interrupted
run keeps its checkpoint, and resuming gives exactly the weights of an uninterrupted run."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from memzoo.runs.checkpoints import load_checkpoint
from memzoo.runs.configure import load_config
from memzoo.training.train import lr_at, train

OVERRIDES = [
    "model.d_model=32", "model.n_layers=2", "model.n_heads=2", "model.segment_len=16",
    "train.steps=6", "train.batch_size=2", "train.window_segments=4", "train.bptt_segments=2",
    "train.warmup_steps=2", "train.checkpoint_every=2", "train.log_every=1",
    "data.max_docs=60", "eval.max_docs=4", "eval.max_segments_per_doc=3", "eval.batch_size=2",
]


def config(tmp_path: Path, method: str = "infini-delta", *extra: str):
    return load_config(method, [*OVERRIDES, f"out_dir={tmp_path}", *extra])


class Interrupt(Exception):
    pass


def cut_off_after(cfg, step: int) -> None:
    """Train `cfg` and interrupt it once `step` steps are done (its checkpoint is kept)."""

    def crash(done: int) -> None:
        if done == step:
            raise Interrupt()

    with pytest.raises(Interrupt):
        train(cfg, on_step=crash, progress=False, evaluate_at_end=False)


def test_resume_after_interruption_gives_the_same_weights(tmp_path: Path) -> None:
    straight = train(config(tmp_path, "infini-delta", "name=straight"), progress=False, evaluate_at_end=False)

    cfg = config(tmp_path, "infini-delta", "name=broken")
    cut_off_after(cfg, 3)
    assert load_checkpoint(tmp_path / "broken")["step"] == 3  # the interrupted run kept its work
    resumed = train(cfg, progress=False, evaluate_at_end=False)

    a, b = load_checkpoint(straight)["model"], load_checkpoint(resumed)["model"]
    assert load_checkpoint(resumed)["step"] == 6
    for key in a:
        assert torch.equal(a[key], b[key]), f"{key} differs after resume"
    steps = [json.loads(line)["step"] for line in (resumed / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5, 6]


class OnTheGpu:
    """A checkpoint tensor as torch.load(map_location="cuda") leaves it: only .cpu() gives the tensor back."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor

    def cpu(self) -> torch.Tensor:
        return self.tensor


def test_a_checkpoint_loaded_onto_the_gpu_resumes_with_its_rng_state(tmp_path: Path, monkeypatch) -> None:
    """A CUDA run loads its checkpoint onto the GPU, RNG state included; torch.set_rng_state takes a CPU
    tensor only (lm-stream-gpu's first resume failed so, H200 2026-11-27), so the state goes back first."""
    import memzoo.training.train as train_module

    straight = train(config(tmp_path, "infini-delta", "name=straight"), progress=False, evaluate_at_end=False)
    cfg = config(tmp_path, "infini-delta", "name=moved")
    cut_off_after(cfg, 2)
    real = train_module.load_checkpoint
    monkeypatch.setattr(train_module, "load_checkpoint",
                        lambda run_dir, device="cpu": {**(c := real(run_dir, device)), "rng": OnTheGpu(c["rng"])})
    resumed = train(cfg, progress=False, evaluate_at_end=False)
    a, b = load_checkpoint(straight)["model"], load_checkpoint(resumed)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_cuda_resume_without_the_device_generator_says_its_draws_restart(monkeypatch) -> None:
    """A checkpoint saved before the CUDA generator was kept (or on the CPU) resumes on CUDA with its
    dropout draws restarted from the seed: that is said, and a checkpoint that holds it sets it silently."""
    import warnings

    from memzoo.runs.checkpoints import restore_rng_states

    set_on_device = []
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, device: set_on_device.append((state, device)))
    with pytest.warns(UserWarning, match="no CUDA generator state"):
        restore_rng_states({"rng": torch.get_rng_state()}, "cuda:1")
    assert set_on_device == []
    saved = torch.ones(3, dtype=torch.uint8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # loaded onto the GPU, as a CUDA run's checkpoint is: only .cpu() gives the tensor back
        restore_rng_states({"rng": torch.get_rng_state(), "cuda_rng": OnTheGpu(saved)}, "cuda:1")
        restore_rng_states({"rng": torch.get_rng_state()}, "cpu")  # a CPU run has no device generator to miss
    assert len(set_on_device) == 1
    state, device = set_on_device[0]
    assert torch.equal(state, saved) and str(device) == "cuda:1"


def test_interruption_inside_a_step_resumes_exactly_with_dropout(tmp_path: Path, monkeypatch) -> None:
    """Cut off in the middle of step 4 (inside the forward/backward): the checkpoint holds the weights
    and RNG of 3 completed steps, and resuming reproduces an uninterrupted run with dropout on."""
    import memzoo.training.train as train_module

    extra = ("model.dropout=0.1", "train.checkpoint_every=0")
    straight = train(config(tmp_path, "infini-linear", "name=straight", *extra), progress=False, evaluate_at_end=False)
    real, calls = train_module.train_window, {"n": 0}

    def flaky(*args, **kwargs):
        result = real(*args, **kwargs)  # forward and backward done, dropout RNG consumed
        calls["n"] += 1
        if calls["n"] == 4:
            raise KeyboardInterrupt  # ... but the optimizer has not stepped
        return result

    cfg = config(tmp_path, "infini-linear", "name=cut", *extra)
    monkeypatch.setattr(train_module, "train_window", flaky)
    with pytest.raises(KeyboardInterrupt):
        train(cfg, progress=False, evaluate_at_end=False)
    monkeypatch.setattr(train_module, "train_window", real)
    assert load_checkpoint(tmp_path / "cut")["step"] == 3
    resumed = train(cfg, progress=False, evaluate_at_end=False)
    a, b = load_checkpoint(straight)["model"], load_checkpoint(resumed)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_step_with_non_finite_gradients_stops_the_run_and_keeps_the_last_weights(tmp_path: Path, monkeypatch) -> None:
    """Seen on a distance run: one batch whose state diverged gave a NaN gradient, the step applied it,
    and every later step and checkpoint was NaN. Now step 3's NaN gradient stops the run with an error
    naming the step, and the checkpoint holds the finite weights of step 2."""
    import memzoo.training.train as train_module

    real, calls = train_module.train_window, {"n": 0}

    def diverging(*args, **kwargs):
        result = real(*args, **kwargs)
        calls["n"] += 1
        if calls["n"] == 3:
            next(p for p in args[0].parameters() if p.grad is not None).grad.fill_(float("nan"))
        return result

    cfg = config(tmp_path, "infini-linear", "name=nan", "train.checkpoint_every=0")
    monkeypatch.setattr(train_module, "train_window", diverging)
    with pytest.raises(train_module.NonFiniteStep, match=r"step 3's gradient norm is nan.*weights of step 2 are kept"):
        train(cfg, progress=False, evaluate_at_end=False)
    saved = load_checkpoint(tmp_path / "nan")
    assert saved["step"] == 2
    assert all(bool(torch.isfinite(v).all()) for v in saved["model"].values() if v.is_floating_point())


def test_bits_per_byte_of_a_uniform_model_is_exactly_eight() -> None:
    from memzoo.data.corpus import Document
    from memzoo.evaluations.lm import evaluate_model
    from conftest import tiny_model

    model = tiny_model("infini-linear")
    with torch.no_grad():
        model.embed.weight.zero_()  # tied head: every logit is 0, a uniform distribution over 256 bytes
    docs = [Document("a", bytes(range(50))), Document("b", b"x" * 30)]
    res = evaluate_model(model, docs, batch_size=2, max_segments_per_doc=None, progress=False)
    assert res["bpb"] == pytest.approx(8.0, abs=1e-6)
    assert res["tokens"] == 49 + 29
    assert sum(res["tokens_by_segment"]) == 78 and len(res["bpb_by_segment"]) == 7


def test_streamed_evaluation_scores_each_document_as_if_alone() -> None:
    """Rows packed three at a time (a row moves on to the next document mid-stream, the step sums stay on
    the device until the end) give each document and segment index the bits it gets streamed alone."""
    from memzoo.data.corpus import Document
    from memzoo.evaluations.lm import evaluate_model
    from conftest import tiny_model

    g = torch.Generator().manual_seed(0)
    docs = [Document(str(i), bytes(torch.randint(0, 256, (n,), generator=g).tolist())) for i, n in enumerate([50, 3, 130, 17, 64])]
    model = tiny_model("xl")
    packed = evaluate_model(model, docs, batch_size=3, max_segments_per_doc=None, progress=False)
    alone = [evaluate_model(model, [d], batch_size=1, max_segments_per_doc=None, progress=False) for d in docs]
    assert packed["tokens_by_doc"] == [a["tokens"] for a in alone] == [49, 2, 129, 16, 63]
    assert packed["bits_by_doc"] == pytest.approx([a["bits_by_doc"][0] for a in alone], rel=1e-6)
    longest = alone[2]  # 129 bytes: the only document reaching segment index 16
    assert packed["bpb_by_segment"][16] == pytest.approx(longest["bpb_by_segment"][16], rel=1e-6)


def test_run_folder_has_config_metrics_checkpoint_and_result(tmp_path: Path) -> None:
    run = train(config(tmp_path, "infini-linear", "name=full-run"), progress=False)
    for f in ("config.yaml", "metrics.jsonl", "checkpoint.pt", "eval-valid.json", "result.json"):
        assert (run / f).is_file(), f
    row = json.loads((run / "result.json").read_text())
    assert row["method"] == "infini-linear"
    assert row["footprint_measured"] == row["footprint_analytic"] == 16 * 17 * 2 * 2
    assert 0 < row["valid_bpb"] < 9
    assert len(row["bpb_by_segment"]) == 3
    assert set(row["gates"]) == {"0", "1"}
    # the saved config reloads to the same run
    again = load_config(str(run / "config.yaml"))
    assert again.memory.name == "infini-linear" and again.train.steps == 6
    # `memzoo eval` on the folder gives the same bits per byte (and the test split on request)
    from memzoo.cli import main

    assert main(["eval", str(run), "--json"]) == 0
    assert json.loads((run / "result.json").read_text())["valid_bpb"] == pytest.approx(row["valid_bpb"], abs=1e-9)
    assert main(["eval", str(run), "--split", "test", "--json"]) == 0
    after = json.loads((run / "result.json").read_text())
    assert "test_bpb" in after and after["valid_bpb"] == pytest.approx(row["valid_bpb"], abs=1e-9)  # nothing lost


def test_training_reduces_loss(tmp_path: Path) -> None:
    cfg = config(tmp_path, "local", "name=learn", "train.steps=40", "train.lr=0.01", "train.log_every=5",
                 "train.checkpoint_every=0")
    run = train(cfg, progress=False, evaluate_at_end=False)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["train_bpb"] < rows[0]["train_bpb"] - 1.0


def test_resume_refuses_a_different_model(tmp_path: Path) -> None:
    train(config(tmp_path, "local", "name=same", "train.steps=2"), progress=False, evaluate_at_end=False)
    with pytest.raises(ValueError, match="different model or memory"):
        train(config(tmp_path, "local", "name=same", "train.steps=2", "model.n_layers=3"), progress=False)


def test_learning_rate_schedule() -> None:
    cfg = load_config("local", ["train.steps=100", "train.warmup_steps=10", "train.lr=1.0", "train.min_lr_ratio=0.1"]).train
    assert lr_at(0, cfg) == pytest.approx(0.1)
    assert lr_at(9, cfg) == pytest.approx(1.0)
    assert lr_at(100, cfg) == pytest.approx(0.1)
    assert lr_at(55, cfg) == pytest.approx(0.55)


@pytest.mark.parametrize("align_end,reached", [(False, {4, 5}), (True, {2, 3, 4, 5})])
def test_task_blocks_align_to_the_answer(align_end: bool, reached: set) -> None:
    """A loss only at the last of 6 segments with k = 4: blocks from the start ([0-3], [4-5]) reach
    segments 4 and 5; blocks aligned to the end ([0-1], [2-5], as task runs use) reach 2 to 5."""
    from conftest import tiny_model
    from memzoo.data.corpus import Batch
    from memzoo.training.train import train_window

    model = tiny_model("infini-linear")
    model.train()
    b, s, n = 1, 6, 8
    tokens = torch.randint(0, 256, (b, s, n), generator=torch.Generator().manual_seed(0))
    mask = torch.zeros(b, s, n, dtype=torch.bool)
    mask[:, -1] = True
    batch = Batch(tokens, tokens.roll(-1, dims=2), mask, torch.zeros(b, s, dtype=torch.bool), torch.arange(s)[None])
    grads: list[torch.Tensor] = []

    def keep_grad(module, inputs, output):
        output.register_hook(lambda g: grads.append(g.detach()))

    handle = model.embed.register_forward_hook(keep_grad)
    train_window(model, batch, bptt_segments=4, align_end=align_end)
    handle.remove()
    # Each block is backpropagated as soon as it is computed, so the hooks fire in block order: [B, S_block, N, d].
    per_segment = torch.cat([g.abs().sum(dim=(0, 2, 3)) for g in grads])
    assert per_segment.numel() == s
    assert {i for i in range(s) if per_segment[i] > 0} == reached



def test_evaluations_during_training_are_kept_by_segment_and_survive_a_resume(tmp_path: Path) -> None:
    """train.eval_every writes one evals.jsonl row per evaluation: bits per byte by segment equal to
    evaluating that step's checkpoint; a run resumed from an earlier checkpoint drops the rows it
    repeats instead of keeping both."""
    from memzoo.runs.configure import build_model
    from memzoo.evaluations.lm import evaluate_run

    cfg = config(tmp_path, "xl", "name=curve", "train.eval_every=2", "train.checkpoint_every=1")
    run, seen = tmp_path / "curve", {}

    def check_then_crash(step: int) -> None:
        if step == 4:  # the step's checkpoint and its evaluation row are both written by now
            model = build_model(cfg)
            model.load_state_dict(load_checkpoint(run)["model"])
            seen["ev"] = evaluate_run(cfg, model.eval(), progress=False)
        if step == 5:
            raise Interrupt()

    with pytest.raises(Interrupt):
        train(cfg, on_step=check_then_crash, progress=False, evaluate_at_end=False)
    first = [json.loads(line) for line in (run / "evals.jsonl").read_text().splitlines()]
    assert [r["step"] for r in first] == [2, 4]
    assert first[1]["bpb_by_segment"] == pytest.approx(seen["ev"]["bpb_by_segment"], rel=1e-9)
    assert first[1]["tokens_by_segment"] == seen["ev"]["tokens_by_segment"]
    assert first[0]["bpb_by_segment"] != first[1]["bpb_by_segment"]  # the rows follow training
    with open(run / "evals.jsonl", "a") as f:  # a row past the kept checkpoint (step 5): must go
        f.write(json.dumps({**first[1], "step": 6}) + "\n")
    train(cfg, progress=False, evaluate_at_end=False)
    rows = [json.loads(line) for line in (run / "evals.jsonl").read_text().splitlines()]
    assert rows == first  # step 6 is the last: its evaluation is the result's, not a row
