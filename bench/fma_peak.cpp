// The machine's float32 FMA peak on one core: twelve independent chains of fused multiply-adds
// in the widest vectors the CPU has (AVX-512 or AVX2, chosen at run time), thread CPU time. A
// floor for matmul-bound steps: docs/PERFORMANCE.md compares the MLP step's FLOPs against it.
//   build/bench/fma_peak
#include <immintrin.h>
#include <time.h>

#include <cstdio>

namespace {

double cpu_seconds() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

// One body per instruction set (compiled for it alone): GFLOP/s, 2 per lane per FMA.
#define KILN_FMA_PEAK(name, isa, V, set1, fmadd, lanes)                         \
  __attribute__((target(isa))) double name(long iters) {                        \
    V a[12];                                                                    \
    for (int k = 0; k < 12; ++k) a[k] = set1(0.1f * static_cast<float>(k + 1)); \
    const V m = set1(0.9999f), c = set1(1e-4f);                                 \
    const double t0 = cpu_seconds();                                            \
    for (long i = 0; i < iters; ++i)                                            \
      for (V & x : a) x = fmadd(x, m, c);                                       \
    const double s = cpu_seconds() - t0;                                        \
    volatile float sink = 0; /* keeps the chains alive */                       \
    for (V & x : a) sink = sink + reinterpret_cast<float*>(&x)[0];              \
    return static_cast<double>(iters) * 12 * 2 * lanes / s / 1e9;               \
  }
KILN_FMA_PEAK(peak_avx2, "avx2,fma", __m256, _mm256_set1_ps, _mm256_fmadd_ps, 8)
KILN_FMA_PEAK(peak_avx512, "avx512f", __m512, _mm512_set1_ps, _mm512_fmadd_ps, 16)
#undef KILN_FMA_PEAK

}  // namespace

int main() {
  const bool avx512 = __builtin_cpu_supports("avx512f");
  if (!avx512 && !(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))) {
    std::printf("no AVX2+FMA: no FMA peak to report\n");
    return 0;
  }
  double best = 0;
  for (int r = 0; r < 5; ++r) {
    const double g = avx512 ? peak_avx512(25'000'000) : peak_avx2(50'000'000);
    best = g > best ? g : best;
  }
  std::printf("float32 FMA peak, one core, %s: %.1f GFLOP/s\n", avx512 ? "AVX-512" : "AVX2", best);
}
