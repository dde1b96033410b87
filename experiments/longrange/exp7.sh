#!/bin/bash
# Long-range recipe, experiment 7: length generalisation, and why the far keys fail. Run from the repository
# root after exp6.sh (its runs in results/exp6); `$1` picks the branch:
#   rmt     RMT (from exp6's rmt-c) with keys 0-13 segments back at 1,916-1,948 bytes;
#   tau     Memorizing (from exp6's mem-a): mem-b, the temperature τ at 50x the learning rate
#           (stopped at step 110 in the README's run), and mem-c, τ = 32 with the kNN layer's gate
#           and temperature started afresh (task.init_backbone_only);
#   digits  Memorizing from mem-c: 1-digit keys (mem-d), then 2 (mem-e), then 5 (mem-f), keys 0-7
#           segments back, each evaluated (and mem-d, mem-f with the memory-reset ablation);
#   more    250 more steps at 5 digits (mem-g);
#   order   the digits' order: 500 steps at 2 digits from mem-e (mem-h), then 300 at 5 (mem-i);
#   three   400 steps at 3 digits from mem-h (mem-j);
#   full    the full control of exp8-controls.yaml, 250 more steps at 0-7 back.
set -e
C="train.lr=0.001 train.warmup_steps=20 train.weight_decay=0.0 train.log_every=10 train.checkpoint_every=50
   train.threads=1 task.name=passkey task.loss=answer task.lm_fraction=0.25 out_dir=results/exp7"
M="memory.store_size=65536 memory.mem_len=128 memory.top_k=32 memory.gate_lr_mult=20"
M32="$M memory.scale_init=32"  # mem-c's fixed temperature, kept by every run from it
GAPS="task.key_segments_back=[0,1,2,3,4,5,6,7] task.lengths=[1148,1180,1212] train.bptt_segments=10"
P="--depths 0,0.5,1 --threads 1"
case "$1" in
rmt)
  memzoo train rmt memory.n_mem_tokens=8 name=rmt-d task.init_from=results/exp6/rmt-c task.key_digits=5 \
      task.key_segments_back=[0,1,2,3,4,5,6,7,8,9,10,11,12,13] task.lengths=[1916,1948] train.steps=300 \
      train.bptt_segments=16 $C
  memzoo passkey results/exp7/rmt-d --lengths 1948,4096,32768 --trials 4 $P
  memzoo passkey results/exp6/rmt-c --lengths 668,1180 --trials 4 --reset-after-key $P ;;
tau)
  memzoo train memorizing $M memory.scale_lr_mult=50 name=mem-b task.init_from=results/exp6/mem-a \
      task.key_digits=5 train.steps=300 $GAPS $C
  memzoo train memorizing $M32 name=mem-c task.init_from=results/exp6/mem-a \
      task.init_backbone_only=true task.key_digits=5 train.steps=300 $GAPS $C
  memzoo passkey results/exp7/mem-c --lengths 1180,4096,32768 --trials 4 $P ;;
digits)
  memzoo train memorizing $M32 name=mem-d task.key_digits=1 task.init_from=results/exp7/mem-c train.steps=150 $GAPS $C
  memzoo passkey results/exp7/mem-d --key-digits 1 --lengths 1180,4096,32768 --trials 8 $P
  memzoo passkey results/exp7/mem-d --key-digits 1 --lengths 1180,4096 --trials 8 --reset-after-key $P
  memzoo train memorizing $M32 name=mem-e task.key_digits=2 task.init_from=results/exp7/mem-d train.steps=150 $GAPS $C
  memzoo passkey results/exp7/mem-e --key-digits 2 --lengths 1180,4096 --trials 4 $P
  memzoo train memorizing $M32 name=mem-f task.key_digits=5 task.init_from=results/exp7/mem-e train.steps=200 $GAPS $C
  memzoo passkey results/exp7/mem-f --lengths 1180,4096,32768 --trials 4 $P
  memzoo passkey results/exp7/mem-f --lengths 1180,4096,32768 --trials 4 --reset-after-key $P ;;
more)  # after digits and experiments/longrange/exp8-controls.yaml (its runs in results/exp8)
  memzoo train memorizing $M32 name=mem-g task.key_digits=5 task.init_from=results/exp7/mem-f \
      train.steps=250 $GAPS $C
  memzoo passkey results/exp7/mem-g --lengths 1180,4096 --trials 4 $P ;;
order)  # after digits: mem-e's 2-digit answer loss was still falling when its 150 steps ended
  memzoo train memorizing $M32 name=mem-h task.key_digits=2 task.init_from=results/exp7/mem-e train.steps=500 $GAPS $C
  memzoo passkey results/exp7/mem-h --key-digits 2 --lengths 1180,4096,32768 --trials 4 $P
  memzoo passkey results/exp7/mem-h --key-digits 2 --lengths 1180,4096,32768 --trials 4 --reset-after-key $P
  memzoo train memorizing $M32 name=mem-i task.key_digits=5 task.init_from=results/exp7/mem-h train.steps=300 $GAPS $C
  memzoo passkey results/exp7/mem-i --lengths 1180,4096,32768 --trials 4 $P
  memzoo passkey results/exp7/mem-i --lengths 1180,4096,32768 --trials 4 --reset-after-key $P ;;
three)  # after order: 5 digits straight from 2 did not keep the order
  memzoo train memorizing $M32 name=mem-j task.key_digits=3 task.init_from=results/exp7/mem-h train.steps=400 $GAPS $C
  memzoo passkey results/exp7/mem-j --key-digits 3 --lengths 1180,4096,32768 --trials 4 $P
  memzoo passkey results/exp7/mem-j --key-digits 3 --lengths 1180,4096 --trials 4 --reset-after-key $P ;;
full)  # 250 more steps for the full control (the README's run was stopped at its step-250 checkpoint)
  memzoo train full name=full-more task.key_digits=5 task.init_from=results/exp8/longrange-controls/runs/full-s0 \
      train.steps=250 $GAPS $C
  memzoo passkey results/exp7/full-more --lengths 668,1180 --trials 4 $P ;;
*)
  echo "usage: exp7.sh rmt|tau|digits|more|order|three|full" >&2; exit 2 ;;
esac
