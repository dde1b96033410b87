"""`python -m memzoo ...` is the `memzoo` command (so `torchrun -m memzoo train CONFIG` works)."""
import sys

from memzoo.cli import command

if __name__ == "__main__":
    sys.exit(command())
