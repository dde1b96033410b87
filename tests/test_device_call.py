"""benchmarks/gpu/device_call.py and checks/eval_check.py on the CPU: the one prepared device call runs
every stage (dry run), keeps a stage's log when it fails or is cut at its limit, and counts the failures;
the GPU stages are the ones the issue sized (checks beside the warm-up, timings alone and last)."""
from __future__ import annotations

import sys
from pathlib import Path

import benchmarks.gpu.device_call as device_call
import checks.eval_check as eval_check
from benchmarks.gpu.device_call import Stage


def test_the_gpu_plan_runs_checks_beside_the_warm_up_and_times_alone_last(tmp_path: Path) -> None:
    groups = device_call.stages(tmp_path, dry_run=False, checks="local", evaluate=False, profile="xl")
    assert [[s.name for s in g] for g in groups] == [["cuda_check", "warmup"], ["gpu"]]
    warm, timing = groups[0][1].argv, groups[1][0].argv
    for row in device_call.COMPILED_ROWS + device_call.TF32_ROWS:  # every compiled row is warmed up
        assert row in warm[warm.index("--methods") + 1].split(",")
    assert timing[timing.index("--methods") + 1].startswith("local," + device_call.TF32_ROWS[0])
    assert all(f"--also={row.replace('[', ':').rstrip(']')}" in timing for row in device_call.TF32_ROWS)
    assert timing[timing.index("--profile") + 1] == "xl" and "--only" in groups[0][0].argv
    full = device_call.stages(tmp_path, dry_run=False)
    assert [[s.name for s in g] for g in full] == [["cuda_check", "warmup"], ["eval_check"], ["gpu"]]
    assert device_call.plan_seconds(full) <= 330  # about 5 minutes at most: a lease of 15 keeps a second try


def test_stages_run_side_by_side_and_a_failing_or_cut_stage_is_counted_with_its_log(tmp_path: Path) -> None:
    py = sys.executable
    group = [Stage("fine", [py, "-c", "print('rows written')"], 30),
             Stage("broken", [py, "-c", "import sys; print('half'); sys.exit(3)"], 30),
             Stage("slow", [py, "-c", "import time; print('began', flush=True); time.sleep(30)"], 2)]
    assert device_call.run_together(group, tmp_path, {"PATH": ""}) == 2
    assert (tmp_path / "fine.log").read_text() == "rows written\n"
    assert (tmp_path / "broken.log").read_text() == "half\n" and (tmp_path / "slow.log").read_text() == "began\n"


def test_eval_check_on_the_cpu_evaluates_on_the_run_device_and_times_both(tmp_path: Path) -> None:
    row = eval_check.measure("local", "cpu", 2, tmp_path)
    assert row["ok"] and "evaluating on cpu" in row["eval_device_line"]
    assert row["eval_tokens_per_s"] > 0 and row["train_tokens_per_s"] > 0 and 0 < row["eval_bpb"] < 9
