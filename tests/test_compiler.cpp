// The LLVM backend end to end: what fuses into one loop, that compiled results equal the
// interpreter's, the on-disk cache, dumps and the backend switch. The registry walk and the
// random programs are in test_compiled_walk.cpp and test_random_programs.cpp.
#include <gtest/gtest.h>
#include <kiln/kiln.h>
#include <kiln/nn.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <atomic>
#include <bit>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include "../examples/custom_primitive.h"
#include "compiler/orc.h"
#include "detail/streaming.h"
#include "math/vector_math.h"
#include "testing.h"

using namespace kiln;

namespace {

const JitOptions kCompiled{.name = "compiled", .backend = ir::Backend::llvm};
const JitOptions kInterpreted{.name = "interpreted", .backend = ir::Backend::interpreter};

// Elementwise differences between the two backends, for finite float results: at most
// `ulps` units in the last place of float32.
void expect_same(const Tensor& got, const Tensor& want, double rel = 0) {
  ASSERT_EQ(got.type(), want.type());
  const std::vector<double> g = got.to_vector<double>(), w = want.to_vector<double>();
  for (std::size_t i = 0; i < g.size(); ++i) {
    if (std::isnan(w[i])) {
      EXPECT_TRUE(std::isnan(g[i])) << i;
      continue;
    }
    EXPECT_NEAR(g[i], w[i], rel * std::max(1.0, std::abs(w[i]))) << i;
  }
}

Tensor normal(uint64_t seed, const Shape& s, DType d = float32) {
  return random::normal(random::key(seed), s, d);
}

// The same bits: equal values, the same sign of zero, NaN where the other has NaN (payloads
// may differ).
void expect_bits(const Tensor& got, const Tensor& want) {
  ASSERT_EQ(got.type(), want.type());
  if (!is_floating(want.dtype())) {
    EXPECT_EQ(got.to_vector<int64_t>(), want.to_vector<int64_t>());
    return;
  }
  const std::vector<double> g = got.to_vector<double>(), w = want.to_vector<double>();
  for (std::size_t i = 0; i < g.size(); ++i) {
    if (std::isnan(w[i])) {
      EXPECT_TRUE(std::isnan(g[i])) << i;
      continue;
    }
    EXPECT_EQ(g[i], w[i]) << i;
    EXPECT_EQ(std::signbit(g[i]), std::signbit(w[i])) << i;
  }
}

// Compiled against interpreted, bit for bit.
template <class F, class... A>
void expect_compiled_bits(const F& f, const A&... args) {
  const auto got = jit(f, kCompiled)(args...), want = jit(f, kInterpreted)(args...);
  if constexpr (std::is_same_v<std::decay_t<decltype(got)>, Tensor>) {
    expect_bits(got, want);
  } else {
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t k = 0; k < got.size(); ++k) expect_bits(got[k], want[k]);
  }
}

// A scratch directory removed with the test.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::string t = (std::filesystem::temp_directory_path() / "kiln-compiler-XXXXXX").string();
    path = mkdtemp(t.data());
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};

// The lines of the LLVM IR (".ll") or assembly (".s") dumped into dir (KILN_DUMP_DIR) for
// which match holds.
int dumped_lines(const std::filesystem::path& dir,
                 const std::function<bool(const std::string&)>& match,
                 std::string_view extension = ".ll") {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().extension() != extension) continue;
    std::ifstream in(e.path());
    for (std::string line; std::getline(in, line);) n += match(line);
  }
  return n;
}

using kiln::testing::EnvVar;
using kiln::testing::Threads;

}  // namespace

TEST(Compiler, AnElementwiseChainIsOneLoop) {
  auto f = [](const Tensor& x, const Tensor& y, const Tensor& z) {
    return tanh(x) * sigmoid(y) + exp(z);
  };
  const Tensor x = normal(1, {1000}), y = normal(2, {1000}), z = normal(3, {1000});
  const auto info = jit(f, kCompiled).compiled(x, y, z);
  EXPECT_EQ(info.backend, ir::Backend::llvm);
  ASSERT_EQ(info.groups.size(), 1u);
  EXPECT_TRUE(info.kernel_calls.empty());
  EXPECT_EQ(info.groups[0].bytes_read, 3 * 1000 * 4);
  EXPECT_EQ(info.groups[0].bytes_written, 1000 * 4);
  // SLEEF's 1-ulp functions against glibc's: a few float32 ulps at most.
  expect_same(jit(f, kCompiled)(x, y, z), jit(f, kInterpreted)(x, y, z), 1e-6);
}

// A user-defined primitive with a lowering (examples/custom_primitive.h, written with
// kiln/lowering.h alone) fuses with its neighbours, and has the interpreter's bits.
TEST(Compiler, AUserPrimitiveWithALoweringFuses) {
  auto f = [](const Tensor& x) { return example::huber(x * 3.0, 1.5) + 1.0; };
  for (DType d : {float32, float64}) {
    Tensor x = normal(11, {1000}, d);
    x = where(abs(x) > 2.5, full_like(x, std::nan("")), x);  // NaN takes a side too
    const auto info = jit(f, kCompiled).compiled(x);
    ASSERT_EQ(info.groups.size(), 1u) << info;
    EXPECT_TRUE(info.kernel_calls.empty()) << info;
    EXPECT_EQ(info.groups[0].equations.size(), 3u) << info;  // mul, huber, add
    expect_compiled_bits(f, x);
  }
}

TEST(Compiler, ReductionsFuseWithProducersAndConsumers) {
  const Tensor x = normal(4, {33, 70}) * 5.0f;
  const Tensor w = normal(5, {70}), b = normal(6, {70});
  const std::vector<std::pair<std::string, std::function<Tensor(const Tensor&)>>> cases = {
      {"softmax", [](const Tensor& t) { return softmax(t, -1); }},
      {"log_softmax", [](const Tensor& t) { return log_softmax(t, -1); }},
      {"logsumexp", [](const Tensor& t) { return logsumexp(t, {1}); }},
      {"layer_norm",
       [&](const Tensor& t) {
         const Tensor m = mean(t, {-1}, true), c = t - m;
         return c / sqrt(mean(c * c, {-1}, true) + 1e-5f) * w + b;
       }},
  };
  for (const auto& [name, f] : cases) {
    SCOPED_TRACE(name);
    const auto info = jit(f, kCompiled).compiled(x);
    EXPECT_EQ(info.groups.size(), 1u) << info;
    EXPECT_TRUE(info.kernel_calls.empty()) << info;
    expect_same(jit(f, kCompiled)(x), jit(f, kInterpreted)(x), 1e-6);
  }
}

TEST(Compiler, GradientProgramsFuseAroundMatmul) {
  auto loss = [](const Tensor& w, const Tensor& x) { return mean(log_softmax(matmul(x, w), -1)); };
  const Tensor w = normal(7, {78, 10}) * 0.1f, x = normal(8, {32, 78});
  auto compiled = jit(value_and_grad(loss), kCompiled);
  const auto info = compiled.compiled(w, x);
  const ir::Function lowered = compiled.lower(w, x);
  for (int e : info.kernel_calls)
    EXPECT_EQ(lowered.equations[static_cast<std::size_t>(e)].prim->name, "matmul") << info;
  EXPECT_LE(info.groups.size(), 3u) << info;
  const auto [l, g] = compiled(w, x);
  const auto [li, gi] = jit(value_and_grad(loss), kInterpreted)(w, x);
  expect_same(l, li, 1e-6);
  expect_same(g, gi, 1e-6);
}

// A group that sums over every axis of an operand read across its rows (a transposed gradient)
// runs on one thread (a contiguous one splits by rows: SumsOverRowsSplitTheRowsAmongThreads).
// Over a large domain, what waits for
// the sum over the whole domain (a clipped gradient's update after its global norm) is a group
// of its own, which threads split, and the sum walks a transposed operand along its memory;
// over a small one it all stays one group.
TEST(Compiler, WorkWaitingForALargeFullReductionLeavesItsGroup) {
  const auto clip = [](const Tensor& g) {
    const Tensor t = transpose(g);  // a weight gradient as a transposed view
    return t - t * (0.5f / sqrt(sum(t * t)));
  };
  const Tensor big = normal(11, {256, 512}), small = normal(12, {16, 32});
  const auto info = jit(clip, kCompiled).compiled(big);
  ASSERT_EQ(info.groups.size(), 2u) << info;
  const std::string& sum_kernel = info.groups[0].kernel;
  EXPECT_NE(sum_kernel.find("reduce_sum"), std::string::npos) << info;
  EXPECT_NE(sum_kernel.find("load in0 @0 [512,1]"), std::string::npos) << info;
  EXPECT_EQ(jit(clip, kCompiled).compiled(small).groups.size(), 1u);
  for (const Tensor& g : {big, small})
    expect_same(jit(clip, kCompiled)(g), jit(clip, kInterpreted)(g), 1e-6);
  // A kept axis of size 1 is no kept axis: its group reorders the others around it (the random
  // programs caught the axis left behind while the domain moved, writing past the output).
  const auto kept_one = [](const Tensor& g) {
    const Tensor t = reshape(transpose(g), {1, 512, 256});
    return sum(t * t, {1, 2});
  };
  expect_same(jit(kept_one, kCompiled)(big), jit(kept_one, kInterpreted)(big), 1e-6);
}

// Elementwise work whose users wait for something not yet computable waits with them: an
// optimiser's m * b1 and p * decay join the update after the clipping norm, rather than the
// norm's group, which would store them and the update read them back.
TEST(Compiler, ElementwiseWorkWaitsForItsUsers) {
  auto f = [](const Tensor& p, const Tensor& g, const Tensor& m) {
    const Tensor c = minimum(1.0f / sqrt(sum(g * g)), 1.0f);
    const Tensor m2 = m * 0.9f + g * c * 0.1f;
    return std::vector<Tensor>{p * 0.99f - m2 * 0.01f, m2};
  };
  const Tensor p = normal(13, {512, 300}), g = normal(14, {512, 300}), m = normal(15, {512, 300});
  const auto info = jit(f, kCompiled).compiled(p, g, m);
  ASSERT_EQ(info.groups.size(), 3u) << info;
  const int64_t matrix = 512 * 300 * 4;
  EXPECT_EQ(info.groups[0].bytes_read, matrix) << info;  // g alone
  EXPECT_EQ(info.groups[0].bytes_written, 4) << info;    // its sum of squares
  EXPECT_EQ(info.groups[2].bytes_written, 2 * matrix) << info;
  expect_compiled_bits(f, p, g, m);
}

// An unrolled loop's steps fuse into groups with the same kernel text; LLVM compiles each
// distinct kernel once and every group runs it on its own buffers.
TEST(Compiler, EqualGroupsShareOneKernel) {
  auto f = [](const Tensor& w, const Tensor& xs) {
    Tensor h = zeros({8, 16});
    for (int64_t t = 0; t < 6; ++t) h = tanh(matmul(h, w) + index(xs, t));
    return sum(h * h);
  };
  const Tensor w = normal(1, {16, 16}) * 0.3, xs = normal(2, {6, 8, 16});
  const auto info = jit(value_and_grad(f), kCompiled).compiled(w, xs);
  EXPECT_GE(info.groups.size(), 12u);
  // Groups of the same text share a kernel: the backward pass's five steps one, the weight
  // gradient's sums of the steps' products (fused two at a time) another.
  EXPECT_GE(static_cast<int64_t>(info.groups.size()) - info.kernels, 5) << info;
  std::set<std::string> texts;
  for (const auto& g : info.groups) texts.insert(g.kernel);
  EXPECT_EQ(info.kernels, static_cast<int64_t>(texts.size()));
  const auto [l, g] = jit(value_and_grad(f), kCompiled)(w, xs);
  const auto [li, gi] = jit(value_and_grad(f), kInterpreted)(w, xs);
  expect_same(l, li, 1e-6);
  expect_same(g, gi, 1e-6);
}

// A checkpoint's body is inlined when compiled, and its recomputation in the backward pass
// stays there: gelu (a checkpoint) between two products, differentiated, stores the product's
// epilogue and the gelu for the next product (the forward loop) and writes the input's
// gradient (the backward loop): three tensors of the hidden layer's size, where storing the
// formula's intermediates for the backward pass took eight.
TEST(Compiler, ACheckpointsRecomputationIsNotStored) {
  auto f = [](const Tensor& w1, const Tensor& w2, const Tensor& x) {
    return sum(matmul(nn::gelu(matmul(x, w1) + 1.0f, /*tanh_approximation=*/true), w2));
  };
  const Tensor w1 = normal(1, {32, 256}) * 0.2, w2 = normal(2, {256, 8}) * 0.2,
               x = normal(3, {64, 32});
  const auto df = value_and_grad(f);
  const auto info = jit(df, kCompiled).compiled(w1, w2, x);
  int64_t written = 0;
  for (const auto& g : info.groups) written += g.bytes_written;
  const int64_t hidden = 64 * 256 * 4;
  EXPECT_LE(written, 3 * hidden + 4096) << info;
  const auto [l, g] = jit(df, kCompiled)(w1, w2, x);
  const auto [li, gi] = jit(df, kInterpreted)(w1, w2, x);
  expect_same(l, li, 1e-5);
  expect_same(g, gi, 1e-5);
}

TEST(Compiler, LayoutOpsAreReadInPlace) {
  // A transpose, a slice and a broadcast of arguments feed the loop without copies.
  auto f = [](const Tensor& a, const Tensor& v) {
    return transpose(a, {1, 0}) * slice(v, {Slice{1, 7, 1}}) + 1.0f;
  };
  const Tensor a = normal(9, {6, 5}), v = normal(10, {8});
  const auto info = jit(f, kCompiled).compiled(a, v);
  ASSERT_EQ(info.groups.size(), 1u) << info;
  EXPECT_TRUE(info.kernel_calls.empty()) << info;
  expect_same(jit(f, kCompiled)(a, v), jit(f, kInterpreted)(a, v));
}

TEST(Compiler, EdgeShapesAndStridedArguments) {
  auto f = [](const Tensor& x) { return sum(exp(x) * 2.0f, {0}) + max(x); };
  for (const Shape& s : {Shape{0, 3}, Shape{1, 1}, Shape{3, 0}, Shape{5, 7}}) {
    const Tensor x = normal(11, s);
    SCOPED_TRACE(x.type().to_string());
    if (s.numel() == 0) {
      // max of nothing has no identity: both backends raise the kernel's error.
      EXPECT_THROW(jit(f, kInterpreted)(x), Error);
      continue;
    }
    expect_same(jit(f, kCompiled)(x), jit(f, kInterpreted)(x), 1e-6);
  }
  auto g = [](const Tensor& x) { return x * x - 1.0f; };
  const Tensor scalar = tensor(3.0f);
  expect_same(jit(g, kCompiled)(scalar), jit(g, kInterpreted)(scalar));
  const Tensor strided = transpose(normal(12, {4, 6}), {1, 0});  // a non-contiguous argument
  ASSERT_FALSE(strided.is_contiguous());
  expect_same(jit(g, kCompiled)(strided), g(strided));
}

TEST(Compiler, FloatReductionsFollowTheInterpreter) {
  // Float sums accumulate in double in both backends, so float32 results agree exactly.
  const Tensor x = normal(13, {3, 1000}) * 100.0f;
  auto f = [](const Tensor& t) { return sum(t, {1}); };
  const Tensor got = jit(f, kCompiled)(x), want = jit(f, kInterpreted)(x);
  EXPECT_EQ(got.to_vector<float>(), want.to_vector<float>());
  // max/min: NaN propagates, +0 beats -0 whatever the order.
  const Tensor z = tensor({0.0f, -0.0f, -0.0f, 0.0f, -0.0f});
  auto m = [](const Tensor& t) { return max(t); };
  EXPECT_FALSE(std::signbit(jit(m, kCompiled)(z).item<float>()));
  const Tensor n = tensor({1.0f, NAN, 3.0f});
  EXPECT_TRUE(std::isnan(jit(m, kCompiled)(n).item<float>()));
  const Tensor inf = tensor({-INFINITY, -INFINITY});
  EXPECT_EQ(jit(m, kCompiled)(inf).item<float>(), -INFINITY);
}

TEST(Compiler, RowReductionsFuseWithProducersAndConsumers) {
  // Reductions that keep the innermost axis (sums over the batch) accumulate whole rows in
  // the group that computes their operands.
  const int64_t rows = 37, cols = 70, mat = rows * cols * 4, vec = cols * 4;
  const Tensor x = normal(20, {rows, cols}), y = normal(21, {rows, cols}), b = normal(22, {cols});
  struct Case {
    std::string name;
    std::function<std::vector<Tensor>(const Tensor&, const Tensor&, const Tensor&)> f;
    int64_t bytes_written;
  };
  const std::vector<Case> cases = {
      {"bias gradient after relu's backward",
       [](const Tensor& h, const Tensor& dy, const Tensor&) {
         const Tensor dz = where(h > 0.0f, dy, zeros_like(dy));
         return std::vector<Tensor>{dz, sum(dz, {0})};
       },
       mat + vec},
      {"layer norm's scale and shift gradients",
       [](const Tensor& xhat, const Tensor& dy, const Tensor&) {
         return std::vector<Tensor>{sum(dy * xhat, {0}), sum(dy, {0})};
       },
       2 * vec},
      {"an elementwise consumer of the reduced rows",
       [](const Tensor& t, const Tensor&, const Tensor& v) {
         return std::vector<Tensor>{sum(t * t, {0}) * 0.5f + v};
       },
       vec},
      {"centred columns, the mean broadcast back",
       [](const Tensor& t, const Tensor&, const Tensor& v) {
         return std::vector<Tensor>{(t - mean(t, {0}, true)) * v};
       },
       mat},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const auto info = jit(c.f, kCompiled).compiled(x, y, b);
    ASSERT_EQ(info.groups.size(), 1u) << info;
    EXPECT_TRUE(info.kernel_calls.empty()) << info;
    EXPECT_EQ(info.groups[0].bytes_written, c.bytes_written) << info;
    const auto got = jit(c.f, kCompiled)(x, y, b), want = jit(c.f, kInterpreted)(x, y, b);
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t k = 0; k < got.size(); ++k) expect_bits(got[k], want[k]);
  }
  // Rows gathered from a transposed operand stay with the kernel, which reads along the
  // reduced axis instead (the row template measured 2x slower).
  auto transposed = [](const Tensor& t) { return sum(transpose(t, {1, 0}), {0}); };
  const auto info = jit(transposed, kCompiled).compiled(x);
  EXPECT_TRUE(info.groups.empty()) << info;
  EXPECT_EQ(info.kernel_calls.size(), 1u) << info;
  // So do rows of fewer than 8 elements (a branch on the data in the row template).
  auto squares = [](const Tensor& t) { return sum(t * t, {0}); };
  const auto narrow = jit(squares, kCompiled).compiled(normal(23, {rows, 7}));
  EXPECT_EQ(narrow.kernel_calls.size(), 1u) << narrow;
  const auto wide = jit(squares, kCompiled).compiled(normal(23, {rows, 8}));
  EXPECT_TRUE(wide.kernel_calls.empty()) << wide;
}

// A quotient by a divisor that stays the same along the loop (a row's sum, a constant) is a
// product by its reciprocal corrected by a fused multiply-add, with the bits of a division:
// dividends over the whole float range (random bits: denormals, infinities, NaN), zeros of
// both signs, and divisors inside and outside the range where the correction is exact (0,
// denormal, huge, infinite, NaN, negative), in float32 and float64, in vector steps and tails.
TEST(Compiler, DivisionByARowsSumHasTheBitsOfADivision) {
  const std::vector<double> divisors = {
      1,      3,    -7,   0.1, 1e-7, 6e-8,  5e-8,     1e-20, -1e-25, -1e-30, 1e-100, -1e-150, 1e12,
      1.2e12, 1e13, 1e30, 0,   -0.0, 1e-40, INFINITY, NAN,   255,    1e60,   1e-60,  1e200};
  const int64_t rows = static_cast<int64_t>(divisors.size()), cols = 301;
  std::mt19937_64 gen(41);
  for (DType d : {float32, float64}) {
    SCOPED_TRACE(dtype_name(d));
    // Random bits, zeros, and values whose exponents crowd the range's edges in both dtypes.
    const int top = d == float32 ? 150 : 1075, q_bound = d == float32 ? 80 : 700;
    auto exponent = [&](uint64_t bits) {
      const int e = static_cast<int>((bits >> 40) % 60);
      switch ((bits >> 50) % 5) {
        case 0:
          return e - top;  // denormal and tiny dividends
        case 1:
          return top - e;  // huge ones, and infinities
        case 2:
          return e - 30 - q_bound;  // quotients near the lower bound
        case 3:
          return e - 30 + q_bound;  // and near the upper one
        default:
          return e / 6 - 5;
      }
    };
    std::vector<double> x, w;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        const uint64_t bits = gen();
        const double v = d == float32 ? std::bit_cast<float>(static_cast<uint32_t>(bits))
                                      : std::bit_cast<double>(bits);
        const double m = 1.0 + static_cast<double>(bits & 0xfffffffff) * 0x1p-36;
        const double scaled = std::ldexp((bits >> 39) % 2 ? -m : m, exponent(bits));
        x.push_back(c % 5 == 0 ? v : c % 7 == 1 ? (c % 2 ? 0.0 : -0.0) : scaled);
        // The row's sum: its divisor, then zeros of the divisor's sign (so -0 stays -0).
        const double divisor = divisors[static_cast<std::size_t>(r)];
        w.push_back(c == 0 ? divisor : std::signbit(divisor) ? -0.0 : 0.0);
      }
    const Tensor xs = astype(tensor(x, {rows, cols}), d), ws = astype(tensor(w, {rows, cols}), d);
    expect_compiled_bits([](const Tensor& a, const Tensor& b) { return a / sum(b, {-1}, true); },
                         xs, ws);
    expect_compiled_bits([](const Tensor& a) { return a / 3.0; }, xs);
    expect_compiled_bits([](const Tensor& a) { return -1e-3 / a; }, xs);
    // On AVX-512 the division by the row's sum takes the reciprocal's path (its rare branch).
    if (math::host_isa() >= math::Isa::avx512) {
      const TempDir dir;
      const EnvVar env("KILN_DUMP_DIR", dir.path.string());
      jit([](const Tensor& a, const Tensor& b) { return a / sum(b, {-1}, true); }, kCompiled)(xs,
                                                                                              ws);
      EXPECT_GT(dumped_lines(dir.path,
                             [](const std::string& line) { return line.rfind("divide", 0) == 0; }),
                0);
    }
  }
}

TEST(Compiler, RowReductionsAgreeWithTheInterpreterBitForBit) {
  // One accumulator per kept element, combining rows in the interpreter's order: float32 and
  // float64 sums agree to the bit. Shapes cross the vector width and its halves (the steps
  // after the full vectors), the row block (at most 2048 kept indices, fewer for this many
  // reductions) and size-1 and empty axes; rows of fewer than 8 run the kernel.
  for (const Shape& s :
       {Shape{0, 9}, Shape{1, 1}, Shape{1, 9}, Shape{3, 0}, Shape{5, 1}, Shape{2, 3}, Shape{5, 15},
        Shape{4, 29}, Shape{9, 16}, Shape{64, 17}, Shape{7, 513}, Shape{3, 2100}}) {
    for (DType d : {float32, float64}) {
      const Tensor x = normal(30, s, d) * 100.0, y = normal(31, s, d);
      SCOPED_TRACE(x.type().to_string());
      // Several reductions of one domain share the group; max and min have no identity.
      const bool empty = s.numel() == 0;
      expect_compiled_bits(
          [empty](const Tensor& a, const Tensor& c) {
            std::vector<Tensor> r = {sum(a * c + 1.0, {0}), prod(1.0 + a * 1e-3, {0}),
                                     mean(exp(a * 1e-2), {0}, true), any(a > 50.0, {0}),
                                     all(a < 50.0, {0})};
            if (!empty) {
              r.push_back(max(a * 2.0, {0}));
              r.push_back(min(a - 1.0, {0}));
            }
            return r;
          },
          x, y);
      const Tensor i = astype(x * 1e6, int32), l = astype(x * 1e9, int64);
      expect_compiled_bits(
          [empty](const Tensor& a, const Tensor& c) {
            std::vector<Tensor> r = {sum(a * a, {0}), sum(c * 3 - 1, {0})};  // i32 wraps
            if (!empty) r.push_back(max(a, {0}));
            return r;
          },
          i, l);
    }
  }
  // Higher rank: any kept axes before the innermost, any reduced ones.
  const Tensor t = normal(32, {4, 6, 35}) * 10.0f;
  for (const Axes& axes : {Axes{0}, Axes{1}, Axes{0, 1}}) {
    SCOPED_TRACE(::testing::PrintToString(axes));
    expect_compiled_bits([&](const Tensor& a) { return sum(sin(a), axes); }, t);
    expect_compiled_bits([&](const Tensor& a) { return max(a * a, axes, true); }, t);
  }
  // Non-contiguous operands: a transpose (the kept axis read with a stride) and a stepped
  // slice.
  const Tensor u = normal(33, {40, 23});
  expect_compiled_bits([](const Tensor& a) { return sum(transpose(a, {1, 0}) * 3.0f, {0}); }, u);
  expect_compiled_bits(
      [](const Tensor& a) {
        return sum(slice(a, {Slice{1, 39, 2}, Slice{0, 23, 3}}), {0});
      },
      u);
}

TEST(Compiler, RowReductionsOfSignedZerosAndNaNs) {
  // Columns: {-0, +0, -0}, {-0, -0, -0}, {1, NaN, 2}, {NaN, -inf, 3}, {-inf, -inf, -inf}; each
  // max and min worked out by hand (NaN wins, +0 beats -0 for max and -0 for min).
  const float nan = NAN, inf = INFINITY;
  const Tensor x = tensor(
      {-0.0f, -0.0f, 1.0f, nan, -inf, 0.0f, -0.0f, nan, -inf, -inf, -0.0f, -0.0f, 2.0f, 3.0f, -inf},
      {3, 5});
  auto mx = [](const Tensor& a) { return max(a * 1.0f, {0}); };
  auto mn = [](const Tensor& a) { return min(a * 1.0f, {0}); };
  expect_bits(jit(mx, kCompiled)(x), tensor({0.0f, -0.0f, nan, nan, -inf}));
  expect_bits(jit(mn, kCompiled)(x), tensor({-0.0f, -0.0f, nan, nan, -inf}));
  expect_compiled_bits(mx, x);
  expect_compiled_bits(mn, x);
  // 200 columns, 40 copies of each: vector lanes and the scalar tail.
  const Tensor wide = reshape(broadcast_to(reshape(x, {3, 1, 5}), {3, 40, 5}), {3, 200});
  expect_compiled_bits(mx, wide);
  expect_compiled_bits(mn, wide);
}

TEST(Compiler, RowReductionsAreTheSameForAnyThreadCount) {
  // A row group splits its kept indices among threads (here mid-row of the innermost axis),
  // never a reduced axis: its max, and its sum that the group reads, are the interpreter's bits
  // on any thread count, float64 sums included.
  for (DType d : {float32, float64}) {
    const Tensor x = normal(34, {3, 200, 1001}, d) * 10.0;
    auto f = [](const Tensor& a) {
      return std::vector<Tensor>{max(a * a + 1.0, {1}), sum(a * a + 1.0, {1}) * 2.0};
    };
    const auto info = jit(f, kCompiled).compiled(x);
    ASSERT_EQ(info.groups.size(), 1u) << info;
    EXPECT_NE(info.groups[0].kernel.find("domain=[3,200r,1001]"), std::string::npos) << info;
    const std::vector<Tensor> want = jit(f, kInterpreted)(x);
    for (int t : {1, 2}) {
      const Threads threads(t);
      const std::vector<Tensor> got = jit(f, kCompiled)(x);
      expect_bits(got[0], want[0]);
      expect_bits(got[1], want[1]);
    }
  }
}

// A row group whose reductions are sums that nothing in it reads runs as a column group with
// the sums as totals, so threads split its rows: each adds its rows in double and the runtime
// adds the threads' sums in order. A sum over every axis of a large domain likewise becomes a
// total over rows that threads split.
TEST(Compiler, SumsOverRowsSplitTheRowsAmongThreads) {
  auto bias_and_scale = [](const Tensor& dy, const Tensor& x) {
    const Tensor dz = dy * tanh(x);
    return std::vector<Tensor>{dz, sum(dz, {0, 1}), sum(dy * x, {0, 1})};
  };
  for (DType d : {float32, float64}) {
    // Rows across the vector width and its tail, a batch axis in front; fewer than 64 rows, or
    // fewer rows than kept indices, stay a row group (a few rows would split unevenly among
    // threads, and many kept indices would make each thread's array of sums large).
    for (const Shape& s :
         {Shape{4, 300, 1003}, Shape{8, 128, 256}, Shape{2, 20, 70}, Shape{2, 100, 256}}) {
      const Tensor dy = normal(35, s, d) * 10.0, x = normal(36, s, d);
      SCOPED_TRACE(dy.type().to_string());
      const auto info = jit(bias_and_scale, kCompiled).compiled(dy, x);
      ASSERT_EQ(info.groups.size(), 1u) << info;
      const int64_t rows = s.dims()[0] * s.dims()[1];
      const bool split = rows >= 64 && rows >= s.dims()[2];
      const std::string d0 = std::to_string(s.dims()[0]), d1 = std::to_string(s.dims()[1]),
                        d2 = std::to_string(s.dims()[2]);
      const std::string& kernel = info.groups[0].kernel;
      EXPECT_NE(kernel.find(split ? "domain=[" + d0 + "," + d1 + "," + d2 + "r]"
                                  : "domain=[" + d0 + "r," + d1 + "r," + d2 + "]"),
                std::string::npos)
          << info;
      EXPECT_EQ(kernel.find(" total ") != std::string::npos, split) << info;
      const std::vector<Tensor> want = jit(bias_and_scale, kInterpreted)(dy, x);
      for (int t : {1, 2}) {
        SCOPED_TRACE(t);
        const Threads threads(t);
        const std::vector<Tensor> got = jit(bias_and_scale, kCompiled)(dy, x);
        expect_bits(got[0], want[0]);
        // Added in double and rounded once, float32 sums come out as the interpreter's here;
        // float64 ones do on one thread, and on two within the reassociation bound.
        for (std::size_t k : {1u, 2u}) {
          if (d == float32 || t == 1) {
            expect_bits(got[k], want[k]);
          } else {
            expect_same(got[k], want[k], 1e-12);
          }
          expect_bits(jit(bias_and_scale, kCompiled)(dy, x)[k], got[k]);  // run to run
        }
      }
    }
    // A kept axis between reduced ones: the rows are the middle axis' indices.
    const Tensor m = normal(37, {4, 400, 70}, d);
    auto middle = [](const Tensor& a) { return sum(a * a, {1}); };
    const auto info = jit(middle, kCompiled).compiled(m);
    ASSERT_EQ(info.groups.size(), 1u) << info;
    EXPECT_NE(info.groups[0].kernel.find("domain=[4r,400,70r]"), std::string::npos) << info;
    expect_same(jit(middle, kCompiled)(m), jit(middle, kInterpreted)(m), 1e-12);
    // Sums of squares over every axis of gradients (a global norm): a group summing rows on
    // every thread, then one for the square root; also when the rows are short.
    auto squares = [](const Tensor& a, const Tensor& b) { return sqrt(sum(a * a) + sum(b * b)); };
    for (const Shape& s : {Shape{512, 300}, Shape{1000, 100}}) {
      const Tensor a = normal(38, s, d), b = normal(39, s, d);
      const auto sq = jit(squares, kCompiled).compiled(a, b);
      ASSERT_EQ(sq.groups.size(), 2u) << sq;
      EXPECT_NE(sq.groups[0].kernel.find("domain=[" + std::to_string(s.dims()[0]) + "," +
                                         std::to_string(s.dims()[1]) + "r]"),
                std::string::npos)
          << sq;
      const Tensor want = jit(squares, kInterpreted)(a, b);
      for (int t : {1, 2}) {
        const Threads threads(t);
        expect_same(jit(squares, kCompiled)(a, b), want, d == float32 ? 1e-6 : 1e-13);
      }
    }
  }
  // Stays a row group: a sum read inside the group.
  const Tensor t = normal(40, {128, 70}), v = normal(41, {70});
  auto read_inside = [](const Tensor& a, const Tensor& b) { return sum(a * a, {0}) * 0.5f + b; };
  const auto inside = jit(read_inside, kCompiled).compiled(t, v);
  ASSERT_EQ(inside.groups.size(), 1u) << inside;
  EXPECT_NE(inside.groups[0].kernel.find("domain=[128r,70]"), std::string::npos) << inside;
  expect_compiled_bits(read_inside, t, v);
  // A sum broadcast back over the domain leaves the group as the sum, its broadcast a view of
  // it: the rows split as for any other sum.
  auto broadcast = [](const Tensor& a) { return broadcast_to(sum(a * a, {0}, true), a.shape()); };
  const auto info = jit(broadcast, kCompiled).compiled(t);
  ASSERT_EQ(info.groups.size(), 1u) << info;
  EXPECT_EQ(info.groups[0].bytes_written, 70 * 4) << info;
  EXPECT_NE(info.groups[0].kernel.find("domain=[128,70r]"), std::string::npos) << info;
  for (int threads : {1, 2}) {
    const Threads guard(threads);
    expect_compiled_bits(broadcast, t);
  }
}

// A reduced value broadcast back over the domain and read outside its group (a softmax's
// denominator, which its gradient reads) is stored once, unbroadcast; the readers, fused loops
// and kernels alike, and the caller, read a broadcast view of it.
TEST(Compiler, BroadcastsOfReducedValuesAreStoredOnce) {
  auto f = [](const Tensor& x, const Tensor& w) {
    const Tensor d = broadcast_to(sum(exp(x), {-1}, true), x.shape());
    const Tensor y = exp(x) / d;
    return std::vector<Tensor>{matmul(d, w), sum(y * d, {0}), d};
  };
  for (DType dt : {float32, float64}) {
    const Tensor x = normal(44, {96, 40}, dt), w = normal(45, {40, 8}, dt);
    SCOPED_TRACE(x.type().to_string());
    const auto info = jit(f, kCompiled).compiled(x, w);
    int64_t written = 0;
    for (const auto& g : info.groups) written += g.bytes_written;
    const int64_t elem = static_cast<int64_t>(dtype_size(dt));
    // y, which a second group reduces over the other axis, the sum (96) and sum(y * d) over
    // the rows (40): not the [96, 40] broadcast as well.
    EXPECT_EQ(written, (96 * 40 + 96 + 40) * elem) << info;
    const std::vector<Tensor> got = jit(f, kCompiled)(x, w), want = jit(f, kInterpreted)(x, w);
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t k = 0; k < got.size(); ++k)
      expect_same(got[k], want[k], dt == float32 ? 1e-5 : 1e-12);
    EXPECT_EQ(got[2].shape(), x.shape());
  }
}

// Sums over the rows that a column group normalises (a layer norm's scale and shift
// gradients) and over everything (a loss) join that group as totals: each thread sums its rows
// in double and the runtime adds the threads' sums in order.
TEST(Compiler, TotalsOverTheKeptAxesJoinTheColumnGroup) {
  auto layer_norm = [](const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& r) {
    const Tensor m = mean(x, {-1}, true), c = x - m;
    return sum((c * rsqrt(mean(c * c, {-1}, true) + 1e-5) * w + b) * r);
  };
  auto step = value_and_grad(layer_norm, argnums<0, 1, 2>);
  // Rows across the vector width and its tail; enough of them for two threads to split; no
  // rows; a batch axis in front (the totals then run over two kept axes).
  for (const Shape& s : {Shape{5, 70}, Shape{300, 1003}, Shape{0, 9}, Shape{3, 40, 33}}) {
    for (DType d : {float32, float64}) {
      const int64_t n = s.dims().back();
      const Tensor x = normal(40, s, d) * 3.0, r = normal(41, s, d);
      const Tensor w = 1.0 + 0.1 * normal(42, {n}, d), b = 0.1 * normal(43, {n}, d);
      SCOPED_TRACE(x.type().to_string());
      const auto info = jit(step, kCompiled).compiled(x, w, b, r);
      EXPECT_EQ(info.groups.size(), 1u) << info;
      EXPECT_TRUE(info.kernel_calls.empty()) << info;
      const auto [li, gi] = jit(step, kInterpreted)(x, w, b, r);
      const double tol = d == float32 ? 1e-5 : 1e-12;
      for (int t : {1, 2}) {
        SCOPED_TRACE(t);
        const Threads threads(t);
        const auto [l, g] = jit(step, kCompiled)(x, w, b, r);
        expect_same(l, li, tol);
        expect_same(std::get<0>(g), std::get<0>(gi), tol);
        expect_same(std::get<1>(g), std::get<1>(gi), tol);
        expect_same(std::get<2>(g), std::get<2>(gi), tol);
        // The same bits on every run with this many threads.
        const auto [l2, g2] = jit(step, kCompiled)(x, w, b, r);
        expect_bits(l2, l);
        expect_bits(std::get<1>(g2), std::get<1>(g));
      }
    }
  }
  // Sums over the kept axes of: a kernel's output that an output of an earlier pass would be
  // written over (the total still reads it in the last pass); a value broadcast over the
  // reduced axes (not a total: its slots would be per kept index); a row normalised over two
  // axes (slots over both); a single row.
  {
    const Tensor a = normal(47, {64, 30}), b = normal(48, {30, 256});
    auto f = [](const Tensor& p, const Tensor& q) {
      const Tensor x = matmul(p, q);
      return std::vector<Tensor>{x * 2.0f, sum(x - max(x, {1}, true), {0})};
    };
    const auto got = jit(f, kCompiled)(a, b), want = jit(f, kInterpreted)(a, b);
    expect_same(got[0], want[0], 1e-6);
    expect_same(got[1], want[1], 1e-5);
  }
  auto normalised = [](const Axes& axes) {
    return [axes](const Tensor& t) {
      const Tensor e = exp(t - max(t, axes, true));
      return sum(e / sum(e, axes, true) * t, {0});
    };
  };
  const std::vector<std::pair<std::function<Tensor(const Tensor&)>, Shape>> more = {
      {[](const Tensor& t) {
         return sum(broadcast_to(max(t, {1}, true), {4, 16}), {0});
       },
       Shape{4, 16}},
      {normalised({1, 2}), Shape{6, 5, 40}},
      {normalised({1}), Shape{1, 37}},
  };
  for (const auto& [f, s] : more) {
    const Tensor x = normal(49, s);
    SCOPED_TRACE(x.type().to_string());
    expect_same(jit(f, kCompiled)(x), jit(f, kInterpreted)(x), 1e-5);
  }
  EXPECT_EQ(jit(normalised({1, 2}), kCompiled).compiled(normal(49, {6, 5, 40})).groups.size(), 1u);
  // On one thread a total over the kept axes adds the rows in the interpreter's order, in
  // double: the interpreter's bits, float64 too (the group's other reduction is a max, which
  // does not depend on the order). Its consumers run after the group.
  for (DType d : {float32, float64}) {
    const Tensor x = normal(44, {300, 1003}, d) * 3.0;
    SCOPED_TRACE(x.type().to_string());
    auto f = [](const Tensor& a) {
      const Tensor c = a - max(a, {-1}, true);
      return std::vector<Tensor>{sum(c * a, {0}) * 2.0 - 1.0, sum(exp(c), {0})};
    };
    EXPECT_EQ(jit(f, kCompiled).compiled(x).groups.size(), 2u);
    const Threads one(1);
    expect_compiled_bits(f, x);
  }
}

// A float sum over the domain's innermost axes and some leading ones (a convolution's bias
// gradient, over N, H and W of [N, C, H, W]) joins the elementwise group that makes its operand:
// the group sums each row over the trailing axes in double, and a total adds the rows' sums
// per index of the axes it keeps.
TEST(Compiler, SumsOverLeadingAndTrailingAxesJoinTheElementwiseGroup) {
  struct Case {
    Shape shape;
    Axes axes;
    bool keepdims = false;
  };
  const std::vector<Case> cases = {
      {{6, 32, 14, 14}, {0, 2, 3}},
      {{5, 7, 6, 9}, {0, 2, 3}, true},
      {{3, 4, 5, 6}, {0, 1, 3}},
      {{2, 3, 1, 40}, {0, 2, 3}},
      {{4, 5, 33}, {0, 2}},
      {{0, 4, 3, 3}, {0, 2, 3}},
      {{300, 8, 3, 5}, {0, 2, 3}},
      {{3, 4, 5, 6, 7}, {0, 3, 4}},
      // One channel: a sum over every axis of size > 1, the column group's own reduction.
      {{6, 1, 14, 14}, {0, 2, 3}},
  };
  for (const Case& c : cases) {
    const Axes axes = c.axes;
    const bool keepdims = c.keepdims;
    auto relu_grad = [axes, keepdims](const Tensor& x, const Tensor& g) {
      const Tensor dy = where(x > 0.0, g * 2.0, zeros_like(g));
      return std::vector<Tensor>{dy, sum(dy, axes, keepdims)};
    };
    for (DType d : {float32, float64}) {
      const Tensor x = normal(50, c.shape, d), g = normal(51, c.shape, d) * 3.0;
      SCOPED_TRACE(x.type().to_string());
      const auto info = jit(relu_grad, kCompiled).compiled(x, g);
      EXPECT_EQ(info.groups.size(), 1u) << info;
      EXPECT_TRUE(info.kernel_calls.empty()) << info;
      const auto want = jit(relu_grad, kInterpreted)(x, g);
      for (int t : {1, 2}) {
        SCOPED_TRACE(t);
        const Threads threads(t);
        const auto got = jit(relu_grad, kCompiled)(x, g);
        expect_same(got[0], want[0], 0.0);
        expect_same(got[1], want[1], d == float32 ? 1e-5 : 1e-12);
        expect_bits(jit(relu_grad, kCompiled)(x, g)[1], got[1]);
      }
    }
  }
  // An integer sum keeps its own group.
  auto counts = [](const Tensor& x) {
    const Tensor m = astype(x > 0.0, int32);
    return std::vector<Tensor>{m * 2, sum(m, {0, 2})};
  };
  const Tensor x = normal(52, {4, 5, 33});
  EXPECT_EQ(jit(counts, kCompiled).compiled(x).groups.size(), 2u);
  const auto got = jit(counts, kCompiled)(x), want = jit(counts, kInterpreted)(x);
  EXPECT_EQ(got[1].to_vector<int32_t>(), want[1].to_vector<int32_t>());
}

// One-row products of small matrices (a decoding step's attention over its cache: a query row
// against each head's keys, the weights against the values) run as a multiply and a sum fused
// into a loop nest, not a library call per product; other products stay matmul kernels.
TEST(Compiler, ThinBatchedProductsRunAsFusedSums) {
  auto scores = [](const Tensor& q, const Tensor& k) { return matmul(q, swapaxes(k, -1, -2)); };
  auto mix = [](const Tensor& w, const Tensor& v) { return matmul(w, v) * 2.0; };
  auto kernel_calls = [](const auto& f, const Tensor& a, const Tensor& b) {
    return jit(f, kCompiled).compiled(a, b).kernel_calls.size();
  };
  for (DType d : {float32, float64}) {
    const double tol = d == float32 ? 1e-5 : 1e-12;
    // Heads of a cache, the tail of a vector width, a product at the size bound.
    for (const auto& [q_shape, k_shape] :
         std::vector<std::pair<Shape, Shape>>{{{2, 3, 1, 40}, {2, 3, 50, 40}},
                                              {{5, 1, 9}, {5, 17, 9}},
                                              {{2, 1, 64}, {2, 1024, 64}}}) {
      const Tensor q = normal(60, q_shape, d), k = normal(61, k_shape, d);
      SCOPED_TRACE(k.type().to_string());
      EXPECT_EQ(kernel_calls(scores, q, k), 0u);
      expect_same(jit(scores, kCompiled)(q, k), jit(scores, kInterpreted)(q, k), tol);
      const Tensor w = softmax(jit(scores, kInterpreted)(q, k), -1);
      EXPECT_EQ(kernel_calls(mix, w, k), 0u);
      expect_same(jit(mix, kCompiled)(w, k), jit(mix, kInterpreted)(w, k), tol);
    }
  }
  // Short rows of keys fuse too (the column template sums them); kernels still: two rows, one
  // matrix, too large a matrix, rows of values shorter than 8 (a sum keeping them runs its
  // kernel), integers.
  {
    const Tensor q = normal(60, {4, 1, 7}), k = normal(61, {4, 30, 7});
    EXPECT_EQ(kernel_calls(scores, q, k), 0u);
    expect_same(jit(scores, kCompiled)(q, k), jit(scores, kInterpreted)(q, k), 1e-5);
  }
  for (const auto& [a, b] :
       std::vector<std::pair<Tensor, Tensor>>{{normal(62, {2, 2, 16}), normal(63, {2, 16, 8})},
                                              {normal(62, {1, 1, 64}), normal(63, {1, 64, 128})},
                                              {normal(62, {2, 1, 64}), normal(63, {2, 64, 1025})},
                                              {normal(62, {8, 1, 64}), normal(63, {8, 64, 4})},
                                              {astype(normal(62, {2, 1, 16}) * 9.0, int32),
                                               astype(normal(63, {2, 16, 8}) * 9.0, int32)}}) {
    SCOPED_TRACE(b.type().to_string());
    EXPECT_EQ(kernel_calls(mix, a, b), 1u);
  }
}

// Below avx512 (KILN_ISA; CI runs this file at avx2, sse4 and scalar) the generated code has
// none of AVX-512's registers or instructions: at avx2 on an AVX-512 CPU it is what an AVX2 CPU
// runs. (On a CPU without AVX-512 this holds trivially.)
TEST(Compiler, GeneratedCodeStaysWithinTheInstructionSet) {
  const TempDir dir;
  {
    const EnvVar env("KILN_DUMP_DIR", dir.path.string());
    jit([](const Tensor& x, const Tensor& y) { return tanh(x) * sigmoid(y) + exp(x * y); },
        kCompiled)(normal(64, {1000}), normal(65, {1000}));
  }
  auto lines = [&](const char* pattern) {
    const std::regex re(pattern);
    return dumped_lines(
        dir.path, [&](const std::string& line) { return std::regex_search(line, re); }, ".s");
  };
  // zmm registers, mask registers, the upper 16 xmm/ymm registers, embedded broadcasts and
  // ternary logic: each only with AVX-512.
  const int avx512 = lines("%zmm|%k[0-7]\\b|%[xy]mm(1[6-9]|2[0-9]|3[01])\\b|\\{1to|vpternlog");
  const math::Isa isa = math::host_isa();
  if (isa < math::Isa::avx512)
    EXPECT_EQ(avx512, 0);
  else
    EXPECT_GT(lines("%zmm"), 0);
  if (isa == math::Isa::avx2) {
    EXPECT_GT(lines("%ymm"), 0);
    EXPECT_GT(lines("vfn?m(add|sub)"), 0);
  }
  // Shares of the peak (KILN_PROFILE, the benchmarks) are of the peak of the same set.
  EXPECT_EQ(machine_peak(1).isa, isa == math::Isa::avx512 ? "avx512"
                                 : isa == math::Isa::avx2 ? "avx2"
                                                          : "sse");
}

// A column group's second pass over a row asks for the next row's inputs (the first pass then
// finds them in cache); row groups get no prefetches.
TEST(Compiler, ColumnGroupsPrefetchTheNextRow) {
  auto prefetches = [&](const auto& f, const auto&... args) {
    const TempDir dir;
    const EnvVar env("KILN_DUMP_DIR", dir.path.string());
    jit(f, kCompiled)(args...);
    return dumped_lines(dir.path, [](const std::string& line) {
      return line.find("call void @llvm.prefetch") != std::string::npos;
    });
  };
  const Tensor x = normal(45, {16, 1000}), w = normal(46, {1000});
  // softmax reads x (two rounds); x - max(x) has one round and a last pass. (A column group
  // that streams its output emits its row loops twice.)
  EXPECT_GE(prefetches([](const Tensor& t) { return softmax(t, -1); }, x), 1);
  EXPECT_GE(prefetches([](const Tensor& t) { return t - max(t, {-1}, true); }, x), 1);
  EXPECT_GE(prefetches([](const Tensor& t, const Tensor& c) { return softmax(t * c, -1); }, x, w),
            1);
  EXPECT_EQ(prefetches([](const Tensor& t) { return t - max(t, {0}, true); }, x), 0);
}

TEST(Compiler, ControlFlowBodiesCompileAndAgree) {
  auto f = [](const Tensor& x) {
    return while_loop([](const Tensor& a) { return sum(abs(a)) < 50.0; },
                      [](const Tensor& a) { return tanh(a) * 1.5 + a; }, x);
  };
  const Tensor x = normal(14, {8}, float64);
  expect_same(jit(f, kCompiled)(x), jit(f, kInterpreted)(x), 1e-12);
  // The reverse mode of a scan: its residual stack and both bodies run compiled.
  auto rnn = [](const Tensor& w, const Tensor& xs) {
    auto [h, ys] = scan(
        [&](const Tensor& c, const Tensor& r) {
          const Tensor n = tanh(c * w + r);
          return std::pair{n, n};
        },
        zeros({4}, float64), xs);
    return sum(ys) + sum(h);
  };
  const Tensor w = normal(15, {4}, float64), xs = normal(16, {6, 4}, float64);
  expect_same(jit(grad(rnn), kCompiled)(w, xs), jit(grad(rnn), kInterpreted)(w, xs), 1e-12);
}

TEST(Compiler, TheBackendIsAnOption) {
  auto f = [](const Tensor& x) { return x + 1.0f; };
  EXPECT_EQ(jit(f, kInterpreted).compiled(ones({3})).backend, ir::Backend::interpreter);
  EXPECT_EQ(jit(f, kCompiled).compiled(ones({3})).backend, ir::Backend::llvm);
  {
    const EnvVar env("KILN_JIT_BACKEND", "interpreter");
    EXPECT_EQ(jit(f).compiled(ones({3})).backend, ir::Backend::interpreter);
  }
  {
    const EnvVar env("KILN_JIT_BACKEND", "gpu");
    kiln::testing::expect_error([&] { jit(f)(ones({3})); }, "jit",
                                {"KILN_JIT_BACKEND is 'gpu'", "expected 'llvm' or 'interpreter'"});
  }
}

TEST(Compiler, TheDiskCacheSkipsLlvmAndRebuildsDamagedEntries) {
  const TempDir dir;
  const EnvVar env("KILN_CACHE_DIR", dir.path.string());
  auto f = [](const Tensor& x) { return exp(x) * 3.0f - x; };
  const Tensor x = normal(15, {100});
  const Tensor want = jit(f, kInterpreted)(x);
  EXPECT_FALSE(jit(f, kCompiled).compiled(x).from_cache);
  // A new jit of the same program (as a second process would) reads the cache.
  EXPECT_TRUE(jit(f, kCompiled).compiled(x).from_cache);
  expect_same(jit(f, kCompiled)(x), want, 1e-6);
  // Damage every entry: the cache is not trusted, the code is rebuilt and rewritten.
  std::vector<std::filesystem::path> entries;
  for (const auto& e : std::filesystem::directory_iterator(dir.path)) entries.push_back(e.path());
  ASSERT_EQ(entries.size(), 1u);
  for (const auto& p : entries) {
    std::fstream file(p, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(200);
    file.write("garbage", 7);
  }
  EXPECT_FALSE(jit(f, kCompiled).compiled(x).from_cache);
  expect_same(jit(f, kCompiled)(x), want, 1e-6);
  EXPECT_TRUE(jit(f, kCompiled).compiled(x).from_cache);
  // A truncated or foreign file is no entry either.
  for (const auto& p : entries) std::filesystem::resize_file(p, 10);
  EXPECT_FALSE(jit(f, kCompiled).compiled(x).from_cache);
}

namespace {

// The one entry of cache directory `dir`.
std::filesystem::path only_entry(const std::filesystem::path& dir) {
  std::vector<std::filesystem::path> entries;
  for (const auto& e : std::filesystem::directory_iterator(dir)) entries.push_back(e.path());
  EXPECT_EQ(entries.size(), 1u);
  return entries.at(0);
}

std::string file_bytes(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

// An entry replaced by something other than a regular file of a plausible size is ignored: the
// code is rebuilt, without waiting on a FIFO or reading a device or a huge file.
TEST(Compiler, TheDiskCacheReadsOnlyRegularFilesOfAPlausibleSize) {
  const TempDir dir;
  const EnvVar env("KILN_CACHE_DIR", dir.path.string());
  auto f = [](const Tensor& x) { return exp(x) * 3.0f - x; };
  const Tensor x = normal(16, {100});
  jit(f, kCompiled)(x);
  const std::filesystem::path entry = only_entry(dir.path);
  const Tensor want = jit(f, kInterpreted)(x);
  const std::vector<std::function<void()>> replacements = {
      [&] { std::filesystem::create_directory(entry); },
      [&] { ASSERT_EQ(mkfifo(entry.c_str(), 0600), 0); },
      [&] { std::filesystem::create_symlink("/dev/zero", entry); },
      [&] {
        std::ofstream(entry).put('K');
        std::filesystem::resize_file(entry, uint64_t{3} << 30);  // sparse
      },
  };
  for (const auto& replace : replacements) {
    std::filesystem::remove_all(entry);
    replace();
    const auto start = std::chrono::steady_clock::now();
    EXPECT_FALSE(jit(f, kCompiled).compiled(x).from_cache);
    expect_same(jit(f, kCompiled)(x), want, 1e-6);
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  }
}

// An entry is checked against the full key stored inside it and its objects parsed before the
// JIT links them: an entry whose checksum was recomputed over a damaged object is rebuilt.
TEST(Compiler, TheDiskCacheChecksTheKeyAndTheObjectsInsideAnEntry) {
  const TempDir dir;
  const EnvVar env("KILN_CACHE_DIR", dir.path.string());
  auto f = [](const Tensor& x) { return tanh(x) * 2.0f; };
  const Tensor x = normal(17, {100});
  const Tensor want = jit(f, kInterpreted)(x);
  jit(f, kCompiled)(x);
  const std::filesystem::path entry = only_entry(dir.path);
  const std::string bytes = file_bytes(entry);
  // The format: magic, the key's size and text, ...
  uint64_t key_size = 0;
  std::memcpy(&key_size, bytes.data() + 8, 8);
  const std::string key = bytes.substr(16, key_size);
  EXPECT_NE(key.find("\nisa " + std::string(math::isa_name(math::host_isa())) + "\n"),
            std::string::npos);
  EXPECT_FALSE(compiler::decode_cache_entry(bytes, key + " ").has_value());
  const std::optional<std::vector<std::string>> objects = compiler::decode_cache_entry(bytes, key);
  ASSERT_TRUE(objects.has_value());
  const std::vector<std::function<void(std::string&)>> damages = {
      [](std::string& o) { o.resize(o.size() / 2); },
      [](std::string& o) { std::memset(o.data() + 0x28, 0x7f, 8); },  // e_shoff
      [](std::string& o) { std::memset(o.data() + 0x40, 0xff, o.size() - 0x40); },
  };
  for (const auto& damage : damages) {
    std::vector<std::string> forged = *objects;
    damage(forged[0]);
    const std::string forged_entry = compiler::encode_cache_entry(key, forged);
    EXPECT_FALSE(compiler::decode_cache_entry(forged_entry, key).has_value());
    std::ofstream(entry, std::ios::binary | std::ios::trunc) << forged_entry;
    EXPECT_FALSE(jit(f, kCompiled).compiled(x).from_cache);
    expect_same(jit(f, kCompiled)(x), want, 1e-6);
  }
  EXPECT_TRUE(jit(f, kCompiled).compiled(x).from_cache);
}

// Fills KILN_CACHE_DIR for TheDiskCacheKeysTheInstructionSet, in a process of its own.
TEST(Compiler, DISABLED_FillTheDiskCache) {
  jit([](const Tensor& x) { return exp(x) + 1.0f; }, kCompiled)(normal(18, {100}));
}

// A cache filled under KILN_ISA=avx2 is not used by a process on another instruction set: the
// key holds the instruction set the code was generated for.
TEST(Compiler, TheDiskCacheKeysTheInstructionSet) {
  if (math::host_isa() == math::Isa::avx2) GTEST_SKIP() << "the host's instruction set is avx2";
  const TempDir dir;
  const std::string child = "KILN_ISA=avx2 KILN_CACHE_DIR=" + dir.path.string() + " " +
                            std::filesystem::read_symlink("/proc/self/exe").string() +
                            " --gtest_also_run_disabled_tests "
                            "--gtest_filter=Compiler.DISABLED_FillTheDiskCache > /dev/null";
  ASSERT_EQ(std::system(child.c_str()), 0);
  only_entry(dir.path);
  const EnvVar env("KILN_CACHE_DIR", dir.path.string());
  auto f = [](const Tensor& x) { return exp(x) + 1.0f; };
  const Tensor x = normal(18, {100});
  EXPECT_FALSE(jit(f, kCompiled).compiled(x).from_cache);
  expect_same(jit(f, kCompiled)(x), jit(f, kInterpreted)(x), 1e-6);
  EXPECT_TRUE(jit(f, kCompiled).compiled(x).from_cache);
}

// A module large enough is split into parts that compile on threads of their own
// (KILN_COMPILE_THREADS): the same kernels, so the same bits as compiling it whole, and the
// disk cache keeps every part's object.
TEST(Compiler, ModulesCompiledInPartsOnThreadsComputeAsOnePart) {
  auto step = grad([](const Tensor& w1, const Tensor& w2, const Tensor& x) {
    const Tensor h = tanh(matmul(x, w1)) * sigmoid(x);
    const Tensor p = softmax(matmul(h, w2), -1);
    return mean(log_softmax(p * h, -1) * exp(-h) + log1p(p * p));
  });
  const Tensor w1 = normal(40, {24, 24}), w2 = normal(41, {24, 24}), x = normal(42, {9, 24});
  // The dumped modules (one per part), and the gradient.
  auto compile = [&](int threads) {
    const TempDir dir;
    const EnvVar dump("KILN_DUMP_DIR", dir.path.string());
    const EnvVar env("KILN_COMPILE_THREADS", std::to_string(threads));
    const Tensor g = jit(step, kCompiled)(w1, w2, x);
    int modules = 0;
    for (const auto& e : std::filesystem::directory_iterator(dir.path))
      modules += e.path().extension() == ".ll";
    return std::pair{modules, g};
  };
  const auto [whole_modules, whole] = compile(1);
  const auto [split_modules, split] = compile(3);
  EXPECT_EQ(whole_modules, 1);
  EXPECT_GT(split_modules, 1);
  expect_bits(split, whole);
  expect_same(whole, jit(step, kInterpreted)(w1, w2, x), 1e-5);

  const TempDir cache;
  const EnvVar env("KILN_CACHE_DIR", cache.path.string());
  const EnvVar threads("KILN_COMPILE_THREADS", "3");
  EXPECT_FALSE(jit(step, kCompiled).compiled(w1, w2, x).from_cache);
  EXPECT_TRUE(jit(step, kCompiled).compiled(w1, w2, x).from_cache);
  expect_bits(jit(step, kCompiled)(w1, w2, x), whole);
}

TEST(Compiler, DumpsLlvmIrAndAssembly) {
  const TempDir dir;
  const EnvVar env("KILN_DUMP_DIR", dir.path.string());
  auto f = [](const Tensor& x) { return x * 2.0f + 1.0f; };
  jit(f, kCompiled)(ones({16}));
  int ll = 0, s = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path)) {
    ll += e.path().extension() == ".ll";
    s += e.path().extension() == ".s";
  }
  EXPECT_EQ(ll, 1);
  EXPECT_EQ(s, 1);
}

// A program's functions share one module of kernels: a group that the top level and a loop
// body compute alike is emitted, and compiled, once.
TEST(Compiler, AKernelSharedByALoopBodyCompilesOnce) {
  auto layer = [](const Tensor& c) { return tanh(c) * 2.0f + 1.0f; };
  auto f = [&](const Tensor& x, const Tensor& xs) {
    auto step = [&](const Tensor& c, const Tensor&) { return std::pair{layer(c), std::tuple<>{}}; };
    return scan(step, layer(x), xs).first;
  };
  const Tensor x = normal(43, {64}), xs = zeros({3, 1});
  const TempDir dir;
  const EnvVar env("KILN_DUMP_DIR", dir.path.string());
  const EnvVar threads("KILN_COMPILE_THREADS", "1");
  const EnvVar no_cache("KILN_CACHE_DIR", "");  // a cached program would dump nothing
  expect_bits(jit(f, kCompiled)(x, xs), jit(f, kInterpreted)(x, xs));
  EXPECT_EQ(dumped_lines(dir.path,
                         [](const std::string& line) {
                           return line.rfind("define", 0) == 0 &&
                                  line.find("@kiln_group") != std::string::npos;
                         }),
            1);
}

// A function's name becomes a file name inside KILN_DUMP_DIR: one with "../" or a leading "/"
// writes there too, never beside or above it.
TEST(Compiler, DumpsStayInsideTheDumpDirectory) {
  const TempDir root;
  const std::filesystem::path dir = root.path / "dumps";
  const EnvVar env("KILN_DUMP_DIR", dir.string());
  auto f = [](const Tensor& x) { return x * 2.0f + 1.0f; };
  for (const std::string name : {"../escaped", "/abs/escaped", "..", ".hidden"})
    jit(f, JitOptions{.name = name, .backend = ir::Backend::llvm})(ones({16}));
  int inside = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(root.path)) {
    if (!e.is_regular_file()) continue;
    EXPECT_EQ(e.path().parent_path(), dir) << e.path();
    EXPECT_NE(e.path().filename().string()[0], '.') << e.path();
    ++inside;
  }
  EXPECT_EQ(inside, 8);  // a .ll and a .s per function
  EXPECT_FALSE(std::filesystem::exists("/abs"));
}

// Kiln's own float32 exp and tanh, emitted inline, give the eager kernels' bits over the whole
// float range, in vector steps and in the scalar tail (on AVX-512 the steps scale by vscalefps,
// the tail by products): every 4099th bit pattern, and the edges of their branches alone (a
// tail) and before them (in vector steps).
TEST(Compiler, InlineExpAndTanhGiveTheEagerBitsOverTheFloatRange) {
  const std::vector<float> edges = {INFINITY, -INFINITY, NAN,      89.0f,   -87.4f,
                                    -103.3f,  -103.9f,   -104.0f,  -104.5f, -175.7f,
                                    -176.0f,  0.625f,    0x1p-12f, 10.0f,   -0.0f};
  std::vector<float> v = edges;
  for (uint64_t b = 0; b < (uint64_t{1} << 32); b += 4099)
    v.push_back(std::bit_cast<float>(static_cast<uint32_t>(b)));
  for (const Tensor& x : {tensor(edges), tensor(v)}) {
    expect_bits(jit([](const Tensor& t) { return exp(t); }, kCompiled)(x), exp(x));
    expect_bits(jit([](const Tensor& t) { return tanh(t); }, kCompiled)(x), tanh(x));
  }
}

// A transcendental node that two passes of a reduction group read (softmax's exp(x - max): the
// sum's pass and the output's) is computed once per element and kept for the later pass: the
// generated code calls exp as often as for sum(exp(x)), which needs it in one pass only. Counted
// in float64, whose exp is a call into SLEEF; float32's is Kiln's own, emitted inline (no call).
TEST(Compiler, ExponentialsTwoPassesReadAreComputedOnce) {
  auto exp_calls = [&](const auto& f, const Tensor& x) {
    // The vector math table's exp for x's dtype, in loop bodies and tails.
    const math::MathFunctions fns = math::host_functions(math::MathFn::exp, x.dtype());
    const TempDir dir;
    const EnvVar env("KILN_DUMP_DIR", dir.path.string());
    jit(f, kCompiled)(x);
    const int calls = dumped_lines(dir.path, [&](const std::string& line) {
      return line.find("call") != std::string::npos &&
             (line.find("@" + fns.vector.symbol + "(") != std::string::npos ||
              line.find("@" + fns.scalar.symbol + "(") != std::string::npos);
    });
    return calls;
  };
  auto sum_exp = [](const Tensor& t) { return sum(exp(t), {1}); };
  auto sm = [](const Tensor& t) { return softmax(t, -1); };
  const Tensor x64 = normal(33, {4, 129}, float64);
  const int once = exp_calls(sum_exp, x64);
  EXPECT_GT(once, 0);
  EXPECT_EQ(exp_calls(sm, x64), once);
  const Tensor x = normal(31, {5, 37});
  ASSERT_TRUE(math::is_own(math::MathFn::exp, float32));
  EXPECT_EQ(exp_calls(sum_exp, x), 0);
  // The kept values are the ones the interpreter computes: rows with a tail, ±inf and NaN,
  // float64, and the backward pass.
  std::vector<float> v = normal(32, {3, 1000}).to_vector<float>();
  v[7] = INFINITY;
  v[1003] = -INFINITY;
  v[2010] = NAN;
  const Tensor odd = tensor(v, {3, 1000});
  expect_compiled_bits([](const Tensor& t) { return softmax(t, -1); }, x);
  expect_compiled_bits([](const Tensor& t) { return log_softmax(t, -1); }, odd);
  // float64 sums reassociate over the lanes (docs/DESIGN.md): equal to round-off.
  expect_same(jit(sm, kCompiled)(x64), jit(sm, kInterpreted)(x64), 1e-14);
  auto grad_of = grad([](const Tensor& t) { return sum(softmax(t, -1) * t); });
  expect_compiled_bits(grad_of, x);
}

namespace {

// Why outputs past the streaming threshold would take more memory and time than a test should
// (a machine with a very large last-level cache), if they would: ctest's KILN_STREAMING_BYTES=0
// runs of this file stream every eligible output whatever the machine.
std::optional<std::string> too_large_to_stream_here() {
  if (detail::streaming_bytes() <= (int64_t{64} << 20)) return std::nullopt;
  return "streaming starts at " + std::to_string(detail::streaming_bytes()) +
         " bytes here; the KILN_STREAMING_BYTES=0 runs cover it";
}

// Runs each check with the compiled functions' LLVM IR dumped, over one thread's range and two
// threads' split, and expects streamed (non-temporal) stores in it, or none under
// KILN_ISA=scalar, whose loops have no vector steps.
void expect_streamed(const std::function<void()>& checks) {
  const TempDir dir;
  const EnvVar env("KILN_DUMP_DIR", dir.path.string());
  for (int t : {1, 2}) {
    const Threads threads(t);
    checks();
  }
  const int streamed = dumped_lines(dir.path, [](const std::string& line) {
    return line.find("store ") != std::string::npos &&
           line.find("!nontemporal") != std::string::npos;
  });
  if (math::host_functions(math::MathFn::exp, float32).vector.lanes >= 4)
    EXPECT_GT(streamed, 0);
  else
    EXPECT_EQ(streamed, 0);
}

}  // namespace

// An elementwise group whose outputs reach detail::streaming_bytes() stores its vector steps
// non-temporally, from the first vector-aligned index of each thread's range (the ones before
// it, and the tail, store as usual), bit for bit as the interpreter: lengths with a vector
// tail, offset arguments, two outputs of different element sizes. (ctest runs this file again
// with KILN_STREAMING_BYTES=0, where every group that can streams.)
TEST(Compiler, LargeOutputsAreStreamedBitForBit) {
  if (auto why = too_large_to_stream_here()) GTEST_SKIP() << *why;
  const int64_t n = std::max<int64_t>(detail::streaming_bytes() / 4, 1000) + 13;
  const Tensor x = normal(41, {n}), y = normal(42, {n}), z = normal(43, {n});
  auto chain = [](const Tensor& a, const Tensor& b, const Tensor& c) {
    return tanh(a) * sigmoid(b) + exp(c);
  };
  auto two = [](const Tensor& a) {
    return std::vector<Tensor>{exp(a) * 2.0f, astype(tanh(a), float64)};
  };
  expect_streamed([&] {
    expect_compiled_bits(chain, x, y, z);
    expect_compiled_bits(two, x);
    expect_compiled_bits(chain, slice(x, {{3, n}}), slice(y, {{1, n - 2}}), slice(z, {{0, n - 3}}));
  });
}

// The column template (softmax's rows) streams its row outputs the same way when every row
// starts on a vector boundary; rows of 1000 float32 do not, and store as usual.
TEST(Compiler, LargeSoftmaxRowsAreStreamedBitForBit) {
  if (auto why = too_large_to_stream_here()) GTEST_SKIP() << *why;
  const int64_t rows = std::max<int64_t>(detail::streaming_bytes() / 4096, 8) + 3;
  const Tensor x = normal(44, {rows, 1024}), odd = normal(45, {rows, 1000});
  auto sm = [](const Tensor& t) { return softmax(t, -1); };
  auto lsm_grad = grad([](const Tensor& t) { return sum(log_softmax(t, -1) * t); });
  expect_streamed([&] { expect_compiled_bits(sm, x); });  // one column group, nothing else
  expect_streamed([&] {
    expect_compiled_bits(lsm_grad, x);
    expect_compiled_bits(sm, odd);
  });
}

// Column max/min accumulate order keys with the last NaN apart (docs/DESIGN.md): rows mixing
// NaN, ±0 and ±inf, of lengths with and without a vector tail, in float32 and float64, give
// the interpreter's results bit for bit (+0 beats -0 for max, -0 for min; NaN wins).
TEST(Compiler, ColumnMaxAndMinFollowTheInterpreterOnEdgeValues) {
  const double specials[] = {0.0, -0.0, INFINITY, -INFINITY, NAN, 1.5, -2.5};
  for (DType dt : {float32, float64})
    for (int64_t n : {1, 3, 8, 9, 17, 33}) {
      std::vector<double> v(static_cast<std::size_t>(7 * n));
      for (std::size_t i = 0; i < v.size(); ++i) v[i] = specials[(i * 5 + i / 3) % 7];
      for (int64_t j = 0; j < n; ++j) {  // row 0 without NaN, row 1 only zeros of both signs
        v[static_cast<std::size_t>(j)] = j % 2 ? -0.0 : 1.0;
        v[static_cast<std::size_t>(n + j)] = j % 3 ? -0.0 : 0.0;
      }
      const Tensor x = astype(tensor(v, {7, n}), dt);
      expect_compiled_bits([](const Tensor& t) { return max(t, {1}); }, x);
      expect_compiled_bits([](const Tensor& t) { return min(t, {1}); }, x);
    }
}

// A long unrolled chain is split into groups of bounded size (LLVM's compile time grows faster
// than a function's length), with the interpreter's results.
TEST(Compiler, LongChainsSplitIntoBoundedGroups) {
  const auto chain = [](const Tensor& x) {
    Tensor y = x;
    for (int i = 0; i < 1500; ++i) y = sin(y) * 0.999f + 0.01f;
    return y;
  };
  const Tensor x = normal(3, {37});
  expect_compiled_bits(chain, x);
  const ir::CompiledInfo info = jit(chain, kCompiled).compiled(x);
  ASSERT_GT(info.groups.size(), 1u);
  for (const auto& g : info.groups) EXPECT_LE(g.equations.size(), 512u);
}

// The NaN a max or min returns is one of its inputs', sign included, as the interpreter's
// (x - x at inf is the negative default NaN on x86): not a NaN constant of its own.
TEST(Compiler, MaxAndMinKeepTheSignOfTheirNaN) {
  for (DType dt : {float32, float64})
    for (int64_t n : {5, 8, 21}) {
      std::vector<double> v(static_cast<std::size_t>(2 * n), 1.0);
      v[3] = INFINITY;
      v[static_cast<std::size_t>(n + 2)] = -INFINITY;
      const Tensor x = astype(tensor(v, {2, n}), dt);
      for (const auto& f :
           {std::function<Tensor(const Tensor&)>([](const Tensor& t) { return max(t - t, {1}); }),
            std::function<Tensor(const Tensor&)>(
                [](const Tensor& t) { return min(-(t - t), {1}); })}) {
        const std::vector<double> want = f(x).to_vector<double>();
        const std::vector<double> got = jit(f, kCompiled)(x).to_vector<double>();
        ASSERT_TRUE(std::isnan(want[0]) && std::isnan(got[0]));
        EXPECT_EQ(std::signbit(got[0]), std::signbit(want[0])) << dt << " n=" << n;
        EXPECT_EQ(std::signbit(got[1]), std::signbit(want[1])) << dt << " n=" << n;
      }
    }
}

TEST(Compiler, TheSteadyStateAsksTheSystemForNoMemory) {
  // A fused chain and a training-like step: after the first calls, the arena is reused and
  // every large buffer (results, kernel outputs) comes from the caching allocator.
  auto step = jit(
      [](const Tensor& w, const Tensor& x) {
        return value_and_grad([](const Tensor& w, const Tensor& x) {
          return mean(log_softmax(tanh(matmul(x, w)) * 2.0f, -1));
        })(w, x);
      },
      kCompiled);
  const Tensor w = normal(17, {300, 256}) * 0.05f, x = normal(18, {256, 300});
  for (int i = 0; i < 3; ++i) step(w, x);
  const MemoryStats before = memory_stats();
  for (int i = 0; i < 10; ++i) step(w, x);
  const MemoryStats after = memory_stats();
  // Per call: the two results (loss, gradient) and the forward product, which the fused
  // group then overwrites with the cotangent the second matmul reads; every other
  // intermediate lives in the arena.
  EXPECT_EQ(after.allocations - before.allocations, 10 * 3);
  // Only the small buffers (the loss, below the cache's 256 KiB) go to malloc, after the
  // thread's list of small blocks: far less than one fresh page per call.
  EXPECT_LT(after.os_bytes_allocated - before.os_bytes_allocated, 10 * 4096);
  EXPECT_GT(after.cache_hits - before.cache_hits, 10);
}

namespace {

// Equal bits (NaNs equal any NaN; +0 and -0 told apart); reports the first difference.
void expect_identical(const Tensor& got, const Tensor& want) {
  ASSERT_EQ(got.type(), want.type());
  const std::vector<double> g = got.to_vector<double>(), w = want.to_vector<double>();
  for (std::size_t i = 0; i < g.size(); ++i) {
    const bool same = (std::isnan(w[i]) && std::isnan(g[i])) ||
                      (g[i] == w[i] && std::signbit(g[i]) == std::signbit(w[i]));
    if (same) continue;
    ADD_FAILURE() << "element " << i << ": got " << g[i] << ", expected " << w[i];
    return;
  }
}

// Outputs written over an input's arena slot (arena) or over a kernel output's buffer.
std::size_t in_place_count(const ir::CompiledInfo& info, bool arena = true) {
  std::size_t n = 0;
  for (const auto& g : info.groups)
    for (const auto& p : g.in_place) n += p.arena == arena;
  return n;
}

// The primitive whose equation defines value v; "" for a parameter or constant.
std::string defined_by(const ir::Function& f, int v) {
  for (const ir::Equation& e : f.equations)
    for (const ir::Value& o : e.outputs)
      if (o.id == v) return e.prim->name;
  return "";
}

constexpr int64_t kSide = 67;  // rows of 67: vector steps and scalar tails in every row
constexpr int64_t kBuffer = (kSide * kSide * 4 + 63) / 64 * 64;  // one arena slot

}  // namespace

TEST(Compiler, ElementwiseOutputsAreWrittenOverTheInputTheyKill) {
  // Groups separated by matmuls, so each is a loop of its own: every intermediate
  // dies in the group that reads it, which writes its output over it. The arena holds one
  // buffer (the live set), not two (liveness alone) or four (one per intermediate). (The row
  // max makes the first a group of its own: a plain exp(x) would wait for the first matmul and
  // join the group after it.)
  auto f = [](const Tensor& x, const Tensor& y) {
    Tensor a = exp(x - max(x, {1}, true)), k = y;
    for (int i = 0; i < 4; ++i) {
      k = matmul(k, y);
      a = tanh(a * k) + 1.0f;
    }
    return a * 2.0f;
  };
  const Tensor x = normal(40, {kSide, kSide}), y = normal(41, {kSide, kSide}) * 0.1f;
  const auto info = jit(f, kCompiled).compiled(x, y);
  ASSERT_EQ(info.groups.size(), 5u) << info;
  EXPECT_EQ(info.arena_bytes, kBuffer) << info;
  EXPECT_EQ(in_place_count(info), 3u) << info;
  // The result is written over the last matmul's product, which dies in that group.
  EXPECT_EQ(in_place_count(info, false), 1u) << info;
  for (int call = 0; call < 2; ++call)
    expect_identical(jit(f, kCompiled)(x, y), jit(f, kInterpreted)(x, y));
}

TEST(Compiler, NoInPlaceWhereTheGroupReadsTheInputAtOtherElements) {
  // `a` dies in the group that computes b, but that group also reads `a` at other elements:
  // written over, rows and lanes computed later would read new values.
  const int64_t n = kSide;
  const std::vector<std::pair<std::string, std::function<Tensor(const Tensor&)>>> reads = {
      {"transposed",
       [](const Tensor& a) {
         return transpose(a, {1, 0});
       }},
      {"row 0 broadcast",
       [=](const Tensor& a) {
         return broadcast_to(slice(a, {Slice{0, 1}}), {n, n});
       }},
      {"row 1 broadcast",
       [=](const Tensor& a) {
         return broadcast_to(slice(a, {Slice{1, 2}}), {n, n});
       }},
      {"rows reversed",
       [](const Tensor& a) {
         return slice(a, {Slice{{}, {}, -1}});
       }},
      {"itself (the control: in place)", [](const Tensor& a) { return a; }},
  };
  const Tensor x = normal(42, {n, n}), y = normal(43, {n, n});
  for (const auto& [name, read] : reads) {
    SCOPED_TRACE(name);
    auto f = [&](const Tensor& x, const Tensor& y) {
      const Tensor a = exp(x * 0.1f);
      const Tensor k = matmul(y, y);
      // Traced in this order by every compiler (the operands of + are not sequenced).
      const Tensor r = read(a);
      const Tensor b = a * k + r;  // an intermediate: the next group reads it
      return b * matmul(k, y);
    };
    const auto info = jit(f, kCompiled).compiled(x, y);
    ASSERT_EQ(info.groups.size(), 3u) << info;
    EXPECT_EQ(in_place_count(info), name.starts_with("itself") ? 1u : 0u) << info;
    expect_identical(jit(f, kCompiled)(x, y), jit(f, kInterpreted)(x, y));
  }
}

TEST(Compiler, NoInPlaceOverArgumentsConstantsResultsOrLiveViews) {
  const Tensor x = normal(44, {kSide, kSide}), y = normal(45, {kSide, kSide});
  const Tensor c = normal(46, {kSide, kSide});
  const std::vector<float> x_before = x.to_vector<float>(), c_before = c.to_vector<float>();
  const std::vector<
      std::pair<std::string, std::function<std::vector<Tensor>(const Tensor&, const Tensor&)>>>
      cases = {
          // The caller's argument and a constant die in the group that computes b.
          {"argument",
           [](const Tensor& x, const Tensor& y) {
             const Tensor k = matmul(y, y), b = x * k;
             return std::vector<Tensor>{b * matmul(k, y)};
           }},
          {"constant",
           [&](const Tensor&, const Tensor& y) {
             const Tensor k = matmul(y, y), b = c * k;
             return std::vector<Tensor>{b * matmul(k, y)};
           }},
          // a is returned: the group that reads it last must not write over it.
          {"result",
           [](const Tensor& x, const Tensor& y) {
             const Tensor a = exp(x), k = matmul(y, y), b = a * k;
             return std::vector<Tensor>{a, b * matmul(k, y)};
           }},
          // a's transpose is read after b's group: a is still live there.
          {"live view",
           [](const Tensor& x, const Tensor& y) {
             const Tensor a = exp(x), k = matmul(y, y), b = a * k;
             return std::vector<Tensor>{b * matmul(k, y) + transpose(a, {1, 0})};
           }},
      };
  for (const auto& [name, f] : cases) {
    SCOPED_TRACE(name);
    auto compiled = jit(f, kCompiled);
    // Only the last group may write its result over the dying product of a matmul.
    const ir::Function lowered = compiled.lower(x, y);
    for (const auto& g : compiled.compiled(x, y).groups)
      for (const auto& p : g.in_place)
        if (p.arena || defined_by(lowered, p.input) != "matmul")
          ADD_FAILURE() << "value " << p.output << " over " << p.input << "\n" << lowered;
    for (int call = 0; call < 2; ++call) {
      const std::vector<Tensor> got = compiled(x, y), want = jit(f, kInterpreted)(x, y);
      ASSERT_EQ(got.size(), want.size());
      for (std::size_t i = 0; i < got.size(); ++i) expect_identical(got[i], want[i]);
    }
    EXPECT_EQ(x.to_vector<float>(), x_before);
    EXPECT_EQ(c.to_vector<float>(), c_before);
  }
}

TEST(Compiler, InPlaceWaitsForEveryReadOfTheLoopBody) {
  // One group stores p, then q (each read by a matmul); only q reads a, a product that dies
  // there. p written over a would clobber a before q's loads read it, so q takes a's memory and
  // p a buffer of its own.
  auto f = [](const Tensor& x, const Tensor& y) {
    const Tensor a = matmul(x, x);
    const Tensor k = matmul(y, y);
    const Tensor p = k * 2.0f, q = a * k;
    const Tensor k2 = matmul(k, y);
    return matmul(p, k2) + matmul(q, k2);
  };
  const Tensor x = normal(47, {kSide, kSide}), y = normal(48, {kSide, kSide});
  const auto info = jit(f, kCompiled).compiled(x, y);
  ASSERT_EQ(info.groups.size(), 2u) << info;
  ASSERT_EQ(info.groups[0].in_place.size(), 1u) << info;
  const ir::Function lowered = jit(f, kCompiled).lower(x, y);
  // q is the group's second output (outputs are stored in value order).
  const auto& eq = lowered.equations[static_cast<std::size_t>(info.groups[0].equations.back())];
  EXPECT_EQ(info.groups[0].in_place[0].output, eq.outputs[0].id) << info << lowered;
  EXPECT_FALSE(info.groups[0].in_place[0].arena) << info;
  expect_identical(jit(f, kCompiled)(x, y), jit(f, kInterpreted)(x, y));
}

TEST(Compiler, ReductionGroupsWriteOverTheirInputRowByRow) {
  // softmax reads a in three passes per row (max, sum, the quotient); the last one writes
  // each row over a's.
  auto f = [](const Tensor& x, const Tensor& y) {
    const Tensor a = exp(x * 0.1f);
    const Tensor k = matmul(y, y);
    const Tensor s = softmax(a * k, -1);
    return s * matmul(k, y);
  };
  const Tensor x = normal(49, {kSide, kSide}), y = normal(50, {kSide, kSide}) * 0.2f;
  const auto info = jit(f, kCompiled).compiled(x, y);
  ASSERT_EQ(info.groups.size(), 3u) << info;
  EXPECT_EQ(info.groups[1].in_place.size(), 1u) << info;
  EXPECT_EQ(info.arena_bytes, kBuffer) << info;
  expect_identical(jit(f, kCompiled)(x, y), jit(f, kInterpreted)(x, y));
}

namespace {

// A unary primitive whose kernel returns one cached tensor of ones (the same Tensor on every
// call): it keeps a reference to its output, which must therefore never change.
const Primitive& cached_ones_p = register_primitive(
    [] {
      Primitive p;
      p.name = "test_cached_ones";
      p.differentiable = false;
      p.type_rule = [](std::span<const TensorType> in, const Attrs&) {
        return std::vector<TensorType>{in[0]};
      };
      return p;
    }(),
    {{KernelSignature{.inputs = {DTypeSet::floating()}},
      [](std::span<const Tensor> in, const Attrs&) {
        static Tensor table;
        if (!table.defined() || table.type() != in[0].type())
          table = ones(in[0].shape(), in[0].dtype());
        return std::vector<Tensor>{table};
      }}});

}  // namespace

TEST(Compiler, ResultsAreWrittenOverTheDyingProductOfAKernel) {
  // tanh(x @ w + b): the product dies in the epilogue group, which writes the result over it:
  // one buffer per call (the product, which becomes the result), not two.
  auto f = [](const Tensor& x, const Tensor& w, const Tensor& b) { return tanh(matmul(x, w) + b); };
  const Tensor x = normal(51, {96, 80}), w = normal(52, {80, 67}), b = normal(53, {67});
  auto compiled = jit(f, kCompiled);
  const auto info = compiled.compiled(x, w, b);
  ASSERT_EQ(info.groups.size(), 1u) << info;
  EXPECT_EQ(in_place_count(info, false), 1u) << info;
  for (int i = 0; i < 2; ++i) compiled(x, w, b);
  const MemoryStats before = memory_stats();
  const Tensor got = compiled(x, w, b);
  EXPECT_EQ(memory_stats().allocations - before.allocations, 1);
  expect_identical(got, jit(f, kInterpreted)(x, w, b));
}

TEST(Compiler, NoInPlaceOverAKernelOutputSomethingElseHolds) {
  // The kernel keeps its output (a cached table); the group that reads it last must write
  // its result elsewhere, call after call.
  auto f = [](const Tensor& x) { return bind1(cached_ones_p, {x}) * 2.0f + x; };
  const Tensor x = normal(54, {kSide, kSide});
  auto compiled = jit(f, kCompiled);
  EXPECT_EQ(in_place_count(compiled.compiled(x), false), 1u);  // planned, refused at run time
  const Tensor want = x + 2.0f;
  for (int call = 0; call < 3; ++call) {
    expect_identical(compiled(x), want);
    expect_identical(bind1(cached_ones_p, {x}), ones({kSide, kSide}));
  }
}

namespace {

// The bytes of the process's anonymous executable mappings: the JIT's code, nothing else.
int64_t jit_code_bytes() {
  std::ifstream maps("/proc/self/maps");
  int64_t bytes = 0;
  for (std::string line; std::getline(maps, line);) {
    std::istringstream fields(line);
    std::string range, perms, offset, device, inode, path;
    fields >> range >> perms >> offset >> device >> inode >> path;
    if (perms.find('x') == std::string::npos || !path.empty()) continue;
    const std::size_t dash = range.find('-');
    bytes += static_cast<int64_t>(std::stoull(range.substr(dash + 1), nullptr, 16) -
                                  std::stoull(range.substr(0, dash), nullptr, 16));
  }
  return bytes;
}

}  // namespace

// A jitted function dropped frees its compiled code: the modules loaded and the executable
// memory mapped return to what they were.
TEST(JitMemory, DroppedFunctionsUnmapTheirCode) {
  auto f = [](const Tensor& x) { return x * 2.0f + 1.0f; };
  const Tensor x = ones({8});
  jit(f, kCompiled)(x);
  const std::size_t modules = compiler::live_native_code();
  const int64_t code = jit_code_bytes();
  for (int i = 0; i < 50; ++i) {
    auto g = jit(f, kCompiled);
    g(x);
    EXPECT_EQ(compiler::live_native_code(), modules + 1);
  }
  EXPECT_EQ(compiler::live_native_code(), modules);
  EXPECT_EQ(jit_code_bytes(), code);
}

// A jitted function keeps its KILN_JIT_CACHE_SIZE most recently used specialisations; the
// others are freed, and traced again when called again.
TEST(JitMemory, TheCacheKeepsTheMostRecentlyUsedSpecialisations) {
  int traces = 0;
  auto body = [&traces](const Tensor& x) {
    ++traces;
    return x * 2.0f + 1.0f;
  };
  const std::size_t modules = compiler::live_native_code();
  {
    const EnvVar size("KILN_JIT_CACHE_SIZE", "4");
    auto f = jit(body, kCompiled);
    for (int64_t n = 1; n <= 20; ++n) {
      const Tensor x = full({n}, static_cast<float>(n));
      EXPECT_EQ(f(x).to_vector<float>(),
                std::vector<float>(static_cast<std::size_t>(n), 2.0f * n + 1));
      EXPECT_EQ(f.cache_size(), std::min<std::size_t>(static_cast<std::size_t>(n), 4));
    }
    EXPECT_EQ(traces, 20);
    EXPECT_EQ(compiler::live_native_code(), modules + 4);
    // Using shape 17 makes it the most recent: a new shape evicts 18, the least recent.
    f(ones({17}));
    f(ones({21}));
    EXPECT_EQ(traces, 21);
    f(ones({17}));
    EXPECT_EQ(traces, 21);
    f(ones({18}));
    EXPECT_EQ(traces, 22);
  }
  EXPECT_EQ(compiler::live_native_code(), modules);
}

// A compiled while_loop that never ends stops at the next step after request_interrupt (from
// another thread here, from a signal handler in a program), with an Error; a later run is not
// interrupted.
TEST(JitInterrupts, AnEndlessCompiledWhileLoopStopsOnRequest) {
  for (const JitOptions& options : {kCompiled, kInterpreted}) {
    auto loop = jit(
        [](const Tensor& x, const Tensor& bound) {
          return while_loop([&](const Tensor& c) { return c < bound; },
                            [](const Tensor& c) { return c + 1.0f; }, x);
        },
        options);
    const Tensor start = zeros({}), endless = full({}, INFINITY);
    if (options.backend == ir::Backend::llvm) {  // the while runs compiled
      ASSERT_FALSE(loop.compiled(start, endless).kernel_calls.empty());
    }
    std::thread interrupter([] {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      request_interrupt();
    });
    kiln::testing::expect_error([&] { loop(start, endless); }, "while", {"interrupted"});
    interrupter.join();
    EXPECT_EQ(loop(start, full({}, 5.0f)).item<float>(), 5.0f);
  }
}

// The check a binding installs (Python's runs its signal handlers) is called while a loop runs;
// what it raises leaves the loop.
TEST(JitInterrupts, TheInstalledCheckRunsDuringALoop) {
  struct Stop {};
  static std::atomic<int> calls{0};
  set_interrupt_check([] {
    if (++calls == 3) throw Stop{};
  });
  auto loop = jit(
      [](const Tensor& x) {
        return while_loop([](const Tensor& c) { return c > -1.0f; },
                          [](const Tensor& c) { return c + 1.0f; }, x);
      },
      kCompiled);
  EXPECT_THROW(loop(zeros({})), Stop);
  set_interrupt_check(nullptr);
  EXPECT_EQ(calls.load(), 3);
}
