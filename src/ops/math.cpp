// Elementwise math beyond the basic arithmetic (docs/OPS.md, "Math"): inverse and hyperbolic
// trigonometry, base-2/10 exponentials and logarithms, special functions (erfinv, lgamma,
// digamma, polygamma), float classification, remainders and floor division, atan2, hypot,
// copysign, logaddexp, and bitwise operations on integers. Each is a functor turned into a
// primitive by src/ops/elementwise_rules.h; softplus, log_sigmoid and nan_to_num compose them.
//
// Kernels call C's libm (correctly rounded or within 1 ulp for glibc's float and double
// functions); the special functions have no libm version and are implemented below in double.
// The exact ones are lowered to LLVM (src/compiler/codegen.cpp, math_op); compiled code calls
// the kernels of the others (docs/OPS.md).
#include <cmath>
#include <limits>
#include <numbers>
#include <type_traits>

#include "kiln/math_ops.h"
#include "ops/elementwise_rules.h"
#include "ops/primitives.h"

namespace kiln {
namespace {

using ops::Domain;
using ops::map_t;
using ops::Operands;
using ops::plus;
using ops::signed_integer;
namespace lw = lowering;

constexpr double kLn2 = std::numbers::ln2;
constexpr double kLn10 = std::numbers::ln10;

// ---- special functions (double precision; float inputs compute in double) ---------------

// The digamma function psi(x) (Cephes' psi): the recurrence psi(x) = psi(x + 1) - 1/x up to
// x >= 10, then the asymptotic series; negative x by reflection,
// psi(1 - x) - psi(x) = pi / tan(pi x). Poles at 0 and the negative integers give NaN there
// (-inf at +0 and -0, the one-sided limit that scipy reports too is taken from x's sign).
double digamma_of(double x) {
  if (std::isnan(x)) return x;
  if (x == 0)
    return std::signbit(x) ? std::numeric_limits<double>::infinity()
                           : -std::numeric_limits<double>::infinity();
  if (x == std::numeric_limits<double>::infinity()) return x;
  double reflection = 0;
  if (x < 0) {
    const double p = std::floor(x);
    if (p == x) return std::numeric_limits<double>::quiet_NaN();
    // pi / tan(pi x), with x reduced to (-1/2, 1/2] so that tan stays accurate.
    double frac = x - p;
    if (frac != 0.5) {
      if (frac > 0.5) frac -= 1.0;
      reflection = std::numbers::pi / std::tan(std::numbers::pi * frac);
    }
    x = 1.0 - x;
  }
  double shift = 0;
  while (x < 10) {
    shift += 1.0 / x;
    x += 1.0;
  }
  constexpr double kA[] = {8.33333333333333333333E-2, -2.10927960927960927961E-2,
                           7.57575757575757575758E-3, -4.16666666666666666667E-3,
                           3.96825396825396825397E-3, -8.33333333333333333333E-3,
                           8.33333333333333333333E-2};
  double series = 0;
  if (x < 1e17) {
    const double z = 1.0 / (x * x);
    double poly = 0;
    for (double a : kA) poly = poly * z + a;
    series = z * poly;
  }
  return std::log(x) - 0.5 / x - series - shift - reflection;
}

// The Hurwitz zeta function zeta(s, q) = sum_k (k + q)^-s for s > 1 (Cephes' zeta):
// direct summation up to q + k > 9, then Euler-Maclaurin with its Bernoulli terms.
double hurwitz_zeta(double s, double q) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  if (s == 1.0) return kInf;
  if (s < 1.0 || std::isnan(s) || std::isnan(q)) return std::numeric_limits<double>::quiet_NaN();
  if (q <= 0.0) {
    if (q == std::floor(q)) return kInf;
    if (s != std::floor(s)) return std::numeric_limits<double>::quiet_NaN();
  }
  if (q == kInf) return 0.0;
  constexpr double kA[] = {12.0,
                           -720.0,
                           30240.0,
                           -1209600.0,
                           47900160.0,
                           -1.8924375803183791606e9,
                           7.47242496e10,
                           -2.950130727918164224e12,
                           1.1646782814350067249e14,
                           -4.5979787224074726105e15,
                           1.8152105401943546773e17,
                           -7.1661652561756670113e18};
  constexpr double kEps = std::numeric_limits<double>::epsilon() / 2;
  double sum = std::pow(q, -s);
  double a = q;
  double b = 0.0;
  for (int i = 0; i < 9 || a <= 9.0;) {
    ++i;
    a += 1.0;
    b = std::pow(a, -s);
    sum += b;
    if (std::fabs(b / sum) < kEps) return sum;
  }
  const double w = a;
  sum += b * w / (s - 1.0) - 0.5 * b;
  double fac = 1.0;
  double k = 0.0;
  for (double bernoulli : kA) {
    fac *= s + k;
    b /= w;
    const double term = fac * b / bernoulli;
    sum += term;
    if (std::fabs(term / sum) < kEps) break;
    k += 1.0;
    fac *= s + k;
    b /= w;
    k += 1.0;
  }
  return sum;
}

// psi^(n)(x) = (-1)^(n+1) n! zeta(n + 1, x) for n >= 1, digamma for n = 0.
double polygamma_of(int64_t n, double x) {
  if (n == 0) return digamma_of(x);
  const double sign = n % 2 == 1 ? 1.0 : -1.0;
  return sign * std::tgamma(static_cast<double>(n) + 1.0) *
         hurwitz_zeta(static_cast<double>(n) + 1.0, x);
}

// The inverse error function: Giles' single-precision approximation ("Approximating the erfinv
// function", GPU Computing Gems, 2011), refined by Halley steps in double (cubic convergence;
// Newton's two steps left 3e-5 relative error at y = 1 - 1e-12, where the approximation
// starts 1% off). Above 1/2 the residual erf(x) - y is computed as (1 - y) - erfc(x), which
// 1 - y keeps exact (Sterbenz) where erf(x) - y would cancel. erfinv(+-1) = +-inf; NaN
// outside [-1, 1]; odd, so erfinv(-0) = -0.
double erfinv_of(double y) {
  const double a = std::fabs(y);
  if (!(a <= 1.0)) return std::numeric_limits<double>::quiet_NaN();
  if (a == 1.0) return std::copysign(std::numeric_limits<double>::infinity(), y);
  double w = -std::log((1.0 - a) * (1.0 + a));
  double x;
  if (w < 5.0) {
    w -= 2.5;
    x = 2.81022636e-08;
    for (double c : {3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087, -0.00125372503,
                     -0.00417768164, 0.246640727, 1.50140941})
      x = x * w + c;
  } else {
    w = std::sqrt(w) - 3.0;
    x = -0.000200214257;
    for (double c : {0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773, -0.0076224613,
                     0.00943887047, 1.00167406, 2.83297682})
      x = x * w + c;
  }
  x *= a;
  constexpr double kTwoOverSqrtPi = std::numbers::inv_sqrtpi * 2;
  for (int step = 0; step < 8 && x > 0; ++step) {
    const double residual = a > 0.5 ? (1.0 - a) - std::erfc(x) : std::erf(x) - a;
    const double newton = residual / (kTwoOverSqrtPi * std::exp(-x * x));
    // Halley: erf'' = -2x erf', so the Newton step is divided by 1 + x * newton.
    const double delta = newton / (1.0 + x * newton);
    x -= delta;
    if (std::fabs(delta) <= 1e-17 * x) break;
  }
  return std::copysign(x, y);
}

// lgamma through glibc's reentrant lgamma_r: lgamma writes the global signgam, a data race
// when kernels run on several threads.
double lgamma_of(double x) {
  int sign = 0;
  return ::lgamma_r(x, &sign);
}

// ---- unary functors -------------------------------------------------------------------------

// dy/dx applied to a tangent t, from x and y = f(x) (functors use what they need).
#define KILN_MATH_UNARY(Name, expr, derivative)                              \
  struct Name {                                                              \
    static constexpr Domain domain = Domain::floating;                       \
    template <typename T>                                                    \
    T operator()(T x) const {                                                \
      return expr;                                                           \
    }                                                                        \
    static Tensor scale(const Tensor& x, const Tensor& y, const Tensor& t) { \
      (void)x;                                                               \
      (void)y;                                                               \
      return derivative;                                                     \
    }                                                                        \
  };
KILN_MATH_UNARY(Log2, std::log2(x), t / (x * kLn2))
KILN_MATH_UNARY(Log10, std::log10(x), t / (x * kLn10))
KILN_MATH_UNARY(Exp2, std::exp2(x), t* y* kLn2)
KILN_MATH_UNARY(Sinh, std::sinh(x), t* cosh(x))
KILN_MATH_UNARY(Cosh, std::cosh(x), t* sinh(x))
KILN_MATH_UNARY(Asin, std::asin(x), t* rsqrt(1.0 - x * x))
KILN_MATH_UNARY(Acos, std::acos(x), -(t* rsqrt(1.0 - x * x)))
KILN_MATH_UNARY(Atan, std::atan(x), t / (x * x + 1.0))
KILN_MATH_UNARY(Asinh, std::asinh(x), t* rsqrt(x* x + 1.0))
// (x - 1)(x + 1), not x^2 - 1: no cancellation near 1, no overflow before x^2 would.
KILN_MATH_UNARY(Acosh, std::acosh(x), t* rsqrt((x - 1.0) * (x + 1.0)))
KILN_MATH_UNARY(Atanh, std::atanh(x), t / ((1.0 - x) * (1.0 + x)))
// d erfinv(x)/dx = sqrt(pi)/2 exp(erfinv(x)^2).
KILN_MATH_UNARY(Erfinv, static_cast<T>(erfinv_of(x)),
                t* exp(y* y) * (0.5 / std::numbers::inv_sqrtpi))
// d erfc(x)/dx = -2/sqrt(pi) exp(-x^2); libm's erfc keeps its relative precision in the tail
// (1 - erf(x) is 0 from x ~ 6 in float64).
KILN_MATH_UNARY(Erfc, std::erfc(x), -(t* exp(-(x* x)) * (2.0 * std::numbers::inv_sqrtpi)))
KILN_MATH_UNARY(Lgamma, static_cast<T>(lgamma_of(x)), t* digamma(x))
KILN_MATH_UNARY(Digamma, static_cast<T>(digamma_of(x)), t* polygamma(1, x))
#undef KILN_MATH_UNARY

// The exact functors below have a compiled form (`lower`, kiln/lowering.h); the others run
// their kernels in compiled code.
struct Trunc {
  static constexpr Domain domain = Domain::floating;
  static lw::Value lower(lw::Builder& b, Operands x, const lw::Site&) {
    return b.round(lw::Rounding::toward_zero, x[0]);
  }
  template <typename T>
  T operator()(T x) const {
    return std::trunc(x);
  }
};
// |x| compared with infinity (a NaN compares false).
lw::Value against_infinity(lw::Builder& b, lw::Comparison c, lw::Value x, DType d) {
  return b.compare(c, d, b.abs(x), b.constant(d, std::numeric_limits<double>::infinity()));
}
struct IsInf {
  static constexpr Domain domain = Domain::floating;
  static constexpr bool bool_result = true;
  static lw::Value lower(lw::Builder& b, Operands x, const lw::Site& s) {
    return against_infinity(b, lw::Comparison::eq, x[0], s.in);
  }
  template <typename T>
  bool operator()(T x) const {
    return std::isinf(x);
  }
};
struct IsFinite {
  static constexpr Domain domain = Domain::floating;
  static constexpr bool bool_result = true;
  static lw::Value lower(lw::Builder& b, Operands x, const lw::Site& s) {
    return against_infinity(b, lw::Comparison::lt, x[0], s.in);
  }
  template <typename T>
  bool operator()(T x) const {
    return std::isfinite(x);
  }
};
// On bool, bitwise not is logical not (numpy's ~True is False).
struct BitwiseNot {
  static constexpr Domain domain = Domain::bits;
  static lw::Value lower(lw::Builder& b, Operands x, const lw::Site&) { return b.bit_not(x[0]); }
  template <typename T>
  T operator()(T x) const {
    if constexpr (std::is_same_v<T, bool>)
      return !x;
    else
      return static_cast<T>(~x);
  }
};

// ---- binary functors ------------------------------------------------------------------------

// The quotient a remainder removed: (a - y) / b is an integer up to rounding, made exact by
// round. The derivative of remainder and fmod with respect to b is minus this quotient.
Tensor removed_quotient(const Tensor& a, const Tensor& b, const Tensor& y) {
  return round((a - y) / b);
}

// numpy's divmod for floats (npy_divmod): the floored quotient and the remainder with the
// divisor's sign, consistent with each other (a = q b + r up to rounding).
struct FloatDivmod {
  double quotient, remainder;
};
template <typename T>
FloatDivmod float_divmod(T a, T b) {
  T mod = std::fmod(a, b);
  if (b == T{0}) return {static_cast<double>(a / b), static_cast<double>(mod)};
  T div = (a - mod) / b;
  if (mod != T{0}) {
    if ((b < T{0}) != (mod < T{0})) {
      mod += b;
      div -= T{1};
    }
  } else {
    mod = std::copysign(T{0}, b);
  }
  T floordiv;
  if (div != T{0}) {
    floordiv = std::floor(div);
    if (div - floordiv > T{0.5}) floordiv += T{1};
  } else {
    floordiv = std::copysign(T{0}, a / b);
  }
  return {static_cast<double>(floordiv), static_cast<double>(mod)};
}

// Integer remainders and quotients of signed T avoid the one overflowing case, MIN / -1:
// the quotient wraps to MIN (as numpy's), the remainder is 0.
template <typename T>
bool overflowing_division(T a, T b) {
  if constexpr (std::is_signed_v<T>)
    return b == T{-1} && a == std::numeric_limits<T>::min();
  else
    return false;
}

// y = a - q b for an integer q: dy/da = 1, dy/db = -q. Integer kernels reject zero divisors.
struct RemainderRules {
  static constexpr Domain domain = Domain::numeric;
  static constexpr bool checks_zero_divisor = true;
  static Tangent jvp(const Tensor& a, const Tensor& b, const Tensor& y, const Tangent& ta,
                     const Tangent& tb) {
    return plus(ta, map_t(tb, [&](const Tensor& t) { return -(t * removed_quotient(a, b, y)); }));
  }
  static ops::Ts vjp(const Tensor& a, const Tensor& b, const Tensor& y, const Tensor& ct) {
    return {ct, -(ct * removed_quotient(a, b, y))};
  }
};
// Python's %: the result has the divisor's sign (numpy.remainder).
struct Remainder : RemainderRules {
  template <typename T>
  T operator()(T a, T b) const {
    if constexpr (std::is_floating_point_v<T>) {
      return static_cast<T>(float_divmod(a, b).remainder);  // NaN for b = 0, as numpy
    } else {
      if (overflowing_division(a, b)) return T{0};
      const T r = static_cast<T>(a % b);
      if constexpr (std::is_signed_v<T>)
        if (r != T{0} && ((r < T{0}) != (b < T{0}))) return static_cast<T>(r + b);
      return r;
    }
  }
};
// C's fmod: the result has the dividend's sign (numpy.fmod).
struct Fmod : RemainderRules {
  template <typename T>
  T operator()(T a, T b) const {
    if constexpr (std::is_floating_point_v<T>)
      return std::fmod(a, b);
    else
      return overflowing_division(a, b) ? T{0} : static_cast<T>(a % b);
  }
};
// Python's //: the quotient rounded towards -inf. Piecewise constant: no derivative.
struct FloorDivide {
  static constexpr Domain domain = Domain::numeric;
  static constexpr bool checks_zero_divisor = true;
  template <typename T>
  T operator()(T a, T b) const {
    if constexpr (std::is_floating_point_v<T>) {
      return static_cast<T>(float_divmod(a, b).quotient);
    } else {
      if (overflowing_division(a, b)) return a;
      const T q = static_cast<T>(a / b);
      if constexpr (std::is_signed_v<T>)
        if (q * b != a && ((a < T{0}) != (b < T{0}))) return static_cast<T>(q - 1);
      return q;
    }
  }
};
// atan2(a, b): the angle of the point (b, a). The derivative is NaN at the origin.
struct Atan2 {
  static constexpr Domain domain = Domain::floating;
  static Tangent jvp(const Tensor& a, const Tensor& b, const Tensor&, const Tangent& ta,
                     const Tangent& tb) {
    const Tensor r2 = a * a + b * b;
    return plus(map_t(ta, [&](const Tensor& t) { return t * b / r2; }),
                map_t(tb, [&](const Tensor& t) { return -(t * a / r2); }));
  }
  static ops::Ts vjp(const Tensor& a, const Tensor& b, const Tensor&, const Tensor& ct) {
    const Tensor r2 = a * a + b * b;
    return {ct * b / r2, -(ct * a / r2)};
  }
  template <typename T>
  T operator()(T a, T b) const {
    return std::atan2(a, b);
  }
};
// sqrt(a^2 + b^2) without overflow. At the origin the derivative is taken as 0 (a / h with h
// replaced by 1 there, where a = 0).
Tensor safe_hypot(const Tensor& h) { return where(h == 0.0, scalar_like(h, 1.0), h); }
struct Hypot {
  static constexpr Domain domain = Domain::floating;
  static Tangent jvp(const Tensor& a, const Tensor& b, const Tensor& y, const Tangent& ta,
                     const Tangent& tb) {
    const Tensor h = safe_hypot(y);
    return plus(map_t(ta, [&](const Tensor& t) { return t * a / h; }),
                map_t(tb, [&](const Tensor& t) { return t * b / h; }));
  }
  static ops::Ts vjp(const Tensor& a, const Tensor& b, const Tensor& y, const Tensor& ct) {
    const Tensor h = safe_hypot(y);
    return {ct * a / h, ct * b / h};
  }
  template <typename T>
  T operator()(T a, T b) const {
    return std::hypot(a, b);
  }
};
// |a| with b's sign bit. d/da is +1 where the sign bits of a and b agree, -1 where they differ;
// nothing flows to b.
Tensor sign_flip(const Tensor& a, const Tensor& b) {
  const Tensor one = scalar_like(a, 1.0);
  return copysign(one, a) * copysign(one, b);
}
struct Copysign {
  static constexpr Domain domain = Domain::floating;
  static lw::Value lower(lw::Builder& b, Operands x, const lw::Site&) {
    return b.copysign(x[0], x[1]);
  }
  static Tangent jvp(const Tensor& a, const Tensor& b, const Tensor&, const Tangent& ta,
                     const Tangent&) {
    return map_t(ta, [&](const Tensor& t) { return t * sign_flip(a, b); });
  }
  static ops::Ts vjp(const Tensor& a, const Tensor& b, const Tensor&, const Tensor& ct) {
    return {ct * sign_flip(a, b), std::nullopt};
  }
  template <typename T>
  T operator()(T a, T b) const {
    return std::copysign(a, b);
  }
};
// log(exp(a) + exp(b)) as max + log1p(exp(-|a - b|)) (numpy's npy_logaddexp): no overflow,
// and a == b (both +-inf included) gives a + log 2 instead of inf - inf. The derivatives are
// the softmax weights exp(a - y) = sigmoid(a - b) and sigmoid(b - a): stable, 1/2 each where
// a == b. Only equal infinities (a - b = NaN) are replaced, so derivatives of every order stay
// right at finite a == b (softplus''(0) = 1/4).
Tensor logaddexp_weight(const Tensor& a, const Tensor& b) {
  const Tensor same_infinity = (a == b) && isinf(a);
  return sigmoid(where(same_infinity, scalar_like(a, 0.0), a - b));
}
struct LogAddExp {
  static constexpr Domain domain = Domain::floating;
  static Tangent jvp(const Tensor& a, const Tensor& b, const Tensor&, const Tangent& ta,
                     const Tangent& tb) {
    return plus(map_t(ta, [&](const Tensor& t) { return t * logaddexp_weight(a, b); }),
                map_t(tb, [&](const Tensor& t) { return t * logaddexp_weight(b, a); }));
  }
  static ops::Ts vjp(const Tensor& a, const Tensor& b, const Tensor&, const Tensor& ct) {
    return {ct * logaddexp_weight(a, b), ct * logaddexp_weight(b, a)};
  }
  template <typename T>
  T operator()(T a, T b) const {
    if (a == b) return a + static_cast<T>(kLn2);
    const T d = a - b;
    if (d > T{0}) return a + std::log1p(std::exp(-d));
    if (d <= T{0}) return b + std::log1p(std::exp(d));
    return d;  // NaN
  }
};

// Bitwise operations on the two's complement bits; on bool they are the logical ones.
#define KILN_BITWISE(Name, op, lowered)                                   \
  struct Name {                                                           \
    static constexpr Domain domain = Domain::bits;                        \
    static lw::Value lower(lw::Builder& b, Operands x, const lw::Site&) { \
      return b.lowered(x[0], x[1]);                                       \
    }                                                                     \
    template <typename T>                                                 \
    T operator()(T a, T b) const {                                        \
      return static_cast<T>(a op b);                                      \
    }                                                                     \
  };
KILN_BITWISE(BitwiseAnd, &, bit_and)
KILN_BITWISE(BitwiseOr, |, bit_or)
KILN_BITWISE(BitwiseXor, ^, bit_xor)
#undef KILN_BITWISE

// Shifts as numpy's npy_lshift / npy_rshift: a count outside [0, bits) (negative counts
// included) shifts every bit out, giving 0, or -1 for a right shift of a negative value.
template <typename T>
bool shift_in_range(T count) {
  using U = std::make_unsigned_t<T>;
  return static_cast<U>(count) < sizeof(T) * 8;
}
// Compiled: whether the count is in range, and the count masked into it, so that the shift
// itself is always defined.
struct ShiftCount {
  lw::Value in_range, count;
};
ShiftCount shift_count(lw::Builder& b, lw::Value count, DType d) {
  const auto bits = static_cast<double>(dtype_size(d) * 8);
  return {b.unsigned_less(count, b.constant(d, bits)), b.bit_and(count, b.constant(d, bits - 1))};
}
// Shifts take the integral dtypes: the public ops compute bool operands in int32.
struct LeftShift {
  static constexpr Domain domain = Domain::integral;
  static lw::Value lower(lw::Builder& b, Operands x, const lw::Site& s) {
    const ShiftCount c = shift_count(b, x[1], s.in);
    return b.select(c.in_range, b.shift_left(x[0], c.count), b.constant(s.in, 0));
  }
  template <typename T>
  T operator()(T a, T b) const {
    using U = std::make_unsigned_t<T>;
    return shift_in_range(b) ? static_cast<T>(static_cast<U>(a) << b) : T{0};
  }
};
struct RightShift {
  static constexpr Domain domain = Domain::integral;
  static lw::Value lower(lw::Builder& b, Operands x, const lw::Site& s) {
    const ShiftCount c = shift_count(b, x[1], s.in);
    // Out of range: 0, or -1 for negative signed values (the sign bit shifted across).
    const double bits = static_cast<double>(dtype_size(s.in) * 8);
    const lw::Value out = signed_integer(s.in)
                              ? b.shift_right(s.in, x[0], b.constant(s.in, bits - 1))
                              : b.constant(s.in, 0);
    return b.select(c.in_range, b.shift_right(s.in, x[0], c.count), out);
  }
  template <typename T>
  T operator()(T a, T b) const {
    if (shift_in_range(b)) return static_cast<T>(a >> b);  // arithmetic for signed T
    if constexpr (std::is_signed_v<T>)
      if (a < T{0}) return T{-1};
    return T{0};
  }
};

}  // namespace

// The tables: accessor (src/ops/primitives.h), functor, IR name.
#define KILN_UNARY(accessor, F, name)                                       \
  const Primitive& prim::accessor() {                                       \
    static const Primitive& p = ops::define_unary<F>(name, Loc::current()); \
    return p;                                                               \
  }
KILN_UNARY(trunc, Trunc, "trunc")
KILN_UNARY(log2, Log2, "log2")
KILN_UNARY(log10, Log10, "log10")
KILN_UNARY(exp2, Exp2, "exp2")
KILN_UNARY(sinh, Sinh, "sinh")
KILN_UNARY(cosh, Cosh, "cosh")
KILN_UNARY(asin, Asin, "asin")
KILN_UNARY(acos, Acos, "acos")
KILN_UNARY(atan, Atan, "atan")
KILN_UNARY(asinh, Asinh, "asinh")
KILN_UNARY(acosh, Acosh, "acosh")
KILN_UNARY(atanh, Atanh, "atanh")
KILN_UNARY(erfinv, Erfinv, "erfinv")
KILN_UNARY(erfc, Erfc, "erfc")
KILN_UNARY(lgamma, Lgamma, "lgamma")
KILN_UNARY(digamma, Digamma, "digamma")
KILN_UNARY(isinf, IsInf, "isinf")
KILN_UNARY(isfinite, IsFinite, "isfinite")
KILN_UNARY(bitwise_not, BitwiseNot, "bitwise_not")
#undef KILN_UNARY
#define KILN_BINARY(accessor, F, name)                                       \
  const Primitive& prim::accessor() {                                        \
    static const Primitive& p = ops::define_binary<F>(name, Loc::current()); \
    return p;                                                                \
  }
KILN_BINARY(remainder, Remainder, "remainder")
KILN_BINARY(fmod, Fmod, "fmod")
KILN_BINARY(floor_divide, FloorDivide, "floor_divide")
KILN_BINARY(atan2, Atan2, "atan2")
KILN_BINARY(hypot, Hypot, "hypot")
KILN_BINARY(copysign, Copysign, "copysign")
KILN_BINARY(logaddexp, LogAddExp, "logaddexp")
KILN_BINARY(bitwise_and, BitwiseAnd, "bitwise_and")
KILN_BINARY(bitwise_or, BitwiseOr, "bitwise_or")
KILN_BINARY(bitwise_xor, BitwiseXor, "bitwise_xor")
KILN_BINARY(left_shift, LeftShift, "left_shift")
KILN_BINARY(right_shift, RightShift, "right_shift")
#undef KILN_BINARY

// polygamma(x; n): the n-th derivative of digamma, n >= 1 (attribute `n`); its derivative is
// the next one.
const Primitive& prim::polygamma() {
  static const Primitive& p = detail::register_builtin(
      {.name = "polygamma",
       .arity = 1,
       .type_rule =
           [](ops::Types in, const Attrs& a) {
             ops::expect_dtype("polygamma", in[0], DTypeSet::floating(),
                               ops::domain_desc(Domain::floating));
             if (a.get_int("n") < 1)
               fail("polygamma", "order out of range: got n = ", a.get_int("n"),
                    ", expected n >= 1 (n = 0 is digamma)");
             return std::vector<TensorType>{in[0]};
           },
       .jvp = [](const RuleArgs& r, std::span<const Tangent> t) -> ops::Ts {
         return {*t[0] * kiln::polygamma(r.attrs.get_int("n") + 1, r.inputs[0])};
       },
       .vjp = [](const RuleArgs& r, std::span<const Tangent> ct) -> ops::Ts {
         return {*ct[0] * kiln::polygamma(r.attrs.get_int("n") + 1, r.inputs[0])};
       },
       .batch = ops::batch_elementwise},
      {{ops::cpu({DTypeSet::floating()}), [](ops::Ins in, const Attrs& a) {
          const int64_t n = a.get_int("n");
          Tensor out = empty(in[0].type());
          detail::visit_dtype(in[0].dtype(), [&]<typename T>() {
            if constexpr (std::is_floating_point_v<detail::compute_t<T>>)
              detail::map_unary<T, T>(in[0], out, [n](auto x) {
                return static_cast<decltype(x)>(polygamma_of(n, static_cast<double>(x)));
              });
          });
          return std::vector<Tensor>{out};
        }}});
  return p;
}

// ---- public ops ---------------------------------------------------------------------------

namespace {

// Integer and bool operands of float-only binary ops become float32 (after promotion).
Tensor float_binary(const Primitive& p, const Tensor& a, const Tensor& b, Loc loc) {
  const detail::CallSite site(loc);
  auto [x, y] = ops::promote_broadcast(p.name, a, b, loc);
  const DType d = to_floating(x.dtype());
  return bind1(p, {ops::cast_if_needed(x, d, loc), ops::cast_if_needed(y, d, loc)}, {}, loc);
}
// isinf and isfinite of integers are constants; a complex value is infinite when either part
// is, finite when both are (numpy's answers).
Tensor classify(const Primitive& p, const Tensor& x, bool integer_answer, Loc loc) {
  const detail::CallSite site(loc);
  if (is_complex(x.dtype())) {
    const Tensor re = classify(p, real(x, loc), integer_answer, loc);
    const Tensor im = classify(p, imag(x, loc), integer_answer, loc);
    return integer_answer ? logical_and(re, im, loc) : logical_or(re, im, loc);
  }
  if (!is_floating(x.dtype())) return full(x.shape(), integer_answer ? 1.0 : 0.0, bool_);
  return bind1(p, {x}, {}, loc);
}

// The largest finite value of a floating dtype.
double max_finite(DType d) {
  switch (d) {
    case float16:
      return 65504.0;
    case bfloat16:
      return 3.3895313892515355e38;
    case float32:
      return std::numeric_limits<float>::max();
    default:
      return std::numeric_limits<double>::max();
  }
}

}  // namespace

Tensor trunc(const Tensor& x, Loc loc) { return ops::rounding_op(prim::trunc(), x, loc); }
Tensor log2(const Tensor& x, Loc loc) { return ops::float_op(prim::log2(), x, loc); }
Tensor log10(const Tensor& x, Loc loc) { return ops::float_op(prim::log10(), x, loc); }
Tensor exp2(const Tensor& x, Loc loc) { return ops::float_op(prim::exp2(), x, loc); }
Tensor sinh(const Tensor& x, Loc loc) { return ops::float_op(prim::sinh(), x, loc); }
Tensor cosh(const Tensor& x, Loc loc) { return ops::float_op(prim::cosh(), x, loc); }
Tensor asin(const Tensor& x, Loc loc) { return ops::float_op(prim::asin(), x, loc); }
Tensor acos(const Tensor& x, Loc loc) { return ops::float_op(prim::acos(), x, loc); }
Tensor atan(const Tensor& x, Loc loc) { return ops::float_op(prim::atan(), x, loc); }
Tensor asinh(const Tensor& x, Loc loc) { return ops::float_op(prim::asinh(), x, loc); }
Tensor acosh(const Tensor& x, Loc loc) { return ops::float_op(prim::acosh(), x, loc); }
Tensor atanh(const Tensor& x, Loc loc) { return ops::float_op(prim::atanh(), x, loc); }
Tensor erfinv(const Tensor& x, Loc loc) { return ops::float_op(prim::erfinv(), x, loc); }
Tensor erfc(const Tensor& x, Loc loc) { return ops::float_op(prim::erfc(), x, loc); }
Tensor lgamma(const Tensor& x, Loc loc) { return ops::float_op(prim::lgamma(), x, loc); }
Tensor digamma(const Tensor& x, Loc loc) { return ops::float_op(prim::digamma(), x, loc); }
Tensor polygamma(int64_t n, const Tensor& x, Loc loc) {
  const detail::CallSite site(loc);
  if (n < 0) fail("polygamma", "order out of range: got n = ", n, ", expected n >= 0");
  if (n == 0) return digamma(x, loc);
  return bind1(prim::polygamma(), {ops::cast_if_needed(x, to_floating(x.dtype()), loc)}, {{"n", n}},
               loc);
}
Tensor isinf(const Tensor& x, Loc loc) { return classify(prim::isinf(), x, false, loc); }
Tensor isfinite(const Tensor& x, Loc loc) { return classify(prim::isfinite(), x, true, loc); }

Tensor nan_to_num(const Tensor& x, const NanToNum& options, Loc loc) {
  const detail::CallSite site(loc);
  if (is_complex(x.dtype()))  // each part on its own, as numpy
    return complex(nan_to_num(real(x, loc), options, loc), nan_to_num(imag(x, loc), options, loc),
                   loc);
  if (!is_floating(x.dtype())) return x;
  const double big = max_finite(x.dtype());
  const Tensor posinf = scalar_like(x, options.posinf.value_or(big));
  const Tensor neginf = scalar_like(x, options.neginf.value_or(-big));
  const Tensor inf = scalar_like(x, std::numeric_limits<double>::infinity());
  const Tensor finite = where(x == inf, posinf, where(x == -inf, neginf, x, loc), loc);
  return where(isnan(x, loc), scalar_like(x, options.nan), finite, loc);
}

Tensor remainder(const Tensor& a, const Tensor& b, Loc loc) {
  return ops::arithmetic(prim::remainder(), a, b, loc);
}
Tensor fmod(const Tensor& a, const Tensor& b, Loc loc) {
  return ops::arithmetic(prim::fmod(), a, b, loc);
}
Tensor floor_divide(const Tensor& a, const Tensor& b, Loc loc) {
  return ops::arithmetic(prim::floor_divide(), a, b, loc);
}
Tensor atan2(const Tensor& a, const Tensor& b, Loc loc) {
  return float_binary(prim::atan2(), a, b, loc);
}
Tensor hypot(const Tensor& a, const Tensor& b, Loc loc) {
  return float_binary(prim::hypot(), a, b, loc);
}
Tensor copysign(const Tensor& a, const Tensor& b, Loc loc) {
  return float_binary(prim::copysign(), a, b, loc);
}
Tensor logaddexp(const Tensor& a, const Tensor& b, Loc loc) {
  return float_binary(prim::logaddexp(), a, b, loc);
}
// softplus(x) = log(1 + exp(x)) = logaddexp(x, 0), computed as max(x, 0) + log1p(exp(-|x|))
// in one kernel; its derivative is sigmoid(x), its second sigmoid'(x) (1/4 at 0).
Tensor softplus(const Tensor& x, Loc loc) {
  const detail::CallSite site(loc);
  const Tensor f = ops::cast_if_needed(x, to_floating(x.dtype()), loc);
  return logaddexp(f, scalar_like(f, 0.0), loc);
}
// log(sigmoid(x)) = -softplus(-x): finite for every finite x, derivative sigmoid(-x).
Tensor log_sigmoid(const Tensor& x, Loc loc) {
  const detail::CallSite site(loc);
  const Tensor f = ops::cast_if_needed(x, to_floating(x.dtype()), loc);
  return neg(softplus(neg(f, loc), loc), loc);
}

// numpy's rule: |a - b| <= atol + rtol |b| for finite values, equality for infinities (a finite
// value is never close to an infinite one), and NaN close to NaN only with equal_nan.
Tensor isclose(const Tensor& a, const Tensor& b, const Closeness& tolerance, Loc loc) {
  const detail::CallSite site(loc);
  auto [x, y] = ops::promote_broadcast("isclose", a, b, loc);
  const DType d = to_floating(x.dtype());
  x = ops::cast_if_needed(x, d, loc);
  y = ops::cast_if_needed(y, d, loc);
  const Tensor within = abs(x - y) <= scalar_like(y, tolerance.atol) + abs(y) * tolerance.rtol;
  Tensor close = logical_or(x == y, isfinite(x) && isfinite(y) && within, loc);
  if (tolerance.equal_nan) close = close || (isnan(x) && isnan(y));
  return close;
}
Tensor allclose(const Tensor& a, const Tensor& b, const Closeness& tolerance, Loc loc) {
  const detail::CallSite site(loc);
  return all(isclose(a, b, tolerance, loc), {}, false, loc);
}

Tensor bitwise_and(const Tensor& a, const Tensor& b, Loc loc) {
  return ops::binary(prim::bitwise_and(), a, b, loc);
}
Tensor bitwise_or(const Tensor& a, const Tensor& b, Loc loc) {
  return ops::binary(prim::bitwise_or(), a, b, loc);
}
Tensor bitwise_xor(const Tensor& a, const Tensor& b, Loc loc) {
  return ops::binary(prim::bitwise_xor(), a, b, loc);
}
Tensor bitwise_not(const Tensor& x, Loc loc) { return bind1(prim::bitwise_not(), {x}, {}, loc); }
Tensor left_shift(const Tensor& a, const Tensor& b, Loc loc) {
  return ops::arithmetic(prim::left_shift(), a, b, loc);
}
Tensor right_shift(const Tensor& a, const Tensor& b, Loc loc) {
  return ops::arithmetic(prim::right_shift(), a, b, loc);
}

}  // namespace kiln
