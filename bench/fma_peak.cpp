// The machine's float32 FMA peak on one core (bench/peak.h). A floor for matmul-bound steps:
// docs/PERFORMANCE.md compares the MLP step's FLOPs against it.
//   build/bench/fma_peak
#include <cstdio>

#include "peak.h"

int main() {
  const auto peak = bench_peak::fma_peak(1);
  if (!peak) {
    std::printf("no AVX2+FMA: no FMA peak to report\n");
    return 0;
  }
  std::printf("float32 FMA peak, one core, %s: %.1f GFLOP/s\n", peak->isa, peak->gflops);
}
