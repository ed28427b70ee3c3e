// Profiles of compiled functions (kiln/profile.h): which steps a profile records, their
// arithmetic and bytes against the operands' shapes, and the machine peaks they are set
// against.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <thread>

#include "kiln/kiln.h"
#include "testing.h"

using namespace kiln;

namespace {

const JitOptions kCompiled{.name = "profiled", .backend = ir::Backend::llvm};

// relu(a @ b + 1): a kernel call (matmul) and a fused group (add, max).
Tensor product_step(const Tensor& a, const Tensor& b) { return nn::relu(matmul(a, b) + 1.0); }

const ProfileRow* find_row(const Profile& p, std::string_view what) {
  for (const ProfileRow& r : p.rows)
    if (r.what.find(what) != std::string::npos) return &r;
  return nullptr;
}

TEST(Profile, RecordsEachStepOfEachCallWithItsArithmeticAndBytes) {
  constexpr int64_t M = 48, K = 40, N = 24;
  const Tensor a = full({M, K}, 0.5), b = full({K, N}, 0.25);
  auto f = jit(product_step, kCompiled);
  f(a, b);  // compiled before the profile: compilation is not a step
  const auto start = std::chrono::steady_clock::now();
  const Profile p = profile([&] {
    for (int i = 0; i < 3; ++i) f(a, b);
  });
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  const ProfileRow* mm = find_row(p, "matmul");
  ASSERT_NE(mm, nullptr) << p.table();
  EXPECT_EQ(mm->function, "profiled");
  EXPECT_FALSE(mm->fused);
  EXPECT_EQ(mm->calls, 3);
  EXPECT_EQ(mm->flops, 2.0 * M * N * K);
  EXPECT_EQ(mm->bytes, 4.0 * (M * K + K * N + M * N));
  EXPECT_NE(mm->what.find("f32[48,40], f32[40,24] -> f32[48,24]"), std::string::npos) << mm->what;

  const ProfileRow* fused = nullptr;
  for (const ProfileRow& r : p.rows)
    if (r.fused) fused = &r;
  ASSERT_NE(fused, nullptr) << p.table();
  EXPECT_EQ(fused->calls, 3);
  EXPECT_EQ(fused->flops, 0);
  // Reads the product and writes the result; the constants are a few scalars.
  EXPECT_GE(fused->bytes, 4.0 * (M * N + M * N));
  EXPECT_LE(fused->bytes, 4.0 * (M * N + M * N) + 64);
  EXPECT_NE(fused->what.find("[48,24]"), std::string::npos) << fused->what;

  const ProfileRow* outside = find_row(p, "outside the steps");
  ASSERT_NE(outside, nullptr) << p.table();
  EXPECT_EQ(outside->step, -1);
  EXPECT_EQ(outside->calls, 3);

  double sum = 0;
  for (const ProfileRow& r : p.rows) {
    EXPECT_GE(r.seconds, 0);
    EXPECT_TRUE(r.step == -1 || r.seconds > 0) << r.what;
    sum += r.seconds;
  }
  EXPECT_LE(sum, wall);
  EXPECT_EQ(p.peak.threads, num_threads());
  EXPECT_GT(p.peak.fma_gflops, 0);
  EXPECT_GT(p.peak.copy_gbps, 0);
  const std::string table = p.table();
  EXPECT_NE(table.find("@profiled: 3 calls"), std::string::npos) << table;
  EXPECT_NE(table.find("GFLOP/s"), std::string::npos) << table;
}

// A kernel whose first call pays a one-time cost, as a library generating its code for a
// shape does: 100 ms more on the first call after g_slow_first_calls is reset.
std::atomic<int> g_slow_first_calls{0};
const Primitive& slow_first_p = [] {
  Primitive p;
  p.name = "test_slow_first";
  p.arity = 1;
  p.type_rule = [](std::span<const TensorType> in, const Attrs&) {
    return std::vector<TensorType>{in[0]};
  };
  return std::cref(register_primitive(
      std::move(p),
      {{KernelSignature{.inputs = {DTypeSet::all()}}, [](std::span<const Tensor> in, const Attrs&) {
          if (g_slow_first_calls++ == 0)
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
          return std::vector<Tensor>{in[0] + 0.0};
        }}}));
}();

// The first call's time is kept apart, and the means over the calls after it are the table's:
// a one-time cost would otherwise show in every step's mean.
TEST(Profile, TheFirstCallIsApartFromTheSteadyState) {
  g_slow_first_calls = 0;
  auto f = jit([](const Tensor& x) { return bind1(slow_first_p, {x * 2.0}) + 1.0; }, kCompiled);
  const Tensor x = full({64}, 1.0);
  (void)f.compiled(x);  // compiled before the profile; the kernel has not run yet
  const Profile p = profile([&] {
    for (int i = 0; i < 5; ++i) f(x);
  });
  const ProfileRow* slow = find_row(p, "test_slow_first");
  ASSERT_NE(slow, nullptr) << p.table();
  EXPECT_EQ(slow->calls, 5);
  EXPECT_GE(slow->first_seconds, 0.1);
  EXPECT_LT(slow->seconds - slow->first_seconds, slow->first_seconds / 2);  // four, no sleep
  EXPECT_EQ(slow->later_calls(), 4);
  EXPECT_EQ(slow->later_seconds(), slow->seconds - slow->first_seconds);
  for (std::size_t i = 0; i < p.rows.size(); ++i) {
    const ProfileRow& r = p.rows[i];
    EXPECT_TRUE(r.step == -1 || r.first_seconds > 0) << r.what;
    EXPECT_LE(r.first_seconds, r.seconds) << r.what;
    // Longest first by the later calls' time, which the first call's does not reorder.
    if (i > 0) {
      EXPECT_GE(p.rows[i - 1].later_seconds(), r.later_seconds()) << p.table();
    }
  }
  // The row's ms per call is the mean of the four later calls, its first call's ms apart.
  char later[32], first[32];
  std::snprintf(later, sizeof later, "%9.3f", (slow->seconds - slow->first_seconds) / 4 * 1e3);
  std::snprintf(first, sizeof first, "%9.3f", slow->first_seconds * 1e3);
  const std::string table = p.table();
  const std::size_t row = table.find("test_slow_first");
  ASSERT_NE(row, std::string::npos) << table;
  const std::string line = table.substr(table.rfind('\n', row) + 1, row - table.rfind('\n', row));
  EXPECT_NE(line.find(later), std::string::npos) << line;
  EXPECT_NE(line.find(first), std::string::npos) << line;
  EXPECT_NE(table.find("@profiled: 5 calls"), std::string::npos) << table;
  EXPECT_NE(table.find("ms a call after the first"), std::string::npos) << table;
}

TEST(Profile, ConvolutionsCountTheForwardMultiplyAddsInEveryPass) {
  // x [N=2, C=3, 9, 8], w [O=4, 3, 3, 2], stride 1, no padding: out 7 x 7.
  const Tensor x = full({2, 3, 9, 8}, 0.5), w = full({4, 3, 3, 2}, 0.25);
  auto loss = [](const Tensor& x, const Tensor& w) { return sum(conv2d(x, w) * conv2d(x, w)); };
  auto g = jit(grad(loss, argnums<0, 1>), kCompiled);
  g(x, w);
  const Profile p = profile([&] { g(x, w); });
  const double macs = 2.0 * 4 * 3 * 7 * 7 * 3 * 2;  // N·O·C·OH·OW·KH·KW
  for (std::string_view op : {"conv f32", "conv_input_grad", "conv_weight_grad"}) {
    const ProfileRow* r = find_row(p, op);
    ASSERT_NE(r, nullptr) << op << "\n" << p.table();
    EXPECT_EQ(r->flops, 2 * macs) << op;
  }
}

TEST(Profile, FunctionsOfOneNameAreToldApart) {
  const Tensor a = full({4, 4}, 1.0);
  auto f = jit(product_step, kCompiled);
  auto g = jit([](const Tensor& x) { return exp(x); }, kCompiled);
  f(a, a);
  g(a);
  const Profile p = profile([&] {
    f(a, a);
    g(a);
    g(a);
  });
  std::map<std::string, int64_t> calls;  // per function, its steps' most calls
  for (const ProfileRow& r : p.rows) calls[r.function] = std::max(calls[r.function], r.calls);
  EXPECT_EQ(calls, (std::map<std::string, int64_t>{{"profiled", 1}, {"profiled (2)", 2}}))
      << p.table();
  const std::string table = p.table();
  EXPECT_NE(table.find("@profiled: 1 call,"), std::string::npos) << table;
  EXPECT_NE(table.find("@profiled (2): 2 calls"), std::string::npos) << table;
}

TEST(Profile, RecordsNothingOutsideAProfile) {
  const Tensor a = full({4, 4}, 1.0);
  auto f = jit(product_step, kCompiled);
  f(a, a);
  start_profile();
  stop_profile();
  f(a, a);
  const Profile later = profile([] {});
  EXPECT_TRUE(later.rows.empty()) << later.table();
  EXPECT_NE(later.table().find("no compiled function ran"), std::string::npos);
}

TEST(Profile, ProfilesNestAndTheOuterOneSeesTheInnerOnesSteps) {
  const Tensor a = full({4, 4}, 1.0);
  auto f = jit(product_step, kCompiled);
  f(a, a);
  start_profile();
  f(a, a);
  const Profile inner = profile([&] { f(a, a); });
  f(a, a);
  const Profile outer = stop_profile();
  const ProfileRow* in = find_row(inner, "matmul");
  const ProfileRow* out = find_row(outer, "matmul");
  ASSERT_NE(in, nullptr) << inner.table();
  ASSERT_NE(out, nullptr) << outer.table();
  EXPECT_EQ(in->calls, 1);
  EXPECT_EQ(out->calls, 3);
  EXPECT_TRUE(stop_profile().rows.empty());  // none open any more
}

TEST(Profile, AnExceptionStopsTheProfile) {
  const Tensor a = full({4, 4}, 1.0);
  auto f = jit(product_step, kCompiled);
  EXPECT_THROW(profile([] { throw std::runtime_error("user"); }), std::runtime_error);
  f(a, a);
  EXPECT_TRUE(stop_profile().rows.empty());
}

// In a process of its own: KILN_PROFILE is read at the first compiled call. The inner profile
// measures the machine's peak after the exit handler was registered, whose table then reads it.
TEST(ProfileDeathTest, KilnProfilePrintsTheWholeProcessAtExit) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        setenv("KILN_PROFILE", "1", 1);
        const Tensor a = full({4, 4}, 1.0);
        auto f = jit(product_step, kCompiled);
        f(a, a);
        profile([&] { f(a, a); });
        std::exit(0);
      },
      ::testing::ExitedWithCode(0), "@profiled: 2 calls");
}

TEST(Profile, MachinePeakChecksItsThreadCount) {
  kiln::testing::expect_error([] { machine_peak(0); }, "machine_peak",
                              {"got 0", "expected 1 to 1024"});
  const MachinePeak one = machine_peak(1);
  EXPECT_EQ(one.threads, 1);
  EXPECT_GT(one.fma_gflops, 0);
  EXPECT_GT(one.copy_gbps, 0);
  EXPECT_TRUE(one.isa == "avx512" || one.isa == "avx2" || one.isa == "sse") << one.isa;
  EXPECT_EQ(machine_peak(1).fma_gflops, one.fma_gflops);  // measured once
}

}  // namespace
