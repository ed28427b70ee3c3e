// Splitting loops over the machine's cores. Small loops stay on the calling thread.
#pragma once

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string_view>

namespace kiln::detail {

// Work below this many elements runs serially: a parallel region costs a few microseconds.
inline constexpr int64_t kParallelGrain = 1 << 15;

// Set on threads that are themselves one of many workers (the data pipeline's): their loops
// stay serial. A second OpenMP team on a machine the first one already fills spins against
// it: measured on 2 cores, a training loop fed by a prefetch thread ran 5x slower.
inline thread_local bool serial_thread = false;

// Kiln's thread count (kiln::set_num_threads, KILN_NUM_THREADS), one for the whole process:
// OpenMP's own setting (omp_set_num_threads) belongs to the thread that made it. 0 until
// first read (src/core/runtime.cpp).
extern std::atomic<int> g_thread_count;
int init_thread_count();
inline int thread_count() {
  const int n = g_thread_count.load(std::memory_order_relaxed);
  return n > 0 ? n : init_thread_count();
}

// The widest vector instructions this CPU has, as Kiln names them: "avx512" (F, BW, DQ, VL,
// CD: OpenBLAS's SkylakeX set), "avx2" (with FMA) or "baseline".
std::string_view cpu_vector_isa();

// OpenBLAS 0.3.21 does not know CPUs newer than itself and runs them on its slowest x86-64
// kernels (Prescott: SSE3, 5x slower sgemm than its AVX-512 ones on a Xeon it does not
// recognise). Re-selects the kernels by the instruction sets the CPU has, once, unless the
// user chose with OPENBLAS_CORETYPE (src/core/runtime.cpp; docs/DESIGN.md).
bool select_blas_kernels();

// Whether denormals flush to zero (kiln::set_flush_denormal): a setting of each thread's
// floating-point control register, so each thread that computes (the caller's, the pool's)
// applies the process-wide choice when it finds its own out of date. One load and compare
// where it is checked: bind, each compiled call, each parallel region's body, each call into
// the libraries. Until set_flush_denormal is first called (-1) Kiln leaves every thread's
// register as it is: another library in the process may have chosen.
extern std::atomic<signed char> g_flush_denormal;  // -1 never set, else 0 or 1
// What this thread applied: -1 nothing yet (a new thread has its creator's register, which
// may be either), else 0 or 1.
inline thread_local signed char t_flush_denormal = -1;
void set_thread_flush_denormal(bool on);
inline void apply_flush_denormal() {
  const signed char want = g_flush_denormal.load(std::memory_order_relaxed);
  if (want >= 0 && t_flush_denormal != want) set_thread_flush_denormal(want == 1);
}
// The pool's threads, which also run OpenBLAS's and oneDNN's own loops: applied in a parallel
// region of n threads when this thread's pool has not seen the latest set_flush_denormal (or
// saw it with a smaller team).
void apply_flush_denormal_to_pool(int n);

// OpenBLAS (the OpenMP build) and oneDNN size their teams from the calling thread's OpenMP
// setting (omp_get_max_threads), so calls into them set it to Kiln's count first. Returns the
// count they will use.
inline int set_library_threads() {
  static const bool blas_kernels = select_blas_kernels();
  (void)blas_kernels;
  apply_flush_denormal();
  if (omp_in_parallel()) return 1;  // both run serially inside a parallel region
  const int n = serial_thread ? 1 : thread_count();
  if (omp_get_max_threads() != n) omp_set_num_threads(n);
  apply_flush_denormal_to_pool(n);
  return n;
}

// How many chunks parallel_for splits n items of this cost into: one (run on the calling
// thread) when the work is small or already runs in parallel, else one per thread.
inline int64_t parallel_chunks(int64_t n, int64_t cost_per_item = 1) {
  const int threads = thread_count();
  if (threads <= 1 || n * cost_per_item < kParallelGrain || omp_in_parallel() || serial_thread)
    return 1;
  return std::min<int64_t>(threads, n);
}

// Calls f(c, begin, end) for each chunk c of [0, n) split into `chunks` contiguous ones (from
// parallel_chunks), in parallel when there are several: chunk c's range depends only on n and
// chunks, so whatever combines per-chunk results in chunk order is deterministic.
template <typename F>
void run_chunks(int64_t n, int64_t chunks, F&& f) {
  if (n <= 0) return;
  if (chunks <= 1) {
    apply_flush_denormal();
    f(int64_t{0}, int64_t{0}, n);
    return;
  }
#pragma omp parallel for num_threads(static_cast <int>(chunks)) schedule(static, 1)
  for (int64_t c = 0; c < chunks; ++c) {
    apply_flush_denormal();
    f(c, n * c / chunks, n * (c + 1) / chunks);
  }
}

// Calls f(begin, end) over [0, n) in contiguous chunks, in parallel when n * cost is large.
template <typename F>
void parallel_for(int64_t n, F&& f, int64_t cost_per_item = 1) {
  run_chunks(n, parallel_chunks(n, cost_per_item),
             [&](int64_t, int64_t begin, int64_t end) { f(begin, end); });
}

}  // namespace kiln::detail
