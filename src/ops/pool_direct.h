// 2x2 max pooling with stride 2 (the common one) over float32 planes, forward and gradient, a
// vector of windows at a time: the two input rows' even and odd columns are the windows' four
// elements. Compiled for AVX-512, AVX2 and the baseline, run on math::host_isa()'s set.
#pragma once

#include <cstdint>

#include "math/vector_math.h"

namespace kiln::ops {

// One plane's geometry: input H x W, output H/2 x W/2 (an odd last row or column is in no window).
struct Planes2x2 {
  int64_t H, W;
  int64_t OH() const { return H / 2; }
  int64_t OW() const { return W / 2; }
};

// Planes [b, e) of x ([*, H, W], contiguous) into y ([*, OH, OW]): each window's first maximum
// by `>`, or its last NaN where it has one.
void max_pool_2x2(const Planes2x2& g, const float* x, float* y, int64_t b, int64_t e,
                  math::Isa isa = math::host_isa());
// Planes [b, e) of dx = max_pool2d_grad(x, dy): dy at the element the forward chose in each
// window, 0 elsewhere.
void max_pool_2x2_grad(const Planes2x2& g, const float* x, const float* dy, float* dx, int64_t b,
                       int64_t e, math::Isa isa = math::host_isa());

}  // namespace kiln::ops
