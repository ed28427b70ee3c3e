// Comparing a compiled backend's results with the interpreter's (docs/DESIGN.md, "Compiler",
// Correctness): the rules every compiled-vs-interpreted test uses, and the edge values they
// feed both backends.
//
//   exact        integers and bool, and float ops that IEEE 754 defines to the bit (add, sub,
//                mul, div, sqrt, min/max, compare, select, convert, rounding, layout, gather):
//                equal bits, except that any NaN matches any NaN (payloads may differ);
//   ulps         transcendental functions (exp, log, log1p, expm1, sin, cos, tan, tanh,
//                sigmoid, erf, pow, rsqrt): within kTranscendentalUlps of each other in the
//                result's own dtype, +0 and -0 one ulp apart;
//   reduction    reduce_sum / reduce_prod and what adds many terms (the interpreter sums float32
//                in double, the compiler in float32 lane accumulators, in another order):
//                |got - want| <= n * eps(dtype) * m + n * denorm_min(dtype), per element, with
//                n the number of terms and m the sum (product) of their magnitudes;
//   program      whole programs mixing the above: |got - want| <= kProgramUlps * eps *
//                (|want| + max(1, max |want| over the result)), eps that of the least precise
//                float dtype the program computes in.
// Everywhere: NaN where the reference has NaN, the same infinity where it has one.
#pragma once

#include <kiln/kiln.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "sanitizers.h"

namespace kiln::testing {

// Sanitizer and Debug builds run 10-50x slower: the compiled-vs-interpreted tests check
// fewer cases there (CI runs every test under ASan/UBSan too).
#if defined(KILN_TEST_ASAN) || defined(KILN_TEST_TSAN) || !defined(NDEBUG)
inline constexpr bool kSlowBuild = true;
#else
inline constexpr bool kSlowBuild = false;
#endif

// The bound for transcendental functions, between two implementations each within 1 ulp
// of the exact value (SLEEF's 1.0-ulp functions vs libm), in ulps of the result's dtype.
inline constexpr int64_t kTranscendentalUlps = 2;
// The bound for random programs: how far rounding differences (reassociated sums, 2-ulp
// transcendentals) may grow through a few dozen well-conditioned operations.
inline constexpr double kProgramUlps = 512;

enum class Rule { exact, ulps, reduction, program };
std::string rule_name(Rule r);

struct Tolerance {
  Rule rule = Rule::exact;
  // reduction: per element of the result, the magnitude m of its terms (float64, the
  // result's shape) and the number of terms n.
  std::optional<Tensor> magnitude;
  int64_t terms = 1;
  // program: the dtype whose epsilon the bound uses, the least precise float dtype the
  // program computes in (a float32 computation converted to a float64 result carries
  // float32 rounding); unset: the result's dtype.
  std::optional<DType> precision;
};

// Distance in units in the last place between two values of a floating dtype (as doubles
// holding values of that dtype), on the ordered line of that dtype's values where -0 and +0
// are neighbours. Infinite distance (INT64_MAX) when exactly one is NaN.
int64_t ulp_distance(double a, double b, DType dtype);
// The same bits, NaN matching any NaN: the exact rule on one element.
bool same_value(double a, double b);

// Empty when `got` matches `want` under `tol`; else a message naming the first element that
// does not (its index, both values and the bound). Types must be equal.
std::optional<std::string> compare(const Tensor& got, const Tensor& want, const Tolerance& tol);

// ---- edge values ------------------------------------------------------------------------

// The edge values of a dtype: for floats +-0, +-inf, NaN, the smallest denormal and a
// larger one, the smallest normal, +-1, and (unless `tame`) the largest finite values; for
// integers 0, +-1, min and max; for bool both. `tame` leaves out values whose sums or
// products overflow in an order-dependent way (for reductions and whatever adds many terms).
std::vector<double> edge_values(DType dtype, bool tame = false);
// A tensor of the given type filled with edge values, cycled from `offset`, so that several
// inputs filled with different offsets meet every value in combination.
Tensor edge_tensor(const TensorType& type, int64_t offset, bool tame = false);

// A value drawn as float64 (the sample table's draws) in another dtype, spread over that
// dtype's range: floats are converted, integers are round(4x) (|.| for unsigned), bool x > 0.
Tensor cast_draw(const Tensor& x, DType dtype);

// The same values in a non-contiguous view: every other element of a larger buffer, or a
// transposed copy transposed back (`transposed`). Tensors of fewer than 2 elements return as
// they are (no layout to vary).
Tensor strided_view(const Tensor& x);
Tensor transposed_view(const Tensor& x);

// Every element as a double, through any view (for reporting and comparing).
std::vector<double> values_of(const Tensor& t);

}  // namespace kiln::testing
