#!/usr/bin/env bash
# Kiln (jit with the LLVM backend, jit with the interpreter, eager) side by side with PyTorch
# 1.13 eager, each part with 1 and 2 threads: fusion, training steps, scan, per-example
# gradients, compile time and the demo end to end, as docs/PERFORMANCE.md records them.
#   bench/jit_vs_torch.sh [BUILD_DIR] [PART...]   (make bench-jit: bench/jit_vs_torch.sh build)
# PART: fusion train scan vmap compile demo (default: all, in that order).
# Environment: THREADS (default "1 2"), ROUNDS (Kiln/PyTorch alternations, default 3), REPS
# (repetitions per round, default 5), DEMO_REPEATS (default 1), DEMO_FULL=1 (every epoch, not
# only to 91%), PY (the Python with torch, default /usr/bin/python3), JOBS (ninja -j, default
# 2), SKIP_BUILD=1.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
build="$root/build"
if [[ $# -gt 0 && "$1" != fusion && "$1" != train && "$1" != scan && "$1" != vmap &&
      "$1" != compile && "$1" != demo ]]; then
  build="$1"
  shift
fi
parts=("$@")
[[ ${#parts[@]} -gt 0 ]] || parts=(fusion train scan vmap compile demo)
threads="${THREADS:-1 2}"
rounds="${ROUNDS:-3}"
reps="${REPS:-5}"
py="${PY:-/usr/bin/python3}"
"$py" -c 'import torch' 2>/dev/null || py=none

if [[ ! -f "$build/build.ninja" ]]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release
fi
[[ "${SKIP_BUILD:-0}" == 1 ]] || ninja -C "$build" -j "${JOBS:-2}" bench_fusion bench_train \
  bench_scan bench_vmap bench_compile demo

section() {
  echo
  echo "=== $* ==="
  echo "# $(date -u +%FT%TZ)  $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?')" \
    " $(uptime | sed 's/.*load/load/')  cores $(nproc --all)"
}

for t in $threads; do
  # Kiln: OMP_NUM_THREADS (its OpenMP pool, OpenBLAS) and KILN_NUM_THREADS; the PyTorch child
  # inherits them and gets --threads t. One thread: OpenBLAS too, as bench/run.sh does.
  export OMP_NUM_THREADS="$t" KILN_NUM_THREADS="$t"
  if [[ "$t" == 1 ]]; then export OPENBLAS_NUM_THREADS=1; else unset OPENBLAS_NUM_THREADS; fi
  common=(--rounds "$rounds" --reps "$reps" --threads "$t" --py "$py")
  for part in "${parts[@]}"; do
    case "$part" in
      fusion)
        section "fusion: chain, softmax, layer norm ($t threads)"
        "$build/bench/bench_fusion" "${common[@]}" ;;
      train)
        section "training step: cnn, mlp, demo cnn ($t threads)"
        "$build/bench/bench_train" "${common[@]}" ;;
      scan)
        section "scan RNN, fwd+bwd ($t threads)"
        "$build/bench/bench_scan" "${common[@]}" --timing-only ;;
      vmap)
        section "per-example gradients, jit(vmap(grad)) vs functorch ($t threads)"
        "$build/bench/bench_vmap" "${common[@]}" ;;
      compile)
        section "compile time, cold and warm KILN_CACHE_DIR ($t threads)"
        "$build/bench/bench_compile" --reps "$reps" ;;
      demo)
        section "the demo to 91% test accuracy, Kiln vs PyTorch ($t threads)"
        /usr/bin/python3 "$here/demo_race.py" --build "$build" --threads "$t" \
          --repeats "${DEMO_REPEATS:-1}" ${DEMO_FULL:+--full} --py "${PY:-/usr/bin/python3}" ;;
      *)
        echo "unknown part $part (fusion train scan vmap compile demo)" >&2
        exit 2 ;;
    esac
  done
done
