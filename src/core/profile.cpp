// Profiles of compiled functions and the machine's peaks they are set against
// (include/kiln/profile.h; the recorder is core/profiling.cpp).
#include "kiln/profile.h"

#include <immintrin.h>
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "core/profiling.h"
#include "kiln/error.h"
#include "kiln/runtime.h"
#include "math/vector_math.h"

namespace kiln {
namespace {

double thread_cpu_seconds() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

double wall_seconds() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

// GFLOP/s of twelve independent chains x = x·m + c in one instruction set's widest vectors,
// per thread CPU second (another process sharing the core does not count against it). Each
// body is compiled for its instruction set alone and chosen at run time.
#define KILN_FMA_CHAINS(name, isa, V, set1, step, lanes)                        \
  __attribute__((target(isa))) double name(long iters) {                        \
    V a[12];                                                                    \
    for (int k = 0; k < 12; ++k) a[k] = set1(0.1f * static_cast<float>(k + 1)); \
    const V m = set1(0.9999f), c = set1(1e-4f);                                 \
    const double t0 = thread_cpu_seconds();                                     \
    for (long i = 0; i < iters; ++i)                                            \
      for (V & x : a) x = step;                                                 \
    const double s = thread_cpu_seconds() - t0;                                 \
    volatile float sink = 0; /* keeps the chains alive */                       \
    for (V & x : a) sink = sink + reinterpret_cast<float*>(&x)[0];              \
    return static_cast<double>(iters) * 12 * 2 * lanes / s / 1e9;               \
  }
KILN_FMA_CHAINS(chains_avx512, "avx512f", __m512, _mm512_set1_ps, _mm512_fmadd_ps(x, m, c), 16)
KILN_FMA_CHAINS(chains_avx2, "avx2,fma", __m256, _mm256_set1_ps, _mm256_fmadd_ps(x, m, c), 8)
// Without FMA a multiply and an add per lane, the same 2 FLOPs.
KILN_FMA_CHAINS(chains_sse, "sse2", __m128, _mm_set1_ps, _mm_add_ps(_mm_mul_ps(x, m), c), 4)
#undef KILN_FMA_CHAINS

// Runs body(t) on `threads` threads at once, best of three rounds of the summed results.
template <typename Body>
double best_of_rounds(int threads, const Body& body) {
  double best = 0;
  for (int round = 0; round < 3; ++round) {
    std::vector<double> rates(static_cast<std::size_t>(threads));
    std::vector<std::thread> team;
    for (std::size_t t = 0; t < rates.size(); ++t)
      team.emplace_back([&, t] { rates[t] = body(t); });
    for (std::thread& th : team) th.join();
    double sum = 0;
    for (double r : rates) sum += r;
    best = std::max(best, sum);
  }
  return best;
}

MachinePeak measure(int threads) {
  MachinePeak p{.threads = threads};
  // The set Kiln runs at (at most the CPU's; KILN_ISA may hold it lower): what its code can reach.
  const math::Isa isa = math::host_isa();
  const bool avx512 = isa >= math::Isa::avx512, avx2 = isa >= math::Isa::avx2;
  p.isa = avx512 ? "avx512" : avx2 ? "avx2" : "sse";
  p.fma_gflops = best_of_rounds(threads, [&](std::size_t) {
    return avx512 ? chains_avx512(10'000'000)
           : avx2 ? chains_avx2(20'000'000)
                  : chains_sse(40'000'000);
  });
  // Buffers far larger than the caches, touched once before timing (first-touch page faults
  // are not bandwidth); the copy is glibc's memcpy, which streams large blocks. 24 MiB each,
  // smaller beyond 10 threads, so that the whole measurement takes at most about 512 MiB.
  const std::size_t kBytes = std::max<std::size_t>(
      std::size_t{4} << 20,
      std::min<std::size_t>(std::size_t{24} << 20,
                            (std::size_t{512} << 20) / (2 * static_cast<std::size_t>(threads))));
  std::vector<std::unique_ptr<char[]>> buffers;
  for (int t = 0; t < 2 * threads; ++t) {
    buffers.emplace_back(new char[kBytes]);
    std::memset(buffers.back().get(), t, kBytes);
  }
  p.copy_gbps = best_of_rounds(threads, [&](std::size_t t) {
    char* dst = buffers[2 * t].get();
    const char* src = buffers[2 * t + 1].get();
    const double t0 = wall_seconds();
    for (int rep = 0; rep < 4; ++rep) std::memcpy(dst, src, kBytes);
    return 4.0 * 2 * static_cast<double>(kBytes) / (wall_seconds() - t0) / 1e9;
  });
  return p;
}

}  // namespace

MachinePeak machine_peak(int threads) {
  if (threads < 1 || threads > kMaxThreads)
    fail("machine_peak", "thread count out of range: got ", threads, ", expected 1 to ",
         kMaxThreads);
  // Never destroyed: KILN_PROFILE's table is printed at exit, after static objects made later
  // than its atexit handler are gone.
  struct Measured {
    std::mutex mutex;
    std::map<int, MachinePeak> peaks;
  };
  static auto* measured = new Measured;
  std::lock_guard lock(measured->mutex);
  auto it = measured->peaks.find(threads);
  if (it == measured->peaks.end()) it = measured->peaks.emplace(threads, measure(threads)).first;
  return it->second;
}

int64_t ProfileRow::later_calls() const {
  return calls > 1 ? calls - 1 : std::max<int64_t>(calls, 1);
}

double ProfileRow::later_seconds() const { return calls > 1 ? seconds - first_seconds : seconds; }

void start_profile() { detail::begin_profile(); }

Profile stop_profile() {
  Profile p;
  p.rows = detail::take_profile();
  if (!p.rows.empty()) p.peak = machine_peak(num_threads());
  return p;
}

std::string Profile::table() const {
  std::string out;
  auto line = [&](const char* format, auto... args) {
    char buf[512];
    std::snprintf(buf, sizeof buf, format, args...);
    out += buf;
  };
  if (rows.empty()) return "kiln profile: no compiled function ran\n";
  line("kiln profile: %d thread%s, %s; FMA peak %.1f GFLOP/s, copy %.1f GB/s (measured now)\n",
       peak.threads, peak.threads == 1 ? "" : "s", peak.isa.c_str(), peak.fma_gflops,
       peak.copy_gbps);
  for (std::size_t b = 0; b < rows.size();) {
    std::size_t e = b;
    double total = 0, flops = 0, first = 0;
    int64_t calls = 1, later = 1;  // the function's: its first step runs on every call
    while (e < rows.size() && rows[e].function == rows[b].function) {
      total += rows[e].later_seconds();
      first += rows[e].first_seconds;
      calls = std::max(calls, rows[e].calls);
      later = std::max(later, rows[e].later_calls());
      flops += rows[e].flops * static_cast<double>(rows[e].later_calls());
      ++e;
    }
    line("\n@%s: %lld call%s, %.3f ms a call%s", rows[b].function.c_str(),
         static_cast<long long>(calls), calls == 1 ? "" : "s",
         total / static_cast<double>(later) * 1e3, calls > 1 ? " after the first" : "");
    if (flops > 0)
      line(", %.1f GFLOP/s (%.0f%% of peak)", flops / total / 1e9,
           100 * flops / total / 1e9 / peak.fma_gflops);
    line("; the first %.3f ms\n", first * 1e3);
    line("  %5s %9s %6s %8s %5s %7s %5s %9s  %s\n", "step", "ms/call", "share", "GFLOP/s", "%pk",
         "GB/s", "%bw", "first ms", "what");
    for (std::size_t i = b; i < e; ++i) {
      const ProfileRow& r = rows[i];
      const double t = r.later_seconds() / static_cast<double>(r.later_calls());
      const double share = total > 0 ? 100 * r.later_seconds() / total : 0;
      const double gbps = t > 0 ? r.bytes / t / 1e9 : 0;
      line("  %5d %9.3f %5.1f%% ", r.step, t * 1e3, share);
      if (r.flops > 0 && t > 0)
        line("%8.1f %4.0f%% ", r.flops / t / 1e9, 100 * r.flops / t / 1e9 / peak.fma_gflops);
      else
        line("%8s %5s ", "-", "");
      line("%7.2f %4.0f%% %9.3f  %s", gbps, 100 * gbps / peak.copy_gbps, r.first_seconds * 1e3,
           r.fused ? "fused " : "");
      out += r.what + "\n";  // any length
    }
    b = e;
  }
  return out;
}

}  // namespace kiln
