#!/usr/bin/env bash
# A sharded checkpoint is complete or absent, never a mix of steps (docs/CHECKPOINTS.md,
# "Sharded checkpoints"): `gpt --data-parallel --zero 3` on 2 processes, checkpointing every 2
# steps, has one of its processes killed (SIGKILL) at three moments after its first
# checkpoint; each time the run resumes in one process from what is on disk and its losses,
# before and after the resume, equal the uninterrupted run's (1e-4 relative).
#   tests/gpt_sharded_kill.sh build/examples/gpt [mpirun]
set -euo pipefail
gpt="$(readlink -f "$1")"
mpirun=("${2:-mpirun}" --allow-run-as-root --oversubscribe -np 2)
export OMP_NUM_THREADS=1 KILN_NUM_THREADS=1
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
common=(--layers 2 --heads 2 --d-model 32 --block-size 32 --batch-size 4 --steps 400 --warmup 5
        --eval-every 2 --eval-batches 1 --seed 3 --sample 0)
"${mpirun[@]}" "$gpt" --data-parallel --zero 3 "${common[@]}" --out "$out/straight" \
  > "$out/straight.log" 2>&1 || { cat "$out/straight.log"; exit 1; }
mid=0  # kills that interrupted the training
# Kill at three moments after the first checkpoint (whatever start-up takes: under the
# sanitizers it is seconds).
for delay in 0.1 0.3 0.6; do
  run="$out/killed-$delay"
  "${mpirun[@]}" "$gpt" --data-parallel --zero 3 "${common[@]}" --out "$run" > "$run.log" 2>&1 &
  launcher=$!
  for _ in $(seq 1200); do
    [[ -e "$run/metrics.csv" ]] && break
    sleep 0.05
  done
  sleep "$delay"
  # One of the two gpt processes (not mpirun), by the executable it runs.
  victim=""
  for pid in $(pgrep -f -- "--out $run" || true); do
    [[ "$(readlink -f "/proc/$pid/exe" 2>/dev/null)" == "$gpt" ]] && victim="$pid"
  done
  [[ -n "$victim" ]] && kill -9 "$victim"
  if wait "$launcher"; then
    echo "$delay s after the first checkpoint: the run had ended before it could be killed"
    continue
  fi
  if ! "$gpt" --resume "$run" --sample 0 > "$run.resume.log" 2>&1; then
    cat "$run.log" "$run.resume.log"
    echo "after ${delay} s: the checkpoint left on disk does not load"
    exit 1
  fi
  step="$(grep -o 'resumed from .* after step [0-9]*' "$run.resume.log" | grep -o '[0-9]*$')"
  (( step < 400 )) && mid=$((mid + 1))
  # Every evaluation the run recorded equals the uninterrupted run's at the same step (process
  # 0 killed between committing a checkpoint and writing metrics.csv loses that one row).
  awk -F, -v delay="$delay" -v step="$step" '
    FNR == 1 { next }
    NR == FNR { train[$1] = $2; val[$1] = $3; next }
    { for (c = 2; c <= 3; ++c) {
        want = c == 2 ? train[$1] : val[$1]; d = ($c - want) / want; if (d < 0) d = -d
        if (d > w) w = d }
      rows++ }
    END { printf "killed %s s after the first checkpoint, resumed after step %s: " \
                 "%d evaluations within %.1e\n", delay, step, rows, w
          exit !(rows >= 199 && w < 1e-4) }' "$out/straight/metrics.csv" "$run/metrics.csv"
done
if (( mid == 0 )); then
  echo "no kill landed during training: nothing was checked"
  exit 1
fi
