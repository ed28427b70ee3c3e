#!/usr/bin/env bash
# `gpt --data-parallel --zero S` on N processes (docs/DISTRIBUTED.md, "Sharded training"): each
# ZeRO stage follows the one-process run (training and validation losses within 1e-4
# relative); stopping after step 20 and resuming under the same stage gives a checkpoint
# byte-identical to the straight run's; a checkpoint written under one layout continues under
# another (ZeRO-3 -> one process, ZeRO-3 -> plain data parallelism, plain -> ZeRO-2) with the
# straight run's losses; bad --zero values are usage errors.
#   tests/gpt_zero.sh build/examples/gpt 2 [mpirun]
set -euo pipefail
gpt="$1"
np="$2"
mpirun=("${3:-mpirun}" --allow-run-as-root --oversubscribe -np "$np")
export OMP_NUM_THREADS=1 KILN_NUM_THREADS=1  # N processes on 2 cores: one thread each
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
common=(--layers 2 --heads 2 --d-model 32 --block-size 32 --batch-size 6 --steps 40
        --warmup 5 --eval-every 10 --eval-batches 2 --seed 7 --sample 0)
source "$(dirname "$0")/job_helpers.sh"  # run, same_losses, usage
dp=("${mpirun[@]}" "$gpt" --data-parallel)
run "$out/one.log" "$gpt" "${common[@]}" --out "$out/one"
for stage in 1 2 3; do
  run "$out/z$stage.log" "${dp[@]}" --zero "$stage" "${common[@]}" --out "$out/z$stage"
  grep -q "data-parallel on $np processes, ZeRO stage $stage" "$out/z$stage.log"
  same_losses "$out/one/metrics.csv" "$out/z$stage/metrics.csv" "ZeRO-$stage on $np processes"
  run "$out/a$stage.log" "${dp[@]}" --zero "$stage" "${common[@]}" --stop-after 20 \
    --out "$out/r$stage"
  run "$out/b$stage.log" "${dp[@]}" --zero "$stage" --resume "$out/r$stage" --sample 0
  grep -q "resumed from .* after step 20" "$out/b$stage.log"
  diff -r "$out/z$stage/checkpoint" "$out/r$stage/checkpoint"
  echo "ZeRO-$stage: resume gives a checkpoint identical to the straight run's"
done

# Any layout continues any other's checkpoint.
run "$out/c.log" "${dp[@]}" --zero 3 "${common[@]}" --stop-after 20 --out "$out/from3"
cp -r "$out/from3" "$out/from3dp"
run "$out/d.log" "$gpt" --resume "$out/from3" --sample 0
same_losses "$out/z3/metrics.csv" "$out/from3/metrics.csv" "1 process resuming ZeRO-3's step 20"
run "$out/e.log" "${dp[@]}" --resume "$out/from3dp" --sample 0
same_losses "$out/z3/metrics.csv" "$out/from3dp/metrics.csv" \
  "data parallelism resuming ZeRO-3's step 20"
run "$out/f.log" "${dp[@]}" "${common[@]}" --stop-after 20 --out "$out/fromdp"
run "$out/g.log" "${dp[@]}" --zero 2 --resume "$out/fromdp" --sample 0
same_losses "$out/z2/metrics.csv" "$out/fromdp/metrics.csv" "ZeRO-2 resuming data parallelism"

usage "must be 1, 2 or 3" "$gpt" --data-parallel --zero 4
usage "add --data-parallel" "$gpt" --zero 2
echo "bad --zero values are usage errors"
