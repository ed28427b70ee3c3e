#include "ops/row_dots.h"

#include "ops/simd.h"

namespace kiln::ops {
namespace {

using namespace simd;

// The lanes' sum: each half with the other, down to one lane.
KILN_SIMD_INLINE float lanes_sum(F4 v) { return (v[0] + v[2]) + (v[1] + v[3]); }
KILN_SIMD_INLINE float lanes_sum(F8 v) {
  return lanes_sum(__builtin_shufflevector(v, v, 0, 1, 2, 3) +
                   __builtin_shufflevector(v, v, 4, 5, 6, 7));
}
KILN_SIMD_INLINE float lanes_sum(F16 v) {
  return lanes_sum(__builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
                   __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15));
}

// R rows at a time, a vector accumulator each: the rows' loads are independent streams, which
// keeps more of the matrix in flight than one row would. A row's lanes take its elements i
// with the same i mod lanes, the last partial vector zero-filled, whatever R is.
template <typename Vec, int R>
KILN_SIMD_INLINE void rows(const float* w, int64_t ldw, const float* x, float* y, int64_t k,
                           int64_t j) {
  constexpr int64_t L = kLanes<Vec>;
  Vec acc[R] = {};
  int64_t i = 0;
  for (; i + L <= k; i += L) {
    const Vec xv = load<Vec>(x + i);
    for (int r = 0; r < R; ++r) acc[r] += load<Vec>(w + (j + r) * ldw + i) * xv;
  }
  if (i < k) {
    const Vec xv = load<Vec>(x + i, k - i);
    for (int r = 0; r < R; ++r) acc[r] += load<Vec>(w + (j + r) * ldw + i, k - i) * xv;
  }
  for (int r = 0; r < R; ++r) y[j + r] = lanes_sum(acc[r]);
}

template <typename Vec>
KILN_SIMD_INLINE void dots(const float* w, int64_t ldw, const float* x, float* y, int64_t k,
                           int64_t b, int64_t e) {
  int64_t j = b;
  for (; j + 4 <= e; j += 4) rows<Vec, 4>(w, ldw, x, y, k, j);
  for (; j < e; ++j) rows<Vec, 1>(w, ldw, x, y, k, j);
}

#define KILN_ROW_DOTS_VARIANT(suffix, Vec, attributes)                                            \
  attributes void dots_##suffix(const float* w, int64_t ldw, const float* x, float* y, int64_t k, \
                                int64_t b, int64_t e) {                                           \
    dots<Vec>(w, ldw, x, y, k, b, e);                                                             \
  }
KILN_ROW_DOTS_VARIANT(baseline, F4, )
KILN_ROW_DOTS_VARIANT(avx2, F8, __attribute__((target("avx2,fma"))))
KILN_ROW_DOTS_VARIANT(avx512, F16, __attribute__((target("avx512f"))))
#undef KILN_ROW_DOTS_VARIANT

using Variant = void (*)(const float*, int64_t, const float*, float*, int64_t, int64_t, int64_t);

}  // namespace

void row_dots(const float* w, int64_t ldw, const float* x, float* y, int64_t k, int64_t b,
              int64_t e, math::Isa isa) {
  pick<Variant>(isa, dots_baseline, dots_avx2, dots_avx512)(w, ldw, x, y, k, b, e);
}

}  // namespace kiln::ops
