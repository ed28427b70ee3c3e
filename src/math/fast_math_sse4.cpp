// fast_math.h's SSE4.1 variants (no FMA: a * b + c rounds twice, as kiln_expf1 does); CMake
// compiles this file alone with -msse4.1.
#include "math/fast_math.h"
#include "math/fast_math_impl.h"

namespace {

struct Sse4 {
  using V = __m128;
  using I = __m128i;
  using Mask = __m128;
  static V set(float v) { return _mm_set1_ps(v); }
  static V add(V a, V b) { return _mm_add_ps(a, b); }
  static V sub(V a, V b) { return _mm_sub_ps(a, b); }
  static V mul(V a, V b) { return _mm_mul_ps(a, b); }
  static V div(V a, V b) { return _mm_div_ps(a, b); }
  static V fma(V a, V b, V c) { return _mm_add_ps(_mm_mul_ps(a, b), c); }
  // maxps and minps return their second operand when either is NaN.
  static V clamp(V x, V lo, V hi) { return _mm_min_ps(hi, _mm_max_ps(lo, x)); }
  static V abs(V v) { return _mm_andnot_ps(_mm_set1_ps(-0.0f), v); }
  static V copysign(V mag, V s) {
    const V sign = _mm_set1_ps(-0.0f);
    return _mm_or_ps(_mm_andnot_ps(sign, mag), _mm_and_ps(sign, s));
  }
  static Mask lt(V a, V b) { return _mm_cmplt_ps(a, b); }
  static V select(Mask m, V a, V b) { return _mm_blendv_ps(b, a, m); }
  static I bits(V v) { return _mm_castps_si128(v); }
  static V from_bits(I i) { return _mm_castsi128_ps(i); }
  static I iset(int32_t v) { return _mm_set1_epi32(v); }
  static I iadd(I a, I b) { return _mm_add_epi32(a, b); }
  static I isub(I a, I b) { return _mm_sub_epi32(a, b); }
  static I shl(I a, int n) { return _mm_slli_epi32(a, n); }
  static I sra(I a, int n) { return _mm_srai_epi32(a, n); }
};

}  // namespace

__m128 kiln_expf4_sse4(__m128 x) { return kiln::math::fast::exp(Sse4{}, x); }
__m128 kiln_tanhf4_sse4(__m128 x) { return kiln::math::fast::tanh(Sse4{}, x); }
