#include "ops/pool_direct.h"

#include <algorithm>
#include <utility>

#include "ops/simd.h"

namespace kiln::ops {
namespace {

using namespace simd;
#define KILN_INLINE KILN_SIMD_INLINE

// Lanes 0, 2, 4, ... (or 1, 3, 5, ...) of a followed by b's.
template <typename Vec, std::size_t... I>
KILN_INLINE Vec even_lanes(Vec a, Vec b, std::index_sequence<I...>) {
  return __builtin_shufflevector(a, b, (2 * I)...);
}
template <typename Vec, std::size_t... I>
KILN_INLINE Vec odd_lanes(Vec a, Vec b, std::index_sequence<I...>) {
  return __builtin_shufflevector(a, b, (2 * I + 1)...);
}
// e[0], o[0], e[1], o[1], ... from lane `from` of e and o on.
template <typename Vec, std::size_t From, std::size_t... I>
KILN_INLINE Vec interleave(Vec e, Vec o, std::index_sequence<I...>) {
  return __builtin_shufflevector(e, o, (I % 2 ? kLanes<Vec> + From + I / 2 : From + I / 2)...);
}

// Which of the four elements each window picks (0, 1: row 0's even and odd column; 2, 3: row
// 1's): the first maximum by `>`, then the last NaN.
template <typename Vec>
KILN_INLINE Bits<Vec> choice(const Vec (&v)[4]) {
  using B = Bits<Vec>;
  Vec m = v[0];
  B k = {};
  for (int j = 1; j < 4; ++j) {
    const B take = v[j] > m;
    k = (take & j) | (~take & k);
    m = (Vec)((take & (B)v[j]) | (~take & (B)m));
  }
  for (int j = 0; j < 4; ++j) {
    const B nan = v[j] != v[j];
    k = (nan & j) | (~nan & k);
  }
  return k;
}

// The four elements of windows [ow, ow + lanes) of rows r0 and r1.
template <typename Vec>
KILN_INLINE void window_elements(const float* r0, const float* r1, int64_t ow, Vec (&v)[4]) {
  constexpr auto half = std::make_index_sequence<kLanes<Vec>>{};
  const float* rows[2] = {r0 + 2 * ow, r1 + 2 * ow};
  for (int r = 0; r < 2; ++r) {
    const Vec a = load<Vec>(rows[r]), b = load<Vec>(rows[r] + kLanes<Vec>);
    v[2 * r] = even_lanes(a, b, half);
    v[2 * r + 1] = odd_lanes(a, b, half);
  }
}

// The forward needs the chosen value only, not which element it is: the same selections as
// choice's, without the index.
template <typename Vec>
KILN_INLINE Vec chosen(const Vec (&v)[4]) {
  using B = Bits<Vec>;
  B m = (B)v[0];
  for (int j = 1; j < 4; ++j) {
    const B take = v[j] > (Vec)m;
    m = (take & (B)v[j]) | (~take & m);
  }
  for (int j = 0; j < 4; ++j) {
    const B nan = v[j] != v[j];
    m = (nan & (B)v[j]) | (~nan & m);
  }
  return (Vec)m;
}

template <typename Vec>
KILN_INLINE void forward_windows(const float* r0, const float* r1, float* y, int64_t ow) {
  Vec v[4];
  window_elements(r0, r1, ow, v);
  store(y + ow, chosen(v));
}

template <typename Vec>
KILN_INLINE void grad_windows(const float* r0, const float* r1, const float* dy, float* d0,
                              float* d1, int64_t ow) {
  using B = Bits<Vec>;
  constexpr int64_t L = kLanes<Vec>;
  constexpr auto all = std::make_index_sequence<L>{};
  Vec v[4];
  window_elements(r0, r1, ow, v);
  const B k = choice(v), g = (B)load<Vec>(dy + ow);
  Vec out[4];
  for (int j = 0; j < 4; ++j) out[j] = (Vec)((k == j) & g);
  float* rows[2] = {d0 + 2 * ow, d1 + 2 * ow};
  for (int r = 0; r < 2; ++r) {
    store(rows[r], interleave<Vec, 0>(out[2 * r], out[2 * r + 1], all));
    store(rows[r] + L, interleave<Vec, L / 2>(out[2 * r], out[2 * r + 1], all));
  }
}

template <bool Grad, typename Vec>
KILN_INLINE void windows(const float* r0, const float* r1, const float* dy, float* out0,
                         float* out1, int64_t ow) {
  if constexpr (Grad) {
    grad_windows<Vec>(r0, r1, dy, out0, out1, ow);
  } else {
    forward_windows<Vec>(r0, r1, out0, ow);
  }
}

// Windows [0, OW) of one row pair in vectors of Vec's lanes: a row's last vector, when OW is no
// multiple of them, ends at OW and overlaps the one before (its windows computed again, to the
// same values). A row narrower than a vector takes one whole vector where `spill` says that
// the memory past the row may be read and written over: the lanes past OW read the next rows
// and write values that the rows after it overwrite (planes() runs the rows in order). Other
// narrow rows go to the next narrower vector, then one window at a time.
template <bool Grad, typename Vec>
KILN_INLINE void row(const float* r0, const float* r1, const float* dy, float* out0, float* out1,
                     int64_t OW, bool spill) {
  constexpr int64_t L = kLanes<Vec>;
  if (OW < L && spill) return windows<Grad, Vec>(r0, r1, dy, out0, out1, 0);
  if (OW < L) {
    if constexpr (L > 4) {
      row<Grad, typename std::conditional_t<L == 16, F8, F4>>(r0, r1, dy, out0, out1, OW, false);
    } else {
      for (int64_t ow = 0; ow < OW; ++ow) {  // the same choice, one window
        const float v[4] = {r0[2 * ow], r0[2 * ow + 1], r1[2 * ow], r1[2 * ow + 1]};
        int k = 0;
        float m = v[0];
        for (int j = 1; j < 4; ++j)
          if (v[j] > m) k = j, m = v[j];
        for (int j = 0; j < 4; ++j)
          if (v[j] != v[j]) k = j;
        if constexpr (Grad) {
          for (int j = 0; j < 4; ++j) (j < 2 ? out0 : out1)[2 * ow + j % 2] = j == k ? dy[ow] : 0;
        } else {
          out0[ow] = v[k];
        }
      }
    }
    return;
  }
  int64_t ow = 0;
  for (; ow + L <= OW; ow += L) windows<Grad, Vec>(r0, r1, dy, out0, out1, ow);
  if (ow < OW) windows<Grad, Vec>(r0, r1, dy, out0, out1, OW - L);
}

// Planes [b, e) in order, row pair by row pair. A narrow row spills a vector past its end (see
// row()) while the range has a vector of outputs (of dY for the gradient) from the row's own on:
// then it has the memory to spill into, the rows after it write every value spilled there, and
// x, and dX laid out as x, have the 2 * L values past the pair's second row that a vector of
// windows covers (four inputs per output: 4 * L - W > 2 * L, as W <= 2 * OW + 1 < 2 * L).
template <bool Grad, typename Vec>
KILN_INLINE void planes(const Planes2x2& g, const float* x, const float* dy, float* out, int64_t b,
                        int64_t e) {
  constexpr int64_t L = kLanes<Vec>;
  const int64_t HW = g.H * g.W, OH = g.OH(), OW = g.OW(), OHW = OH * OW;
  const int64_t windows_end = e * OHW;
  for (int64_t p = b; p < e; ++p) {
    const float* plane = x + p * HW;
    for (int64_t oh = 0; oh < OH; ++oh) {
      const float* r0 = plane + 2 * oh * g.W;
      const int64_t w = p * OHW + oh * OW;  // the row's first window
      const bool spill = windows_end - w >= L;
      if constexpr (Grad) {
        float* d0 = out + p * HW + 2 * oh * g.W;
        row<true, Vec>(r0, r0 + g.W, dy + w, d0, d0 + g.W, OW, spill);
        if (g.W % 2) d0[g.W - 1] = d0[2 * g.W - 1] = 0;  // the odd last column
      } else {
        row<false, Vec>(r0, r0 + g.W, nullptr, out + w, nullptr, OW, spill);
      }
    }
    if (Grad && g.H % 2) std::fill_n(out + p * HW + (g.H - 1) * g.W, g.W, 0.0f);
  }
}

// One block of `b` channels, [H, W, b] (b a multiple of Vec's lanes): a window's four elements
// are four vectors of channels, and each channel gets the plane kernels' choice.
template <bool Grad, typename Vec>
KILN_INLINE void block(const Planes2x2& g, int64_t b, const float* x, const float* dy, float* out) {
  constexpr int64_t L = kLanes<Vec>;
  const int64_t OH = g.OH(), OW = g.OW(), row = g.W * b;
  for (int64_t oh = 0; oh < OH; ++oh) {
    for (int64_t ow = 0; ow < OW; ++ow)
      for (int64_t i = 0; i < b; i += L) {
        const int64_t at[4] = {2 * oh * row + 2 * ow * b + i, 2 * oh * row + (2 * ow + 1) * b + i,
                               (2 * oh + 1) * row + 2 * ow * b + i,
                               (2 * oh + 1) * row + (2 * ow + 1) * b + i};
        Vec v[4];
        for (int j = 0; j < 4; ++j) v[j] = load<Vec>(x + at[j]);
        const int64_t w = (oh * OW + ow) * b + i;
        if constexpr (Grad) {
          const Bits<Vec> k = choice(v), d = (Bits<Vec>)load<Vec>(dy + w);
          for (int j = 0; j < 4; ++j) store(out + at[j], (Vec)((k == j) & d));
        } else {
          store(out + w, chosen(v));
        }
      }
    if (Grad && g.W % 2)  // the odd last column is in no window
      for (int64_t h = 2 * oh; h < 2 * oh + 2; ++h) std::fill_n(out + h * row + row - b, b, 0.0f);
  }
  if (Grad && g.H % 2) std::fill_n(out + (g.H - 1) * row, row, 0.0f);
}

// An L x L tile, a vector per row, transposed by log2(L) perfect shuffles: each interleaves
// row k with row k + L/2.
template <typename Vec>
KILN_INLINE void transpose(Vec (&r)[kLanes<Vec>]) {
  constexpr int64_t L = kLanes<Vec>;
  constexpr auto all = std::make_index_sequence<L>{};
  for (int64_t n = 1; n < L; n *= 2) {
    Vec t[L];
    for (int64_t k = 0; k < L / 2; ++k) {
      t[2 * k] = interleave<Vec, 0>(r[k], r[k + L / 2], all);
      t[2 * k + 1] = interleave<Vec, L / 2>(r[k], r[k + L / 2], all);
    }
    for (int64_t k = 0; k < L; ++k) r[k] = t[k];
  }
}

// b planes of `size` floats, [b, size], into a block [size, b] (ToBlock), or back; b a multiple
// of Vec's lanes.
template <bool ToBlock, typename Vec>
KILN_INLINE void transpose_block(const float* from, int64_t size, int64_t b, float* to) {
  constexpr int64_t L = kLanes<Vec>;
  auto planar = [&](float* base, int64_t i, int64_t p) { return base + i * size + p; };
  auto blocked = [&](float* base, int64_t i, int64_t p) { return base + p * b + i; };
  float* src = const_cast<float*>(from);
  int64_t p = 0;
  for (; p + L <= size; p += L)
    for (int64_t i = 0; i < b; i += L) {
      Vec r[L];
      for (int64_t k = 0; k < L; ++k)
        r[k] = load<Vec>(ToBlock ? planar(src, i + k, p) : blocked(src, i, p + k));
      transpose(r);
      for (int64_t k = 0; k < L; ++k)
        store(ToBlock ? blocked(to, i, p + k) : planar(to, i + k, p), r[k]);
    }
  for (; p < size; ++p)
    for (int64_t i = 0; i < b; ++i)
      *(ToBlock ? blocked(to, i, p) : planar(to, i, p)) =
          *(ToBlock ? planar(src, i, p) : blocked(src, i, p));
}

#define KILN_POOL_VARIANTS(suffix, Vec, attributes)                                             \
  attributes void forward_##suffix(const Planes2x2& g, const float* x, const float*, float* y,  \
                                   int64_t b, int64_t e) {                                      \
    planes<false, Vec>(g, x, nullptr, y, b, e);                                                 \
  }                                                                                             \
  attributes void grad_##suffix(const Planes2x2& g, const float* x, const float* dy, float* dx, \
                                int64_t b, int64_t e) {                                         \
    planes<true, Vec>(g, x, dy, dx, b, e);                                                      \
  }
KILN_POOL_VARIANTS(baseline, F4, )
KILN_POOL_VARIANTS(avx2, F8, __attribute__((target("avx2,fma"))))
KILN_POOL_VARIANTS(avx512, F16, __attribute__((target("avx512f"))))
#undef KILN_POOL_VARIANTS

// A block's channels in the widest vector that divides them (b is a multiple of 4).
#define KILN_BLOCK_VARIANT(suffix, Vec, Half, attributes)                                      \
  attributes void block_forward_##suffix(const Planes2x2& g, int64_t b, const float* x,        \
                                         const float*, float* y) {                             \
    if (b % kLanes<Vec> == 0) return block<false, Vec>(g, b, x, nullptr, y);                   \
    if (b % kLanes<Half> == 0) return block<false, Half>(g, b, x, nullptr, y);                 \
    block<false, F4>(g, b, x, nullptr, y);                                                     \
  }                                                                                            \
  attributes void block_grad_##suffix(const Planes2x2& g, int64_t b, const float* x,           \
                                      const float* dy, float* dx) {                            \
    if (b % kLanes<Vec> == 0) return block<true, Vec>(g, b, x, dy, dx);                        \
    if (b % kLanes<Half> == 0) return block<true, Half>(g, b, x, dy, dx);                      \
    block<true, F4>(g, b, x, dy, dx);                                                          \
  }                                                                                            \
  attributes void to_block_##suffix(const float* from, int64_t size, int64_t b, float* to) {   \
    if (b % kLanes<Vec> == 0) return transpose_block<true, Vec>(from, size, b, to);            \
    if (b % kLanes<Half> == 0) return transpose_block<true, Half>(from, size, b, to);          \
    transpose_block<true, F4>(from, size, b, to);                                              \
  }                                                                                            \
  attributes void from_block_##suffix(const float* from, int64_t size, int64_t b, float* to) { \
    if (b % kLanes<Vec> == 0) return transpose_block<false, Vec>(from, size, b, to);           \
    if (b % kLanes<Half> == 0) return transpose_block<false, Half>(from, size, b, to);         \
    transpose_block<false, F4>(from, size, b, to);                                             \
  }
KILN_BLOCK_VARIANT(baseline, F4, F4, )
KILN_BLOCK_VARIANT(avx2, F8, F4, __attribute__((target("avx2,fma"))))
KILN_BLOCK_VARIANT(avx512, F16, F8, __attribute__((target("avx512f"))))
#undef KILN_BLOCK_VARIANT
#undef KILN_INLINE

using Variant = void (*)(const Planes2x2&, const float*, const float*, float*, int64_t, int64_t);
using BlockVariant = void (*)(const Planes2x2&, int64_t, const float*, const float*, float*);
using TransposeVariant = void (*)(const float*, int64_t, int64_t, float*);

}  // namespace

void max_pool_2x2(const Planes2x2& g, const float* x, float* y, int64_t b, int64_t e,
                  math::Isa isa) {
  pick<Variant>(isa, forward_baseline, forward_avx2, forward_avx512)(g, x, nullptr, y, b, e);
}

void max_pool_2x2_grad(const Planes2x2& g, const float* x, const float* dy, float* dx, int64_t b,
                       int64_t e, math::Isa isa) {
  pick<Variant>(isa, grad_baseline, grad_avx2, grad_avx512)(g, x, dy, dx, b, e);
}

void max_pool_2x2_block(const Planes2x2& g, int64_t b, const float* x, float* y, math::Isa isa) {
  pick<BlockVariant>(isa, block_forward_baseline, block_forward_avx2, block_forward_avx512)(
      g, b, x, nullptr, y);
}

void max_pool_2x2_block_grad(const Planes2x2& g, int64_t b, const float* x, const float* dy,
                             float* dx, math::Isa isa) {
  pick<BlockVariant>(isa, block_grad_baseline, block_grad_avx2, block_grad_avx512)(g, b, x, dy, dx);
}

void channels_to_block(const float* planes, int64_t size, int64_t b, float* block, math::Isa isa) {
  pick<TransposeVariant>(isa, to_block_baseline, to_block_avx2, to_block_avx512)(planes, size, b,
                                                                                 block);
}

void block_to_channels(const float* block, int64_t size, int64_t b, float* planes, math::Isa isa) {
  pick<TransposeVariant>(isa, from_block_baseline, from_block_avx2, from_block_avx512)(block, size,
                                                                                       b, planes);
}

}  // namespace kiln::ops
