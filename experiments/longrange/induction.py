"""Does a trained run copy from its context? Bits per byte on a chunk's first and second copy.
The command line of memzoo.diagnose.induction.

    python experiments/longrange/induction.py RUN_DIR [RUN_DIR ...] [--chunks 32] [--chunk-len 60]
"""
from __future__ import annotations

import argparse

from memzoo.diagnose.induction import copy_bits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+")
    parser.add_argument("--chunks", type=int, default=32)
    parser.add_argument("--chunk-len", type=int, default=60)
    args = parser.parse_args()
    print(f"{'run':40} {'first copy':>10} {'second copy':>11}")
    for run in args.runs:
        first, second = copy_bits(run, args.chunks, args.chunk_len)
        print(f"{run:40} {first:10.2f} {second:11.2f}")


if __name__ == "__main__":
    main()
