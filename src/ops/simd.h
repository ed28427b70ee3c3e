// Float vectors for loops written once and compiled per instruction set (the direct
// convolutions and poolings): GCC's and Clang's vector extensions in the widths of SSE (4
// lanes), AVX2 (8) and AVX-512 (16), their lanes' bits for masking, loads and stores, and the
// choice of a variant by math::host_isa().
//
// The pattern: helpers marked KILN_SIMD_INLINE take and return vectors among themselves; each
// variant is a function marked __attribute__((target(...))) that calls them with pointers and
// sizes only, so that they are inlined into it and compiled for its registers. (Clang rejects a
// vector passed from a target function to a helper without that target, and GCC warns about
// the calling convention of such helpers, which inlining makes moot; the warning is off in the
// files that include this header.)
#pragma once

#include <cstdint>
#include <cstring>

#include "math/vector_math.h"

#pragma GCC diagnostic ignored "-Wpsabi"

#define KILN_SIMD_INLINE [[gnu::always_inline]] inline

namespace kiln::ops::simd {

typedef float F4 __attribute__((vector_size(16)));
typedef float F8 __attribute__((vector_size(32)));
typedef float F16 __attribute__((vector_size(64)));
typedef int32_t I4 __attribute__((vector_size(16)));
typedef int32_t I8 __attribute__((vector_size(32)));
typedef int32_t I16 __attribute__((vector_size(64)));

template <typename Vec>
struct BitsOf;
template <>
struct BitsOf<F4> {
  using type = I4;
};
template <>
struct BitsOf<F8> {
  using type = I8;
};
template <>
struct BitsOf<F16> {
  using type = I16;
};
template <typename Vec>
using Bits = typename BitsOf<Vec>::type;

template <typename Vec>
inline constexpr int64_t kLanes = sizeof(Vec) / sizeof(float);

template <typename Vec>
KILN_SIMD_INLINE Vec load(const float* p) {
  Vec v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <typename Vec>
KILN_SIMD_INLINE void store(float* p, Vec v) {
  std::memcpy(p, &v, sizeof v);
}
// The first `count` lanes (all of them: one load), the others zero; a partial vector goes
// through memory, for the rare row narrower than a vector.
template <typename Vec>
KILN_SIMD_INLINE Vec load(const float* p, int64_t count) {
  if (count == kLanes<Vec>) return load<Vec>(p);
  Vec v = {};
  std::memcpy(&v, p, static_cast<std::size_t>(count) * sizeof(float));
  return v;
}
template <typename Vec>
KILN_SIMD_INLINE void store(float* p, Vec v, int64_t count) {
  if (count == kLanes<Vec>) return store(p, v);
  std::memcpy(p, &v, static_cast<std::size_t>(count) * sizeof(float));
}

// The variant for `isa`: AVX-512, AVX2, or the baseline (SSE4.2) for anything below.
template <typename F>
F pick(math::Isa isa, F baseline, F avx2, F avx512) {
  return isa == math::Isa::avx512 ? avx512 : isa == math::Isa::avx2 ? avx2 : baseline;
}

}  // namespace kiln::ops::simd
