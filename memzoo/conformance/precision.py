"""The precision invariants: a float64 model runs no narrower floating-point op (each one found is named
with the plugin's line that ran it, and the fix), and under bf16 autocast the state keeps the policy's dtype."""
from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from memzoo.core.losses import token_nll
from memzoo.conformance.tiny import boundary, tiny_model, tokens

FACTORIES = {"aten.zeros", "aten.new_zeros", "aten.zeros_like", "aten.scalar_tensor", "aten.full", "aten.new_full",
             "aten.lift_fresh", "aten.empty", "aten.new_empty"}  # ops that make a tensor from no tensor data
HARMLESS = "a zero scalar made in float32 (exact in any dtype: `torch.zeros(())` as an auxiliary loss)"
# How to make a tensor in the model's dtype, said with every precision failure.
PRECISION_FIX = ("make tensors from the inputs (`x.new_zeros(shape)`, `torch.zeros(shape, dtype=x.dtype, device=x.device)`) "
                 "and keep state and arithmetic in `self.working_dtype(x)` (memzoo.core.memory.zero_loss(x) for a zero loss)")


def caller_line() -> str:
    """The innermost frame of the running code outside torch and this module: 'file.py:LINE: code'."""
    import traceback

    for frame in reversed(traceback.extract_stack()[:-2]):
        path = frame.filename.replace("\\", "/")
        if "/torch/" in path or path.endswith(("/conformance/precision.py", "/contextlib.py")):
            continue
        return f"{Path(path).name}:{frame.lineno}: {(frame.line or '').strip()}"
    return "?"


class FloatOps(TorchDispatchMode):
    """Records the dtype of every floating-point tensor each op returns: {(op, dtype): count}, and for
    each (op, dtype) the first line of code outside torch that ran it. It sees what ran (forward,
    backward, state creation), not what the code says. A zero scalar made by a factory op is exact in
    every dtype and counted apart (`harmless`), never as narrower."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: Counter[tuple[str, torch.dtype]] = Counter()
        self.first: dict[tuple[str, torch.dtype], str] = {}
        self.harmless = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        op = str(func.overloadpacket)
        for t in pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.is_floating_point():
                if op in FACTORIES and t.dim() == 0 and not bool(t):
                    self.harmless += 1
                    continue
                key = (op, t.dtype)
                self.seen[key] += 1
                if key not in self.first:  # the stack walk is slow: once per (op, dtype), not per op
                    self.first[key] = caller_line()
        return out

    def narrower_than(self, dtype: torch.dtype) -> list[str]:
        """The ops that returned a floating dtype other than `dtype`, most frequent first, each with the
        first line that ran it: 'aten.mm float32 x4 (first at plugin.py:31: out = a @ b)'."""
        bad = [(n, op, dt) for (op, dt), n in self.seen.items() if dt != dtype]
        return [f"{op} {str(dt).removeprefix('torch.')} x{n} (first at {self.first[(op, dt)]})"
                for n, op, dt in sorted(bad, key=lambda b: (-b[0], b[1]))]


def check_precision(method: str, options: dict[str, Any]) -> None:
    """A float64 model computes in float64: its forward and backward over S segments (with a
    document boundary) execute no float32, bf16 or fp16 floating-point op (recorded, not read)."""
    model = tiny_model(method, options=options).double().train()
    x = tokens()
    with FloatOps() as ops:
        out = model(x, reset=boundary(0, 2))
        loss = token_nll(out.logits, torch.roll(x, -1, dims=-1)).mean() + out.aux_loss
        loss.backward()
    bad = ops.narrower_than(torch.float64)
    assert not bad, (f"{method}: a float64 forward and backward ran {len(bad)} kind(s) of narrower floating-point "
                     f"op (the precision policy: memzoo.core.precision.working_dtype): {'; '.join(bad[:8])}"
                     + (f" and {len(bad) - 8} more" if len(bad) > 8 else "") + f". Fix: {PRECISION_FIX}")


def check_precision_bf16(method: str, options: dict[str, Any]) -> None:
    """Under bf16 autocast (CPU) a training step keeps every floating state tensor in the dtype the
    precision policy names for its memory (float32 unless the plugin declares a narrower state_floor)."""
    model = tiny_model(method, options=options).train()
    x = tokens()
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        out = model(x, reset=boundary(0, 2))
        loss = token_nll(out.logits, torch.roll(x, -1, dims=-1)).mean() + out.aux_loss
    loss.backward()
    owners = [*model.memories, model.model_memory]
    bad = [f"state[{i}][{key!r}] {str(value.dtype).removeprefix('torch.')} (policy: "
           f"{str(owner.state_dtype()).removeprefix('torch.')})"
           for i, (owner, st) in enumerate(zip(owners, out.state.all())) for key, value in st.items()
           if value.is_floating_point() and value.dtype != owner.state_dtype()]
    assert not bad, f"{method}: after a bf16 autocast step the state is not in the policy's dtype: {', '.join(bad[:6])}"
