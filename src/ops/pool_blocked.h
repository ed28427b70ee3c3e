// 2x2 max pooling with stride 2 of float32 images [N, C, H, W] whose operands are each plain or
// channel-blocked, [N, C/b, H, W, b] (Primitive::ChannelBlocked): each block of b channels runs
// the kernel of x's layout (pool_direct.h), and an operand in the other layout is transposed
// through a scratch buffer of the block's size, so the values are the plain kernels', bit for
// bit.
#pragma once

#include <cstdint>

#include "kiln/shape.h"
#include "ops/pool_direct.h"

namespace kiln::ops {

// N images of C channels of H x W; C a multiple of `block`, itself a multiple of 4.
struct Images2x2 {
  int64_t N, C, block;
  Planes2x2 plane;
};

enum class Layout { plain, blocked };

// The layouts of x, the gradient's dy (the forward's: x's), and the output (y or dx).
struct PoolLayouts {
  Layout x = Layout::plain, dy = Layout::plain, out = Layout::plain;
};

void max_pool_2x2_images(const Images2x2& g, const PoolLayouts& layouts, const float* x, float* y);
void max_pool_2x2_images_grad(const Images2x2& g, const PoolLayouts& layouts, const float* x,
                              const float* dy, float* dx);

// Every image of [N, C, H, W] (C a multiple of b, b of 4) into the layout `to`, from the other.
void relayout_images(const Shape& images, int64_t b, Layout to, const float* from, float* out);

}  // namespace kiln::ops
