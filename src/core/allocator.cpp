// The caching allocator behind tensor storage (allocator.h). glibc hands large blocks straight
// back to the kernel on free (they are mmap'd), so every eager op on a large tensor would pay
// a page fault per page again; freed large blocks wait here instead, binned by size.
#include "core/allocator.h"

#include <malloc.h>
#include <sanitizer/asan_interface.h>  // ASAN_(UN)POISON_MEMORY_REGION: no-ops without ASan
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <limits>
#include <list>
#include <mutex>
#include <new>
#include <unordered_map>

namespace kiln {
namespace detail {
namespace {

constexpr std::size_t round64(std::size_t n) {
  return (std::max<std::size_t>(n, 1) + 63) / 64 * 64;
}

struct Counters {
  std::atomic<int64_t> in_use{0}, peak{0}, allocations{0}, cache_hits{0}, os_allocations{0},
      os_bytes{0}, os_releases{0};
};
Counters counters;  // constant-initialised: usable from any static constructor

struct FreeBlock {
  void* data;
  std::size_t bytes;  // block_bytes of the request it served
};

// KILN_ALLOCATOR_CACHE_LIMIT, else the smaller of 2 GiB and 1/8 of physical memory: room for
// a training step's activations without holding a large share of the machine.
std::size_t initial_limit() {
  if (auto v =
          parse_env_int("KILN_ALLOCATOR_CACHE_LIMIT", std::getenv("KILN_ALLOCATOR_CACHE_LIMIT"), 0,
                        std::numeric_limits<int64_t>::max()))
    return static_cast<std::size_t>(*v);
  return std::min<std::size_t>(std::size_t{2} << 30, physical_memory() / 8);
}

void release_to_system(const FreeBlock& b) noexcept {
  ASAN_UNPOISON_MEMORY_REGION(b.data, b.bytes);
  std::free(b.data);
  counters.os_releases.fetch_add(1, std::memory_order_relaxed);
}

class Cache {
 public:
  // A cached block of exactly `bytes` (a bin size), or nullptr. The most recently freed one:
  // its pages are the likeliest to still be in the CPU's caches and TLB.
  void* take(std::size_t bytes) {
    std::lock_guard lock(mu_);
    const auto bin = bins_.find(bytes);
    if (bin == bins_.end()) return nullptr;
    const auto node = bin->second.back();
    bin->second.pop_back();
    if (bin->second.empty()) bins_.erase(bin);
    void* data = node->data;
    lru_.erase(node);
    cached_ -= bytes;
    return data;
  }

  // Keeps a freed block (poisoned under ASan, so a use after free is still caught), then
  // evicts the least recently freed blocks while over the bound. The system calls run after
  // the lock is released.
  void put(FreeBlock block) noexcept {
    ASAN_POISON_MEMORY_REGION(block.data, block.bytes);
    std::list<FreeBlock> evicted;
    bool kept = false;
    {
      std::lock_guard lock(mu_);
      if (block.bytes <= limit_ && insert(block)) {
        kept = true;
        cached_ += block.bytes;
        while (cached_ > limit_) evict_oldest(evicted);
      }
    }
    if (!kept) release_to_system(block);
    for (const FreeBlock& b : evicted) release_to_system(b);
  }

  // Whether freed blocks are kept at all (a bound of 0 turns every cache off).
  bool caching() const noexcept { return caching_.load(std::memory_order_relaxed); }
  // Sets the bound and evicts down to it.
  void set_limit(std::size_t limit) {
    std::list<FreeBlock> evicted;
    {
      std::lock_guard lock(mu_);
      limit_ = limit;
      caching_.store(limit > 0, std::memory_order_relaxed);
      while (cached_ > limit_) evict_oldest(evicted);
    }
    for (const FreeBlock& b : evicted) release_to_system(b);
  }

  void release_all() noexcept {
    std::list<FreeBlock> evicted;
    {
      std::lock_guard lock(mu_);
      evicted.splice(evicted.end(), lru_);
      bins_.clear();
      cached_ = 0;
    }
    for (const FreeBlock& b : evicted) release_to_system(b);
  }

  struct Sizes {
    std::size_t cached, limit;
  };
  Sizes sizes() {
    std::lock_guard lock(mu_);
    return {cached_, limit_};
  }

 private:
  using Node = std::list<FreeBlock>::iterator;

  // False when the bookkeeping itself cannot allocate: the block then goes to the system.
  bool insert(const FreeBlock& block) noexcept {
    try {
      lru_.push_back(block);
    } catch (const std::bad_alloc&) {
      return false;
    }
    try {
      bins_[block.bytes].push_back(std::prev(lru_.end()));
    } catch (const std::bad_alloc&) {
      lru_.pop_back();
      return false;
    }
    return true;
  }

  // Moves the least recently freed block to `out`. Within a bin blocks are in freeing order
  // too, so it is the front of its bin.
  void evict_oldest(std::list<FreeBlock>& out) noexcept {
    const Node oldest = lru_.begin();
    const auto bin = bins_.find(oldest->bytes);
    bin->second.pop_front();
    if (bin->second.empty()) bins_.erase(bin);
    cached_ -= oldest->bytes;
    out.splice(out.end(), lru_, oldest);
  }

  std::mutex mu_;
  std::list<FreeBlock> lru_;                                // least recently freed first
  std::unordered_map<std::size_t, std::deque<Node>> bins_;  // by block size, oldest first
  std::size_t cached_ = 0;
  std::size_t limit_ = initial_limit();
  std::atomic<bool> caching_{limit_ > 0};
};

// Never destroyed: storage held by static objects may be freed after static destruction began.
// The blocks it holds stay reachable from here, so leak checkers do not report them.
Cache& cache() {
  static Cache* const c = new Cache;
  return *c;
}

// Blocks of at most kSmallBytes: glibc serves a small aligned request on its slow path
// (memalign carves an aligned piece out of a larger chunk, consolidating its fast bins first),
// and a compiled call makes many small kernel outputs. So each thread keeps up to
// kSmallPerSize freed blocks of each 64-byte size, at most kSmallHeld bytes in all, and hands
// them out again, last freed first. A block may be freed on another thread than the one that
// took it: it joins that thread's lists. A thread's blocks go back to the system when it exits.
constexpr std::size_t kSmallBytes = 4096, kSmallHeld = std::size_t{256} << 10;
constexpr std::size_t kSmallPerSize = 8;

struct SmallBlocks {
  std::array<std::array<void*, kSmallPerSize>, kSmallBytes / 64> blocks{};  // by size / 64 - 1
  std::array<std::size_t, kSmallBytes / 64> counts{};
  std::size_t held = 0;

  static std::size_t size_class(std::size_t bytes) { return bytes / 64 - 1; }
  void* take(std::size_t bytes) noexcept {
    std::size_t& n = counts[size_class(bytes)];
    if (n == 0) return nullptr;
    held -= bytes;
    return blocks[size_class(bytes)][--n];
  }
  bool put(void* data, std::size_t bytes) noexcept {
    std::size_t& n = counts[size_class(bytes)];
    if (n == kSmallPerSize || held + bytes > kSmallHeld) return false;
    ASAN_POISON_MEMORY_REGION(data, bytes);
    blocks[size_class(bytes)][n++] = data;
    held += bytes;
    return true;
  }
  void release() noexcept {
    for (std::size_t k = 0; k < blocks.size(); ++k) {
      for (std::size_t i = 0; i < counts[k]; ++i) {
        ASAN_UNPOISON_MEMORY_REGION(blocks[k][i], (k + 1) * 64);
        std::free(blocks[k][i]);
      }
      counts[k] = 0;
    }
    held = 0;
  }
};

// Trivially destructible, so valid for the whole life of its thread; the guard empties it
// when the thread exits, and frees after that (a thread_local destroyed later) skip it.
thread_local SmallBlocks t_small;
enum class SmallState : signed char { unused, open, closed };
thread_local SmallState t_small_state = SmallState::unused;
struct SmallBlocksGuard {
  ~SmallBlocksGuard() {
    t_small_state = SmallState::closed;
    t_small.release();
  }
};
thread_local SmallBlocksGuard t_small_guard;

// This thread's small blocks, or nullptr once it is exiting.
SmallBlocks* small_blocks() noexcept {
  if (t_small_state == SmallState::unused) {
    static_cast<void>(&t_small_guard);  // constructs it, so that it runs at thread exit
    t_small_state = SmallState::open;
  }
  return t_small_state == SmallState::open ? &t_small : nullptr;
}

// Hands the cache's blocks and the calling thread's small ones back to the system.
void release_caches() noexcept {
  cache().release_all();
  if (SmallBlocks* small = small_blocks()) small->release();
}

// Blocks of at least one huge page start on a huge page's boundary, and the huge pages that
// their first request covers whole are offered to the kernel as transparent huge pages
// (MADV_HUGEPAGE; Debian's default gives them only on request). A first touch then faults once
// per 2 MiB instead of once per 4 KiB page, which costs 12-16 us on some virtual machines. The
// rest stays in small pages, so no more memory becomes resident than the request touches.
// KILN_HUGE_PAGES=0 turns this off.
constexpr std::size_t kHugePage = std::size_t{2} << 20;

bool huge_pages() {
  static const bool on =
      parse_env_int("KILN_HUGE_PAGES", std::getenv("KILN_HUGE_PAGES"), 0, 1).value_or(1) == 1;
  return on;
}

// A block of `bytes` (a bin's size) for a request of `used` bytes.
void* aligned_block(std::size_t bytes, std::size_t used) {
  if (used < kHugePage || !huge_pages()) return std::aligned_alloc(64, bytes);
  // aligned_alloc takes a multiple of the alignment; the rounding is never touched.
  void* data = std::aligned_alloc(kHugePage, (bytes + kHugePage - 1) / kHugePage * kHugePage);
  // Advice only: where the kernel has no huge pages to give, the block works as it is.
  if (data != nullptr) madvise(data, used / kHugePage * kHugePage, MADV_HUGEPAGE);
  return data;
}

// A block from the system allocator; on failure the caches are released and the request
// tried once more.
void* system_allocate(std::size_t bytes, std::size_t used) {
  void* data = aligned_block(bytes, used);
  if (data == nullptr) {
    release_caches();
    data = aligned_block(bytes, used);
  }
  if (data == nullptr) throw std::bad_alloc();
  counters.os_allocations.fetch_add(1, std::memory_order_relaxed);
  counters.os_bytes.fetch_add(static_cast<int64_t>(bytes), std::memory_order_relaxed);
  return data;
}

}  // namespace

std::size_t block_bytes(std::size_t nbytes) {
  const std::size_t n = round64(nbytes);
  if (n < kCachedMinBytes) return n;
  const std::size_t quarter = std::bit_floor(n) / 4;
  return (n + quarter - 1) / quarter * quarter;
}

void* allocate_block(std::size_t nbytes) {
  // Beyond this the rounding below would overflow; no system can satisfy such a request.
  if (nbytes > std::numeric_limits<std::size_t>::max() / 4) throw std::bad_alloc();
  const std::size_t bytes = block_bytes(nbytes);
  void* data = nullptr;
  if (bytes >= kCachedMinBytes) {
    data = cache().take(bytes);
  } else if (SmallBlocks* small = bytes <= kSmallBytes ? small_blocks() : nullptr) {
    data = small->take(bytes);
  }
  if (data != nullptr) {
    counters.cache_hits.fetch_add(1, std::memory_order_relaxed);
  } else {
    data = system_allocate(bytes, round64(nbytes));
    ASAN_POISON_MEMORY_REGION(data, bytes);
  }
  // Under ASan the bin's slack beyond the request stays poisoned, as malloc's would be.
  ASAN_UNPOISON_MEMORY_REGION(data, round64(nbytes));
  counters.allocations.fetch_add(1, std::memory_order_relaxed);
  const auto n = static_cast<int64_t>(nbytes);
  const int64_t now = counters.in_use.fetch_add(n, std::memory_order_relaxed) + n;
  int64_t peak = counters.peak.load(std::memory_order_relaxed);
  while (now > peak && !counters.peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
  return data;
}

void free_block(void* data, std::size_t nbytes) noexcept {
  counters.in_use.fetch_sub(static_cast<int64_t>(nbytes), std::memory_order_relaxed);
  const std::size_t bytes = block_bytes(nbytes);
  if (bytes < kCachedMinBytes) {
    SmallBlocks* small = bytes <= kSmallBytes && cache().caching() ? small_blocks() : nullptr;
    if (!small || !small->put(data, bytes)) std::free(data);
    return;
  }
  cache().put({data, bytes});
}

void set_cache_limit(int64_t bytes) {
  cache().set_limit(static_cast<std::size_t>(std::max<int64_t>(bytes, 0)));
  if (bytes > 0) return;
  if (SmallBlocks* small = small_blocks()) small->release();
}

std::size_t physical_memory() {
  static const std::size_t bytes = [] {
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    return pages > 0 && page > 0 ? static_cast<std::size_t>(pages) * static_cast<std::size_t>(page)
                                 : std::numeric_limits<std::size_t>::max();
  }();
  return bytes;
}

std::optional<int64_t> parse_env_int(std::string_view name, const char* value, int64_t min,
                                     int64_t max) {
  if (value == nullptr) return std::nullopt;
  const std::string_view text(value);
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec == std::errc() && end == text.data() + text.size() && v >= min && v <= max) return v;
  std::fprintf(stderr, "kiln: ignoring %.*s=\"%s\": expected an integer from %lld to %lld\n",
               static_cast<int>(name.size()), name.data(), value, static_cast<long long>(min),
               static_cast<long long>(max));
  return std::nullopt;
}

}  // namespace detail

MemoryStats memory_stats() {
  using detail::counters;
  const auto sizes = detail::cache().sizes();
  MemoryStats s;
  s.bytes_in_use = counters.in_use.load(std::memory_order_relaxed);
  s.peak_bytes_in_use = counters.peak.load(std::memory_order_relaxed);
  s.bytes_cached = static_cast<int64_t>(sizes.cached);
  s.cache_limit = static_cast<int64_t>(std::min<std::size_t>(
      sizes.limit, static_cast<std::size_t>(std::numeric_limits<int64_t>::max())));
  s.allocations = counters.allocations.load(std::memory_order_relaxed);
  s.cache_hits = counters.cache_hits.load(std::memory_order_relaxed);
  s.os_allocations = counters.os_allocations.load(std::memory_order_relaxed);
  s.os_bytes_allocated = counters.os_bytes.load(std::memory_order_relaxed);
  s.os_releases = counters.os_releases.load(std::memory_order_relaxed);
  return s;
}

void reset_peak_memory_stats() {
  detail::counters.peak.store(detail::counters.in_use.load(std::memory_order_relaxed),
                              std::memory_order_relaxed);
}

void release_cached_memory() {
  detail::release_caches();
  // glibc keeps freed blocks below its mmap threshold in its heap: return their pages too.
  malloc_trim(0);
}

}  // namespace kiln
