"""How much of Infini-attention's memory read is the pairs' as the gap grows? (the linear rule
on the `distance` suite.) Under the linear rule the state is a sum over the tokens written,
z_G = z_P + z_F(G) (the pairs' segment's keys, then the filler's), and the read σ(q) M / (σ(q) z)
is a weighted average of the values with the pairs' total weight

    share(G) = σ(q)·z_P / σ(q)·z_G                      (exact: nothing is ever erased)

With a filler that writes about the same mass b every segment, share ≈ a / (a + b G): it falls as
1/G, not geometrically as a delta rule's carried part does (memzoo.diagnose.deltanet_retention).
Per layer and head, at the scored positions of the queries' segment on the suite's own examples:
the median share over examples and positions, the median selectivity σ(q)·z_P / σ(q)·z_F(1) (the
pairs' weight against one filler segment's, the a/b above), and the head's memory gate; with the
recall on the same examples.

    python experiments/distance/infini_pairs_share.py RUN_DIR [RUN_DIR ...] [--gaps 8,64,256,1024,4096] [--trials 32] [--out results/bench]

The command line appends one row per (run, gap, layer, head) to infini_pairs_share.csv and prints each layer's
head with the largest share.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

import memzoo.memories.infini as infini
from memzoo.core.probe import recording
from memzoo.runs.checkpoints import load_trained
from memzoo.diagnose.stream import ProbeStream
from memzoo.evaluations.recall_stream import training_layout


def pairs_share(sq: Tensor, z_pairs: Tensor, z_all: Tensor) -> Tensor:
    """σ(q)·z_P / σ(q)·z: sq [B, H, N, Dk], z_pairs and z_all [B, H, Dk] -> [B, H, N]."""
    return torch.einsum("bhnk,bhk->bhn", sq, z_pairs) / torch.einsum("bhnk,bhk->bhn", sq, z_all).clamp_min(infini.DEN_FLOOR)


def at_scored(x: Tensor, offsets: list[list[int]]) -> Tensor:
    """x [B, H, N] at each example's scored offsets, pooled: [H, sum of positions]."""
    return torch.cat([x[b][:, pos] for b, pos in enumerate(offsets)], dim=1)


@torch.no_grad()
def share_rows(run_dir: str, gaps: list[int], trials: int, seed: int = 0, segments_per_call: int = 64) -> list[dict[str, Any]]:
    """One row per (gap, layer, head) of a trained infini-linear distance run (gaps >= 2: the selectivity
    reads one filler segment after the pairs before the first gap is probed)."""
    if min(gaps) < 2:
        raise ValueError(f"infini_pairs_share gaps={sorted(gaps)}; expected every gap >= 2 segments (the selectivity "
                         f"is measured on the first filler segment, fed before any gap is read)")
    cfg, model = load_trained(run_dir)
    model.eval()
    blocks = [(i, m) for i, m in enumerate(m for m in model.modules() if isinstance(m, infini.InfiniAttention))]
    if not blocks or any(m.cfg.rule != "linear" for _, m in blocks):
        raise ValueError(f"{run_dir}: infini_pairs_share needs an Infini-attention run with rule=linear "
                         f"(its z is a sum, so the pairs' part is exact); got {cfg.memory.name}")
    queries: dict[int, Tensor] = {}
    ordinal = {m.layer_index: i for i, m in blocks}

    def record(name: str, r: dict[str, Any]) -> None:  # the plugin's "infini.memory" probe
        queries[ordinal[r["layer"]]] = r["sq"][:, -1]  # [B, H, N, Dk]: the peeked queries' segment

    gaps = sorted(set(gaps))
    stream = ProbeStream(model, training_layout(cfg.task), gaps[-1], trials, seed, segments_per_call)
    z_of = lambda i: stream.decoder.state.layers[i]["z"].float()  # noqa: E731  [B, H, Dk]
    stream.feed_writes()
    z_pairs = {i: z_of(i).clone() for i, _ in blocks}  # the writes so far
    stream.feed_to_gap(2)  # one filler segment more
    z_one = {i: z_of(i) - z_pairs[i] for i, _ in blocks}  # one filler segment's
    rows = []
    for gap in gaps:
        stream.feed_to_gap(gap)
        with recording(record, {"infini.memory"}):
            _, scores = stream.peek()
        recall = scores["recall_accuracy"]
        for i, layer in blocks:
            share = at_scored(pairs_share(queries[i], z_pairs[i], z_of(i)), stream.offsets)  # [H, positions]
            select = at_scored(pairs_share(queries[i], z_pairs[i], z_one[i]), stream.offsets)  # σ(q)·z_P / σ(q)·z_F(1)
            gate = layer.gate_values().float().flatten()  # [H]: sigmoid(β), the memory's weight
            rows += [{"run": str(run_dir), "method": cfg.memory.name, "seed": cfg.seed, "gap_segments": gap,
                      "layer": i, "head": h, "memory_gate": float(gate[h]) if gate.numel() > h else float("nan"),
                      "share_median": float(share[h].median()), "selectivity_median": float(select[h].median()),
                      "recall_accuracy": recall, "trials": trials} for h in range(share.shape[0])]
    return rows
