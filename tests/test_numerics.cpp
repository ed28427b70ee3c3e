// Numerical edge cases of the ops and nn: cancellation in log_softmax and its
// siblings, reductions over empty axes, signed zeros, selection ops whose forward and reverse
// derivatives must pick the same element (jacfwd == jacrev), the curvature of the losses at
// zero and at kinks, and cross_entropy's labels outside [0, C).
//
// References: numpy 1.24 (the expression is given next to each pasted value), analytic
// formulas evaluated in long double by plain loops, and float64 finite differences. Nothing
// is compared against a value the code under test produced, except where the test is that
// two modes of one transform agree (jacfwd vs jacrev, eager vs jit).
#include <gtest/gtest.h>
#include <kiln/kiln.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "testing.h"

namespace kiln {
namespace {

using kiln::testing::expect_error;
using D = std::vector<double>;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNan = std::numeric_limits<double>::quiet_NaN();

// Values within atol + rtol |want|; NaN matches NaN and infinities match exactly.
void expect_close(const Tensor& t, const D& want, double rtol, double atol = 0.0,
                  const std::string& what = "") {
  const D got = t.to_vector<double>();
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < want.size(); ++i) {
    if (std::isnan(want[i]))
      EXPECT_TRUE(std::isnan(got[i])) << what << " [" << i << "]: " << got[i];
    else if (std::isinf(want[i]))
      EXPECT_EQ(got[i], want[i]) << what << " [" << i << "]";
    else
      EXPECT_NEAR(got[i], want[i], atol + rtol * std::fabs(want[i])) << what << " [" << i << "]";
  }
}
// Bit-for-bit the same values (NaN matches NaN): for two derivative modes that must choose
// the same elements.
void expect_same(const Tensor& a, const Tensor& b, const std::string& what) {
  ASSERT_EQ(a.type(), b.type()) << what;
  const D x = a.to_vector<double>(), y = b.to_vector<double>();
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (!(std::isnan(x[i]) && std::isnan(y[i]))) {
      EXPECT_EQ(x[i], y[i]) << what << " [" << i << "]";
    }
  }
}

Tensor f32(const D& v, const Shape& s) { return astype(tensor(v, s), float32); }
Tensor f64(const D& v, const Shape& s) { return tensor(v, s); }

// ---- 3. log_softmax and its siblings keep the digits next to large logits ----------------

TEST(NumericsSoftmax, LogSoftmaxOfLargeLogitsKeepsTheLogOfTheSum) {
  // numpy: x - m - np.log(np.sum(np.exp(x - m))), m = x.max(), in float32 and float64
  expect_close(log_softmax(f32({1e7, 1e7}, {2})), {-0.6931472, -0.6931472}, 1e-7);
  expect_close(log_softmax(f32({1000, 1000, -1000}, {3})), {-0.6931472, -0.6931472, -2000.6931},
               1e-7);
  expect_close(log_softmax(f64({1e7, 1e7}, {2})), {-0.6931471805599453, -0.6931471805599453},
               1e-15);
  expect_close(log_softmax(f64({1000, 1000, -1000}, {3})),
               {-0.6931471805599453, -0.6931471805599453, -2000.69314718056}, 1e-15);
  // Along an inner axis of a batch, and through cross_entropy (which uses log_softmax).
  expect_close(log_softmax(f32({1e7, 3, 1e7, 3}, {2, 2}), 0),
               {-0.6931472, -0.6931472, -0.6931472, -0.6931472}, 1e-7);
  const Tensor label0 = tensor(std::vector<int64_t>{0}, Shape{1});
  EXPECT_NEAR(nn::cross_entropy(f32({1e7, 1e7}, {1, 2}), label0).item<double>(), 0.6931472, 1e-7);
}

// The shift by the max is a stop_gradient: the derivatives are those of the formula, also at
// ties (the max's own derivative splits there) and next to -inf.
TEST(NumericsSoftmax, DerivativesAtTiesAndMinusInfinityAreTheFormulas) {
  // d log_softmax_0 / dx = e_0 - softmax(x); Hessian of logsumexp = diag(p) - p p^T.
  const Tensor tie = f64({2, 2, 2}, {3});
  expect_close(grad([](const Tensor& x) { return index(log_softmax(x), 0); })(tie),
               {2.0 / 3, -1.0 / 3, -1.0 / 3}, 1e-15);
  const double a = 1.0 / 3 - 1.0 / 9, b = -1.0 / 9;
  const D want{a, b, b, b, a, b, b, b, a};
  auto lse = [](const Tensor& x) { return logsumexp(x); };
  expect_close(hessian(lse)(tie), want, 1e-15, 1e-16);
  expect_close(jacrev([&](const Tensor& x) { return grad(lse)(x); })(tie), want, 1e-15, 1e-16);
  // A -inf logit has probability 0: gradient [0, 1], no curvature, and no NaN.
  const Tensor masked = f64({-kInf, 0.5}, {2});
  expect_close(grad(lse)(masked), {0, 1}, 0);
  expect_close(hessian(lse)(masked), {0, 0, 0, 0}, 0);
}

// ---- 4. reductions over an empty axis (numpy's semantics) ----------------------------------

TEST(NumericsEmpty, LogsumexpAndSoftmaxOverAnEmptyAxis) {
  // numpy: np.logaddexp.reduce(np.zeros((0, 3)), axis=0) -> [-inf, -inf, -inf]
  const Tensor lse = logsumexp(zeros({0, 3}), {0});
  EXPECT_EQ(lse.type(), (TensorType{float32, Shape{3}}));
  expect_close(lse, {-kInf, -kInf, -kInf}, 0);
  expect_close(logsumexp(zeros({0, 3}), {0}, true), {-kInf, -kInf, -kInf}, 0);
  EXPECT_EQ(logsumexp(zeros({0, 3}), {0}, true).shape(), (Shape{1, 3}));
  expect_close(logsumexp(zeros({2, 0, 3}), {0, 1}), {-kInf, -kInf, -kInf}, 0);
  expect_close(logsumexp(zeros({0})), {-kInf}, 0);
  for (const auto& f :
       {std::function<Tensor(const Tensor&)>([](const Tensor& x) { return softmax(x, 1); }),
        std::function<Tensor(const Tensor&)>([](const Tensor& x) { return log_softmax(x, 1); })}) {
    const Tensor y = f(zeros({3, 0}));
    EXPECT_EQ(y.type(), (TensorType{float32, Shape{3, 0}}));
  }
  // An empty tensor whose softmax axis is not empty is an ordinary empty result.
  EXPECT_EQ(softmax(zeros({0, 3}), 1).type(), (TensorType{float32, Shape{0, 3}}));
  // Derivatives, jit and vmap take the same path.
  const Tensor g =
      grad([](const Tensor& x) { return sum(logsumexp(x, {0})); })(zeros({0, 3}, float64));
  EXPECT_EQ(g.type(), (TensorType{float64, Shape{0, 3}}));
  expect_close(jit([](const Tensor& x) { return logsumexp(x, {0}); })(zeros({0, 3})),
               {-kInf, -kInf, -kInf}, 0);
  const Tensor v = vmap([](const Tensor& x) { return logsumexp(x, {0}); })(zeros({2, 0, 3}));
  EXPECT_EQ(v.shape(), (Shape{2, 3}));
  expect_close(v, D(6, -kInf), 0);
  EXPECT_EQ(vmap([](const Tensor& x) { return log_softmax(x, 0); })(zeros({2, 0})).shape(),
            (Shape{2, 0}));
  // The result is a constant -inf: its tangent is 0, as the empty sum's (not log's 0 / 0).
  const auto [value, tangent] =
      jvp([](const Tensor& x) { return logsumexp(x, {0}); }, std::tuple{zeros({0, 3}, float64)},
          std::tuple{zeros({0, 3}, float64)});
  expect_close(value, {-kInf, -kInf, -kInf}, 0);
  expect_close(tangent, {0, 0, 0}, 0);
}

TEST(NumericsEmpty, EveryReductionFollowsNumpy) {
  // numpy: np.sum / np.prod / np.mean / np.var / np.all / np.any of np.zeros((0, 3)), axis=0
  //   -> [0 0 0], [1 1 1], [nan nan nan], [nan nan nan], [True]*3, [False]*3
  const Tensor e = zeros({0, 3});
  expect_close(sum(e, {0}), {0, 0, 0}, 0);
  expect_close(prod(e, {0}), {1, 1, 1}, 0);
  expect_close(mean(e, {0}), {kNan, kNan, kNan}, 0);
  expect_close(var(e, {0}), {kNan, kNan, kNan}, 0);
  expect_close(astype(all(e, {0}), float64), {1, 1, 1}, 0);
  expect_close(astype(any(e, {0}), float64), {0, 0, 0}, 0);
  EXPECT_EQ(sum(zeros({0}, int32)).item<int32_t>(), 0);
  EXPECT_EQ(prod(zeros({0}, int64)).item<int64_t>(), 1);
  // Their derivatives over an empty axis are empty, and vmap agrees.
  for (const auto& f :
       {std::function<Tensor(const Tensor&)>([](const Tensor& x) { return sum(x, {0}); }),
        std::function<Tensor(const Tensor&)>([](const Tensor& x) { return prod(x, {0}); }),
        std::function<Tensor(const Tensor&)>([](const Tensor& x) { return mean(x, {0}); })}) {
    EXPECT_EQ(grad([&](const Tensor& x) { return sum(f(x)); })(zeros({0, 3}, float64)).shape(),
              (Shape{0, 3}));
    EXPECT_EQ(vmap(f)(zeros({2, 0, 3})).shape(), (Shape{2, 3}));
  }
  // max, min, argmax and argmin have no identity: numpy raises ("zero-size array to
  // reduction operation maximum which has no identity", "attempt to get argmax of an empty
  // sequence"), and so do they, naming the shape and the axis.
  expect_error([&] { (void)max(e, {0}); }, "reduce_max",
               {"reduction over an empty axis", "f32[0,3]", "axis 0"});
  expect_error([&] { (void)min(e, {0}); }, "reduce_min",
               {"reduction over an empty axis", "f32[0,3]", "axis 0"});
  expect_error([&] { (void)max(zeros({0})); }, "reduce_max", {"reduction over an empty axis"});
  expect_error([&] { (void)argmax(e, 0); }, "argmax",
               {"empty axis", "f32[0,3]", "expected a non-empty axis"});
  expect_error([&] { (void)argmin(e); }, "argmin", {"empty axis"});
  // A non-empty axis of an empty tensor is fine: an empty result.
  EXPECT_EQ(max(e, {1}).shape(), (Shape{0}));
}

// ---- 6. signed zeros, as numpy ------------------------------------------------------------

bool negative_zero(double v) { return v == 0.0 && std::signbit(v); }
bool positive_zero(double v) { return v == 0.0 && !std::signbit(v); }

TEST(NumericsSignedZero, AbsClearsTheSignOfZero) {
  // numpy: np.abs(np.float32(-0.0)) -> 0.0 (+0); likewise for float16 and float64.
  for (DType dt : {float16, bfloat16, float32, float64}) {
    const D v = abs(astype(tensor({-0.0, 0.0, -2.5}), dt)).to_vector<double>();
    EXPECT_TRUE(positive_zero(v[0])) << dt << ": " << v[0];
    EXPECT_TRUE(positive_zero(v[1])) << dt;
    EXPECT_EQ(v[2], 2.5) << dt;
  }
}

TEST(NumericsSignedZero, OtherKernelsMatchNumpy) {
  const Tensor nz = tensor({-0.0}), pz = tensor({0.0});
  auto first = [](const Tensor& t) { return t.to_vector<double>()[0]; };
  // numpy: np.sign(-0.0) -> 0.0; np.floor(-0.0), np.ceil(-0.5), np.round(-0.4), np.round(-0.0)
  // -> -0.0; np.sqrt(-0.0) -> -0.0; np.negative(0.0) -> -0.0
  EXPECT_TRUE(positive_zero(first(sign(nz))));
  EXPECT_TRUE(negative_zero(first(floor(nz))));
  EXPECT_TRUE(negative_zero(first(ceil(tensor({-0.5})))));
  EXPECT_TRUE(negative_zero(first(round(tensor({-0.4})))));
  EXPECT_TRUE(negative_zero(first(round(nz))));
  EXPECT_TRUE(negative_zero(first(sqrt(nz))));
  EXPECT_TRUE(negative_zero(first(neg(pz))));
  // numpy: np.maximum(-0.0, 0.0) -> 0.0, np.maximum(0.0, -0.0) -> -0.0, np.minimum likewise
  // (the second operand wins a tie).
  EXPECT_TRUE(positive_zero(first(maximum(nz, pz))));
  EXPECT_TRUE(negative_zero(first(maximum(pz, nz))));
  EXPECT_TRUE(positive_zero(first(minimum(nz, pz))));
  EXPECT_TRUE(negative_zero(first(minimum(pz, nz))));
  // Reductions do not depend on the order they combine in (threads, vector lanes): +0 is the
  // max and -0 the min of {-0, +0} (IEEE 754-2019 maximum/minimum), where numpy's np.max gives
  // whichever comes last (np.max([0.0, -0.0]) -> -0.0); docs/DESIGN.md, "Kernels".
  EXPECT_TRUE(positive_zero(max(tensor({-0.0, 0.0})).item<double>()));
  EXPECT_TRUE(positive_zero(max(tensor({0.0, -0.0})).item<double>()));
  EXPECT_TRUE(negative_zero(min(tensor({-0.0, 0.0})).item<double>()));
  EXPECT_TRUE(negative_zero(min(tensor({0.0, -0.0})).item<double>()));
  // An all -inf max is -inf (not the lowest finite value), an all +inf min +inf.
  EXPECT_EQ(max(tensor({-HUGE_VAL, -HUGE_VAL})).item<double>(), -HUGE_VAL);
  EXPECT_EQ(min(tensor({HUGE_VAL})).item<double>(), HUGE_VAL);
  EXPECT_EQ(max(tensor({-HUGE_VALF, -HUGE_VALF})).item<float>(), -HUGE_VALF);
  // numpy: np.clip(-0.0, 0.0, 1.0) -> 0.0; np.sum([-0.0, -0.0]) -> 0.0 (the sum starts at +0)
  EXPECT_TRUE(positive_zero(first(clip(nz, 0.0, 1.0))));
  EXPECT_TRUE(positive_zero(sum(tensor({-0.0, -0.0})).item<double>()));
  // relu(-0) is +0, as PyTorch's.
  EXPECT_TRUE(positive_zero(first(nn::relu(nz))));
}

// ---- 5. selection ops: forward and reverse mode pick the same element ---------------------

// J by forward mode and by reverse mode, bit for bit.
void expect_jacobians_agree(const std::function<Tensor(const Tensor&)>& f, const Tensor& x,
                            const std::string& what) {
  expect_same(jacfwd(f)(x), jacrev(f)(x), what);
}

TEST(NumericsSelection, MaxPoolJvpAtMinusInfinityNextToPaddingMatchesTheVjp) {
  // x = [[-inf, 1], [0, 2]], kernel 2, stride 2, padding 1: each window holds one input
  // element, which is its maximum; the corner's is -inf, like the padding around it.
  const Tensor x = f64({-kInf, 1, 0, 2}, {1, 1, 2, 2});
  const Pool2dOptions o{
      .kernel = {2, 2}, .stride = std::pair<int64_t, int64_t>{2, 2}, .padding = {1, 1}};
  auto pool = [&](const Tensor& a) { return max_pool2d(a, o); };
  auto [y, ty] = jvp(pool, std::tuple<Tensor>{x}, std::tuple<Tensor>{ones({1, 1, 2, 2}, float64)});
  expect_close(y, {-kInf, 1, 0, 2}, 0);
  expect_close(ty, {1, 1, 1, 1}, 0);
  expect_close(grad([&](const Tensor& a) { return sum(pool(a)); })(x), {1, 1, 1, 1}, 0);
  expect_jacobians_agree(pool, x, "max_pool2d at -inf");
}

// Random windows full of ties, -inf and NaN, over geometries with and without padding (and
// the 2x2 fast path): the Jacobian is 0/1 and the same in both modes, and a window's column
// of it has a single 1, at the element the gradient kernel picks.
TEST(NumericsSelection, MaxPoolJacobiansAgreeWithTiesInfinitiesAndNan) {
  struct Geometry {
    int64_t k, s, p;
  };
  const D pool_values{-kInf, -1, 0, 0, 1, 1, 2};
  for (const Geometry g : {Geometry{2, 2, 0}, Geometry{2, 2, 1}, Geometry{3, 2, 1},
                           Geometry{2, 1, 1}, Geometry{3, 3, 1}, Geometry{3, 1, 0}}) {
    for (uint32_t seed : {1u, 2u, 3u}) {
      SCOPED_TRACE("kernel " + std::to_string(g.k) + " stride " + std::to_string(g.s) +
                   " padding " + std::to_string(g.p) + " seed " + std::to_string(seed));
      D v = kiln::testing::random_values(2 * 4 * 5, seed, 0.0,
                                         static_cast<double>(pool_values.size()));
      for (double& e : v) e = pool_values[static_cast<std::size_t>(e)];
      if (seed == 3) v[6] = v[13] = kNan;  // two NaNs, sometimes in one window
      const Tensor x = f64(v, {1, 2, 4, 5});
      const Pool2dOptions o{.kernel = {g.k, g.k},
                            .stride = std::pair<int64_t, int64_t>{g.s, g.s},
                            .padding = {g.p, g.p}};
      auto pool = [&](const Tensor& a) { return max_pool2d(a, o); };
      expect_jacobians_agree(pool, x, "max_pool2d");
      // Second order through max_pool2d_grad, whose transpose is the same selection.
      const Tensor dy = random::normal(random::key(seed), max_pool2d(x, o).shape(), float64);
      auto pool_grad = [&](const Tensor& a) {
        return grad([&](const Tensor& b) { return sum(max_pool2d(b, o) * a); })(x);
      };
      expect_jacobians_agree(pool_grad, dy, "max_pool2d_grad");
      const D jac = jacrev(pool)(x).to_vector<double>();
      const int64_t outs = static_cast<int64_t>(jac.size()) / x.numel();
      for (int64_t r = 0; r < outs; ++r) {
        double row = 0;
        for (int64_t c = 0; c < x.numel(); ++c)
          row += jac[static_cast<std::size_t>(r * x.numel() + c)];
        EXPECT_EQ(row, 1.0) << "output " << r;
      }
    }
  }
}

// The other ops that choose among their inputs: at ties and at the clip bounds the two
// modes share one rule (ties split evenly, as in JAX).
TEST(NumericsSelection, ReductionsMaximumAndClipAgreeAtTies) {
  const Tensor ties = f64({1, 3, 3, -kInf, 2, 3}, {2, 3});
  expect_jacobians_agree([](const Tensor& x) { return max(x, {1}); }, ties, "max");
  expect_jacobians_agree([](const Tensor& x) { return min(x, {0}); }, ties, "min");
  expect_jacobians_agree([](const Tensor& x) { return max(x); }, ties, "max (all)");
  const Tensor other = f64({1, 0, 3, -kInf, 2, 2.5}, {2, 3});
  expect_jacobians_agree([&](const Tensor& x) { return maximum(x, other); }, ties, "maximum");
  expect_jacobians_agree([&](const Tensor& x) { return minimum(other, x); }, ties, "minimum");
  expect_jacobians_agree([](const Tensor& x) { return clip(x, 1.0, 3.0); }, ties, "clip");
  expect_jacobians_agree([](const Tensor& x) { return nn::relu(x); }, f64({0, -0.0, 1, -1}, {4}),
                         "relu");
  expect_jacobians_agree([](const Tensor& x) { return abs(x); }, f64({0, -0.0, 1, -1}, {4}), "abs");
}

// ---- 7. the losses' curvature at 0 and at kinks ------------------------------------------

long double sigmoid_ld(long double x) { return 1.0L / (1.0L + std::exp(-x)); }

// The Hessian of f at x forward-over-reverse and reverse-over-reverse, against `want`.
void expect_hessian(const std::function<Tensor(const Tensor&)>& f, const Tensor& x, const D& want,
                    double rtol, double atol, const std::string& what) {
  expect_close(hessian(f)(x), want, rtol, atol, what + " (forward over reverse)");
  expect_close(jacrev([&](const Tensor& a) { return grad(f)(a); })(x), want, rtol, atol,
               what + " (reverse over reverse)");
}

// Second differences in float64: H_ij = [f(+i+j) - f(+i-j) - f(-i+j) + f(-i-j)] / 4h^2.
D finite_difference_hessian(const std::function<Tensor(const Tensor&)>& f, const D& x, double h) {
  const std::size_t n = x.size();
  auto at = [&](std::size_t i, double di, std::size_t j, double dj) {
    D y = x;
    y[i] += di;
    y[j] += dj;
    return f(f64(y, {static_cast<int64_t>(n)})).item<double>();
  };
  D H(n * n);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < n; ++j)
      H[i * n + j] =
          (at(i, h, j, h) - at(i, h, j, -h) - at(i, -h, j, h) + at(i, -h, j, -h)) / (4 * h * h);
  return H;
}

TEST(NumericsLosses, BinaryCrossEntropyHasCurvatureAtZero) {
  // loss = mean(t softplus(-x) + (1 - t) softplus(x)): d2/dx_i^2 = sigmoid(x_i) sigmoid(-x_i) / n,
  // 1/4n at 0 whatever the target.
  const Tensor t = f64({0.0, 1.0, 0.3}, {3});
  auto bce = [&](const Tensor& x) { return nn::binary_cross_entropy_with_logits(x, t); };
  expect_hessian(bce, zeros({3}, float64), {0.25 / 3, 0, 0, 0, 0.25 / 3, 0, 0, 0, 0.25 / 3}, 1e-15,
                 0, "bce at 0");
  expect_hessian(bce, f64({-0.0, 0.0, -0.0}, {3}), {0.25 / 3, 0, 0, 0, 0.25 / 3, 0, 0, 0, 0.25 / 3},
                 1e-15, 0, "bce at -0");
  // Away from 0 and far out, against the formula in long double and finite differences.
  const D xs{-30.0, 2.5, 40.0};
  D want(9, 0.0);
  for (std::size_t i = 0; i < 3; ++i)
    want[i * 4] = static_cast<double>(sigmoid_ld(xs[i]) * sigmoid_ld(-xs[i]) / 3);
  expect_hessian(bce, f64(xs, {3}), want, 1e-12, 0, "bce away from 0");
  // A confident right answer keeps its small loss: numpy np.logaddexp(0, -40) (x = 40, t = 1).
  EXPECT_NEAR(nn::binary_cross_entropy_with_logits(f64({40}, {1}), f64({1}, {1})).item<double>(),
              4.248354255291589e-18, 1e-30);
  const D fd = finite_difference_hessian(bce, {0.0, 0.0, 0.0}, 1e-4);
  expect_close(hessian(bce)(zeros({3}, float64)), fd, 0, 5e-8, "bce vs finite differences");
}

// The symptom these curvatures prevent: Newton's method on a logistic regression from zero
// weights. With the right curvature it converges in a few steps (the loss falls every step, the
// gradient vanishes); with a zero Hessian at the start it diverged (0.69 -> 17).
TEST(NumericsLosses, NewtonsMethodOnALogisticRegressionConverges) {
  const D xv{1.0, 0.5, -1.0, 1.5, 2.0, -0.5, -0.7, -1.2, 0.3, 0.8, -1.5, 0.2};  // 6 x 2
  const Tensor X = f64(xv, {6, 2});
  const Tensor y = f64({1, 0, 1, 0, 0, 1}, {6});  // not separable: a finite optimum
  auto loss = [&](const Tensor& w) {
    return nn::binary_cross_entropy_with_logits(matmul(X, w), y);
  };
  // At w = 0 the Hessian is X^T X / (4 n), from a plain loop.
  D h0(4, 0.0);
  for (int r = 0; r < 6; ++r)
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 2; ++j)
        h0[static_cast<std::size_t>(i * 2 + j)] += xv[r * 2 + i] * xv[r * 2 + j] / 24;
  expect_close(hessian(loss)(zeros({2}, float64)), h0, 1e-14, 1e-16, "Hessian at w = 0");
  Tensor w = zeros({2}, float64);
  double previous = loss(w).item<double>();
  EXPECT_NEAR(previous, std::log(2.0), 1e-15);
  for (int step = 0; step < 8; ++step) {
    const D g = grad(loss)(w).to_vector<double>(), H = hessian(loss)(w).to_vector<double>();
    const double det = H[0] * H[3] - H[1] * H[2];
    ASSERT_GT(det, 0.0) << "step " << step;
    const D dw{(H[3] * g[0] - H[1] * g[1]) / det, (H[0] * g[1] - H[2] * g[0]) / det};
    w = w - f64(dw, {2});
    const double l = loss(w).item<double>();
    EXPECT_LE(l, previous + 1e-15) << "step " << step;
    previous = l;
  }
  const D g = grad(loss)(w).to_vector<double>();
  EXPECT_LT(std::hypot(g[0], g[1]), 1e-12);
  // numpy: the same Newton iteration with np.linalg.solve, loss np.mean(np.logaddexp(0, z) - y z)
  EXPECT_NEAR(previous, 0.6041751376895143, 1e-14);
  expect_close(w, {0.70816691, -0.24898188}, 0, 1e-8, "optimum");
}

TEST(NumericsLosses, SoftplusAndLogSigmoidAreExactAndSmooth) {
  // numpy: np.logaddexp(0, x) and -np.logaddexp(0, -x), float64
  const D xs{-800, -30, -1, 0, 1e-10, 1, 30, 800};
  expect_close(nn::softplus(f64(xs, {8})),
               {0.0, 9.357622968839737e-14, 0.31326168751822286, 0.6931471805599453,
                0.6931471806099453, 1.3132616875182228, 30.000000000000092, 800.0},
               1e-15);
  expect_close(nn::log_sigmoid(f64({-800, -30, -1, 0, 1, 30, 800}, {7})),
               {-800.0, -30.000000000000092, -1.3132616875182228, -0.6931471805599453,
                -0.31326168751822286, -9.357622968839737e-14, -0.0},
               1e-15);
  // numpy: np.logaddexp(np.float32(0), np.float32([-100, -20, 0, 20, 100]))
  expect_close(nn::softplus(f32({-100, -20, 0, 20, 100}, {5})),
               {3.783505853677006e-44, 2.06115369216775e-09, 0.6931471824645996, 20.0, 100.0},
               1e-6);
  // softplus' = sigmoid, softplus'' = sigmoid(x) sigmoid(-x), in long double; no NaN from the
  // branch that is not taken, even at +-800.
  for (double x : {-800.0, -30.0, -0.0, 0.0, 0.5, 30.0, 800.0}) {
    auto sp = [](const Tensor& a) { return sum(nn::softplus(a)); };
    const Tensor at = f64({x}, {1});
    expect_close(grad(sp)(at), {static_cast<double>(sigmoid_ld(x))}, 1e-15, 0, "softplus'");
    expect_hessian(sp, at, {static_cast<double>(sigmoid_ld(x) * sigmoid_ld(-x))}, 1e-14, 1e-300,
                   "softplus'' at " + std::to_string(x));
  }
}

TEST(NumericsLosses, CrossEntropyAndMseCurvatureAtZeroLogits) {
  // cross_entropy at zero logits (every class tied): H = (diag(p) - p p^T) / rows, p = 1/C.
  const Tensor labels = tensor(std::vector<int64_t>{2}, Shape{1});
  auto ce = [&](const Tensor& x) { return nn::cross_entropy(reshape(x, {1, 3}), labels); };
  const double a = (1.0 / 3) * (2.0 / 3), b = -1.0 / 9;
  expect_hessian(ce, zeros({3}, float64), {a, b, b, b, a, b, b, b, a}, 1e-15, 1e-17,
                 "cross_entropy at 0");
  const D fd = finite_difference_hessian(ce, {0.0, 0.0, 0.0}, 1e-4);
  expect_close(hessian(ce)(zeros({3}, float64)), fd, 0, 5e-8,
               "cross_entropy vs finite differences");
  // mse: 2 / n I, at 0 as anywhere.
  const Tensor target = zeros({2}, float64);
  auto mse = [&](const Tensor& x) { return nn::mse(x, target); };
  expect_hessian(mse, zeros({2}, float64), {1, 0, 0, 1}, 0, 0, "mse at 0");
}

// ---- 15. cross_entropy's labels outside [0, C) ---------------------------------------------

TEST(NumericsCrossEntropyLabels, OutOfRangeLabelsRaiseEagerlyAndWhenTraced) {
  const Tensor logits = f64({0.1, 0.2, 0.3, 0.4, 0.5, 0.6}, {2, 3});
  for (int64_t bad : {-1, -2, 3, 7}) {
    const Tensor labels = tensor(std::vector<int64_t>{0, bad}, Shape{2});
    const std::string got = "got " + std::to_string(bad);
    expect_error([&] { (void)nn::cross_entropy(logits, labels); }, "nn.cross_entropy",
                 {"label out of range", got, "i64[2]",
                  "expected labels in [0, 3) or the ignore_index -100"});
    // Traced labels: checked when the traced function runs, under jit, grad and vmap.
    auto ce = [](const Tensor& l, const Tensor& y) { return nn::cross_entropy(l, y); };
    expect_error([&] { (void)jit(ce)(logits, labels); }, "nn.cross_entropy",
                 {"label out of range", got});
    expect_error([&] { (void)grad(ce)(logits, labels); }, "nn.cross_entropy",
                 {"label out of range", got});
    expect_error(
        [&] { (void)jit([&](const Tensor& l) { return nn::cross_entropy(l, labels); })(logits); },
        "nn.cross_entropy", {"label out of range", got});
    expect_error(
        [&] {
          (void)vmap([&](const Tensor& l, const Tensor& y) {
            return nn::cross_entropy(expand_dims(l, 0), expand_dims(y, 0));
          })(logits, labels);
        },
        "nn.cross_entropy", {"label out of range", got});
  }
  // int32 and unsigned labels too; without an ignore_index, -100 is out of range as well.
  expect_error(
      [&] {
        (void)nn::cross_entropy(logits, tensor(std::vector<int32_t>{-1, 0}, Shape{2}));
      },
      "nn.cross_entropy", {"label out of range", "got -1"});
  expect_error(
      [&] {
        (void)nn::cross_entropy(logits,
                                astype(tensor(std::vector<int32_t>{3, 0}, Shape{2}), uint8));
      },
      "nn.cross_entropy", {"label out of range", "got 3", "u8[2]"});
  expect_error(
      [&] {
        (void)nn::cross_entropy(logits, tensor(std::vector<int64_t>{-100, 0}, Shape{2}), 0.0,
                                std::nullopt);
      },
      "nn.cross_entropy", {"label out of range", "got -100", "expected labels in [0, 3)"});
}

// PyTorch's ignore_index: ignored positions add nothing, to the loss or to the gradient, and
// the mean is over the others (NaN when every position is ignored, as in PyTorch).
TEST(NumericsCrossEntropyLabels, IgnoreIndexMasksPositionsOutOfTheMean) {
  const D lv{0.1, 1.2, -0.3, 2.0, 0.5, -kInf, 0.7, -1.0, 0.0};  // 3 x 3; row 1 has a -inf logit
  const std::vector<int64_t> lab{2, -100, 0};
  // The reference: -log softmax at the label, rows 0 and 2, in long double.
  auto nll = [&](int r, int c, double e) {
    long double z = 0;
    for (int k = 0; k < 3; ++k)
      z += std::exp(static_cast<long double>(lv[static_cast<std::size_t>(r * 3 + k)]));
    long double out = 0;
    for (int k = 0; k < 3; ++k) {
      const long double lp = lv[static_cast<std::size_t>(r * 3 + k)] - std::log(z);
      out -= lp * ((k == c ? 1 - e : 0.0) + e / 3);
    }
    return out;
  };
  const Tensor logits = f64(lv, {3, 3}), labels = tensor(lab, Shape{3});
  for (double e : {0.0, 0.2}) {
    const double want = static_cast<double>((nll(0, 2, e) + nll(2, 0, e)) / 2);
    EXPECT_NEAR(nn::cross_entropy(logits, labels, e).item<double>(), want, 1e-15) << e;
    EXPECT_NEAR(jit([&](const Tensor& l, const Tensor& y) { return nn::cross_entropy(l, y, e); })(
                    logits, labels)
                    .item<double>(),
                want, 1e-15)
        << e;
    // The ignored row gets a zero gradient (no NaN from its -inf logit).
    const D g = grad([&](const Tensor& l) { return nn::cross_entropy(l, labels, e); })(logits)
                    .to_vector<double>();
    for (int k = 3; k < 6; ++k) EXPECT_EQ(g[static_cast<std::size_t>(k)], 0.0) << k;
    for (int k : {0, 1, 2, 6, 7, 8})
      EXPECT_TRUE(std::isfinite(g[static_cast<std::size_t>(k)])) << k;
  }
  // A chosen ignore_index, also one inside [0, C).
  const Tensor with_seven = tensor(std::vector<int64_t>{2, 7, 0}, Shape{3});
  EXPECT_NEAR(nn::cross_entropy(logits, with_seven, 0.0, 7).item<double>(),
              static_cast<double>((nll(0, 2, 0) + nll(2, 0, 0)) / 2), 1e-15);
  EXPECT_NEAR(nn::cross_entropy(logits, tensor(std::vector<int64_t>{2, 1, 0}, Shape{3}), 0.0, 1)
                  .item<double>(),
              static_cast<double>((nll(0, 2, 0) + nll(2, 0, 0)) / 2), 1e-15);
  EXPECT_TRUE(
      std::isnan(nn::cross_entropy(logits, tensor(std::vector<int64_t>{-100, -100, -100}, Shape{3}))
                     .item<double>()));
}

}  // namespace
}  // namespace kiln
