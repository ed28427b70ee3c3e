// float32 matmul on each GEMM backend (oneDNN's matmul, OpenBLAS's sgemm; set_gemm_backend)
// and thread count against a float64 loop, over the layouts the kernel hands to gemm; the
// KILN_GEMM setting; determinism; compiled programs on the same kernels.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kiln/kiln.h"
#include "ops/dnnl_common.h"
#include "ops/gemm.h"
#include "testing.h"

namespace {

using namespace kiln;
using kiln::testing::random_values;

const GemmBackend kBackends[] = {GemmBackend::onednn, GemmBackend::openblas};

// Restores the default backend and thread count when a test ends.
class Backends : public ::testing::Test {
 protected:
  void TearDown() override {
    set_gemm_backend(std::nullopt);
    set_num_threads(threads_);
  }
  int threads_ = num_threads();
};

// Runs body on each backend with 1 and 2 threads (as runtime_info reports).
template <typename Body>
void for_each_setting(Body body) {
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    for (GemmBackend backend : kBackends) {
      SCOPED_TRACE(std::string(gemm_backend_name(backend)) + ", threads " +
                   std::to_string(threads));
      set_gemm_backend(backend);
      const RuntimeInfo info = runtime_info();
      EXPECT_EQ(info.gemm_backend, backend);
      EXPECT_EQ(info.num_threads, threads);
      body();
    }
  }
}

// c = a @ b in float64 from the operands' values (any layout), both [batch, m, k] x [batch,
// k, n] or 2-d, and a bound on float32's rounding error per element: (k + 2) u sum |a||b|
// holds for every summation order.
struct Reference {
  std::vector<double> c, bound;
};
Reference reference(const Tensor& a, const Tensor& b) {
  const std::vector<double> av = a.to_vector<double>(), bv = b.to_vector<double>();
  const int64_t m = a.dim(-2), k = a.dim(-1), n = b.dim(-1);
  const int64_t batch = static_cast<int64_t>(av.size()) / (m * k);
  Reference r{std::vector<double>(static_cast<std::size_t>(batch * m * n)),
              std::vector<double>(static_cast<std::size_t>(batch * m * n))};
  const double u = std::ldexp(1.0, -24);
  for (int64_t t = 0; t < batch; ++t)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double s = 0, mag = 0;
        for (int64_t p = 0; p < k; ++p) {
          const double x = av[static_cast<std::size_t>((t * m + i) * k + p)];
          const double y = bv[static_cast<std::size_t>((t * k + p) * n + j)];
          s += x * y;
          mag += std::abs(x * y);
        }
        const auto o = static_cast<std::size_t>((t * m + i) * n + j);
        r.c[o] = s;
        r.bound[o] = static_cast<double>(k + 2) * u * mag + 1e-30;
      }
  return r;
}

Tensor matrix(const Shape& shape, uint32_t seed) {
  return astype(tensor(random_values(shape.numel(), seed), shape), float32);
}

void expect_matches_reference(const Tensor& a, const Tensor& b, const std::string& what) {
  const Tensor c = matmul(a, b);
  const Reference want = reference(a, b);
  const std::vector<double> got = c.to_vector<double>();
  ASSERT_EQ(got.size(), want.c.size()) << what;
  int bad = 0;
  for (std::size_t i = 0; i < got.size() && bad < 3; ++i)
    if (!(std::abs(got[i] - want.c[i]) <= want.bound[i])) {
      ++bad;
      ADD_FAILURE() << what << ": element " << i << " is " << got[i] << ", expected " << want.c[i]
                    << " within " << want.bound[i];
    }
}

// a [m, k] and b [k, n] in every layout gemm takes: row-major, transposed views, rows with
// a longer stride than their length, and views that must be copied first (every other row).
// One row against a transposed b is Kiln's own loop (ops::row_dots) on either backend.
// Products of 2^20 multiply-adds and more run on two threads in blocks of rows or columns, or
// in oneDNN's own split (src/ops/gemm.cpp): 600 x 300 x 530, and 1024 x 40 x 37 with
// transposed a (its columns 4 KiB apart).
void check_layouts(int64_t m, int64_t k, int64_t n) {
  const std::string dims = std::to_string(m) + "x" + std::to_string(k) + "x" + std::to_string(n);
  const Tensor a = matrix({m, k}, 1), b = matrix({k, n}, 2);
  expect_matches_reference(a, b, dims + " row-major");
  expect_matches_reference(transpose(matrix({k, m}, 3)), b, dims + " a transposed");
  expect_matches_reference(a, transpose(matrix({n, k}, 4)), dims + " b transposed");
  expect_matches_reference(transpose(matrix({k, m}, 5)), transpose(matrix({n, k}, 6)),
                           dims + " both transposed");
  const Tensor wide = slice(transpose(matrix({k + 3, m}, 7)), {Slice{}, Slice{0, k}});
  expect_matches_reference(wide, b, dims + " a rows strided");
  const Tensor b_wide = transpose(slice(matrix({n, k + 3}, 9), {Slice{}, Slice{0, k}}));
  expect_matches_reference(a, b_wide, dims + " b transposed, its rows strided");
  const Tensor stepped = slice(matrix({2 * m, k}, 8), {Slice{std::nullopt, std::nullopt, 2}});
  expect_matches_reference(stepped, b, dims + " a every other row");
}

TEST_F(Backends, EveryLayoutAndOddShapeMatchesAFloat64Loop) {
  for_each_setting([] {
    for (const auto& [m, k, n] : std::vector<std::array<int64_t, 3>>{{1, 1, 1},
                                                                     {1, 7, 17},
                                                                     {1, 4097, 3},
                                                                     {1, 300, 1100},
                                                                     {17, 7, 1},
                                                                     {7, 17, 7},
                                                                     {4097, 3, 5},
                                                                     {2, 4097, 3},
                                                                     {3, 5, 4097},
                                                                     {64, 512, 10},
                                                                     {64, 10, 17},
                                                                     {130, 70, 33},
                                                                     {37, 300, 1100},
                                                                     {37, 70, 1100},
                                                                     {1100, 70, 37},
                                                                     {1100, 520, 37},
                                                                     {600, 300, 530},
                                                                     {1024, 40, 37}})
      check_layouts(m, k, n);
  });
}

TEST_F(Backends, BatchesMatchAFloat64Loop) {
  for_each_setting([] {
    const Tensor a = matrix({3, 7, 17}, 11), b = matrix({3, 17, 5}, 12);
    expect_matches_reference(a, b, "batched");
    expect_matches_reference(swapaxes(matrix({3, 17, 7}, 13), -1, -2), b, "batched, a transposed");
    const Tensor shared_b = broadcast_to(matrix({17, 5}, 14), {3, 17, 5});
    expect_matches_reference(a, shared_b, "b shared (one folded product)");
    const Tensor shared_a = broadcast_to(matrix({7, 17}, 15), {3, 7, 17});
    expect_matches_reference(shared_a, b, "a shared");
    // Batch axes [2, 3] of a permuted [3, 2, 7, 17]: offsets not evenly spaced.
    const Tensor permuted = permute(matrix({3, 2, 7, 17}, 16), {1, 0, 2, 3});
    expect_matches_reference(permuted, matrix({2, 3, 17, 5}, 17), "permuted batch axes");
    expect_matches_reference(matrix({256, 32, 32}, 18), matrix({256, 32, 32}, 19),
                             "many small products");
    // Attention's heads: [B, T, 3C] split into q, k and v, viewed as [B, heads, T, C / heads]
    // (two batch axes, rows 3C apart), k transposed; then scores [B, heads, T, T] times v.
    const Tensor qkv = matrix({4, 64, 3 * 96}, 20);
    auto heads = [&](int part) {
      return swapaxes(reshape(slice(qkv, {Slice{}, Slice{}, Slice{part * 96, (part + 1) * 96}}),
                              {4, 64, 3, 32}),
                      1, 2);
    };
    expect_matches_reference(heads(0), swapaxes(heads(1), -1, -2), "heads: q k^T");
    expect_matches_reference(matrix({4, 3, 64, 64}, 21), heads(2), "heads: scores v");
    // Three batch axes permuted so that their offsets form no grid of two even axes: one
    // product per matrix, spread over the threads.
    const Tensor scrambled = permute(matrix({2, 3, 2, 7, 17}, 22), {1, 0, 2, 3, 4});
    expect_matches_reference(scrambled, matrix({3, 2, 2, 17, 5}, 23), "scrambled batch axes");
  });
}

// float64 runs on OpenBLAS whatever the setting (oneDNN has no float64 matmul).
TEST_F(Backends, Float64IsExactToItsOwnPrecisionOnEverySetting) {
  for (GemmBackend backend : kBackends) {
    set_gemm_backend(backend);
    const Tensor a = tensor(random_values(17 * 33, 21), {17, 33});
    const Tensor b = tensor(random_values(33 * 9, 22), {33, 9});
    const Reference want = reference(a, b);
    const std::vector<double> got = matmul(a, b).to_vector<double>();
    for (std::size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want.c[i], 1e-13);
  }
}

TEST_F(Backends, SameBitsTwice) {
  for_each_setting([] {
    // The second product is split into blocks of columns on two threads (src/ops/gemm.cpp).
    for (const auto& [m, k, n] :
         std::vector<std::array<int64_t, 3>>{{257, 1031, 129}, {37, 300, 1100}}) {
      const Tensor a = matrix({m, k}, 31), b = transpose(matrix({n, k}, 32));
      const std::vector<float> first = matmul(a, b).to_vector<float>();
      EXPECT_EQ(matmul(a, b).to_vector<float>(), first) << m << "x" << k << "x" << n;
    }
  });
}

// Compiled programs call the matmul primitive's kernel, so they run on the chosen backend:
// the same bits as the eager product on it.
TEST_F(Backends, CompiledProgramsUseTheSameBackend) {
  const Tensor a = matrix({64, 784}, 41), b = matrix({784, 512}, 42);
  const auto f = jit([](const Tensor& x, const Tensor& w) { return matmul(x, w) * 1.0; });
  for (GemmBackend backend : kBackends) {
    set_gemm_backend(backend);
    EXPECT_EQ(f(a, b).to_vector<float>(), matmul(a, b).to_vector<float>())
        << gemm_backend_name(backend);
  }
}

TEST(GemmSetting, KilnGemmNamesABackendOrIsAnError) {
  EXPECT_EQ(ops::parse_gemm_env(nullptr), std::nullopt);
  EXPECT_EQ(ops::parse_gemm_env("onednn"), GemmBackend::onednn);
  EXPECT_EQ(ops::parse_gemm_env("openblas"), GemmBackend::openblas);
  for (const char* bad : {"", "oneDNN", "mkl", "openblas "})
    kiln::testing::expect_error(
        [&] { ops::parse_gemm_env(bad); }, "matmul",
        {"KILN_GEMM", std::string("got \"") + bad + "\"", "\"onednn\"", "\"openblas\""});
}

// The rule: oneDNN exactly when the CPU has AVX2 (with FMA) or AVX-512.
TEST(GemmSetting, DefaultFollowsTheRule) {
  if (std::getenv("KILN_GEMM")) GTEST_SKIP() << "KILN_GEMM chooses";
  const RuntimeInfo info = runtime_info();
  EXPECT_EQ(info.gemm_backend,
            info.cpu_isa == "baseline" ? GemmBackend::openblas : GemmBackend::onednn)
      << info.cpu_isa;
  EXPECT_EQ(info.num_threads, num_threads());
}

// The primitive cache keeps the most recently used plans up to its capacity, remembers a
// rejected key as nullptr without asking again, and a plan a caller still holds outlives its
// eviction.
TEST(PlanCache, KeepsTheMostRecentlyUsedPlans) {
  ops::PlanCache<int, int> cache(2);
  int made = 0;
  auto make = [&](int v) {
    return [&made, v] {
      ++made;
      return std::make_unique<int>(v);
    };
  };
  const std::shared_ptr<const int> one = cache.get(1, make(10));
  cache.get(2, make(20));
  EXPECT_EQ(*cache.get(1, make(-1)), 10);  // a hit: 1 is now the most recent
  cache.get(3, make(30));                  // evicts 2, the least recently used
  EXPECT_EQ(made, 3);
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_EQ(*cache.get(1, make(-1)), 10);
  EXPECT_EQ(*cache.get(2, make(21)), 21);  // made again
  EXPECT_EQ(made, 4);
  cache.get(4, make(40));  // evicts 3
  cache.get(5, make(50));  // evicts 1 while `one` still holds it
  EXPECT_EQ(*one, 10);
  EXPECT_EQ(cache.size(), 2u);
  int rejected = 0;
  auto reject = [&] {
    ++rejected;
    throw dnnl::error(dnnl_unimplemented, "no kernel");
    return std::unique_ptr<int>();
  };
  EXPECT_EQ(cache.get(6, reject), nullptr);
  EXPECT_EQ(cache.get(6, reject), nullptr);
  EXPECT_EQ(rejected, 1);
}

}  // namespace
