"""One training run over several processes (torchrun + DistributedDataParallel).

torchrun sets RANK, WORLD_SIZE and LOCAL_RANK; `setup` joins the process group (gloo on CPU, nccl
on CUDA). Every rank builds the same global batch from (seed, step) and keeps a contiguous block of
its rows (rank r: rows [r B/W, (r+1) B/W)). Gradients are averaged by DDP once per step; the
segment state (the memories) is per rank and never reduced or broadcast. Only rank 0 writes files.
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import ContextManager

import torch
import torch.distributed as dist
from torch import nn

from memzoo.data.corpus import Batch


@dataclass(frozen=True)
class DistInfo:
    """Where this process stands in the run: its rank among `world` processes."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world > 1


def env_info() -> DistInfo:
    """The rank and world size torchrun gave this process (a plain run: rank 0 of 1)."""
    try:
        rank = int(os.environ.get("RANK", "0"))
        world = int(os.environ.get("WORLD_SIZE", "1"))
        local = int(os.environ.get("LOCAL_RANK", str(rank)))
    except ValueError as err:
        raise RuntimeError(f"RANK/WORLD_SIZE/LOCAL_RANK must be integers (as torchrun sets them): {err}") from None
    if world < 1 or not 0 <= rank < world:
        raise RuntimeError(f"RANK={rank} is not in [0, WORLD_SIZE={world})")
    return DistInfo(rank, world, local)


def setup(device: torch.device) -> tuple[DistInfo, torch.device]:
    """Join the process group when launched by torchrun with WORLD_SIZE > 1; returns the info and
    this rank's device (cuda:LOCAL_RANK on CUDA)."""
    info = env_info()
    if not info.enabled:
        return info, device
    if device.type == "cuda":
        device = torch.device("cuda", info.local_rank)
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    if dist.get_world_size() != info.world:
        raise RuntimeError(f"process group has {dist.get_world_size()} ranks, WORLD_SIZE says {info.world}")
    return info, device


def teardown(info: DistInfo) -> None:
    """Leave the process group together: every rank waits at a barrier (rank 0 evaluates and writes
    the result first), then all destroy it. A rank that destroyed its gloo group and exited while
    its peer still held the connection was seen to abort at exit (SIGABRT, "terminate called
    without an active exception"), failing a finished run."""
    if info.enabled and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()


class DetachedState(nn.Module):
    """The model with its returned state detached. `train_window` detaches the state after every
    call anyway; returning it detached keeps DDP from expecting gradients for parameters that reach
    only the next block's state (an RMT write slot in a one-segment block)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, *args, **kwargs):
        out = self.model(*args, **kwargs)
        return type(out)(out.logits, out.state.detach(), out.aux_loss)


def wrap(model: nn.Module, info: DistInfo, device: torch.device) -> nn.Module:
    """DDP around the model (a plain run: the model itself). broadcast_buffers=False: the model's
    buffers are constants and the memory state is no buffer, so nothing per rank is overwritten.
    find_unused_parameters: a parameter may get no gradient in a step's last BPTT block (a
    compressor with nothing evicted)."""
    if not info.enabled:
        return model
    ids = [device.index] if device.type == "cuda" else None
    return nn.parallel.DistributedDataParallel(DetachedState(model), device_ids=ids, broadcast_buffers=False,
                                               find_unused_parameters=True)


def block_sync(model: nn.Module):
    """`train_window`'s per-block context: gradients accumulate locally (no_sync) in every BPTT
    block but the last, whose backward all-reduces the step's whole gradient once."""

    def context(last: bool) -> ContextManager:
        if last or not isinstance(model, nn.parallel.DistributedDataParallel):
            return contextlib.nullcontext()
        return model.no_sync()

    return context


def shard_rows(batch: Batch, info: DistInfo) -> Batch:
    """This rank's contiguous block of the global batch's rows."""
    b = batch.tokens.shape[0]
    if b % info.world:
        raise ValueError(f"train.batch_size={b} must be divisible by the number of processes ({info.world})")
    per = b // info.world
    lo, hi = info.rank * per, (info.rank + 1) * per
    return batch.rows(lo, hi)


def all_sum(values: list[float], info: DistInfo, device: torch.device) -> list[float]:
    """Sum of each number over the ranks (float64; a plain run returns them unchanged)."""
    if not info.enabled:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


def loss_denominator(batch: Batch, info: DistInfo, device: torch.device) -> float:
    """What each rank divides its summed NLL by so that DDP's mean over ranks equals the global
    batch's per-token mean: (global target count) / world. A plain run: its own target count."""
    local = float(batch.mask.sum())
    if not info.enabled:
        return max(local, 1.0)
    (total,) = all_sum([local], info, device)
    return max(total, 1.0) / info.world
