"""Loss helpers that training and evaluation share: per-token negative log-likelihood, and nats to bits."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from memzoo.core.precision import working_dtype

LN2 = math.log(2.0)  # nats per bit: bits per byte = nats per byte / LN2


def token_nll(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-token negative log-likelihood in nats: logits [..., V], targets [...] -> [...] (float32, or
    float64 for float64 logits: the precision policy)."""
    flat = logits.to(working_dtype(logits)).flatten(0, -2)  # [T, V]
    return F.cross_entropy(flat, targets.flatten(), reduction="none").view(targets.shape)
