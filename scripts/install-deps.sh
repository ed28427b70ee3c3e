#!/usr/bin/env bash
# Installs the Debian 12 packages Kiln needs, calling apt-get only for what is missing.
#   scripts/install-deps.sh          build, test and demo dependencies
#   scripts/install-deps.sh --demo   only what the library and the demo need (make demo)
#   scripts/install-deps.sh --bench  also the peers the benchmarks compare against
#   scripts/install-deps.sh --clang  also clang 16, libFuzzer and clang's OpenMP (make fuzz, and
#                                    the clang build of the find_package consumer in install-test)
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git
  ccache                 # compiler cache: the several build folders of make test and CI share objects
  libopenblas-openmp-dev # GEMM for matmul and convolution, LAPACK for linalg (OpenMP build: one thread pool)
  libdnnl-dev            # oneDNN: float32 convolutions and their gradients
  llvm-16-dev            # jit's code generator: LLVM 16 and its ORC JIT (src/compiler/)
  libsleef-dev           # SLEEF: vectorised exp, log, tanh, ... (variant picked at run time)
  libfftw3-dev           # FFTW 3: fft, rfft, irfft and their n-dimensional forms
  libopenmpi-dev openmpi-bin  # OpenMPI: pmap's collectives across processes, mpirun for its tests
  zlib1g-dev libpng-dev libjpeg-dev   # data pipeline: gzip'd IDX, PNG, JPEG
  dataset-fashion-mnist  # the demo's data set (/usr/share/datasets/fashion-mnist)
  fortunes               # demo-gpt's default text: 2.5 MB of English (/usr/share/games/fortunes)
)
# Everything else: the tests, benchmarks, Python module and the checks.
[[ "${1:-}" == "--demo" ]] || packages+=(
  libgtest-dev libgmock-dev libbenchmark-dev
  python3-numpy python3-scipy python3-mpmath  # reference values in tests: numpy, scipy, mpmath
  python3-dev python3-pybind11 python3-pytest  # the Python module (python/) and its tests
  python3-mypy           # its stubgen writes the module's type stubs (python/stubs.py)
  python3-venv python3-pip python3-setuptools python3-wheel  # pip install of the package (install-test)
  libdlpack-dev          # DLPack: the Python module exchanges tensors with PyTorch through it
  python3-torch          # the Python tests' DLPack interchange with PyTorch 1.13
  clang-format-14        # Debian 12's clang-format: the layout check (make format-check)
  black flake8           # the Python formatter and linter (make format, make format-check)
)
if [[ "${1:-}" == "--bench" ]]; then
  packages+=(libtorch-dev python3-torch)  # PyTorch 1.13 (C++ and Python) as the peer
fi
if [[ "${1:-}" == "--clang" ]]; then
  # clang 16 (clang 14 lacks std::source_location), libFuzzer, OpenMP for clang
  packages+=(clang-16 libclang-rt-16-dev libomp-16-dev)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
sudo=""
if [[ $(id -u) -ne 0 ]]; then sudo="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
