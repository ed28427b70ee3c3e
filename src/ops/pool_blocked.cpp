#include "ops/pool_blocked.h"

#include <vector>

#include "detail/parallel.h"

namespace kiln::ops {
namespace {

// Into channel blocks (to_block) or out of them.
void transpose(bool to_block, const float* from, int64_t size, int64_t b, float* to) {
  if (to_block) {
    channels_to_block(from, size, b, to);
  } else {
    block_to_channels(from, size, b, to);
  }
}

// A thread's scratch for one block's input-sized and output-sized operand, kept between calls.
struct Scratch {
  float* image;
  float* pooled;
};
Scratch scratch(const Images2x2& g) {
  thread_local std::vector<float> memory;
  const int64_t image = g.block * g.plane.H * g.plane.W;
  const auto size = static_cast<std::size_t>(image + g.block * g.plane.OH() * g.plane.OW());
  if (memory.size() < size) memory.resize(size);
  return {memory.data(), memory.data() + image};
}

// Runs f(block index, x's, the pooled image's offset) over the blocks in parallel. A block of
// b channels takes the same memory in either layout: b planes from plane (n·C + c), which is
// block (n·C/b + c/b) of the blocked image.
template <typename F>
void each_block(const Images2x2& g, F&& f) {
  const int64_t HW = g.plane.H * g.plane.W, OHW = g.plane.OH() * g.plane.OW();
  detail::parallel_for(
      g.N * (g.C / g.block),
      [&](int64_t begin, int64_t end) {
        for (int64_t u = begin; u < end; ++u) f(u * g.block * HW, u * g.block * OHW);
      },
      g.block * OHW * 4);
}

}  // namespace

void max_pool_2x2_images(const Images2x2& g, const BlockedOperands& blocked, const float* x,
                         float* y) {
  const int64_t b = g.block, OHW = g.plane.OH() * g.plane.OW();
  each_block(g, [&](int64_t xi, int64_t yi) {
    const Scratch s = scratch(g);
    if (blocked.x) {
      max_pool_2x2_block(g.plane, b, x + xi, blocked.out ? y + yi : s.pooled);
      if (!blocked.out) block_to_channels(s.pooled, OHW, b, y + yi);
    } else {
      max_pool_2x2(g.plane, x + xi, blocked.out ? s.pooled : y + yi, 0, b);
      if (blocked.out) channels_to_block(s.pooled, OHW, b, y + yi);
    }
  });
}

void max_pool_2x2_images_grad(const Images2x2& g, const BlockedOperands& blocked, const float* x,
                              const float* dy, float* dx) {
  const int64_t b = g.block, HW = g.plane.H * g.plane.W, OHW = g.plane.OH() * g.plane.OW();
  each_block(g, [&](int64_t xi, int64_t yi) {
    const Scratch s = scratch(g);
    // dy in x's layout, and where dx goes before it reaches its own.
    const float* d = dy + yi;
    if (blocked.dy != blocked.x) {
      transpose(blocked.x, dy + yi, OHW, b, s.pooled);
      d = s.pooled;
    }
    float* out = blocked.out == blocked.x ? dx + xi : s.image;
    if (blocked.x) {
      max_pool_2x2_block_grad(g.plane, b, x + xi, d, out);
    } else {
      max_pool_2x2_grad(g.plane, x + xi, d, out, 0, b);
    }
    if (blocked.out != blocked.x) transpose(blocked.out, s.image, HW, b, dx + xi);
  });
}

}  // namespace kiln::ops
