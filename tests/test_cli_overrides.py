"""A property of `memzoo train CONFIG key=value ...`: whatever the overrides (drawn from the run
config's schema: valid values of each key's type, wrong types, negative sizes, unknown keys, garbage
strings), the command either trains and evaluates, or ends with one line `memzoo: error: ...` on
stderr and a non-zero exit; never a traceback.

MEMZOO_OVERRIDE_EXAMPLES=500 explores further (the default keeps the test to seconds).
"""
from __future__ import annotations

import contextlib
import dataclasses
import io
import math
import os
import tempfile
import typing
import warnings
from pathlib import Path
from typing import Any, Union

import pytest

hypothesis = pytest.importorskip("hypothesis", reason="hypothesis is not installed (pip install -e '.[dev]')")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

from memzoo.cli import main  # noqa: E402
from memzoo.core.config import RunConfig  # noqa: E402
from memzoo.core.plugins import registered  # noqa: E402

EXAMPLES = int(os.environ.get("MEMZOO_OVERRIDE_EXAMPLES", "30"))
# A tiny 1-step run: every override below is drawn on top of these (and may replace one of them).
BASE = ["model.d_model=16", "model.n_layers=1", "model.n_heads=2", "model.segment_len=8", "model.mlp_ratio=1.0",
        "train.steps=1", "train.batch_size=2", "train.window_segments=2", "train.bptt_segments=1",
        "train.warmup_steps=1", "train.checkpoint_every=0", "train.device=cpu", "eval.batch_size=2",
        "eval.max_docs=2", "eval.max_segments_per_doc=2", "eval.recall_examples=2", "task.lengths=[64]",
        "task.pairs=2", "task.queries=1"]
# The values a string key accepts (the schema types them as str); other strings are garbage for them.
CHOICES = {
    "model.attention_backend": ["auto", "sdpa", "xformers"], "model.init": ["small", "torch"],
    "model.init_streams": ["split", "shared"], "train.precision": ["fp32", "bf16", "auto"],
    "train.device": ["auto", "cpu", "cuda"], "eval.split": ["train", "valid", "test"],
    "task.name": ["lm", "passkey", "recall"], "task.loss": ["answer", "all"],
    "log.tracker": ["none", "tensorboard", "wandb"], "name": ["run", "other-run"], "memory.name": sorted(registered()),
}
# Garbage: no path separators (a drawn out_dir or name stays inside the example's folder), no NUL
# (argv cannot hold one), not starting with "-" (argparse would take it for an option).
GARBAGE = st.text(st.sampled_from("abcxyz019 _.,:;!?@#%&*()[]{}$='\"+"), min_size=0, max_size=8)
SPECIAL = ["", "null", "nan", "inf", "-inf", "1e999", "${nope}", "${train.steps}", "[", "]", "{a: 1}", "[1,", "'",
           "true", "-1", "0", "1.5", "abc", "[1, 2]", "[[1]]", "{}"]


def schema_leaves(cls: type = RunConfig, prefix: str = "") -> list[tuple[str, Any]]:
    """(dotted key, type) of every leaf of the run config's dataclasses; free-form sections
    (memory, methods) are left to memory.name below."""
    hints = typing.get_type_hints(cls)
    out: list[tuple[str, Any]] = []
    for f in dataclasses.fields(cls):
        kind = hints[f.name]
        if dataclasses.is_dataclass(kind):
            out += schema_leaves(kind, f"{prefix}{f.name}.")
        elif kind is not Any:
            out.append((f"{prefix}{f.name}", kind))
    return out


LEAVES = schema_leaves() + [("memory.name", str)]


def text(value: Any) -> str:
    """A Python value as an override's right-hand side."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return "nan" if math.isnan(value) else repr(value)
    if isinstance(value, list):
        return "[" + ",".join(text(v) for v in value) + "]"
    return str(value)


def valid_values(key: str, kind: Any) -> st.SearchStrategy:
    """Values of the key's own type, small enough for a 1-step run (negative and zero sizes included)."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin is Union:
        (inner,) = [a for a in args if a is not type(None)]
        return st.one_of(st.none(), valid_values(key, inner))
    if origin is list:
        return st.lists(valid_values(key, args[0]), max_size=3)
    if kind is bool:
        return st.booleans()
    if kind is int:
        return st.integers(-3, 8) if key != "task.lengths" else st.integers(-3, 300)
    if kind is float:
        return st.one_of(st.floats(-1.0, 2.0), st.sampled_from([0.0, 0.05, 0.5, 0.9, 1.0]))
    if kind is str:
        return st.sampled_from(CHOICES[key]) if key in CHOICES else GARBAGE
    raise AssertionError(f"{key}: no strategy for {kind}")


def list_item(key: str, kind: Any) -> st.SearchStrategy:
    """The item type's values of a list key (task.lengths=[...]): lengths get realistic sizes."""
    return st.integers(-3, 300) if key == "task.lengths" else valid_values(key, typing.get_args(kind)[0])


@st.composite
def override(draw) -> str:
    """One key=value: a schema key with a valid, wrongly typed or garbage value, or an unknown key."""
    key, kind = draw(st.sampled_from(LEAVES))
    how = draw(st.sampled_from(["valid", "valid", "valid", "special", "garbage", "unknown key"]))
    if how == "valid":
        if typing.get_origin(kind) is list:
            value = text(draw(st.lists(list_item(key, kind), max_size=3)))
        else:
            value = text(draw(valid_values(key, kind)))
    elif how == "special":
        value = draw(st.sampled_from(SPECIAL))
    elif how == "garbage":
        value = draw(GARBAGE)
    else:
        key = draw(st.sampled_from([f"{key}x", f"{key}.deeper", "bogus", f"{key.split('.')[0]}.bogus"]))
        value = text(draw(valid_values(*draw(st.sampled_from(LEAVES)))))
    return f"{key}={value}"


# What this property found (each escaped as a traceback before the config layer checked it), kept as
# explicit examples so that every run tries them.
FOUND_EXAMPLES = [
    ["name='"], ["name=["], ["train.steps=${nope}"], ["memory.name.deeper=run"], ["train.betas.deeper=run"],
    ["task.lengths.deeper=run"], ["train.log_every=0"], ["model.attention_backend=xformers"],
    ["log.tracker=wandb", "log.project=:0"], ["train.betas=[2,3]"], ["train.lr=nan"], ["model.vocab_size=100"],
    ["train.threads=-1"], ["train.device=meta"], ["model.dropout=2.0"], ["eval.split=all"],
]


def found_examples(fn):
    """hypothesis.example for each of FOUND_EXAMPLES."""
    for overrides in reversed(FOUND_EXAMPLES):
        fn = hypothesis.example(overrides)(fn)
    return fn


@contextlib.contextmanager
def quiet_progress():
    """tqdm bars off (they write to stderr), the slow-bf16 warning silenced: stderr then holds only errors."""
    from tqdm.auto import tqdm

    import memzoo.evaluations.lm as evaluate
    import memzoo.training.train as train

    def silent(*args, **kwargs):
        return tqdm(*args, **{**kwargs, "disable": True})

    with pytest.MonkeyPatch.context() as mp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mp.setattr(train, "tqdm", silent)
        mp.setattr(evaluate, "tqdm", silent)
        mp.setenv("WANDB_MODE", "disabled")
        mp.setenv("HF_DATASETS_OFFLINE", "1")
        mp.setenv("HF_HUB_OFFLINE", "1")
        yield


def run_train(root: Path, corpus: Path, overrides: list[str]) -> tuple[int, str, str]:
    """`memzoo train local BASE overrides` in-process, in a fresh folder; (exit code, stdout, stderr)."""
    here = Path(tempfile.mkdtemp(dir=root))
    out, err = io.StringIO(), io.StringIO()
    cwd = os.getcwd()
    os.chdir(here)  # a drawn out_dir or name lands in here
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(["train", "local", *BASE, f"data.source={corpus}", f"out_dir={here / 'runs'}", *overrides])
            except SystemExit as exit_:  # argparse
                code = exit_.code if isinstance(exit_.code, int) else 1
    finally:
        os.chdir(cwd)
    return code, out.getvalue(), err.getvalue()


def test_train_overrides_succeed_or_fail_in_one_line(tmp_path: Path) -> None:
    corpus = tmp_path / "doc.txt"
    corpus.write_bytes(Path(__file__).read_bytes() * 2)  # one document: split 90/5/5 by bytes
    seen = {"ok": 0, "error": 0}

    @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize="MEMZOO_OVERRIDE_EXAMPLES" not in os.environ,
              suppress_health_check=[HealthCheck.too_slow])
    @given(st.lists(override(), min_size=1, max_size=3))
    @found_examples
    def check(overrides: list[str]) -> None:
        code, _, err = run_train(tmp_path, corpus, overrides)
        assert "Traceback" not in err, (overrides, err)
        if code == 0:
            seen["ok"] += 1
            return
        seen["error"] += 1
        lines = err.strip("\n").splitlines()
        assert len(lines) == 1 and lines[0].startswith("memzoo: error: "), (overrides, code, err)
        assert code != 0

    with quiet_progress():
        check()
    assert seen["ok"] and seen["error"], seen  # both outcomes were exercised


def test_a_folder_holding_another_model_is_one_line(tmp_path: Path) -> None:
    """The same run name with another model: one line naming the folder, not a traceback."""
    corpus = tmp_path / "doc.txt"
    corpus.write_bytes(Path(__file__).read_bytes() * 2)
    with quiet_progress():
        assert run_train(tmp_path, corpus, [f"out_dir={tmp_path / 'runs'}"])[0] == 0
        code, _, err = run_train(tmp_path, corpus, [f"out_dir={tmp_path / 'runs'}", "model.n_layers=2"])
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("memzoo: error: ") and "holds a run with a different model or memory config" in err
