"""How much rounding decides a method's quick result: each method's `quick` run (one seed) trained
(a) at 1 thread, (b) at 2 threads, (c) at 1 thread with every initial weight multiplied by
(1 + rel * noise), noise ~ N(0, 1) from its own generator. Prints and appends to a CSV the valid
bits per byte of each and the differences (b) - (a) and (c) - (a).

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 python experiments/precision/sensitivity.py armt titans-mag \
        --out /tmp/sens --csv experiments/precision/sensitivity.csv
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import csv
import json
import multiprocessing
import time
from pathlib import Path
from typing import Any, Optional

import torch
from omegaconf import DictConfig

from experiments.precision.trace_hooks import flush, tracing

CONDITIONS = {"1thread": (1, 0.0), "2threads": (2, 0.0), "perturbed": (1, 1e-7)}  # name -> (threads, rel)


@torch.no_grad()
def perturb_weights(model: torch.nn.Module, rel: float, seed: int = 12345) -> None:
    """w <- w * (1 + rel * noise) for every floating parameter, the noise from a generator of its own
    (the global RNG, which the run's sampling and dropout use, is left untouched)."""
    if not rel >= 0:
        raise ValueError(f"rel={rel}; expected >= 0")
    gen = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        if p.is_floating_point():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float64)
            p.copy_((p.double() * (1 + rel * noise)).to(p.dtype))


def quick_config(method: str, seed: int, out_dir: str, overrides: Optional[list[str]] = None) -> DictConfig:
    """The quick suite's resolved run config for one method and seed, written under out_dir."""
    from memzoo.suites.compare import expand, load_suite

    suite = load_suite("quick", [f"methods=[{method}]", f"seeds=[{seed}]", f"out_dir={out_dir}", *(overrides or [])])
    (spec,) = expand(suite)
    return spec.cfg


def run_one(method: str, seed: int, condition: str, out_dir: str, log_every: int, trace: bool,
            overrides: Optional[list[str]] = None) -> dict[str, Any]:
    """One quick run under `condition` (in a fresh process); its result row."""
    import memzoo.training.train as train_mod

    threads, rel = CONDITIONS[condition]
    torch.set_num_threads(threads)
    cfg = quick_config(method, seed, out_dir, [f"run.train.log_every={log_every}", *(overrides or [])])
    cfg.train.threads = threads
    run_dir = Path(out_dir) / f"{method}-s{seed}-{condition}"
    if rel > 0:  # the weights as initialised, then nudged: the run starts from them (task.init_from)
        if cfg.task.init_from:
            raise ValueError(f"{method}: the quick run already starts from {cfg.task.init_from}; perturb that instead")
        torch.manual_seed(cfg.seed)
        model = train_mod.build_model(cfg)
        perturb_weights(model, rel)
        init = run_dir.with_name(run_dir.name + "-init")
        init.mkdir(parents=True, exist_ok=True)
        torch.save({"model": model.state_dict()}, init / "checkpoint.pt")
        cfg.task.init_from = str(init)
    on_step = None
    tracer = tracing(method) if trace else None
    if tracer is not None:  # the memory's statistics per step, appended to run_dir/trace.jsonl
        run_dir.mkdir(parents=True, exist_ok=True)
        on_step = lambda step: flush(run_dir / "trace.jsonl", step)  # noqa: E731
    t0 = time.perf_counter()
    with tracer or contextlib.nullcontext():
        train_mod.train(cfg, run_dir=run_dir, progress=False, on_step=on_step)
    result = json.loads((run_dir / "result.json").read_text())
    return {"method": method, "seed": seed, "condition": condition, "threads": threads, "rel": rel,
            "valid_bpb": float(result["valid_bpb"]), "seconds": round(time.perf_counter() - t0, 1),
            "run_dir": str(run_dir)}


def differences(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (method, seed): each condition's valid_bpb minus the 1-thread one's (`diff`)."""
    base = {(r["method"], r["seed"]): r["valid_bpb"] for r in rows if r["condition"] == "1thread"}
    return [{**r, "diff": r["valid_bpb"] - base[(r["method"], r["seed"])] if (r["method"], r["seed"]) in base else None}
            for r in rows]


def fmt(diff: Optional[float]) -> str:
    return "-" if diff is None else f"{diff:+.5f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("methods", nargs="+")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--conditions", nargs="+", default=list(CONDITIONS), choices=list(CONDITIONS))
    ap.add_argument("--out", default="/tmp/sensitivity")
    ap.add_argument("--csv", default="experiments/precision/sensitivity.csv")
    ap.add_argument("--jobs", type=int, default=1, help="runs at a time (each in a fresh process)")
    ap.add_argument("--log-every", type=int, default=1, help="metrics.jsonl rows: every step for the traces")
    ap.add_argument("--set", nargs="*", default=[], help="quick-suite overrides, e.g. options.armt.write_norm=rms-kv")
    ap.add_argument("--no-trace", action="store_true", help="no per-step memory statistics (trace.jsonl)")
    ap.add_argument("--label", default="", help="a note for the CSV's rows (the code version, the machine)")
    args = ap.parse_args()
    todo = [(m, c) for m in args.methods for c in args.conditions]
    rows = []
    with cf.ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn"), max_tasks_per_child=1) as pool:
        futs = [pool.submit(run_one, m, args.seed, c, args.out, args.log_every, not args.no_trace, args.set) for m, c in todo]
        for f in cf.as_completed(futs):
            rows.append(f.result())
            line = json.dumps({k: v for k, v in rows[-1].items() if k != "run_dir"})
            print(line, flush=True)
            with Path(args.csv).with_suffix(".jsonl").open("a") as fh:  # every finished run at once (a cut-off sweep keeps them)
                fh.write(json.dumps({**rows[-1], "label": args.label}) + "\n")
    rows = differences(sorted(rows, key=lambda r: (r["method"], list(CONDITIONS).index(r["condition"]))))
    for r in rows:
        print(f"{r['method']:14s} {r['condition']:10s} {r['valid_bpb']:.5f}  diff {fmt(r['diff'])}")
    path = Path(args.csv)
    new = not path.is_file()
    with path.open("a", newline="") as fh:
        w = csv.DictWriter(fh, ["label", "method", "seed", "condition", "threads", "rel", "valid_bpb", "diff", "seconds"],
                           extrasaction="ignore")
        if new:
            w.writeheader()
        for r in rows:
            w.writerow({**r, "label": args.label})


if __name__ == "__main__":
    main()
