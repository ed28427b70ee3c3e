// Type rules and kernel helpers shared by the primitive families in src/ops/.
#pragma once

#include <span>
#include <string_view>
#include <vector>

#include "kiln/primitive.h"

namespace kiln::ops {

// "(f32[2,3], f32[3])", for messages.
std::string types_str(std::span<const TensorType> types);

// Throws unless t.dtype is in `allowed`; `what` describes the expectation ("a floating dtype").
void expect_dtype(std::string_view op, const TensorType& t, DTypeSet allowed, std::string_view what);
// Throws unless every input has the same dtype and shape (binary elementwise primitives).
void expect_same_types(std::string_view op, std::span<const TensorType> in);

// A new tensor of the given type for a kernel's output.
inline Tensor new_output(const TensorType& t) { return empty(t); }

// Kernel signature helpers.
KernelSignature cpu(std::initializer_list<DTypeSet> inputs);
KernelSignature cpu_variadic(DTypeSet all_inputs);

// Public-op helpers: promote a pair of tensors to their common dtype and broadcast them to
// their common shape (views; nothing is copied eagerly).
std::pair<Tensor, Tensor> promote_broadcast(std::string_view op, const Tensor& a, const Tensor& b,
                                            Loc loc);
// x converted to `dtype` when it has another one.
Tensor cast_if_needed(const Tensor& x, DType dtype, Loc loc);

// The transpose of a strided slice: g placed at start + k*step along each axis of a tensor of
// shape x, zeros elsewhere. Built from pad and reshape, so it differentiates again.
Tensor unslice(const Tensor& g, const Shape& x, const std::vector<int64_t>& start,
               const std::vector<int64_t>& step);

}  // namespace kiln::ops
