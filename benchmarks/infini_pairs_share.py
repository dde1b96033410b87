"""How much of Infini-attention's memory read is the pairs' as the gap grows? (a `distance` diagnosis
of the linear rule on the `distance` suite.) Under the linear rule the state is a sum over the tokens
written, z_G = z_P + z_F(G) (the pairs' segment's keys, then the filler's), and the read
σ(q) M / (σ(q) z) is a weighted average of the values with the pairs' total weight

    share(G) = σ(q)·z_P / σ(q)·z_G                      (exact: nothing is ever erased)

With a filler that writes about the same mass b every segment, share ≈ a / (a + b G): it falls as
1/G, not geometrically as a delta rule's carried part does (benchmarks/deltanet_retention.py).
Per layer and head, at the scored positions of the queries' segment on the suite's own examples:
the median share over examples and positions, the median selectivity σ(q)·z_P / σ(q)·z_F(1) (the
pairs' weight against one filler segment's, the a/b above), and the head's memory gate; with the
recall on the same examples.

    python benchmarks/infini_pairs_share.py RUN_DIR [RUN_DIR ...] [--gaps 8,64,256,1024,4096] [--trials 32] [--out results/bench]

Appends one row per (run, gap, layer, head) to infini_pairs_share.csv and prints each layer's
head with the largest share.
"""
from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

import memzoo.memories.infini as infini
from memzoo.running.bench_table import append_rows
from memzoo.running.checkpoints import load_trained
from memzoo.running.distance import ProbeStream
from memzoo.running.recall_stream import training_layout


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
    recording = [False]
    for i, layer in blocks:
        plain = layer.forward

        def record(x, state, i=i, plain=plain):
            if recording[0]:
                queries[i] = infini.sigma(x.q.float())[:, -1]  # [B, H, N, Dk]: the peeked queries' segment
            return plain(x, state)

        layer.forward = record  # this instance only
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
        recording[0] = True
        _, scores = stream.peek()
        recording[0] = False
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="trained infini-linear run folders of the distance suite (its last stage)")
    ap.add_argument("--gaps", default="8,64,256,1024,4096")
    ap.add_argument("--trials", type=int, default=32)
    ap.add_argument("--out", default="results/bench")
    args = ap.parse_args()
    path = Path(args.out) / "infini_pairs_share.csv"
    for run in args.runs:
        rows = share_rows(run, [int(g) for g in args.gaps.split(",")], args.trials)
        append_rows(path, rows)
        print(f"{run} (seed {rows[0]['seed']}): per layer, the head whose share is largest (median over examples)")
        for gap in sorted({r["gap_segments"] for r in rows}):
            for layer in sorted({r["layer"] for r in rows}):
                heads = [r for r in rows if r["gap_segments"] == gap and r["layer"] == layer]
                best = max(heads, key=lambda r: r["share_median"])
                print(f"  gap {gap:>5} layer {layer}: recall {best['recall_accuracy']:.2f}  head {best['head']} share "
                      f"{best['share_median']:.3g}  selectivity {best['selectivity_median']:.3g}  gate "
                      f"{best['memory_gate']:.2f}", flush=True)
    print(f"appended to {path}")


if __name__ == "__main__":
    main()
