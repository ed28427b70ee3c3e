#!/usr/bin/env bash
# `demo --data-parallel` on N processes (docs/DISTRIBUTED.md, "Data-parallel training"): a short run
# reaches a sane test accuracy with one process's output only; stopping after epoch 1 and
# resuming on N processes gives a checkpoint byte-identical to the straight run's; the N-process
# checkpoint of epoch 1 continues in one process without mpirun; --dtype f16 trains; a batch
# size that N does not divide is a usage error.
#   tests/demo_data_parallel.sh build/examples/demo 2 [mpirun]
set -euo pipefail
demo="$1"
np="$2"
mpirun=("${3:-mpirun}" --allow-run-as-root --oversubscribe -np "$np")
# One thread per process: N processes of the default thread count on a 2-core machine spin
# against each other (3 processes ran 10x slower than with one thread each).
export OMP_NUM_THREADS=1 KILN_NUM_THREADS=1
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
common=(--model mlp --limit 1536 --epochs 2 --batch-size 24 --seed 7)
source "$(dirname "$0")/job_helpers.sh"  # run, same_losses
run "$out/straight.log" "${mpirun[@]}" "$demo" --data-parallel "${common[@]}" --out "$out/straight"
grep -q "data-parallel on $np processes" "$out/straight.log"
# Process 0 alone prints: one final progress line and one summary per epoch.
test "$(grep -c '^epoch 2/2 \[#*\] 100%' "$out/straight.log")" -eq 1
test "$(grep -c '^epoch 2: train loss' "$out/straight.log")" -eq 1
# metrics.csv: epoch,train_loss,train_accuracy,test_loss,test_accuracy,seconds,images_per_second
awk -F, -v np="$np" 'NR == 3 {
    printf "%s processes: test accuracy %.1f%% after 2 epochs\n", np, 100 * $5
    exit !($5 > 0.6) }' "$out/straight/metrics.csv"

run "$out/first.log" "${mpirun[@]}" "$demo" --data-parallel "${common[@]}" --stop-after 1 \
  --out "$out/resumed"
cp -r "$out/resumed" "$out/single"
run "$out/second.log" "${mpirun[@]}" "$demo" --data-parallel --resume "$out/resumed"
grep -q "resumed from .* after epoch 1" "$out/second.log"
cmp "$out/straight/checkpoint.safetensors" "$out/resumed/checkpoint.safetensors"
echo "$np processes: resume gives a checkpoint identical to the straight run's"

# One process continues the N-process run at the same data position (the next batch of 24),
# so its second epoch matches the straight run's up to float32 round-off.
run "$out/single.log" "$demo" --resume "$out/single"
grep -q "resumed from .* after epoch 1" "$out/single.log"
test "$(wc -l < "$out/single/metrics.csv")" -eq 3  # header + 2 epochs
paste -d, "$out/straight/metrics.csv" "$out/single/metrics.csv" | awk -F, 'NR == 3 {
    d = $2 - $9; if (d < 0) d = -d
    printf "1 process after %s: epoch 2 train loss %.5f (straight run %.5f)\n", "'"$np"'", $9, $2
    exit !(d < 1e-3) }'

# Mixed precision trains data-parallel too (f16: the loss scaler skips the same steps on all).
run "$out/f16.log" "${mpirun[@]}" "$demo" --data-parallel "${common[@]}" --dtype f16 --out "$out/f16"
awk -F, -v np="$np" 'NR == 3 {
    printf "%s processes, f16: test accuracy %.1f%% after 2 epochs\n", np, 100 * $5
    exit !($5 > 0.6) }' "$out/f16/metrics.csv"

# The batch size counts images over all processes: N must divide it.
if "${mpirun[@]}" "$demo" --data-parallel --batch-size 25 > "$out/usage.log" 2>&1; then
  echo "--batch-size 25 on $np processes should fail"
  exit 1
fi
test "$(grep -c 'must be divisible by the' "$out/usage.log")" -eq 1
