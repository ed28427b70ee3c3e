#include "ops/pool_blocked.h"

#include "detail/parallel.h"
#include "kiln/tensor.h"

namespace kiln::ops {
namespace {

// One block's b planes of `size` floats into the layout `to`, from the other.
void relayout(Layout to, const float* from, int64_t size, int64_t b, float* out) {
  if (to == Layout::blocked) {
    channels_to_block(from, size, b, out);
  } else {
    block_to_channels(from, size, b, out);
  }
}

// A chunk's scratch for one block's input-sized and output-sized operand.
struct Scratch {
  float* image;
  float* pooled;
};

// Runs f(scratch, x's offset, the pooled image's offset) for every block of b channels, the
// blocks split among threads. A block takes the same memory in either layout: b planes from
// plane (n·C + c), which is block (n·C/b + c/b) of the blocked image. Where the operands'
// layouts differ, a scratch per chunk is allocated here, outside the parallel region.
template <typename F>
void each_block(const Images2x2& g, const PoolLayouts& layouts, F&& f) {
  const int64_t HW = g.plane.H * g.plane.W, OHW = g.plane.OH() * g.plane.OW();
  const int64_t blocks = g.N * (g.C / g.block), image = g.block * HW,
                per_chunk = image + g.block * OHW;
  const int64_t chunks = detail::parallel_chunks(blocks, g.block * OHW * 4);
  const bool mixed = layouts.out != layouts.x || layouts.dy != layouts.x;
  const Tensor scratch = empty({mixed ? chunks * per_chunk : 0}, float32);
  float* base = scratch.data<float>();
  detail::run_chunks(blocks, chunks, [&](int64_t c, int64_t begin, int64_t end) {
    const Scratch s{base + c * per_chunk, base + c * per_chunk + image};
    for (int64_t u = begin; u < end; ++u) f(s, u * image, u * g.block * OHW);
  });
}

}  // namespace

void max_pool_2x2_images(const Images2x2& g, const PoolLayouts& layouts, const float* x, float* y) {
  const int64_t b = g.block, OHW = g.plane.OH() * g.plane.OW();
  each_block(g, layouts, [&](const Scratch& s, int64_t xi, int64_t yi) {
    float* out = layouts.out == layouts.x ? y + yi : s.pooled;
    if (layouts.x == Layout::blocked) {
      max_pool_2x2_block(g.plane, b, x + xi, out);
    } else {
      max_pool_2x2(g.plane, x + xi, out, 0, b);
    }
    if (layouts.out != layouts.x) relayout(layouts.out, s.pooled, OHW, b, y + yi);
  });
}

void max_pool_2x2_images_grad(const Images2x2& g, const PoolLayouts& layouts, const float* x,
                              const float* dy, float* dx) {
  const int64_t b = g.block, HW = g.plane.H * g.plane.W, OHW = g.plane.OH() * g.plane.OW();
  each_block(g, layouts, [&](const Scratch& s, int64_t xi, int64_t yi) {
    // dy in x's layout, and where dx goes before it reaches its own.
    const float* d = dy + yi;
    if (layouts.dy != layouts.x) {
      relayout(layouts.x, dy + yi, OHW, b, s.pooled);
      d = s.pooled;
    }
    float* out = layouts.out == layouts.x ? dx + xi : s.image;
    if (layouts.x == Layout::blocked) {
      max_pool_2x2_block_grad(g.plane, b, x + xi, d, out);
    } else {
      max_pool_2x2_grad(g.plane, x + xi, d, out, 0, b);
    }
    if (layouts.out != layouts.x) relayout(layouts.out, s.image, HW, b, dx + xi);
  });
}

void relayout_images(const Shape& images, int64_t b, Layout to, const float* from, float* out) {
  const int64_t HW = images[2] * images[3], blocks = images[0] * (images[1] / b);
  detail::parallel_for(
      blocks,
      [&](int64_t begin, int64_t end) {
        for (int64_t u = begin; u < end; ++u)
          relayout(to, from + u * b * HW, HW, b, out + u * b * HW);
      },
      b * HW);
}

}  // namespace kiln::ops
