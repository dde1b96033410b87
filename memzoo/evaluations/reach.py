"""How far a memory reaches by construction: the farthest gap, in whole segments, between a
segment and a later one across which anything of the earlier segment can arrive.

A window memory (XL's cache, Compressive's FIFO and compressed slots, Memorizing's store; the
plugin's `lookback`) lets layer l attend to w_l positions before its segment's first token, and
causal attention within a segment reaches back to that segment's first token. Information climbs
one layer per hop, so the earliest input position the top layer's output in the queries' segment
can depend on is found by walking down the layers from the top: p <- (start of p's segment) - w_l,
starting at the queries' segment start. A gap G is within reach when the whole segment G back lies
at or after that position. A memory whose state can carry anything (lookback None: a matrix,
memory tokens, full attention) has no such limit. The backbone's sliding window (model.attention_span
W > 0) lets every layer that uses it see W - 1 positions back, whatever its memory's own lookback.

Example: XL with mem_len 16 = N and 2 layers reaches 2 segments (the top layer's cache holds the
previous segment, whose layer-0 outputs saw the one before); Memorizing with a 16-slot store at
layer 1 and no XL cache reaches 1.
"""
from __future__ import annotations

from typing import Optional

from omegaconf import DictConfig

from memzoo.core.config import model_config
from memzoo.core.plugins import get_memory
from memzoo.core.window import carried_len
from memzoo.runs.configure import memory_config


def reach_segments(windows: Optional[list[int]], segment_len: int) -> Optional[int]:
    """The farthest whole-segment gap that per-layer windows `windows` (bottom layer first) can
    bridge; None for None (no window: unbounded)."""
    if windows is None:
        return None
    if segment_len < 1 or any(w < 0 for w in windows):
        raise ValueError(f"reach of windows={windows} with segment_len={segment_len}; expected windows >= 0 and "
                         "segment_len >= 1")
    earliest = 0  # positions relative to the queries' segment start
    for w in reversed(windows):  # from the top layer down
        earliest = (earliest // segment_len) * segment_len - w
    return -earliest // segment_len


def max_reach_segments(cfg: DictConfig) -> Optional[int]:
    """The farthest gap (segments) run config `cfg`'s memory can bridge by construction; None: no limit."""
    spec = get_memory(str(cfg.memory.name))
    model = model_config(cfg)
    windows = spec.cls.lookback(memory_config(cfg.memory.name, cfg.memory), model)
    if windows is not None and spec.cls.uses_window:  # the backbone's sliding window sees W - 1 positions back
        windows = [max(w, carried_len(model.attention_span)) for w in windows]
    return reach_segments(windows, model.segment_len)
