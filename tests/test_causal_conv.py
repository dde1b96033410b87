"""memzoo.core.causal_conv: the depthwise causal convolution with its backward written out equals the sum of
shifted products it replaces, with zero history or with its history prepended, and with fewer rows than
the kernel; its gradients (and their gradients) are autograd's numerical ones in float64."""
from __future__ import annotations

import pytest
import torch

from memzoo.core.causal_conv import causal_conv, tap_ranges


def shifted_sum(x: torch.Tensor, w: torch.Tensor, b, pad: int) -> torch.Tensor:
    """y_t = b + Σ_j w_j x̃_{t+j} with x̃ = [pad zero rows; x], written out."""
    k = w.shape[0]
    padded = torch.cat((x.new_zeros(*x.shape[:-2], pad, x.shape[-1]), x), dim=-2)
    n_out = padded.shape[-2] - k + 1
    y = sum(w[j] * padded[..., j:j + n_out, :] for j in range(k))
    return y if b is None else y + b


@pytest.mark.parametrize("pad,n,k", [(3, 7, 4), (3, 2, 4), (0, 9, 4), (2, 5, 4), (0, 4, 4), (1, 3, 2), (0, 5, 1)])
def test_values_and_gradients_equal_the_shifted_products(pad: int, n: int, k: int) -> None:
    g = torch.Generator().manual_seed(10 * pad + n)
    x = torch.randn(2, 3, n, 5, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(k, 1, 3, 1, 5, generator=g, dtype=torch.float64, requires_grad=True)  # broadcast over rows
    b = torch.randn(3, 1, 5, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.allclose(causal_conv(x, w, b, pad), shifted_sum(x, w, b, pad), atol=1e-13)
    assert torch.allclose(causal_conv(x, w, None, pad), shifted_sum(x, w, None, pad), atol=1e-13)
    assert torch.autograd.gradcheck(lambda x, w, b: causal_conv(x, w, b, pad), (x, w, b))
    assert torch.autograd.gradgradcheck(lambda x, w: causal_conv(x, w, None, pad), (x, w))


def test_zero_history_is_the_default_and_a_pad_beyond_the_kernel_is_refused() -> None:
    x, w = torch.randn(1, 6, 2, dtype=torch.float64), torch.randn(4, 2, dtype=torch.float64)
    assert causal_conv(x, w).shape == x.shape  # pad K − 1: one output row per input row
    assert torch.equal(causal_conv(x, w), causal_conv(x, w, pad=3))
    assert causal_conv(x, w, pad=0).shape == (1, 3, 2)  # x carries its own 3 rows of history
    with pytest.raises(ValueError, match="pad=4"):
        causal_conv(x, w, pad=4)
    # the current row's tap first; a tap that reaches no output row is left out
    assert [j for j, *_ in tap_ranges(4, 3, 2)] == [3, 2]
