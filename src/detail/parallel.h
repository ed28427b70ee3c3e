// Splitting loops over the machine's cores. Small loops stay on the calling thread.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>

namespace kiln::detail {

// Work below this many elements runs serially: a parallel region costs a few microseconds.
inline constexpr int64_t kParallelGrain = 1 << 15;

// Set on threads that are themselves one of many workers (the data pipeline's): their loops
// stay serial. A second OpenMP team on a machine the first one already fills spins against
// it: measured on 2 cores, a training loop fed by a prefetch thread ran 5x slower.
inline thread_local bool serial_thread = false;

// Calls f(begin, end) over [0, n) in contiguous chunks, in parallel when n * cost is large.
template <typename F>
void parallel_for(int64_t n, F&& f, int64_t cost_per_item = 1) {
  if (n <= 0) return;
  const int threads = omp_get_max_threads();
  if (threads <= 1 || n * cost_per_item < kParallelGrain || omp_in_parallel() || serial_thread) {
    f(int64_t{0}, n);
    return;
  }
  const int64_t chunks = std::min<int64_t>(threads, n);
#pragma omp parallel for num_threads(static_cast <int>(chunks)) schedule(static, 1)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t b = n * c / chunks, e = n * (c + 1) / chunks;
    f(b, e);
  }
}

}  // namespace kiln::detail
