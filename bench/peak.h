// The machine's float32 FMA peak: twelve independent chains of fused multiply-adds in the
// widest vectors the CPU has (AVX-512 or AVX2, chosen at run time), per thread CPU time, on
// one or more threads at once. Shared by fma_peak and bench_matmul (which sets products'
// GFLOP/s against the peak measured in the same run).
#pragma once

#include <immintrin.h>
#include <time.h>

#include <algorithm>
#include <optional>
#include <thread>
#include <vector>

namespace bench_peak {

inline double cpu_seconds() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

// One body per instruction set (compiled for it alone): GFLOP/s, 2 per lane per FMA.
#define KILN_FMA_PEAK(name, isa, V, set1, fmadd, lanes)                         \
  __attribute__((target(isa))) inline double name(long iters) {                 \
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

struct Peak {
  const char* isa;  // "AVX-512" or "AVX2"
  double gflops;    // summed over the threads
};

// The best of five runs of `threads` cores each running the chains at the same time;
// std::nullopt on a CPU without AVX2 and FMA.
inline std::optional<Peak> fma_peak(int threads = 1) {
  const bool avx512 = __builtin_cpu_supports("avx512f");
  if (!avx512 && !(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")))
    return std::nullopt;
  double best = 0;
  for (int r = 0; r < 5; ++r) {
    std::vector<double> rates(static_cast<std::size_t>(threads));
    std::vector<std::thread> team;
    for (std::size_t t = 0; t < rates.size(); ++t)
      team.emplace_back(
          [&, t] { rates[t] = avx512 ? peak_avx512(25'000'000) : peak_avx2(50'000'000); });
    for (std::thread& th : team) th.join();
    double sum = 0;
    for (double g : rates) sum += g;
    best = std::max(best, sum);
  }
  return Peak{avx512 ? "AVX-512" : "AVX2", best};
}

}  // namespace bench_peak
