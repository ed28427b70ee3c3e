// Convolutions through oneDNN (libdnnl), behind the same three primitives as Kiln's own
// im2col + gemm kernels (src/ops/conv.cpp), which remain for f64 and for what oneDNN does
// not take.
#pragma once

#include <cstdint>

namespace kiln::ops {

// x [N, C, H, W] convolved with w [O, C/G, KH, KW] into y [N, O, OH, OW].
struct ConvGeom {
  int64_t N, C, H, W, O, KH, KW, sh, sw, ph, pw, dh, dw, G, OH, OW;
};

enum class ConvPass {
  forward,           // a = x, b = w, out = y
  backward_data,     // a = dy, b = w, out = dx
  backward_weights,  // a = dy, b = x, out = dw
};

// Runs one pass in float32 on contiguous buffers; false when oneDNN cannot take this
// geometry (the caller then uses its own kernel). `out` is overwritten, not accumulated.
bool dnnl_conv(ConvPass pass, const ConvGeom& g, const float* a, const float* b, float* out);

}  // namespace kiln::ops
