"""A depthwise causal convolution over time with its backward written out: the short convolutions of the
delta-rule memories and Titans (memzoo.memories.gated_deltanet, memzoo.memories.titans).

    y_t = b + Σ_j w_j ⊙ x̃_{t+j},   j = 0 … K−1,   x̃ = [`pad` rows of zeros ; x]   (time on axis −2)

so that y_t sees x_{t−K+1} … x_t when pad = K − 1 (zero history before x), or, with the history already
prepended to x (pad = 0), the K − 1 rows before each output. w_j and b broadcast against y (one filter
per channel, shared over batch and time).

As shifted products under autograd, each of the K taps costs a zero tensor of the whole input and a
copy into it in backward, and its sum another pass. Here the forward is K fused multiply-adds into one
buffer and the backward K more into the input's gradient (the zero history is never materialised, and
no zero-filled tensor is made where one tap covers every input row) plus one product and reduction a
tap for the filter's gradient: the same sums, in one order, at about half the memory traffic. The
backward is made of differentiable operations, so a gradient of the gradient still works.
"""
from __future__ import annotations

from typing import Iterator, Optional

import torch
from torch import Tensor


def tap_ranges(k: int, pad: int, n_in: int) -> Iterator[tuple[int, int, int, int]]:
    """(tap j, first output row it reaches, the input row that row reads, rows) for every tap that reaches
    an output row, the last tap (the current input) first; n_in rows of input give n_in + pad − k + 1 out."""
    n_out = n_in + pad - k + 1
    for j in range(k - 1, -1, -1):
        first = max(0, pad - j)  # output rows before it read the zero history
        rows = n_out - first
        if rows > 0:
            yield j, first, first + j - pad, rows


class CausalTaps(torch.autograd.Function):
    """y = b + Σ_j w[j] ⊙ x̃[j : j + n_out] (see the module docstring); w: [K, ...] broadcasting against y."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Optional[Tensor], pad: int) -> Tensor:  # type: ignore[override]
        k = weight.shape[0]
        y: Optional[Tensor] = None
        for j, first, src, rows in tap_ranges(k, pad, x.shape[-2]):
            if y is None:  # the last tap reaches every output row (pad <= K − 1)
                y = (torch.addcmul(bias, x.narrow(-2, src, rows), weight[j]) if bias is not None
                     else x.narrow(-2, src, rows) * weight[j])
            else:
                y.narrow(-2, first, rows).addcmul_(x.narrow(-2, src, rows), weight[j])
        if y is None:
            raise ValueError(f"causal conv: {x.shape[-2]} input rows with {pad} of history leave no output row for a kernel of {k}")
        ctx.save_for_backward(x, weight)
        ctx.pad, ctx.has_bias = pad, bias is not None
        ctx.bias_shape = None if bias is None else bias.shape
        return y

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        x, weight = ctx.saved_tensors
        k, pad = weight.shape[0], ctx.pad
        taps = list(tap_ranges(k, pad, x.shape[-2]))
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            j, first, src, rows = taps[0]
            if src == 0 and rows == x.shape[-2]:  # the last tap reads every input row: no zeros needed
                grad_x = grad * weight[j]
            else:
                grad_x = grad.new_zeros(x.shape)
                grad_x.narrow(-2, src, rows).addcmul_(grad, weight[j])
            for j, first, src, rows in taps[1:]:
                grad_x.narrow(-2, src, rows).addcmul_(grad.narrow(-2, first, rows), weight[j])
        if ctx.needs_input_grad[1]:
            tap_shape = weight.shape[1:]
            per_tap = [torch.zeros(tap_shape, dtype=weight.dtype, device=weight.device) for _ in range(k)]
            for j, first, src, rows in taps:
                per_tap[j] = (grad.narrow(-2, first, rows) * x.narrow(-2, src, rows)).sum_to_size(tap_shape)
            grad_w = torch.stack(per_tap)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = grad.sum_to_size(ctx.bias_shape)
        return grad_x, grad_w, grad_b, None


def causal_conv(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None, pad: Optional[int] = None) -> Tensor:
    """Depthwise causal conv of x [..., n, C] (time on axis −2) with taps weight [K, ...] (tap K − 1 the
    current row) and an optional bias, both broadcasting against the output. pad: rows of zero history
    before x (default K − 1: an output row per input row); 0 when x already begins with its K − 1 rows of
    history (then n − K + 1 output rows)."""
    k = weight.shape[0]
    pad = k - 1 if pad is None else pad
    if not 0 <= pad <= k - 1:
        raise ValueError(f"causal conv: pad={pad}; expected 0 .. K − 1 = {k - 1}")
    return CausalTaps.apply(x, weight, bias, pad)
