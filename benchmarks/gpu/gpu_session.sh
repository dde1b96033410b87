#!/usr/bin/env bash
# Every GPU check memzoo has, in one call that fits a short lease (about 9 minutes on one H100/H200):
#   1. a slice of capacity-gpu (seed 0, one cell of its sweep, four methods at once), in the background;
#   2. benchmarks/gpu/cuda_check.py: every method's fast path on CUDA against the float64 CPU oracle;
#   3. benchmarks/speed/gdn_speed.py on CUDA: Gated DeltaNet's chunkwise form against its per-token loop;
#      benchmarks/gpu/fla_speed.py: fla's kernels against the chunkwise form (where fla imports);
#   4. benchmarks/gpu/gpu.py, once the GPU is free again: tokens/s, MFU, peak memory and xformers vs sdpa.
# Usage: OUT=dir bash benchmarks/gpu/gpu_session.sh   (PYTHON=python3 by default; each stage has its own
# time limit, and everything measured lands in $OUT/results.tgz and $OUT/session.log even when one fails).
set -u
OUT=${OUT:-results/gpu-session}
PY=${PYTHON:-python3}
R=gpu-session
mkdir -p "$OUT" "$R"
export PYTHONUNBUFFERED=1 PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"
log() { echo "[$(date -u +%H:%M:%S)] $*"; }
{
log "environment"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv
$PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"
$PY -c "import xformers, xformers.ops; print('xformers', xformers.__version__)" 2>&1 | tail -1

log "1. capacity-gpu slice in the background (seed 0; d_model 128, lr 0.003, 16 pairs, gap 4)"
# Ten at once reached 2.4 (Titans-MAC) to 12.5 (local) steps/s each on an H200 (2026-11-26): in 300 s
# only local finished its 3,000 steps. Four at once leaves each process more of the GPU.
CAP_METHODS=${CAP_METHODS:-full,local,infini-delta,gated-deltanet}
timeout -k 5 "${CAP_SECONDS:-300}" $PY -m memzoo compare capacity-gpu out_dir="$R/capacity" 'seeds=[0]' \
  'sweep={model.d_model: [128], train.lr: [0.003], task.pairs: [16], task.gap_segments: [4]}' \
  "methods=[$CAP_METHODS]" 'grid.infini-delta={model.head_dim: [32]}' 'grid.rmt.n_mem_tokens=[8]' \
  'grid.xl.mem_len=[128]' --jobs "${CAP_JOBS:-4}" > "$R/capacity.log" 2>&1 &
CAP=$!

log "2. fast paths on CUDA against the CPU oracle"
timeout -k 5 120 $PY benchmarks/gpu/cuda_check.py --out "$R"

log "3. Gated DeltaNet chunkwise vs per-token loop on CUDA (paper-gpu heads: 8 of 64, segment 512, batch 8)"
timeout -k 5 90 $PY benchmarks/speed/gdn_speed.py --device cuda --segment 512 --heads 8 --head-dim 64 --batch 8 \
  --rounds 5 --out "$R"

log "3b. fla's fused DeltaNet kernels against the PyTorch chunkwise form (where fla imports: pip install memzoo[fla])"
timeout -k 5 100 $PY benchmarks/gpu/fla_speed.py --rounds 3 --out "$R"

log "waiting for the capacity slice"
wait $CAP; echo "capacity exit $?"
pkill -f "memzoo compare capacity-gpu" 2>/dev/null; pkill -f "multiprocessing.spawn" 2>/dev/null; sleep 2
tail -25 "$R/capacity.log"

log "4. benchmarks/gpu/gpu.py (paper-gpu backbone, bf16, 3 timed steps a method)"
timeout -k 5 "${GPU_SECONDS:-220}" $PY benchmarks/gpu/gpu.py --steps 3 --max-seconds "${GPU_MAX:-170}" --out "$R"
log "done"
} 2>&1 | tee "$OUT/session.log"
# rows, reports and logs only: the runs' checkpoints made the archive 49 MB, over the lease's 16 MB a file
tar czf "$OUT/results.tgz" --exclude='*.pt' --exclude='*.safetensors' "$R" 2>/dev/null
ls -la "$OUT"
