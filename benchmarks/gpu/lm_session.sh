#!/usr/bin/env bash
# The bits-per-byte comparison on one GPU in one short lease (about 5 minutes on one H100: 226 s for the suite):
#   1. `memzoo compare lm-gpu`: every run of configs/suites/lm-gpu.yaml as a process sharing the GPU;
#   2. meanwhile, benchmarks/gpu/fla_speed.py: fla's delta-rule kernels against the chunkwise form.
# Usage: OUT=dir bash benchmarks/gpu/lm_session.sh   (PYTHON=python3; wheels for what the GPU image
# lacks (omegaconf, fla-core) in .whl/, see docs/scaling.md). Rows, reports and logs land in $OUT.
set -u
OUT=${OUT:-results/gpu-lm}
PY=${PYTHON:-python3}
R=gpu-lm
mkdir -p "$OUT" "$R"
if ls .whl/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
export PYTHONUNBUFFERED=1 PYTHONPATH=".:/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
log() { echo "[$(date -u +%H:%M:%S)] $*"; }
{
log "environment"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
$PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
log "1. lm-gpu suite (${LM_JOBS:-15} processes sharing the GPU)"
timeout -k 10 "${LM_SECONDS:-300}" $PY -m memzoo compare lm-gpu out_dir="$R" --jobs "${LM_JOBS:-15}" ${LM_OVERRIDES:-} > "$R/lm.log" 2>&1 &
LM=$!
sleep 20
log "2. fla kernels against the chunkwise form"
timeout -k 5 120 $PY benchmarks/gpu/fla_speed.py --rounds 3 --out "$R" 2>&1 | tail -30
log "waiting for the suite"
wait $LM; echo "lm-gpu exit $?"
tail -40 "$R/lm.log"
$PY -m memzoo compare lm-gpu out_dir="$R" --collect ${LM_OVERRIDES:-} 2>&1 | tail -30
nvidia-smi --query-gpu=memory.used --format=csv
log "done"
} 2>&1 | tee "$OUT/session.log"
cp "$R"/lm-gpu/report.md "$R"/lm-gpu/results.parquet "$R"/fla_speed.csv "$OUT"/ 2>/dev/null
tar czf "$OUT/runs.tgz" --exclude='*.pt' --exclude='*.safetensors' --exclude='*.png' "$R" 2>/dev/null
ls -la "$OUT"
