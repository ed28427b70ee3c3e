// fast_math.h's scalar variants with FMA (the avx2 and avx512 variants' twins); CMake compiles
// this file alone with -mfma, and it runs only on CPUs with AVX2 and FMA or AVX-512.
#include "math/fast_math.h"
#include "math/fast_math_impl.h"

using Fused = kiln::math::fast::Scalar<true>;
float kiln_expf1_fma(float x) { return kiln::math::fast::exp(Fused{}, x); }
float kiln_tanhf1_fma(float x) { return kiln::math::fast::tanh(Fused{}, x); }
