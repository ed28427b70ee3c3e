// vector_loops.h's SSE4.1 loops; CMake compiles this file alone with -msse4.1.
#include "math/vector_loops_impl.h"

namespace kiln::math {
KILN_VECTOR_LOOPS(sse4_f32, float, __m128, 4, _mm_loadu_ps, _mm_storeu_ps)
KILN_VECTOR_LOOPS(sse4_f64, double, __m128d, 2, _mm_loadu_pd, _mm_storeu_pd)
}  // namespace kiln::math
