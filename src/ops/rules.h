// Type rules and kernel helpers shared by the primitive families in src/ops/.
#pragma once

#include <functional>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "kiln/primitive.h"

namespace kiln::ops {

// The shorthands every rule file uses.
using Ts = std::vector<Tangent>;
using Types = std::span<const TensorType>;
using Ins = std::span<const Tensor>;

// Zeros of type t that hold no memory (a broadcast scalar): symbolic-zero tangents made
// concrete, stand-ins for tracing.
Tensor zeros_of(const TensorType& t);

// "(f32[2,3], f32[3])", for messages.
std::string types_str(std::span<const TensorType> types);

// Throws unless t.dtype is in `allowed`; `what` describes the expectation ("a floating dtype").
void expect_dtype(std::string_view op, const TensorType& t, DTypeSet allowed,
                  std::string_view what);
// Throws unless every input has the same dtype and shape (binary elementwise primitives).
void expect_same_types(std::string_view op, std::span<const TensorType> in);

// A new tensor of the given type for a kernel's output.
inline Tensor new_output(const TensorType& t) { return empty(t); }

// Kernel signature helpers.
KernelSignature cpu(std::initializer_list<DTypeSet> inputs);
KernelSignature cpu_variadic(DTypeSet all_inputs);

// The precisions LAPACK, FFTW and BLAS compute in, and where a real dtype goes for them:
// float64 stays, every other real dtype (integers, 16-bit floats) computes in float32.
inline constexpr DTypeSet kSingleOrDouble = DTypeSet(float32) | float64;
inline DType single_or_double(DType d) { return d == float64 ? float64 : float32; }

// Public-op helpers: promote a pair of tensors to their common dtype and broadcast them to
// their common shape (views; nothing is copied eagerly).
std::pair<Tensor, Tensor> promote_broadcast(std::string_view op, const Tensor& a, const Tensor& b,
                                            Loc loc);
// x converted to `dtype` when it has another one.
Tensor cast_if_needed(const Tensor& x, DType dtype, Loc loc);

// The JVP of a primitive linear in all its inputs (reshape, transpose, broadcast_to, slice,
// flip, concatenate, reduce_sum, neg, avg_pool2d, psum, ...): the primitive itself applied to
// the tangents with the same attributes. A zero tangent becomes zeros only next to a non-zero
// one (concatenate).
std::vector<Tangent> linear_jvp(const RuleArgs& r, std::span<const Tangent> t);

// The transpose of a strided slice: g placed at start + k*step along each axis of a tensor of
// shape x, zeros elsewhere. Built from pad and reshape, so it differentiates again.
Tensor unslice(const Tensor& g, const Shape& x, const std::vector<int64_t>& start,
               const std::vector<int64_t>& step);

// ---- batching helpers ----
// t with its batch axis moved to the front; an unbatched t is broadcast to `size` there.
Tensor batch_first(const Tensor& t, std::optional<int> dim, int64_t size);
// Rule for primitives applied independently to each element or row of same-shaped inputs
// (elementwise, select): batch axes are aligned at the front, the primitive runs once.
std::vector<Batched> batch_elementwise(const BatchArgs& b);
// Rule for single-input primitives whose attributes only need the batch axis in front,
// with `adjust` rewriting the attributes for one more leading axis.
BatchRule batch_leading(std::function<Attrs(const Attrs&, const Tensor& x)> adjust);
// Attribute helpers for `adjust`: shift axis lists / single axes by one, prepend to lists.
Attrs shift_ints(const Attrs& a, const char* name);
Attrs shift_int(const Attrs& a, const char* name);
Attrs prepend_int(const Attrs& a, const char* name, int64_t value);
// The last resort: run the primitive once per example and stack (always right, slower).
std::vector<Batched> batch_by_loop(const BatchArgs& b);

}  // namespace kiln::ops
