// float32 matrix products through oneDNN's matmul primitive, and the rule that picks between it
// and OpenBLAS for matmul (kiln::runtime_info() reports the choice; docs/DESIGN.md, "GEMM
// backend").
#pragma once

#include <cstdint>
#include <optional>

#include "kiln/runtime.h"

namespace kiln::ops {

// Where one operand's matrices lie, in elements: element (r, c) of matrix i at
// data + i * batch + r * row + c * col. batch 0: one matrix shared by the whole batch.
struct GemmStrides {
  int64_t batch, row, col;
};

// The strides of a BLAS operand: rows ld apart, or, transposed, columns ld apart.
inline GemmStrides blas_strides(bool transposed, int64_t ld, int64_t batch = 0) {
  return transposed ? GemmStrides{batch, 1, ld} : GemmStrides{batch, ld, 1};
}

// c[i] = a[i] b[i] for i < count: a[i] is m x k, b[i] k x n, c contiguous [count, m, n].
struct SgemmCall {
  int64_t count, m, n, k;
  const float* a;
  GemmStrides as;
  const float* b;
  GemmStrides bs;
  float* c;
};

// The backend float32 products use now (set_gemm_backend, else KILN_GEMM, else the rule).
GemmBackend sgemm_backend();

// KILN_GEMM's value parsed: std::nullopt when unset, an Error when invalid.
std::optional<GemmBackend> parse_gemm_env(const char* value);

// Runs the call on oneDNN; false when oneDNN does not take this layout (the caller then uses
// OpenBLAS). Primitives are cached per shape, strides and thread count (the 1,024 most
// recently used).
bool dnnl_sgemm(const SgemmCall& call);

}  // namespace kiln::ops
