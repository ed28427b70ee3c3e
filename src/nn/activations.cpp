// kiln::nn activations beyond relu, gelu and silu (elu, leaky_relu, PyTorch's softplus, mish,
// hardtanh, ..., glu, prelu, softmin, normalize, dropout) and their layers. Composites of where,
// expm1, nn::softplus, reductions and random::bernoulli.
#include <cmath>

#include "kiln/nn.h"
#include "nn/checks.h"

namespace kiln::nn {

namespace {

// where(x <= 0, f(x), x): the test is x <= 0 so that NaN takes the identity branch (value NaN,
// derivative 1, as PyTorch's elu, celu and selu). f gets an input that is 0 where x > 0, so
// that expm1 of a large positive x never puts inf into the derivative (0 * inf would be NaN).
template <class F>
Tensor negative_branch(const Tensor& x, F&& f, Loc loc) {
  const Tensor negative = x <= 0.0;
  const Tensor xn = where(negative, x, scalar_like(x, 0.0), loc);
  return where(negative, f(xn), x, loc);
}

}  // namespace

Tensor elu(const Tensor& x, double alpha, Loc loc) {
  const kiln::detail::CallSite site(loc);
  return located(loc, [&]() -> Tensor {
    expect_floating("nn.elu", "input", x);
    return negative_branch(
        x, [&](const Tensor& xn) { return alpha * expm1(xn, loc); }, loc);
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

Tensor mish(const Tensor& x, Loc loc) {
  const kiln::detail::CallSite site(loc);
  return located(loc, [&]() -> Tensor {
    expect_floating("nn.mish", "input", x);
    return x * tanh(nn::softplus(x, loc), loc);
  });
}

namespace {
// min_val where x <= min_val, max_val where x >= max_val, else x: NaN takes the x branch, and
// the derivative at either end is 0, as PyTorch's hardtanh.
Tensor clamp_between(const Tensor& x, double min_val, double max_val, Loc loc) {
  return where(x <= min_val, scalar_like(x, min_val),
               where(x >= max_val, scalar_like(x, max_val), x, loc), loc);
}
}  // namespace

Tensor hardtanh(const Tensor& x, double min_val, double max_val, Loc loc) {
  const kiln::detail::CallSite site(loc);
  return located(loc, [&]() -> Tensor {
    constexpr std::string_view op = "nn.hardtanh";
    expect_floating(op, "input", x);
    if (!(min_val <= max_val))
      fail(op, "bounds out of order: got min_val=", min_val, ", max_val=", max_val,
           ", expected min_val <= max_val");
    return clamp_between(x, min_val, max_val, loc);
  });
}

Tensor relu6(const Tensor& x, Loc loc) {
  const kiln::detail::CallSite site(loc);
  return located(loc, [&]() -> Tensor {
    expect_floating("nn.relu6", "input", x);
    return clamp_between(x, 0.0, 6.0, loc);
  });
}

// Piecewise as PyTorch's vectorised kernel (0 below -3, x (x + 3) / 6 on [-3, 3), x from 3
// on), so the derivative at -3 is -1/2 and at 3 is 1 as there, and NaN takes the x branch.
// The middle formula gets 0 where it is not chosen from 3 on or at NaN, whose 0 * NaN would
// reach the derivative otherwise.
Tensor hardswish(const Tensor& x, Loc loc) {
  const kiln::detail::CallSite site(loc);
  return located(loc, [&]() -> Tensor {
    expect_floating("nn.hardswish", "input", x);
    const Tensor middle = x < 3.0;
    const Tensor xm = where(middle, x, scalar_like(x, 0.0), loc);
    return where(x < -3.0, scalar_like(x, 0.0),
                 where(middle, xm * (xm + 3.0) * (1.0 / 6.0), x, loc), loc);
  });
}

Tensor hardsigmoid(const Tensor& x, Loc loc) {
  const kiln::detail::CallSite site(loc);
  return located(loc, [&]() -> Tensor {
    expect_floating("nn.hardsigmoid", "input", x);
    return clamp_between(x * (1.0 / 6.0) + 0.5, 0.0, 1.0, loc);
  });
}

// The constants of Klambauer et al. (2017), as PyTorch's.
Tensor selu(const Tensor& x, Loc loc) {
  const kiln::detail::CallSite site(loc);
  return located(loc, [&]() -> Tensor {
    constexpr double alpha = 1.6732632423543772848170429916717;
    constexpr double scale = 1.0507009873554804934193349852946;
    expect_floating("nn.selu", "input", x);
    return scale * negative_branch(
                       x, [&](const Tensor& xn) { return alpha * expm1(xn, loc); }, loc);
  });
}

Tensor celu(const Tensor& x, double alpha, Loc loc) {
  const kiln::detail::CallSite site(loc);
  return located(loc, [&]() -> Tensor {
    constexpr std::string_view op = "nn.celu";
    expect_floating(op, "input", x);
    if (alpha == 0.0 || !std::isfinite(alpha))
      fail(op, "alpha out of range: got ", alpha, ", expected a finite non-zero value");
    return negative_branch(
        x, [&](const Tensor& xn) { return alpha * expm1(xn * (1.0 / alpha), loc); }, loc);
  });
}

Tensor glu(const Tensor& x, int64_t axis, Loc loc) {
  const kiln::detail::CallSite site(loc);
  return located(loc, [&]() -> Tensor {
    constexpr std::string_view op = "nn.glu";
    expect_input(op, x, 1, "a tensor of rank >= 1");
    expect_floating(op, "input", x);
    const int ax = normalize_axis(op, axis, x.rank());
    if (x.shape()[ax] % 2 != 0)
      fail(op, "odd size along the axis: got input ", x.type(), " and axis ", axis,
           ", expected an even size to halve");
    const std::vector<Tensor> halves = split(x, 2, ax, loc);
    return halves[0] * sigmoid(halves[1], loc);
  });
}

Tensor prelu(const Tensor& x, const Tensor& weight, Loc loc) {
  const kiln::detail::CallSite site(loc);
  return located(loc, [&]() -> Tensor {
    constexpr std::string_view op = "nn.prelu";
    expect_floating(op, "input", x);
    expect_floating(op, "weight", weight);
    const int64_t n = weight.numel();
    const int channel_axis = x.rank() >= 2 ? 1 : 0;
    const int64_t channels = x.rank() == 0 ? 1 : x.shape()[channel_axis];
    if (weight.rank() > 1 || (n != 1 && n != channels))
      fail(op, "weight does not match the channels: got weight ", weight.type(), " and input ",
           x.type(), ", expected one element or [", channels, "]");
    std::vector<int64_t> per_channel(static_cast<std::size_t>(x.rank()), 1);
    if (n != 1) per_channel[static_cast<std::size_t>(channel_axis)] = channels;
    const Tensor w =
        n == 1 ? reshape(weight, Shape{}, loc) : reshape(weight, Shape(per_channel), loc);
    return where(x > 0.0, x, w * x, loc);
  });
}

Tensor softmin(const Tensor& x, int64_t axis, Loc loc) {
  const kiln::detail::CallSite site(loc);
  return located(loc, [&]() -> Tensor {
    expect_floating("nn.softmin", "input", x);
    return softmax(-x, axis, loc);
  });
}

// The norm's derivative is infinite where it is 0; the zero rows are fed 1 (their norm is
// replaced by eps anyway), so that 0 * inf never reaches the gradient.
Tensor normalize(const Tensor& x, double p, int64_t axis, double eps, Loc loc) {
  const kiln::detail::CallSite site(loc);
  return located(loc, [&]() -> Tensor {
    constexpr std::string_view op = "nn.normalize";
    expect_input(op, x, 1, "a tensor of rank >= 1");
    expect_floating(op, "input", x);
    if (!(p > 0.0)) fail(op, "p out of range: got ", p, ", expected p > 0 or infinity");
    const Axes axes{normalize_axis(op, axis, x.rank())};
    const Tensor a = abs(x, loc);
    Tensor norm;
    if (std::isinf(p)) {
      norm = max(a, axes, true, loc);
    } else {
      const Tensor s = sum(p == 2.0 ? square(x, loc) : pow(a, p, loc), axes, true, loc);
      const Tensor zero = s <= 0.0;
      const Tensor safe = where(zero, scalar_like(s, 1.0), s, loc);
      const Tensor root = p == 2.0 ? sqrt(safe, loc) : pow(safe, 1.0 / p, loc);
      norm = where(zero, scalar_like(s, 0.0), root, loc);
    }
    return x / maximum(norm, scalar_like(norm, eps), loc);
  });
}

Tensor dropout(const Tensor& x, double rate, const Tensor& key, Loc loc) {
  const kiln::detail::CallSite site(loc);
  return located(loc, [&]() -> Tensor {
    constexpr std::string_view op = "nn.dropout";
    if (!(rate >= 0.0 && rate < 1.0))
      fail(op, "rate out of range: got ", rate, ", expected [0, 1)");
    expect_floating(op, "input", x);
    if (rate == 0.0) return x;
    const Tensor keep = random::bernoulli(key, 1.0 - rate, x.shape(), loc);
    return where(keep, x * (1.0 / (1.0 - rate)), scalar_like(x, 0.0), loc);
  });
}

namespace {
// Checked before the tensor is made, whose own error would not name PReLU.
Tensor prelu_weight(int64_t num_parameters, double init, DType dtype) {
  if (num_parameters < 1)
    fail("nn.PReLU", "non-positive size: got num_parameters=", num_parameters, ", expected >= 1");
  return full({num_parameters}, init, dtype);
}
}  // namespace

PReLU::PReLU(int64_t num_parameters, double init, DType dtype)
    : weight(prelu_weight(num_parameters, init, dtype)) {}

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

Tensor Hardtanh::operator()(const Tensor& x, Loc loc) const {
  return noted("Hardtanh", [&] { return hardtanh(x, min_val, max_val, loc); });
}
Tensor CELU::operator()(const Tensor& x, Loc loc) const {
  return noted("CELU", [&] { return celu(x, alpha, loc); });
}
Tensor GLU::operator()(const Tensor& x, Loc loc) const {
  return noted("GLU", [&] { return glu(x, axis, loc); });
}
Tensor PReLU::operator()(const Tensor& x, Loc loc) const {
  Tensor y = prelu(x, weight, loc);
  detail::summary_note("PReLU", y, {&weight});
  return y;
}

}  // namespace kiln::nn
