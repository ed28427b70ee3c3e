// Convolutions through oneDNN (libdnnl), behind the same three primitives as Kiln's own
// im2col + gemm kernels (src/ops/conv.cpp), which remain for f64 and for what oneDNN does
// not take.
#pragma once

#include <array>
#include <cstdint>
#include <optional>

#include "kiln/tensor.h"

namespace kiln::ops {

// Sizes along the spatial axes (depth, height, width). A convolution of rank r < 3 uses the
// last r entries; the leading ones are neutral (size 1, stride 1, padding 0, dilation 1), so
// that one set of kernels serves 1d, 2d and 3d.
using Spatial = std::array<int64_t, 3>;

// x [N, C, *in] convolved with w [O, C/G, *k] into y [N, O, *out].
struct ConvGeom {
  int rank;  // spatial axes: 1, 2 or 3
  int64_t N, C, O, G;
  Spatial in, k, stride, pad, dil, out;

  int64_t in_size() const { return in[0] * in[1] * in[2]; }
  int64_t out_size() const { return out[0] * out[1] * out[2]; }
  int64_t taps() const { return k[0] * k[1] * k[2]; }
};

enum class ConvPass {
  forward,           // a = x, b = w, out = y
  backward_data,     // a = dy, b = w, out = dx
  backward_weights,  // a = dy, b = x, out = dw
};

// The channel block of the operands a pass reads or writes channel-blocked, [N, C/b, *in, b]
// (2-d geometries only); none: plain, [N, C, *in].
struct ConvBlocks {
  std::optional<int64_t> a, b, out;
};

// Runs one pass in float32 on contiguous operands; false when oneDNN cannot take this geometry
// (the caller then uses its own kernel). `out` is overwritten, not accumulated. The operands'
// reorders into oneDNN's layouts are shared within a compiled call (detail::cached_copy).
bool dnnl_conv(ConvPass pass, const ConvGeom& g, const Tensor& a, const Tensor& b, float* out,
               const ConvBlocks& blocks = {});

// Whether dnnl_conv takes this pass and geometry (on the calling thread's thread count).
bool dnnl_conv_takes(ConvPass pass, const ConvGeom& g);

// The channel block of the image layout oneDNN's float32 convolutions choose on this machine
// (16 with AVX-512, 8 with AVX2), or none when they choose a plain one. KILN_CHANNEL_BLOCKS=0
// says none, so that compiled code keeps every image plain.
std::optional<int64_t> dnnl_channel_block();

}  // namespace kiln::ops
