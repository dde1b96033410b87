"""The stage-W pilot's plugin (experiments/backbone/short_conv_full.py): queries and keys convolved over
time before `full`, the convolution's history carried across segments and cleared at a document start.
Its convolution is held to a loop over positions written from the formula; imported as `--import`
imports a .py plugin, which once failed for a dataclass config under postponed annotations."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from memzoo.conformance.tiny import B, N, S, boundary, streamed, tiny_model, tokens
from memzoo.core.model import ModelState
from memzoo.core.plugins import unregister_memory
from memzoo.suites.suite_plugins import import_plugins

PLUGIN = Path(__file__).resolve().parents[1] / "experiments" / "backbone" / "short_conv_full.py"


@pytest.fixture(scope="module")
def registered():
    """The plugin imported from its file (as `memzoo --import FILE` does), unregistered afterwards."""
    import_plugins([str(PLUGIN)])
    yield
    unregister_memory("full-shortconv")


def test_a_plugin_file_with_a_dataclass_under_postponed_annotations_imports(tmp_path: Path) -> None:
    # dataclasses looks the class's module up in sys.modules: a file exec'd without registering it there failed.
    path = tmp_path / "postponed.py"
    path.write_text("from __future__ import annotations\nfrom dataclasses import dataclass\n\n"
                    "@dataclass\nclass Options:\n    k: int = 4\n")
    import_plugins([str(path)])
    assert sys.modules["memzoo_suite_plugin_postponed"].Options().k == 4


def random_taps(model: torch.nn.Module, seed: int = 3) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for memory in model.memories:
            memory.taps.copy_(torch.randn(memory.taps.shape, generator=gen))


def by_hand(x: torch.Tensor, reset: torch.Tensor, taps: torch.Tensor) -> torch.Tensor:
    """x' [B, S, H, N, D] from x [B, S, H, N, D]: x'_t = Σ_j taps[j] ⊙ x_{t-K+1+j} over one document's
    positions (segments joined), zero before the document's first; taps [K, H, 1, D]."""
    b, s, h, n, d = x.shape
    k = taps.shape[0]
    flat = x.permute(0, 2, 1, 3, 4).reshape(b, h, s * n, d)  # [B, H, S*N, D]
    start = torch.zeros(b, s * n, dtype=torch.long)  # [B, S*N] the first position of each one's document
    for row in range(b):
        for t in range(1, s * n):
            new_doc = t % n == 0 and bool(reset[row, t // n])
            start[row, t] = t if new_doc else start[row, t - 1]
    out = torch.zeros_like(flat)
    for row in range(b):
        for t in range(s * n):
            for j in range(k):
                src = t - k + 1 + j
                if src >= int(start[row, t]):
                    out[row, :, t] += taps[j, :, 0] * flat[row, :, src]
    return out.view(b, h, s, n, d).permute(0, 2, 1, 3, 4)


def test_the_convolution_is_the_formula_across_segments_and_document_starts(registered) -> None:
    from memzoo.core.memory import LayerInputs

    model = tiny_model("full-shortconv", options={"kernel": 3})
    random_taps(model)
    memory = model.memories[0]
    gen = torch.Generator().manual_seed(5)
    h, d = model.cfg.n_heads, model.cfg.d_head
    q, k = (torch.randn(B, S, h, N, d, generator=gen) for _ in range(2))
    reset = boundary(1, 2)
    x = LayerInputs(torch.zeros(B, S, N, model.cfg.d_model), q, k, k, reset, None, None)  # type: ignore[arg-type]
    q2, k2, last = memory.convolve(x, torch.zeros(B, 2, h, 2, d))  # nothing before the first segment
    torch.testing.assert_close(q2, by_hand(q, reset, memory.taps[:, 0].detach()), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(k2, by_hand(k, reset, memory.taps[:, 1].detach()), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(last[:, 1], k[:, -1, :, -2:])  # the raw keys carried, not the convolved ones


def test_at_identity_taps_it_is_full(registered) -> None:
    conv, full = tiny_model("full-shortconv"), tiny_model("full")
    assert conv.load_state_dict(full.state_dict(), strict=False).unexpected_keys == []
    x, reset = tokens(), boundary(0, 1)
    torch.testing.assert_close(conv(x, reset=reset).logits, full(x, reset=reset).logits)
    random_taps(conv)
    assert (conv(x, reset=reset).logits - full(x, reset=reset).logits).abs().max() > 1e-3


def test_streaming_equals_one_call_with_the_history_carried_and_cleared(registered) -> None:
    model = tiny_model("full-shortconv")
    random_taps(model)
    x, reset = tokens(), boundary(1, 2)
    torch.testing.assert_close(streamed(model, x, reset), model(x, reset=reset).logits, rtol=1e-5, atol=1e-5)
    # The carried history matters: dropping it between calls changes the second segment on.
    state = model.initial_state(B)
    first = model(x[:, :1], state)
    cut = [{**s, "qk_tail": torch.zeros_like(s["qk_tail"])} for s in first.state.layers]
    fresh = model(x[:, 1:2], ModelState(cut, first.state.model, first.state.window))
    assert (fresh.logits - model(x[:, :2]).logits[:, 1:2]).abs().max() > 1e-4


def test_the_backbone_convolution_is_the_same_function(registered) -> None:
    """`full` on a backbone with model.qk_conv (memzoo.core.qk_conv) and this plugin with the same taps give
    the same logits, streamed with a reset row, so the stage-X pilot's numbers carry over to it."""
    pilot, ours = tiny_model("full-shortconv", options={"kernel": 4}), tiny_model("full", qk_conv=4)
    random_taps(pilot)
    weights = {k: v for k, v in pilot.state_dict().items() if not k.endswith("memory.taps")}
    weights |= {f"blocks.{i}.attn.qk_taps": m.taps.data for i, m in enumerate(pilot.memories)}
    ours.load_state_dict(weights)
    x, reset = tokens(), boundary(0, 2)
    with torch.no_grad():
        assert (ours(x, reset=reset).logits - streamed(pilot, x, reset)).abs().max() < 1e-5
