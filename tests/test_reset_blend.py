"""reset_rows without the host check (its path off the CPU: no sync per layer and segment) gives the
same outputs and gradients as with it, with and without a document boundary in the window,
for every method that uses the default reset_rows."""
from __future__ import annotations

import pytest
import torch

import memzoo.core.memory as memory
from conftest import tiny_model

DEFAULT_RESET = ["infini-delta", "titans-mag", "titans-mac", "rmt", "infty-former", "armt"]  # those calling it


def run(method: str, reset: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Logits and every parameter's gradient of a tiny float64 model over 3 segments."""
    torch.manual_seed(0)
    model = tiny_model(method).double().train()
    tokens = torch.randint(0, 256, (2, 3, 8), generator=torch.Generator().manual_seed(1))
    out = model(tokens, None, reset)
    loss = out.logits.square().mean() + out.aux_loss
    grads = torch.autograd.grad(loss, [p for p in model.parameters() if p.requires_grad], allow_unused=True)
    return out.logits.detach(), [g if g is not None else torch.zeros(()) for g in grads]


@pytest.mark.parametrize("method", DEFAULT_RESET)
def test_blend_without_host_check_equals_the_checked_path(method: str, monkeypatch: pytest.MonkeyPatch) -> None:
    resets = [torch.zeros(2, 3, dtype=torch.bool), torch.tensor([[False, True, False], [False, False, False]])]
    for reset in resets:
        checked = run(method, reset)
        monkeypatch.setattr(memory, "HOST_CHECKED", ())
        blended = run(method, reset)
        monkeypatch.setattr(memory, "HOST_CHECKED", ("cpu",))
        assert torch.equal(checked[0], blended[0]), f"{method}: logits differ"
        assert len(checked[1]) == len(blended[1])
        for a, b in zip(checked[1], blended[1]):
            assert torch.allclose(a, b, rtol=0, atol=1e-15), f"{method}: a gradient differs"
    # Not vacuous: the boundary changes the output (the blend is not skipped where a row resets).
    assert not torch.equal(run(method, resets[0])[0], run(method, resets[1])[0])
