#!/usr/bin/env bash
# `gpt --tensor-parallel --mesh data=D,model=M` on 4 processes (docs/DISTRIBUTED.md, "Tensor
# parallelism"): the 2 x 2, 1 x 4 and 4 x 1 meshes, and ZeRO stages 1-3, follow the one-process
# run (training and validation losses within 1e-4 relative), the meshes with dropout too (the
# one-process run's masks);
# stopping after step 20 and resuming on the same mesh
# gives a checkpoint byte-identical to the straight run's; a checkpoint written on one mesh
# continues on another and in one process; meshes that do not fit are usage errors.
#   tests/gpt_tensor_parallel.sh build/examples/gpt [mpirun]
set -euo pipefail
gpt="$1"
mpirun=("${2:-mpirun}" --allow-run-as-root --oversubscribe -np 4)
export OMP_NUM_THREADS=1 KILN_NUM_THREADS=1  # 4 processes on 2 cores: one thread each
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
common=(--layers 2 --heads 4 --d-model 32 --block-size 32 --batch-size 8 --accum 2 --steps 40
        --warmup 5 --eval-every 10 --eval-batches 2 --seed 9 --sample 0)
source "$(dirname "$0")/job_helpers.sh"  # run, same_losses, usage
tp=("${mpirun[@]}" "$gpt" --tensor-parallel)
run "$out/one.log" "$gpt" "${common[@]}" --out "$out/one"
for mesh in data=2,model=2 data=1,model=4 data=4,model=1; do
  run "$out/$mesh.log" "${tp[@]}" --mesh "$mesh" "${common[@]}" --out "$out/$mesh"
  grep -q "tensor-parallel on the mesh" "$out/$mesh.log"
  same_losses "$out/one/metrics.csv" "$out/$mesh/metrics.csv" "mesh $mesh"
done

# ZeRO stages 1-3 on the same 4 processes follow it too.
for stage in 1 2 3; do
  run "$out/z$stage.log" "${mpirun[@]}" "$gpt" --data-parallel --zero "$stage" "${common[@]}" \
    --out "$out/z$stage"
  same_losses "$out/one/metrics.csv" "$out/z$stage/metrics.csv" "ZeRO-$stage on 4 processes"
done

# Dropout: every mesh draws the one-process run's masks, each process its rows and heads.
run "$out/one-drop.log" "$gpt" "${common[@]}" --dropout 0.1 --out "$out/one-drop"
if same_losses "$out/one/metrics.csv" "$out/one-drop/metrics.csv" "dropout" > /dev/null; then
  echo "--dropout 0.1 changed no loss"
  exit 1
fi
for mesh in data=2,model=2 data=1,model=4; do
  run "$out/drop.log" "${tp[@]}" --mesh "$mesh" "${common[@]}" --dropout 0.1 \
    --out "$out/drop-$mesh"
  same_losses "$out/one-drop/metrics.csv" "$out/drop-$mesh/metrics.csv" \
    "mesh $mesh with dropout"
done

run "$out/a.log" "${tp[@]}" --mesh data=2,model=2 "${common[@]}" --stop-after 20 --out "$out/r"
cp -r "$out/r" "$out/r14"
cp -r "$out/r" "$out/r1"
cp -r "$out/r" "$out/rz"
run "$out/b.log" "${tp[@]}" --mesh data=2,model=2 --resume "$out/r" --sample 0
grep -q "resumed from .* after step 20" "$out/b.log"
diff -r "$out/data=2,model=2/checkpoint" "$out/r/checkpoint"
echo "2 x 2: resume gives a checkpoint identical to the straight run's"
run "$out/c.log" "${tp[@]}" --mesh data=1,model=4 --resume "$out/r14" --sample 0
same_losses "$out/data=2,model=2/metrics.csv" "$out/r14/metrics.csv" "1 x 4 resuming 2 x 2"
run "$out/d.log" "$gpt" --resume "$out/r1" --sample 0
same_losses "$out/data=2,model=2/metrics.csv" "$out/r1/metrics.csv" "1 process resuming 2 x 2"
# Each process wrote its own pieces (no gathered checkpoint), and ZeRO-3 continues from them.
test -d "$out/r/checkpoint"
test ! -e "$out/data=2,model=2/checkpoint.safetensors"
run "$out/e.log" "${mpirun[@]}" "$gpt" --data-parallel --zero 3 --resume "$out/rz" --sample 0
same_losses "$out/data=2,model=2/metrics.csv" "$out/rz/metrics.csv" "ZeRO-3 resuming 2 x 2"

usage "holds 6 processes" "${tp[@]}" --mesh data=2,model=3
usage "heads must be divisible" "${tp[@]}" --mesh data=1,model=4 --heads 2 --d-model 32
usage "add it" "$gpt" --mesh data=1,model=1
echo "meshes that do not fit are usage errors"
