"""Is sdpa's cuDNN backward right on this GPU when calls of one shape get output gradients of different
layouts? memzoo runs every attention call with cuDNN off (memzoo.core.attention.sdpa) because on an H100
(torch 2.11.0+cu130, cuDNN 9.19) it was not: Memorizing's kNN layer hands attention a dense gradient and
its XL layers a strided one, and the second layout of a shape came back about 100% off.

    PYTHONPATH=. python checks/cudnn_sdpa_check.py [--device cuda]

For each shape (the cuda_check backbone's and the paper-gpu backbone's), causal and under a bool mask,
one set of bf16 q, k, v and one output gradient, handed to backward in three layouts in turn: contiguous
[B, H, N, D], dense [B, N, H, D] (a transpose), and a strided slice of [B, S, N, H, D]. Each dq, dk, dv
is compared with the math backend's in float32 (rel. error = ||a - ref|| / ||ref||). Exit status 1 when
an error exceeds TOL: keep cuDNN off. `--device cpu` runs the default CPU backend the same way (for
checking the script; there is no cuDNN there).
"""
from __future__ import annotations

import argparse
import contextlib
import sys
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel

TOL = 5e-2  # bf16 attention gradients against float32 math: a few 1e-3 when right, ~1 when wrong
SHAPES = {"cuda_check": (2, 4, 32, 96, 16), "paper-gpu": (16, 8, 512, 1024, 64)}  # B, H, N queries, keys, D


def layouts(g: Tensor) -> dict[str, Tensor]:
    """The same gradient [B, H, N, D] as contiguous, as a transpose of [B, N, H, D], and as a slice of [B, S, N, H, D]."""
    b, h, n, d = g.shape
    dense = g.transpose(1, 2).contiguous().transpose(1, 2)  # strides of [B, N, H, D]
    wide = torch.zeros(b, 3, n, h, d, dtype=g.dtype, device=g.device)
    wide[:, 1] = g.transpose(1, 2)
    return {"contiguous": g.contiguous(), "bnhd": dense, "strided": wide[:, 1].transpose(1, 2)}


def grads(q: Tensor, k: Tensor, v: Tensor, g: Tensor, mask: Optional[Tensor], backend: Optional[SDPBackend]) -> list[Tensor]:
    """dq, dk, dv of sdpa (causal when mask is None) on `backend` (None: the device's default choice)."""
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    with sdpa_kernel([backend]) if backend is not None else contextlib.nullcontext():
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)
    return list(torch.autograd.grad(out, (q, k, v), g))


def rel(a: Tensor, ref: Tensor) -> float:
    return float((a.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-30))


def check(shape: tuple[int, ...], masked: bool, device: torch.device, dtype: torch.dtype) -> list[dict]:
    """One row per gradient layout: the worst of dq, dk, dv against float32 math."""
    b, h, n, m, d = shape
    m = m if masked else n  # causal: the segment alone; masked: a prefix of m - n keys before it
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(b, h, length, d, generator=gen).to(device, dtype) for length in (n, m, m))
    g = torch.randn(b, h, n, d, generator=gen).to(device, dtype)
    mask = None
    if masked:  # the prefix (half of it empty in row 0, as after a reset), then the causal block
        mask = torch.ones(b, 1, n, m, dtype=torch.bool, device=device)
        mask[..., m - n:] = torch.ones(n, n, dtype=torch.bool, device=device).tril()
        mask[0, ..., : (m - n) // 2] = False
    ref = grads(q.float(), k.float(), v.float(), g.float(), mask, SDPBackend.MATH)
    rows = []
    for name, g_layout in layouts(g).items():  # one after another: the order is part of what is checked
        err = max(rel(a, r) for a, r in zip(grads(q, k, v, g_layout, mask, None), ref))
        rows.append({"layout": name, "rel_err": err, "ok": err <= TOL})
    return rows


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated, of {', '.join(SHAPES)}")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("checks/cudnn_sdpa_check.py: no CUDA device here, nothing checked")
        return 0
    if device.type == "cuda":
        print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, "
              f"cuDNN sdpa enabled: {torch.backends.cuda.cudnn_sdp_enabled()}")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    bad = 0
    for label in args.shapes.split(","):
        shape = SHAPES[label]
        for masked in (False, True):
            for row in check(shape, masked, device, dtype):
                bad += not row["ok"]
                print(f"{label:11s} {'mask  ' if masked else 'causal'} grad {row['layout']:10s} "
                      f"rel. error {row['rel_err']:.1e}  {'ok' if row['ok'] else 'WRONG'}", flush=True)
    print(f"{bad} wrong" + (": keep cuDNN's sdpa off" if bad else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
