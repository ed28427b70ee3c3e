// tree_sum, tree_dot and tree_norm (include/kiln/tree.h): compositions of existing ops over
// the leaves, so grad, vmap and jit handle them like any other op.
#include <cmath>
#include <optional>

#include "kiln/ops.h"
#include "kiln/tree.h"

namespace kiln::detail {

namespace {

// Adds 0-d partial results; 16-bit floats are carried in float32 and rounded once at the end.
struct PartialSum {
  std::optional<Tensor> total;
  std::optional<DType> dtype;  // the promotion of the partials' dtypes

  void add(const Tensor& partial) {
    dtype = dtype ? promote_types(*dtype, partial.dtype()) : partial.dtype();
    const DType carry = dtype_size(partial.dtype()) == 2 && is_floating(partial.dtype())
                            ? float32
                            : partial.dtype();
    const Tensor p = astype(partial, carry);
    total = total ? kiln::add(*total, p) : p;
  }
  Tensor result(DType empty_dtype) const {
    return total ? astype(*total, *dtype) : zeros(Shape{}, empty_dtype);
  }
};

// What a norm computes in: the leaf's float dtype, at least float32 (as optim::global_norm); a
// complex leaf by its magnitudes.
Tensor norm_operand(const Tensor& x) {
  if (is_complex(x.dtype())) return abs(x);
  const DType d = to_floating(x.dtype());
  return astype(x, d == float16 || d == bfloat16 ? float32 : d);
}

}  // namespace

Tensor leaves_sum(std::span<const Tensor> leaves) {
  PartialSum s;
  for (const Tensor& leaf : leaves)
    if (leaf.defined()) s.add(sum(leaf));
  return s.result(float32);
}

Tensor leaves_dot(std::span<const Tensor> a, std::span<const Tensor> b) {
  PartialSum s;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i].defined() || b[i].defined()) s.add(sum(mul(a[i], b[i])));
  return s.result(float32);
}

Tensor leaves_norm(std::span<const Tensor> leaves, double ord) {
  if (!(ord > 0))
    fail("tree_norm", "invalid ord: got ", ord, ", expected a number > 0 or INFINITY");
  if (std::isinf(ord)) {
    std::optional<Tensor> m;
    std::optional<DType> dtype;
    for (const Tensor& leaf : leaves) {
      if (!leaf.defined()) continue;
      const Tensor x = norm_operand(leaf);
      dtype = dtype ? promote_types(*dtype, x.dtype()) : x.dtype();
      if (x.numel() == 0) continue;
      const Tensor leaf_max = max(abs(x));
      m = m ? maximum(*m, leaf_max) : leaf_max;
    }
    if (!m) return zeros(Shape{}, dtype.value_or(float32));
    return astype(*m, *dtype);
  }
  PartialSum s;
  for (const Tensor& leaf : leaves) {
    if (!leaf.defined()) continue;
    const Tensor x = norm_operand(leaf);
    s.add(sum(ord == 2 ? square(x) : ord == 1 ? abs(x) : pow(abs(x), scalar_like(x, ord))));
  }
  if (!s.total) return s.result(float32);
  const Tensor total = *s.total;
  if (ord == 1) return s.result(float32);
  // The root's derivative is infinite at 0; the double `where` makes the gradient of an
  // all-zero tree 0 instead of NaN (the root never sees a 0).
  const Tensor zero = equal(total, scalar_like(total, 0.0));
  const Tensor safe = where(zero, scalar_like(total, 1.0), total);
  const Tensor root = ord == 2 ? sqrt(safe) : pow(safe, scalar_like(safe, 1.0 / ord));
  return astype(where(zero, scalar_like(total, 0.0), root), *s.dtype);
}

}  // namespace kiln::detail
