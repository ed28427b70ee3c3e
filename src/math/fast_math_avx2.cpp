// fast_math.h's AVX2 variants (with FMA, as kiln_expf1_fma); CMake compiles this
// file alone with -mavx2 -mfma.
#include "math/fast_math.h"
#include "math/fast_math_impl.h"

namespace {

struct Avx2 {
  using V = __m256;
  using I = __m256i;
  using Mask = __m256;
  static V set(float v) { return _mm256_set1_ps(v); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V sub(V a, V b) { return _mm256_sub_ps(a, b); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V div(V a, V b) { return _mm256_div_ps(a, b); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  // maxps and minps return their second operand when either is NaN.
  static V clamp(V x, V lo, V hi) { return _mm256_min_ps(hi, _mm256_max_ps(lo, x)); }
  static V abs(V v) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v); }
  static V copysign(V mag, V s) {
    const V sign = _mm256_set1_ps(-0.0f);
    return _mm256_or_ps(_mm256_andnot_ps(sign, mag), _mm256_and_ps(sign, s));
  }
  static Mask lt(V a, V b) { return _mm256_cmp_ps(a, b, _CMP_LT_OQ); }
  static V select(Mask m, V a, V b) { return _mm256_blendv_ps(b, a, m); }
  static I bits(V v) { return _mm256_castps_si256(v); }
  static V from_bits(I i) { return _mm256_castsi256_ps(i); }
  static I iset(int32_t v) { return _mm256_set1_epi32(v); }
  static I iadd(I a, I b) { return _mm256_add_epi32(a, b); }
  static I isub(I a, I b) { return _mm256_sub_epi32(a, b); }
  static I shl(I a, int n) { return _mm256_slli_epi32(a, n); }
  static I sra(I a, int n) { return _mm256_srai_epi32(a, n); }
};

}  // namespace

__m256 kiln_expf8_avx2(__m256 x) { return kiln::math::fast::exp(Avx2{}, x); }
__m256 kiln_tanhf8_avx2(__m256 x) { return kiln::math::fast::tanh(Avx2{}, x); }
