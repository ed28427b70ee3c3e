#include "math/vector_math.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "kiln/error.h"
#include "math/fast_math.h"
#include "math/vector_loops.h"

// SLEEF's functions, declared here rather than taken from sleef.h: the header declares the
// AVX2 and AVX-512 variants only in code compiled for those instruction sets, and this file is
// compiled for the baseline (x86-64-v2). Only the loops that call them (vector_loops.h) are
// compiled for more, and they run only where detected_isa() found the instructions.
#define KILN_ONE(T) (T)
#define KILN_TWO(T) (T, T)
#define KILN_SLEEF_DECLARE(name, ARGS)               \
  __m512 Sleef_##name##f16_u10avx512f ARGS(__m512);  \
  __m256 Sleef_##name##f8_u10avx2 ARGS(__m256);      \
  __m128 Sleef_##name##f4_u10sse4 ARGS(__m128);      \
  float Sleef_##name##f1_u10purecfma ARGS(float);    \
  float Sleef_##name##f1_u10purec ARGS(float);       \
  __m512d Sleef_##name##d8_u10avx512f ARGS(__m512d); \
  __m256d Sleef_##name##d4_u10avx2 ARGS(__m256d);    \
  __m128d Sleef_##name##d2_u10sse4 ARGS(__m128d);    \
  double Sleef_##name##d1_u10purecfma ARGS(double);  \
  double Sleef_##name##d1_u10purec ARGS(double);
extern "C" {
KILN_SLEEF_DECLARE(exp, KILN_ONE)
KILN_SLEEF_DECLARE(log, KILN_ONE)
KILN_SLEEF_DECLARE(log1p, KILN_ONE)
KILN_SLEEF_DECLARE(expm1, KILN_ONE)
KILN_SLEEF_DECLARE(sin, KILN_ONE)
KILN_SLEEF_DECLARE(cos, KILN_ONE)
KILN_SLEEF_DECLARE(tan, KILN_ONE)
KILN_SLEEF_DECLARE(tanh, KILN_ONE)
KILN_SLEEF_DECLARE(erf, KILN_ONE)
KILN_SLEEF_DECLARE(pow, KILN_TWO)
}
#undef KILN_SLEEF_DECLARE
#undef KILN_ONE
#undef KILN_TWO

namespace kiln::math {
namespace {

struct Variant {
  const char* symbol;
  int lanes;
  AnyFn fn;
};
// One function in one dtype: the two scalar variants, then the vector ones by Isa.
struct Variants {
  Variant purec, purecfma, sse4, avx2, avx512;
};
struct Row {
  Variants f32, f64;
};

#define KILN_VARIANT(sym, lanes) \
  Variant { #sym, lanes, reinterpret_cast < AnyFn>(&sym) }
#define KILN_SLEEF_F32(name)                                                                   \
  {                                                                                            \
    KILN_VARIANT(Sleef_##name##f1_u10purec, 1), KILN_VARIANT(Sleef_##name##f1_u10purecfma, 1), \
        KILN_VARIANT(Sleef_##name##f4_u10sse4, 4), KILN_VARIANT(Sleef_##name##f8_u10avx2, 8),  \
        KILN_VARIANT(Sleef_##name##f16_u10avx512f, 16)                                         \
  }
#define KILN_SLEEF_F64(name)                                                                   \
  {                                                                                            \
    KILN_VARIANT(Sleef_##name##d1_u10purec, 1), KILN_VARIANT(Sleef_##name##d1_u10purecfma, 1), \
        KILN_VARIANT(Sleef_##name##d2_u10sse4, 2), KILN_VARIANT(Sleef_##name##d4_u10avx2, 4),  \
        KILN_VARIANT(Sleef_##name##d8_u10avx512f, 8)                                           \
  }
#define KILN_SLEEF_ROW(name) \
  Row { KILN_SLEEF_F32(name), KILN_SLEEF_F64(name) }
// float32 exp and tanh are Kiln's own (fast_math.h: as accurate, and faster), float64 SLEEF's.
#define KILN_OWN_F32_ROW(name)                                                     \
  Row {                                                                            \
    {KILN_VARIANT(kiln_##name##f1, 1), KILN_VARIANT(kiln_##name##f1_fma, 1),       \
     KILN_VARIANT(kiln_##name##f4_sse4, 4), KILN_VARIANT(kiln_##name##f8_avx2, 8), \
     KILN_VARIANT(kiln_##name##f16_avx512, 16)},                                   \
        KILN_SLEEF_F64(name)                                                       \
  }
// Indexed by MathFn.
const Row kTable[] = {KILN_OWN_F32_ROW(exp), KILN_SLEEF_ROW(log),    KILN_SLEEF_ROW(log1p),
                      KILN_SLEEF_ROW(expm1), KILN_SLEEF_ROW(sin),    KILN_SLEEF_ROW(cos),
                      KILN_SLEEF_ROW(tan),   KILN_OWN_F32_ROW(tanh), KILN_SLEEF_ROW(erf),
                      KILN_SLEEF_ROW(pow)};
#undef KILN_OWN_F32_ROW
#undef KILN_SLEEF_ROW
#undef KILN_SLEEF_F64
#undef KILN_SLEEF_F32
#undef KILN_VARIANT
static_assert(std::size(kTable) == std::size(kMathFns));

template <typename T>
const Variants& variants(MathFn fn) {
  const Row& row = kTable[static_cast<int>(fn)];
  if constexpr (std::is_same_v<T, float>)
    return row.f32;
  else
    return row.f64;
}
const Variant& vector_variant(const Variants& v, Isa isa) {
  switch (isa) {
    case Isa::scalar:
      return v.purec;
    case Isa::sse4:
      return v.sse4;
    case Isa::avx2:
      return v.avx2;
    case Isa::avx512:
      return v.avx512;
  }
  return v.purec;
}
// The scalar variant contracts with FMA where the vector one does: SSE4.1 has no FMA.
const Variant& scalar_variant(const Variants& v, Isa isa) {
  return isa >= Isa::avx2 ? v.purecfma : v.purec;
}

// The loops over contiguous arrays: scalar ones here, vector ones in vector_loops.h.
template <typename T>
using UnaryLoop = void (*)(AnyFn, const T*, T*, int64_t);
template <typename T>
using BinaryLoop = void (*)(AnyFn, const T*, const T*, T*, int64_t);

template <typename T>
void scalar_unary(AnyFn f, const T* in, T* out, int64_t n) {
  const auto fn = reinterpret_cast<T (*)(T)>(f);
  for (int64_t i = 0; i < n; ++i) out[i] = fn(in[i]);
}
template <typename T>
void scalar_binary(AnyFn f, const T* a, const T* b, T* out, int64_t n) {
  const auto fn = reinterpret_cast<T (*)(T, T)>(f);
  for (int64_t i = 0; i < n; ++i) out[i] = fn(a[i], b[i]);
}

template <typename T>
UnaryLoop<T> unary_loop(Isa isa) {
  constexpr bool f32 = std::is_same_v<T, float>;
  switch (isa) {
    case Isa::scalar:
      return scalar_unary<T>;
    case Isa::sse4:
      if constexpr (f32)
        return unary_sse4_f32;
      else
        return unary_sse4_f64;
    case Isa::avx2:
      if constexpr (f32)
        return unary_avx2_f32;
      else
        return unary_avx2_f64;
    case Isa::avx512:
      if constexpr (f32)
        return unary_avx512_f32;
      else
        return unary_avx512_f64;
  }
  return scalar_unary<T>;
}
template <typename T>
BinaryLoop<T> binary_loop(Isa isa) {
  constexpr bool f32 = std::is_same_v<T, float>;
  switch (isa) {
    case Isa::scalar:
      return scalar_binary<T>;
    case Isa::sse4:
      if constexpr (f32)
        return binary_sse4_f32;
      else
        return binary_sse4_f64;
    case Isa::avx2:
      if constexpr (f32)
        return binary_avx2_f32;
      else
        return binary_avx2_f64;
    case Isa::avx512:
      if constexpr (f32)
        return binary_avx512_f32;
      else
        return binary_avx512_f64;
  }
  return scalar_binary<T>;
}

void check_isa(Isa isa) {
  if (isa > detected_isa())
    fail("vector_math", "instruction set not supported by this CPU: got ", isa_name(isa),
         ", expected at most ", isa_name(detected_isa()));
}

template <typename T>
DType dtype_of() {
  return std::is_same_v<T, float> ? float32 : float64;
}

// Elements per block when a function needs its inputs again after the call (patches).
constexpr int64_t kBlock = 256;

// C's libm, for the few arguments where SLEEF's result is patched (Patches::libm_on_overflow).
template <typename T>
T libm(MathFn fn, T x, T y) {
  switch (fn) {
    case MathFn::exp:
      return std::exp(x);
    case MathFn::pow:
      return std::pow(x, y);
    default:
      return std::numeric_limits<T>::quiet_NaN();
  }
}

bool patched(const Patches& p) {
  return p.identity_below_normal || p.log_above || p.libm_on_overflow;
}

template <typename T>
void apply_unary(Isa isa, MathFn fn, const T* in, T* out, int64_t n) {
  check_isa(isa);
  if (arity(fn) != 1)
    fail("vector_math", "apply takes unary functions: got ", fn_name(fn), ", expected apply_pow");
  const AnyFn f = vector_variant(variants<T>(fn), isa).fn;
  const UnaryLoop<T> loop = unary_loop<T>(isa);
  const Patches p = patches(fn, dtype_of<T>());
  if (!patched(p)) {
    loop(f, in, out, n);
    return;
  }
  const auto log = reinterpret_cast<T (*)(T)>(scalar_variant(variants<T>(MathFn::log), isa).fn);
  // `out` may alias `in`: each block keeps a copy of its inputs for the patches.
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t m = std::min(kBlock, n - b);
    T x[kBlock];
    std::copy(in + b, in + b + m, x);
    loop(f, x, out + b, m);
    for (int64_t k = 0; k < m; ++k) {
      T& r = out[b + k];
      if (p.identity_below_normal && std::fabs(x[k]) < std::numeric_limits<T>::min())
        r = x[k];
      else if (p.log_above && x[k] > *p.log_above)
        r = log(x[k]);
      else if (p.libm_on_overflow && std::isinf(r) && std::isfinite(x[k]))
        r = libm(fn, x[k], T{});
    }
  }
}

template <typename T>
void apply_binary(Isa isa, const T* a, const T* b, T* out, int64_t n) {
  check_isa(isa);
  const AnyFn f = vector_variant(variants<T>(MathFn::pow), isa).fn;
  const BinaryLoop<T> loop = binary_loop<T>(isa);
  const Patches p = patches(MathFn::pow, dtype_of<T>());
  if (!patched(p)) {
    loop(f, a, b, out, n);
    return;
  }
  for (int64_t s = 0; s < n; s += kBlock) {
    const int64_t m = std::min(kBlock, n - s);
    T x[kBlock], y[kBlock];
    std::copy(a + s, a + s + m, x);
    std::copy(b + s, b + s + m, y);
    loop(f, x, y, out + s, m);
    for (int64_t k = 0; k < m; ++k) {
      T& r = out[s + k];
      if (std::isinf(r) && std::isfinite(x[k]) && std::isfinite(y[k]))
        r = libm(MathFn::pow, x[k], y[k]);
    }
  }
}

}  // namespace

std::string_view isa_name(Isa isa) {
  switch (isa) {
    case Isa::scalar:
      return "scalar";
    case Isa::sse4:
      return "sse4";
    case Isa::avx2:
      return "avx2";
    case Isa::avx512:
      return "avx512";
  }
  return "?";
}

Isa detected_isa() {
  // libgcc's CPU model checks the OS's saved register state (XCR0) too: AVX-512 counts only
  // where the kernel saves the zmm registers.
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return Isa::avx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Isa::avx2;
  if (__builtin_cpu_supports("sse4.1")) return Isa::sse4;
  return Isa::scalar;
}

Isa isa_from_env(std::optional<std::string_view> value, Isa detected) {
  if (!value || value->empty()) return detected;
  for (Isa isa : {Isa::scalar, Isa::sse4, Isa::avx2, Isa::avx512})
    if (*value == isa_name(isa)) return std::min(isa, detected);
  fail("vector_math", "unknown instruction set in KILN_ISA: got '", *value,
       "', expected scalar, sse4, avx2 or avx512");
}

Isa host_isa() {
  static const Isa isa = [] {
    const char* v = std::getenv("KILN_ISA");
    return isa_from_env(v ? std::optional<std::string_view>(v) : std::nullopt, detected_isa());
  }();
  return isa;
}

std::string_view fn_name(MathFn fn) {
  switch (fn) {
    case MathFn::exp:
      return "exp";
    case MathFn::log:
      return "log";
    case MathFn::log1p:
      return "log1p";
    case MathFn::expm1:
      return "expm1";
    case MathFn::sin:
      return "sin";
    case MathFn::cos:
      return "cos";
    case MathFn::tan:
      return "tan";
    case MathFn::tanh:
      return "tanh";
    case MathFn::erf:
      return "erf";
    case MathFn::pow:
      return "pow";
  }
  return "?";
}

int arity(MathFn fn) { return fn == MathFn::pow ? 2 : 1; }

MathFunctions math_functions(MathFn fn, DType dtype, Isa isa) {
  if (dtype != float32 && dtype != float64)
    fail("vector_math", "no vector function for this dtype: got ", dtype_name(dtype),
         ", expected f32 or f64");
  const Row& row = kTable[static_cast<int>(fn)];
  const Variants& v = dtype == float32 ? row.f32 : row.f64;
  const Variant& vec = vector_variant(v, isa);
  const Variant& tail = scalar_variant(v, isa);
  return {{vec.symbol, vec.lanes}, {tail.symbol, tail.lanes}};
}

bool is_own(MathFn fn, DType dtype) {
  if (dtype != float32 && dtype != float64) return false;
  const Row& row = kTable[static_cast<int>(fn)];
  return std::string_view((dtype == float32 ? row.f32 : row.f64).avx2.symbol).starts_with("kiln_");
}

std::vector<SymbolAddress> symbols() {
  std::vector<SymbolAddress> out;
  for (const Row& row : kTable)
    for (const Variants* v : {&row.f32, &row.f64})
      for (const Variant* x : {&v->purec, &v->purecfma, &v->sse4, &v->avx2, &v->avx512})
        out.push_back({x->symbol, reinterpret_cast<void*>(x->fn)});
  return out;
}

Patches patches(MathFn fn, DType dtype) {
  switch (fn) {
    case MathFn::log1p:
      // Above these x + 1 rounds to x in the dtype, and SLEEF's thresholds (1e38, 1e307)
      // lie above them.
      return {.identity_below_normal = true, .log_above = dtype == float32 ? 1e37 : 1e306};
    case MathFn::tan:
      return {.identity_below_normal = true};
    case MathFn::exp:
    case MathFn::pow:
      return {.libm_on_overflow = dtype == float64};
    default:
      return {};
  }
}

void apply(MathFn fn, const float* in, float* out, int64_t n) {
  apply_unary(host_isa(), fn, in, out, n);
}
void apply(MathFn fn, const double* in, double* out, int64_t n) {
  apply_unary(host_isa(), fn, in, out, n);
}
void apply_pow(const float* a, const float* b, float* out, int64_t n) {
  apply_binary(host_isa(), a, b, out, n);
}
void apply_pow(const double* a, const double* b, double* out, int64_t n) {
  apply_binary(host_isa(), a, b, out, n);
}
void apply(Isa isa, MathFn fn, const float* in, float* out, int64_t n) {
  apply_unary(isa, fn, in, out, n);
}
void apply(Isa isa, MathFn fn, const double* in, double* out, int64_t n) {
  apply_unary(isa, fn, in, out, n);
}
void apply_pow(Isa isa, const float* a, const float* b, float* out, int64_t n) {
  apply_binary(isa, a, b, out, n);
}
void apply_pow(Isa isa, const double* a, const double* b, double* out, int64_t n) {
  apply_binary(isa, a, b, out, n);
}

}  // namespace kiln::math
