#!/usr/bin/env bash
# Data-parallel training, Kiln against PyTorch 1.13 DistributedDataParallel, in one
# go: the demo's CNN (examples/demo.cpp, `--model cnn`) with the same global batch and steps on
# 1 process and on 2 processes, each process with 1 thread.
#   bench/dp_race.sh [BUILD_DIR]          (default: build)
# Environment: EPOCHS (default 3), LIMIT (training images per epoch, default 12800, i.e. 200
# steps of 64), BATCH (global batch, default 64), REPEATS (default 1; the variants' order
# rotates between repeats), PY (the Python with torch, default /usr/bin/python3), DATA (the
# Fashion-MNIST directory, default /usr/share/datasets/fashion-mnist).
#
# Variants, each process with KILN_NUM_THREADS = OMP_NUM_THREADS = OPENBLAS_NUM_THREADS = 1:
#   kiln_p1   BUILD/examples/demo --epochs E --limit L --batch-size B
#   kiln_p2   mpirun -np 2 BUILD/examples/demo --data-parallel (same flags; skipped, and said
#             so, when the demo has no --data-parallel)
#   torch_p1  PY bench/ddp_torch.py --procs 1 (plain PyTorch, no DDP)
#   torch_p2  PY bench/ddp_torch.py --procs 2 (DistributedDataParallel, gloo)
# Step time: Kiln's demo prints each epoch's training rate in images/s (the training loop
# only, data waits included, evaluation not); its step time is the batch over the median rate
# of epochs 2..E (epoch 1 compiles). PyTorch's is the mean over (E - 1) x steps-per-epoch timed
# steps after 20 warm-up steps (ddp_torch.py's RESULT line). Table: step ms and images/s per
# variant (median over repeats), speedup of 2 processes over 1 for each side (target for Kiln
# >= 1.7x), and Kiln's step time over DDP's on 2 processes (target <= 0.7x).
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
build="${1:-$root/build}"
epochs="${EPOCHS:-3}"
limit="${LIMIT:-12800}"
batch="${BATCH:-64}"
repeats="${REPEATS:-1}"
py="${PY:-/usr/bin/python3}"
data="${DATA:-/usr/share/datasets/fashion-mnist}"
demo="$build/examples/demo"
mpirun=(mpirun --allow-run-as-root --oversubscribe)
one_thread=(env KILN_NUM_THREADS=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1)
steps_per_epoch=$((limit / batch))
if ((epochs < 2 || steps_per_epoch < 1)); then
  echo "dp_race: EPOCHS must be >= 2 and LIMIT >= BATCH" >&2
  exit 2
fi

out="$(mktemp -d /tmp/kiln_dp_race.XXXXXX)"
trap 'rm -rf "$out"' EXIT

variants=()
if [[ -x "$demo" ]]; then
  variants+=(kiln_p1)
  if "$demo" --help 2>/dev/null | grep -q -- --data-parallel; then
    variants+=(kiln_p2)
  else
    echo "# $demo has no --data-parallel yet: kiln_p2 skipped"
  fi
else
  echo "# no $demo (cmake --build $build --target demo): Kiln skipped"
fi
if "$py" -c 'import torch' 2>/dev/null; then
  variants+=(torch_p1 torch_p2)
else
  echo "# no torch for $py: PyTorch skipped"
fi
((${#variants[@]})) || exit 1

# The command line of a variant, one word per line.
command_of() {
  local demo_flags=(--epochs "$epochs" --limit "$limit" --batch-size "$batch" --data "$data")
  local torch_flags=(--threads 1 --batch-size "$batch" --limit "$limit" --data "$data"
                     --warmup 20 --steps $(((epochs - 1) * steps_per_epoch)))
  case "$1" in
    kiln_p1) printf '%s\n' "${one_thread[@]}" "$demo" "${demo_flags[@]}" --out "$out/$1" ;;
    kiln_p2) printf '%s\n' "${mpirun[@]}" -np 2 -x KILN_NUM_THREADS=1 -x OMP_NUM_THREADS=1 \
               -x OPENBLAS_NUM_THREADS=1 "$demo" --data-parallel "${demo_flags[@]}" \
               --out "$out/$1" ;;
    torch_p1) printf '%s\n' "${one_thread[@]}" "$py" "$here/ddp_torch.py" --procs 1 \
                "${torch_flags[@]}" ;;
    torch_p2) printf '%s\n' "${one_thread[@]}" "$py" "$here/ddp_torch.py" --procs 2 \
                "${torch_flags[@]}" ;;
  esac
}

# The median of numbers, one per line or separated by spaces.
median() { tr ' ' '\n' | grep . | sort -g | awk '{ v[++n] = $1 } END { if (n) print n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2 }'; }

# Runs a variant once; prints its step milliseconds (or nothing when it failed).
step_ms() {
  local name="$1" log="$out/$1.log" cmd
  mapfile -t cmd < <(command_of "$name")
  rm -rf "${out:?}/$name"
  "${cmd[@]}" >"$log" 2>"$out/$name.err"
  local rc=$?
  if [[ "$name" == kiln_* ]]; then
    # "epoch N: ... | S s, R img/s" per epoch (process 0 only), the first one left out; R has
    # four digits where S has one decimal, so the step time is batch / R.
    local rate
    rate="$(awk '/^epoch [0-9]+:/ && $2 != "1:" { n = split($0, p, "|"); split(p[n], f, " "); print f[3] }' "$log" | median)"
    [[ -n "$rate" ]] && awk -v r="$rate" -v b="$batch" 'BEGIN { printf "%.2f\n", b / r * 1000 }'
  else
    awk '/^RESULT/ { printf "%.2f\n", $4 }' "$log"
  fi
  if ((rc != 0)); then
    echo "# $name exited with $rc; last lines of its stderr:" >&2
    tail -n 5 "$out/$name.err" >&2
  fi
}

echo "# dp_race: $(date -u +%FT%TZ), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# demo cnn, global batch $batch, $steps_per_epoch steps per epoch ($limit images), $epochs epochs, 1 thread per process, $repeats repeat(s)"
for v in "${variants[@]}"; do
  echo "# $v: $(command_of "$v" | tr '\n' ' ' | sed "s|$out/|TMP/|g")"
done
declare -A results
for ((r = 0; r < repeats; ++r)); do
  n=${#variants[@]}
  for ((i = 0; i < n; ++i)); do
    v="${variants[$(((i + r) % n))]}"
    t="$(step_ms "$v")"
    echo "#   repeat $((r + 1)) $v: ${t:-failed} ms/step (load $(cut -d' ' -f1 /proc/loadavg))"
    [[ -n "$t" ]] && results[$v]+="$t "
  done
done

declare -A med
for v in kiln_p1 kiln_p2 torch_p1 torch_p2; do
  med[$v]="$(median <<<"${results[$v]:-}")"
done
ratio() { [[ -n "$1" && -n "$2" ]] && awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2fx", a / b }' || echo -; }

echo
printf '%-9s %6s %12s %10s %14s %12s\n' variant procs "step ms" "img/s" "2 vs 1 procs" "Kiln / DDP"
for v in kiln_p1 kiln_p2 torch_p1 torch_p2; do
  [[ -n "${med[$v]}" ]] || { printf '%-9s %6s %12s\n' "$v" "${v: -1}" "not run"; continue; }
  speedup=-
  [[ "$v" == *_p2 ]] && speedup="$(ratio "${med[${v%_p2}_p1]}" "${med[$v]}")"
  vs=-
  [[ "$v" == kiln_p2 ]] && vs="$(ratio "${med[kiln_p2]}" "${med[torch_p2]}")"
  [[ "$v" == kiln_p1 ]] && vs="$(ratio "${med[kiln_p1]}" "${med[torch_p1]}")"
  printf '%-9s %6s %12.2f %10.0f %14s %12s\n' "$v" "${v: -1}" "${med[$v]}" \
    "$(awk -v t="${med[$v]}" -v b="$batch" 'BEGIN { print b / t * 1000 }')" "$speedup" "$vs"
done
echo "# step ms: median over repeats; 2 vs 1 procs: p1 step time / p2 step time (Kiln target >= 1.7x);"
echo "# Kiln / DDP: Kiln's step time over PyTorch's, same process count (2 processes: target <= 0.7x)"
echo "# load at the end $(cut -d' ' -f1-3 /proc/loadavg)"
