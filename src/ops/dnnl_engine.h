// oneDNN's CPU engine, one per process, shared by the convolutions (src/ops/conv_dnnl.cpp) and
// the matrix products (src/ops/gemm.cpp).
#pragma once

#include <dnnl.hpp>

namespace kiln::ops {

inline const dnnl::engine& dnnl_engine() {
  static const dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

}  // namespace kiln::ops
