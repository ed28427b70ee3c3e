// Internal to src/transforms: what structured control flow's primitives (cond.cpp,
// while_loop.cpp, scan.cpp) and its entry points (control_flow.cpp) share. See
// docs/CONTROL_FLOW.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/primitive.h"
#include "transforms/core.h"

namespace kiln::detail::cf {

using Tensors = std::vector<Tensor>;
using TypeList = std::vector<TensorType>;
using Idx = std::vector<std::size_t>;

using detail::types_of;

Tensors sub(std::span<const Tensor> v, std::size_t b, std::size_t n);
void append(Tensors& a, std::span<const Tensor> b);
Tensor or_zero(const Tangent& t, const TensorType& type);
// Indices (relative to b) of the floating and complex entries of types[b, b+n): those carry
// derivatives.
Idx inexact(const TypeList& types, std::size_t b, std::size_t n);
// t without / with a leading axis of n: a scan's slice and its stacked xs or ys.
TensorType unstacked(const TensorType& t);
TensorType stacked(const TensorType& t, int64_t n);

// A sub-function built by a rule. Rules only pass tensors in as parameters, so nothing of an
// enclosing trace can be captured; a capture would be a bug in the rule.
FunctionRef closed(const std::string& name, const TypeList& types,
                   const std::function<Tensors(const Tensors&)>& body);

// cond's attribute name of branch k, and the branch an i32[] index selects (clamped to n).
std::string bname(std::size_t k);
std::size_t clamp_index(const Tensor& idx, std::size_t n);

// Per-example results of fn on batched operands, each with its batch axis in front.
Tensors batch_apply(const ir::Function& fn, std::span<const Tensor> ins,
                    std::span<const std::optional<int>> dims, int64_t size, std::string_view axis);
// A [B] mask shaped to broadcast against a [B, ...] tensor of rank `rank`.
Tensor mask_for(const Tensor& m, int rank);

// Variadic registrations need one input; a primitive that can take none (scan) gets a
// zero-input registration too.
std::vector<KernelRegistration> interpreter_kernels(Kernel k, bool nullary = false);

// A scan's attributes.
Attrs scan_attrs(FunctionRef body, int64_t length, bool reverse, std::size_t nc, std::size_t nx);

}  // namespace kiln::detail::cf
