"""The existing methods' logits are pinned: growing the interface (ARMT's per-layer hooks on a
ModelMemory) must leave every method built before it bit-identical.

Each method is built at a tiny size, every parameter is overwritten from its NAME (a generator
seeded by a hash of the name, so the values depend neither on the order in which modules are
initialised nor on how MemoryModel.__init__ seeds them), and fixed tokens run in float64. The
golden logits in tests/fixtures/golden_logits.json were first generated from the code before the
hooks existed, then regenerated in float64 once the precision policy (memzoo.core.precision) made
a float64 model compute in float64 throughout: before it, RoPE tables, Infini's, the ∞-former's and
Memorizing's memory arithmetic and every cache ran in float32, and Compressive refused float64. The
regenerated logits differ from the earlier ones by at most 2.9e-6 (Compressive, then float32 end to
end) and 3.8e-7 (the others): float32 rounding, no change of method. `python tests/test_hook_pin.py`
rewrites them; do that only for a deliberate change.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from conftest import tiny_model  # tests/ is on the path (pytest inserts it)
from memzoo.conformance.pinned import B, N, PINNED, S, TOLERANCE, pinned_logits, set_parameters_from_names

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "golden_logits.json"
# The nine methods that existed before the hooks (the pin is about them; new methods are not in it).
@pytest.mark.parametrize("method", PINNED)
def test_existing_methods_logits_are_pinned(method: str) -> None:
    golden = json.loads(FIXTURE.read_text())
    expected = torch.tensor(golden[method], dtype=torch.float64)
    got = pinned_logits(method)
    assert got.dtype == torch.float64 and got.shape == expected.shape
    diff = float((got - expected).abs().max())
    assert diff <= TOLERANCE, f"{method}: logits moved by {diff:.3e} from the golden ones"


def test_the_pin_sees_a_change() -> None:
    """Control: nudging one parameter by 1e-9 moves the logits past the tolerance (the pin is not vacuous)."""
    model = tiny_model("rmt").double()
    set_parameters_from_names(model)
    tokens = torch.randint(0, 256, (B, S, N), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        before = model(tokens).logits
        model.blocks[0].mlp.up.weight[0, 0] += 1e-9
        after = model(tokens).logits
    assert float((after - before).abs().max()) > TOLERANCE


if __name__ == "__main__":  # run from the repository root: PYTHONPATH=. python tests/test_hook_pin.py
    FIXTURE.parent.mkdir(exist_ok=True)
    FIXTURE.write_text(json.dumps({m: pinned_logits(m).tolist() for m in PINNED}) + "\n")
    print(f"wrote {FIXTURE} ({FIXTURE.stat().st_size} bytes)")


@pytest.mark.parametrize("checkpointed", [False, True], ids=["plain", "checkpointed"])
def test_per_layer_hooks_run_around_every_block_in_order(checkpointed: bool) -> None:
    """A notebook ModelMemory using only the generic hooks: before_layer sees each block's input and
    what it returns is what the block gets; after_layer sees the block's output; both for every
    block in order, each segment, with or without activation checkpointing."""
    from dataclasses import dataclass

    from memzoo.core.memory import ModelMemory
    from memzoo.core.model import MemoryModel
    from memzoo.core.plugins import register_memory, unregister_memory
    from conftest import tiny_model_config

    @dataclass
    class TraceConfig:
        shift: float = 0.5

    calls: list[tuple[str, int]] = []
    seen: dict[str, torch.Tensor] = {}

    @register_memory("test-layer-hooks", config=TraceConfig)
    class Trace(ModelMemory):
        def initial_state(self, batch_size, device):
            return {"count": torch.zeros(batch_size, device=device)}

        @classmethod
        def footprint(cls, cfg, model, tokens_seen):
            return {"total": 1}

        def enter(self, x, state):
            return x, torch.ones(x.shape[1], dtype=torch.bool)

        def leave(self, h, state):
            return state

        def before_layer(self, index, x, state):
            calls.append(("before", index))
            return x + self.cfg.shift  # the block must see the shifted input

        def after_layer(self, index, x, state):
            calls.append(("after", index))
            seen[f"out{index}"] = x.detach()
            return {"count": state["count"] + 1}

    try:
        torch.manual_seed(0)
        model = MemoryModel(tiny_model_config(checkpoint_activations=checkpointed), "test-layer-hooks", TraceConfig())
        model.train()
        x = torch.randint(0, 256, (2, 2, 8))
        out = model(x)
        assert calls == [(w, i) for _ in range(2) for i in range(2) for w in ("before", "after")]
        assert out.state.model["count"].tolist() == [4.0, 4.0]  # 2 segments x 2 blocks
        h = model.embed(x[:, 1]) + 0.5  # the last segment by hand: shift, block 0, shift, block 1
        no_state = torch.zeros(2, 1, dtype=torch.bool)
        h = model.blocks[0](h[:, None], no_state, {}, None)[0][:, 0]
        assert torch.allclose(seen["out0"], h, atol=1e-6)
        h = model.blocks[1]((h + 0.5)[:, None], no_state, {}, None)[0][:, 0]
        assert torch.allclose(seen["out1"], h, atol=1e-6)
        out.logits.sum().backward()  # the hooks' graph is sound under checkpointing too
    finally:
        unregister_memory("test-layer-hooks")
