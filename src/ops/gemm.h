// float32 matrix products through oneDNN's matmul primitive, and the rule that picks between it
// and OpenBLAS for matmul (kiln::runtime_info() reports the choice; docs/DESIGN.md, "GEMM
// backend").
#pragma once

#include <cstdint>
#include <optional>
#include <span>

#include "kiln/runtime.h"

namespace kiln::ops {

// Where one operand's matrices lie, in elements: element (r, c) of matrix (o, i) at
// data + o * outer + i * batch + r * row + c * col. batch (outer) 0: the same matrices for
// every i (o).
struct GemmStrides {
  int64_t batch, row, col;
  int64_t outer = 0;
};

// The strides of a BLAS operand: rows ld apart, or, transposed, columns ld apart.
inline GemmStrides blas_strides(bool transposed, int64_t ld, int64_t batch = 0, int64_t outer = 0) {
  return transposed ? GemmStrides{batch, 1, ld, outer} : GemmStrides{batch, ld, 1, outer};
}

// c[o, i] = a[o, i] b[o, i] for o < outer, i < count: a[o, i] is m x k, b[o, i] k x n, c
// contiguous [outer, count, m, n]. Two batch axes take the matrices of a view whose batch does
// not lie evenly apart, as the heads of a [B, T, 3C] projection: [B, heads].
struct SgemmCall {
  int64_t count, m, n, k;
  const float* a;
  GemmStrides as;
  const float* b;
  GemmStrides bs;
  float* c;
  int64_t outer = 1;
};

// The backend float32 products use now (set_gemm_backend, else KILN_GEMM, else the rule).
GemmBackend sgemm_backend();

// KILN_GEMM's value parsed: std::nullopt when unset, an Error when invalid.
std::optional<GemmBackend> parse_gemm_env(const char* value);

// Runs the call on oneDNN; false when oneDNN does not take this layout (the caller then uses
// OpenBLAS). Primitives are cached per shape, strides and thread count (the 1,024 most
// recently used).
bool dnnl_sgemm(const SgemmCall& call);

// Runs independent products on oneDNN (a batch whose matrices lie apart in no pattern SgemmCall
// describes): each on one thread, the calls spread over the threads, or, when there are fewer
// large ones than threads, one after another on all of them. False when oneDNN does not take
// the layout of one of them (the caller then runs them all another way).
bool dnnl_sgemm_each(std::span<const SgemmCall> calls);

}  // namespace kiln::ops
