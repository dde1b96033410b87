#!/usr/bin/env bash
# Every GPU check memzoo has, in one call sized to a short lease (about 9 minutes on one H100/H200,
# leaving a lease of 15 minutes time for its start and a second try):
#   1. `memzoo compare lm-gpu` in the background: the bits-per-byte comparison, 15 runs sharing the GPU;
#   2. meanwhile checks/cudnn_sdpa_check.py (cuDNN attention's backward against math),
#      checks/cuda_check.py (every fast path against the float64 CPU oracle, fla's included)
#      benchmarks/gpu/fla_speed.py (fla's DeltaNet kernels against the PyTorch chunkwise form)
#      and checks/resume_check.py (a run cut off and resumed on CUDA ends as a straight one);
#   3. once the GPU is free: benchmarks/gpu/gpu.py (paper-gpu tokens/s per method, ratios to local).
# Usage: OUT=dir bash benchmarks/gpu/gpu_session.sh. PYTHON=python3 by default. Wheels the GPU image lacks
# (omegaconf; fla-core for the fused kernels) are installed from .whl/ when present (docs/scaling.md).
# LM_SUITE picks the bits-per-byte suite (default lm-gpu; lm-stream-gpu is lm-stream's protocol at a GPU
# budget, 18 runs, about 9.5 minutes of one H200: LM_SECONDS=525 CHECKS=0 leaves out stages 2 and 3; a second call
# on the same warm machine resumes the runs from their checkpoints). LM_JOBS overrides the suite's jobs. LM_OVERRIDES adds suite overrides (e.g. token_budget=16384000 for 500 steps a run; the suite's 800
# because at 500 full had not yet overtaken local on an H100, 2026-11-26). Each stage has its own time limit; whatever was measured lands in $OUT even when one fails.
set -u
OUT=${OUT:-results/gpu-session}
PY=${PYTHON:-python3}
R=gpu-session
LM_SUITE=${LM_SUITE:-lm-gpu}
mkdir -p "$OUT" "$R"
if ls .whl/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
export PYTHONUNBUFFERED=1 PYTHONPATH=".:/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
log() { echo "[$(date -u +%H:%M:%S)] $*"; }
{
log "environment"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv
$PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"
$PY -c "import fla; print('fla', fla.__version__)" 2>&1 | tail -1

log "1. $LM_SUITE in the background: its runs sharing the GPU"
timeout -k 10 "${LM_SECONDS:-420}" $PY -m memzoo compare "$LM_SUITE" out_dir="$R" ${LM_OVERRIDES:-} ${LM_JOBS:+--jobs $LM_JOBS} > "$R/lm.log" 2>&1 &
LM=$!

if [ "${CHECKS:-1}" != 0 ]; then
log "2a. cuDNN attention backward against math"
timeout -k 5 60 $PY checks/cudnn_sdpa_check.py
log "2b. fast paths on CUDA against the float64 CPU oracle"
timeout -k 5 200 $PY checks/cuda_check.py --out "$R"
log "2c. fla's DeltaNet kernels against the PyTorch chunkwise form"
timeout -k 5 90 $PY benchmarks/gpu/fla_speed.py --rounds 3 --out "$R"
log "2d. an interrupted run resumes on CUDA as an uninterrupted one ends"
timeout -k 5 120 $PY checks/resume_check.py --out "$R"
fi

log "waiting for $LM_SUITE"
wait $LM; echo "$LM_SUITE exit $?"
# [m]: the pattern never matches a shell whose own command line holds it (a one-line command that runs this)
pkill -f "[m]emzoo compare $LM_SUITE" 2>/dev/null; pkill -f "[m]ultiprocessing.spawn" 2>/dev/null; sleep 2
tail -12 "$R/lm.log"
$PY -m memzoo compare "$LM_SUITE" out_dir="$R" ${LM_OVERRIDES:-} --collect 2>&1 | tail -20
case "$LM_SUITE" in lm-stream*)  # the curve against steps, and headroom where every run reached
  $PY experiments/lm-stream/curve.py "$R/$LM_SUITE" --out "$R/curve" 2>&1 | tail -40 ;; esac

if [ "${CHECKS:-1}" != 0 ]; then
log "3. benchmarks/gpu/gpu.py (paper-gpu backbone, bf16, 3 timed steps a method; DeltaNets on both kernel paths)"
timeout -k 5 "${GPU_SECONDS:-140}" $PY benchmarks/gpu/gpu.py --steps 3 --kernels torch,fla --max-seconds "${GPU_MAX:-110}" --out "$R"
fi
log "done"
} 2>&1 | tee "$OUT/session.log"
cp "$R/$LM_SUITE"/report.md "$OUT"/lm-report.md 2>/dev/null
cp "$R/$LM_SUITE"/results.parquet "$OUT"/lm-results.parquet 2>/dev/null
# rows, reports and logs only (checkpoints would pass the lease's 16 MB a file)
tar czf "$OUT/results.tgz" --exclude='*.pt' --exclude='*.safetensors' --exclude='*.png' "$R" 2>/dev/null
ls -la "$OUT"
