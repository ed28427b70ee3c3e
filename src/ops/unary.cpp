// Unary elementwise primitives: each entry of the table below is one primitive, with its
// domain, type rule and kernel.
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "detail/elementwise.h"
#include "kiln/ops.h"
#include "math/vector_math.h"
#include "ops/elementwise_rules.h"
#include "ops/primitives.h"
#include "ops/rules.h"

namespace kiln {
namespace {

using ops::define_unary;
using ops::Domain;
using ops::float_op;
using ops::kChunk;
using ops::Operands;
using ops::rounding_op;
using ops::signed_integer;
namespace lw = lowering;

// Each functor: `domain`, whether the result is bool, and the scalar function on compute_t.
// `scale(x, y, t)` applies dy/dx (diagonal, so the same for tangents and cotangents);
// functors without it are not differentiable (their derivative is zero almost everywhere).
// A `linear` one's JVP is the primitive itself on the tangent (ops::linear_jvp). `lower` is
// the compiled form (kiln/lowering.h): the same formula, operation by operation.
struct Neg {
  static constexpr Domain domain = Domain::numeric;
  static constexpr bool complex = true;
  static constexpr Algebra algebra{.involution = true, .cheap_arithmetic = true};
  static constexpr bool linear = true;
  static Tensor scale(const Tensor&, const Tensor&, const Tensor& t) { return -t; }
  static lw::Value lower(lw::Builder& b, Operands x, const lw::Site& s) {
    return b.neg(s.in, x[0]);
  }
  template <typename T>
  T operator()(T x) const {
    if constexpr (std::is_integral_v<T>)  // wraps (also for the most negative value)
      return static_cast<T>(std::make_unsigned_t<T>{0} - static_cast<std::make_unsigned_t<T>>(x));
    else
      return -x;
  }
};
struct Abs {
  static constexpr Domain domain = Domain::numeric;
  static constexpr Algebra algebra{.cheap_arithmetic = true};
  static Tensor scale(const Tensor& x, const Tensor&, const Tensor& t) { return t * sign(x); }
  static lw::Value lower(lw::Builder& b, Operands x, const lw::Site& s) {
    if (is_floating(s.in)) return b.abs(x[0]);
    if (!signed_integer(s.in)) return x[0];
    return b.select(b.compare(lw::Comparison::lt, s.in, x[0], b.constant(s.in, 0)),
                    b.neg(s.in, x[0]), x[0]);
  }
  template <typename T>
  T operator()(T x) const {
    // fabs clears the sign bit: |-0| = +0, as numpy.
    if constexpr (std::is_unsigned_v<T>)
      return x;
    else if constexpr (std::is_floating_point_v<T>)
      return std::fabs(x);
    else
      return x < T{0} ? Neg{}(x) : x;
  }
};
struct Sign {
  static constexpr Domain domain = Domain::numeric;
  static constexpr Algebra algebra{.cheap_arithmetic = true};
  static lw::Value lower(lw::Builder& b, Operands x, const lw::Site& s) {
    using lw::Comparison;
    const DType d = s.in;
    const lw::Value zero = b.constant(d, 0), one = b.constant(d, 1), minus = b.constant(d, -1);
    if (is_floating(d)) {  // NaN stays NaN
      const lw::Value below = b.select(b.compare(Comparison::lt, d, x[0], zero), minus, zero);
      const lw::Value r = b.select(b.compare(Comparison::gt, d, x[0], zero), one, below);
      return b.select(b.is_nan(x[0]), x[0], r);
    }
    const lw::Value pos = b.compare(Comparison::gt, d, x[0], zero);
    const lw::Value neg =
        signed_integer(d) ? b.compare(Comparison::lt, d, x[0], zero) : b.constant(bool_, 0);
    return b.select(pos, one, b.select(neg, minus, zero));
  }
  template <typename T>
  T operator()(T x) const {
    if constexpr (std::is_floating_point_v<T>)
      if (x != x) return x;
    return static_cast<T>((T{0} < x) - (x < T{0}));
  }
};
// dy/dx applied to a tangent t, from x and y = f(x) (functors use what they need).
#define KILN_UNARY_SCALE(derivative)                                       \
  static Tensor scale(const Tensor& x, const Tensor& y, const Tensor& t) { \
    (void)x;                                                               \
    (void)y;                                                               \
    return derivative;                                                     \
  }
// A float function without a derivative (a step function) and its lowering; with one, the
// same and `scale`.
#define KILN_PLAIN_UNARY(Name, expr, lowered)                                                \
  struct Name {                                                                              \
    static constexpr Domain domain = Domain::floating;                                       \
    template <typename T>                                                                    \
    T operator()(T x) const {                                                                \
      return expr;                                                                           \
    }                                                                                        \
    static lw::Value lower(lw::Builder& b, Operands x, [[maybe_unused]] const lw::Site& s) { \
      return lowered;                                                                        \
    }                                                                                        \
  };
#define KILN_FLOAT_UNARY(Name, expr, lowered, derivative) \
  KILN_PLAIN_UNARY(Name##Value, expr, lowered)            \
  struct Name : Name##Value {                             \
    KILN_UNARY_SCALE(derivative)                          \
  };
KILN_FLOAT_UNARY(Sqrt, std::sqrt(x), b.sqrt(x[0]), t / (y * 2.0))
KILN_FLOAT_UNARY(Rsqrt, T{1} / std::sqrt(x), b.div(b.constant(s.in, 1), b.sqrt(x[0])),
                 t* y / x * -0.5)
// Transcendental functions run SLEEF's vector functions (src/math/vector_math.h) over
// contiguous chunks: `chunk(x, y, n)` computes y[i] = f(x[i]) in float or double.
#define KILN_VECTOR_UNARY(Name, fn, derivative)                             \
  struct Name {                                                             \
    static constexpr Domain domain = Domain::floating;                      \
    template <typename C>                                                   \
    static void chunk(const C* x, C* y, int64_t n) {                        \
      math::apply(math::MathFn::fn, x, y, n);                               \
    }                                                                       \
    static constexpr bool transcendental = true;                            \
    static lw::Value lower(lw::Builder& b, Operands x, const lw::Site& s) { \
      return b.call(lw::MathFunction::fn, s.in, x);                         \
    }                                                                       \
    KILN_UNARY_SCALE(derivative)                                            \
  };
KILN_VECTOR_UNARY(Exp, exp, t* y)
KILN_VECTOR_UNARY(Log, log, t / x)
KILN_VECTOR_UNARY(Log1p, log1p, t / (x + 1.0))
KILN_VECTOR_UNARY(Expm1, expm1, t*(y + 1.0))
KILN_VECTOR_UNARY(Sin, sin, t* cos(x))
KILN_VECTOR_UNARY(Cos, cos, -(t* sin(x)))
KILN_VECTOR_UNARY(Tan, tan, t*(y* y + 1.0))
KILN_VECTOR_UNARY(Tanh, tanh, t*(1.0 - y * y))
KILN_VECTOR_UNARY(Erf, erf, t* exp(-(x* x)) * 1.1283791670955126)  // 2/sqrt(pi)
#undef KILN_VECTOR_UNARY
// Stable for large |x|: only e = exp(-|x|) <= 1 is computed (vectorised), then 1/(1+e) for
// x >= 0 and e/(1+e) below. The rounding error of 1 + e is exact in Fast2Sum form (1 >= e)
// and corrects the quotient: without it float32 reached 2.25 ulp, with it the error is e's
// own plus one rounding (docs/DESIGN.md, "Kernels").
struct Sigmoid {
  static constexpr Domain domain = Domain::floating;
  template <typename C>
  static void chunk(const C* x, C* y, int64_t n) {
    for (int64_t b = 0; b < n; b += kChunk) {
      const int64_t m = std::min(kChunk, n - b);
      C e[kChunk];
      for (int64_t k = 0; k < m; ++k) e[k] = -std::fabs(x[b + k]);
      math::apply(math::MathFn::exp, e, e, m);
      for (int64_t k = 0; k < m; ++k) {
        const C d = C{1} + e[k];
        const C lo = (C{1} - d) + e[k];  // 1 + e == d + lo exactly
        const C q = (x[b + k] >= C{0} ? C{1} : e[k]) / d;
        // 1/d for the small correction: q = 1/d >= 1/2, or 1 - q where q = e/d <= 1/2; a max,
        // not a select, so that the loop stays vectorised.
        y[b + k] = q - q * (lo * std::max(q, C{1} - q));
      }
    }
  }
  static constexpr bool transcendental = true;
  static lw::Value lower(lw::Builder& b, Operands x, const lw::Site& s) {
    const DType t = s.in;
    const lw::Value minus_abs[] = {b.neg(t, b.abs(x[0]))};
    const lw::Value e = b.call(lw::MathFunction::exp, t, minus_abs);
    const lw::Value one = b.constant(t, 1);
    const lw::Value d = b.add(t, one, e);
    const lw::Value lo = b.add(t, b.sub(t, one, d), e);
    const lw::Value num =
        b.select(b.compare(lw::Comparison::ge, t, x[0], b.constant(t, 0)), one, e);
    const lw::Value q = b.div(num, d);
    return b.sub(t, q, b.mul(t, q, b.mul(t, lo, b.max(t, q, b.sub(t, one, q)))));
  }
  static Tensor scale(const Tensor&, const Tensor& y, const Tensor& t) { return t * y * (1.0 - y); }
};
KILN_PLAIN_UNARY(Floor, std::floor(x), b.round(lw::Rounding::floor, x[0]))
KILN_PLAIN_UNARY(Ceil, std::ceil(x), b.round(lw::Rounding::ceil, x[0]))
// The default rounding mode: half to even.
KILN_PLAIN_UNARY(Round, std::nearbyint(x), b.round(lw::Rounding::nearest_even, x[0]))
#undef KILN_FLOAT_UNARY
#undef KILN_UNARY_SCALE
#undef KILN_PLAIN_UNARY
struct LogicalNot {
  static constexpr Domain domain = Domain::boolean;
  static constexpr Algebra algebra{.cheap_arithmetic = true};
  static lw::Value lower(lw::Builder& b, Operands x, const lw::Site&) { return b.bit_not(x[0]); }
  bool operator()(bool x) const { return !x; }
};
struct IsNan {
  static constexpr Domain domain = Domain::floating;
  static constexpr bool bool_result = true;
  static lw::Value lower(lw::Builder& b, Operands x, const lw::Site&) { return b.is_nan(x[0]); }
  template <typename T>
  bool operator()(T x) const {
    return x != x;
  }
};

// Conversion between dtypes; attribute `dtype` is the target.
// Derivatives pass through conversions between floats and complex numbers and stop at integer
// ones.
Tangent convert_tangent(const Tensor& t, DType to) {
  if (!is_inexact(to) || !is_inexact(t.dtype())) return std::nullopt;
  return astype(t, to);
}

}  // namespace

// The table: accessor (src/ops/primitives.h), functor, IR name. A primitive's definition is its
// line here.
#define KILN_UNARY(accessor, F, name)                                  \
  const Primitive& prim::accessor() {                                  \
    static const Primitive& p = define_unary<F>(name, Loc::current()); \
    return p;                                                          \
  }
KILN_UNARY(neg, Neg, "neg")
KILN_UNARY(abs, Abs, "abs")
KILN_UNARY(sign, Sign, "sign")
KILN_UNARY(exp, Exp, "exp")
KILN_UNARY(log, Log, "log")
KILN_UNARY(log1p, Log1p, "log1p")
KILN_UNARY(expm1, Expm1, "expm1")
KILN_UNARY(sqrt, Sqrt, "sqrt")
KILN_UNARY(rsqrt, Rsqrt, "rsqrt")
KILN_UNARY(sin, Sin, "sin")
KILN_UNARY(cos, Cos, "cos")
KILN_UNARY(tan, Tan, "tan")
KILN_UNARY(tanh, Tanh, "tanh")
KILN_UNARY(sigmoid, Sigmoid, "sigmoid")
KILN_UNARY(erf, Erf, "erf")
KILN_UNARY(floor, Floor, "floor")
KILN_UNARY(ceil, Ceil, "ceil")
KILN_UNARY(round, Round, "round")
KILN_UNARY(not_, LogicalNot, "not")
KILN_UNARY(isnan, IsNan, "isnan")
#undef KILN_UNARY

const Primitive& prim::convert() {
  static const Primitive& p = detail::register_builtin(
      {.name = "convert",
       .arity = 1,
       .type_rule =
           [](std::span<const TensorType> in, const Attrs& a) {
             return std::vector<TensorType>{{a.get_dtype("dtype"), in[0].shape}};
           },
       // Between floats and complex numbers convert is linear (complex to real keeps the real
       // part, whose transpose is the embedding back); to or from integers it stops derivatives.
       .jvp = [](const RuleArgs& r, std::span<const Tangent> t) -> std::vector<Tangent> {
         if (!is_inexact(r.attrs.get_dtype("dtype")) || !is_inexact(t[0]->dtype()))
           return {std::nullopt};
         return ops::linear_jvp(r, t);
       },
       .vjp = [](const RuleArgs& r, std::span<const Tangent> ct) -> std::vector<Tangent> {
         return {convert_tangent(*ct[0], r.inputs[0].dtype())};
       },
       .batch = ops::batch_elementwise,
       .algebra = {.cheap_arithmetic = true},
       .lowering = lw::Lowering{.elementwise =
                                    [](lw::Builder& b, Operands x, const lw::Site& s) {
                                      return b.convert(s.in, s.out, x[0]);
                                    }}},
      {{ops::cpu({DTypeSet::all()}), [](std::span<const Tensor> in, const Attrs& a) {
          Tensor out = empty(in[0].shape(), a.get_dtype("dtype"));
          detail::copy_cast(in[0], out);
          return std::vector<Tensor>{out};
        }}});
  return p;
}

// The identity marked non-differentiable: derivatives are zero through it.
const Primitive& prim::stop_gradient() {
  static const Primitive& p = detail::register_builtin(
      {.name = "stop_gradient",
       .arity = 1,
       .type_rule = [](ops::Types in, const Attrs&) { return std::vector<TensorType>{in[0]}; },
       .differentiable = false,
       .batch = ops::batch_elementwise,
       .lowering = lw::Lowering{.elementwise = [](lw::Builder&, Operands x,
                                                  const lw::Site&) { return x[0]; }}},
      {{ops::cpu({DTypeSet::all()}),
        [](ops::Ins in, const Attrs&) { return std::vector<Tensor>{in[0]}; }}});
  return p;
}

namespace {

Tensor numeric_op(const Primitive& p, const Tensor& x, Loc loc) {
  const detail::CallSite site(loc);
  return bind1(p, {x.dtype() == bool_ ? astype(x, int32, loc) : x}, {}, loc);
}

}  // namespace

Tensor neg(const Tensor& x, Loc loc) { return numeric_op(prim::neg(), x, loc); }
Tensor abs(const Tensor& x, Loc loc) {
  if (is_complex(x.dtype())) return bind1(prim::complex_abs(), {x}, {}, loc);
  return x.dtype() == bool_ ? x : bind1(prim::abs(), {x}, {}, loc);
}
Tensor sign(const Tensor& x, Loc loc) {
  return x.dtype() == bool_ ? x : bind1(prim::sign(), {x}, {}, loc);
}
Tensor exp(const Tensor& x, Loc loc) { return float_op(prim::exp(), x, loc); }
Tensor log(const Tensor& x, Loc loc) { return float_op(prim::log(), x, loc); }
Tensor log1p(const Tensor& x, Loc loc) { return float_op(prim::log1p(), x, loc); }
Tensor expm1(const Tensor& x, Loc loc) { return float_op(prim::expm1(), x, loc); }
Tensor sqrt(const Tensor& x, Loc loc) { return float_op(prim::sqrt(), x, loc); }
Tensor rsqrt(const Tensor& x, Loc loc) { return float_op(prim::rsqrt(), x, loc); }
Tensor sin(const Tensor& x, Loc loc) { return float_op(prim::sin(), x, loc); }
Tensor cos(const Tensor& x, Loc loc) { return float_op(prim::cos(), x, loc); }
Tensor tan(const Tensor& x, Loc loc) { return float_op(prim::tan(), x, loc); }
Tensor tanh(const Tensor& x, Loc loc) { return float_op(prim::tanh(), x, loc); }
Tensor sigmoid(const Tensor& x, Loc loc) { return float_op(prim::sigmoid(), x, loc); }
Tensor erf(const Tensor& x, Loc loc) { return float_op(prim::erf(), x, loc); }
Tensor floor(const Tensor& x, Loc loc) { return rounding_op(prim::floor(), x, loc); }
Tensor ceil(const Tensor& x, Loc loc) { return rounding_op(prim::ceil(), x, loc); }
Tensor round(const Tensor& x, Loc loc) {
  const detail::CallSite site(loc);
  if (is_complex(x.dtype()))  // both parts, as numpy
    return complex(round(real(x, loc), loc), round(imag(x, loc), loc), loc);
  return rounding_op(prim::round(), x, loc);
}
Tensor square(const Tensor& x, Loc loc) { return mul(x, x, loc); }
Tensor logical_not(const Tensor& x, Loc loc) {
  const detail::CallSite site(loc);
  return bind1(prim::not_(), {ops::cast_if_needed(x, bool_, loc)}, {}, loc);
}
Tensor isnan(const Tensor& x, Loc loc) {
  const detail::CallSite site(loc);
  if (is_complex(x.dtype()))  // NaN when either part is, as numpy
    return logical_or(isnan(real(x, loc), loc), isnan(imag(x, loc), loc), loc);
  if (!is_floating(x.dtype())) return zeros(x.shape(), bool_);
  return bind1(prim::isnan(), {x}, {}, loc);
}
Tensor stop_gradient(const Tensor& x, Loc loc) {
  return bind1(prim::stop_gradient(), {x}, {}, loc);
}
Tensor astype(const Tensor& x, DType dtype, Loc loc) {
  const detail::CallSite site(loc);
  if (x.dtype() == dtype) return x;
  return bind1(prim::convert(), {x}, {{"dtype", dtype}}, loc);
}

}  // namespace kiln
