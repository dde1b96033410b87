#!/bin/bash
# Two suites started together from the checkout $1 for $2 seconds (label $3); prints each one's step after that time.
code=$1; secs=$2; tag=$3
rm -rf /tmp/sens/two-$tag; pids=()
for i in 1 2; do
  (cd /tmp && PYTHONPATH=$code exec python -m memzoo compare quick "methods=[armt]" "seeds=[0]" out_dir=/tmp/sens/two-$tag/$i --jobs 1 --no-report > /tmp/sens/two-$tag-$i.log 2>&1) &
  pids+=($!)
done
sleep $secs
for i in 1 2; do echo "$tag suite $i: $(cat /tmp/sens/two-$tag/$i/quick/runs/armt-s0/progress.json 2>/dev/null)"; done
for p in ${pids[@]}; do pkill -TERM -P $p; kill $p 2>/dev/null; done
