"""Stage A of the copying backbone: teach `small-stdlib` to copy by content (an induction head) where it is
cheapest to learn, then ship the weights as `copy-stdlib-a`, the start of stage B
(`memzoo backbone backbones/copy-stdlib copy-stdlib`, docs/protocols/backbone.md).

    PYTHONPATH=. python experiments/backbone/copy_stage_a.py [--steps 1500] [--ckpt runs/copy-stage-a.pt]

The small preset as `full`, from `small-stdlib`, on rows of 128 bytes that are each a random printable
string of d bytes written over and over, d drawn log-uniformly in 8..48 per row (memzoo.data.copy_reads):
every byte after the first d is copyable, and only by looking up where the current context occurred
before, as d varies from row to row. Batch 32, AdamW (the run's groups, weight decay 0.1), lr 3e-3 after
50 warm-up steps, constant; clip 1.0; loss on every byte. It prints the bits per byte on the copyable bytes
and on the first period (which nothing predicts: log2 95 = 6.57) every 100 steps and checkpoints every 250
(an interrupted run resumes from it). Measured on one thread of the project's 2-core CPU (2026-12-02),
copyable bytes: 6.58 at step 100, 4.45 at 800, then the phase change: 1.54 at 900, 0.73 at 1,000, 0.41 at
1,100. Text is forgotten meanwhile (6.5 bits on held-out text): stage B mixes it back.

A plugin memory trains the same way as a pilot, checkpointed and not shipped (name the checkpoint
`DIR/checkpoint.pt`, and a run continues from it with `task.init_from=DIR task.init_backbone_only=false`):

    PYTHONPATH=. python experiments/backbone/copy_stage_a.py --import experiments/backbone/short_conv_full.py \
        --memory full-shortconv --option kernel=4 --ckpt DIR/checkpoint.pt --steps 500

With that short convolution on queries and keys the phase change comes between steps 100 and 200
(copyable bytes 5.45 at 100, 0.17 at 200, 0.08 at 400; the same with 8 taps), where `full` needs 900–1,000.
The backbone's own convolution (model.qk_conv, memzoo.core.qk_conv) is the same function and ships, as
`copy-conv-a`, the start of stage X (3.3 minutes on one thread; the same curve to the second decimal):

    PYTHONPATH=. python experiments/backbone/copy_stage_a.py --qk-conv 4 --steps 500 --name copy-conv-a --minutes 3.3
"""
from __future__ import annotations

import argparse
import math
import os
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

from memzoo.core.config import ModelConfig
from memzoo.core.losses import token_nll
from memzoo.core.model import MemoryModel
from memzoo.data.copy_reads import PRINTABLE, CopyReads
from memzoo.runs.configure import memory_config
from memzoo.suites.suite_plugins import import_plugins
from memzoo.training.backbones import shipped_dir, write_backbone

ROW = 128  # bytes a row: one segment


def model_config(qk_conv: int = 0) -> ModelConfig:
    """The small preset at one segment of ROW bytes, with the backbone's convolution of `qk_conv` taps."""
    return ModelConfig(d_model=128, n_layers=4, n_heads=4, segment_len=ROW, qk_conv=qk_conv)


def model(memory: str = "full", options: tuple[str, ...] = (), qk_conv: int = 0) -> MemoryModel:
    """The small preset as `full` (or a plugin memory with `options`, key=value), from the shipped
    block-local backbone; a plugin's own weights and the convolution's taps keep their initialisation."""
    net = MemoryModel(model_config(qk_conv), memory,
                      memory_config(memory, OmegaConf.from_dotlist(list(options))), seed=0)  # the plugin's defaults
    net.load_state_dict(torch.load(shipped_dir() / "small-stdlib.pt", weights_only=True), strict=False)
    return net


def periodic_rows(reads: CopyReads, batch: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of ROW + 1 bytes, each a random string repeated with its own period, and the mask of the
    targets only copying predicts (target t + 1 >= d). [B, ROW + 1], [B, ROW]"""
    rows, masks = [], []
    for _ in range(batch):
        d = reads.distance(gen)
        string = torch.randint(int(PRINTABLE[0]), int(PRINTABLE[-1]) + 1, (d,), generator=gen)  # [d]
        rows.append(string.repeat(-(-(ROW + 1) // d))[:ROW + 1])
        mask = torch.zeros(ROW, dtype=torch.bool)
        mask[d - 1:] = True
        masks.append(mask)
    return torch.stack(rows), torch.stack(masks)


def train(steps: int, lr: float, lo: int, hi: int, batch: int, ckpt: Path,
          memory: str = "full", options: tuple[str, ...] = (), qk_conv: int = 0) -> MemoryModel:
    """Stage A's loop; resumes from `ckpt` when it exists."""
    net = model(memory, options, qk_conv)
    opt = torch.optim.AdamW(net.optim_groups(0.1, lr), lr=lr, betas=(0.9, 0.95))
    start = 0
    if ckpt.is_file():
        state = torch.load(ckpt, weights_only=False)
        net.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["step"] + 1
    gen, reads, t0, seen = torch.Generator().manual_seed(1 + start), CopyReads(1.0, lo, hi), time.time(), []
    for step in range(start, steps + 1):
        x, copyable = periodic_rows(reads, batch, gen)
        for group in opt.param_groups:
            group["lr"] = lr * group.get("lr_mult", 1.0) * min(1.0, (step + 1) / 50)  # a plugin's own multiplier kept
        bits = token_nll(net(x[:, :-1]).logits, x[:, None, 1:]).view(batch, -1) / math.log(2)  # [B, ROW]
        seen.append((bits[copyable].mean().item(), bits[~copyable].mean().item()))
        if step % 100 == 0:
            mean = torch.tensor(seen).mean(0)
            seen = []
            print(f"{step} copyable {mean[0]:.2f} first-period {mean[1]:.2f}  {time.time() - t0:.0f}s", flush=True)
        if step % 250 == 0 and step > start:
            torch.save({"model": net.state_dict(), "opt": opt.state_dict(), "step": step}, f"{ckpt}.tmp")
            os.replace(f"{ckpt}.tmp", ckpt)
        opt.zero_grad()
        bits.mean().backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
    return net


def ship(ckpt: Path, name: str, cost: str, dest: Path, qk_conv: int = 0) -> Path:
    """Write the checkpoint's backbone weights as shipped backbone `name`, with its index record."""
    state = torch.load(ckpt, weights_only=False)
    model_cfg = OmegaConf.structured(model_config(qk_conv))
    return write_backbone(state["model"], name, model_cfg, dest, {
        "method": "full", "seed": 0, "steps": int(state["step"]), "batch_size": 32, "window_segments": 1,
        "data": "copy rows (random printable strings, period 8..48)", "cost": cost})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--distance", type=int, nargs=2, default=[8, 48], metavar=("MIN", "MAX"))
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--ckpt", default="runs/copy-stage-a.pt")
    ap.add_argument("--name", default="copy-stdlib-a")
    ap.add_argument("--dest", default=None, help="where to ship (default: memzoo/backbones of this checkout)")
    ap.add_argument("--ship-only", action="store_true", help="ship the checkpoint as it is, without training")
    ap.add_argument("--import", dest="imports", action="append", default=[], metavar="PLUGIN",
                    help="a plugin module to import first (a .py file or a dotted name); repeatable")
    ap.add_argument("--memory", default="full", help="the memory to train as (a pilot: not shipped unless full)")
    ap.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", help="the memory's config")
    ap.add_argument("--minutes", type=float, default=None,
                    help="the measured training minutes for the card (default: estimated at 1.1 s a step, one thread)")
    ap.add_argument("--qk-conv", type=int, default=0, metavar="K",
                    help="the backbone's convolution on queries and keys, K taps (model.qk_conv; 0: none)")
    args = ap.parse_args()
    import_plugins(args.imports)
    if args.memory != "full" and args.ship_only:
        ap.error(f"--ship-only with --memory {args.memory}: a shipped backbone keeps no memory weights, so it "
                 f"would drop the plugin's; continue from the checkpoint's folder instead")
    torch.set_num_threads(1)
    ckpt = Path(args.ckpt)
    ckpt.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    if not args.ship_only:
        train(args.steps, args.lr, *args.distance, args.batch, ckpt, args.memory, tuple(args.option), args.qk_conv)
    steps = torch.load(ckpt, weights_only=False)["step"]
    if args.memory != "full":  # a pilot: continue with task.init_from=<the checkpoint's folder> init_backbone_only=false
        print(f"{args.memory} after {steps} steps: {ckpt} (not shipped: a backbone keeps no memory weights)")
        return
    conv = f" with model.qk_conv={args.qk_conv}" if args.qk_conv else ""
    minutes = args.minutes if args.minutes is not None else steps * 1.1 / 60
    cost = (f"stage A: {steps:,} steps of full{conv} from small-stdlib on copy rows only (batch 32 x 128 bytes, period "
            f"{args.distance[0]}..{args.distance[1]}, lr {args.lr:g}), about {minutes:.0f} minutes on one "
            f"thread of the project's 2-core CPU; made by experiments/backbone/copy_stage_a.py; copies at the "
            f"distances it was trained at, forgets text (stage B restores it)")
    print(f"shipped {ship(ckpt, args.name, cost, Path(args.dest) if args.dest else shipped_dir(), args.qk_conv)} "
          f"({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
