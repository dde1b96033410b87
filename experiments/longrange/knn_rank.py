"""Where does Memorizing's kNN layer look for a passkey? The key slot's rank and weight per head.
The command line of memzoo.diagnose.knn_rank.

    python experiments/longrange/knn_rank.py RUN_DIR --length 668 --back 3 [--trials 4]
"""
from __future__ import annotations

import argparse

import torch

from memzoo.diagnose.knn_rank import knn_layer_of, slot_ranks
from memzoo.runs.checkpoints import load_trained


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run")
    parser.add_argument("--length", type=int, default=668)
    parser.add_argument("--back", type=int, default=3, help="segments between the key and the question")
    parser.add_argument("--trials", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(1)
    _, model = load_trained(args.run)
    ranks, weights = slot_ranks(model, args.length, args.back, args.trials)
    knn = knn_layer_of(model)
    r, w = torch.tensor(ranks, dtype=torch.float), torch.tensor(weights)
    print(f"{args.run}: length {args.length}, key {args.back} segments back, {len(ranks)} answer digits")
    print("gate sigmoid(b):", [round(g, 2) for g in knn.gate_values().tolist()])
    print("temperature τ:  ", [round(t, 1) for t in knn.log_scale.exp().tolist()])
    print("median rank:    ", [int(v) for v in r.median(0).values.tolist()])
    print("top-1 share:    ", [round(v, 2) for v in (r == 0).float().mean(0).tolist()])
    print("mean weight:    ", [round(v, 3) for v in w.mean(0).tolist()])


if __name__ == "__main__":
    main()
