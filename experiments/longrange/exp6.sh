#!/bin/bash
# Long-range recipe, experiment 6: continue RMT (exp5's last stage) and Memorizing (exp4's stage 1) with
# mixed-gap stages and the corpus loss mixed in (lm_fraction 0.25). Run from the repository root
# after `memzoo compare experiments/longrange/exp4.yaml` and `... exp5.yaml`; `$1` is rmt or memorizing.
set -e
C="train.lr=0.001 train.warmup_steps=20 train.weight_decay=0.0 train.log_every=10 train.checkpoint_every=50
   train.threads=1 task.name=passkey task.loss=answer task.key_digits=5 task.lm_fraction=0.25 out_dir=results/exp6"
if [ "$1" = rmt ]; then
  memzoo train rmt memory.n_mem_tokens=8 name=rmt-a task.init_from=results/exp5/runs/rmt-s0 \
      task.key_segments_back=[0,1,2,3] task.lengths=[636,668] train.steps=400 train.bptt_segments=8 $C
  memzoo train rmt memory.n_mem_tokens=8 name=rmt-b task.init_from=results/exp6/rmt-a \
      task.key_segments_back=[0,1,2,3,4,5,6,7] task.lengths=[1148,1180,1212] train.steps=400 train.bptt_segments=10 $C
  memzoo passkey results/exp6/rmt-b --lengths 668,1180,4096,32768 --depths 0,0.5,1 --trials 4 --threads 1
else
  M="memory.store_size=65536 memory.mem_len=128 memory.top_k=32 memory.gate_lr_mult=20"
  memzoo train memorizing $M name=mem-a task.init_from=results/exp4/runs/memorizing-s0-c1 \
      task.key_segments_back=[0,1,2,3] task.lengths=[636,668] train.steps=600 train.bptt_segments=8 $C
  memzoo passkey results/exp6/mem-a --lengths 668,4096,32768 --depths 0,0.5,1 --trials 4 --threads 1
  # the store at the top layer, from the same stage-1 weights (its own gate and temperature fresh)
  memzoo train memorizing $M memory.knn_layer=3 name=mem-top task.init_from=results/exp4/runs/memorizing-s0-c1 \
      task.init_backbone_only=true task.key_segments_back=[0,1,2,3] task.lengths=[636,668] train.steps=600 \
      train.bptt_segments=8 $C
fi
# Then (reported as `rmt` after 500 more): stage 4 again from rmt-b,
#   memzoo train rmt memory.n_mem_tokens=8 name=rmt-c task.init_from=results/exp6/rmt-b \
#       task.key_segments_back=[0,1,2,3,4,5,6,7] task.lengths=[1148,1180,1212] train.steps=500 train.bptt_segments=10 $C
