#include "compiler/plan.h"

#include <algorithm>
#include <numeric>

#include "detail/checked.h"
#include "kiln/error.h"

namespace kiln::compiler {
namespace {

void check(std::span<const Buffer> buffers) {
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    const Buffer& b = buffers[i];
    if (b.excluded) continue;
    if (b.bytes < 0 || b.alignment < 1 || (b.alignment & (b.alignment - 1)) != 0)
      fail("jit", "memory plan: buffer ", i, " has no valid size and alignment: got ", b.bytes,
           " bytes aligned to ", b.alignment, ", expected a size >= 0 and a power of two");
    if (b.last_use < b.defined)
      fail("jit", "memory plan: buffer ", i,
           " is used before it is made: got its last use at step ", b.last_use,
           ", expected one at or after step ", b.defined, " that makes it");
    if (b.overwrites && *b.overwrites >= buffers.size())
      fail("jit", "memory plan: buffer ", i, " overwrites no buffer: got index ", *b.overwrites,
           ", expected one below ", buffers.size());
  }
}

int64_t round_up(int64_t n, int64_t alignment) {
  return detail::checked_add("jit", n, alignment - 1) / alignment * alignment;
}

class Planner {
 public:
  explicit Planner(std::span<const Buffer> buffers) : buffers_(buffers), slot_of_(buffers.size()) {
    plan_.offsets.assign(buffers.size(), std::nullopt);
  }

  void place(std::size_t i) {
    const Buffer& b = buffers_[i];
    const int64_t size = round_up(b.bytes, b.alignment);
    std::optional<std::size_t> k = taken_over(b, size);
    if (!k) k = smallest_free(b, size);
    if (!k) {
      const int64_t offset = round_up(plan_.arena_bytes, b.alignment);
      slots_.push_back({.offset = offset, .size = size});
      plan_.arena_bytes = detail::checked_add("jit", offset, size);
      k = slots_.size() - 1;
    }
    slots_[*k].holder = i;
    slot_of_[i] = k;
    plan_.offsets[i] = slots_[*k].offset;
  }

  MemoryPlan take() { return std::move(plan_); }

 private:
  // A stretch of the arena and the buffer that holds it last.
  struct Slot {
    int64_t offset = 0, size = 0;
    std::size_t holder = 0;
  };

  bool fits(const Slot& s, const Buffer& b, int64_t size) const {
    return s.size >= size && s.offset % b.alignment == 0;
  }

  // The slot of the buffer that b overwrites, when b may take it over.
  std::optional<std::size_t> taken_over(const Buffer& b, int64_t size) const {
    if (!b.overwrites) return std::nullopt;
    const std::size_t over = *b.overwrites;
    const std::optional<std::size_t> k = slot_of_[over];
    if (!k || slots_[*k].holder != over || buffers_[over].defined >= b.defined ||
        buffers_[over].last_use != b.defined || !fits(slots_[*k], b, size))
      return std::nullopt;
    return k;
  }

  // The smallest slot that fits b and whose holder's last use is before b's step (the first
  // of equal ones).
  std::optional<std::size_t> smallest_free(const Buffer& b, int64_t size) const {
    std::optional<std::size_t> best;
    for (std::size_t k = 0; k < slots_.size(); ++k)
      if (buffers_[slots_[k].holder].last_use < b.defined && fits(slots_[k], b, size) &&
          (!best || slots_[k].size < slots_[*best].size))
        best = k;
    return best;
  }

  std::span<const Buffer> buffers_;
  std::vector<Slot> slots_;
  std::vector<std::optional<std::size_t>> slot_of_;
  MemoryPlan plan_;
};

}  // namespace

MemoryPlan plan_memory(std::span<const Buffer> buffers) {
  check(buffers);
  std::vector<std::size_t> order(buffers.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return buffers[a].defined < buffers[b].defined;
  });
  Planner planner(buffers);
  for (std::size_t i : order)
    if (!buffers[i].excluded) planner.place(i);
  return planner.take();
}

}  // namespace kiln::compiler
