"""Registration: the decorator (in-notebook plugins), the entry-point group (plugins from other
installed packages, with a real throwaway package), and errors that list what is registered."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from conftest import tiny_model_config
from memzoo.core.memory import LayerMemory, NoMemory
from memzoo.core.model import MemoryModel
from memzoo.core.plugins import UnknownMethodError, get_memory, register_memory, registered, unregister_memory


def test_unknown_method_lists_registered_names() -> None:
    with pytest.raises(UnknownMethodError) as err:
        get_memory("infini-quadratic")
    msg = str(err.value)
    assert "infini-quadratic" in msg
    for name in ("infini-linear", "infini-delta", "local", "full"):
        assert name in msg


def test_decorator_registers_a_notebook_plugin_and_backbone_uses_it() -> None:
    @dataclass
    class EchoConfig:
        scale: float = 2.0

    @register_memory("test-echo", config=EchoConfig)
    class Echo(NoMemory):
        """Local attention, doubled: enough to see the backbone calls the plugin."""

        def forward(self, x, state):
            out, state, aux = super().forward(x, state)
            return out * self.cfg.scale, state, aux

    try:
        assert "test-echo" in registered()
        torch.manual_seed(0)
        a = MemoryModel(tiny_model_config(), "test-echo", EchoConfig(scale=1.0))
        torch.manual_seed(0)
        b = MemoryModel(tiny_model_config(), "test-echo", EchoConfig(scale=3.0))
        x = torch.randint(0, 256, (1, 1, 8))
        assert not torch.allclose(a(x).logits, b(x).logits)
    finally:
        unregister_memory("test-echo")


def test_registering_a_non_memory_is_an_error() -> None:
    with pytest.raises(TypeError, match="LayerMemory or ModelMemory"):
        register_memory("not-a-memory", config=dict)(object)


PLUGIN_PY = '''
from dataclasses import dataclass
from memzoo.core.memory import NoMemory
from memzoo.core.plugins import register_memory


@dataclass
class ExternalConfig:
    strength: float = 1.0


@register_memory("external-test-memory", config=ExternalConfig)
class ExternalMemory(NoMemory):
    """A memory from another installed package."""
'''


def test_entry_point_plugin_from_an_installed_package(tmp_path: Path) -> None:
    """Build and install a throwaway package declaring `memzoo.memories`; memzoo discovers it."""
    src = tmp_path / "src"
    (src / "memzoo_external_test").mkdir(parents=True)
    (src / "memzoo_external_test" / "__init__.py").write_text(PLUGIN_PY)
    (src / "pyproject.toml").write_text(textwrap.dedent('''
        [build-system]
        requires = ["setuptools>=61"]
        build-backend = "setuptools.build_meta"
        [project]
        name = "memzoo-external-test"
        version = "0.0.1"
        [project.entry-points."memzoo.memories"]
        external-test-memory = "memzoo_external_test"
        [tool.setuptools]
        packages = ["memzoo_external_test"]
    '''))
    target = tmp_path / "site"
    import importlib.util

    # Build with the installed setuptools when there is one (offline); else let pip fetch it.
    isolation = [] if importlib.util.find_spec("setuptools") is None else ["--no-build-isolation"]
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", *isolation, "--target", str(target), str(src)],
        check=True, capture_output=True,
    )
    # The plugin package was installed into `target`, not site-packages: the child process finds it (and its
    # entry point) through PYTHONPATH, as an interpreter would with the package on its path.
    code = (
        "import json;"
        "from memzoo.conformance.catalog import catalogue; from memzoo.core.plugins import get_memory;"
        "spec = get_memory('external-test-memory');"
        "print(json.dumps({'source': spec.source, 'listed': [r['name'] for r in catalogue()]}))"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(target), os.environ.get("PYTHONPATH")]))}
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, cwd=tmp_path, env=env)
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found["source"] == "memzoo_external_test"
    assert "external-test-memory" in found["listed"]


def test_layer_memory_interface_default_loop_resets_rows() -> None:
    """The default LayerMemory.forward resets a row before the segment its flag marks."""

    @dataclass
    class CountConfig:
        pass

    class Counter(LayerMemory):
        def initial_state(self, batch_size, device):
            return {"n": torch.zeros(batch_size, device=device)}

        def segment(self, x, state):
            return x.q, {"n": state["n"] + 1}, torch.zeros(())

    mem = Counter(CountConfig(), tiny_model_config(), 0)
    from memzoo.core.attention import LocalAttention
    from memzoo.core.memory import LayerInputs

    q = torch.zeros(2, 4, 2, 8, 16)
    reset = torch.tensor([[False, False, True, False], [False, False, False, False]])
    attend = LocalAttention(10000.0)  # the interface hands every memory an attention (each segment its own)
    _, state, _ = mem(LayerInputs(q[:, :, 0, :, :].unsqueeze(2), q, q, q, reset, attend, None), mem.initial_state(2, "cpu"))
    assert state["n"].tolist() == [2.0, 4.0]
