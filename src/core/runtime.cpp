// The thread count shared by Kiln's loops, OpenBLAS and oneDNN, and their floating-point mode
// (include/kiln/runtime.h). The memory half of the runtime lives in allocator.cpp.
#include "kiln/runtime.h"

#include <cblas.h>  // openblas_set_num_threads (the OpenMP build)
#include <omp.h>
#include <xmmintrin.h>  // _mm_getcsr, _mm_setcsr

#include <algorithm>
#include <cstdlib>
#include <string_view>

#include "core/allocator.h"
#include "core/interrupt.h"
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

std::string_view cpu_vector_isa() {
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512cd"))
    return "avx512";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "avx2";
  return "baseline";
}

// In DYNAMIC_ARCH builds of OpenBLAS (Debian's) only; weak so that any other build links.
extern "C" {
void gotoblas_dynamic_init() __attribute__((weak));
void gotoblas_dynamic_quit() __attribute__((weak));
}

bool select_blas_kernels() {
  if (std::getenv("OPENBLAS_CORETYPE") || !gotoblas_dynamic_init || !gotoblas_dynamic_quit)
    return false;
  // Its fallback for an x86-64 CPU it cannot name.
  if (std::string_view(openblas_get_corename()) != "Prescott") return false;
  const std::string_view isa = cpu_vector_isa();
  const char* core = isa == "avx512" ? "SKYLAKEX" : isa == "avx2" ? "HASWELL" : nullptr;
  if (!core) return false;
  // OpenBLAS reads the choice from the environment when it initialises; the variable is
  // removed again afterwards, so child processes see the environment they were given.
  setenv("OPENBLAS_CORETYPE", core, 1);
  gotoblas_dynamic_quit();
  gotoblas_dynamic_init();
  unsetenv("OPENBLAS_CORETYPE");
  return true;
}

std::atomic<signed char> g_flush_denormal{-1};
// How many times set_flush_denormal has been called: what a pool is brought up to.
std::atomic<unsigned> g_flush_denormal_changes{0};

void set_thread_flush_denormal(bool on) {
  // FTZ (bit 15): a denormal result is 0; DAZ (bit 6): a denormal operand reads as 0.
  constexpr unsigned kFtzDaz = 0x8040;
  _mm_setcsr(on ? _mm_getcsr() | kFtzDaz : _mm_getcsr() & ~kFtzDaz);
  t_flush_denormal = static_cast<signed char>(on);
}

void apply_flush_denormal_to_pool(int n) {
  // What this thread's pool (libgomp keeps one per thread that starts parallel regions) was
  // last brought up to: the count of changes then, and the team. A count, not the setting: the
  // pool's threads may have followed a change since (in Kiln's loops) and the one after it not.
  struct Applied {
    unsigned changes = 0;
    int team = 0;
  };
  static thread_local Applied applied;
  const unsigned changes = g_flush_denormal_changes.load(std::memory_order_acquire);
  if (changes == 0 || (changes == applied.changes && n <= applied.team)) return;
#pragma omp parallel num_threads(n)
  apply_flush_denormal();
  applied = {changes, changes == applied.changes ? std::max(n, applied.team) : n};
}

}  // namespace detail

void set_flush_denormal(bool on) {
  detail::g_flush_denormal.store(on ? 1 : 0, std::memory_order_relaxed);
  detail::g_flush_denormal_changes.fetch_add(1, std::memory_order_acq_rel);
  detail::apply_flush_denormal();
  if (!omp_in_parallel())
    detail::apply_flush_denormal_to_pool(detail::serial_thread ? 1 : detail::thread_count());
}

bool flush_denormal() { return detail::g_flush_denormal.load(std::memory_order_relaxed) == 1; }

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

void request_interrupt() noexcept { detail::interrupt_pending().store(true); }

void set_interrupt_check(void (*check)()) { detail::interrupt_check().store(check); }

std::string blas_kernels() {
  detail::set_library_threads();  // selects them first
  return openblas_get_corename();
}

}  // namespace kiln
