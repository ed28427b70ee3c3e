// kiln::nn activations with parameters (elu, leaky_relu, PyTorch's softplus) and their layers.
// Composites of where, expm1 and nn::softplus.
#include <cmath>

#include "kiln/nn.h"
#include "nn/checks.h"

namespace kiln::nn {

// The negative branch gets an input that is 0 where x > 0, so that expm1 of a large positive
// x never puts inf into the derivative (0 * inf would be NaN).
Tensor elu(const Tensor& x, double alpha, Loc loc) {
  const kiln::detail::CallSite site(loc);
  return located(loc, [&]() -> Tensor {
    expect_floating("nn.elu", "input", x);
    const Tensor positive = x > 0.0;
    const Tensor xn = where(positive, scalar_like(x, 0.0), x, loc);
    return where(positive, x, alpha * expm1(xn, loc), loc);
  });
}

Tensor leaky_relu(const Tensor& x, double negative_slope, Loc loc) {
  const kiln::detail::CallSite site(loc);
  return located(loc, [&]() -> Tensor {
    expect_floating("nn.leaky_relu", "input", x);
    return where(x > 0.0, x, negative_slope * x, loc);
  });
}

// nn::softplus(z) (qualified: kiln::softplus, the primitive, has the same signature) is exact
// and finite for every z, so only the threshold needs a where.
Tensor softplus(const Tensor& x, double beta, double threshold, Loc loc) {
  const kiln::detail::CallSite site(loc);
  return located(loc, [&]() -> Tensor {
    constexpr std::string_view op = "nn.softplus";
    expect_floating(op, "input", x);
    if (!(beta > 0.0 && std::isfinite(beta)))
      fail(op, "beta out of range: got ", beta, ", expected a positive finite value");
    const Tensor z = x * beta;
    return where(z > threshold, x, nn::softplus(z, loc) / beta, loc);
  });
}

namespace {
template <class F>
Tensor noted(std::string_view type, F&& f) {
  Tensor y = f();
  detail::summary_note(type, y, {});
  return y;
}
}  // namespace

Tensor ELU::operator()(const Tensor& x, Loc loc) const {
  return noted("ELU", [&] { return elu(x, alpha, loc); });
}
Tensor LeakyReLU::operator()(const Tensor& x, Loc loc) const {
  return noted("LeakyReLU", [&] { return leaky_relu(x, negative_slope, loc); });
}
Tensor Softplus::operator()(const Tensor& x, Loc loc) const {
  return noted("Softplus", [&] { return softplus(x, beta, threshold, loc); });
}

}  // namespace kiln::nn
