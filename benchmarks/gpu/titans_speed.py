"""Training-step time of memories against `local` at a suite's backbone, side by side in one process:
step time, tokens/s as a ratio to `local`, peak memory, and the number of aten operations per step.

    python benchmarks/gpu/titans_speed.py [--device cuda] [--suite paper-gpu] [--batch-size 48] [--steps 3]
        [--runs local titans-mag 'titans-mag:chunk_size=64,compile=eager'] [--set run.model.n_layers=2]
        [--count-ops] [--out results/titans-speed]

The GPU run (paper-gpu backbone, the suite's batch, bf16; the default runs below):

    python benchmarks/gpu/titans_speed.py --steps 2 --max-seconds 420 --out results/titans-speed

A run is a method, optionally with memory options after a colon (`name:key=value,key=value`), over the
suite's own options for it. Memory: on CUDA the peak of torch.cuda.max_memory_allocated over the timed
steps; on the CPU (or with --saved), `saved_mb`, the largest sum over one block (one model call) of the
distinct storages autograd saved for backward, parameters excluded (torch.autograd.graph.saved_tensors_hooks):
the activation memory a step holds.
`--count-ops` counts aten calls of one step's forward and backward (a TorchDispatchMode; eager runs), a proxy for
kernel launches where small operations dominate, and the host syncs among them (a tensor read as a
Python number: on a GPU the host waits for every queued kernel). One run failing (an error, out of memory) gives a row
that says so; the others go on. Writes titans_speed.csv.
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import gc
import sys
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Optional

import torch
from omegaconf import OmegaConf
from torch.utils._python_dispatch import TorchDispatchMode


# The suite's Titans options (paper-gpu: compile and checkpoint) first, then what they are measured against:
# eager with checkpoint (the speed before, at a batch that fits), compiled storing, larger chunks, CUDA graphs, the other
# memories below 0.5x local, and last the eager scan storing its activations (120-130 GB at batch 48 on an H200).
GPU_RUNS = ["local", "titans-mag", "titans-mac", "titans-mag:compile=eager", "titans-mag:checkpoint=false",
            "titans-mag:chunk_size=64", "titans-mac:chunk_size=64", "titans-mag:compile=reduce-overhead",
            "compressive", "infty-former", "armt", "infini-delta", "titans-mag:compile=eager,checkpoint=false"]
CPU_RUNS = ["local", "titans-mag:compile=eager,checkpoint=false", "titans-mac:compile=eager,checkpoint=false",
            "titans-mag:compile=eager", "titans-mac:compile=eager"]


def parse_run(text: str) -> tuple[str, dict[str, Any]]:
    """'titans-mag:chunk_size=64,compile=true' -> ('titans-mag', {'chunk_size': 64, 'compile': True})."""
    method, _, opts = text.partition(":")
    options: dict[str, Any] = {}
    for item in filter(None, opts.split(",")):
        key, eq, value = item.partition("=")
        if not eq:
            raise ValueError(f"run {text!r}: option {item!r} is not key=value")
        options[key.strip()] = _scalar(value.strip())
    return method, options


def _scalar(value: str) -> Any:
    """A YAML scalar: 64 -> int, true -> bool, 0.5 -> float, else the string."""
    return OmegaConf.to_container(OmegaConf.create(f"v: {value}"))["v"]


def run_config(suite: str, method: str, options: dict[str, Any], overrides: list[str]) -> Any:
    """The suite's first run config for `method` (seed 0, first grid point), its memory options updated."""
    from memzoo.runs.configure import build_model  # noqa: F401  (imports the plugins)
    from memzoo.suites.compare import expand, load_suite

    spec = next(s for s in expand(load_suite(suite, overrides + [f"methods=[{method}]"])) if s.method == method)
    cfg = spec.cfg
    for key, value in options.items():
        OmegaConf.update(cfg, f"memory.{key}", value, force_add=True)
    return cfg


class OpCounter(TorchDispatchMode):
    """Counts aten calls (forward and backward) while active."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[str(func.overloadpacket.__name__)] += 1
        return func(*args, **(kwargs or {}))


@contextmanager
def saved_bytes(model: torch.nn.Module, peak: list[int]) -> Iterator[None]:
    """peak[0] = max over model calls of the bytes of distinct storages saved for backward (no parameters)."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    live: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        if st.data_ptr() not in params and st.data_ptr() != 0:
            live[st.data_ptr()] = st.nbytes()
        return t

    def start(*_: Any) -> None:
        live.clear()

    def end(*_: Any) -> None:
        peak[0] = max(peak[0], sum(live.values()))

    hooks = [model.register_forward_pre_hook(start), model.register_forward_hook(end)]
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            yield
    finally:
        for h in hooks:
            h.remove()


def bench(cfg: Any, docs: list, steps: int, device: torch.device, count_ops: bool, warmup: int,
          saved: bool) -> dict[str, Any]:
    """Time `steps` training steps after `warmup` untimed ones; memory and (optionally) aten calls."""
    from memzoo.data.samplers import WindowSampler
    from memzoo.runs.configure import build_model
    from memzoo.training.windows import train_window

    tc, m = cfg.train, cfg.model
    precision = "bf16" if device.type == "cuda" else "fp32"
    sampler = WindowSampler(docs, m.segment_len, 0)
    torch.manual_seed(0)
    model = build_model(cfg).to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=tc.lr)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)

    def step(i: int, counter: Optional[OpCounter] = None) -> float:
        batch = sampler.sample(i, tc.batch_size, tc.window_segments).to(device)
        with counter if counter is not None else contextlib.nullcontext():  # the model, not the optimiser
            res = train_window(model, batch, tc.bptt_segments, tc.aux_loss_weight, precision)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return res.nll_sum / max(res.tokens, 1)

    began = time.perf_counter()
    # kernels, allocator, compilation; the first step's loss (same weights and batch for every run of a
    # method) shows whether an option changed the values
    first_loss = [step(i) for i in range(max(warmup, 1))][0]
    sync()
    warm_s = time.perf_counter() - began
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    elapsed, loss = 0.0, float("nan")
    for i in range(max(warmup, 1), max(warmup, 1) + steps):
        sync()
        t0 = time.perf_counter()
        loss = step(i)
        sync()
        elapsed += time.perf_counter() - t0
    peak = [0]
    if saved:
        with saved_bytes(model, peak):
            step(warmup + steps)
    row = {"params": model.num_parameters(), "batch_size": tc.batch_size, "step_s": elapsed / steps,
           "tokens_per_s": tc.batch_size * tc.window_segments * m.segment_len * steps / elapsed,
           "warmup_s": warm_s, "saved_mb": peak[0] / 2**20 if saved else None,
           "first_loss": first_loss, "loss": loss,
           "peak_cuda_mb": torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None}
    if count_ops and str(cfg.memory.get("compile", "eager")) == "eager":  # compiled code runs under no dispatch mode
        counter = OpCounter()
        step(warmup + steps + 1, counter)
        row["aten_ops"] = sum(counter.counts.values())
        row["host_syncs"] = counter.counts["_local_scalar_dense"]  # .item(), bool(t), int(t): a wait on a GPU
        row["top_ops"] = " ".join(f"{k}:{v}" for k, v in counter.counts.most_common(6))
    return row


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--suite", default="paper-gpu", help="the suite whose backbone and options are used")
    ap.add_argument("--batch-size", type=int, default=None, help="rows per step (default: the suite's)")
    ap.add_argument("--steps", type=int, default=3, help="timed training steps per run")
    ap.add_argument("--warmup", type=int, default=None,
                    help="untimed steps first (default 1; 2 where a memory compiles, 3 with CUDA graphs)")
    ap.add_argument("--runs", nargs="+", default=None,
                    help="method[:key=value,...] each; the first `local` is the ratios' denominator "
                         f"(default on CUDA: {' '.join(GPU_RUNS)}; on the CPU: {' '.join(CPU_RUNS)})")
    ap.add_argument("--set", nargs="*", default=[], help="suite overrides, e.g. run.model.n_layers=2")
    ap.add_argument("--count-ops", action="store_true", help="count aten calls of one step")
    ap.add_argument("--saved", action="store_true", help="measure bytes saved for backward (always on the CPU)")
    ap.add_argument("--max-seconds", type=float, default=None, help="start no run after this many seconds")
    ap.add_argument("--out", default="results/titans-speed")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("benchmarks/gpu/titans_speed.py: no CUDA device here, nothing measured (pass --device cpu)")
        return 0
    from memzoo.data.corpus import load_documents, split_documents

    overrides = ["run.data.max_docs=400", *args.set] + ([f"run.train.batch_size={args.batch_size}"] if args.batch_size else [])
    args.runs = args.runs or (GPU_RUNS if device.type == "cuda" else CPU_RUNS)
    runs = [parse_run(r) for r in args.runs]
    first = run_config(args.suite, runs[0][0], runs[0][1], overrides)
    docs = split_documents(load_documents(first.data), first.data)["train"]
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({torch.get_num_threads()} threads)"
    print(f"{name}: suite {args.suite}, {first.model.n_layers} layers, d_model {first.model.d_model}, "
          f"{first.model.n_heads} heads, segments of {first.model.segment_len}, batch {first.train.batch_size} x "
          f"{first.train.window_segments} segments (bptt {first.train.bptt_segments}), torch {torch.__version__}", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    began, local_tps = time.perf_counter(), None
    for text, (method, options) in zip(args.runs, runs):
        row: dict[str, Any] = {"device": name, "run": text}
        if args.max_seconds is not None and time.perf_counter() - began > args.max_seconds:
            row["status"] = f"not measured (--max-seconds {args.max_seconds:g})"
        else:
            try:
                cfg = run_config(args.suite, method, options, overrides)
                saved = args.saved or device.type == "cpu"
                mode = str(cfg.memory.get("compile", "eager"))  # CUDA graphs record on a later call than compilation
                warmup = args.warmup if args.warmup is not None else {"eager": 1, "reduce-overhead": 3}.get(mode, 2)
                row.update(bench(cfg, docs, args.steps, device, args.count_ops, warmup, saved), status="ok")
            except Exception as err:  # noqa: BLE001  one run failing is a row, not a lost table
                row["status"] = f"{type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else ''}"
            if device.type == "cuda":
                gc.collect()  # a failed run's frames (its model, its activations) sit in reference cycles
                torch.cuda.empty_cache()
        if row.get("status") == "ok":
            if method == "local" and local_tps is None:
                local_tps = row["tokens_per_s"]
            row["x_local"] = row["tokens_per_s"] / local_tps if local_tps else None
            cuda_mb = f"  peak {row['peak_cuda_mb']:9,.0f} MB" if row["peak_cuda_mb"] is not None else ""
            ops = f"  {row['aten_ops']:>9,} aten ops {row['host_syncs']:>5,} syncs" if "aten_ops" in row else ""
            saved_mb = f"  saved {row['saved_mb']:9,.0f} MB" if row["saved_mb"] is not None else ""
            ratio = f"{row['x_local']:6.3f}x local" if row["x_local"] is not None else "  (no local)"
            print(f"{text:40s} {row['step_s']:8.3f} s/step {row['tokens_per_s']:>10,.0f} tok/s {ratio}{cuda_mb}"
                  f"{saved_mb}{ops}  warm-up {row['warmup_s']:.0f} s  first loss {row['first_loss']:.4f}",
                  flush=True)
        else:
            print(f"{text:40s} {row['status']}", flush=True)
        rows.append(row)
        with open(out / "titans_speed.csv", "w", newline="") as f:  # after every run: a killed run keeps the rest
            writer = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for r in rows for k in r)))
            writer.writeheader()
            writer.writerows(rows)
    print(f"wrote {out / 'titans_speed.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
