"""How much of Infini-attention's memory read can one key get? Per layer, the best head's share.
The command line of memzoo.diagnose.infini_share.

    python experiments/longrange/infini_share.py RUN_DIR [--lengths 668,4096,32768] [--trials 2]
"""
from __future__ import annotations

import argparse

import torch

from memzoo.diagnose.infini_share import key_share


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run")
    parser.add_argument("--lengths", default="668,4096,32768")
    parser.add_argument("--trials", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"{args.run}: key at depth 0; per layer, the head giving the key's digit the largest share")
    print(f"{'length':>8} {'layer':>5} {'share':>8} {'selectivity':>11} {'read/value (mean over heads)':>29}")
    for length in (int(x) for x in args.lengths.split(",")):
        share, sel, read = key_share(args.run, length, args.trials)
        for layer in range(share.shape[0]):
            h = int(share[layer].argmax())
            print(f"{length:8d} {layer:5d} {float(share[layer, h]):8.4f} {float(sel[layer, h]):11.1f} "
                  f"{float(read[layer].mean()):29.3f}")


if __name__ == "__main__":
    main()
