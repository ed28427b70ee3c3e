// The compiled function's memory planner (src/compiler/plan.h) on hand-built descriptions,
// checked by properties any correct plan has whatever the algorithm: buffers live at the same
// step share no byte, offsets honour alignment, the arena holds every step's live bytes, dead
// buffers' memory is reused, and excluded buffers get none.
#include <gtest/gtest.h>

#include <random>
#include <sstream>
#include <string>

#include "compiler/plan.h"
#include "testing.h"

namespace kiln::compiler {
namespace {

using testing::expect_error;

bool live_together(const Buffer& a, const Buffer& b) {
  return a.defined <= b.last_use && b.defined <= a.last_use;
}

// What is wrong with `plan` for `buffers`, or "" when nothing is. Two buffers live at one step
// may share bytes only when one is written in place over the other, made by an earlier step
// and dying in the step that makes the one, and then they lie at the same offset.
std::string violations(const std::vector<Buffer>& buffers, const MemoryPlan& plan) {
  std::ostringstream out;
  if (plan.offsets.size() != buffers.size()) out << "one offset per buffer expected\n";
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    const Buffer& a = buffers[i];
    const std::optional<int64_t> at = plan.offsets[i];
    if (a.excluded != !at) out << "buffer " << i << (at ? " excluded but placed\n" : " unplaced\n");
    if (!at) continue;
    if (*at % a.alignment) out << "buffer " << i << " at " << *at << " not aligned\n";
    if (*at < 0 || *at + a.bytes > plan.arena_bytes) out << "buffer " << i << " outside\n";
    for (std::size_t j = 0; j < i; ++j) {
      const Buffer& b = buffers[j];
      const std::optional<int64_t> bt = plan.offsets[j];
      if (!bt || !live_together(a, b)) continue;
      const bool share = *at < *bt + b.bytes && *bt < *at + a.bytes;
      auto in_place = [&](const Buffer& x, std::size_t over, const Buffer& y) {
        return x.overwrites == over && y.defined < x.defined && y.last_use == x.defined &&
               *at == *bt;
      };
      if (share && !in_place(a, j, b) && !in_place(b, i, a))
        out << "buffers " << j << " and " << i << " are live together and overlap\n";
    }
  }
  return out.str();
}

// The most bytes of planned buffers live at one step.
int64_t peak_live_bytes(const std::vector<Buffer>& buffers) {
  int64_t peak = 0;
  for (const Buffer& at : buffers) {
    int64_t live = 0;
    for (const Buffer& b : buffers)
      if (!b.excluded && b.defined <= at.defined && at.defined <= b.last_use) live += b.bytes;
    peak = std::max(peak, live);
  }
  return peak;
}

Buffer lives(int64_t bytes, std::size_t defined, std::size_t last_use, int64_t alignment = 64) {
  return {.bytes = bytes, .alignment = alignment, .defined = defined, .last_use = last_use};
}

TEST(MemoryPlan, AChainReusesTheMemoryOfBuffersThatDied) {
  // a -> b -> c, each read only by the step that makes the next.
  const std::vector<Buffer> chain = {lives(256, 0, 1), lives(256, 1, 2), lives(256, 2, 3)};
  const MemoryPlan plan = plan_memory(chain);
  EXPECT_EQ(violations(chain, plan), "");
  EXPECT_GE(plan.arena_bytes, peak_live_bytes(chain));
  EXPECT_LT(plan.arena_bytes, 3 * 256);
}

TEST(MemoryPlan, AChainWrittenInPlaceHoldsOneBuffer) {
  std::vector<Buffer> chain = {lives(256, 0, 1), lives(256, 1, 2), lives(256, 2, 3)};
  chain[1].overwrites = 0;
  chain[2].overwrites = 1;
  const MemoryPlan plan = plan_memory(chain);
  EXPECT_EQ(violations(chain, plan), "");
  EXPECT_EQ(plan.arena_bytes, 256);
}

TEST(MemoryPlan, BuffersLiveTogetherGetDisjointMemory) {
  // Two made by one step, one read by nothing (it still holds its memory while made), and one
  // living across all of them.
  const std::vector<Buffer> buffers = {lives(100, 0, 3), lives(64, 1, 1), lives(64, 1, 2),
                                       lives(300, 2, 2)};
  const MemoryPlan plan = plan_memory(buffers);
  EXPECT_EQ(violations(buffers, plan), "");
  EXPECT_GE(plan.arena_bytes, peak_live_bytes(buffers));
}

TEST(MemoryPlan, OffsetsHonourEachBuffersAlignment) {
  const std::vector<Buffer> buffers = {lives(3, 0, 4, 1),   lives(10, 0, 4, 4),
                                       lives(1, 1, 4, 256), lives(70, 2, 4, 64),
                                       lives(5, 2, 4, 2),   lives(33, 3, 4, 128)};
  const MemoryPlan plan = plan_memory(buffers);
  EXPECT_EQ(violations(buffers, plan), "");
}

TEST(MemoryPlan, ExcludedBuffersGetNoArenaSpace) {
  // Arguments, constants and results live in memory of their own.
  std::vector<Buffer> buffers = {lives(512, 0, 2), lives(64, 0, 1), lives(512, 1, 3)};
  buffers[0].excluded = true;
  buffers[2].excluded = true;
  const MemoryPlan plan = plan_memory(buffers);
  EXPECT_EQ(violations(buffers, plan), "");
  EXPECT_EQ(plan.arena_bytes, 64);
  buffers[1].excluded = true;
  EXPECT_EQ(plan_memory(buffers).arena_bytes, 0);
}

TEST(MemoryPlan, AnInPlaceRequestThatIsNotSafeIsRefused) {
  // b asks to overwrite a, which is still read after b is made; c and d both ask for e; f
  // asks for c, made in the same step (over e, which is live in that step).
  std::vector<Buffer> buffers = {lives(128, 0, 2), lives(128, 1, 3), lives(128, 3, 3),
                                 lives(128, 3, 4), lives(128, 2, 3), lives(128, 3, 4)};
  buffers[1].overwrites = 0;
  buffers[2].overwrites = 4;
  buffers[3].overwrites = 4;
  buffers[5].overwrites = 2;
  const MemoryPlan plan = plan_memory(buffers);
  EXPECT_EQ(violations(buffers, plan), "");
  EXPECT_NE(plan.offsets[2], plan.offsets[3]);
}

TEST(MemoryPlan, AnInvalidDescriptionIsAnError) {
  expect_error([] { plan_memory(std::vector<Buffer>{lives(8, 0, 1, 3)}); }, "jit",
               {"buffer 0", "aligned to 3", "power of two"});
  expect_error([] { plan_memory(std::vector<Buffer>{lives(8, 2, 1)}); }, "jit",
               {"buffer 0", "step 1", "step 2"});
  std::vector<Buffer> unknown = {lives(8, 0, 1)};
  unknown[0].overwrites = 5;
  expect_error([&] { plan_memory(unknown); }, "jit", {"got index 5", "below 1"});
}

// Many random programs' worth of lifetimes, sizes, alignments and in-place requests (a fixed
// seed): no two buffers live at the same step overlap, and the arena holds the peak.
TEST(MemoryPlan, RandomLifetimesNeverOverlap) {
  std::mt19937 gen(20261204);
  auto draw = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(gen);
  };
  for (int trial = 0; trial < 500; ++trial) {
    const auto steps = static_cast<std::size_t>(draw(1, 12));
    std::vector<Buffer> buffers(static_cast<std::size_t>(draw(1, 40)));
    for (std::size_t i = 0; i < buffers.size(); ++i) {
      Buffer& b = buffers[i];
      b.defined = static_cast<std::size_t>(draw(0, static_cast<int64_t>(steps) - 1));
      b.last_use = b.defined + static_cast<std::size_t>(draw(0, 4));
      b.bytes = draw(0, 3) == 0 ? draw(0, 8) : draw(1, 4096);
      b.alignment = int64_t{1} << draw(0, 7);
      b.excluded = draw(0, 5) == 0;
      if (draw(0, 2) == 0) b.overwrites = static_cast<std::size_t>(draw(0, 39)) % buffers.size();
    }
    const MemoryPlan plan = plan_memory(buffers);
    ASSERT_EQ(violations(buffers, plan), "") << "trial " << trial;
    std::vector<Buffer> separate = buffers;  // the peak counts no buffer written in place
    for (Buffer& b : separate) b.overwrites.reset();
    const MemoryPlan separate_plan = plan_memory(separate);
    ASSERT_EQ(violations(separate, separate_plan), "") << "trial " << trial;
    ASSERT_GE(separate_plan.arena_bytes, peak_live_bytes(separate)) << "trial " << trial;
  }
}

}  // namespace
}  // namespace kiln::compiler
