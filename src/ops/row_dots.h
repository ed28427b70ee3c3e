// A row times a matrix held by the rows of its transpose: y[j] = sum_i w[j, i] x[i], the step
// of one token through a layer whose weight is nn.Linear's [out, in]. It streams the matrix
// once and is bound by memory; OpenBLAS's gemv read a small GPT's weights at 33-34 GB/s on a
// Xeon core that streams 36-37 (docs/DESIGN.md, "GEMM backend"). Compiled for AVX-512, AVX2 and the
// baseline, run on math::host_isa()'s set.
#pragma once

#include <cstdint>

#include "math/vector_math.h"

namespace kiln::ops {

// Rows [b, e) of w (row j at w + j * ldw, k floats) against x (k floats, contiguous): y[j] for
// j in [b, e). Each row's sum runs in one order, whichever range it comes in, so a split of
// the rows across threads leaves every bit of y as it is.
void row_dots(const float* w, int64_t ldw, const float* x, float* y, int64_t k, int64_t b,
              int64_t e, math::Isa isa = math::host_isa());

}  // namespace kiln::ops
