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

// One block of b channels (b a multiple of 4) of a channel-blocked image, x [H, W, b], into y
// [OH, OW, b]: per channel, the choices of max_pool_2x2.
void max_pool_2x2_block(const Planes2x2& g, int64_t b, const float* x, float* y,
                        math::Isa isa = math::host_isa());
// The gradient of one such block, dy [OH, OW, b] into dx [H, W, b]: max_pool_2x2_grad's values
// per channel.
void max_pool_2x2_block_grad(const Planes2x2& g, int64_t b, const float* x, const float* dy,
                             float* dx, math::Isa isa = math::host_isa());

// b planes of `size` floats, [b, size], into one channel block [size, b] (b a multiple of 4),
// and back: the transposes between a plain image's b channels and a blocked one's block.
void channels_to_block(const float* planes, int64_t size, int64_t b, float* block,
                       math::Isa isa = math::host_isa());
void block_to_channels(const float* block, int64_t size, int64_t b, float* planes,
                       math::Isa isa = math::host_isa());

}  // namespace kiln::ops
