// The thread count shared by Kiln's loops, OpenBLAS and oneDNN (include/kiln/runtime.h). The
// memory half of the runtime lives in allocator.cpp.
#include "kiln/runtime.h"

#include <cblas.h>  // openblas_set_num_threads (the OpenMP build)
#include <omp.h>

#include <algorithm>
#include <cstdlib>

#include "core/allocator.h"
#include "detail/parallel.h"
#include "kiln/error.h"

namespace kiln {
namespace detail {

std::atomic<int> g_thread_count{0};

int init_thread_count() {
  static const int initial = [] {
    if (auto n = parse_env_int("KILN_NUM_THREADS", std::getenv("KILN_NUM_THREADS"), 1, kMaxThreads))
      return static_cast<int>(*n);
    return std::clamp(omp_get_max_threads(), 1, kMaxThreads);
  }();
  // A set_num_threads that ran first wins.
  int expected = 0;
  return g_thread_count.compare_exchange_strong(expected, initial) ? initial : expected;
}

}  // namespace detail

void set_num_threads(int n) {
  if (n < 1) fail("set_num_threads", "invalid thread count: got ", n, ", expected >= 1");
  if (n > kMaxThreads)
    fail("set_num_threads", "invalid thread count: got ", n, ", expected at most ", kMaxThreads);
  detail::g_thread_count.store(n, std::memory_order_relaxed);
  // The calling thread's own settings too, for code that asks OpenMP or OpenBLAS directly;
  // Kiln's calls into them set it on whichever thread makes them (detail::set_library_threads).
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
}

int num_threads() { return detail::thread_count(); }

}  // namespace kiln
