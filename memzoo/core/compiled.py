"""torch.compile of a plugin's hot function, once per (function, mode): for the recurrences whose
eager form launches many small kernels (Titans' chunk step, the DeltaNets' chunkwise form)."""
from __future__ import annotations

from typing import Callable

import torch

COMPILE_MODES = ("eager", "default", "reduce-overhead", "max-autotune-no-cudagraphs")
COMPILED: dict[tuple[Callable, str], Callable] = {}


def check_compile_mode(method: str, mode: str) -> None:
    """A clear error for a mode torch.compile does not take (the value and the choices named)."""
    if mode not in COMPILE_MODES:
        raise ValueError(f"{method} compile={mode!r}; expected one of {COMPILE_MODES}")


def compiled(fn: Callable, mode: str) -> Callable:
    """`fn` itself for mode 'eager', else its torch.compile in `mode` (static shapes, one graph: a
    graph break would hide the eager cost it is meant to remove), shared by every layer that calls it."""
    if mode == "eager":
        return fn
    if (fn, mode) not in COMPILED:
        COMPILED[(fn, mode)] = torch.compile(fn, mode=mode, dynamic=False, fullgraph=True)
    return COMPILED[(fn, mode)]
