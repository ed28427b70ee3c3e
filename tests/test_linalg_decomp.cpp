// Decompositions, least squares, norms and powers (include/kiln/linalg.h): values
// against numpy (tests/reference/linalg_decomp_ref.py), derivatives against finite differences
// in float64, vmap against a loop (and as one batched call), jit against eager, degenerate and
// bad input; and random::multivariate_normal.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kiln/kiln.h"
#include "linalg_testing.h"
#include "testing.h"

using namespace kiln;
using kiln::testing::at;
using kiln::testing::expect_close;
using kiln::testing::expect_error;
using kiln::testing::expect_grad_fd;

namespace {

const io::TensorFile& ref() {
  static const io::TensorFile file = kiln::testing::reference("linalg_decomp");
  return file;
}

Tensor mT(const Tensor& x) { return swapaxes(x, -1, -2); }
Tensor identity_like(const Tensor& q) {  // I [..., c, c] for q [..., r, c]
  std::vector<int64_t> s(q.shape().begin(), q.shape().end() - 2);
  s.push_back(q.dim(-1));
  s.push_back(q.dim(-1));
  return broadcast_to(eye(q.dim(-1), float64), Shape(s));
}

constexpr double kInf = INFINITY;
const char* const kShapes[] = {"tall", "wide", "square"};

class DecompDtypes : public ::testing::TestWithParam<DType> {
 protected:
  Tensor in(const std::string& name) const { return astype(at(ref(), name), GetParam()); }
  double tol() const { return GetParam() == float64 ? 1e-10 : 1e-4; }
};

TEST_P(DecompDtypes, QrMatchesNumpy) {
  for (const char* shape : kShapes)
    for (auto [mode, tag] : {std::pair{linalg::QrMode::reduced, "reduced"},
                             std::pair{linalg::QrMode::complete, "complete"}}) {
      SCOPED_TRACE(std::string(shape) + " " + tag);
      const linalg::QR f = linalg::qr(in(shape), mode);
      EXPECT_EQ(f.q.dtype(), GetParam());
      // Same Householder algorithm as numpy: the same signs.
      expect_close(f.q, at(ref(), std::string("qr_") + tag + "_" + shape + "_q"), tol(), tol());
      expect_close(f.r, at(ref(), std::string("qr_") + tag + "_" + shape + "_r"), tol(), tol());
      expect_close(matmul(f.q, f.r), at(ref(), shape), tol(), tol());
    }
}

TEST_P(DecompDtypes, SvdMatchesNumpy) {
  for (const char* shape : kShapes) {
    expect_close(linalg::svdvals(in(shape)), at(ref(), std::string("svdvals_") + shape), tol(),
                 tol());
    for (bool full : {false, true}) {
      SCOPED_TRACE(std::string(shape) + (full ? " full" : " reduced"));
      const linalg::SVD f = linalg::svd(in(shape), full);
      expect_close(f.s, at(ref(), std::string("svdvals_") + shape), tol(), tol());
      const std::string base = "svd_" + std::to_string(int(full)) + "_" + shape;
      const Tensor u_np = at(ref(), base + "_u"), vh_np = at(ref(), base + "_vh");
      ASSERT_EQ(f.u.shape(), u_np.shape());
      ASSERT_EQ(f.vh.shape(), vh_np.shape());
      // Singular vectors up to each one's sign: |U^T U_numpy| = I (and likewise for Vh) on
      // the columns of distinct singular values (all, here; the extra columns of full
      // matrices span the null space only as a whole).
      const int64_t k = f.s.dim(-1);
      const Tensor uu = abs(matmul(mT(astype(f.u, float64)), u_np));
      const Tensor vv = abs(matmul(astype(f.vh, float64), mT(vh_np)));
      expect_close(slice(uu, {Slice{}, Slice{}, Slice{0, k}, Slice{0, k}}),
                   identity_like(slice(u_np, {Slice{}, Slice{}, Slice{}, Slice{0, k}})), 0.0,
                   10 * tol());
      expect_close(slice(vv, {Slice{}, Slice{}, Slice{0, k}, Slice{0, k}}),
                   identity_like(slice(u_np, {Slice{}, Slice{}, Slice{}, Slice{0, k}})), 0.0,
                   10 * tol());
      // Orthogonality of all columns and the reconstruction.
      expect_close(matmul(mT(f.u), f.u), identity_like(f.u), 0.0, tol());
      expect_close(matmul(f.vh, mT(f.vh)), identity_like(mT(f.vh)), 0.0, tol());
      const Tensor us = slice(f.u, {Slice{}, Slice{}, Slice{}, Slice{0, k}}) * expand_dims(f.s, -2);
      expect_close(matmul(us, slice(f.vh, {Slice{}, Slice{}, Slice{0, k}})), at(ref(), shape),
                   tol(), tol());
    }
  }
}

TEST_P(DecompDtypes, PinvLstsqMatchNumpy) {
  for (const char* shape : kShapes)
    expect_close(linalg::pinv(in(shape)), at(ref(), std::string("pinv_") + shape), 10 * tol(),
                 10 * tol());
  const double rcond = 1e-5;  // the zero singular values are ~1e-16 (f64) or ~1e-7 (f32)
  expect_close(linalg::pinv(in("low_rank"), rcond), at(ref(), "pinv_low_rank"), 10 * tol(),
               10 * tol());
  expect_close(linalg::lstsq(in("low_rank"), in("lstsq_b"), rcond), at(ref(), "lstsq_low_rank"),
               10 * tol(), 10 * tol());
  const Tensor tall = index(index(in("tall"), 0), 0), wide = index(index(in("wide"), 0), 0);
  expect_close(linalg::lstsq(tall, in("lstsq_b")), at(ref(), "lstsq_tall"), 10 * tol(), 10 * tol());
  expect_close(linalg::lstsq(tall, index(mT(in("lstsq_b")), 0)), at(ref(), "lstsq_tall_vec"),
               10 * tol(), 10 * tol());
  expect_close(linalg::lstsq(wide, slice(in("lstsq_b"), {Slice{0, 3}})), at(ref(), "lstsq_wide"),
               10 * tol(), 10 * tol());
}

TEST_P(DecompDtypes, NormMatchesNumpy) {
  const Tensor v = in("vec"), x = in("x3");
  for (auto [tag, ord] : std::vector<std::pair<std::string, linalg::NormOrd>>{{"2", 2},
                                                                              {"1", 1},
                                                                              {"inf", INFINITY},
                                                                              {"minf", -INFINITY},
                                                                              {"0", 0},
                                                                              {"3", 3},
                                                                              {"half", 0.5},
                                                                              {"m1", -1}}) {
    SCOPED_TRACE(tag);
    const Tensor got = linalg::norm(v, ord);
    EXPECT_EQ(got.type(), (TensorType{GetParam(), Shape{}}));
    expect_close(got, at(ref(), "norm_vec_" + tag), tol(), tol());
  }
  expect_close(linalg::norm(v), at(ref(), "norm_vec_default"), tol());
  expect_close(linalg::norm(x), at(ref(), "norm_x3_default"), tol());
  expect_close(linalg::norm(x, 3, std::vector<int64_t>{1}, true), at(ref(), "norm_x3_axis1_keep"),
               tol());
  for (auto [tag, ord] : std::vector<std::pair<std::string, linalg::NormOrd>>{{"fro", "fro"},
                                                                              {"nuc", "nuc"},
                                                                              {"1", 1},
                                                                              {"m1", -1},
                                                                              {"inf", INFINITY},
                                                                              {"minf", -INFINITY},
                                                                              {"2", 2},
                                                                              {"m2", -2}}) {
    SCOPED_TRACE(tag);
    expect_close(linalg::norm(index(x, 0), ord), at(ref(), "norm_mat_" + tag), tol(), tol());
    for (auto [r, c] : {std::pair{1, 2}, std::pair{2, 0}, std::pair{0, 1}})
      expect_close(linalg::norm(x, ord, std::vector<int64_t>{r, c}),
                   at(ref(), "norm_x3_" + tag + "_" + std::to_string(r) + std::to_string(c)), tol(),
                   tol());
    expect_close(linalg::norm(x, ord, std::vector<int64_t>{-1, 0}, true),
                 at(ref(), "norm_x3_" + tag + "_keep"), tol(), tol());
  }
}

TEST_P(DecompDtypes, MatrixPowerMatchesNumpy) {
  const Tensor a = in("square") * 0.5;
  for (int n : {0, 1, 2, 3, 5, -1, -3}) {
    SCOPED_TRACE(n);
    expect_close(linalg::matrix_power(a, n), at(ref(), "matrix_power_" + std::to_string(n)),
                 100 * tol(), 100 * tol());
  }
}

TEST_P(DecompDtypes, JitAgreesWithEager) {
  const auto f = [](const Tensor& a, const Tensor& w) {
    const linalg::QR q = linalg::qr(a);
    const linalg::SVD s = linalg::svd(a, false);
    return sum(q.r * q.r) + sum(linalg::norm(a, "nuc", std::vector<int64_t>{-2, -1})) + sum(s.s) +
           sum(linalg::lstsq(a, w)) + sum(linalg::matrix_power(matmul(mT(a), a), 3));
  };
  const Tensor a = in("tall"), w = slice(in("tall"), {Slice{}, Slice{}, Slice{}, Slice{0, 2}});
  expect_close(jit(f)(a, w), f(a, w), 10 * tol(), 10 * tol());
}

INSTANTIATE_TEST_SUITE_P(LinalgDecomp, DecompDtypes, ::testing::Values(float32, float64),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(LinalgDecomp, GradientsMatchFiniteDifferences) {
  const Tensor tall = at(ref(), "tall"), wide = at(ref(), "wide"), sqm = at(ref(), "square");
  const auto weight = [](const Tensor& t) { return cos(t * 3.0); };
  // qr: reduced tall and square (complete square is the same factorisation).
  for (const Tensor& a : {tall, sqm}) {
    expect_grad_fd(
        [&](const Tensor& x) {
          const linalg::QR f = linalg::qr(x);
          return sum(f.q * weight(f.q)) + sum(f.r * weight(f.r));
        },
        a, sin(a));
  }
  expect_grad_fd([&](const Tensor& x) { return sum(linalg::qr(x).r * sqm); }, sqm, cos(sqm));
  expect_grad_fd(
      [&](const Tensor& x) { return sum(linalg::qr(x, linalg::QrMode::complete).q * sqm); }, sqm,
      cos(sqm));
  // svd: functions invariant to each singular vector's sign.
  for (const Tensor& a : {tall, wide, sqm}) {
    expect_grad_fd(
        [&](const Tensor& x) {
          const linalg::SVD f = linalg::svd(x, false);
          const Tensor us = f.u * expand_dims(sin(f.s), -2);
          return sum(matmul(us, f.vh) * x) + sum(f.s * f.s * f.s) + sum(square(f.u) * f.u * f.u) +
                 sum(square(f.vh) * weight(f.vh * f.vh));
        },
        a, cos(a));
    expect_grad_fd([&](const Tensor& x) { return sum(sin(linalg::svdvals(x))); }, a, cos(a));
    expect_grad_fd([&](const Tensor& x) { return sum(linalg::pinv(x) * weight(mT(x))); }, a, cos(a),
                   1e-5);
    expect_grad_fd(
        [&](const Tensor& x) {
          return sum(linalg::norm(x, "nuc", std::vector<int64_t>{-2, -1}));
        },
        a, cos(a));
    expect_grad_fd(
        [&](const Tensor& x) {
          return sum(linalg::norm(x, 2, std::vector<int64_t>{-2, -1}));
        },
        a, cos(a));
  }
  expect_grad_fd(
      [&](const Tensor& x) {
        return sum(linalg::norm(x, -2, std::vector<int64_t>{-2, -1}));
      },
      sqm, cos(sqm));
  expect_grad_fd([&](const Tensor& x) { return sum(linalg::svd(x, true).s); }, sqm, cos(sqm));
  // lstsq with respect to both operands.
  const Tensor b = slice(tall, {Slice{}, Slice{}, Slice{}, Slice{0, 2}});
  expect_grad_fd(
      [&](const Tensor& x) {
        const Tensor y = linalg::lstsq(x, b);
        return sum(y * weight(y));
      },
      tall, cos(tall), 1e-5);
  // norms: vector ords and matrix ords away from ties.
  const Tensor v = at(ref(), "vec") + 0.1;
  for (double p : {2.0, 1.0, 3.0, 0.5, kInf, -kInf})
    expect_grad_fd([&](const Tensor& x) { return linalg::norm(x, p); }, v, cos(v));
  for (linalg::NormOrd ord : {linalg::NormOrd("fro"), linalg::NormOrd(1), linalg::NormOrd(-1),
                              linalg::NormOrd(INFINITY), linalg::NormOrd(-INFINITY)})
    expect_grad_fd(
        [&](const Tensor& x) {
          return sum(linalg::norm(x, ord, std::vector<int64_t>{1, 2}));
        },
        tall, cos(tall));
  // matrix_power, positive and negative.
  for (int n : {0, 2, 3, -2})
    expect_grad_fd([&](const Tensor& x) { return sum(linalg::matrix_power(x, n) * sqm); },
                   sqm * 0.5 + eye(4, float64), cos(sqm), 1e-5);
}

// vmap of a per-example function: one batched primitive call, values as a loop.
TEST(LinalgDecomp, VmapIsOneBatchedCall) {
  const Tensor tall = reshape(at(ref(), "tall"), {6, 5, 3});
  const auto f = [](const Tensor& a) {
    const linalg::QR q = linalg::qr(a);
    const linalg::SVD s = linalg::svd(a, false);
    return sum(abs(q.r)) + sum(matmul(s.u * expand_dims(s.s, -2), s.vh)) + sum(linalg::svdvals(a)) +
           linalg::norm(a, "fro");
  };
  const auto batched = vmap(f);
  const Tensor got = batched(tall);
  for (int64_t i = 0; i < 6; ++i) expect_close(index(got, i), f(index(tall, i)), 1e-12, 1e-12);
  // pinv batches into one call too.
  const auto pinv_batched = vmap([](const Tensor& a) { return linalg::pinv(a); });
  expect_close(pinv_batched(tall), linalg::pinv(tall), 1e-12, 1e-12);
  int pinv_calls = 0;
  const ir::Function pinv_traced = trace(pinv_batched, tall);
  for (const ir::Equation& e : pinv_traced.equations) pinv_calls += e.prim->name == "pinv";
  EXPECT_EQ(pinv_calls, 1) << pinv_traced;
  const ir::Function traced = trace(batched, tall);
  for (const char* name : {"qr", "svd", "svdvals"}) {
    int count = 0;
    for (const ir::Equation& e : traced.equations) count += e.prim->name == name;
    EXPECT_EQ(count, 1) << name << " in\n" << traced;
  }
}

TEST(LinalgDecomp, DegenerateInputsFollowTheDocumentedRules) {
  const double nan = std::nan("");
  // Nothing below reaches LAPACK with an argument it would report (xerbla prints).
  ::testing::internal::CaptureStderr();
  // Empty matrices: Q is the identity where it has columns, R and s empty or zero.
  const linalg::QR e = linalg::qr(zeros({2, 3, 0}, float64), linalg::QrMode::complete);
  expect_close(e.q, broadcast_to(eye(3, float64), Shape({2, 3, 3})), 0.0);
  EXPECT_EQ(e.r.shape(), Shape({2, 3, 0}));
  EXPECT_EQ(linalg::qr(zeros({0, 4, 4}, float32)).q.shape(), Shape({0, 4, 4}));
  const linalg::SVD es = linalg::svd(zeros({0, 2}, float64));
  EXPECT_EQ(es.s.shape(), Shape({0}));
  expect_close(es.vh, eye(2, float64), 0.0);
  EXPECT_EQ(linalg::pinv(zeros({3, 0}, float64)).shape(), Shape({0, 3}));
  EXPECT_EQ(linalg::norm(zeros({0}, float64)).item<double>(), 0.0);
  expect_close(linalg::norm(zeros({2, 0}, float64), "nuc"), zeros({}, float64), 0.0);
  // NaN / inf input: NaN singular values and vectors for that matrix only.
  const Tensor bad = stack({tensor({nan, 1.0, 1.0, 1.0}, {2, 2}), eye(2, float64)});
  const linalg::SVD f = linalg::svd(bad);
  for (double x : index(f.s, 0).to_vector<double>()) EXPECT_TRUE(std::isnan(x));
  for (double x : index(f.u, 0).to_vector<double>()) EXPECT_TRUE(std::isnan(x));
  expect_close(index(f.s, 1), ones({2}, float64), 1e-15);
  EXPECT_TRUE(std::isnan(linalg::svdvals(tensor({kInf, 0.0}, {1, 2})).item<double>()));
  // Rank deficient: zero singular values, pinv drops them.
  expect_close(linalg::svdvals(zeros({2, 3}, float64)), zeros({2}, float64), 0.0);
  expect_close(linalg::pinv(zeros({2, 3}, float64)), zeros({3, 2}, float64), 0.0);
  // Repeated singular values: values right; the derivative through U, Vh is not finite, the
  // one through s alone is.
  expect_close(linalg::svdvals(eye(3, float64) * 2.0), full({3}, 2.0, float64), 1e-15);
  const Tensor g = grad([](const Tensor& a) { return sum(linalg::svdvals(a)); })(eye(3, float64));
  expect_close(g, eye(3, float64), 1e-12, 1e-12);
  // pinv's derivative stays finite at repeated singular values (constant-rank formula).
  const Tensor d = tensor(kiln::testing::random_values(9, 3), {3, 3});
  expect_grad_fd([&](const Tensor& x) { return sum(linalg::pinv(x) * cos(d)); },
                 eye(3, float64) * 2.0, d);
  // Integers: norm computes in float32; matrix_power stays in the integer dtype.
  const Tensor ints = tensor(std::vector<int32_t>{3, 4}, {2});
  EXPECT_EQ(linalg::norm(ints).type(), (TensorType{float32, Shape{}}));
  EXPECT_EQ(linalg::norm(ints).item<float>(), 5.0f);
  const Tensor m = tensor(std::vector<int32_t>{1, 1, 1, 0}, {2, 2});
  EXPECT_EQ(linalg::matrix_power(m, 10).to_vector<int32_t>(),
            (std::vector<int32_t>{89, 55, 55, 34}));
  // Non-contiguous input reads the same matrices.
  const Tensor sq = at(ref(), "square");
  expect_close(linalg::svdvals(mT(sq)), linalg::svdvals(sq), 1e-12);
  expect_close(linalg::qr(mT(sq)).r, linalg::qr(mT(sq).contiguous()).r, 0.0);
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
}

TEST(LinalgDecomp, BadInputIsAnError) {
  expect_error([] { linalg::qr(zeros({3}, float64)); }, "qr", {"f64[3]", "[..., m, n]"});
  expect_error(
      [] {
        linalg::svd(zeros({2, 2}, int32));
      },
      "svd", {"i32[2,2]", "float32 or float64"});
  expect_error([] { linalg::svdvals(Tensor()); }, "svdvals", {"undefined"});
  expect_error([] { linalg::pinv(zeros({2}, float32)); }, "pinv", {"f32[2]"});
  expect_error(
      [] {
        linalg::lstsq(zeros({3, 2}, float64), zeros({2}, float64));
      },
      "lstsq", {"f64[3,2]", "f64[2]"});
  expect_error([] { linalg::norm(zeros({2, 2, 2}), 2); }, "norm", {"f32[2,2,2]", "axis"});
  expect_error([] { linalg::norm(zeros({2}), "fro"); }, "norm", {"\"fro\"", "vector"});
  expect_error([] { linalg::norm(zeros({2, 2}), 3); }, "norm", {"3", "matrix"});
  expect_error([] { linalg::norm(zeros({2, 2}), "spectral"); }, "norm", {"spectral"});
  expect_error(
      [] {
        linalg::norm(zeros({2, 2}), 2, std::vector<int64_t>{0, -2});
      },
      "norm", {"duplicate"});
  expect_error(
      [] {
        linalg::norm(zeros({2, 2}), 2, std::vector<int64_t>{2});
      },
      "norm", {"out of range"});
  expect_error([] { linalg::norm(zeros({2, 0}), 2); }, "norm", {"empty", "f32[2,0]"});
  expect_error([] { linalg::matrix_power(zeros({2, 3}), 2); }, "matrix_power", {"f32[2,3]"});
  expect_error([] { linalg::matrix_power(zeros({2, 2}, int32), -1); }, "inv", {"i32[2,2]"});
  // Derivatives the rules do not cover say so.
  expect_error(
      [] {
        grad([](const Tensor& a) { return sum(linalg::qr(a).r); })(ones({2, 3}, float64));
      },
      "qr", {"f64[2,3]", "m >= n"});
  expect_error(
      [] {
        grad([](const Tensor& a) { return sum(linalg::svd(a, true).u); })(ones({3, 2}, float64));
      },
      "svd", {"f64[3,2]", "full_matrices"});
}

// ---- random::multivariate_normal -----------------------------------------------------------

TEST(MultivariateNormal, IsMeanPlusCholeskyTimesNormal) {
  const Tensor mean = tensor({1.0, -2.0, 0.5});
  const Tensor cov = tensor({2.0, 0.3, 0.1, 0.3, 1.0, -0.2, 0.1, -0.2, 0.5}, {3, 3});
  const Tensor key = random::key(7);
  const Tensor x = random::multivariate_normal(key, mean, cov, Shape{4});
  EXPECT_EQ(x.type(), (TensorType{float64, Shape{4, 3}}));
  const Tensor z = random::normal(key, Shape{4, 3}, float64);
  const Tensor want = mean + mT(matmul(linalg::cholesky(cov), mT(z)));
  expect_close(x, want, 1e-14, 1e-14);
  // Deterministic, and jit gives the same draw.
  expect_close(random::multivariate_normal(key, mean, cov, Shape{4}), x, 0.0);
  expect_close(jit([&](const Tensor& k) {
                 return random::multivariate_normal(k, mean, cov, Shape{4});
               })(key),
               x, 1e-14, 1e-14);
}

TEST(MultivariateNormal, MomentsMatchTheParameters) {
  const Tensor mu = tensor({1.0f, -2.0f, 0.5f});
  const Tensor cov = tensor({2.0f, 0.3f, 0.1f, 0.3f, 1.0f, -0.2f, 0.1f, -0.2f, 0.5f}, {3, 3});
  const int64_t n = 40000;
  const Tensor x = astype(random::multivariate_normal(random::key(3), mu, cov, Shape{n}), float64);
  EXPECT_EQ(x.shape(), Shape({n, 3}));
  const Tensor m = mean(x, {0});
  const Tensor centred = x - m;
  const Tensor c = matmul(mT(centred), centred) / static_cast<double>(n - 1);
  // Standard errors: sqrt(2 / n) ~ 0.007 for the mean, ~0.015 for the covariance entries.
  expect_close(m, astype(mu, float64), 0.0, 0.04);
  expect_close(c, astype(cov, float64), 0.0, 0.08);
}

TEST(MultivariateNormal, BroadcastsBatchesAndVmapsOverKeys) {
  // Default shape: the batch shape of mean and cov broadcast.
  const Tensor mean = zeros({2, 1, 3}, float64);
  const Tensor cov = broadcast_to(eye(3, float64), Shape({4, 3, 3}));
  EXPECT_EQ(random::multivariate_normal(random::key(1), mean, cov).shape(), Shape({2, 4, 3}));
  // vmap over keys gives what a loop over them gives.
  const Tensor keys = random::split(random::key(2), 5);
  const Tensor c = tensor({1.0, 0.5, 0.5, 2.0}, {2, 2});
  const auto draw = [&](const Tensor& k) {
    return random::multivariate_normal(k, tensor({0.0, 1.0}), c, Shape{3});
  };
  const Tensor batched = vmap(draw)(keys);
  for (int64_t i = 0; i < 5; ++i) expect_close(index(batched, i), draw(index(keys, i)), 0.0);
  // Gradient through mean and cov (reparameterised): d/dmean sum(x) = number of draws.
  const Tensor gm = grad([&](const Tensor& mu) {
    return sum(random::multivariate_normal(random::key(4), mu, c, Shape{3}));
  })(tensor({0.0, 1.0}));
  expect_close(gm, full({2}, 3.0, float64), 1e-14);
  // Not positive definite: NaN samples (cholesky's rule).
  const Tensor bad = random::multivariate_normal(random::key(5), zeros({2}, float64),
                                                 tensor({1.0, 2.0, 2.0, 1.0}, {2, 2}));
  for (double v : bad.to_vector<double>()) EXPECT_TRUE(std::isnan(v));
}

TEST(MultivariateNormal, BadInputIsAnError) {
  expect_error([] { random::multivariate_normal(random::key(0), zeros({3}), eye(2)); },
               "multivariate_normal", {"f32[3]", "f32[2,2]"});
  expect_error([] { random::multivariate_normal(random::key(0), zeros({}), eye(2)); },
               "multivariate_normal", {"f32[]"});
  expect_error(
      [] { random::multivariate_normal(random::key(0), zeros({2}, int32), eye(2, int32)); },
      "multivariate_normal", {"i32", "floating"});
  expect_error(
      [] {
        random::multivariate_normal(random::key(0), zeros({3, 2}), eye(2), Shape{2});
      },
      "multivariate_normal", {"[2]", "broadcast"});
}

}  // namespace
