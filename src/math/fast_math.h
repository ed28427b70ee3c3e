// Kiln's own float32 exp and tanh, in SLEEF's calling convention (one vector register in and
// out, a scalar twin with the same bits for loop tails), which src/math/vector_math.cpp puts in
// its table in place of SLEEF's: measured 3-5x faster than SLEEF's 1.0-ulp variants on AVX2,
// within 2 ulps (tests/test_vector_math.cpp). The algorithms are in fast_math_impl.h; each
// variant is built in its own file for its instruction set and runs only where
// math::detected_isa() found it. `_fma` scalars contract as the avx2 and avx512 variants do; the
// plain ones as sse4 (no FMA).
#pragma once

#include <immintrin.h>

extern "C" {
float kiln_expf1(float x);
float kiln_tanhf1(float x);
float kiln_expf1_fma(float x);
float kiln_tanhf1_fma(float x);
__m128 kiln_expf4_sse4(__m128 x);
__m128 kiln_tanhf4_sse4(__m128 x);
__m256 kiln_expf8_avx2(__m256 x);
__m256 kiln_tanhf8_avx2(__m256 x);
__m512 kiln_expf16_avx512(__m512 x);
__m512 kiln_tanhf16_avx512(__m512 x);
}
