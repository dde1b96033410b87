"""How strongly ARMT writes, segment by segment: the `distance`
suite's own examples streamed through a trained ARMT run, and per layer, for the pairs' segment and
for the filler after it, the write strength β of the memory tokens (median, and the share shut to
below 1e-6) and the sizes |k| = |φ(W_K m)| and |v| = |W_V m| of what they write.

The delta gain is the largest eigenvalue of G = Σ_i β_i k_i k_iᵀ / den_i, the part of A that one
batched write subtracts (A ← A (I − G) + Σ_i β_i v_i k_iᵀ, every token reading the same A): one
token alone has a gain of at most 1 (den_i ≥ ‖k_i‖²), but the m tokens' sum can pass 2, where the
write amplifies what A holds instead of correcting it (the delta rule's step-size bound).

A layer whose β is shut exactly during the filler keeps what the pairs wrote (its A does not move);
one whose β stays open keeps writing filler over them. In the paper's write, β = sigmoid(W_β m) can
shut exactly only because m (the memory tokens' residual stream) grows large; `write_norm: rms`
takes that away, `rms-kv` leaves β the raw m.

    python experiments/distance/armt_write_gate.py RUN_DIR [RUN_DIR ...] [--segments 40] [--trials 32] [--out results/bench]

The command line prints a table per run and appends one row per (run, layer, phase) to armt_write_gate.csv.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

import torch
from torch import Tensor

import memzoo.memories.armt as armt
from memzoo.core.probe import recording
from memzoo.core.model import MemoryModel
from memzoo.runs.checkpoints import load_trained
from memzoo.evaluations.distance import distance_batch
from memzoo.evaluations.generate import StreamingDecoder
from memzoo.evaluations.recall_stream import training_layout

SHUT = 1e-6  # a β below this writes nothing a float32 state can hold next to the pairs' write


@contextmanager
def recorded_writes() -> Iterator[list[tuple[Tensor, Tensor, Tensor, Tensor]]]:
    """Every ARMT write while inside, in call order (the plugin's "armt.write" probe): (β [B, m],
    |k| [B, m], |v| [B, m], delta gain [B]; the gain is NaN on a row whose memory was empty)."""
    calls: list[tuple[Tensor, Tensor, Tensor, Tensor]] = []

    def listen(name: str, w: dict[str, Any]) -> None:
        kd, bd = w["k"].detach().double(), w["beta"].detach().double()  # [B, m, d_key], [B, m, 1]
        gain = delta_gain(kd, w["z"].detach().double(), bd, w["eps"], w["floor"], w.get("cos_floor", 0.0))
        gain[w["empty"].cpu()] = float("nan")
        calls.append((bd[..., 0], kd.norm(dim=-1), w["v"].detach().double().norm(dim=-1), gain))

    with recording(listen, {"armt.write"}):
        yield calls


def delta_gain(k: Tensor, z: Tensor, beta: Tensor, eps: float, floor: float, cos_floor: float = 0.0) -> Tensor:
    """The largest eigenvalue of Σ_i β_i k_i k_iᵀ / den_i per row (NaN where not finite).
    k: [B, m, d_key], z: [B, d_key], beta: [B, m, 1] -> [B]."""
    scale = beta / armt.denominator(k, z, eps, floor, cos_floor)  # [B, m, 1] β_i / den_i (the write's own denominators)
    gram = torch.einsum("bmk,bml->bkl", k * scale, k)  # [B, d_key, d_key]
    finite = gram.flatten(1).isfinite().all(-1)  # [B]
    gain = torch.full(finite.shape, float("nan"), dtype=torch.float64)
    if bool(finite.any()):
        gain[finite.cpu()] = torch.linalg.eigvalsh(gram[finite]).select(-1, -1).double().cpu()
    return gain


def writes_per_segment(model: MemoryModel, tokens: Tensor, segments: int) -> list[list[tuple[Tensor, ...]]]:
    """Stream tokens [B, ≥ segments·N] one segment at a time; [segment][layer] -> (β, |k|, |v| [B, m], gain [B])."""
    n, layers = model.cfg.segment_len, model.cfg.n_layers
    decoder = StreamingDecoder(model, tokens.shape[0], 1, "fp32")
    with torch.no_grad(), recorded_writes() as calls:
        for s in range(segments):
            decoder.feed(tokens[:, s * n : (s + 1) * n])
    if len(calls) != segments * layers:
        raise RuntimeError(f"{len(calls)} writes recorded for {segments} segments x {layers} layers; is this an ARMT model?")
    return [calls[s * layers : (s + 1) * layers] for s in range(segments)]


def gate_stats(writes: list[tuple[Tensor, ...]]) -> dict[str, float]:
    """Over every (row, memory token) of the given writes whose β, |k| and |v| are finite (a state that
    overflowed makes them NaN): β's median and shut share, |k| and |v| medians, and the non-finite share;
    over every (row, write) with a finite gain: the delta gain's median and the share above 2."""
    beta, k, v = (torch.cat([w[i].flatten() for w in writes]) for i in range(3))
    ok = beta.isfinite() & k.isfinite() & v.isfinite()
    beta, k, v = beta[ok], k[ok], v[ok]
    gain = torch.cat([w[3].flatten() for w in writes]) if len(writes[0]) > 3 else torch.empty(0, dtype=torch.float64)
    gain = gain[gain.isfinite()]
    return {"beta_median": beta.median().item(), "beta_shut_share": (beta < SHUT).double().mean().item(),
            "k_norm_median": k.median().item(), "v_norm_median": v.median().item(),
            "nonfinite_share": 1 - ok.double().mean().item(),
            "gain_median": gain.median().item() if gain.numel() else float("nan"),
            "gain_over_2_share": (gain > 2).double().mean().item() if gain.numel() else float("nan")}


def write_gate_rows(run_dir: str, segments: int, trials: int, seed: int = 0) -> list[dict[str, Any]]:
    """One row per (layer, phase) of one trained ARMT distance run: the pairs' segment(s), then the filler."""
    cfg, model = load_trained(run_dir)
    model.eval()
    layout = training_layout(cfg.task)
    batch = distance_batch(layout, segments, trials, model.cfg.segment_len, seed)
    first = int(batch.pairs_segment[0])
    last_write = first + layout["rewrites"]  # the last segment that writes pairs
    per_segment = writes_per_segment(model, batch.tokens.long(), min(segments, batch.query_segment))
    rows = []
    for layer in range(model.cfg.n_layers):
        for phase, span in (("pairs", range(first, last_write + 1)), ("filler", range(last_write + 1, len(per_segment)))):
            rows.append({"run": str(run_dir), "seed": cfg.seed, "write_norm": getattr(model.model_memory.cfg, "write_norm", "none"),
                         "layer": layer, "phase": phase, "segments": len(span),
                         **gate_stats([per_segment[s][layer] for s in span])})
    return rows
