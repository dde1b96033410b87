"""`memzoo check PLUGIN`: the README's example plugin passes every invariant, and small mutations
of it each fail exactly the invariant they break, with the others still passing."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Iterator

import pytest
import torch

from memzoo.cli import main
from memzoo.core.plugins import registered, unregister_memory
from memzoo.conformance.check import plugin_memories, run_checks
from memzoo.conformance.invariants import INVARIANTS
from test_readme import readme_plugin_source


def readme_plugin() -> str:
    """The plugin example exactly as README.md shows it."""
    return readme_plugin_source()


def mutate(name: str, old: str, new: str) -> str:
    """The README plugin registered as `name`, with `old` (which must occur once) replaced by `new`."""
    code = readme_plugin().replace('"my-decay"', f'"{name}"')
    assert code.count(old) == 1, f"the README example changed: {old!r} no longer occurs once"
    return code.replace(old, new)


# (a) reads the state after writing the whole segment into it: an output sees later tokens of its segment.
LEAKY = mutate("leaky-decay", 'out = local + state["avg"][:, :, None]',
               'out = local + (self.cfg.decay * state["avg"] + (1 - self.cfg.decay) * x.v.mean(2))[:, :, None]')
# (b) its footprint reports one number fewer than its state holds.
LYING = mutate("lying-decay", "model.n_layers}", "model.n_layers - 1}")
# (c) keeps its state across a document boundary.
STICKY = mutate("sticky-decay", "    @classmethod\n",
                "    def reset_rows(self, state, rows):\n        return state\n\n    @classmethod\n")
# (d) gates its read by a hand-written sigmoid e / (1 + e): inf / inf once the scores are large.
UNSTABLE = mutate("unstable-decay", '        out = local + state["avg"][:, :, None]',
                  '        e = torch.exp((x.q * state["avg"][:, :, None]).sum(-1, keepdim=True))  # [B, H, N, 1]\n'
                  '        out = local + e / (1 + e) * state["avg"][:, :, None]')

# (e) casts its state to float32: a float64 model then computes its memory in float32.
FLOAT32_STATE = mutate("float-decay", '{"avg": avg}', '{"avg": avg.float()}')
# (e') returns the natural zero auxiliary loss, a float32 scalar: exact in float64, so no failure.
ZEROS_AUX = mutate("zeros-decay", "avg.new_zeros(())", "torch.zeros(())")
# (f) keeps its state in the autocast dtype (bf16), not in the policy's float32.
BF16_STATE = mutate("bf16-decay", '{"avg": avg}', '{"avg": avg.to(x.v.dtype)}')


@pytest.fixture
def plugin_file(tmp_path: Path) -> Iterator:
    """Write plugin code to a .py file; the memories registered meanwhile are unregistered afterwards."""
    before = set(registered())

    def write(code: str, stem: str = "plugin") -> Path:
        path = tmp_path / f"{stem}.py"
        path.write_text(code)
        return path

    yield write
    for name in set(registered()) - before:
        unregister_memory(name)


def statuses(results: list) -> dict[str, str]:
    return {r.invariant: r.status for r in results}


def expected(*failing: str) -> dict[str, str]:
    """Every invariant passes but those `failing`; an out-of-tree plugin has no card to check."""
    return {k: "FAIL" if k in failing else "SKIP" if k == "footprint-card" else "PASS" for k in INVARIANTS}


def test_readme_example_passes_every_invariant(plugin_file, capsys) -> None:
    path = plugin_file(readme_plugin(), "my_decay")
    code = main(["check", str(path)])
    out = capsys.readouterr().out
    assert code == 0, out
    lines = out.splitlines()
    for invariant, status in expected().items():
        assert any(re.fullmatch(rf"my-decay\s+{invariant}\s+{status}\b.*", line) for line in lines), (invariant, out)
    assert "no card" in out
    assert lines[-1] == f"1 memory: {len(INVARIANTS) - 1} PASS, 0 FAIL, 1 SKIP"


@pytest.mark.parametrize("code, name, failing, message", [
    (LYING, "lying-decay", "footprint", "measured 64 != analytic 63 after 1 segment(s)"),
    (STICKY, "sticky-decay", "reset", "reset row does not start from a fresh state"),
    (UNSTABLE, "unstable-decay", "finite", "not finite with the embedding x10000 and attention inputs x1000: logits"),
    (FLOAT32_STATE, "float-decay", "precision", "float-decay: a float64 forward and backward ran"),
    (BF16_STATE, "bf16-decay", "precision-bf16", "state[0]['avg'] bfloat16 (policy: float32)"),
], ids=["footprint", "reset", "finite", "precision-float32-state", "precision-bf16-state"])
def test_a_broken_plugin_fails_the_invariant_it_breaks(plugin_file, code: str, name: str, failing: str,
                                                       message: str) -> None:
    names = plugin_memories(str(plugin_file(code)))
    assert names == [name]
    results = list(run_checks(names))
    assert statuses(results) == expected(failing)
    (failure,) = [r for r in results if r.status == "FAIL"]
    assert message in failure.message


def test_a_causality_violation_fails_with_exit_status_1(plugin_file, capsys) -> None:
    """Through the command's entry (`memzoo check FILE`, in this process: a fresh interpreter costs
    seconds): exit status 1, and the line names what failed and where."""
    path = plugin_file(LEAKY, "leaky")
    code = main(["check", str(path)])
    out = capsys.readouterr()
    assert code == 1, out.out + out.err
    found = {m.group(1): m.group(2) for m in re.finditer(r"^leaky-decay\s+(\S+)\s+(PASS|FAIL|SKIP)", out.out, re.M)}
    # A last segment cut short sees fewer of its own later tokens, so the leak breaks that too.
    assert found == expected("causality", "partial-segment"), out.out
    assert re.search(r"causality\s+FAIL\s+an output before position 11 depends on a token at or after 11 "
                     r"\(max diff \S+, first at position 8\)", out.out), out.out


def test_json_output_and_options(plugin_file, capsys) -> None:
    path = plugin_file(LYING, "lying")
    code = main(["check", str(path), "--only", "footprint,causality", "--options", "decay=0.5", "--json"])
    rows = json.loads(capsys.readouterr().out)
    assert code == 1
    assert [(r["memory"], r["invariant"], r["status"]) for r in rows] == [
        ("lying-decay", "causality", "PASS"), ("lying-decay", "footprint", "FAIL")]
    assert main(["check", str(path), "--only", "causality", "--options-json", '{"decay": 2}', "--options", "decay=0.1"]) == 0


@pytest.mark.parametrize("argv, error", [
    (["check", "no/such/plugin.py"], "plugin file 'no/such/plugin.py' does not exist"),
    (["check", "no_such_module_xyz"], "'no_such_module_xyz' is no .py file, importable module or memzoo.memories entry point"),
    (["check", "json"], "'json' registers no memory"),
    (["check", "memzoo.memories.xl", "--options", "mem_lenn=3"], "xl: unknown option(s) ['mem_lenn']"),
    (["check", "memzoo.memories.xl", "--only", "causalty"], "--only: unknown invariant(s) ['causalty']"),
])
def test_errors_are_one_line(capsys, argv: list[str], error: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"memzoo: error: {error}") and err.count("\n") == 1, err


def test_a_module_path_and_an_entry_point_name_find_their_memories(tmp_path: Path, monkeypatch) -> None:
    """An in-tree module imported long ago is matched by source; an entry point by its module."""
    assert plugin_memories("memzoo.memories.infini") == ["infini-delta", "infini-linear"]
    (tmp_path / "memzoo_check_ep_test.py").write_text(readme_plugin().replace('"my-decay"', '"ep-decay"'))
    dist = tmp_path / "memzoo_check_ep_test-0.0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: memzoo-check-ep-test\nVersion: 0.0.1\n")
    (dist / "entry_points.txt").write_text("[memzoo.memories]\nep-plugin = memzoo_check_ep_test\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "memzoo_check_ep_test", raising=False)
    try:
        assert plugin_memories("ep-plugin") == ["ep-decay"]
    finally:
        unregister_memory("ep-decay")
        sys.modules.pop("memzoo_check_ep_test", None)


def test_a_float32_zero_scalar_auxiliary_loss_passes_every_invariant(plugin_file) -> None:
    """`torch.zeros(())`, a plugin author's natural zero loss, is float32 in a float64 model but exact:
    the precision check counts it apart and passes."""
    names = plugin_memories(str(plugin_file(ZEROS_AUX)))
    assert statuses(run_checks(names)) == expected()


def test_a_precision_failure_names_the_plugins_line_and_the_fix(plugin_file) -> None:
    """The float32-state plugin's failure points at its own line (file, number, code) and says how to fix it."""
    path = plugin_file(FLOAT32_STATE, "float_plugin")
    (failure,) = [r for r in run_checks(plugin_memories(str(path))) if r.status == "FAIL"]
    line = next(i for i, text in enumerate(FLOAT32_STATE.splitlines(), 1) if "avg.float()" in text)
    assert f"float_plugin.py:{line}: " in failure.message and "avg.float()" in failure.message, failure.message
    assert "Fix: make tensors from the inputs" in failure.message


# (g) right in float64, off by 1% wherever it computes in float32 (as a device would).
DRIFT32 = mutate("drift-decay", '        out = local + state["avg"][:, :, None]',
                 '        out = local + state["avg"][:, :, None] * (1.01 if x.q.dtype == torch.float32 else 1.0)')


def test_device_rows_hold_a_plugin_to_the_float64_oracle_and_skip_without_cuda(plugin_file, capsys) -> None:
    """`memzoo check --device cpu`: the README plugin passes fp32, tf32 and bf16 against the float64 CPU
    oracle; one that drifts in float32 fails device-fp32 (exit 1); --device cuda without a GPU is a SKIP."""
    from memzoo.conformance.check import device_checks

    good = plugin_memories(str(plugin_file(readme_plugin())))
    assert statuses(device_checks(good, "cpu")) == {"device-fp32": "PASS", "device-tf32": "PASS", "device-bf16": "PASS"}
    drift = str(plugin_file(DRIFT32, "drift_plugin"))
    rows = {r.invariant: r for r in device_checks(plugin_memories(drift), "cpu")}
    assert rows["device-fp32"].status == "FAIL" and "logits" in rows["device-fp32"].message
    assert main(["check", drift, "--only", "causality", "--device", "cpu"]) == 1
    if not torch.cuda.is_available():
        assert statuses(device_checks(good, "cuda")) == {"device": "SKIP"}
