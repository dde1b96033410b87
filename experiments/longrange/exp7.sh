#!/bin/bash
# Issue 10, experiment 7: length generalisation. Memorizing (from exp6's mem-a) with a faster
# memory-path temperature (scale_lr_mult), keys 0-7 segments back; RMT (from exp6's rmt-c) keys
# 0-13 segments back at 1,916-1,948 bytes. `$1` is rmt or memorizing; run from the repository root.
set -e
C="train.lr=0.001 train.warmup_steps=20 train.weight_decay=0.0 train.log_every=10 train.checkpoint_every=50
   train.threads=1 task.name=passkey task.loss=answer task.key_digits=5 task.lm_fraction=0.25 out_dir=results/exp7"
if [ "$1" = rmt ]; then
  memzoo train rmt memory.n_mem_tokens=8 name=rmt-d task.init_from=results/exp6/rmt-c \
      task.key_segments_back=[0,1,2,3,4,5,6,7,8,9,10,11,12,13] task.lengths=[1916,1948] train.steps=300 \
      train.bptt_segments=16 $C
  memzoo passkey results/exp7/rmt-d --lengths 1948,4096,32768 --depths 0,0.5,1 --trials 4 --threads 1
else
  M="memory.store_size=65536 memory.mem_len=128 memory.top_k=32 memory.gate_lr_mult=20 memory.scale_lr_mult=50"
  memzoo train memorizing $M name=mem-b task.init_from=results/exp6/mem-a \
      task.key_segments_back=[0,1,2,3,4,5,6,7] task.lengths=[1148,1180,1212] train.steps=300 train.bptt_segments=10 $C
  memzoo passkey results/exp7/mem-b --lengths 1180,4096,32768 --depths 0,0.5,1 --trials 4 --threads 1
fi
