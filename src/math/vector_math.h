// Vectorised transcendental functions: one table of functions within about 1 ulp per function,
// dtype and instruction set (SLEEF's 1.0-ulp "u10" ones, and Kiln's own float32 exp and tanh,
// fast_math.h), chosen at run time from the host CPU's features (never
// from build flags: the library runs on AMD and Intel machines with and without AVX-512).
// Eager kernels call apply(); the LLVM code generator reads host_functions() and calls the
// same symbols, so eager and compiled code run the same algorithms.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/dtype.h"

namespace kiln::math {

// Instruction sets with a SLEEF variant, in increasing order of capability: sse4 needs
// SSE4.1, avx2 needs AVX2 and FMA, avx512 needs AVX512F.
enum class Isa { scalar, sse4, avx2, avx512 };
std::string_view isa_name(Isa isa);
// What the CPU (and the OS's saved register state) supports.
Isa detected_isa();
// The instruction set the kernels use: detected_isa(), lowered by the environment variable
// KILN_ISA=scalar|sse4|avx2|avx512 (to test every path on one machine). A KILN_ISA above what
// the CPU supports is capped at detected_isa(); an unknown name is an Error. Read once.
Isa host_isa();
// The instruction set KILN_ISA=`value` selects on a CPU supporting `detected`.
Isa isa_from_env(std::optional<std::string_view> value, Isa detected);

enum class MathFn { exp, log, log1p, expm1, sin, cos, tan, tanh, erf, pow };
inline constexpr MathFn kMathFns[] = {MathFn::exp, MathFn::log, MathFn::log1p, MathFn::expm1,
                                      MathFn::sin, MathFn::cos, MathFn::tan,   MathFn::tanh,
                                      MathFn::erf, MathFn::pow};
std::string_view fn_name(MathFn fn);
int arity(MathFn fn);  // 2 for pow, 1 otherwise

// A function of the table: its symbol (SLEEF's, in libsleef.so, or Kiln's own) and how many
// elements one call computes.
// Vector variants take and return one vector register (__m128, __m256, __m512, or two of them
// for pow); lanes == 1 is the scalar C function float(float) / double(double).
struct VectorFunction {
  std::string symbol;
  int lanes;
};
// The variant for loops of `isa` and the scalar one for their tails. The scalar variant uses
// FMA exactly where the vector one does (purecfma on avx2/avx512, purec below), so tails and
// loop bodies give the same bits.
struct MathFunctions {
  VectorFunction vector;
  VectorFunction scalar;
};
// dtype float32 or float64 (anything else is an Error).
MathFunctions math_functions(MathFn fn, DType dtype, Isa isa);
inline MathFunctions host_functions(MathFn fn, DType dtype) {
  return math_functions(fn, dtype, host_isa());
}

// Whether the table's function for fn and dtype is Kiln's own (fast_math.h: float32 exp and
// tanh), whose algorithm the code generator emits inline instead of calling it (the same
// operations over the same policy: the same bits).
bool is_own(MathFn fn, DType dtype);

// Every symbol of the table with its address, which the code generator's JIT defines for the
// code it loads (the process's symbol table lacks them when Python loads Kiln with RTLD_LOCAL).
struct SymbolAddress {
  std::string name;
  void* address;
};
std::vector<SymbolAddress> symbols();

// Where SLEEF 3.5.1 differs from C's libm beyond its ulp bound (found by
// tests/test_vector_math.cpp); apply() patches these after the call, and compiled code must
// apply the same selects:
//   `identity_below_normal`: |x| < the smallest normal number gives x (SLEEF returns +0 for the
//     smallest denormals, losing the value and the sign: log1p, tan);
//   `log_above`: x > log_above gives log(x) (SLEEF's log1p overflows to inf above 1e38 in
//     float32 and 1e307 in float64; there x + 1 == x, so log1p(x) = log(x) to the last bit);
//   `libm_on_overflow`: an infinite result from finite arguments is recomputed by C's libm
//     (SLEEF's float64 exp and pow overflow to inf up to 2e-6 below log(DBL_MAX), where the
//     result is still finite: exp(709.7827128) = 1.797e308, pow(DBL_MAX, 1) = DBL_MAX).
struct Patches {
  bool identity_below_normal = false;
  std::optional<double> log_above;
  bool libm_on_overflow = false;
};
Patches patches(MathFn fn, DType dtype);

// out[i] = fn(in[i]) for i < n over contiguous arrays, with host_isa()'s widest variant; the
// tail runs through a zero-padded register, so every element gets the same algorithm whatever
// the array is split into. `in` and `out` may be the same array. Unary functions only.
void apply(MathFn fn, const float* in, float* out, int64_t n);
void apply(MathFn fn, const double* in, double* out, int64_t n);
// out[i] = pow(a[i], b[i]).
void apply_pow(const float* a, const float* b, float* out, int64_t n);
void apply_pow(const double* a, const double* b, double* out, int64_t n);

// The same with an explicit instruction set (tests run every set the CPU supports); an `isa`
// above detected_isa() is an Error, not an illegal instruction.
void apply(Isa isa, MathFn fn, const float* in, float* out, int64_t n);
void apply(Isa isa, MathFn fn, const double* in, double* out, int64_t n);
void apply_pow(Isa isa, const float* a, const float* b, float* out, int64_t n);
void apply_pow(Isa isa, const double* a, const double* b, double* out, int64_t n);

}  // namespace kiln::math
