// vector_loops.h's AVX-512 loops; CMake compiles this file alone with -mavx512f -mfma.
#include "math/vector_loops_impl.h"

namespace kiln::math {
KILN_VECTOR_LOOPS(avx512_f32, float, __m512, 16, _mm512_loadu_ps, _mm512_storeu_ps)
KILN_VECTOR_LOOPS(avx512_f64, double, __m512d, 8, _mm512_loadu_pd, _mm512_storeu_pd)
}  // namespace kiln::math
