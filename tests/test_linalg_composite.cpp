// Linear-algebra compositions, LU and expm (include/kiln/linalg.h): derivatives against
// finite differences in float64, vmap against a loop, jit against eager, and errors. Values
// against numpy / scipy / PyTorch are in python/tests/test_linalg.py.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kiln/kiln.h"
#include "linalg_testing.h"
#include "testing.h"

using namespace kiln;
using kiln::testing::expect_close;
using kiln::testing::expect_error;
using kiln::testing::expect_grad_fd;

namespace {

constexpr double kInf = INFINITY;

Tensor normal(uint64_t seed, const Shape& s) {
  return random::normal(random::key(seed), s, float64);
}
// Well conditioned: A = 0.3 N + 2 I.
Tensor conditioned(uint64_t seed, int64_t n) {
  return normal(seed, Shape{n, n}) * 0.3 + eye(n, float64) * 2.0;
}
Tensor spd(uint64_t seed, int64_t n) {
  const Tensor m = normal(seed, Shape{n, n});
  return matmul(m, swapaxes(m, 0, 1)) + eye(n, float64) * 2.0;
}

TEST(LinalgComposite, MultiDotGradientsMatchFiniteDifferences) {
  const Tensor a = normal(1, Shape{3, 6}), b = normal(2, Shape{6, 2}), c = normal(3, Shape{2, 5});
  const Tensor v = normal(4, Shape{5}), w = normal(5, Shape{5});
  expect_grad_fd([&](const Tensor& x) { return sum(linalg::multi_dot({a, x, c}) * w); }, b, cos(b));
  expect_grad_fd(
      [&](const Tensor& x) {
        return linalg::multi_dot({x, a, b, c, v});
      },
      normal(6, Shape{3}), normal(7, Shape{3}));
}

TEST(LinalgComposite, NormGradientsMatchFiniteDifferences) {
  const Tensor x = normal(8, Shape{2, 3, 4});
  for (double p : {2.0, 1.0, 3.0, 0.5, kInf, -kInf})
    expect_grad_fd(
        [&](const Tensor& y) {
          return sum(linalg::vector_norm(y, p, std::vector<int64_t>{0, 2}) * normal(9, Shape{3}));
        },
        x, cos(x));
  for (linalg::NormOrd ord : {linalg::NormOrd("fro"), linalg::NormOrd("nuc"), linalg::NormOrd(1),
                              linalg::NormOrd(-2), linalg::NormOrd(kInf)})
    expect_grad_fd(
        [&](const Tensor& y) {
          return sum(linalg::matrix_norm(y, ord, {0, 2}));
        },
        x, cos(x));
}

TEST(LinalgComposite, CondChoSolveEigvalshGradientsMatchFiniteDifferences) {
  const Tensor a = conditioned(10, 4);
  for (std::optional<linalg::NormOrd> p :
       {std::optional<linalg::NormOrd>{}, std::optional<linalg::NormOrd>{-2},
        std::optional<linalg::NormOrd>{"fro"}, std::optional<linalg::NormOrd>{1}})
    expect_grad_fd([&](const Tensor& x) { return linalg::cond(x, p); }, a, sin(a));
  const Tensor s = spd(11, 4), b = normal(12, Shape{4, 2});
  const Tensor l = linalg::cholesky(s);
  for (bool lower : {true, false}) {
    const Tensor c = lower ? l : swapaxes(l, 0, 1);
    expect_grad_fd([&](const Tensor& x) { return sum(linalg::cho_solve(x, b, lower) * b); }, c,
                   lower ? tril(cos(c)) : triu(cos(c)));
    expect_grad_fd([&](const Tensor& y) { return sum(sin(linalg::cho_solve(c, y, lower))); }, b,
                   cos(b));
  }
  expect_grad_fd([&](const Tensor& x) { return sum(sin(linalg::eigvalsh(x))); }, s, cos(s));
}

TEST(LinalgComposite, VmapAndJitAgreeWithEager) {
  const Tensor as = stack({conditioned(13, 3), conditioned(14, 3)});
  const auto f = [](const Tensor& a) {
    return linalg::cond(a) + linalg::matrix_norm(a, "nuc") + linalg::vector_norm(a, 3) +
           sum(linalg::eigvalsh(a)) + astype(linalg::matrix_rank(a), float64);
  };
  const Tensor batched = vmap(f)(as);
  for (int64_t i = 0; i < 2; ++i) expect_close(index(batched, i), f(index(as, i)), 1e-12);
  expect_close(jit(f)(index(as, 0)), f(index(as, 0)), 1e-12);
}

// Rows 2, 0, 1 of a diagonally dominant matrix: partial pivoting swaps rows, and the swaps stay
// put under the finite-difference steps.
Tensor pivoted(uint64_t seed) {
  const Tensor m = conditioned(seed, 3);
  return stack({index(m, 2), index(m, 0), index(m, 1)});
}

TEST(LinalgLu, FactorsReassembleAndPivotsAreScipys) {
  const Tensor a = pivoted(20);
  const linalg::LU f = linalg::lu(a);
  expect_close(matmul(f.p, matmul(f.l, f.u)), a, 1e-12, 1e-12);
  expect_close(f.l, tril(f.l), 0.0);
  expect_close(f.u, triu(f.u), 0.0);
  const linalg::LUFactor lf = linalg::lu_factor(a);
  EXPECT_EQ(lf.pivots.type(), (TensorType{int32, Shape{3}}));
  // The largest entry of column 0 is row 1 (a's row 0 is m's row 2): pivots[0] = 1.
  EXPECT_EQ(lf.pivots.to_vector<int32_t>()[0], 1);
  expect_close(linalg::lu_pivots_to_permutation(lf.pivots, 3),
               linalg::lu_pivots_to_permutation(tensor(std::vector<int32_t>{1, 2, 2}), 3), 0.0);
}

TEST(LinalgLu, GradientsMatchFiniteDifferences) {
  for (const Tensor& a : {conditioned(21, 4), pivoted(22)}) {
    const Tensor w = normal(23, a.shape());
    expect_grad_fd([&](const Tensor& x) { return sum(linalg::lu_factor(x).lu * w); }, a, cos(a));
    expect_grad_fd(
        [&](const Tensor& x) {
          const linalg::LU f = linalg::lu(x);
          return sum(sin(f.l) * w) + sum(f.u * f.u * w) + sum(f.p * w);
        },
        a, sin(a));
    const Tensor b = normal(24, Shape{a.dim(0), 2});
    for (int trans : {0, 1}) {
      expect_grad_fd(
          [&](const Tensor& x) {
            return sum(linalg::lu_solve(linalg::lu_factor(x), b, trans) * b);
          },
          a, cos(a));
      expect_grad_fd(
          [&](const Tensor& y) {
            return sum(sin(linalg::lu_solve(linalg::lu_factor(a), y, trans)));
          },
          b, cos(b));
    }
  }
}

TEST(LinalgLu, VmapAndJitAgreeWithEager) {
  const Tensor as = stack({pivoted(25), conditioned(26, 3)});
  const Tensor b = normal(27, Shape{3});
  const auto f = [&](const Tensor& a) { return linalg::lu_solve(linalg::lu_factor(a), b); };
  const Tensor batched = vmap(f)(as);
  for (int64_t i = 0; i < 2; ++i) {
    expect_close(index(batched, i), f(index(as, i)), 1e-12);
    expect_close(index(batched, i), linalg::solve(index(as, i), b), 1e-12);
  }
  expect_close(jit(f)(index(as, 0)), f(index(as, 0)), 1e-12);
}

TEST(LinalgExpm, GradientsMatchFiniteDifferences) {
  // Norms that take 0, 2 and 6 squarings.
  for (double scale : {0.5, 8.0, 100.0}) {
    const Tensor a = normal(30, Shape{3, 3}) * (scale / 3.0);
    const Tensor w = normal(31, Shape{3, 3});
    expect_grad_fd([&](const Tensor& x) { return sum(linalg::expm(x) * w); }, a, cos(a), 1e-5);
  }
  // Second order: d/dt of the gradient along a direction, against differences of the gradient.
  const Tensor a = normal(32, Shape{2, 2});
  const auto g = grad([](const Tensor& x) { return sum(sin(linalg::expm(x))); });
  const Tensor d = cos(a);
  const double h = 1e-5;
  const Tensor fd = (g(a + d * h) - g(a - d * h)) / (2 * h);
  const Tensor hvp = jvp(g, std::tuple{a}, std::tuple{d}).second;
  expect_close(hvp, fd, 1e-5, 1e-7);
}

TEST(LinalgExpm, VmapAndJitAgreeWithEagerAcrossSquaringCounts) {
  // Matrices needing 0 and 5 squarings in one batch: the loop runs 5 steps for both.
  const Tensor as = stack({normal(33, Shape{3, 3}) * 0.1, normal(34, Shape{3, 3}) * 40.0});
  const auto f = [](const Tensor& a) { return linalg::expm(a); };
  const Tensor eager = f(as), batched = vmap(f)(as), compiled = jit(f)(as);
  for (int64_t i = 0; i < 2; ++i) {
    expect_close(index(eager, i), f(index(as, i)), 1e-13, 1e-13);
    expect_close(index(batched, i), f(index(as, i)), 1e-13, 1e-13);
    expect_close(index(compiled, i), f(index(as, i)), 1e-13, 1e-13);
  }
  // exp(A) exp(-A) = I, at a norm that takes squarings but keeps the product well conditioned.
  const Tensor m = normal(35, Shape{3, 3}) * 3.0;
  expect_close(matmul(f(m), f(-m)), eye(3, float64), 1e-10, 1e-10);
}

TEST(LinalgComposite, BadInputIsAnError) {
  expect_error(
      [] {
        linalg::multi_dot({zeros({2, 3}, float64)});
      },
      "multi_dot", {"too few operands"});
  expect_error([] { linalg::cond(zeros({3}, float64)); }, "cond", {"not matrices"});
  expect_error([] { linalg::expm(zeros({2, 3}, float64)); }, "expm", {"not square matrices"});
  expect_error(
      [] {
        linalg::lu_factor(zeros({2, 3}, float64));
      },
      "lu_factor", {"not square matrices"});
  expect_error([] { linalg::cond(zeros({2, 0}, float64)); }, "cond", {"empty matrices"});
  expect_error(
      [] {
        linalg::matrix_rank(zeros({3, 3}, int32));
      },
      "matrix_rank", {"unsupported dtype"});
  expect_error(
      [] {
        linalg::cho_solve(zeros({3, 3}, float64), zeros({2}, float64));
      },
      "triangular_solve", {"shapes do not match"});
  expect_error([] { linalg::vector_norm(zeros({2}, float64), 2, std::vector<int64_t>{1}); },
               "vector_norm", {"axis out of range"});
  expect_error(
      [] {
        linalg::matrix_norm(zeros({2, 2}, float64), 2, {0, -2});
      },
      "matrix_norm", {"duplicate axes"});
}

}  // namespace
