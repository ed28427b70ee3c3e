// The runtime: the caching allocator behind tensor storage (memory_stats, the bound, release,
// concurrency, the retry on allocation failure, ASan poisoning), the one thread count that
// Kiln's loops, OpenBLAS and oneDNN follow from any thread, and the operand copies that the
// kernel calls of one compiled call share.
#include <gtest/gtest.h>
#include <omp.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <numeric>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/allocator.h"
#include "detail/operand_cache.h"
#include "detail/parallel.h"
#include "kiln/kiln.h"
#include "sanitizers.h"
#include "testing.h"
#ifdef KILN_TEST_ASAN
#include <sanitizer/asan_interface.h>
#endif

using namespace kiln;

namespace {

using kiln::testing::expect_error;

constexpr int64_t MiB = int64_t{1} << 20;

// A float32 tensor of exactly `bytes` bytes (a multiple of 4).
Tensor buffer(int64_t bytes) { return empty({bytes / 4}, float32); }

// Each test starts from an empty cache with a known bound and restores the bound after.
class Allocator : public ::testing::Test {
 protected:
  void SetUp() override {
    saved_limit_ = memory_stats().cache_limit;
    detail::set_cache_limit(256 * MiB);
    release_cached_memory();
  }
  void TearDown() override {
    release_cached_memory();
    detail::set_cache_limit(saved_limit_);
  }
  int64_t saved_limit_ = 0;
};

TEST_F(Allocator, FreedLargeBufferIsReusedWithoutAskingTheSystem) {
  const void* first = nullptr;
  {
    const Tensor a = buffer(4 * MiB);
    first = a.raw_data();
  }
  const MemoryStats before = memory_stats();
  EXPECT_EQ(before.bytes_cached, 4 * MiB);
  const Tensor b = buffer(4 * MiB);
  const MemoryStats after = memory_stats();
  EXPECT_EQ(b.raw_data(), first);
  EXPECT_EQ(after.allocations - before.allocations, 1);
  EXPECT_EQ(after.cache_hits - before.cache_hits, 1);
  EXPECT_EQ(after.os_allocations, before.os_allocations);
  EXPECT_EQ(after.os_bytes_allocated, before.os_bytes_allocated);
  EXPECT_EQ(after.bytes_cached, 0);
}

TEST_F(Allocator, ASimilarSizeReusesTheSameBin) {
  // 1,000,000 and 1,040,000 bytes both round up to the 1 MiB bin.
  { const Tensor a = buffer(1'000'000); }
  const MemoryStats before = memory_stats();
  const Tensor b = buffer(1'040'000);
  EXPECT_EQ(memory_stats().cache_hits - before.cache_hits, 1);
  EXPECT_EQ(memory_stats().os_allocations, before.os_allocations);
  // A size in another bin (1.25 MiB) does not take it.
  { const Tensor c = buffer(1'000'000); }
  const Tensor d = buffer(1'100'000);
  EXPECT_EQ(memory_stats().cache_hits - before.cache_hits, 1);
  EXPECT_EQ(memory_stats().bytes_cached, MiB);
}

TEST_F(Allocator, SmallBuffersGoToMalloc) {
  { const Tensor a = buffer(64 * 1024); }
  EXPECT_EQ(memory_stats().bytes_cached, 0);
  const MemoryStats before = memory_stats();
  const Tensor b = buffer(64 * 1024);
  EXPECT_EQ(memory_stats().cache_hits, before.cache_hits);
  EXPECT_EQ(memory_stats().os_allocations - before.os_allocations, 1);
}

// Small blocks: glibc's aligned allocation of a small size is slow, so each thread keeps a few
// freed ones.
TEST_F(Allocator, SmallBuffersAreReusedByTheThreadThatFreedThem) {
  const void* first = nullptr;
  {
    const Tensor a = buffer(1024);
    first = a.raw_data();
  }
  const MemoryStats before = memory_stats();
  {
    const Tensor b = buffer(1000);  // the same 64-byte size
    EXPECT_EQ(b.raw_data(), first);
  }
  EXPECT_EQ(memory_stats().cache_hits - before.cache_hits, 1);
  EXPECT_EQ(memory_stats().os_allocations, before.os_allocations);
  EXPECT_EQ(memory_stats().bytes_cached, 0);  // not the shared cache's bytes
  // Another thread does not take it.
  const void* other = nullptr;
  std::thread([&] { other = buffer(1024).raw_data(); }).join();
  EXPECT_NE(other, first);
  EXPECT_EQ(buffer(1024).raw_data(), first);
}

TEST_F(Allocator, SmallBuffersAreNotKeptAfterAReleaseOrWithCachingOff) {
  { const Tensor a = buffer(512); }
  release_cached_memory();
  const MemoryStats before = memory_stats();
  { const Tensor b = buffer(512); }  // from the system, then kept
  EXPECT_EQ(memory_stats().cache_hits, before.cache_hits);
  EXPECT_EQ(memory_stats().os_allocations - before.os_allocations, 1);
  detail::set_cache_limit(0);  // drops b's block
  { const Tensor c = buffer(512); }
  { const Tensor d = buffer(512); }
  EXPECT_EQ(memory_stats().cache_hits, before.cache_hits);
  EXPECT_EQ(memory_stats().os_allocations - before.os_allocations, 3);
}

TEST_F(Allocator, LiveBuffersAreNeverShared) {
  std::vector<Tensor> live;
  for (int i = 0; i < 4; ++i) live.push_back(buffer(2 * MiB));
  live.erase(live.begin() + 1);  // one goes back to the cache
  for (int i = 0; i < 3; ++i) live.push_back(buffer(2 * MiB));
  std::set<const void*> pointers;
  for (const Tensor& t : live) pointers.insert(t.raw_data());
  EXPECT_EQ(pointers.size(), live.size());
  // Each one holds its own values.
  for (std::size_t i = 0; i < live.size(); ++i) {
    float* p = live[i].data<float>();
    std::fill(p, p + live[i].numel(), static_cast<float>(i));
  }
  for (std::size_t i = 0; i < live.size(); ++i) {
    const float* p = live[i].data<float>();
    EXPECT_TRUE(std::all_of(p, p + live[i].numel(), [&](float v) { return v == float(i); })) << i;
  }
}

TEST_F(Allocator, BytesInUseAndPeakFollowLiveTensors) {
  const int64_t base = memory_stats().bytes_in_use;
  reset_peak_memory_stats();
  EXPECT_EQ(memory_stats().peak_bytes_in_use, base);
  Tensor a = buffer(3 * MiB);
  Tensor small = buffer(1000);
  EXPECT_EQ(memory_stats().bytes_in_use - base, 3 * MiB + 1000);
  a = Tensor();
  // Cached bytes are not in use; the peak remembers the high point.
  EXPECT_EQ(memory_stats().bytes_in_use - base, 1000);
  EXPECT_EQ(memory_stats().peak_bytes_in_use - base, 3 * MiB + 1000);
  reset_peak_memory_stats();
  EXPECT_EQ(memory_stats().peak_bytes_in_use - base, 1000);
  { const Tensor b = buffer(MiB); }
  EXPECT_EQ(memory_stats().peak_bytes_in_use - base, MiB + 1000);
  small = Tensor();
  EXPECT_EQ(memory_stats().bytes_in_use, base);
}

TEST_F(Allocator, CachedBytesStayWithinTheBoundEvictingTheLeastRecentlyFreed) {
  detail::set_cache_limit(3 * MiB);
  std::vector<Tensor> ts;
  for (int i = 0; i < 4; ++i) ts.push_back(buffer(MiB));
  std::vector<const void*> ptrs;
  for (const Tensor& t : ts) ptrs.push_back(t.raw_data());
  const MemoryStats before = memory_stats();
  ts.clear();  // freed in order 0, 1, 2, 3: block 0 is evicted
  const MemoryStats freed = memory_stats();
  EXPECT_EQ(freed.bytes_cached, 3 * MiB);
  EXPECT_EQ(freed.cache_limit, 3 * MiB);
  EXPECT_EQ(freed.os_releases - before.os_releases, 1);
  // The most recently freed come back first.
  for (int i = 3; i >= 1; --i) {
    ts.push_back(buffer(MiB));
    EXPECT_EQ(ts.back().raw_data(), ptrs[static_cast<std::size_t>(i)]) << i;
  }
  EXPECT_EQ(memory_stats().cache_hits - freed.cache_hits, 3);
  ts.push_back(buffer(MiB));
  EXPECT_EQ(memory_stats().os_allocations - freed.os_allocations, 1);
  ts.clear();
  EXPECT_LE(memory_stats().bytes_cached, 3 * MiB);

  // A block larger than the bound is not kept; lowering the bound evicts; 0 disables.
  { const Tensor big = buffer(4 * MiB); }
  EXPECT_EQ(memory_stats().bytes_cached, 3 * MiB);
  detail::set_cache_limit(MiB);
  EXPECT_EQ(memory_stats().bytes_cached, MiB);
  detail::set_cache_limit(0);
  EXPECT_EQ(memory_stats().bytes_cached, 0);
  { const Tensor c = buffer(MiB); }
  EXPECT_EQ(memory_stats().bytes_cached, 0);
}

TEST_F(Allocator, ReleaseReturnsEveryCachedBlock) {
  { const Tensor a = buffer(MiB), b = buffer(2 * MiB), c = buffer(5 * MiB); }
  const MemoryStats before = memory_stats();
  EXPECT_EQ(before.bytes_cached, 8 * MiB);
  release_cached_memory();
  const MemoryStats after = memory_stats();
  EXPECT_EQ(after.bytes_cached, 0);
  EXPECT_EQ(after.os_releases - before.os_releases, 3);
  const Tensor d = buffer(2 * MiB);
  EXPECT_EQ(memory_stats().os_allocations - after.os_allocations, 1);
  EXPECT_EQ(memory_stats().cache_hits, after.cache_hits);
}

// The VmFlags of the mapping that holds address p (/proc/self/smaps), empty when none does.
std::string mapping_flags(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  const auto at = reinterpret_cast<uintptr_t>(p);
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    uintptr_t lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2 && line.find(':') > line.find(' ')) {
      inside = lo <= at && at < hi;
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      return line;
    }
  }
  return "";
}

// A block of 2 MiB or more starts on a huge page and asks for transparent huge pages over its
// whole huge pages (madvise: "hg" among the mapping's flags), unless KILN_HUGE_PAGES=0.
TEST_F(Allocator, BlocksOfHugePagesStartOnOneAndAskForThem) {
  if (!std::filesystem::exists("/sys/kernel/mm/transparent_hugepage"))
    GTEST_SKIP() << "the kernel has no transparent huge pages";
  const char* setting = std::getenv("KILN_HUGE_PAGES");
  const bool on = setting == nullptr || std::string(setting) != "0";
  const Tensor big = buffer(5 * MiB);
  const auto address = reinterpret_cast<uintptr_t>(big.raw_data());
  const std::string flags = mapping_flags(big.raw_data());
  ASSERT_FALSE(flags.empty());
  if (on) {
    EXPECT_EQ(address % static_cast<uintptr_t>(2 * MiB), 0u);
    EXPECT_NE(flags.find(" hg"), std::string::npos) << flags;
  } else {
    EXPECT_EQ(flags.find(" hg"), std::string::npos) << flags;
  }
  // The block works as memory: every byte written and read back.
  float* x = big.data<float>();
  std::iota(x, x + big.numel(), 0.0f);
  EXPECT_EQ(x[big.numel() - 1], static_cast<float>(big.numel() - 1));
}

// block_bytes against the bins written out: 64-byte multiples below 256 KiB, then the
// smallest 2^k * {4, 5, 6, 7} / 4 at or above the request.
TEST(AllocatorBins, SizesRoundUpToBoundedBins) {
  const auto reference = [](std::size_t n) -> std::size_t {
    const std::size_t r = (std::max<std::size_t>(n, 1) + 63) / 64 * 64;
    if (r < (std::size_t{256} << 10)) return r;
    for (int k = 18; k < 62; ++k)
      for (std::size_t m = 4; m <= 7; ++m)
        if ((std::size_t{1} << k) * m / 4 >= r) return (std::size_t{1} << k) * m / 4;
    return 0;
  };
  std::vector<std::size_t> sizes = {0,
                                    1,
                                    63,
                                    64,
                                    65,
                                    262'080,
                                    262'143,
                                    262'144,
                                    262'145,
                                    327'680,
                                    327'681,
                                    1'000'000,
                                    1'835'008,
                                    1'835'009,
                                    std::size_t{40'000'000},
                                    std::size_t{1} << 40};
  for (std::size_t n = 200'000; n < 5'000'000; n += 7'919) sizes.push_back(n);
  for (const std::size_t n : sizes) {
    const std::size_t b = detail::block_bytes(n);
    EXPECT_EQ(b, reference(n)) << n;
    EXPECT_EQ(b % 64, 0u) << n;
    if (n >= (std::size_t{256} << 10)) {
      EXPECT_LE(b - n, n / 4) << n;
    }
  }
  EXPECT_THROW(detail::allocate_block(SIZE_MAX), std::bad_alloc);
}

TEST_F(Allocator, ManyThreadsAllocateAndFreeConcurrently) {
  detail::set_cache_limit(6 * MiB);  // small, so evictions race with reuse too
  const int64_t base = memory_stats().bytes_in_use;
  constexpr int kThreads = 8, kRounds = 150;
  std::atomic<int> corrupted{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([t, &corrupted] {
      std::vector<Tensor> held;
      for (int r = 0; r < kRounds; ++r) {
        // Sizes in several bins, large and small; each buffer holds its owner's mark.
        const int64_t bytes = ((r * 7 + t) % 5 + 1) * 300'000 + (r % 3 == 0 ? 0 : 4000);
        Tensor x = buffer(r % 4 == 0 ? 4096 : bytes);
        const float mark = static_cast<float>(t * 1000 + r);
        float* p = x.data<float>();
        std::fill(p, p + x.numel(), mark);
        held.push_back(std::move(x));
        if (held.size() > 3) {
          const Tensor& old = held.front();
          const float* q = old.data<float>();
          const float want = q[0];
          if (!std::all_of(q, q + old.numel(), [&](float v) { return v == want; }))
            corrupted.fetch_add(1);
          held.erase(held.begin());
        }
      }
    });
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(corrupted.load(), 0);
  EXPECT_EQ(memory_stats().bytes_in_use, base);
  EXPECT_LE(memory_stats().bytes_cached, 6 * MiB);
}

// An allocation that fails releases the cache and tries again: with the address space capped
// just above what the process maps, a request larger than the headroom only fits once the
// cached blocks are unmapped. (Sanitizers reserve terabytes of shadow address space, so the
// cap cannot be set under them.)
TEST_F(Allocator, AFailedAllocationReleasesTheCacheAndRetries) {
#if defined(KILN_TEST_ASAN) || defined(KILN_TEST_TSAN)
  GTEST_SKIP() << "RLIMIT_AS cannot be lowered under a sanitizer";
#else
  { const Tensor a = buffer(64 * MiB), b = buffer(64 * MiB), c = buffer(64 * MiB); }
  ASSERT_EQ(memory_stats().bytes_cached, 192 * MiB);
  const auto mapped_bytes = [] {
    std::ifstream status("/proc/self/status");
    std::string line;
    while (std::getline(status, line))
      if (line.rfind("VmSize:", 0) == 0) return int64_t{std::stoll(line.substr(7))} * 1024;
    return int64_t{0};
  };
  const int64_t mapped = mapped_bytes();
  ASSERT_GT(mapped, 0);
  rlimit saved{};
  ASSERT_EQ(getrlimit(RLIMIT_AS, &saved), 0);
  rlimit capped = saved;
  capped.rlim_cur = static_cast<rlim_t>(mapped + 128 * MiB);
  ASSERT_EQ(setrlimit(RLIMIT_AS, &capped), 0);
  const MemoryStats before = memory_stats();
  bool ok = true;
  std::string error;
  try {
    const Tensor big = buffer(160 * MiB);
  } catch (const std::exception& e) {
    ok = false;
    error = e.what();
  }
  setrlimit(RLIMIT_AS, &saved);
  EXPECT_TRUE(ok) << error;
  EXPECT_EQ(memory_stats().os_releases - before.os_releases, 3);
  // A request that cannot be satisfied even then is still an Error naming the op.
  ASSERT_EQ(setrlimit(RLIMIT_AS, &capped), 0);
  try {
    const Tensor huge = buffer(512 * MiB);
    ok = true;
  } catch (const Error& e) {
    ok = false;
    error = e.what();
  }
  setrlimit(RLIMIT_AS, &saved);
  EXPECT_FALSE(ok);
  EXPECT_NE(error.find("[empty] out of memory"), std::string::npos) << error;
#endif
}

TEST_F(Allocator, CachedBlocksArePoisonedUnderAddressSanitizer) {
#ifndef KILN_TEST_ASAN
  GTEST_SKIP() << "only meaningful in the KILN_SANITIZE build";
#else
  // 1,000,000 bytes in the 1 MiB bin: the slack after the request is poisoned too.
  const char* p = nullptr;
  {
    const Tensor a = buffer(1'000'000);
    p = static_cast<const char*>(a.raw_data());
    EXPECT_FALSE(__asan_address_is_poisoned(p));
    EXPECT_FALSE(__asan_address_is_poisoned(p + 999'999));
    EXPECT_TRUE(__asan_address_is_poisoned(p + 1'000'000));
  }
  EXPECT_TRUE(__asan_address_is_poisoned(p));
  EXPECT_TRUE(__asan_address_is_poisoned(p + 500'000));
  const Tensor b = buffer(1'000'000);
  ASSERT_EQ(b.raw_data(), p);
  EXPECT_FALSE(__asan_address_is_poisoned(p));
  EXPECT_FALSE(__asan_address_is_poisoned(p + 999'999));
  EXPECT_TRUE(__asan_address_is_poisoned(p + 1'000'000));
  // A small block waits poisoned in its thread's list too.
  const char* q = nullptr;
  {
    const Tensor c = buffer(1024);
    q = static_cast<const char*>(c.raw_data());
  }
  EXPECT_TRUE(__asan_address_is_poisoned(q));
  EXPECT_TRUE(__asan_address_is_poisoned(q + 1023));
  const Tensor d = buffer(1024);
  ASSERT_EQ(d.raw_data(), q);
  EXPECT_FALSE(__asan_address_is_poisoned(q));
  EXPECT_FALSE(__asan_address_is_poisoned(q + 1023));
#endif
}

// ---- threads ----------------------------------------------------------------------

// In the sanitizer builds (clang on libgomp) Kiln's own code has no parallel regions: its loops
// run their chunks on the calling thread, and it cannot reach the pool's threads that OpenBLAS and
// oneDNN start (their libraries are built with regions).
#ifdef _OPENMP
#define SKIP_WITHOUT_PARALLEL_REGIONS() (void)0
#else
#define SKIP_WITHOUT_PARALLEL_REGIONS() \
  GTEST_SKIP() << "compiled without parallel regions (clang on libgomp, the sanitizer build)"
#endif

// Restores the thread count a test changes, and IEEE denormals.
class Threads : public ::testing::Test {
 protected:
  void SetUp() override {
#ifdef KILN_TEST_TSAN
    GTEST_SKIP() << "libgomp is not instrumented: its teams look like races to TSan";
#endif
    saved_ = num_threads();
  }
  void TearDown() override {
    if (saved_ > 0) set_num_threads(saved_);
    set_flush_denormal(false);
  }
  int saved_ = 0;
};

// The distinct OpenMP thread numbers that run the chunks of a large detail::parallel_for.
int threads_used() {
  std::mutex mu;
  std::set<int> seen;
  detail::parallel_for(int64_t{1} << 22, [&](int64_t, int64_t) {
    const int id = omp_get_thread_num();
    std::lock_guard lock(mu);
    seen.insert(id);
  });
  return static_cast<int>(seen.size());
}

TEST_F(Threads, ParallelLoopsUseTheCountSetFromAnyThread) {
  SKIP_WITHOUT_PARALLEL_REGIONS();
  set_num_threads(1);
  EXPECT_EQ(num_threads(), 1);
  EXPECT_EQ(threads_used(), 1);
  set_num_threads(2);
  EXPECT_EQ(num_threads(), 2);
  EXPECT_EQ(threads_used(), 2);
  // A thread that never called set_num_threads sees the count too, whatever its own OpenMP
  // setting says.
  int other = 0;
  std::thread([&] {
    omp_set_num_threads(3);
    other = threads_used();
  }).join();
  EXPECT_EQ(other, 2);
  // A count set on another thread holds on this one.
  std::thread([] { set_num_threads(1); }).join();
  EXPECT_EQ(num_threads(), 1);
  EXPECT_EQ(threads_used(), 1);
}

TEST_F(Threads, InvalidCountsAreErrors) {
  for (const int n : {0, -3})
    expect_error([&] { set_num_threads(n); }, "set_num_threads",
                 {"got " + std::to_string(n), "expected >= 1"});
  expect_error([] { set_num_threads(kMaxThreads + 1); }, "set_num_threads",
               {"got " + std::to_string(kMaxThreads + 1), "expected at most 1024"});
  EXPECT_EQ(num_threads(), saved_);
}

std::set<std::string> os_threads() {
  std::set<std::string> ids;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/task"))
    ids.insert(e.path().filename().string());
  return ids;
}

// OS threads started while fn runs on a new thread whose own OpenMP setting is omp_setting.
// A new thread has an OpenMP pool of its own, so any team it starts shows up as new threads.
// New thread ids are counted, not the total: an earlier thread's pool may exit meanwhile.
int threads_started(int omp_setting, const std::function<void()>& fn) {
  int started = 0;
  std::thread([&] {
    omp_set_num_threads(omp_setting);
    const std::set<std::string> before = os_threads();
    fn();
    for (const std::string& id : os_threads()) started += before.count(id) == 0;
  }).join();
  return started;
}

// OpenBLAS and oneDNN size their OpenMP teams from the calling thread's own setting: with the
// count at 1, a matmul and a convolution from a thread whose setting says 4 start no team.
TEST_F(Threads, BlasAndConvolutionFollowTheCountOnAnyThread) {
  const Tensor a = ones({512, 512}), b = ones({512, 512});
  const Tensor x = ones({8, 16, 64, 64}), w = ones({32, 16, 3, 3});
  // The check can see a team: with the count at 2 a convolution starts one. (Its oneDNN
  // primitive, made for 2 threads, must not be reused below.)
  set_num_threads(2);
  EXPECT_GE(threads_started(1, [&] { conv2d(x, w); }), 1);
  set_num_threads(1);
  float mm = 0, conv = 0;
  EXPECT_EQ(threads_started(4, [&] { mm = matmul(a, b).data<float>()[0]; }), 0);
  EXPECT_EQ(threads_started(4, [&] { conv = conv2d(x, w).data<float>()[0]; }), 0);
  EXPECT_EQ(mm, 512.0f);
  EXPECT_EQ(conv, 16.0f * 9.0f);  // 16 channels x 3x3 taps of ones
}

// A thread that runs the jobs it is given, one at a time, for as long as it lives.
class Worker {
 public:
  Worker() : thread_([this] { serve(); }) {}
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;
  ~Worker() {
    run(nullptr);
    thread_.join();
  }
  // Runs job on the worker and waits for it (nullptr: the worker ends).
  void run(std::function<void()> job) {
    std::unique_lock lock(mu_);
    job_ = std::move(job);
    pending_ = true;
    cv_.notify_all();
    cv_.wait(lock, [&] { return !pending_; });
  }

 private:
  void serve() {
    for (;;) {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return pending_; });
      const std::function<void()> job = std::move(job_);
      if (job) job();
      pending_ = false;
      cv_.notify_all();
      if (!job) return;
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::function<void()> job_;
  bool pending_ = false;
  std::thread thread_;
};

// A normal float whose quarter is a denormal: the quarter as IEEE computes it (here in double).
constexpr float kTiny = 1.5e-38f;
const float kQuarterOfTiny = static_cast<float>(static_cast<double>(kTiny) * 0.25);

// Every element of t equals want, bit for bit (printed as bits: printing a float reads it as a
// number, which a denormal is not while flushing).
void expect_all_bits(const Tensor& t, float want, const std::string& what) {
  const std::vector<float> v = t.to_vector<float>();
  const auto differs = std::find_if(v.begin(), v.end(), [&](float e) {
    return std::bit_cast<uint32_t>(e) != std::bit_cast<uint32_t>(want);
  });
  EXPECT_TRUE(differs == v.end()) << what << ": element " << (differs - v.begin())
                                  << " has the bits " << std::hex
                                  << std::bit_cast<uint32_t>(*differs) << ", expected "
                                  << std::bit_cast<uint32_t>(want);
}

// Flushing denormals applies to every thread that computes, whichever thread set it: a thread
// (and its OpenMP pool) made before the change, and one made while it was on, which starts with
// its creator's register. A denormal result becomes 0 (FTZ) and a denormal operand reads as 0
// (DAZ), in oneDNN's matmul, eager and compiled loops on every thread of the pool and a sum of
// a whole tensor; off again, results are IEEE's (the denormal, computed here in double).
TEST_F(Threads, FlushingDenormalsReachesEveryThreadAndTheLibraries) {
  SKIP_WITHOUT_PARALLEL_REGIONS();
  set_num_threads(2);
  const float tiny = kTiny, denormal = kQuarterOfTiny;
  ASSERT_EQ(std::fpclassify(denormal), FP_SUBNORMAL);
  const int64_t n = int64_t{1} << 20;  // chunks on every thread of the pool
  const Tensor x = full({n}, tiny), d = full({n}, denormal);
  const Tensor a = full({256, 256}, tiny), quarter = eye(256) * 0.25f;
  const auto quartered = [](const Tensor& t) { return t * 0.25f; };
  const auto plus_zero = [](const Tensor& t) { return t + 0.0f; };
  const auto whole_sum = [&](bool flush, const std::string& where) {
    const double total = sum(d).item<float>();  // n denormals: a normal number, or 0 read as 0
    const double want = flush ? 0.0 : static_cast<double>(denormal) * static_cast<double>(n);
    EXPECT_NEAR(total, want, 1e-6 * want) << "sum of a whole tensor " << where;
  };
  // What each thread checks. Each first call on a pool after a change meets its threads out of
  // date: the library call's (first on one thread) and the whole-tensor sum's (on another).
  const auto check = [&](bool flush, const std::string& where, bool sum_first = false) {
    const float made = flush ? 0.0f : denormal;
    if (sum_first) whole_sum(flush, where);
    expect_all_bits(matmul(a, quarter), made, "matmul " + where);
    expect_all_bits(quartered(x), made, "eager product " + where);
    expect_all_bits(jit(quartered)(x), made, "compiled product " + where);
    expect_all_bits(plus_zero(d), made, "eager sum with a denormal operand " + where);
    expect_all_bits(jit(plus_zero)(d), made, "compiled sum with a denormal operand " + where);
    whole_sum(flush, where);
  };
  Worker before, before_sum;  // threads, and pools, that exist in IEEE's mode
  before.run([&] { check(false, "before any change"); });
  before_sum.run([&] { check(false, "before any change", true); });
  set_flush_denormal(true);
  EXPECT_TRUE(flush_denormal());
  before.run([&] { check(true, "on a thread made before it was set"); });
  before_sum.run([&] { check(true, "on a thread made before it was set", true); });
  check(true, "on the thread that set it");
  std::optional<Worker> during(std::in_place);  // its register starts as this thread's
  set_flush_denormal(false);
  EXPECT_FALSE(flush_denormal());
  during->run([&] { check(false, "on a thread made while it was on"); });
  before.run([&] { check(false, "off again, on a thread made before"); });
  check(false, "off again");
}

// A thread's pool is brought up to every change, not only to a setting it saw before: here its
// threads followed a change back to IEEE's mode in Kiln's loops, and the change after it must
// reach them before the next library call.
TEST_F(Threads, APoolFollowsEachChangeOfTheDenormalMode) {
  SKIP_WITHOUT_PARALLEL_REGIONS();
  set_num_threads(2);
  const Tensor a = full({256, 256}, kTiny), quarter = eye(256) * 0.25f, x = full({1 << 20}, kTiny);
  Worker t;
  set_flush_denormal(true);
  t.run([&] { expect_all_bits(matmul(a, quarter), 0.0f, "matmul"); });
  set_flush_denormal(false);
  t.run([&] { expect_all_bits(x * 0.25f, kQuarterOfTiny, "product"); });  // its pool follows
  set_flush_denormal(true);
  t.run([&] { expect_all_bits(matmul(a, quarter), 0.0f, "matmul after"); });
}

// On a CPU with AVX2 or AVX-512, Kiln's first BLAS call leaves OpenBLAS on kernels for them,
// not on its SSE3 fallback for CPUs it does not know (unless the user chose with
// OPENBLAS_CORETYPE), and leaves the environment as it was.
TEST(Blas, RunsKernelsForTheInstructionSetsTheCpuHas) {
  if (std::getenv("OPENBLAS_CORETYPE")) GTEST_SKIP() << "the user chose the kernels";
  const Tensor c = matmul(ones({64, 64}), ones({64, 64}));
  EXPECT_EQ(c.data<float>()[0], 64.0f);
  const std::string core = blas_kernels();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    EXPECT_NE(core, "Prescott");
  }
  EXPECT_EQ(std::getenv("OPENBLAS_CORETYPE"), nullptr);
}

TEST(RuntimeEnv, IntegersAreParsedAndInvalidValuesWarnedAboutAndIgnored) {
  EXPECT_EQ(detail::parse_env_int("KILN_NUM_THREADS", nullptr, 1, 1024), std::nullopt);
  EXPECT_EQ(detail::parse_env_int("KILN_NUM_THREADS", "3", 1, 1024), 3);
  EXPECT_EQ(detail::parse_env_int("KILN_ALLOCATOR_CACHE_LIMIT", "0", 0, INT64_MAX), 0);
  for (const char* bad : {"", "abc", "2x", " 4", "0", "-1", "1025", "99999999999999999999"}) {
    ::testing::internal::CaptureStderr();
    EXPECT_EQ(detail::parse_env_int("KILN_NUM_THREADS", bad, 1, 1024), std::nullopt) << bad;
    const std::string warning = ::testing::internal::GetCapturedStderr();
    EXPECT_NE(warning.find("KILN_NUM_THREADS"), std::string::npos) << bad;
    EXPECT_EQ(std::count(warning.begin(), warning.end(), '\n'), 1) << warning;
  }
}

// A copy is made once per source and layout key within a scope, again for anything that differs
// (another tensor, a view at another offset, another key, outside the scope, an inner scope),
// and let go once only the cache holds its source.
TEST(OperandCache, ACopyIsMadeOncePerSourceAndKeyWithinAScope) {
  int made = 0;
  auto copy_of = [&](const Tensor& t, int64_t key) {
    return detail::cached_copy(t, {key}, [&] {
      ++made;
      return t * 2.0f;
    });
  };
  const Tensor a = arange(0, 8, 1, float32), b = arange(0, 8, 1, float32);
  copy_of(a, 1);
  copy_of(a, 1);
  EXPECT_EQ(made, 2) << "outside a scope nothing is kept";
  made = 0;
  std::weak_ptr<Storage> released;
  {
    detail::OperandCacheScope scope;
    const Tensor first = copy_of(a, 1);
    EXPECT_EQ(copy_of(a, 1).raw_data(), first.raw_data());
    EXPECT_EQ(copy_of(reshape(reshape(a, {2, 4}), {8}), 1).raw_data(), first.raw_data())
        << "another handle on the same elements is the same source";
    EXPECT_EQ(made, 1);
    copy_of(a, 2);
    copy_of(b, 1);
    copy_of(slice(a, {{1, 5}}), 1);
    copy_of(slice(a, {{0, 4}}), 1);
    EXPECT_EQ(made, 5) << "another key, tensor or offset is another copy";
    {
      detail::OperandCacheScope inner;
      copy_of(a, 1);
      EXPECT_EQ(made, 6) << "a scope sees only its own copies";
    }
    copy_of(a, 1);
    EXPECT_EQ(made, 6);
    {
      Tensor held = arange(0, 4, 1, float32);
      released = held.storage();
      copy_of(held, 1);
      scope.drop_unheld();
      EXPECT_FALSE(released.expired()) << "kept while its source is held";
    }
    EXPECT_FALSE(released.expired());
    scope.drop_unheld();
    EXPECT_TRUE(released.expired()) << "let go once only the cache holds the source";
    scope.forget(reshape(b, {2, 4}));
    copy_of(b, 1);
    EXPECT_EQ(made, 8) << "forgotten: what shares b's storage is about to be written over";
    {
      detail::OperandCacheOff off;
      copy_of(a, 1);
      {
        detail::OperandCacheScope inner;
        copy_of(a, 1);
        copy_of(a, 1);
      }
      copy_of(a, 1);
      EXPECT_EQ(made, 11) << "off: made on every call, but in a scope opened inside";
    }
    EXPECT_EQ(copy_of(a, 1).data<float>()[3], 6.0f);
    EXPECT_EQ(made, 11) << "the scope's own copies again";
  }
  copy_of(a, 1);
  EXPECT_EQ(made, 12);
}

}  // namespace
