// A kernel registered for a primitive after a function was compiled with that primitive's
// operands channel-blocked (docs/DESIGN.md, "Channel-blocked values") runs on plain copies of
// them. A binary of its own: the registration holds for the rest of the process.
#include <gtest/gtest.h>

#include <atomic>

#include "kiln/kiln.h"
#include "kiln/nn.h"
#include "testing.h"

namespace {

using namespace kiln;

std::atomic<int> g_runs{0};

TEST(ChannelBlockedReplaced, AKernelRegisteredLaterRunsOnPlainCopies) {
  const Tensor x = random::normal(random::key(1), {2, 16, 8, 8}),
               w = random::normal(random::key(2), {32, 16, 3, 3});
  // The pooled image weighted per channel and position, so that a layout mixed up anywhere
  // changes the sum; the pooling's output is blocked, as the group reading it is.
  const Tensor weights = random::normal(random::key(3), {1, 32, 4, 4});
  auto f = [&](const Tensor& x, const Tensor& w) {
    return sum(max_pool2d(nn::relu(conv2d(x, w, {.padding = {1, 1}}))) * weights);
  };
  auto compiled = jit(f, JitOptions{.backend = ir::Backend::llvm});
  const ir::CompiledInfo info = compiled.compiled(x, w);
  if (info.channel_blocked.empty()) GTEST_SKIP() << "oneDNN lays images out plainly here";
  EXPECT_EQ(kiln::testing::blocked_outputs(compiled, "max_pool2d", x, w), 1) << info;
  const Tensor before = compiled(x, w);
  // The same pooling through float64's kernel: the values max_pool2d picks, exactly.
  register_kernel(primitive("max_pool2d"), KernelSignature{.inputs = {float32}},
                  [](std::span<const Tensor> in, const Attrs& attrs) {
                    ++g_runs;
                    const Tensor y =
                        bind1(primitive("max_pool2d"), {astype(in[0], float64)}, attrs);
                    return std::vector<Tensor>{astype(y, float32)};
                  });
  const Tensor after = compiled(x, w);
  EXPECT_GT(g_runs.load(), 0) << "the registered kernel did not run";
  EXPECT_EQ(after.item<float>(), before.item<float>());
  const Tensor interpreted = jit(f, JitOptions{.backend = ir::Backend::interpreter})(x, w);
  EXPECT_EQ(after.item<float>(), interpreted.item<float>());
}

}  // namespace
