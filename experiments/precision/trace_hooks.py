"""Per-step statistics of ARMT's and Titans' memories during training, for finding where two runs
part: the hooks wrap the memories' module-level functions (the model's arithmetic is unchanged) and
`flush` writes one JSON row per training step.

ARMT: the ratio zᵀφ / ‖φ‖² of the read's and v̄'s denominators (the floor binds below norm_floor),
γ before its clip (clipped below 0), β, max |A|, max z. Titans: θ, α, η, the fraction of tokens
whose inner gradient is rescaled (‖∇ℓ‖ > grad_clip) and its largest norm, max |W|, max |S|.
"""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Callable

import torch
from torch import Tensor

STATS: dict[str, list[float]] = defaultdict(list)
REDUCE: dict[str, Callable[[list[float]], float]] = {}


def record(name: str, value: Tensor | float, how: Callable[[list[float]], float] = max) -> None:
    STATS[name].append(float(value))
    REDUCE[name] = how


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def install_armt() -> None:
    """Wrap armt.denominator and armt.associative_write with recorders."""
    import memzoo.memories.armt as armt

    den0, write0 = armt.denominator, armt.associative_write

    def denominator(phi: Tensor, z: Tensor, eps: float, floor: float, *more) -> Tensor:
        with torch.no_grad():
            raw = torch.einsum("btk,bk->bt", phi, z) + eps  # [B, T]
            norm2 = phi.square().sum(-1)  # [B, T]
            ratio = raw / norm2.clamp_min(1e-30)
            record("armt_den_ratio_min", ratio.min(), min)
            record("armt_floor_binds", (raw < floor * norm2).double().mean(), mean)
            record("armt_phi_norm2_max", norm2.max())
        return den0(phi, z, eps, floor, *more)

    def associative_write(A, z, k, v, beta, empty, eps, floor=0.0, *more):
        with torch.no_grad():
            zk = torch.einsum("bmk,bk->bm", k, z)
            k2 = k.square().sum(-1)
            g = 1 - (zk + eps) / (k2 + eps)  # γ before the clip
            live = ~empty[:, None].expand_as(g)
            if bool(live.any()):
                record("armt_gamma_clipped", (g[live] < 0).double().mean(), mean)
                record("armt_gamma_margin_min", g[live].abs().min(), min)  # how near a γ is to switching
                record("armt_gamma_mean", g[live].clamp(0, 1).mean(), mean)
            record("armt_beta_mean", beta.mean(), mean)
            record("armt_beta_max", beta.max())
            record("armt_A_max", A.abs().max())
            record("armt_z_max", z.abs().max())
            record("armt_v_max", v.abs().max())
        return write0(A, z, k, v, beta, empty, eps, floor, *more)

    armt.denominator, armt.associative_write = denominator, associative_write


def install_titans() -> None:
    """Wrap titans.scan_memory (gates, state norms) and titans.inner_grad (the inner gradient's norm)."""
    import memzoo.memories.titans as titans

    scan0, grad0 = titans.scan_memory, titans.inner_grad
    clip = {"value": 1.0}

    def scan_memory(weights, momentum, keys, values, queries, log_keep, log_eta, lr, chunk_size, grad_clip):
        clip["value"] = grad_clip
        with torch.no_grad():
            record("titans_theta_max", lr.max())
            record("titans_theta_mean", lr.mean(), mean)
            record("titans_alpha_mean", (1 - log_keep.exp()).mean(), mean)
            record("titans_alpha_min", (1 - log_keep.exp()).min(), min)
            record("titans_eta_max", log_eta.exp().max())
            record("titans_W_max", max(w.abs().max() for w in weights))
            record("titans_S_max", max(s.abs().max() for s in momentum))
            record("titans_S_norm_max", max(s.flatten(2).norm(dim=-1).max() for s in momentum))
        return scan0(weights, momentum, keys, values, queries, log_keep, log_eta, lr, chunk_size, grad_clip)

    def inner_grad(weights, keys, values):
        deltas, acts = grad0(weights, keys, values)
        with torch.no_grad():
            norm2 = sum((d * d).sum(-1) * (a * a).sum(-1) for d, a in zip(deltas, acts))  # [B, H, n]
            norm = norm2.sqrt()
            record("titans_inner_grad_max", norm.max())
            if clip["value"] > 0:
                record("titans_inner_clipped", (norm > clip["value"]).double().mean(), mean)
                record("titans_inner_clip_margin_min", (norm - clip["value"]).abs().min(), min)
        return deltas, acts

    titans.scan_memory, titans.inner_grad = scan_memory, inner_grad


def install(method: str) -> bool:
    """The hooks for `method`'s memory; False where there are none."""
    if method == "armt":
        install_armt()
    elif method.startswith("titans"):
        install_titans()
    else:
        return False
    return True


def flush(path: Path, step: int) -> None:
    """Append this step's reduced statistics to `path` and start the next step's."""
    row = {"step": step, **{k: REDUCE[k](v) for k, v in STATS.items() if v}}
    with path.open("a") as fh:
        fh.write(json.dumps(row) + "\n")
    STATS.clear()
