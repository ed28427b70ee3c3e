#include "ops/rules.h"

#include "kiln/ops.h"

namespace kiln::ops {

std::string types_str(std::span<const TensorType> types) {
  std::string s = "(";
  for (std::size_t i = 0; i < types.size(); ++i) s += (i ? ", " : "") + types[i].to_string();
  return s + ")";
}

void expect_dtype(std::string_view op, const TensorType& t, DTypeSet allowed,
                  std::string_view what) {
  if (!allowed.contains(t.dtype)) fail(op, "unsupported dtype: got ", t, ", expected ", what);
}

void expect_same_types(std::string_view op, std::span<const TensorType> in) {
  for (std::size_t i = 1; i < in.size(); ++i)
    if (in[i] != in[0])
      fail(op, "operands differ in dtype or shape: got ", types_str(in),
           ", expected equal dtypes and shapes (the public op promotes and broadcasts first)");
}

KernelSignature cpu(std::initializer_list<DTypeSet> inputs) {
  return KernelSignature{.device = Device::cpu, .inputs = inputs, .variadic = false};
}
KernelSignature cpu_variadic(DTypeSet all_inputs) {
  return KernelSignature{.device = Device::cpu, .inputs = {all_inputs}, .variadic = true};
}

Tensor cast_if_needed(const Tensor& x, DType dtype, Loc loc) {
  return x.dtype() == dtype ? x : astype(x, dtype, loc);
}

std::pair<Tensor, Tensor> promote_broadcast(std::string_view op, const Tensor& a, const Tensor& b,
                                            Loc loc) {
  const DType dt = promote_types(a.dtype(), b.dtype());
  Tensor x = cast_if_needed(a, dt, loc), y = cast_if_needed(b, dt, loc);
  if (x.shape() != y.shape()) {
    const Shape s = broadcast_shapes(op, x.shape(), y.shape());
    x = broadcast_to(x, s, loc);
    y = broadcast_to(y, s, loc);
  }
  return {x, y};
}

}  // namespace kiln::ops
