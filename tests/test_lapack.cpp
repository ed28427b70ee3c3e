// Linear algebra through LAPACK (include/kiln/linalg.h): values against numpy / scipy
// (tests/reference/lapack_ref.py), derivatives against finite differences in float64, vmap
// against a loop (and as one batched call), jit against eager, degenerate and bad input.
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
  static const io::TensorFile file = kiln::testing::reference("lapack");
  return file;
}

class LapackDtypes : public ::testing::TestWithParam<DType> {
 protected:
  Tensor in(const char* name) const { return astype(at(ref(), name), GetParam()); }
  double rtol() const { return GetParam() == float64 ? 1e-12 : 1e-4; }
};

TEST_P(LapackDtypes, ValuesMatchNumpy) {
  const double tol = rtol();
  expect_close(linalg::cholesky(in("spd")), at(ref(), "cholesky"), tol, tol);
  expect_close(linalg::solve(in("general"), in("rhs")), at(ref(), "solve"), 100 * tol, tol);
  expect_close(linalg::solve(index(index(in("general"), 0), 0), in("vec")), at(ref(), "solve_vec"),
               100 * tol, tol);
  expect_close(linalg::inv(in("general")), at(ref(), "inv"), 100 * tol, tol);
  const auto [sign, logabs] = linalg::slogdet(in("general"));
  expect_close(sign, at(ref(), "slogdet_sign"), 0.0);
  expect_close(logabs, at(ref(), "slogdet_logabs"), tol, tol);
  expect_close(linalg::det(in("general")), at(ref(), "det"), 10 * tol, tol);
  // eigh: eigenvalues, and eigenvectors up to each one's sign: |V^T V_numpy| = I.
  const auto [w, v] = linalg::eigh(in("general"));
  expect_close(w, at(ref(), "eigh_w"), 10 * tol, 10 * tol);
  expect_close(abs(matmul(swapaxes(astype(v, float64), -1, -2), at(ref(), "eigh_v"))),
               broadcast_to(eye(4, float64), Shape({2, 3, 4, 4})), 0.0, 100 * tol);
  for (bool lower : {false, true})
    for (bool transpose : {false, true})
      for (bool unit : {false, true}) {
        const std::string name = "tri_l" + std::to_string(lower) + "_t" +
                                 std::to_string(transpose) + "_u" + std::to_string(unit);
        SCOPED_TRACE(name);
        expect_close(linalg::triangular_solve(
                         in("tri_a"), in("rhs"),
                         {.lower = lower, .transpose = transpose, .unit_diagonal = unit}),
                     at(ref(), name.c_str()), 10 * tol, tol);
      }
}

TEST_P(LapackDtypes, JitAgreesWithEager) {
  const auto f = [](const Tensor& a, const Tensor& g, const Tensor& b) {
    const Tensor l = linalg::cholesky(a);
    return linalg::triangular_solve(l, linalg::solve(g, b), {.lower = true}) *
               expand_dims(expand_dims(linalg::det(g), -1), -1) +
           matmul(linalg::inv(g), b);
  };
  expect_close(jit(f)(in("spd"), in("general"), in("rhs")), f(in("spd"), in("general"), in("rhs")),
               rtol(), rtol());
}

INSTANTIATE_TEST_SUITE_P(Lapack, LapackDtypes, ::testing::Values(float32, float64),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// A usage example: a Newton-like direction through cholesky, a vector triangular solve
// and slogdet, compiled; against central differences of the same function in float64.
TEST(Lapack, UsageExampleGradMatchesFiniteDifferences) {
  Tensor A = tensor({4.0, 2.0, 2.0, 3.0}, {2, 2}), b = tensor({1.0, 2.0});
  const auto f = [](const Tensor& A, const Tensor& b) {
    Tensor L = linalg::cholesky(A);
    Tensor x = linalg::triangular_solve(L, b, {.lower = true});
    return sum(x * x) + linalg::slogdet(A).second;
  };
  auto newton_dir = jit(grad(f));
  const Tensor g = newton_dir(A, b);
  ASSERT_EQ(g.shape(), Shape({2, 2}));
  const std::vector<double> a0 = A.to_vector<double>(), gv = g.to_vector<double>();
  // A enters symmetrised, so the gradient is symmetric and each entry is half of the
  // derivative along the symmetric perturbation of (i, j) and (j, i) when i != j.
  const double h = 1e-6;
  for (int i = 0; i < 4; ++i) {
    std::vector<double> p = a0, m = a0;
    p[i] += h;
    m[i] -= h;
    const double fd =
        (f(tensor(p, {2, 2}), b).item<double>() - f(tensor(m, {2, 2}), b).item<double>()) / (2 * h);
    EXPECT_NEAR(gv[i], fd, 1e-6) << "entry " << i;
  }
}

TEST(Lapack, GradientsMatchFiniteDifferences) {
  const Tensor spd = at(ref(), "spd"), gen = at(ref(), "general"), rhs = at(ref(), "rhs");
  const Tensor dir = at(ref(), "general") * 0.5;  // any direction (A symmetrised: any works)
  const Tensor w = at(ref(), "rhs");
  expect_grad_fd([&](const Tensor& a) { return sum(linalg::cholesky(a) * sin(a)); }, spd, dir);
  expect_grad_fd([&](const Tensor& a) { return sum(linalg::solve(a, rhs) * w); }, gen, dir);
  expect_grad_fd([&](const Tensor& b) { return sum(square(linalg::solve(gen, b))); }, rhs, w);
  expect_grad_fd([&](const Tensor& a) { return sum(linalg::inv(a) * gen); }, gen, dir);
  expect_grad_fd([&](const Tensor& a) { return sum(linalg::det(a)); }, gen, dir);
  expect_grad_fd([&](const Tensor& a) { return sum(linalg::slogdet(a).second); }, gen, dir);
  // eigh: through w, and through V by a function of V invariant to each column's sign.
  expect_grad_fd(
      [&](const Tensor& a) {
        const auto [w, v] = linalg::eigh(a);
        return sum(w * sin(w)) + sum(v * v * gen);
      },
      gen, dir);
  const Tensor tri = at(ref(), "tri_a");
  for (bool lower : {false, true})
    for (bool transpose : {false, true})
      for (bool unit : {false, true}) {
        const linalg::TriangularSolveOptions o{lower, transpose, unit};
        expect_grad_fd(
            [&](const Tensor& a) { return sum(linalg::triangular_solve(a, rhs, o) * w); }, tri,
            dir);
        expect_grad_fd(
            [&](const Tensor& b) { return sum(square(linalg::triangular_solve(tri, b, o))); }, rhs,
            w);
      }
}

// vmap of a per-example function: one batched primitive call, values as a loop.
TEST(Lapack, VmapIsOneBatchedCall) {
  const Tensor spd = reshape(at(ref(), "spd"), {6, 4, 4});
  const Tensor gen = reshape(at(ref(), "general"), {6, 4, 4});
  const Tensor vec = tensor(kiln::testing::random_values(24, 7), {6, 4});
  const auto f = [](const Tensor& s, const Tensor& g, const Tensor& v) {
    const Tensor l = linalg::cholesky(s);
    return linalg::triangular_solve(l, linalg::solve(g, v), {.lower = true}) * linalg::det(g);
  };
  const auto batched = vmap(f);
  const Tensor got = batched(spd, gen, vec);
  for (int64_t i = 0; i < 6; ++i)
    expect_close(index(got, {i}), f(index(spd, {i}), index(gen, {i}), index(vec, {i})), 1e-12,
                 1e-12);
  const ir::Function traced = trace(batched, spd, gen, vec);
  const ir::Function eig = trace(vmap([](const Tensor& a) { return linalg::eigh(a).first; }), gen);
  int eigh_calls = 0;
  for (const ir::Equation& e : eig.equations) eigh_calls += e.prim->name == "eigh";
  EXPECT_EQ(eigh_calls, 1) << eig;
  expect_close(vmap([](const Tensor& a) { return linalg::eigh(a).first; })(gen),
               linalg::eigh(gen).first, 0.0);
  for (const char* name : {"cholesky", "triangular_solve", "solve", "slogdet"}) {
    int count = 0;
    for (const ir::Equation& e : traced.equations) count += e.prim->name == name;
    EXPECT_EQ(count, 1) << name << " in\n" << traced;
  }
}

TEST(Lapack, DegenerateInputsFollowTheDocumentedRules) {
  const double nan = std::nan("");
  // Not positive definite: NaNs (eagerly and under jit alike).
  const Tensor indefinite = tensor({1.0, 2.0, 2.0, 1.0}, {2, 2});
  for (double v : linalg::cholesky(indefinite).to_vector<double>()) EXPECT_TRUE(std::isnan(v));
  for (double v :
       jit([](const Tensor& a) { return linalg::cholesky(a); })(indefinite).to_vector<double>())
    EXPECT_TRUE(std::isnan(v));
  // Singular: solve and inv give NaNs, det 0, slogdet (0, -inf).
  const Tensor singular = tensor({1.0, 2.0, 2.0, 4.0}, {2, 2});
  for (double v : linalg::inv(singular).to_vector<double>()) EXPECT_TRUE(std::isnan(v));
  for (double v : linalg::solve(singular, tensor({1.0, 1.0})).to_vector<double>())
    EXPECT_TRUE(std::isnan(v));
  EXPECT_EQ(linalg::det(tensor({0.0, 0.0, 0.0, 0.0}, {2, 2})).item<double>(), 0.0);
  const auto [sign, logabs] = linalg::slogdet(tensor({0.0, 0.0, 0.0, 0.0}, {2, 2}));
  EXPECT_EQ(sign.item<double>(), 0.0);
  EXPECT_EQ(logabs.item<double>(), -INFINITY);
  // eigh: a repeated eigenvalue has the right values; NaN input gives NaNs.
  expect_close(linalg::eigh(eye(3, float64) * 2.0).first, full({3}, 2.0, float64), 1e-15);
  for (double x : linalg::eigh(tensor({nan, 1.0, 1.0, 1.0}, {2, 2})).second.to_vector<double>())
    EXPECT_TRUE(std::isnan(x));
  // NaN input propagates.
  EXPECT_TRUE(std::isnan(linalg::det(tensor({nan, 1.0, 1.0, 1.0}, {2, 2})).item<double>()));
  // Empty: 0x0 matrices (det 1) and empty batches.
  EXPECT_EQ(linalg::cholesky(zeros({3, 0, 0}, float64)).shape(), Shape({3, 0, 0}));
  expect_close(linalg::det(zeros({3, 0, 0}, float64)), ones({3}, float64), 0.0);
  EXPECT_EQ(linalg::solve(zeros({0, 2, 2}, float64), zeros({0, 2, 3}, float64)).shape(),
            Shape({0, 2, 3}));
  EXPECT_EQ(linalg::triangular_solve(eye(2, float32), zeros({2, 0}, float32)).shape(),
            Shape({2, 0}));
  // Broadcast batch dimensions and a non-contiguous (transposed) operand.
  const Tensor g = at(ref(), "general");
  const Tensor r = index(index(at(ref(), "rhs"), 0), 0);
  expect_close(linalg::solve(g, r), linalg::solve(g, broadcast_to(r, Shape({2, 3, 4, 2}))), 0.0);
  expect_close(linalg::inv(swapaxes(g, -1, -2)), swapaxes(at(ref(), "inv"), -1, -2), 1e-10, 1e-10);
}

TEST(Lapack, BadInputIsAnError) {
  expect_error(
      [] {
        linalg::cholesky(zeros({2, 3}, float64));
      },
      "cholesky", {"f64[2,3]", "square"});
  expect_error([] { linalg::cholesky(zeros({3}, float64)); }, "cholesky", {"f64[3]"});
  expect_error(
      [] {
        linalg::cholesky(zeros({2, 2}, int32));
      },
      "cholesky", {"i32[2,2]", "float32 or float64"});
  expect_error(
      [] {
        linalg::solve(zeros({3, 3}, float64), zeros({2}, float64));
      },
      "solve", {"f64[3,3]", "f64[2]"});
  expect_error(
      [] {
        linalg::solve(zeros({3, 3}, float64), zeros({2, 1}, float64));
      },
      "solve", {"f64[2,1]"});
  expect_error(
      [] {
        linalg::solve(zeros({2, 3, 3}, float64), zeros({4, 3, 1}, float64));
      },
      "solve", {"broadcast"});
  expect_error(
      [] {
        linalg::triangular_solve(zeros({2, 3}, float64), zeros({3}, float64));
      },
      "triangular_solve", {"f64[2,3]"});
  expect_error([] { linalg::det(zeros({2, 3}, float32)); }, "slogdet", {"f32[2,3]"});
  expect_error([] { linalg::inv(Tensor()); }, "inv", {"undefined"});
  expect_error([] { linalg::eigh(zeros({3, 2}, float64)); }, "eigh", {"f64[3,2]", "square"});
}

}  // namespace
