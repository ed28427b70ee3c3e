// Per-primitive derivative checks (the AD walk over the shared sample table,
// tests/primitive_samples.h). For every sample of a differentiable primitive, with
// deterministic random inputs (float64 unless the sample is about another dtype):
//   a. its JVP against central finite differences of the sample's function evaluated eagerly;
//   b. its VJP against its JVP by the dot-product test <ct, J t> == <J^T ct, t>;
//   c. its second derivatives: the Hessian-vector product of g(x) = sum(w * f(x)), computed
//      forward-over-reverse (ad::jvp of the traced gradient) and reverse-over-reverse (ad::vjp
//      of <gradient, v>), against central finite differences of the gradient.
// Collectives (psum, pmax, all_gather, ppermute, ...) are checked per example inside a vmap
// with a named axis, the only place they are defined.
// `PrimitiveSamples.EveryPrimitiveHasTheSamplesItsWalksNeed` (below) is the table's one
// completeness check, for this walk and the others.
#include <gtest/gtest.h>
#include <kiln/kiln.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "primitive_samples.h"
#include "testing.h"

namespace kiln {
namespace {

using kiln::testing::expect_allclose;

using Ts = std::vector<Tensor>;
using Ints = std::vector<int64_t>;

using samples::Arg;
using samples::fixed;
using samples::Gen;
using samples::PrimitiveSample;
using samples::traced;
using samples::with_fn;

// ---- the checked function and numeric helpers -------------------------------------------

bool floating(const Tensor& t) { return is_floating(t.dtype()); }

std::vector<TensorType> types_of(const Ts& xs) {
  std::vector<TensorType> t;
  for (const Tensor& x : xs) t.push_back(x.type());
  return t;
}
Ts or_zeros(const std::vector<Tangent>& ts, const Ts& like) {
  Ts out;
  for (std::size_t i = 0; i < like.size(); ++i)
    out.push_back(ts[i] ? *ts[i] : zeros(like[i].shape(), like[i].dtype()));
  return out;
}
std::vector<Tangent> tangents(const Ts& ts) { return std::vector<Tangent>(ts.begin(), ts.end()); }
Ts cat(const Ts& a, const Ts& b) {
  Ts out = a;
  out.insert(out.end(), b.begin(), b.end());
  return out;
}
// Splits a flat argument list into groups of n.
std::vector<Ts> groups(const Ts& a, std::size_t n) {
  std::vector<Ts> out;
  for (std::size_t i = 0; i < a.size(); i += n)
    out.emplace_back(a.begin() + static_cast<std::ptrdiff_t>(i),
                     a.begin() + static_cast<std::ptrdiff_t>(i + n));
  return out;
}

// The sample's function (its primitive bound once, or its body) of its differentiated inputs
// (the parameters of `fn`), with the fixed ones as constants. Collectives apply per example
// inside a vmap with a named axis:
// `fn` then takes one example, and every derivative is taken per example and vmapped, so the
// collective's own JVP/VJP rules run (and are batched), while the finite-difference reference
// evaluates only the vmapped primitive.
struct Problem {
  PrimitiveSample c;
  Gen gen;
  samples::Sample sample;
  Ts x;  // the differentiated inputs (batched for collectives)
  std::shared_ptr<const ir::Function> fn;

  explicit Problem(PrimitiveSample c_)
      : c(std::move(c_)),
        gen(samples::seed_of(name_of(c)), samples::seed_of(name_of(c))),
        sample(c.make(gen)) {
    std::vector<TensorType> types;
    for (const Arg& a : sample.args)
      if (a.wrt) {
        x.push_back(a.value);
        TensorType t = a.value.type();
        if (!c.axis_name.empty())
          t.shape = Shape(std::vector<int64_t>(t.shape.begin() + 1, t.shape.end()));
        types.push_back(t);
      }
    ir::Traced t = ir::trace_function(c.prim, types, [&](const Ts& params) {
      Ts ins;
      std::size_t k = 0;
      for (const Arg& a : sample.args) ins.push_back(a.wrt ? params[k++] : a.value);
      return samples::apply(c, ins, sample.attrs);
    });
    EXPECT_TRUE(t.captures.empty());
    EXPECT_TRUE(samples::traces_primitive(*t.function, c))
        << "the sample's function does not contain '" << c.prim << "':\n"
        << ir::print(*t.function);
    fn = t.function;
  }

  // body(args) directly, or vmapped over axis 0 of every argument with the sample's axis name.
  Ts run(const std::function<Ts(const Ts&)>& body, const Ts& args) const {
    if (c.axis_name.empty()) return body(args);
    return vmap([&](const Ts& a) { return body(a); }, axis_name(c.axis_name))(args);
  }

  Ts eval(const Ts& xs) const {
    return run([&](const Ts& a) { return ir::evaluate(*fn, a); }, xs);
  }
  // (outputs, output tangents) of the JVP at xs along ts.
  std::pair<Ts, Ts> jvp(const Ts& xs, const Ts& ts) const {
    const std::size_t n = fn->results.size();
    const Ts both = run(
        [&](const Ts& a) {
          const auto g = groups(a, xs.size());
          const ad::JvpResult r = ad::jvp(*fn, g[0], tangents(g[1]));
          return cat(r.outputs, or_zeros(r.tangents, r.outputs));
        },
        cat(xs, ts));
    const auto g = groups(both, n);
    return {g[0], g[1]};
  }
  // J^T ct at xs.
  Ts pullback(const Ts& xs, const Ts& cts) const {
    return run(
        [&](const Ts& a) {
          const Ts ex(a.begin(), a.begin() + static_cast<std::ptrdiff_t>(xs.size()));
          const Ts ct(a.begin() + static_cast<std::ptrdiff_t>(xs.size()), a.end());
          return or_zeros(ad::vjp(fn, ex).pullback(tangents(ct)), ex);
        },
        cat(xs, cts));
  }

  // Random values shaped like `like` (tangents, cotangents, weights), in its dtype.
  Ts random_like(const Ts& like) {
    Ts out;
    for (const Tensor& t : like) out.push_back(astype(gen.normal(t.shape()), t.dtype()));
    return out;
  }
};

// The gradient of g(x) = sum_i sum(w_i * f_i(x)) for one example (concrete or traced).
Ts example_gradient(const Problem& p, const Ts& w, const Ts& x) {
  ad::VjpResult r = ad::vjp(p.fn, x);
  std::vector<Tangent> seed;
  for (std::size_t i = 0; i < r.outputs.size(); ++i)
    seed.push_back(floating(r.outputs[i]) ? Tangent(w[i]) : std::nullopt);
  return or_zeros(r.pullback(seed), x);
}

Ts step(const Ts& x, double h, const Ts& t) {
  Ts out;
  for (std::size_t i = 0; i < x.size(); ++i) out.push_back(x[i] + t[i] * h);
  return out;
}
Ts central_difference(const std::function<Ts(const Ts&)>& f, const Ts& x, const Ts& t, double h) {
  const Ts plus = f(step(x, h, t)), minus = f(step(x, -h, t));
  Ts out;
  for (std::size_t i = 0; i < plus.size(); ++i)
    out.push_back(floating(plus[i])
                      ? (astype(plus[i], float64) - astype(minus[i], float64)) / (2 * h)
                      : Tensor());
  return out;
}
std::vector<double> values(const Tensor& t) { return t.to_vector<double>(); }

// Each result whose `want` is defined (a sample's non-differentiable results have none).
void expect_each_allclose(const Ts& got, const Ts& want, Closeness tol, const std::string& what,
                          std::source_location at = std::source_location::current()) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (want[i].defined())
      expect_allclose(got[i], want[i], tol, what + " [" + std::to_string(i) + "]", at);
}

// sum_i <a_i, b_i> over the floating pairs, and the sum of |a_i b_i| as its scale.
std::pair<double, double> inner(const Ts& a, const Ts& b) {
  double s = 0.0, scale = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!a[i].defined() || !b[i].defined() || !floating(a[i])) continue;
    const std::vector<double> u = values(a[i]), v = values(b[i]);
    for (std::size_t k = 0; k < u.size(); ++k) {
      s += u[k] * v[k];
      scale += std::abs(u[k] * v[k]);
    }
  }
  return {s, scale};
}

// ---- the checks ------------------------------------------------------------------------

class PrimitiveRules : public ::testing::TestWithParam<PrimitiveSample> {};

// a. JVP vs central finite differences of the primitive, evaluated eagerly.
TEST_P(PrimitiveRules, JvpMatchesFiniteDifferences) {
  Problem p(GetParam());
  if (!p.c.ad.forward_mode) GTEST_SKIP() << p.c.prim << " has no forward mode by design";
  const Ts t = p.random_like(p.x);
  const auto [y, jt] = p.jvp(p.x, t);
  const Ts fd = central_difference([&](const Ts& a) { return p.eval(a); }, p.x, t, p.c.ad.fd_h);
  expect_each_allclose(jt, fd, {.rtol = p.c.ad.fd_rtol / 2, .atol = p.c.ad.fd_rtol / 2},
                       "JVP vs finite differences");
  expect_each_allclose(y, p.eval(p.x), {.rtol = 0, .atol = 0}, "jvp outputs vs evaluation");
}

// b. <ct, J t> == <J^T ct, t>; without forward mode, J t comes from finite differences.
TEST_P(PrimitiveRules, VjpIsTheTransposeOfTheJvp) {
  Problem p(GetParam());
  const Ts t = p.random_like(p.x);
  const Ts ct = p.random_like(p.eval(p.x));
  Ts jt;
  double rtol = p.c.ad.dot_rtol;
  if (p.c.ad.forward_mode) {
    jt = p.jvp(p.x, t).second;
  } else {
    jt = central_difference([&](const Ts& a) { return p.eval(a); }, p.x, t, p.c.ad.fd_h);
    rtol = p.c.ad.fd_rtol;
  }
  const Ts jtct = p.pullback(p.x, ct);
  for (std::size_t i = 0; i < jtct.size(); ++i)
    EXPECT_EQ(jtct[i].type(), p.x[i].type()) << "cotangent " << i << " of " << p.c.prim;
  const auto [lhs, s1] = inner(ct, jt);
  const auto [rhs, s2] = inner(jtct, t);
  EXPECT_NEAR(lhs, rhs, rtol * std::max({s1, s2, 1e-300}))
      << "<ct, J t> vs <J^T ct, t> for " << p.c.prim;
}

// c. Hessian-vector products of g(x) = sum(w * f(x)) vs finite differences of the gradient.
// No primitive is skipped: for linear ones (shapes, gather/scatter, convert, add, psum, ...)
// and piecewise-linear ones at a smooth sample (abs, max, reduce_max, max_pool2d, pmax) the
// product is zero, which still checks that their VJP rules trace and differentiate again.
TEST_P(PrimitiveRules, SecondDerivativesMatchFiniteDifferences) {
  Problem p(GetParam());
  const Ts w = p.random_like(p.eval(p.x));
  const Ts v = p.random_like(p.x);
  const std::size_t n = p.x.size(), m = w.size();
  const double h = 1e-5;
  // Splits (x, w, v) of one example.
  auto parts = [n, m](const Ts& a) {
    auto at = [&](std::size_t b, std::size_t e) {
      return Ts(a.begin() + static_cast<std::ptrdiff_t>(b),
                a.begin() + static_cast<std::ptrdiff_t>(e));
    };
    return std::tuple<Ts, Ts, Ts>{at(0, n), at(n, n + m), at(n + m, a.size())};
  };
  // The reference: finite differences of the (first-order, already checked) gradient.
  auto gradient_at = [&](const Ts& xs) {
    return p.run(
        [&](const Ts& a) {  // a = (x, w) of one example
          const auto mid = a.begin() + static_cast<std::ptrdiff_t>(n);
          return example_gradient(p, Ts(mid, a.end()), Ts(a.begin(), mid));
        },
        cat(xs, w));
  };
  const Ts fd = central_difference(gradient_at, p.x, v, h);

  // Forward over reverse: ad::jvp of the traced gradient (custom_vjp: none, by design).
  if (p.c.ad.forward_mode) {
    const Ts hv = p.run(
        [&](const Ts& a) {
          const auto [x, wx, vx] = parts(a);
          const ir::Traced g =
              ir::trace_function("grad_" + p.c.prim, types_of(x),
                                 [&](const Ts& b) { return example_gradient(p, wx, b); });
          ir::verify(*g.function);
          // Captured tracers (w, inside vmap) are extra parameters with no tangent.
          std::vector<Tangent> tv = tangents(vx);
          tv.resize(x.size() + g.captures.size());
          const ad::JvpResult r = ad::jvp(*g.function, cat(x, g.captures), tv);
          return or_zeros(r.tangents, r.outputs);
        },
        cat(cat(p.x, w), v));
    expect_each_allclose(hv, fd, {.rtol = p.c.ad.hvp_rtol / 2, .atol = p.c.ad.hvp_rtol / 2},
                         "forward-over-reverse HVP");
  }
  // Reverse over reverse: the gradient of <gradient(x), v>.
  const Ts hv = p.run(
      [&](const Ts& a) {
        const auto [x, wx, vx] = parts(a);
        const ir::Traced g = ir::trace_function("hv_" + p.c.prim, types_of(x), [&](const Ts& b) {
          const Ts gr = example_gradient(p, wx, b);
          Tensor s = full(Shape{}, 0.0, float64);
          for (std::size_t i = 0; i < gr.size(); ++i) s = s + sum(astype(gr[i] * vx[i], float64));
          return Ts{s};
        });
        ir::verify(*g.function);
        ad::VjpResult r = ad::vjp(g.function, cat(x, g.captures));
        const Ts all =
            or_zeros(r.pullback(std::vector<Tangent>{ones(Shape{}, float64)}), cat(x, g.captures));
        return Ts(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(x.size()));
      },
      cat(cat(p.x, w), v));
  expect_each_allclose(hv, fd, {.rtol = p.c.ad.hvp_rtol / 2, .atol = p.c.ad.hvp_rtol / 2},
                       "reverse-over-reverse HVP");
}

INSTANTIATE_TEST_SUITE_P(AdRules, PrimitiveRules, ::testing::ValuesIn(samples::ad_samples()),
                         [](const ::testing::TestParamInfo<PrimitiveSample>& info) {
                           return name_of(info.param);
                         });

// ---- the registry ----------------------------------------------------------------------

// 1. A differentiable primitive has both rules.
TEST(AdRegistry, EveryDifferentiablePrimitiveHasJvpAndVjp) {
  for (const Primitive* p : all_primitives()) {
    if (!p->differentiable) continue;
    if (!p->jvp)
      ADD_FAILURE() << "primitive '" << p->name << "' is differentiable but has no JVP rule";
    if (!p->vjp)
      ADD_FAILURE() << "primitive '" << p->name << "' is differentiable but has no VJP rule";
  }
}

// 2. The one completeness check of the shared sample table (tests/primitive_samples.h), for
// this walk, the vmap walk and every other: every registered primitive has a sample, every
// differentiable one a sample this walk checks, every one with a batching rule a sample the
// vmap walk checks — so a new primitive cannot slip through untested.
TEST(PrimitiveSamples, EveryPrimitiveHasTheSamplesItsWalksNeed) {
  for (const std::string& gap : samples::coverage_gaps()) ADD_FAILURE() << gap;
}

TEST(AdRegistry, SecondOrderThroughADataDependentWhileLoop) {
  // x <- x * a while x < 10, from x = a: near a = 1.5 that is five steps, f(a) = a^6.
  auto f = [](const Tensor& a) {
    return while_loop([](const Tensor& x) { return x < 10.0; },
                      [&](const Tensor& x) { return x * a; }, a);
  };
  const Tensor a = tensor(1.5);
  EXPECT_NEAR(grad(f)(a).item<double>(), 6 * std::pow(1.5, 5), 1e-10);
  auto df = [&](const Tensor& x) { return grad(f)(x); };
  EXPECT_NEAR(grad(df)(a).item<double>(), 30 * std::pow(1.5, 4), 1e-9);  // reverse over reverse
  EXPECT_NEAR(jit(grad(df))(a).item<double>(), 30 * std::pow(1.5, 4), 1e-9);
  EXPECT_NEAR(hessian(f)(a).item<double>(), 30 * std::pow(1.5, 4), 1e-9);  // forward over reverse
  auto d2f = [&](const Tensor& x) { return grad(df)(x); };
  EXPECT_NEAR(grad(d2f)(a).item<double>(), 120 * std::pow(1.5, 3), 1e-8);  // third order
}

TEST(AdRegistry, CustomVjpRefusesForwardMode) {
  const TensorType m{float64, Shape{3}};
  FunctionRef fn = traced("f", {m}, [](const Ts& a) { return Ts{sin(a[0])}; });
  FunctionRef bwd = traced("f_bwd", {m, m, m}, [](const Ts& a) { return Ts{a[2] * cos(a[0])}; });
  const Attrs attrs = with_fn("fn", fn, with_fn("bwd", bwd));
  const auto f = ir::trace_function("g", {m}, [&](const Ts& a) {
                   return kiln::bind(primitive("custom_vjp"), {a[0]}, attrs);
                 }).function;
  const Ts x{tensor({0.1, 0.2, 0.3})};
  EXPECT_THROW(ad::jvp(*f, x, std::vector<Tangent>{tensor({1.0, 1.0, 1.0})}), Error);
}

// reduce_prod's rule scans the reduced elements; an empty reduction has no partials.
TEST(AdEdgeCases, ProductOverAnEmptyAxis) {
  auto f = [](const Tensor& a) { return sum(prod(a, {1})); };
  const Tensor g = grad(f)(zeros(Shape{3, 0}, float64));
  EXPECT_EQ(g.type(), (TensorType{float64, Shape{3, 0}}));
}

// ---- 3. non-differentiable primitives contribute zero ----------------------------------

Tensor sample_x() { return random::normal(random::key(7), Shape{3, 4}, float64); }

void expect_equal(const Tensor& got, const Tensor& want) {
  ASSERT_EQ(got.type(), want.type());
  EXPECT_EQ(values(got), values(want));
}

TEST(NonDifferentiable, ComparisonContributesNothing) {
  const Tensor x = sample_x();
  auto f = [](const Tensor& a) { return sum(astype(a > 0.0, float64) * a); };
  expect_equal(grad(f)(x), astype(x > 0.0, float64));
  const Tensor t = random::normal(random::key(8), Shape{3, 4}, float64);
  auto [y, ty] = jvp(f, std::tuple<Tensor>{x}, std::tuple<Tensor>{t});
  EXPECT_NEAR(ty.item<double>(), sum(astype(x > 0.0, float64) * t).item<double>(), 1e-12);
}

TEST(NonDifferentiable, ArgmaxIndexPathHasZeroGradient) {
  const Tensor x = random::normal(random::key(9), Shape{6}, float64);
  const int64_t i = argmax(x).item<int64_t>();
  // The value path: a one-hot gradient at the maximum.
  auto pick = [](const Tensor& a) { return take(a, argmax(a)); };
  expect_equal(grad(pick)(x), one_hot(tensor(std::vector<int64_t>{i}, Shape{}), 6, float64));
  // The index path alone: zero.
  auto index_only = [](const Tensor& a) {
    return astype(argmax(a), float64) + astype(argmin(a), float64);
  };
  expect_equal(grad(index_only)(x), zeros(Shape{6}, float64));
  auto [y, ty] =
      jvp(index_only, std::tuple<Tensor>{x}, std::tuple<Tensor>{ones(Shape{6}, float64)});
  EXPECT_EQ(ty.item<double>(), 0.0);
}

TEST(NonDifferentiable, RoundingSignAndIntegerConversionHaveZeroGradient) {
  const Tensor x = sample_x() * 3.0;
  auto f = [](const Tensor& a) {
    return sum(floor(a) + ceil(a) + round(a) + sign(a) + astype(astype(a, int32), float64));
  };
  expect_equal(grad(f)(x), zeros(Shape{3, 4}, float64));
}

TEST(NonDifferentiable, StopGradientBlocksOnlyItsPath) {
  const Tensor x = sample_x();
  auto f = [](const Tensor& a) { return sum(stop_gradient(a) * a); };
  expect_equal(grad(f)(x), x);
  auto only = [](const Tensor& a) { return sum(stop_gradient(a * a)); };
  expect_equal(grad(only)(x), zeros(Shape{3, 4}, float64));
}

TEST(NonDifferentiable, SelectPredicateGetsNoCotangent) {
  const Tensor x = sample_x();
  auto f = [](const Tensor& a) { return sum(where(a > 0.0, a * a, -a)); };
  expect_equal(grad(f)(x), where(x > 0.0, x * 2.0, full(Shape{}, -1.0, float64)));
}

// ---- 4. second derivatives at the edges of each domain ------------------------------------
// The random samples above stay away from zeros, ties, poles and huge magnitudes; rules built
// from where/select can hide a 0 * inf there that only a second derivative exposes (reverse
// over reverse of pow(a, 0) at a = 0 was NaN). At each edge point the Hessian of
// sum(prim(inputs)) with respect to the differentiated inputs is computed four ways (forward
// or reverse over forward or reverse); they must agree, hold no NaN, and where the primitive
// is smooth around the point, match second differences in float64.

struct EdgePoint {
  std::string prim;
  std::vector<Arg> args;  // scalars or small vectors; `wrt` ones are differentiated
  bool smooth = true;     // twice differentiable around the point: compare with differences
  Attrs attrs = {};
  double fd_step = 1e-4;  // smaller near poles, larger at large magnitudes (power laws)
};

void PrintTo(const EdgePoint& e, std::ostream* os) {
  *os << e.prim << "(";
  for (std::size_t i = 0; i < e.args.size(); ++i)
    *os << (i ? ", " : "") << (e.args[i].wrt ? "" : "fixed ") << e.args[i].value;
  *os << ")";
}

std::vector<EdgePoint> edge_points() {
  std::vector<EdgePoint> e;
  const double inf = INFINITY;
  auto s = [](double v) { return Arg{tensor(v), true}; };
  auto k = [](double v) { return fixed(tensor(v)); };
  auto v = [](std::vector<double> x) { return Arg{tensor(x), true}; };
  auto unary = [&](const char* p, std::vector<double> xs, bool smooth = true,
                   double fd_step = 1e-4) {
    for (double x : xs) e.push_back({p, {s(x)}, smooth, {}, fd_step});
  };
  unary("neg", {0.0, -0.0});
  unary("abs", {1.0, -1.0});
  unary("abs", {0.0, -0.0}, false);  // the kink
  unary("exp", {0.0, -0.0, 30.0, -30.0, 300.0, -745.0});
  unary("log", {1.0});
  unary("log", {1e-3}, true, 1e-7);
  unary("log", {1e10}, true, 1e5);
  unary("log", {0.0, 1e-300}, false);  // the pole: -inf
  unary("log1p", {0.0, -0.0, -0.5});
  unary("log1p", {1e10}, true, 1e5);
  unary("log1p", {-1.0}, false);
  unary("expm1", {0.0, -0.0, 50.0, -50.0});
  unary("sqrt", {1.0});
  unary("sqrt", {1e-2}, true, 1e-6);
  unary("sqrt", {1e10}, true, 1e5);
  unary("sqrt", {0.0}, false);
  unary("rsqrt", {1.0});
  unary("rsqrt", {1e-2}, true, 1e-6);
  unary("rsqrt", {0.0}, false);
  unary("sin", {0.0, -0.0, 1e3});
  unary("cos", {0.0, -0.0, 1e3});
  unary("tan", {0.0, -0.0, 1.0});
  unary("tanh", {0.0, -0.0, 30.0, -30.0, 400.0});
  unary("sigmoid", {0.0, -0.0, 40.0, -40.0, 800.0, -800.0});
  unary("erf", {0.0, -0.0, 6.0, -6.0, 30.0});
  // pow at zero bases and zero exponents: with respect to the base, the exponent, and both.
  for (double b : {0.0, 1.0, 2.0, 3.0, -1.0, 0.5})
    for (double a : {0.0, -0.0, 1.0, 2.0, -2.0}) {
      if (b == -1.0 && a == 0.0) continue;  // 1/a at a pole
      const bool fractional = b != std::floor(b);
      if (fractional && a <= 0.0) continue;  // no real a^b around negative bases
      // a^b is a polynomial in a for b in {0, 1, 2, 3}: smooth in a even at 0.
      e.push_back({"pow", {s(a), k(b)}, !(b == 0.5 && a == 0.0)});
    }
  e.push_back({"pow", {k(0.0), s(0.0)}, false});  // 0^b jumps from 1 to 0 at b = 0
  e.push_back({"pow", {k(0.0), s(2.0)}});         // 0^b = 0 all around b = 2
  e.push_back({"pow", {k(2.0), s(0.0)}});
  e.push_back({"pow", {s(0.0), s(0.0)}, false});
  e.push_back({"pow", {s(0.0), s(2.0)}, false});
  e.push_back({"pow", {s(1.0), s(0.0)}});  // d2/da db = a^(b-1) (1 + b log a) = 1: not 0
  e.push_back({"pow", {s(2.0), s(0.0)}});
  e.push_back({"pow", {s(2.0), s(-1.0)}});
  for (const char* p : {"add", "sub", "mul"}) e.push_back({p, {s(0.0), s(-0.0)}});
  e.push_back({"div", {s(0.0), s(1.0)}});
  e.push_back({"div", {s(-0.0), s(-1.0)}});
  e.push_back({"div", {s(1e-300), s(1e10)}});
  for (const char* p : {"max", "min"}) {  // ties, signed-zero ties, infinite ties: kinks
    for (auto [a, b] : {std::pair{0.0, 0.0}, {-0.0, 0.0}, {1.0, 1.0}, {-inf, -inf}})
      e.push_back({p, {s(a), s(b)}, false});
    e.push_back({p, {s(1.0), s(2.0)}});
  }
  e.push_back({"select", {fixed(tensor({1.0, 0.0}) > 0.5), v({0.0, -0.0}), v({1.0, 0.0})}});
  // Reductions at zeros (reduce_prod: smooth, a polynomial) and ties (max, min: kinks).
  const Attrs all{{"axes", Ints{0}}};
  e.push_back({"reduce_sum", {v({0.0, -0.0, 1.0})}, true, all});
  e.push_back({"reduce_prod", {v({0.0, 0.0, 2.0})}, true, all});
  e.push_back({"reduce_prod", {v({0.0, -0.0, 0.0})}, true, all});
  e.push_back({"reduce_prod", {v({0.0, 3.0, -1.0})}, true, all});
  e.push_back({"reduce_max", {v({1.0, 1.0, 0.0})}, false, all});
  e.push_back({"reduce_max", {v({-inf, -inf})}, false, all});
  e.push_back({"reduce_min", {v({-0.0, 0.0, 2.0})}, false, all});
  return e;
}

class EdgeSecondDerivatives : public ::testing::TestWithParam<EdgePoint> {};

TEST_P(EdgeSecondDerivatives, FourModesAgreeAndMatchFiniteDifferences) {
  const EdgePoint& ep = GetParam();
  const Primitive& p = primitive(ep.prim);
  // f(u): the differentiated inputs are the consecutive elements of u.
  std::vector<double> u0;
  for (const Arg& a : ep.args)
    if (a.wrt)
      for (double x : values(a.value)) u0.push_back(x);
  const auto n = static_cast<int64_t>(u0.size());
  auto f = [&](const Tensor& u) {
    Ts ins;
    int64_t at = 0;
    for (const Arg& a : ep.args) {
      if (!a.wrt) {
        ins.push_back(a.value);
        continue;
      }
      const int64_t m = a.value.numel();
      ins.push_back(reshape(slice(u, {Slice{at, at + m, 1}}), a.value.shape()));
      at += m;
    }
    return sum(bind1(p, ins, ep.attrs));
  };
  auto gf = [&](const Tensor& u) { return grad(f)(u); };
  auto jf = [&](const Tensor& u) { return jacfwd(f)(u); };
  const Tensor u = tensor(u0, Shape{n});
  const std::vector<std::pair<std::string, Tensor>> modes{{"forward over reverse", jacfwd(gf)(u)},
                                                          {"reverse over reverse", jacrev(gf)(u)},
                                                          {"forward over forward", jacfwd(jf)(u)},
                                                          {"reverse over forward", jacrev(jf)(u)}};
  const std::vector<double> ref = values(modes[0].second);
  for (const auto& [name, h] : modes) {
    const std::vector<double> got = values(h);
    ASSERT_EQ(got.size(), static_cast<std::size_t>(n * n)) << name;
    for (std::size_t i = 0; i < got.size(); ++i) {
      EXPECT_FALSE(std::isnan(got[i])) << name << " [" << i << "]";
      if (std::isinf(ref[i]))
        EXPECT_EQ(got[i], ref[i]) << name << " [" << i << "]";
      else
        EXPECT_NEAR(got[i], ref[i], 1e-12 * std::max(1.0, std::abs(ref[i])))
            << name << " [" << i << "]";
    }
  }
  if (!ep.smooth) return;
  // Second differences: [f(+i+j) - f(+i-j) - f(-i+j) + f(-i-j)] / 4h^2.
  auto fv = [&](std::vector<double> w) { return f(tensor(w, Shape{n})).item<double>(); };
  const double h = ep.fd_step;
  double scale = 1.0;
  for (double r : ref) scale = std::max(scale, std::abs(r));
  for (std::size_t i = 0; i < u0.size(); ++i)
    for (std::size_t j = 0; j < u0.size(); ++j) {
      auto at = [&](double si, double sj) {
        std::vector<double> w = u0;
        w[i] += si * h;
        w[j] += sj * h;
        return fv(w);
      };
      const double fd = (at(1, 1) - at(1, -1) - at(-1, 1) + at(-1, -1)) / (4 * h * h);
      EXPECT_NEAR(ref[i * u0.size() + j], fd, 1e-5 * scale) << "H[" << i << "][" << j << "]";
    }
}

INSTANTIATE_TEST_SUITE_P(AdRules, EdgeSecondDerivatives, ::testing::ValuesIn(edge_points()));

}  // namespace
}  // namespace kiln
