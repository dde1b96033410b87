"""One device call, sized to a lease of 15 minutes (about 5 minutes of it, at most 330 s by the stages'
limits, leaving the machine's start and a second try): the checks side by side, then the timings alone.

    python benchmarks/gpu/device_call.py --out DIR [--dry-run] [--checks CASES] [--no-eval] [--profile ROWS]

Stages, each under its own time limit, each writing its log and CSV into DIR as it goes (a stage cut
off or failing costs its own rows only):
  0. the environment: GPU, driver, torch, Triton, fla;
  1. side by side: checks/cuda_check.py (every method and variant against the float64 CPU oracle in
     fp32, tf32 and bf16, the compiled DeltaNets and Titans included) and a warm-up of the compiled rows
     of 3 (their first step only: inductor's cache is filled, so that 3 times steps, not compiles);
  2. checks/eval_check.py: `memzoo eval` on the GPU, timed against a training step;
  3. alone: benchmarks/gpu/gpu.py, training tokens/s of every method at the paper-gpu backbone (batch 48,
     bf16) and its ratio to local; first the compiled rows with TF32 (train.tf32) and without.
Wheels in .whl/ (omegaconf, which the image lacks) are installed into /tmp/site first. `--dry-run`
runs every stage on the CPU at a tiny backbone in seconds (tests/test_device_call.py): it checks the
script, not the GPU. Exit status: the number of stages that failed. On one H100 (2026-11-27) it took
288 s (docs/gpu/h100-2026-11-27.md).
"""
from __future__ import annotations

import argparse
import glob
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[2]
# The suite's compiled rows (paper-gpu compiles the DeltaNets' read and Titans' chunk step), and the same
# with their float32 products in TF32 (train.tf32): warmed up in stage 1, timed first in stage 3.
COMPILED_ROWS = ["gated-deltanet", "deltanet", "titans-mac", "titans-mag"]
TF32_ROWS = ["gated-deltanet[train.tf32=true]", "deltanet[train.tf32=true]", "titans-mac[train.tf32=true]"]
ALSO = [f"--also={row.replace('[', ':').rstrip(']')}" for row in TF32_ROWS]


@dataclass
class Stage:
    name: str
    argv: list[str]
    seconds: float


def plan_seconds(groups: list[list[Stage]]) -> float:
    """The most the stages can take: each group as long as its longest stage."""
    return sum(max(stage.seconds for stage in group) for group in groups)


def stages(out: Path, dry_run: bool, checks: Optional[str] = None, evaluate: bool = True,
           profile: str = "") -> list[list[Stage]]:
    """Groups of stages: the stages of a group run side by side, the groups one after another."""
    py = sys.executable
    if dry_run:
        return [[Stage("cuda_check", [py, "checks/cuda_check.py", "--device", "cpu", "--only", "local", "--out", str(out)], 120),
                 Stage("warmup", [py, "benchmarks/gpu/gpu.py", "--device", "cpu", "--steps", "0", "--methods",
                                  "deltanet[compile=eager]", "--also=deltanet:compile=eager", "--out", str(out / "warmup")], 120)],
                [Stage("eval_check", [py, "checks/eval_check.py", "--device", "cpu", "--steps", "2", "--out", str(out)], 120)],
                [Stage("gpu", [py, "benchmarks/gpu/gpu.py", "--device", "cpu", "--steps", "1", "--methods",
                               "local,deltanet[compile=eager]", "--also=deltanet:compile=eager", "--out", str(out)], 120)]]
    first = ",".join(["local", *TF32_ROWS, *COMPILED_ROWS, "*"])
    only = ["--only", checks] if checks else []
    groups = [[Stage("cuda_check", [py, "checks/cuda_check.py", *only, "--out", str(out)], 140),
                Stage("warmup", [py, "benchmarks/gpu/gpu.py", "--steps", "0", "--peak-tflops", "989", *ALSO, "--methods",
                                ",".join([*COMPILED_ROWS, *TF32_ROWS]), "--out", str(out / "warmup")], 140)],
              [Stage("eval_check", [py, "checks/eval_check.py", "--out", str(out)], 40)],
              [Stage("gpu", [py, "benchmarks/gpu/gpu.py", "--steps", "3", *ALSO, "--methods", first, "--max-seconds", "110",
                             *(["--profile", profile] if profile else []), "--out", str(out)], 140)]]
    return [group for group in groups if evaluate or group[0].name != "eval_check"]


def launch(stage: Stage, out: Path, env: dict[str, str]) -> tuple[subprocess.Popen, float]:
    log = open(out / f"{stage.name}.log", "w")
    print(f"[{time.strftime('%H:%M:%S')}] {stage.name}: {' '.join(stage.argv[1:])}", flush=True)
    return subprocess.Popen(stage.argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT), time.monotonic()


def run_together(group: list[Stage], out: Path, env: dict[str, str]) -> int:
    """Run `group` side by side, each killed at its limit; the number that failed (each log's tail printed)."""
    running = [(stage, *launch(stage, out, env)) for stage in group]
    failed = 0
    for stage, proc, began in running:
        try:
            code = proc.wait(timeout=max(1.0, stage.seconds - (time.monotonic() - began)))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            code = "killed at its limit"
        failed += code != 0
        tail = (out / f"{stage.name}.log").read_text(errors="replace").splitlines()[-40:]
        print(f"[{time.strftime('%H:%M:%S')}] {stage.name}: exit {code} after {time.monotonic() - began:.0f} s\n  "
              + "\n  ".join(tail), flush=True)
    return failed


def environment(env: dict[str, str]) -> None:
    probe = ("import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, "
             "torch.cuda.get_device_name() if torch.cuda.is_available() else 'no CUDA')\n"
             "try:\n import triton; print('triton', triton.__version__)\nexcept ImportError: print('no triton')\n"
             "from memzoo.memories import fla_kernels; f = fla_kernels.load_fla(); print('fla', f if isinstance(f, str) else 'imports')")
    subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv"], check=False) \
        if any(Path(p, "nvidia-smi").exists() for p in os.environ.get("PATH", "").split(os.pathsep)) else None
    subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, check=False)


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--dry-run", action="store_true", help="every stage on the CPU at a tiny size (checks the script)")
    ap.add_argument("--checks", default=None, help="cuda_check's cases (comma-separated; default every one)")
    ap.add_argument("--no-eval", action="store_true", help="leave out the eval_check stage")
    ap.add_argument("--profile", default="", help="gpu.py rows to profile for one more step each (slow: ~10 s a row)")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    wheels = glob.glob(str(ROOT / ".whl" / "*.whl"))
    if wheels and not args.dry_run:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                        "--no-cache-dir", "--upgrade", "--target", "/tmp/site", *wheels], check=True)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), "/tmp/site" if wheels and not args.dry_run else "",
                                                      env.get("PYTHONPATH", "")]))
    began = time.monotonic()
    environment(env)
    failed = sum(run_together(group, args.out, env) for group in stages(args.out, args.dry_run, args.checks, not args.no_eval,
                                                                     args.profile))
    print(f"device call: {time.monotonic() - began:.0f} s, {failed} stage(s) failed; rows in {args.out}", flush=True)
    return failed


if __name__ == "__main__":
    sys.exit(main())
