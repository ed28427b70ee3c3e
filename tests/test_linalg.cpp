// matmul: the primitive and the numpy-style public op, against a naive double-precision
// reference written here (independent of the library's kernels).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kiln/kiln.h"
#include "testing.h"

using namespace kiln;

namespace {

using kiln::testing::expect_allclose;

using kiln::testing::random_values;

std::vector<double> random_ints(int64_t n, uint32_t seed, int lo, int hi) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> dist(lo, hi);
  std::vector<double> v(static_cast<std::size_t>(n));
  for (double& x : v) x = dist(gen);
  return v;
}

int64_t numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

// numpy.matmul in doubles on row-major buffers: 1-d operands get an axis, batch dimensions
// broadcast. Returns the values and the result shape.
struct Ref {
  std::vector<double> values;
  std::vector<int64_t> shape;
};
Ref ref_matmul(const std::vector<double>& A, std::vector<int64_t> sa, const std::vector<double>& B,
               std::vector<int64_t> sb) {
  const bool av = sa.size() == 1, bv = sb.size() == 1;
  if (av) sa.insert(sa.begin(), 1);
  if (bv) sb.push_back(1);
  const int64_t m = sa[sa.size() - 2], k = sa.back(), n = sb.back();
  EXPECT_EQ(k, sb[sb.size() - 2]);
  std::vector<int64_t> ba(sa.begin(), sa.end() - 2), bb(sb.begin(), sb.end() - 2);
  const std::size_t r = std::max(ba.size(), bb.size());
  ba.insert(ba.begin(), r - ba.size(), 1);
  bb.insert(bb.begin(), r - bb.size(), 1);
  std::vector<int64_t> bo(r);
  for (std::size_t i = 0; i < r; ++i) bo[i] = std::max(ba[i], bb[i]);
  const int64_t batches = numel(bo);
  Ref out;
  out.values.assign(static_cast<std::size_t>(batches * m * n), 0.0);
  for (int64_t t = 0; t < batches; ++t) {
    // Batch index per dimension, then the flat batch index of each operand.
    int64_t rem = t, ia = 0, ib = 0, mula = 1, mulb = 1;
    for (std::size_t d = r; d-- > 0;) {
      const int64_t idx = rem % bo[d];
      rem /= bo[d];
      ia += (ba[d] == 1 ? 0 : idx) * mula;
      ib += (bb[d] == 1 ? 0 : idx) * mulb;
      mula *= ba[d];
      mulb *= bb[d];
    }
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t p = 0; p < k; ++p)
          s += A[static_cast<std::size_t>(ia * m * k + i * k + p)] *
               B[static_cast<std::size_t>(ib * k * n + p * n + j)];
        out.values[static_cast<std::size_t>(t * m * n + i * n + j)] = s;
      }
  }
  out.shape = bo;
  if (!av) out.shape.push_back(m);
  if (!bv) out.shape.push_back(n);
  return out;
}

// The reference as a tensor to check a `dt` result against: float64 for floating `dt`.
Tensor as_tensor(const Ref& r, DType dt) {
  return astype(tensor(r.values, Shape(r.shape)), is_floating(dt) ? float64 : dt);
}

Tensor make(const std::vector<double>& v, const std::vector<int64_t>& shape, DType dt = float32) {
  return astype(tensor(v, Shape(shape)), dt);
}

// Runs the public matmul on random operands of the given shapes and checks the reference.
void check_shapes(const std::vector<int64_t>& sa, const std::vector<int64_t>& sb, DType dt,
                  uint32_t seed) {
  SCOPED_TRACE(Shape(sa).to_string() + " @ " + Shape(sb).to_string() + " " +
               std::string(dtype_name(dt)));
  const auto A = random_values(numel(sa), seed), B = random_values(numel(sb), seed + 1);
  const Tensor c = matmul(make(A, sa, dt), make(B, sb, dt));
  EXPECT_EQ(c.dtype(), dt);
  const double tol = dt == float64 ? 1e-12 : 1e-5;
  expect_allclose(c, as_tensor(ref_matmul(A, sa, B, sb), dt), {.rtol = tol, .atol = tol});
}

}  // namespace

TEST(Matmul, HandComputed) {
  for (DType dt : {float32, float64, int32, int64, float16, bfloat16, uint8, uint32}) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    const Tensor a = make({1, 2, 3, 4}, {2, 2}, dt);
    const Tensor b = make({5, 6, 7, 8}, {2, 2}, dt);
    const Tensor c = matmul(a, b);
    EXPECT_EQ(c.type(), (TensorType{dt, Shape{2, 2}}));
    EXPECT_EQ(c.to_vector<double>(), (std::vector<double>{19, 22, 43, 50}));
  }
  // [2,3] x [3,1]
  const Tensor c = matmul(tensor({1.f, 0.f, -1.f, 2.f, 3.f, 4.f}, Shape{2, 3}),
                          tensor({1.f, 2.f, 3.f}, Shape{3, 1}));
  EXPECT_EQ(c.shape(), (Shape{2, 1}));
  EXPECT_EQ(c.to_vector<float>(), (std::vector<float>{-2.f, 20.f}));
  // Dot product of two vectors is 0-d.
  const Tensor d = matmul(tensor({1.0, 2.0, 3.0}), tensor({4.0, 5.0, 6.0}));
  EXPECT_EQ(d.type(), (TensorType{float64, Shape{}}));
  EXPECT_EQ(d.item<double>(), 32.0);
}

TEST(Matmul, RandomMatricesFloat) {
  uint32_t seed = 1;
  for (DType dt : {float32, float64})
    for (auto [m, k, n] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{{1, 1, 1},
                                                                             {1, 7, 1},
                                                                             {5, 1, 3},
                                                                             {3, 4, 5},
                                                                             {17, 33, 9},
                                                                             {64, 64, 64},
                                                                             {1, 50, 40},
                                                                             {40, 50, 1},
                                                                             {130, 70, 90}})
      check_shapes({m, k}, {k, n}, dt, seed++);
}

TEST(Matmul, LargeMatrixUsesThreadedGemm) {
  check_shapes({200, 300}, {300, 150}, float32, 7);
  check_shapes({150, 257}, {257, 201}, float64, 8);
}

TEST(Matmul, BatchedAndBroadcastBatch) {
  uint32_t seed = 100;
  for (DType dt : {float32, float64}) {
    check_shapes({3, 4, 5}, {3, 5, 2}, dt, seed++);
    check_shapes({2, 3, 4, 5}, {2, 3, 5, 6}, dt, seed++);
    check_shapes({2, 1, 3, 4}, {5, 4, 6}, dt, seed++);  // -> [2,5,3,6]
    check_shapes({4, 3, 4}, {4, 2}, dt, seed++);        // b shared: one folded gemm
    check_shapes({2, 3, 3, 4}, {4, 2}, dt, seed++);
    check_shapes({2, 0, 4}, {4, 3}, dt, seed++);  // folded, no rows
    check_shapes({2, 3, 0}, {0, 5}, dt, seed++);  // folded, k = 0
    check_shapes({3, 4}, {2, 4, 5}, dt, seed++);  // a shared
    check_shapes({1, 3, 4}, {6, 4, 5}, dt, seed++);
    check_shapes({64, 16, 16}, {64, 16, 16}, dt, seed++);  // many small gemms, in parallel
    check_shapes({300, 2, 3}, {1, 3, 2}, dt, seed++);
  }
}

// x [..., M, K] @ W [K, N] is one product over all the rows (the batch axes folded into M), so
// reverse mode makes W's gradient one product too, with no per-batch products to sum; both
// values against double-precision sums.
TEST(Matmul, ASharedMatrixAndItsGradientAreOneProductOverAllRows) {
  const std::vector<int64_t> sx{3, 5, 4};
  const std::vector<double> xv = random_values(numel(sx), 7), wv = random_values(4 * 2, 8),
                            rv = random_values(3 * 5 * 2, 9);
  const Tensor x = make(xv, sx), w = make(wv, {4, 2}), r = make(rv, {3, 5, 2});
  const auto loss = [&](const Tensor& w_) { return sum(matmul(x, w_) * r); };
  const ir::Function f = jit(grad(loss)).lower(w);
  for (const ir::Equation& e : f.equations) {
    if (e.prim->name == "matmul") EXPECT_EQ(e.outputs[0].type.shape.rank(), 2) << ir::print(f);
    EXPECT_NE(e.prim->name, "reduce_sum") << ir::print(f);
  }
  // dW[k, n] = sum over the rows i of x[i, k] * r[i, n].
  std::vector<double> want(8, 0.0);
  for (int64_t i = 0; i < 15; ++i)
    for (int64_t k = 0; k < 4; ++k)
      for (int64_t n = 0; n < 2; ++n)
        want[static_cast<std::size_t>(k * 2 + n)] +=
            xv[static_cast<std::size_t>(i * 4 + k)] * rv[static_cast<std::size_t>(i * 2 + n)];
  expect_allclose(grad(loss)(w), as_tensor({want, {4, 2}}, float64), {.rtol = 1e-5, .atol = 1e-6});
  expect_allclose(jit(grad(loss))(w), as_tensor({want, {4, 2}}, float64),
                  {.rtol = 1e-5, .atol = 1e-6});
}

// k = 1 takes its own path (outer products, written once): the same values as the naive
// reference, exactly (one rounded product each), batched, broadcast and strided.
TEST(Matmul, InnerDimensionOneIsAnExactOuterProduct) {
  uint32_t seed = 150;
  for (DType dt : {float32, float64}) {
    check_shapes({5, 1}, {1, 7}, dt, seed++);
    check_shapes({64, 9, 1}, {64, 1, 13}, dt, seed++);
    check_shapes({3, 1, 4, 1}, {5, 1, 6}, dt, seed++);  // -> [3,5,4,6]
    check_shapes({2, 4, 1}, {1, 3}, dt, seed++);
    SCOPED_TRACE(std::string(dtype_name(dt)));
    const int64_t m = 6, n = 5;
    const auto A = random_values(m, seed++), B = random_values(2 * n, seed++);
    // a: [m,1] with row stride 1 (a transposed row); b: [1,n] with column stride 2.
    const Tensor a = transpose(make(A, {1, m}, dt));
    const Tensor b = slice(transpose(make(B, {n, 2}, dt)), {Slice{0, 1}});
    ASSERT_EQ(b.strides()[1], 2);
    const Tensor c = matmul(a, b);
    std::vector<double> want;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        const double x = A[static_cast<std::size_t>(i)], y = B[static_cast<std::size_t>(2 * j)];
        want.push_back(dt == float32 ? double(float(x) * float(y)) : x * y);
      }
    EXPECT_EQ(c.to_vector<double>(), want);
  }
}

TEST(Matmul, OneDimensionalOperands) {
  uint32_t seed = 200;
  for (DType dt : {float32, float64}) {
    check_shapes({4}, {4}, dt, seed++);        // -> []
    check_shapes({4}, {4, 3}, dt, seed++);     // -> [3]
    check_shapes({3, 4}, {4}, dt, seed++);     // -> [3]
    check_shapes({4}, {2, 4, 3}, dt, seed++);  // -> [2,3]
    check_shapes({2, 3, 4}, {4}, dt, seed++);  // -> [2,3]
  }
  EXPECT_EQ(matmul(ones({5}), ones({2, 5, 3})).shape(), (Shape{2, 3}));
  EXPECT_EQ(matmul(ones({2, 3, 5}), ones({5})).shape(), (Shape{2, 3}));
  EXPECT_EQ(matmul(ones({5}), ones({5})).shape(), Shape{});
}

TEST(Matmul, TransposedAndStridedViews) {
  for (DType dt : {float32, float64}) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    const int64_t m = 6, k = 5, n = 7;
    const auto A = random_values(k * m, 1), B = random_values(n * k, 2);
    // at is a [m,k] view of a row-major [k,m] buffer (strides [1,m]); bt likewise.
    const Tensor at = transpose(make(A, {k, m}, dt));
    const Tensor bt = transpose(make(B, {n, k}, dt));
    ASSERT_FALSE(at.is_contiguous());
    ASSERT_FALSE(bt.is_contiguous());
    std::vector<double> Ad(static_cast<std::size_t>(m * k)), Bd(static_cast<std::size_t>(k * n));
    for (int64_t i = 0; i < m; ++i)
      for (int64_t p = 0; p < k; ++p) Ad[i * k + p] = A[p * m + i];
    for (int64_t p = 0; p < k; ++p)
      for (int64_t j = 0; j < n; ++j) Bd[p * n + j] = B[j * k + p];
    const Tensor a = make(Ad, {m, k}, dt), b = make(Bd, {k, n}, dt);
    const Ref want = ref_matmul(Ad, {m, k}, Bd, {k, n});
    const double tol = 1e-5;
    expect_allclose(matmul(at, b), as_tensor(want, dt), {.rtol = tol, .atol = tol});
    expect_allclose(matmul(a, bt), as_tensor(want, dt), {.rtol = tol, .atol = tol});
    expect_allclose(matmul(at, bt), as_tensor(want, dt), {.rtol = tol, .atol = tol});
    // Batched transposed views: swapaxes of [2,k,m].
    const auto A3 = random_values(2 * k * m, 3);
    std::vector<double> A3d(A3.size());
    for (int64_t t = 0; t < 2; ++t)
      for (int64_t i = 0; i < m; ++i)
        for (int64_t p = 0; p < k; ++p) A3d[t * m * k + i * k + p] = A3[t * k * m + p * m + i];
    expect_allclose(matmul(swapaxes(make(A3, {2, k, m}, dt), -1, -2), b),
                    as_tensor(ref_matmul(A3d, {2, m, k}, Bd, {k, n}), dt),
                    {.rtol = tol, .atol = tol});
    // Views gemm cannot take directly: every other row, reversed rows, broadcast rows.
    const auto W = random_values(2 * m * k, 4);
    std::vector<double> Wd(static_cast<std::size_t>(m * k));
    for (int64_t i = 0; i < m; ++i)
      for (int64_t p = 0; p < k; ++p) Wd[i * k + p] = W[2 * i * k + p];
    const Tensor stepped = slice(make(W, {2 * m, k}, dt), {Slice{std::nullopt, std::nullopt, 2}});
    ASSERT_EQ(stepped.shape(), (Shape{m, k}));
    expect_allclose(matmul(stepped, b), as_tensor(ref_matmul(Wd, {m, k}, Bd, {k, n}), dt),
                    {.rtol = tol, .atol = tol});
    const Tensor flipped = flip(a, {0});
    std::vector<double> Fd(Ad.size());
    for (int64_t i = 0; i < m; ++i)
      for (int64_t p = 0; p < k; ++p) Fd[i * k + p] = Ad[(m - 1 - i) * k + p];
    expect_allclose(matmul(flipped, b), as_tensor(ref_matmul(Fd, {m, k}, Bd, {k, n}), dt),
                    {.rtol = tol, .atol = tol});
    const Tensor row = make(random_values(k, 5), {1, k}, dt);
    const Tensor rows = broadcast_to(row, Shape{m, k});
    std::vector<double> Rd;
    const auto rv = row.to_vector<double>();
    for (int64_t i = 0; i < m; ++i) Rd.insert(Rd.end(), rv.begin(), rv.end());
    expect_allclose(matmul(rows, b), as_tensor(ref_matmul(Rd, {m, k}, Bd, {k, n}), dt),
                    {.rtol = tol, .atol = tol});
    // Inner-dimension stride not 1 in both axes: every other column.
    const auto Q = random_values(k * 2 * n, 6);
    std::vector<double> Qd(static_cast<std::size_t>(k * n));
    for (int64_t p = 0; p < k; ++p)
      for (int64_t j = 0; j < n; ++j) Qd[p * n + j] = Q[p * 2 * n + 2 * j];
    const Tensor cols =
        slice(make(Q, {k, 2 * n}, dt), {Slice{}, Slice{std::nullopt, std::nullopt, 2}});
    expect_allclose(matmul(a, cols), as_tensor(ref_matmul(Ad, {m, k}, Qd, {k, n}), dt),
                    {.rtol = tol, .atol = tol});

    // Batched a with one shared b: batches that fold into one gemm (leading dimension 2k),
    // and ones that do not (every other batch; a batch broadcast with stride 0).
    const auto P = random_values(3 * m * 2 * k, 7);
    std::vector<double> Pd;  // P[:, :, :k]
    for (int64_t r = 0; r < 3 * m; ++r)
      Pd.insert(Pd.end(), P.begin() + r * 2 * k, P.begin() + r * 2 * k + k);
    const Tensor half_cols = slice(make(P, {3, m, 2 * k}, dt), {Slice{}, Slice{}, Slice{0, k}});
    ASSERT_FALSE(half_cols.is_contiguous());
    expect_allclose(matmul(half_cols, b), as_tensor(ref_matmul(Pd, {3, m, k}, Bd, {k, n}), dt),
                    {.rtol = tol, .atol = tol});
    const auto S = random_values(4 * m * k, 8);
    std::vector<double> Sd(S.begin(), S.begin() + m * k);
    Sd.insert(Sd.end(), S.begin() + 2 * m * k, S.begin() + 3 * m * k);
    const Tensor every_other =
        slice(make(S, {4, m, k}, dt), {Slice{std::nullopt, std::nullopt, 2}});
    expect_allclose(matmul(every_other, b), as_tensor(ref_matmul(Sd, {2, m, k}, Bd, {k, n}), dt),
                    {.rtol = tol, .atol = tol});
    std::vector<double> Ad5;
    for (int t = 0; t < 5; ++t) Ad5.insert(Ad5.end(), Ad.begin(), Ad.end());
    expect_allclose(matmul(broadcast_to(a, Shape{5, m, k}), b),
                    as_tensor(ref_matmul(Ad5, {5, m, k}, Bd, {k, n}), dt),
                    {.rtol = tol, .atol = tol});
  }
}

TEST(Matmul, IntegerDtypesExact) {
  for (DType dt : {int32, int64, uint32, uint8}) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    const int hi = dt == uint8 ? 3 : 50, lo = is_unsigned(dt) ? 0 : -50;
    const auto A = random_ints(2 * 37 * 41, 11, lo, hi), B = random_ints(2 * 41 * 29, 12, lo, hi);
    const Tensor c = matmul(make(A, {2, 37, 41}, dt), make(B, {2, 41, 29}, dt));
    EXPECT_EQ(c.dtype(), dt);
    Ref want = ref_matmul(A, {2, 37, 41}, B, {2, 41, 29});
    if (dt == uint8)
      for (double& v : want.values) v = std::fmod(v, 256.0);
    expect_allclose(c, as_tensor(want, dt), {.rtol = 0, .atol = 0});
    // Transposed integer operands.
    const std::vector<double> B2(B.begin(), B.begin() + 37 * 58);
    const Tensor ct = matmul(transpose(make(A, {37, 82}, dt)), make(B2, {37, 58}, dt));
    expect_allclose(ct,
                    as_tensor(
                        [&] {
                          std::vector<double> At(82 * 37);
                          for (int i = 0; i < 82; ++i)
                            for (int p = 0; p < 37; ++p) At[i * 37 + p] = A[p * 82 + i];
                          Ref r = ref_matmul(At, {82, 37}, B2, {37, 58});
                          if (dt == uint8)
                            for (double& v : r.values) v = std::fmod(v, 256.0);
                          return r;
                        }(),
                        dt),
                    {.rtol = 0, .atol = 0});
    // A transposed integer b: [37,58] viewed from a row-major [58,37] buffer.
    std::vector<double> B2t(B2.size());
    for (int p = 0; p < 37; ++p)
      for (int j = 0; j < 58; ++j) B2t[j * 37 + p] = B2[p * 58 + j];
    const std::vector<double> A2(A.begin(), A.begin() + 5 * 37);
    const Tensor cb = matmul(make(A2, {5, 37}, dt), transpose(make(B2t, {58, 37}, dt)));
    Ref rb = ref_matmul(A2, {5, 37}, B2, {37, 58});
    if (dt == uint8)
      for (double& v : rb.values) v = std::fmod(v, 256.0);
    expect_allclose(cb, as_tensor(rb, dt), {.rtol = 0, .atol = 0});
  }
}

TEST(Matmul, IntegerOverflowWraps) {
  // int32: 2^30*2 + 2^30 = 3*2^30 wraps to -2^30; (2^31-1)*2 + 1 = 2^32-1 wraps to -1.
  const Tensor a = tensor({1 << 30, 1 << 30, 2147483647, 1}, Shape{2, 2});
  const Tensor b = tensor({2, 1}, Shape{2, 1});
  EXPECT_EQ(matmul(a, b).to_vector<int32_t>(), (std::vector<int32_t>{-1073741824, -1}));
  // uint8: 200*2 + 100*1 = 500 = 244 (mod 256).
  const Tensor u = matmul(astype(tensor({200, 100}, Shape{1, 2}), uint8),
                          astype(tensor({2, 1}, Shape{2, 1}), uint8));
  EXPECT_EQ(u.to_vector<uint8_t>(), (std::vector<uint8_t>{244}));
  // int64: (2^62) * 4 wraps to 0, plus 5.
  const Tensor l = matmul(tensor(std::vector<int64_t>{int64_t{1} << 62, 5}, Shape{1, 2}),
                          tensor(std::vector<int64_t>{4, 1}, Shape{2, 1}));
  EXPECT_EQ(l.to_vector<int64_t>(), (std::vector<int64_t>{5}));
}

TEST(Matmul, HalfPrecision) {
  for (DType dt : {float16, bfloat16}) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    // Multiples of 1/8 in [-2, 2] are exact in both formats.
    auto A = random_ints(3 * 8 * 12, 21, -16, 16), B = random_ints(12 * 5, 22, -16, 16);
    for (double& v : A) v /= 8;
    for (double& v : B) v /= 8;
    const Tensor c = matmul(make(A, {3, 8, 12}, dt), make(B, {12, 5}, dt));
    EXPECT_EQ(c.dtype(), dt);
    expect_allclose(c, as_tensor(ref_matmul(A, {3, 8, 12}, B, {12, 5}), dt),
                    {.rtol = dt == float16 ? 1e-3 : 8e-3, .atol = 1e-2});
  }
}

TEST(Matmul, PromotesDtypes) {
  const Tensor a = tensor({1, 2, 3, 4}, Shape{2, 2});  // int32
  const Tensor b = tensor({0.5f, 0.25f, 1.f, 2.f}, Shape{2, 2});
  const Tensor c = matmul(a, b);
  EXPECT_EQ(c.dtype(), promote_types(int32, float32));
  EXPECT_EQ(c.to_vector<double>(), (std::vector<double>{2.5, 4.25, 5.5, 8.75}));
  EXPECT_EQ(matmul(astype(a, uint8), astype(a, int64)).dtype(), int64);
  EXPECT_EQ(matmul(astype(a, float16), astype(a, bfloat16)).dtype(), float32);
  // Bools compute in int32, like arithmetic on bools.
  const Tensor t = tensor(std::vector<bool>{true, true, false, true}, Shape{2, 2});
  const Tensor bc = matmul(t, t);
  EXPECT_EQ(bc.dtype(), int32);
  EXPECT_EQ(bc.to_vector<int32_t>(), (std::vector<int32_t>{1, 2, 0, 1}));
}

TEST(Matmul, ZeroSizedDimensions) {
  for (DType dt : {float32, float64, int32, float16}) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    const Tensor c = matmul(zeros({3, 0}, dt), zeros({0, 4}, dt));  // k = 0: zeros
    EXPECT_EQ(c.type(), (TensorType{dt, Shape{3, 4}}));
    EXPECT_EQ(c.to_vector<double>(), std::vector<double>(12, 0.0));
    EXPECT_EQ(matmul(zeros({2, 0, 5}, dt), zeros({2, 5, 4}, dt)).shape(), (Shape{2, 0, 4}));
    EXPECT_EQ(matmul(zeros({2, 3, 5}, dt), zeros({2, 5, 0}, dt)).shape(), (Shape{2, 3, 0}));
    EXPECT_EQ(matmul(zeros({0, 3, 5}, dt), zeros({5, 2}, dt)).shape(), (Shape{0, 3, 2}));
    EXPECT_EQ(matmul(zeros({0}, dt), zeros({0}, dt)).to_vector<double>(), std::vector<double>{0.0});
  }
}

TEST(Matmul, PrimitiveDirectly) {
  const Primitive& p = primitive("matmul");
  const Tensor c = bind1(p, {tensor({1.0, 2.0, 3.0, 4.0}, Shape{1, 2, 2}),
                             tensor({1.0, 0.0, 0.0, 1.0}, Shape{1, 2, 2})});
  EXPECT_EQ(c.to_vector<double>(), (std::vector<double>{1, 2, 3, 4}));
  EXPECT_EQ(p.infer(std::vector<TensorType>{{int64, Shape{4, 2, 3}}, {int64, Shape{4, 3, 5}}}, {}),
            (std::vector<TensorType>{{int64, Shape{4, 2, 5}}}));
}

namespace {
// The Error's op and that its message contains every piece.
void expect_error(const std::function<void()>& f, const std::vector<std::string>& pieces) {
  try {
    f();
    ADD_FAILURE() << "expected kiln::Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.op(), "matmul");
    const std::string msg = e.what();
    for (const std::string& p : pieces)
      EXPECT_NE(msg.find(p), std::string::npos) << "message: " << msg << "\nmissing: " << p;
  }
}
}  // namespace

TEST(Matmul, Errors) {
  expect_error(
      [] {
        matmul(ones({2, 3}), ones({4, 5}));
      },
      {"[matmul] inner dimensions differ", "f32[2,3]", "f32[4,5]", "(3 vs 4)"});
  EXPECT_THROW(matmul(ones({2, 3}), ones({4, 5})), Error);
  expect_error([] { matmul(ones({3}), ones({4})); }, {"f32[3]", "f32[4]", "(3 vs 4)"});
  expect_error(
      [] {
        matmul(ones({2, 3, 4}), ones({3, 4, 5}));
      },
      {"batch dimensions cannot be broadcast", "f32[2,3,4]", "f32[3,4,5]", "(2 vs 3)"});
  expect_error([] { matmul(ones({}), ones({3})); }, {"0-d operand", "f32[]", "f32[3]"});
  // The primitive's own checks, reached by binding it directly.
  const Primitive& p = primitive("matmul");
  expect_error([&] { bind1(p, {ones({3}), ones({3, 2})}); }, {"rank >= 2", "f32[3]", "f32[3,2]"});
  expect_error(
      [&] {
        bind1(p, {ones({2, 2, 3}), ones({3, 3, 2})});
      },
      {"batch dimensions differ", "f32[2,2,3]", "f32[3,3,2]"});
  expect_error(
      [&] {
        bind1(p, {ones({2, 3}), ones({3, 2}, float64)});
      },
      {"differ in dtype", "f32[2,3]", "f64[3,2]"});
  expect_error(
      [&] {
        bind1(p, {ones({2, 3}, bool_), ones({3, 2}, bool_)});
      },
      {"unsupported dtype", "bool[2,3]"});
  expect_error(
      [&] {
        bind1(p, {ones({2, 3}), ones({4, 2})});
      },
      {"inner dimensions differ", "f32[2,3]", "f32[4,2]", "(3 vs 4)"});
}
