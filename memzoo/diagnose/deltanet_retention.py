"""How much of the pairs' write a (Gated) DeltaNet keeps as filler streams through it (a diagnosis
of the DeltaNets' reach): the `distance` suite's own examples streamed through a trained
run, and per layer, at each gap G, the state split into what the pairs wrote and what the filler wrote.

Given the tokens' k_t, β_t and α_t (what the stream computed), the recurrence is affine in S:
S_t = S_{t-1} α_t (I − β_t k_t k_tᵀ) + β_t v_t k_tᵀ. So the state at gap G is exactly

    S_G = P_G + F_G,   P_G = P_0 Π_t α_t (I − β_t k_t k_tᵀ)   (the pairs' write, carried: v ≡ 0)
                       F_G = the filler's own writes from S = 0

with P_0 the state right after the pairs' last segment (the stream starts from S = 0). Reported:
retention ‖P_G‖ / ‖P_0‖ (how much of the pairs' write survives the filler's erasures and decay),
filler/pairs ‖F_G‖ / ‖P_G‖, the read ratio ‖P_G q‖ / ‖F_G q‖ at the scored positions of the
queries' segment (with its own q: the pairs' part of the memory read against the filler's), the
write strength β (mean, and the share below 0.01) over the pairs' segment and over the filler, the
filler's mean log α (Gated DeltaNet's decay; 0 for DeltaNet), and recall at G on the same examples.
The split is checked on every call: ‖P + F − S‖ / ‖S‖ is reported (float32 rounding, ~1e-6).

    python experiments/distance/deltanet_retention.py RUN_DIR [RUN_DIR ...] [--gaps 8,16,64,256,1024] [--trials 32] [--out results/bench]

The command line appends one row per (run, gap, layer) to deltanet_retention.csv and prints a table per run.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator, Optional

import torch
from torch import Tensor

import memzoo.memories.gated_deltanet as gdn
from memzoo.core.probe import recording
from memzoo.runs.checkpoints import load_trained
from memzoo.diagnose.stream import ProbeStream
from memzoo.evaluations.recall_stream import training_layout

SMALL_BETA = 0.01  # a write this weak moves S by at most 1% of the error along k
RECURRENCE = gdn.delta_rule_chunkwise  # the plugin's own chunkwise form (same values as its loop)


def carry(p: Tensor, k: Tensor, g: Tensor, beta: Tensor, reset: Tensor, chunk_size: int) -> Tensor:
    """P Π_t α_t (I − β_t k_t k_tᵀ) over the given tokens: the recurrence with v ≡ 0 (its homogeneous
    part). p: [B, H, Dv, Dk]; k: [B, S, H, N, Dk]; g, beta: [B, S, H, N]; reset: [B, S] -> [B, H, Dv, Dk]."""
    zeros = k.new_zeros(*k.shape[:-1], p.shape[-2])  # [B, S, H, N, Dv]
    return RECURRENCE(k, k, zeros, g, beta, p, reset, chunk_size)[1]


class PairsSplit:
    """Called with every recurrence of the stream (layer by layer, in call order): carries each layer's
    pairs' part P and filler's part F alongside the model's own S, and accumulates the gates' statistics.
    `phase` is "pairs" (the pairs' segments: P is the state they leave), "filler" or "query" (a peek:
    records q, changes nothing)."""

    def __init__(self, n_layers: int, chunk_size: int):
        self.n_layers, self.chunk_size, self.calls, self.phase = n_layers, chunk_size, 0, "pairs"
        self.p: list[Optional[Tensor]] = [None] * n_layers  # [B, H, Dv, Dk]
        self.f: list[Optional[Tensor]] = [None] * n_layers
        self.s: list[Optional[Tensor]] = [None] * n_layers  # the model's own state
        self.q: list[Optional[Tensor]] = [None] * n_layers  # [B, H, N, Dk] the queries' segment
        self.split_error = [0.0] * n_layers  # the largest ‖P + F − S‖ / ‖S‖ seen
        self.sums = {(layer, phase): torch.zeros(4, dtype=torch.float64) for layer in range(n_layers)
                     for phase in ("pairs", "filler")}  # [tokens, Σβ, #β<0.01, Σ log α]

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, s0: Tensor, reset: Tensor,
                 new_state: Tensor) -> None:
        layer = self.calls % self.n_layers
        self.calls += 1
        if self.phase == "query":
            self.q[layer] = q[:, 0]
            return
        sums = self.sums[(layer, self.phase)]
        sums += torch.tensor([beta.numel(), beta.double().sum(), (beta < SMALL_BETA).sum(), g.double().sum()])
        if self.phase == "pairs":
            self.p[layer], self.f[layer] = new_state.clone(), torch.zeros_like(new_state)
        else:
            self.p[layer] = carry(self.p[layer], k, g, beta, reset, self.chunk_size)
            self.f[layer] = RECURRENCE(q, k, v, g, beta, self.f[layer], reset, self.chunk_size)[1]
            error = (self.p[layer] + self.f[layer] - new_state).flatten(1).norm(dim=-1) / new_state.flatten(1).norm(dim=-1)
            self.split_error[layer] = max(self.split_error[layer], float(error.max()))
        self.s[layer] = new_state


@contextmanager
def recorded(split: PairsSplit) -> Iterator[PairsSplit]:
    """Show `split` every DeltaNet recurrence (either form) the model runs while inside: the plugin's
    "gated-deltanet.recurrence" probe, its inputs and the state it leaves."""

    def listen(name: str, r: dict[str, Any]) -> None:
        split(r["q"], r["k"], r["v"], r["g"], r["beta"], r["s0"], r["reset"], r["state"])

    with recording(listen, {"gated-deltanet.recurrence"}):
        yield split


def frob(x: Tensor) -> Tensor:
    """Frobenius norm per batch row over every other axis: [B, ...] -> [B]."""
    return x.flatten(1).norm(dim=-1)


def layer_metrics(split: PairsSplit, layer: int, p0: Tensor, positions: list[list[int]]) -> dict[str, float]:
    """One layer's split at the current gap; positions: the scored positions in the queries' segment per row."""
    p, f, q = split.p[layer], split.f[layer], split.q[layer]  # [B, H, Dv, Dk] x 2, [B, H, N, Dk]
    read_p = torch.einsum("bhvk,bhnk->bnhv", p, q).flatten(2).norm(dim=-1)  # [B, N] over heads and Dv
    read_f = torch.einsum("bhvk,bhnk->bnhv", f, q).flatten(2).norm(dim=-1)
    ratio = torch.cat([read_p[i, pos] / read_f[i, pos] for i, pos in enumerate(positions)])
    out = {"retention_median": (frob(p) / frob(p0)).median().item(),
           "filler_over_pairs_median": (frob(f) / frob(p)).median().item(),
           "read_ratio_median": ratio.median().item(), "split_error": split.split_error[layer]}
    for phase in ("pairs", "filler"):
        n, beta, small, log_alpha = split.sums[(layer, phase)].tolist()
        out |= {f"beta_{phase}_mean": beta / max(n, 1), f"beta_{phase}_small_share": small / max(n, 1)}
    out["log_alpha_filler_mean"] = log_alpha / max(n, 1)  # the loop's last phase: the filler
    return out


@torch.no_grad()
def retention_rows(run_dir: str, gaps: list[int], trials: int, seed: int = 0, segments_per_call: int = 64) -> list[dict[str, Any]]:
    """One row per (gap, layer) of one trained (Gated) DeltaNet distance run, on the distance suite's examples."""
    cfg, model = load_trained(run_dir)
    model.eval()
    memories = [m for m in model.modules() if isinstance(m, gdn.GatedDeltaNet)]
    if not memories:
        raise ValueError(f"{run_dir} is a {cfg.memory.name!r} run; expected deltanet or gated-deltanet")
    gaps = sorted(set(gaps))
    stream = ProbeStream(model, training_layout(cfg.task), gaps[-1], trials, seed, segments_per_call)
    split = PairsSplit(len(memories), memories[0].cfg.chunk_size)
    rows = []
    with recorded(split):
        stream.feed_writes()
        p0 = [p.clone() for p in split.p]
        split.phase = "filler"
        for gap in gaps:
            stream.feed_to_gap(gap)
            split.phase = "query"
            _, scores = stream.peek()
            split.phase = "filler"
            for layer in range(len(memories)):
                rows.append({"run": str(run_dir), "method": cfg.memory.name, "seed": cfg.seed, "gap_segments": gap,
                             "trials": trials, "layer": layer, "recall_accuracy": scores["recall_accuracy"],
                             **layer_metrics(split, layer, p0[layer], stream.offsets)})
    return rows
