// vector_loops.h's AVX2 loops; CMake compiles this file alone with -mavx2 -mfma.
#include "math/vector_loops_impl.h"

namespace kiln::math {
KILN_VECTOR_LOOPS(avx2_f32, float, __m256, 8, _mm256_loadu_ps, _mm256_storeu_ps)
KILN_VECTOR_LOOPS(avx2_f64, double, __m256d, 4, _mm256_loadu_pd, _mm256_storeu_pd)
}  // namespace kiln::math
