// Convolutions of a single-channel input (a grayscale image's first layer) as direct loops.
// Such a layer does 2·taps FLOPs per output it writes, so it is bound by memory; oneDNN's
// plain-layout path and im2col + gemm ran it at 3-6% of the FMA peak and a tenth of the copy
// bandwidth (docs/PERFORMANCE.md, "Training step"). The loops are compiled for AVX-512, AVX2
// and the baseline, and run on the instruction set math::host_isa() names.
#pragma once

#include "math/vector_math.h"
#include "ops/conv_dnnl.h"

namespace kiln::ops {

// Whether the direct loops take g: one input channel, one group, unit stride along the last
// axis (padding, dilation and the other strides are free).
bool direct_conv_applies(const ConvGeom& g);

// The three passes on contiguous float32 buffers, each overwriting `out` (layouts as in
// conv_dnnl.h), on instruction set `isa` (at most math::detected_isa()). The sums run in a
// fixed order, so a given ISA gives the same bits on any thread count.
void direct_conv_forward(const ConvGeom& g, const float* x, const float* w, float* y,
                         math::Isa isa = math::host_isa());
void direct_conv_input_grad(const ConvGeom& g, const float* dy, const float* w, float* dx,
                            math::Isa isa = math::host_isa());
void direct_conv_weight_grad(const ConvGeom& g, const float* dy, const float* x, float* dw,
                             math::Isa isa = math::host_isa());

}  // namespace kiln::ops
