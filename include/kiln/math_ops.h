// Elementwise math beyond ops.h's basics: inverse and hyperbolic trigonometry, base-2 and
// base-10 exponentials and logarithms, special functions, float classification, remainders,
// atan2/hypot/copysign/logaddexp, softplus and log_sigmoid, and bitwise operations
// (docs/OPS.md, "Math"). Like ops.h: each runs eagerly and traces; binary ones broadcast and
// promote. Float-only ops compute integer and bool inputs in float32, as numpy does.
#pragma once

#include <optional>

#include "kiln/tensor.h"

namespace kiln {

// ---- unary (floating results) -----------------------------------------------------------
Tensor trunc(const Tensor& x, Loc loc = Loc::current());  // towards 0; identity on integers
Tensor log2(const Tensor& x, Loc loc = Loc::current());
Tensor log10(const Tensor& x, Loc loc = Loc::current());
Tensor exp2(const Tensor& x, Loc loc = Loc::current());
Tensor sinh(const Tensor& x, Loc loc = Loc::current());
Tensor cosh(const Tensor& x, Loc loc = Loc::current());
Tensor asin(const Tensor& x, Loc loc = Loc::current());
Tensor acos(const Tensor& x, Loc loc = Loc::current());
Tensor atan(const Tensor& x, Loc loc = Loc::current());
Tensor asinh(const Tensor& x, Loc loc = Loc::current());
Tensor acosh(const Tensor& x, Loc loc = Loc::current());
Tensor atanh(const Tensor& x, Loc loc = Loc::current());
Tensor erfinv(const Tensor& x, Loc loc = Loc::current());  // NaN outside [-1, 1]
Tensor erfc(const Tensor& x, Loc loc = Loc::current());    // 1 - erf(x), accurate in the tail
Tensor lgamma(const Tensor& x, Loc loc = Loc::current());  // log |Gamma(x)|
Tensor digamma(const Tensor& x, Loc loc = Loc::current());
// The n-th derivative of digamma (n = 0: digamma); n < 0 is an Error.
Tensor polygamma(int64_t n, const Tensor& x, Loc loc = Loc::current());
// ---- classification (bool results; integers are always finite) --------------------------
Tensor isinf(const Tensor& x, Loc loc = Loc::current());
Tensor isfinite(const Tensor& x, Loc loc = Loc::current());
// NaN, +inf and -inf replaced, as numpy.nan_to_num: by default 0 and the dtype's largest and
// lowest finite values. Integers come back unchanged.
struct NanToNum {
  double nan = 0.0;
  std::optional<double> posinf;
  std::optional<double> neginf;
};
Tensor nan_to_num(const Tensor& x, const NanToNum& options = {}, Loc loc = Loc::current());

// ---- binary -----------------------------------------------------------------------------
// Floats and integers; an integer zero divisor raises Error (like div).
Tensor remainder(const Tensor& a, const Tensor& b, Loc loc = Loc::current());  // sign of b
Tensor fmod(const Tensor& a, const Tensor& b, Loc loc = Loc::current());       // sign of a
Tensor floor_divide(const Tensor& a, const Tensor& b, Loc loc = Loc::current());
// Floating results.
Tensor atan2(const Tensor& a, const Tensor& b, Loc loc = Loc::current());
Tensor hypot(const Tensor& a, const Tensor& b, Loc loc = Loc::current());
Tensor copysign(const Tensor& a, const Tensor& b, Loc loc = Loc::current());
Tensor logaddexp(const Tensor& a, const Tensor& b, Loc loc = Loc::current());
// x log(y), and 0 where x == 0 (also for y == 0; NaN y stays NaN), as scipy.special.xlogy; JAX's
// derivative (log(y) and x / y, also at x == 0).
Tensor xlogy(const Tensor& x, const Tensor& y, Loc loc = Loc::current());

// ---- comparison with a tolerance (numpy.isclose's rule) ----------------------------------
struct Closeness {
  double rtol = 1e-5;
  double atol = 1e-8;
  bool equal_nan = false;  // NaN counts as close to NaN
};
// |a - b| <= atol + rtol |b| elementwise (bool; a and b broadcast); infinities close only to
// themselves.
Tensor isclose(const Tensor& a, const Tensor& b, const Closeness& tolerance = {},
               Loc loc = Loc::current());
// all(isclose(a, b)): a 0-d bool tensor (traceable, as JAX's allclose).
Tensor allclose(const Tensor& a, const Tensor& b, const Closeness& tolerance = {},
                Loc loc = Loc::current());
// log(1 + exp(x)) and log(sigmoid(x)) = -softplus(-x), stable for every x.
Tensor softplus(const Tensor& x, Loc loc = Loc::current());
Tensor log_sigmoid(const Tensor& x, Loc loc = Loc::current());

// ---- bitwise (integer and bool dtypes; shifts integers only) -----------------------------
Tensor bitwise_and(const Tensor& a, const Tensor& b, Loc loc = Loc::current());
Tensor bitwise_or(const Tensor& a, const Tensor& b, Loc loc = Loc::current());
Tensor bitwise_xor(const Tensor& a, const Tensor& b, Loc loc = Loc::current());
Tensor bitwise_not(const Tensor& x, Loc loc = Loc::current());
// Counts outside [0, bits) shift every bit out: 0, or -1 for right shifts of negative values.
Tensor left_shift(const Tensor& a, const Tensor& b, Loc loc = Loc::current());
Tensor right_shift(const Tensor& a, const Tensor& b, Loc loc = Loc::current());

}  // namespace kiln
