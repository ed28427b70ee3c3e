#!/usr/bin/env bash
# `gpt --data-parallel` on N processes (docs/DISTRIBUTED.md, "Data-parallel training") follows
# the one-process run: the same windows split N ways and the gradients averaged give the same
# training and validation losses up to float32 round-off (1e-4 relative here); one process's
# output only; stopping after step 20 and resuming on N processes gives a checkpoint
# byte-identical to the straight N-process run's; the N-process checkpoint continues in one
# process without mpirun; a batch size that N does not divide is a usage error.
#   tests/gpt_data_parallel.sh build/examples/gpt 2 [mpirun]
set -euo pipefail
gpt="$1"
np="$2"
mpirun=("${3:-mpirun}" --allow-run-as-root --oversubscribe -np "$np")
# One thread per process: N processes of the default thread count on a 2-core machine spin
# against each other.
export OMP_NUM_THREADS=1 KILN_NUM_THREADS=1
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
common=(--layers 2 --heads 2 --d-model 32 --block-size 32 --batch-size 6 --accum 2 --steps 40
        --warmup 5 --eval-every 10 --eval-batches 2 --seed 5 --sample 0)
source "$(dirname "$0")/job_helpers.sh"  # run, same_losses
run "$out/one.log" "$gpt" "${common[@]}" --out "$out/one"
run "$out/straight.log" "${mpirun[@]}" "$gpt" --data-parallel "${common[@]}" --out "$out/straight"
grep -q "data-parallel on $np processes" "$out/straight.log"
# Process 0 alone prints: one summary per evaluation, one final line. (Not anchored at the line's
# start: mpirun forwards stdout and stderr separately, so a progress bar's text may precede them.)
count() { grep -c "$1" "$2" || true; }
if [[ "$(count 'step 40: train loss' "$out/straight.log")" != 1 ||
      "$(count 'done after 40 of 40 steps' "$out/straight.log")" != 1 ]]; then
  cat "$out/straight.log"
  echo "expected one summary of step 40 and one final line from process 0"
  exit 1
fi
same_losses "$out/one/metrics.csv" "$out/straight/metrics.csv" "$np processes against 1"

run "$out/first.log" "${mpirun[@]}" "$gpt" --data-parallel "${common[@]}" --stop-after 20 \
  --out "$out/resumed"
cp -r "$out/resumed" "$out/single"
run "$out/second.log" "${mpirun[@]}" "$gpt" --data-parallel --resume "$out/resumed" --sample 0
grep -q "resumed from .* after step 20" "$out/second.log"
cmp "$out/straight/checkpoint.safetensors" "$out/resumed/checkpoint.safetensors"
echo "$np processes: resume gives a checkpoint identical to the straight run's"

run "$out/single.log" "$gpt" --resume "$out/single" --sample 0
grep -q "resumed from .* after step 20" "$out/single.log"
same_losses "$out/straight/metrics.csv" "$out/single/metrics.csv" \
  "1 process resuming $np processes' step 20"

# The batch size counts sequences over all processes: N must divide it.
if "${mpirun[@]}" "$gpt" --data-parallel --batch-size 7 > "$out/usage.log" 2>&1; then
  echo "--batch-size 7 on $np processes should fail"
  exit 1
fi
test "$(grep -c 'must be divisible by the' "$out/usage.log")" -eq 1
