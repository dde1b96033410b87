"""What a memory's state holds as the gap grows: the `distance`
suite's own examples streamed through a trained run, and at each gap G, per state tensor,

    drift(G)  = ||S_G - S_0|| / ||S_0||           how far the state moved after the last write
    filler(G) = ||S_G - S_0|| / ||S_0 - S_pre||   the filler's writes against the pairs' own write

with S_pre the state before the pairs' segment, S_0 right after the last write, S_G before the
queries' segment at gap G (norms per example, then the median over the examples whose state is finite),
the state's norm, the share of examples whose state overflowed to inf or NaN, and the recall at G on
the same examples, split by whether their state overflowed. A memory whose filler writes grow past
its pairs' write (filler > 1) overwrites what it stored; one whose state stays put (drift ~ 0) and
still loses recall has a read that changed, not a state.

    python experiments/distance/state_drift.py RUN_DIR [RUN_DIR ...] [--gaps 8,64,512,4096] [--trials 32] [--float64] [--set KEY=VALUE] [--out results/bench]

The command line appends one row per (run, gap, state tensor) to state_drift.csv and prints a table per run.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from memzoo.core.model import ModelState
from memzoo.runs.checkpoints import load_trained
from memzoo.diagnose.stream import ProbeStream
from memzoo.evaluations.recall_stream import training_layout


def flat_state(state: ModelState) -> dict[str, Tensor]:
    """Every floating-point state tensor as [B, numbers] in float64, named part.key (part: layer
    index, or 'model' for a model-level memory)."""
    parts = [(str(i), s) for i, s in enumerate(state.layers)] + [("model", state.model)]
    return {f"{p}.{k}": v.detach().double().flatten(1).cpu() for p, s in parts for k, v in s.items()
            if isinstance(v, Tensor) and v.is_floating_point() and v.dim() >= 1}


def row_norm(x: Tensor) -> Tensor:
    return x.norm(dim=1)  # [B]


def state_metrics(before: dict[str, Tensor], after: dict[str, Tensor], now: dict[str, Tensor],
                  hits: Tensor) -> list[dict[str, Any]]:
    """Per state tensor (each [B, numbers]: S_pre, S_0, S_G) with hits [B] (recall per example at G):
    the share of examples whose state overflowed (inf or NaN in any tensor), the recall of the others
    and of those, and over the others the medians of log10 |S_G|, drift and filler (module doc)."""
    finite = torch.stack([torch.isfinite(v).all(1) for v in now.values()]).all(0)  # [B]
    rows = []
    for name, s0 in after.items():
        moved = row_norm(now[name] - s0)  # [B]
        drift = (moved / row_norm(s0).clamp_min(1e-30))[finite]
        filler = (moved / row_norm(s0 - before[name]).clamp_min(1e-30))[finite]
        norm = row_norm(now[name])[finite]
        med = lambda x: x.median().item() if len(x) else float("nan")  # noqa: E731
        rows.append({"state": name, "numbers": s0.shape[1], "nonfinite_rows": 1 - finite.double().mean().item(),
                     "recall_finite_rows": hits[finite].mean().item() if finite.any() else float("nan"),
                     "recall_nonfinite_rows": hits[~finite].mean().item() if (~finite).any() else float("nan"),
                     "log10_norm_median": med(norm.log10()), "drift_median": med(drift),
                     "filler_over_write_median": med(filler)})
    return rows


@torch.no_grad()
def drift_rows(run_dir: str, gaps: list[int], trials: int, seed: int = 0, segments_per_call: int = 64,
               float64: bool = False, options: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """One row per (gap, state tensor) of one trained distance run, on the distance suite's examples
    (float64: the trained weights and every state in float64, the same computation with 2^971 x the range;
    options: memory options changed on the trained model, e.g. {"norm_floor": "0"})."""
    cfg, model = load_trained(run_dir)
    model.eval()
    for key, value in (options or {}).items():  # on every memory's config (the model's and each layer's)
        found = [m.cfg for m in model.modules() if hasattr(m, "cfg") and hasattr(m.cfg, key)]
        if not found:
            raise ValueError(f"--set {key}={value}: no memory of {run_dir} has an option {key!r}")
        for c in found:
            setattr(c, key, type(getattr(c, key))(value))
    if float64:
        model.double()
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64 if float64 else default)  # the states a plugin creates
    try:
        return _stream_rows(run_dir, cfg, model, gaps, trials, seed, segments_per_call, float64, options)
    finally:
        torch.set_default_dtype(default)


def _stream_rows(run_dir: str, cfg: Any, model: Any, gaps: list[int], trials: int, seed: int, segments_per_call: int,
                 float64: bool, options: dict[str, str] | None) -> list[dict[str, Any]]:
    """drift_rows' stream, once the model is loaded and set up."""
    gaps = sorted(set(gaps))
    stream = ProbeStream(model, training_layout(cfg.task), gaps[-1], trials, seed, segments_per_call)
    before = flat_state(stream.decoder.state)
    stream.feed_writes()
    after = flat_state(stream.decoder.state)
    rows = []
    for gap in gaps:
        stream.feed_to_gap(gap)
        now = flat_state(stream.decoder.state)
        _, scores = stream.peek()
        hits = torch.tensor([h / max(q, 1) for h, q in zip(scores["recall_hits_by_example"], scores["recall_queries_by_example"])],
                            dtype=torch.float64)  # [B]
        rows += [{"run": str(run_dir), "method": cfg.memory.name, "seed": cfg.seed, "float64": float64,
                  "options": str(options or {}), "gap_segments": gap, "trials": trials,
                  "recall_accuracy": scores["recall_accuracy"], **m} for m in state_metrics(before, after, now, hits)]
    return rows
