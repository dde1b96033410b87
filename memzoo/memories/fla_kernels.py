"""fla's fused chunk kernels (flash-linear-attention, `pip install memzoo[fla]`) for the two DeltaNets,
behind memzoo's layout, with the choice between them and the PyTorch chunkwise form.

The adapter maps memzoo's q, k [B, S, H, N, Dk], v [B, S, H, N, Dv], log-decay g and β [B, S, H, N],
state S [B, H, Dv, Dk] and per-segment resets [B, S] onto one fla call over all S segments:

- tokens [B, T = S·N, H, D]; scale = 1.0 (memzoo reads o_t = S_t q_t, without 1/sqrt(d_k));
- `chunk_gated_delta_rule` keeps S as [Dv, Dk] (`state_v_first=True`); `chunk_delta_rule` has no such
  option and takes [Dk, Dv], so S is transposed on the way in and out;
- no reset after a row's first segment: B sequences, the carried S (zeroed where segment 0 resets) as
  `initial_state`; a reset inside the block: fla's varlen form, the rows flattened into one sequence
  cut at every row start and every reset (`cu_seqlens`), each row's first piece starting from its S,
  every later piece from 0, and each row's final S taken from its last piece.
Gradients flow into q, k, v, g, β and the carried S through fla's backward.

The hook: `load_fla()` returns the kernels (a `FlaKernels`), `gpu_capability(device)` the device's
compute capability (None: not CUDA). Tests replace both (monkeypatch) to run the adapter through a
float64 stand-in with fla's call signature on the CPU.
"""
from __future__ import annotations

import functools
import re
import sys
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
from einops import rearrange
from torch import Tensor

KERNELS = ("auto", "fla", "torch")
HALF = frozenset({torch.bfloat16, torch.float16})
# Triton's dot products take float32 input as TF32 (10-bit mantissa) unless told otherwise, and fla does not
TF32_NOTE = {torch.float32: "; its products in TF32, about 1e-3 relative"}
# Triton releases in which fla 0.6.0's gated backward (chunk_bwd_dqkwg) raises on Hopper: >= 3.4 and < 3.7.1
HOPPER_BAD_TRITON = ((3, 4, 0, -1), (3, 7, 1, 0))  # pre-releases of 3.4.0 included, of 3.7.1 too


@dataclass(frozen=True)
class FlaKernels:
    """fla's two chunk kernels, the dtypes each takes, and the Triton version they compile with."""

    gated: Callable  # chunk_gated_delta_rule
    delta: Callable  # chunk_delta_rule
    triton: str  # triton.__version__
    gated_dtypes: frozenset = field(default=frozenset({torch.float32, *HALF}))
    delta_dtypes: frozenset = field(default=HALF)  # chunk_delta_rule asserts its input is not float32


@functools.cache
def _import_fla() -> FlaKernels | str:
    try:
        import triton
        from fla.ops.delta_rule import chunk_delta_rule
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except Exception as err:  # absent, or installed without a working Triton
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        return f"{type(err).__name__}: {first}"
    return FlaKernels(chunk_gated_delta_rule, chunk_delta_rule, triton.__version__)


def load_fla() -> FlaKernels | str:
    """fla's kernels, or why they do not import (imported once per process). A test hook."""
    return _import_fla()


def gpu_capability(device: torch.device) -> Optional[tuple[int, int]]:
    """The CUDA device's compute capability, None for any other device. A test hook."""
    return torch.cuda.get_device_capability(device) if device.type == "cuda" else None


def version_tuple(version: str) -> tuple[int, ...]:
    """'3.6.0+git1a2b' -> (3, 6, 0, 0); a pre-release sorts below its release: '3.7.1rc1' -> (3, 7, 1, -1)."""
    match = re.match(r"\s*v?(\d+)(?:\.(\d+))?(?:\.(\d+))?(.*)", version)
    if match is None:
        raise ValueError(f"cannot read the version {version!r}; expected MAJOR.MINOR.PATCH")
    release = tuple(int(p or 0) for p in match.groups()[:3])
    pre = re.match(r"[.-]?(a|b|rc|alpha|beta|dev|pre)\d*", match.group(4), re.IGNORECASE)
    return (*release, -1 if pre else 0)


@dataclass(frozen=True)
class KernelChoice:
    """What one DeltaNet call runs: fla's gated kernel, its plain one, or PyTorch (run is None), and why."""

    run: Optional[Callable[..., tuple[Tensor, Tensor]]]
    line: str


def choose(kernel: str, gated: bool, device: torch.device, dtype: torch.dtype, backward: bool) -> KernelChoice:
    """The path for `kernel` ('auto', 'fla', 'torch') on this device and input dtype (`backward`: a
    gradient will flow). kernel='fla' that cannot run is an error naming why."""
    name = method_name(gated)
    if kernel == "torch":
        return KernelChoice(None, f"{name}: PyTorch chunkwise form (kernel=torch)")
    fla, why = _fla_kernel(gated, device, dtype, backward)
    if fla is not None:
        return KernelChoice(fla, f"{name}: fla {why} (kernel={kernel})")
    if kernel == "fla":
        raise RuntimeError(f"{name}: kernel='fla' cannot run: {why}; use kernel='auto' (falls back) or 'torch'")
    return torch_fallback(gated, why)


def method_name(gated: bool) -> str:
    return "gated-deltanet" if gated else "deltanet"


def torch_fallback(gated: bool, why: str) -> KernelChoice:
    """The PyTorch path under kernel=auto, with the reason fla did not run."""
    return KernelChoice(None, f"{method_name(gated)}: PyTorch chunkwise form (kernel=auto: {why})")


def _fla_kernel(gated: bool, device: torch.device, dtype: torch.dtype,
                backward: bool) -> tuple[Optional[Callable[..., tuple[Tensor, Tensor]]], str]:
    """(adapter bound to the fla kernel that runs here, what it is) or (None, why none runs)."""
    capability = gpu_capability(device)
    if capability is None:
        return None, f"fla's kernels are Triton kernels for CUDA; the device is {device.type}"
    fla = load_fla()
    if isinstance(fla, str):
        return None, f"fla absent ({fla})"
    triton = version_tuple(fla.triton)
    hopper_bad = capability == (9, 0) and HOPPER_BAD_TRITON[0] <= triton < HOPPER_BAD_TRITON[1]
    gated_refused = None
    if hopper_bad and backward:
        gated_refused = (f"fla refused chunk_gated_delta_rule: its backward raises on Hopper (sm_90) with Triton "
                         f"{fla.triton} (>= 3.4 and < 3.7.1; upgrade Triton to >= 3.7.1)")
    elif dtype not in fla.gated_dtypes:
        gated_refused = f"fla refused chunk_gated_delta_rule: {dtype} input (it takes {sorted(map(str, fla.gated_dtypes))})"
    if not gated:
        if dtype in fla.delta_dtypes:
            return functools.partial(delta_rule_fla, fla.delta, False), f"chunk_delta_rule ({dtype})"
        refused = f"chunk_delta_rule takes {sorted(map(str, fla.delta_dtypes))}, not {dtype}"
        if gated_refused is None:  # α ≡ 1 is the gated rule at g = 0
            return functools.partial(delta_rule_fla, fla.gated, True), \
                f"chunk_gated_delta_rule with g = 0 ({refused}{TF32_NOTE.get(dtype, '')})"
        return None, f"{refused}; {gated_refused}"
    if gated_refused is not None:
        return None, gated_refused
    return functools.partial(delta_rule_fla, fla.gated, True), f"chunk_gated_delta_rule ({dtype}{TF32_NOTE.get(dtype, '')})"


SAID: set[str] = set()
FAILED: dict[tuple, str] = {}  # (gated, device, dtype, backward) -> why fla's call raised under kernel=auto


def chunkwise(kernel: str, gated: bool, torch_form: Callable[..., tuple[Tensor, Tensor]], q: Tensor, k: Tensor,
              v: Tensor, g: Tensor, beta: Tensor, s0: Tensor, reset: Tensor) -> tuple[Tensor, Tensor]:
    """The chunkwise recurrence through fla or `torch_form` (same arguments and results), as `kernel`
    and the device allow; one line per process says which ran and why. Under kernel=auto, an fla call
    that raises, forward or (tried once on a small slice first) backward, is named in that line and
    PyTorch runs from then on for this device and dtype."""
    backward = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v, g, beta, s0))
    key = path_key(gated, q.device, q.dtype, backward)
    choice = plan(kernel, gated, q.device, q.dtype, backward)
    if choice.run is not None:
        try:
            if backward and kernel == "auto" and key not in BACKWARD_TRIED:
                BACKWARD_TRIED.add(key)
                try_backward(choice.run, q, k, v, g, beta, s0, reset)
            out = choice.run(q, k, v, g, beta, s0, reset)
            say_once(choice.line)
            return out
        except Exception as err:
            if kernel == "fla":
                raise
            first = str(err).strip().splitlines()[0][:200] if str(err).strip() else ""
            FAILED[key] = f"fla raised {type(err).__name__}: {first}"
            choice = torch_fallback(gated, FAILED[key])
    say_once(choice.line)
    return torch_form(q, k, v, g, beta, s0, reset)


BACKWARD_TRIED: set[tuple] = set()


def path_key(gated: bool, device: torch.device, dtype: torch.dtype, backward: bool) -> tuple:
    """What FAILED and BACKWARD_TRIED are keyed by: one path per method, device, dtype and gradient."""
    return gated, str(device), dtype, backward


def plan(kernel: str, gated: bool, device: torch.device, dtype: torch.dtype, backward: bool) -> KernelChoice:
    """`choose`, except that under kernel=auto a path whose fla call raised before runs PyTorch."""
    failed = FAILED.get(path_key(gated, device, dtype, backward)) if kernel == "auto" else None
    return torch_fallback(gated, failed) if failed else choose(kernel, gated, device, dtype, backward)


def try_backward(run: Callable[..., tuple[Tensor, Tensor]], q: Tensor, k: Tensor, v: Tensor, g: Tensor,
                 beta: Tensor, s0: Tensor, reset: Tensor) -> None:
    """One forward and backward of `run` on the first row and segment (detached copies), so that under
    kernel=auto an error in fla's backward, which would surface only in the caller's loss.backward(),
    raises here, where PyTorch's form can still take over."""
    leaves = [t[:1, :1].detach().clone().requires_grad_() for t in (q, k, v, g, beta)]
    state = s0[:1].detach().clone().requires_grad_()
    o, s_end = run(*leaves, state, reset[:1, :1])
    torch.autograd.grad(o.float().sum() + s_end.float().sum(), [*leaves, state], allow_unused=True)


def say_once(line: str) -> None:
    """Print `line` to stderr the first time this process meets it (which path ran, and why)."""
    if line not in SAID:
        SAID.add(line)
        print(f"memzoo: {line}", file=sys.stderr, flush=True)


def delta_rule_fla(kernel: Callable, gated_kernel: bool, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor,
                   s0: Tensor, reset: Tensor) -> tuple[Tensor, Tensor]:
    """The recurrence of `delta_rule_chunkwise` (same arguments and results) through one fla call:
    `kernel` is chunk_gated_delta_rule (`gated_kernel`) or chunk_delta_rule (which ignores g: α ≡ 1)."""
    b, s, _, n, _ = q.shape
    reset_cpu = reset.detach().cpu()  # [B, S]; the one host sync: fla's varlen form needs the cuts on the host
    starts = reset_cpu.clone()
    starts[:, 0] = True  # a piece starts at every row's first segment and at every reset
    carried = torch.where(reset[:, 0, None, None, None].to(s0.device), torch.zeros_like(s0), s0)  # [B, H, Dv, Dk]
    if starts[:, 1:].any():
        first = starts.flatten().nonzero().squeeze(1)  # [M] flat segment index (row·S + s) opening each piece
        row_first = first % s == 0  # [M] pieces that start a row (they carry that row's state)
        cu_cpu = torch.cat((first * n, torch.tensor([b * s * n]))).to(torch.int64)  # [M + 1] token offsets
        keep = row_first.to(s0.device, s0.dtype)[:, None, None, None]
        h0 = carried[(first // s).to(s0.device)] * keep  # [M, H, Dv, Dk]: the row's S, or 0 after a reset
        tokens = "b s h n d -> 1 (b s n) h d"
        gates = "b s h n -> 1 (b s n) h"
        last = torch.cat((row_first.nonzero().squeeze(1)[1:] - 1, torch.tensor([len(first) - 1])))  # [B]
        cuts = {"cu_seqlens": cu_cpu.to(q.device), "cu_seqlens_cpu": cu_cpu}
    else:
        h0, tokens, gates, last, cuts = carried, "b s h n d -> b (s n) h d", "b s h n -> b (s n) h", None, {}
    q_, k_, v_ = (rearrange(t, tokens).contiguous() for t in (q, k, v))  # [B', T, H, D]
    g_, beta_ = (rearrange(t, gates).contiguous() for t in (g, beta))  # [B', T, H]
    if gated_kernel:
        o, ht = kernel(q_, k_, v_, g_, beta_, scale=1.0, initial_state=h0.contiguous(), output_final_state=True,
                       state_v_first=True, **cuts)  # ht [M, H, Dv, Dk]
    else:
        o, ht = kernel(q_, k_, v_, beta_, scale=1.0, initial_state=h0.transpose(-1, -2).contiguous(),
                       output_final_state=True, **cuts)  # ht [M, H, Dk, Dv]
        ht = ht.transpose(-1, -2)
    if last is not None:
        ht = ht[last.to(ht.device)]  # [B, H, Dv, Dk] the last piece of each row
    o = rearrange(o, "b2 (s n) h d -> b2 s h n d", n=n) if last is None else \
        rearrange(o, "1 (b s n) h d -> b s h n d", b=b, s=s)
    return o, ht
