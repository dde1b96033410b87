"""GPU check: every registered method at the `paper-gpu` suite's backbone, a few bf16 training steps
each on CUDA, with tokens/s, model FLOP/s as a fraction of the device's bf16 peak, peak CUDA memory,
and (where xformers is installed) the xformers and sdpa attention backends checked against each other.

    python benchmarks/gpu/gpu.py [--steps 5] [--batch-size 16] [--peak-tflops 989] [--max-seconds 300] [--out results/gpu]
                                 [--kernels auto,torch,fla]

Writes gpu.csv (one row per method) and prints the table. Without CUDA it says so in one line and
exits 0. Model FLOPs per token = 6 x (weights of every matrix multiply, the tied LM head included)
+ 6 x n_layers x segment_len x d_model (causal attention within the segment, forward and backward);
memory reads are not counted, so a heavy memory shows as lower utilisation. The bf16 peak is
--peak-tflops when given, else measured by timing 8192^3 bf16 matrix multiplies. Backends agree when
max |logits_xformers - logits_sdpa| <= XFORMERS_RTOL x max |logits_sdpa| (same weights, one bf16 forward).
Exit status 1 when a loss is not finite or the backends disagree. `--kernels` times the two DeltaNets
once per kernel path named (their `kernel` option: auto, torch, fla), as rows `deltanet[fla]` etc.;
a path that cannot run (fla absent, or refused on this GPU and Triton) gets a row saying why.
`--also METHOD:OPTION=VALUE[,OPTION=VALUE]` (repeatable) times one more row of that method with those
memory options, named `METHOD[OPTION=VALUE,...]` (e.g. `gated-deltanet:compile=default`, the chunkwise
form through torch.compile, beside the suite's eager row); `train.KEY=VALUE` sets a training setting
(`gated-deltanet:compile=default,train.tf32=true`: its float32 products in TF32). Each row says its `tf32`.
"""
from __future__ import annotations

import argparse
import math
import re
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

import torch
from torch import nn

# --device cpu: the paper-gpu suite's config at a backbone small enough to check the script in seconds
DRY_RUN = ["run.model.d_model=32", "run.model.n_layers=2", "run.model.n_heads=2", "run.model.segment_len=16",
           "run.train.batch_size=2", "run.train.window_segments=4", "run.train.bptt_segments=2", "run.data.max_docs=40"]
XFORMERS_RTOL = 2e-2  # bf16 keeps 8 mantissa bits; two kernels summing in another order differ by ~1e-2


def matmul_flops_per_token(model: nn.Module) -> int:
    """Forward + backward FLOPs of the model's matrix multiplies per token: 6 x every Linear's weight."""
    return 6 * sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))


def model_flops_per_token(model: nn.Module, n_layers: int, segment_len: int, d_model: int) -> int:
    """Matrix multiplies plus causal attention within a segment (QK^T and AV: 2 x 2 d N/2 forward, x3 with backward)."""
    return matmul_flops_per_token(model) + 6 * n_layers * segment_len * d_model


def measured_bf16_peak(n: int = 8192, iters: int = 20) -> float:
    """FLOP/s of a large bf16 matrix multiply on this device (the practical peak)."""
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        a @ b
    torch.cuda.synchronize()
    return 2 * n**3 * iters / (time.perf_counter() - start)


def method_configs(overrides: list[str]) -> dict[str, Any]:
    """One run config per registered method at the paper-gpu backbone (seed 0, first grid point)."""
    from memzoo.suites.compare import expand, load_suite

    configs: dict[str, Any] = {}
    for spec in expand(load_suite("paper-gpu", overrides)):
        configs.setdefault(spec.method, spec.cfg)
    return configs


def backends_agree(cfg: Any, batch: Any) -> Optional[float]:
    """max |xformers - sdpa| / max |sdpa| over one bf16 forward with the same weights (None: no xformers)."""
    try:
        import xformers.ops  # noqa: F401
    except ImportError:
        return None
    except Exception as err:  # installed but built for another torch or CUDA: say so, measure the rest
        raise RuntimeError(f"xformers is installed but does not load: {err}") from err
    from memzoo.core.precision import autocast_context
    from memzoo.runs.configure import build_model

    logits = {}
    for backend in ("sdpa", "xformers"):
        cfg.model.attention_backend = backend
        torch.manual_seed(0)
        model = build_model(cfg).cuda().eval()
        with torch.no_grad(), autocast_context("bf16", torch.device("cuda")):
            logits[backend] = model(batch.tokens, None, batch.reset).logits.float()
    cfg.model.attention_backend = "auto"
    return float((logits["xformers"] - logits["sdpa"]).abs().max() / logits["sdpa"].abs().max())


def with_kernels(configs: dict[str, Any], kernels: list[str]) -> dict[str, Any]:
    """Each config once, but the methods with a `kernel` option (the DeltaNets) once per kernel path,
    named `method[kernel]` (a lone 'auto' keeps the plain name)."""
    import dataclasses

    from memzoo.core.plugins import get_memory
    from memzoo.memories.fla_kernels import KERNELS

    bad = [k for k in kernels if k not in KERNELS]
    if bad:
        raise SystemExit(f"--kernels: {bad} not among {', '.join(KERNELS)}")
    out: dict[str, Any] = {}
    for method, cfg in configs.items():
        if "kernel" not in {f.name for f in dataclasses.fields(get_memory(method).config_cls)}:
            out[method] = cfg
            continue
        for kernel in kernels:
            variant = cfg.copy()
            variant.memory.kernel = kernel
            out[method if kernels == ["auto"] else f"{method}[{kernel}]"] = variant
    return out


def with_variants(configs: dict[str, Any], also: list[str]) -> dict[str, Any]:
    """`configs` plus one row per `METHOD:OPTION=VALUE[,OPTION=VALUE]`, named `METHOD[OPTION=VALUE,...]`; an
    option `train.KEY` sets the run's training setting instead of the memory's (`train.tf32=true`)."""
    import copy
    import dataclasses

    import yaml

    from memzoo.core.plugins import get_memory

    out = dict(configs)
    for spec in also:
        method, _, options = spec.partition(":")
        if method not in configs or not options:
            raise SystemExit(f"--also {spec!r}: expected METHOD:OPTION=VALUE[,OPTION=VALUE] with METHOD among "
                             f"{', '.join(configs)}")
        variant = copy.deepcopy(configs[method])
        fields = {f.name for f in dataclasses.fields(get_memory(method).config_cls)}
        for pair in options.split(","):
            key, _, value = pair.partition("=")
            section, _, train_key = key.partition(".")
            if section == "train" and train_key in variant.train:  # a training setting, e.g. train.tf32=true
                variant.train[train_key] = yaml.safe_load(value)
                continue
            if key not in fields:
                raise SystemExit(f"--also {spec!r}: {method} has no option {key!r} (it has {', '.join(sorted(fields))}, "
                                 "or train.KEY for a training setting)")
            variant.memory[key] = yaml.safe_load(value)
        out[f"{method}[{options}]"] = variant
    return out


def row_names(methods: str) -> list[str]:
    """'local,titans-mac[compile=default,checkpoint=true]' -> the two names (commas inside [] kept)."""
    return [name for name in re.split(r",(?![^\[]*\])", methods) if name]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bench_method(method: str, cfg: Any, docs: list, steps: int, peak: float,
                 device: torch.device = torch.device("cuda"), profile: bool = False) -> dict[str, Any]:
    """Time `steps` bf16 training steps (after one untimed) of one method; its row of gpu.csv.
    (`device` cpu: a dry run of the same code, for checking it without a GPU.) `profile`: one more
    step under torch's profiler, untimed, its costliest kernels printed."""
    from memzoo.core.losses import LN2
    from memzoo.data.samplers import WindowSampler
    from memzoo.runs.configure import build_model, use_tf32
    from memzoo.training.train import train_window

    cuda = device.type == "cuda"
    use_tf32(cfg, device)  # every row sets it, so a tf32 row leaves the next one as its config says
    tc, m = cfg.train, cfg.model
    sampler = WindowSampler(docs, m.segment_len, 0)
    torch.manual_seed(0)
    model = build_model(cfg).to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=tc.lr)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    bpb, elapsed = float("nan"), 0.0
    for step in range(steps + 1):  # step 0 warms up (kernels, allocator) and is not timed
        batch = sampler.sample(step, tc.batch_size, tc.window_segments).to(device)
        _sync(device)
        start = time.perf_counter()
        res = train_window(model, batch, tc.bptt_segments, tc.aux_loss_weight, "bf16")
        opt.step()
        opt.zero_grad(set_to_none=True)
        _sync(device)
        elapsed += (time.perf_counter() - start) if step else 0.0
        bpb = res.nll_sum / max(res.tokens, 1) / LN2
    if profile:
        profile_step(lambda: train_window(model, batch, tc.bptt_segments, tc.aux_loss_weight, "bf16"), method, device)
    tokens = tc.batch_size * tc.window_segments * m.segment_len * steps
    if steps == 0:  # a warm-up alone (compiles, fills inductor's cache): nothing timed
        return {"method": method, "params": model.num_parameters(), "batch_size": tc.batch_size, "tf32": bool(tc.tf32),
                "peak_cuda_mb": torch.cuda.max_memory_allocated(device) / 2**20 if cuda else None,
                "train_bpb_last": bpb, "status": "warm-up step only" if math.isfinite(bpb) else "loss not finite"}
    flops = model_flops_per_token(model, m.n_layers, m.segment_len, m.d_model)
    diff, xf_error = None, None
    if cuda:
        try:
            diff = backends_agree(cfg, batch)
        except Exception as err:  # xformers failing is a finding for its column, not a lost row
            xf_error = f"{type(err).__name__}: {str(err).splitlines()[0][:160] if str(err) else ''}"
    return {
        "method": method, "params": model.num_parameters(), "batch_size": tc.batch_size, "tf32": bool(tc.tf32),
        "tokens_per_s": tokens / elapsed, "model_flops_per_token": flops,
        "model_tflops": flops * tokens / elapsed / 1e12, "mfu": flops * tokens / elapsed / peak,
        "peak_cuda_mb": torch.cuda.max_memory_allocated(device) / 2**20 if cuda else None, "train_bpb_last": bpb,
        "xformers_rel_diff": diff, "xformers_ok": None if diff is None else diff <= XFORMERS_RTOL, "xformers_error": xf_error,
        "status": "ok" if math.isfinite(bpb) else "loss not finite",
    }


def profile_step(step: Callable[[], Any], method: str, device: torch.device, top: int = 15) -> None:
    """One call of `step` under torch's profiler; its `top` costliest ops by self time on the device
    (CPU time on a CPU), as a table on stdout."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    with profile(activities=activities) as prof:
        step()
        _sync(device)
    events = prof.key_averages()
    key = "self_cpu_time_total"
    if cuda:
        key = "self_device_time_total" if hasattr(events[0], "self_device_time_total") else "self_cuda_time_total"
    print(f"profile of one step of {method} (sorted by {key}):\n{events.table(sort_by=key, row_limit=top, max_name_column_width=60)}",
          flush=True)


def main(argv: Optional[list[str]] = None) -> int:
    from memzoo.evaluations.harness import atomic_csv  # memzoo imported inside functions, as everywhere in this script

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=5, help="timed bf16 training steps per method (after one warm-up)")
    ap.add_argument("--batch-size", type=int, default=None, help="rows per step (default: the suite's train.batch_size)")
    ap.add_argument("--peak-tflops", type=float, default=None, help="the device's bf16 peak (default: measured)")
    ap.add_argument("--methods", default=None,
                    help="comma-separated rows to time, in this order: methods, METHOD[KERNEL], METHOD[OPTION=VALUE,...], "
                         "and '*' for every row not named")
    ap.add_argument("--max-seconds", type=float, default=None,
                    help="start no further method after this many seconds (the rest get a 'not measured' row)")
    ap.add_argument("--kernels", default="auto",
                    help="the DeltaNets' kernel paths to time, comma-separated: auto, torch, fla (one row each)")
    ap.add_argument("--also", action="append", default=[], metavar="METHOD:OPTION=VALUE[,OPTION=VALUE]",
                    help="time one more row of METHOD with these memory options (repeatable)")
    ap.add_argument("--profile", default="", help="rows (as --methods names them) to profile for one more step each")
    ap.add_argument("--out", default="results/gpu")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="cpu: a dry run of the same code at a tiny backbone (checks the script, measures nothing)")
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("benchmarks/gpu/gpu.py: no CUDA device here, nothing measured (run it on a machine with a GPU)")
        return 0

    from memzoo.data.corpus import load_documents, split_documents

    cuda = args.device == "cuda"
    overrides = (["run.data.max_docs=400"] if cuda else DRY_RUN) + \
        ([f"run.train.batch_size={args.batch_size}"] if args.batch_size else [])
    configs = with_variants(with_kernels(method_configs(overrides), args.kernels.split(",")), args.also)
    if args.methods:
        wanted = row_names(args.methods)
        if "*" in wanted:  # the rows not named, in the suite's order, where the '*' stands
            at = wanted.index("*")
            wanted[at:at + 1] = [name for name in configs if name not in wanted]
        missing = [name for name in wanted if name not in configs]
        if missing:
            raise SystemExit(f"--methods: {missing} not among the rows {', '.join(configs)}")
        configs = {name: configs[name] for name in wanted}
    profiled = set(row_names(args.profile))
    first = next(iter(configs.values()))
    docs = split_documents(load_documents(first.data), first.data)["train"]
    peak = args.peak_tflops * 1e12 if args.peak_tflops else measured_bf16_peak() if cuda else 1e12
    device = torch.cuda.get_device_name() if cuda else "cpu (dry run)"
    print(f"{device}: bf16 peak {peak / 1e12:.0f} TFLOP/s ({'given' if args.peak_tflops else 'measured' if cuda else 'nominal'}); "
          f"paper-gpu backbone: {first.model.n_layers} layers, d_model {first.model.d_model}, "
          f"segments of {first.model.segment_len}", flush=True)
    rows, began = [], time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for method, cfg in configs.items():
        if args.max_seconds is not None and time.perf_counter() - began > args.max_seconds:
            rows.append({"device": device, "method": method, "status": f"not measured (--max-seconds {args.max_seconds:g})"})
            continue
        try:
            row = bench_method(method, cfg, docs, args.steps, peak, torch.device(args.device), method in profiled)
        except torch.cuda.OutOfMemoryError as err:
            row = {"method": method, "status": f"out of memory: {str(err).splitlines()[0][:120]}"}
        except Exception as err:  # a kernel path that cannot run here (fla refused, absent) is a row, not a stop
            if "[" not in method:
                raise
            row = {"method": method, "status": f"failed: {type(err).__name__}: {str(err).strip().splitlines()[0][:200]}"}
        if cuda:
            torch.cuda.empty_cache()
        rows.append({"device": device, "peak_tflops": peak / 1e12, **row})
        if "tokens_per_s" in row:
            xf = (row["xformers_error"] or "n/a") if row["xformers_rel_diff"] is None else f"{row['xformers_rel_diff']:.1e}"
            peak_mb = "n/a" if row["peak_cuda_mb"] is None else f"{row['peak_cuda_mb']:,.0f}"
            print(f"{method:14s} {row['params']:>11,} params {row['tokens_per_s']:>10,.0f} tok/s "
                  f"{row['model_tflops']:6.1f} TFLOP/s  MFU {row['mfu']:5.1%}  peak {peak_mb:>8s} MB  "
                  f"bpb {row['train_bpb_last']:.3f}  xformers-vs-sdpa {xf}  {row['status']}", flush=True)
        else:
            peak_mb = f"  peak {row['peak_cuda_mb']:,.0f} MB" if row.get("peak_cuda_mb") is not None else ""
            print(f"{method:14s} {row['status']}{peak_mb}", flush=True)
        atomic_csv(out / "gpu.csv", rows)  # after every method: a killed run keeps the rows it measured
    local = next((r["tokens_per_s"] for r in rows if r["method"] == "local" and "tokens_per_s" in r), None)
    for r in rows:
        if local and "tokens_per_s" in r:
            r["ratio_to_local"] = r["tokens_per_s"] / local
    if local:
        print("training tokens/s as a ratio to local, measured in this call: " + ", ".join(
            f"{r['method']} {r['ratio_to_local']:.2f}x" for r in sorted(rows, key=lambda r: -r.get("ratio_to_local", -1))
            if "ratio_to_local" in r))
    atomic_csv(out / "gpu.csv", rows)
    print(f"wrote {out / 'gpu.csv'}")
    bad = [r["method"] for r in rows if r.get("status") == "loss not finite" or r.get("xformers_ok") is False]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
