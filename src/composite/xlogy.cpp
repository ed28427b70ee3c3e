// xlogy: a where() whose derivative is JAX's rather than the where()'s, by a custom JVP rule
// (so it sits above transforms).
#include "kiln/math_ops.h"
#include "kiln/transforms.h"
#include "ops/rules.h"

namespace kiln {

// x log(y), 0 where x == 0 and y is not NaN (scipy's xlogy). The derivative is JAX's:
// log(y) dx + x / y dy everywhere, so d/dx at x == 0 is log(y), not the 0 of the `where`.
Tensor xlogy(const Tensor& x, const Tensor& y, Loc loc) {
  const detail::CallSite site(loc);
  auto [a, b] = ops::promote_broadcast("xlogy", x, y, loc);
  const DType d = to_floating(a.dtype());
  const auto value = [](const Tensor& u, const Tensor& v) {
    return where((u == 0.0) && !isnan(v), zeros_like(u), u * log(v));
  };
  const auto rule = [value](const std::tuple<Tensor, Tensor>& p,
                            const std::tuple<Tensor, Tensor>& t) {
    const auto& [u, v] = p;
    const auto& [du, dv] = t;
    return du * log(v) + dv * u / v;
  };
  return custom_jvp(value, rule)(ops::cast_if_needed(a, d, loc), ops::cast_if_needed(b, d, loc));
}

}  // namespace kiln
