#!/usr/bin/env bash
# Builds the benchmark targets and runs every benchmark, printing the tables that
# docs/PERFORMANCE.md records.
#   bench/run.sh [BUILD_DIR]        (make bench calls: bench/run.sh build)
# Environment: REPS (Google Benchmark repetitions, default 5), PY (the Python with torch,
# default /usr/bin/python3), JOBS (ninja -j, default 1), SKIP_BUILD=1.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
build="${1:-$root/build}"
reps="${REPS:-5}"
py="${PY:-/usr/bin/python3}"
jobs="${JOBS:-1}"

if [[ ! -f "$build/build.ninja" ]]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release
fi
targets=(bench_eager bench_matmul bench_jit bench_ad)
[[ -f "$here/bench_data.cpp" ]] && grep -q bench_data "$here/CMakeLists.txt" && targets+=(bench_data)
targets+=(bench_train)
[[ "${SKIP_BUILD:-0}" == 1 ]] || ninja -C "$build" -j "$jobs" "${targets[@]}"

gb=(--benchmark_repetitions="$reps" --benchmark_enable_random_interleaving=true
    --benchmark_report_aggregates_only=true --benchmark_counters_tabular=true)
median_only() { grep -v -E '_(mean|stddev|cv) ' || true; }

section() {
  echo
  echo "=== $* ==="
  echo "# $(date -u +%FT%TZ)  $(uptime | sed 's/.*load/load/')  nproc $(nproc)"
}

section "eager: small-op overhead and 10^7-element bandwidth (Kiln vs libtorch C++)"
"$build/bench/bench_eager" "${gb[@]}" | median_only

section "matmul: float32 on each GEMM backend, against the FMA peak"
"$build/bench/bench_matmul"

section "jit: cached-call overhead and MLP forward, jit vs eager"
"$build/bench/bench_jit" "${gb[@]}" | median_only

section "AD: correctness checks"
"$build/bench/bench_ad" --check

section "AD: training step, HVP, checkpoint (Kiln; libtorch C++ in the same process)"
"$build/bench/bench_ad" "${gb[@]}" | median_only

# PyTorch from Python. Debian's python3-torch uses the generic libblas.so.3 (OpenBLAS,
# pthreads build), whose spinning threads fight torch's OpenMP threads on a 2-core machine;
# the peer is therefore also run with OpenBLAS single-threaded and with the OpenMP build of
# OpenBLAS preloaded (the configuration Kiln itself links), and the best figure is the peer.
if "$py" -c 'import torch' 2>/dev/null; then
  omp_blas=/usr/lib/x86_64-linux-gnu/openblas-openmp/libblas.so.3
  section "AD: PyTorch (Python) peers, as installed"
  "$py" "$here/torch_peers.py"
  section "AD: PyTorch (Python) peers, OPENBLAS_NUM_THREADS=1"
  OPENBLAS_NUM_THREADS=1 "$py" "$here/torch_peers.py"
  if [[ -f "$omp_blas" ]]; then
    section "AD: PyTorch (Python) peers, LD_PRELOAD=$omp_blas"
    LD_PRELOAD="$omp_blas" "$py" "$here/torch_peers.py"
  fi
else
  echo "(no torch for $py: skipping the PyTorch peers)"
fi

# The same AD cases with one thread on each side: on a loaded 2-core machine a 2-thread
# OpenMP region waits for whichever thread the scheduler parked, so these are steadier.
section "AD, one thread: Kiln and libtorch C++ (OMP_NUM_THREADS=1)"
OMP_NUM_THREADS=1 "$build/bench/bench_ad" "${gb[@]}" --benchmark_filter='step|hvp' | median_only
if "$py" -c 'import torch' 2>/dev/null; then
  section "AD, one thread: PyTorch (Python), OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1"
  OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 "$py" "$here/torch_peers.py" --threads 1
fi

if [[ -x "$build/bench/bench_data" ]]; then
  section "data pipeline (bench_data, see docs/PERFORMANCE.md 'Data pipeline')"
  "$build/bench/bench_data"
fi

# One training step, Kiln jit vs PyTorch eager from Python (bench/train_torch.py, run by the
# binary between its rounds, from the same initial parameters and batch). The child inherits
# the environment, so OMP_NUM_THREADS=1 makes torch's OpenMP and its OpenBLAS single-threaded too.
torch_py="$py"
"$py" -c 'import torch' 2>/dev/null || torch_py=none
section "training step: CNN and MLP, Kiln jit vs PyTorch eager"
"$build/bench/bench_train" --rounds 3 --py "$torch_py"
if [[ "$torch_py" != none ]]; then
  # As for the AD peers: the pthreads OpenBLAS of Python torch fights its OpenMP threads.
  section "training step, PyTorch with OPENBLAS_NUM_THREADS=1 (Kiln as above)"
  "$build/bench/bench_train" --rounds 3 --py "env OPENBLAS_NUM_THREADS=1 $py"
fi
section "training step, one thread: OMP_NUM_THREADS=1, torch --threads 1"
OMP_NUM_THREADS=1 "$build/bench/bench_train" --rounds 3 --threads 1 --py "$torch_py"
