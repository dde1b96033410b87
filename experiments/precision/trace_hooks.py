"""Per-step statistics of ARMT's and Titans' memories during training, for finding where two runs
part: a listener on the memories' probes (memzoo.core.probe: the model's arithmetic is unchanged and
nothing is patched) and `flush`, which writes one JSON row per training step.

ARMT: the ratio zᵀφ / ‖φ‖² of the read's denominator (the floor binds below norm_floor), γ before its
clip (clipped below 0), β, max |A|, max z. Titans: θ, α, η, the fraction of tokens whose inner gradient
is rescaled (‖∇ℓ‖ > grad_clip) and its largest norm, max |W|, max |S|.
"""
from __future__ import annotations

import json
from collections import defaultdict
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from memzoo.core.probe import recording

STATS: dict[str, list[float]] = defaultdict(list)
REDUCE: dict[str, Callable[[list[float]], float]] = {}
PROBES = {"armt": {"armt.read", "armt.write"}, "titans": {"titans.scan", "titans.inner_grad"}}
CLIP = {"value": 1.0}  # the grad_clip of the last Titans write (inner_grad's probe does not carry it)


def record(name: str, value: torch.Tensor | float, how: Callable[[list[float]], float] = max) -> None:
    STATS[name].append(float(value))
    REDUCE[name] = how


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def armt_read(v: dict[str, Any]) -> None:
    raw = torch.einsum("btk,bk->bt", v["phi"], v["z"]) + v["eps"]  # [B, T]
    norm2 = v["phi"].square().sum(-1)  # [B, T]
    record("armt_den_ratio_min", (raw / norm2.clamp_min(1e-30)).min(), min)
    record("armt_floor_binds", (raw < v["floor"] * norm2).double().mean(), mean)
    record("armt_phi_norm2_max", norm2.max())


def armt_write(v: dict[str, Any]) -> None:
    k, z = v["k"], v["z"]
    g = 1 - (torch.einsum("bmk,bk->bm", k, z) + v["eps"]) / (k.square().sum(-1) + v["eps"])  # γ before the clip
    live = ~v["empty"][:, None].expand_as(g)
    if bool(live.any()):
        record("armt_gamma_clipped", (g[live] < 0).double().mean(), mean)
        record("armt_gamma_margin_min", g[live].abs().min(), min)  # how near a γ is to switching
        record("armt_gamma_mean", g[live].clamp(0, 1).mean(), mean)
    record("armt_beta_mean", v["beta"].mean(), mean)
    record("armt_beta_max", v["beta"].max())
    record("armt_A_max", v["A"].abs().max())
    record("armt_z_max", z.abs().max())
    record("armt_v_max", v["v"].abs().max())


def titans_scan(v: dict[str, Any]) -> None:
    weights, momentum = v["states_before"]
    CLIP["value"] = v["grad_clip"]
    record("titans_theta_max", v["lr"].max())
    record("titans_theta_mean", v["lr"].mean(), mean)
    record("titans_alpha_mean", (1 - v["log_keep"].exp()).mean(), mean)
    record("titans_alpha_min", (1 - v["log_keep"].exp()).min(), min)
    record("titans_eta_max", v["log_eta"].exp().max())
    record("titans_W_max", max(w.abs().max() for w in weights))
    record("titans_S_max", max(s.abs().max() for s in momentum))
    record("titans_S_norm_max", max(s.flatten(2).norm(dim=-1).max() for s in momentum))


def titans_inner_grad(v: dict[str, Any]) -> None:
    norm = sum((d * d).sum(-1) * (a * a).sum(-1) for d, a in zip(v["deltas"], v["acts"])).sqrt()  # [B, H, n]
    record("titans_inner_grad_max", norm.max())
    if CLIP["value"] > 0:
        record("titans_inner_clipped", (norm > CLIP["value"]).double().mean(), mean)
        record("titans_inner_clip_margin_min", (norm - CLIP["value"]).abs().min(), min)


LISTENERS = {"armt.read": armt_read, "armt.write": armt_write, "titans.scan": titans_scan,
             "titans.inner_grad": titans_inner_grad}


def listen(name: str, values: dict[str, Any]) -> None:
    with torch.no_grad():
        LISTENERS[name](values)


def tracing(method: str) -> Optional[AbstractContextManager]:
    """A context inside which `method`'s memory statistics are recorded; None where there are none."""
    family = "titans" if method.startswith("titans") else method
    return recording(listen, names=PROBES[family]) if family in PROBES else None


def flush(path: Path, step: int) -> None:
    """Append this step's reduced statistics to `path` and start the next step's."""
    row = {"step": step, **{k: REDUCE[k](v) for k, v in STATS.items() if v}}
    with path.open("a") as fh:
        fh.write(json.dumps(row) + "\n")
    STATS.clear()
