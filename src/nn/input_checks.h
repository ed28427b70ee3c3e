// Input checks shared by the attention and recurrent layers (src/nn/attention.cpp,
// src/nn/recurrent.cpp).
#pragma once

#include <string_view>

#include "kiln/error.h"
#include "kiln/tensor.h"

namespace kiln::nn::detail {

// An Error unless t is a floating tensor of at least min_rank dimensions (`layout` says which).
inline void expect_floating_input(std::string_view op, std::string_view what, const Tensor& t,
                                  int min_rank, std::string_view layout) {
  if (!t.defined())
    fail(op, "undefined ", what, ": got a default-constructed Tensor, expected ", layout);
  if (!is_floating(t.dtype()))
    fail(op, what, " must be floating point: got ", t.type(), ", expected f16, bf16, f32 or f64");
  if (t.rank() < min_rank)
    fail(op, what, " has too few dimensions: got ", t.type(), ", expected ", layout);
}

}  // namespace kiln::nn::detail
