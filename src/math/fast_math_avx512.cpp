// fast_math.h's AVX-512 variants (with FMA, as kiln_expf1_fma); CMake compiles this file alone
// with -mavx512f -mfma.
// GCC 12's avx512fintrin.h initialises its "undefined" registers from themselves, which
// -Wuninitialized reports at every use of _mm512_max_ps, _mm512_slli_epi32, ...
#pragma GCC diagnostic ignored "-Wuninitialized"

#include "math/fast_math.h"
#include "math/fast_math_impl.h"

namespace {

struct Avx512 {
  using V = __m512;
  using I = __m512i;
  using Mask = __mmask16;
  static V set(float v) { return _mm512_set1_ps(v); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static V sub(V a, V b) { return _mm512_sub_ps(a, b); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V div(V a, V b) { return _mm512_div_ps(a, b); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  // vmaxps and vminps return their second operand when either is NaN.
  static V clamp(V x, V lo, V hi) { return _mm512_min_ps(hi, _mm512_max_ps(lo, x)); }
  static I bits(V v) { return _mm512_castps_si512(v); }
  static V from_bits(I i) { return _mm512_castsi512_ps(i); }
  static V abs(V v) { return from_bits(_mm512_and_epi32(bits(v), _mm512_set1_epi32(0x7fffffff))); }
  static V copysign(V mag, V s) {
    return from_bits(_mm512_ternarylogic_epi32(bits(mag), bits(s), _mm512_set1_epi32(0x7fffffff),
                                               0xe4));  // mask ? mag : s, bit by bit
  }
  static Mask lt(V a, V b) { return _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ); }
  static V select(Mask m, V a, V b) { return _mm512_mask_blend_ps(m, b, a); }
  static I iset(int32_t v) { return _mm512_set1_epi32(v); }
  static I iadd(I a, I b) { return _mm512_add_epi32(a, b); }
  static I isub(I a, I b) { return _mm512_sub_epi32(a, b); }
  static I shl(I a, int n) { return _mm512_slli_epi32(a, static_cast<unsigned>(n)); }
  static I sra(I a, int n) { return _mm512_srai_epi32(a, static_cast<unsigned>(n)); }
  static bool has_scalef() { return true; }
  static V scalef(V y, V n) { return _mm512_scalef_ps(y, n); }
};

}  // namespace

__m512 kiln_expf16_avx512(__m512 x) { return kiln::math::fast::exp(Avx512{}, x); }
__m512 kiln_tanhf16_avx512(__m512 x) { return kiln::math::fast::tanh(Avx512{}, x); }
