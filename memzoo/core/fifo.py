"""A fixed-capacity FIFO of per-row slots, shared by the cache-style memories (XL, Compressive,
Memorizing). Buffers are laid out [B, C, ...] (slot axis 1, oldest first) with a `valid` mask
[B, C], so empty slots are masked rather than attended as zeros, and a reset row just clears its
mask. Slot i of a full, time-contiguous buffer holds the position i - C relative to the segment
that follows it.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from memzoo.core.attention import KVPrefix
from memzoo.core.memory import State


def fifo_init(batch_size: int, capacity: int, shapes: dict[str, tuple[int, ...]], device: torch.device,
              dtype: torch.dtype = torch.float32, lazy: bool = False) -> State:
    """Empty buffers {name: [B, C, *shape]} plus `valid` [B, C] (all False).

    lazy: the buffers are left uninitialised (no page of them is touched), for buffers that are only
    ever read through `filled` and written by `fifo_push_filled`.
    """
    alloc = torch.empty if lazy else torch.zeros
    state = {name: alloc(batch_size, capacity, *shape, device=device, dtype=dtype) for name, shape in shapes.items()}
    state["valid"] = torch.zeros(batch_size, capacity, dtype=torch.bool, device=device)
    return state


def fifo_reset(state: State, rows: Tensor) -> State:
    """Clear the rows marked in `rows` [B]: every bool `*valid` mask of the state (one per buffer,
    e.g. `valid`, `store_valid`) loses those rows' slots, so they are masked from then on."""
    return {k: v & ~rows[:, None] if k.endswith("valid") and v.dtype == torch.bool else v for k, v in state.items()}


def fifo_push(state: State, new: dict[str, Tensor], new_valid: Tensor | None = None) -> tuple[State, State]:
    """Append n new slots per row ({name: [B, n, ...]}), keep the newest C.

    Returns (state, evicted) where evicted holds the slots pushed out, oldest first, with their
    own `valid` mask (for compression into a second memory).
    """
    capacity = state["valid"].shape[1]
    n = next(iter(new.values())).shape[1]
    if new_valid is None:
        new_valid = torch.ones(state["valid"].shape[0], n, dtype=torch.bool, device=state["valid"].device)
    joined = {name: torch.cat((state[name], new[name].to(state[name].dtype)), dim=1) for name in new}
    joined["valid"] = torch.cat((state["valid"], new_valid), dim=1)
    cut = joined["valid"].shape[1] - capacity
    kept = {name: t[:, cut:] for name, t in joined.items()}
    evicted = {name: t[:, :cut] for name, t in joined.items()}
    return kept, evicted


def filled(buf: State) -> State:
    """The buffer from its oldest slot valid in any row on: {name: [B, F, ...]}, F <= C.

    Every valid slot is kept (rows with fewer are still masked by `valid`), so a read over the
    result masks exactly what a read over the whole buffer masks, at a cost that follows the filled
    slots, not the capacity. Slot i of the result is slot C - F + i of the buffer, so a FIFO
    slot's position i - C (slot_positions) is the same computed on either.
    """
    valid = buf["valid"]  # [B, C]
    capacity = valid.shape[1]
    if capacity == 0:
        return buf
    slot = torch.arange(capacity, device=valid.device)
    first = int(torch.where(valid.any(dim=0), slot, capacity).min())  # one host sync
    return buf if first == 0 else {name: t[:, first:] for name, t in buf.items()}


def fifo_push_filled(state: State, new: dict[str, Tensor]) -> State:
    """fifo_push for a buffer read only through `filled`: writes the filled slots and the new ones, nothing else.

    While the buffer is not full the slots before the filled part are left as they are in a new
    uninitialised buffer (never read), so a push costs the filled slots, not the capacity: a store
    of 65,536 holding 900 keys copies 900 slots. A full buffer shifts as fifo_push does. Every slot
    from the oldest valid one on holds what fifo_push would put there.
    """
    valid = state["valid"]  # [B, C]
    capacity, n = valid.shape[1], next(iter(new.values())).shape[1]
    window = filled(state)  # {name: [B, F, ...]}
    kept = window["valid"].shape[1] + n  # F + n slots written
    if kept >= capacity:
        return fifo_push(state, new)[0]
    out = {}
    for name, t in new.items():
        buf = torch.empty_like(state[name])  # [B, C, ...]; slots before C - F - n are never touched
        buf[:, capacity - kept : capacity - n] = window[name]
        buf[:, capacity - n :] = t.to(buf.dtype)
        out[name] = buf
    out["valid"] = torch.cat((valid[:, n:], torch.ones(valid.shape[0], n, dtype=torch.bool, device=valid.device)), dim=1)
    return out


def slot_positions(capacity: int, device: torch.device, spacing: int = 1, offset: int = 0) -> Tensor:
    """Positions of C time-contiguous slots relative to the next segment's first token: [C]."""
    return (torch.arange(capacity, device=device) - capacity) * spacing - offset


def kv_slot_shapes(n_heads: int, d_head: int) -> dict[str, tuple[int, ...]]:
    """A key/value cache slot: one key and one value per head."""
    return {"k": (n_heads, d_head), "v": (n_heads, d_head)}


def kv_slot_numbers(n_heads: int, d_head: int) -> int:
    """Numbers a key/value slot holds (kv_slot_shapes): 2·H·D."""
    return 2 * n_heads * d_head


def kv_slots(k: Tensor, v: Tensor) -> dict[str, Tensor]:
    """A segment's keys and values (k, v [B, H, N, D]) as FIFO slots {k, v: [B, N, H, D]}, gradient stopped."""
    return {"k": k.transpose(1, 2).detach(), "v": v.transpose(1, 2).detach()}


def hidden_prefix(cache: State, project_kv: Callable[[Tensor], tuple[Tensor, Tensor]], dtype: torch.dtype) -> KVPrefix | None:
    """A FIFO of hidden states (h [B, C, d], valid [B, C]) as the prefix of local attention: its
    filled part only (F slots), keys and values recomputed by the current W_K, W_V (`project_kv`),
    slot i at position i - F, empty slots masked. None when F = 0 (XL cache=hidden, the ∞-former's STM)."""
    held = filled(cache)  # projecting and attending cost the slots held, not the capacity
    count = held["valid"].shape[1]
    if count == 0:
        return None
    k, v = project_kv(held["h"].to(dtype))  # [B, H, F, D] each
    return KVPrefix(k, v, slot_positions(count, held["valid"].device), held["valid"])


def kv_prefix(cache: State) -> KVPrefix | None:
    """A key/value FIFO (k, v [B, C, H, D], valid [B, C]) as the prefix of local attention: its filled
    part only (`filled`: F slots), slot i at position i - F before the segment, empty slots masked.
    None when F = 0."""
    cache = filled(cache)  # attention costs the slots held, not the capacity
    capacity = cache["valid"].shape[1]
    if capacity == 0:
        return None
    return KVPrefix(
        k=cache["k"].transpose(1, 2),  # [B, H, F, D]
        v=cache["v"].transpose(1, 2),
        pos=slot_positions(capacity, cache["valid"].device),  # [F]: -F .. -1
        valid=cache["valid"],
    )


def delayed(cache: State, attended: int, delay: int) -> State:
    """The `attended` oldest slots of a FIFO whose `delay` newest slots are not read (a cache behind the
    backbone's window: memzoo.core.window.beyond_window_delay); the cache itself when delay is 0."""
    return {name: t[:, :attended] for name, t in cache.items()} if delay else cache


def shifted(prefix: KVPrefix | None, delay: int) -> KVPrefix | None:
    """A prefix read from `delayed` slots, moved `delay` positions further back (behind the delay line)."""
    if prefix is None or not delay:
        return prefix
    return KVPrefix(prefix.k, prefix.v, prefix.pos - delay, prefix.valid)


def push_kv(cache: State, k: Tensor, v: Tensor) -> tuple[State, State]:
    """Append a segment's keys and values (k, v [B, H, N, D]) with gradient stopped, in the cache's dtype."""
    return fifo_push(cache, kv_slots(k, v))  # fifo_push casts
