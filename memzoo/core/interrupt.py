"""SIGTERM as an interrupt: a `kill` (or a scheduler's stop) ends a memzoo command as Ctrl-C does,
with its checkpoint kept and its lock released, and a suite passes it on to its worker processes."""
from __future__ import annotations

import signal
from types import FrameType
from typing import Optional


class Terminated(KeyboardInterrupt):
    """The process was sent SIGTERM (unlike a terminal's Ctrl-C, its child processes were not)."""


def _terminated(signum: int, frame: Optional[FrameType]) -> None:
    raise Terminated(f"signal {signum}")


def raise_on_sigterm() -> None:
    """From now on SIGTERM raises `Terminated` in this (main) thread."""
    signal.signal(signal.SIGTERM, _terminated)
