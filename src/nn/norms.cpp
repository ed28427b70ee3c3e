// kiln::nn normalisations, functional and as layers: layer_norm, batch_norm, instance_norm,
// group_norm, rms_norm. Composites of reductions.
#include "detail/checked.h"
#include "kiln/nn.h"
#include "nn/checks.h"

namespace kiln::nn {

namespace {

// An optional per-channel parameter must be [channels].
void expect_parameter(std::string_view op, std::string_view what, const std::optional<Tensor>& p,
                      int64_t channels) {
  if (!p) return;
  expect_floating(op, what, *p);
  if (p->rank() != 1 || p->shape()[0] != channels)
    fail(op, what, " does not match the channels: got ", what, " ", p->type(), ", expected [",
         channels, "]");
}

// An optional parameter must have the shape `want`.
void expect_parameter_shape(std::string_view op, std::string_view what,
                            const std::optional<Tensor>& p, const Shape& want) {
  if (!p) return;
  expect_floating(op, what, *p);
  if (p->shape() != want)
    fail(op, what, " does not match: got ", what, " ", p->type(), ", expected shape ", want);
}

// x's shape with every axis but 1 set to 1: a per-channel tensor [C] broadcast against x.
Shape channel_shape(const Tensor& x) {
  std::vector<int64_t> dims(static_cast<std::size_t>(x.rank()), 1);
  dims[1] = x.shape()[1];
  return Shape(dims);
}

// (x - mean) / sqrt(var + eps) * weight + bias, the parameters reshaped to `as`.
Tensor normalise_affine(const Tensor& centred, const Tensor& var, double eps,
                        const std::optional<Tensor>& weight, const std::optional<Tensor>& bias,
                        const Shape& as, Loc loc) {
  Tensor y = centred * rsqrt(var + eps, loc);
  if (weight) y = y * reshape(*weight, as, loc);
  if (bias) y = y + reshape(*bias, as, loc);
  return y;
}

}  // namespace

Tensor layer_norm(const Tensor& x, const Shape& normalized_shape,
                  const std::optional<Tensor>& weight, const std::optional<Tensor>& bias,
                  double eps, Loc loc) {
  const kiln::detail::CallSite site(loc);
  return located(loc, [&]() -> Tensor {
    constexpr std::string_view op = "nn.layer_norm";
    const int k = normalized_shape.rank();
    if (k == 0)
      fail(op, "empty normalized_shape: got [], expected at least one axis to normalise over");
    expect_input(op, x, k, "[..., normalized_shape]");
    expect_floating(op, "input", x);
    for (int i = 0; i < k; ++i)
      if (x.shape()[x.rank() - k + i] != normalized_shape[i])
        fail(op, "trailing dimensions do not match: got input ", x.type(), ", expected [..., ",
             normalized_shape, "]");
    expect_parameter_shape(op, "weight", weight, normalized_shape);
    expect_parameter_shape(op, "bias", bias, normalized_shape);
    Axes axes;
    for (int i = 0; i < k; ++i) axes.push_back(x.rank() - k + i);
    const Tensor centred = x - mean(x, axes, true, loc);
    const Tensor v = mean(square(centred, loc), axes, true, loc);
    return normalise_affine(centred, v, eps, weight, bias, normalized_shape, loc);
  });
}

BatchNormResult batch_norm(const Tensor& x, const std::optional<BatchNormState>& running,
                           const std::optional<Tensor>& weight, const std::optional<Tensor>& bias,
                           bool training, double momentum, double eps, Loc loc) {
  const kiln::detail::CallSite site(loc);
  return located(loc, [&]() -> BatchNormResult {
    constexpr std::string_view op = "nn.batch_norm";
    expect_input(op, x, 2, "[N, C, ...]");
    expect_floating(op, "input", x);
    const int64_t c = x.shape()[1];
    expect_parameter(op, "weight", weight, c);
    expect_parameter(op, "bias", bias, c);
    if (running) {
      expect_parameter(op, "running mean", running->mean, c);
      expect_parameter(op, "running var", running->var, c);
    }
    const Shape b = channel_shape(x);
    if (!training) {
      if (!running)
        fail(op, "evaluation needs running statistics: got none, expected a BatchNormState");
      const Tensor mu = reshape(running->mean, b, loc);
      return {normalise_affine(x - mu, reshape(running->var, b, loc), eps, weight, bias, b, loc),
              running};
    }
    Axes axes{0};
    int64_t count = x.shape()[0];
    for (int i = 2; i < x.rank(); ++i) {
      axes.push_back(i);
      count = kiln::detail::checked_mul(op, count, x.shape()[i]);
    }
    if (count < 2)
      fail(op, "training needs more than one value per channel: got input ", x.type(),
           ", expected N * H * W > 1");
    const Tensor mu = mean(x, axes, true, loc);
    const Tensor centred = x - mu;
    const Tensor var = mean(square(centred, loc), axes, true, loc);
    BatchNormResult out{normalise_affine(centred, var, eps, weight, bias, b, loc), std::nullopt};
    if (running) {
      // The batch statistics enter the state through stop_gradient: no gradient flows into it.
      const double unbias = static_cast<double>(count) / static_cast<double>(count - 1);
      const Tensor batch_mean = stop_gradient(reshape(mu, {c}, loc), loc);
      const Tensor batch_var = stop_gradient(reshape(var, {c}, loc), loc) * unbias;
      out.state = BatchNormState{(1.0 - momentum) * running->mean + momentum * batch_mean,
                                 (1.0 - momentum) * running->var + momentum * batch_var};
    }
    return out;
  });
}

Tensor instance_norm(const Tensor& x, const std::optional<Tensor>& weight,
                     const std::optional<Tensor>& bias, double eps, Loc loc) {
  const kiln::detail::CallSite site(loc);
  return located(loc, [&]() -> Tensor {
    // group_norm checks the dtype and the parameters, and names itself.
    expect_input("nn.instance_norm", x, 3, "[N, C, ...] with at least one position axis");
    return group_norm(x, x.shape()[1], weight, bias, eps, loc);
  });
}

Tensor group_norm(const Tensor& x, int64_t num_groups, const std::optional<Tensor>& weight,
                  const std::optional<Tensor>& bias, double eps, Loc loc) {
  const kiln::detail::CallSite site(loc);
  return located(loc, [&]() -> Tensor {
    constexpr std::string_view op = "nn.group_norm";
    expect_input(op, x, 2, "[N, C, ...]");
    expect_floating(op, "input", x);
    const int64_t n = x.shape()[0], c = x.shape()[1];
    if (num_groups < 1 || c % num_groups != 0)
      fail(op, "channels not divisible into groups: got input ", x.type(),
           " and num_groups=", num_groups, ", expected C to be a positive multiple of num_groups");
    expect_parameter(op, "weight", weight, c);
    expect_parameter(op, "bias", bias, c);
    // [N, G, rest]: the statistics of a group are over its channels and all positions.
    int64_t group_size = c / num_groups;
    for (int i = 2; i < x.rank(); ++i)
      group_size = kiln::detail::checked_mul(op, group_size, x.shape()[i]);
    const Tensor g = reshape(x, {n, num_groups, group_size}, loc);
    const Tensor mu = mean(g, {2}, true, loc);
    const Tensor centred = g - mu;
    const Tensor v = mean(square(centred, loc), {2}, true, loc);
    Tensor y = reshape(centred * rsqrt(v + eps, loc), x.shape(), loc);
    std::vector<int64_t> per_channel(static_cast<std::size_t>(x.rank()), 1);
    per_channel[1] = c;
    if (weight) y = y * reshape(*weight, Shape(per_channel), loc);
    if (bias) y = y + reshape(*bias, Shape(per_channel), loc);
    return y;
  });
}

Tensor rms_norm(const Tensor& x, const std::optional<Tensor>& weight, double eps, Loc loc) {
  const kiln::detail::CallSite site(loc);
  return located(loc, [&]() -> Tensor {
    constexpr std::string_view op = "nn.rms_norm";
    expect_input(op, x, 1, "[..., dim]");
    expect_floating(op, "input", x);
    expect_parameter(op, "weight", weight, x.shape()[x.rank() - 1]);
    Tensor y = x * rsqrt(mean(square(x, loc), {-1}, true, loc) + eps, loc);
    if (weight) y = y * *weight;
    return y;
  });
}

GroupNorm::GroupNorm(int64_t num_groups_, int64_t channels_, double eps_, bool affine, DType dtype)
    : num_groups(num_groups_), channels(channels_), eps(eps_) {
  if (num_groups < 1 || channels < 1 || channels % num_groups != 0)
    fail("nn.GroupNorm", "channels not divisible into groups: got num_groups=", num_groups,
         ", channels=", channels, ", expected channels to be a positive multiple of num_groups");
  if (affine) {
    weight = ones({channels}, dtype);
    bias = zeros({channels}, dtype);
  }
}

Tensor GroupNorm::operator()(const Tensor& x, Loc loc) const {
  const kiln::detail::CallSite site(loc);
  return located(loc, [&]() -> Tensor {
    constexpr std::string_view op = "nn.GroupNorm";
    expect_input(op, x, 2, "[N, C, ...]");
    if (x.shape()[1] != channels)
      fail(op, "channels do not match: got input ", x.type(), " for ", channels,
           " channels, expected [N, ", channels, ", ...]");
    Tensor y = group_norm(x, num_groups, weight, bias, eps, loc);
    detail::summary_note("GroupNorm", y, {weight ? &*weight : nullptr, bias ? &*bias : nullptr});
    return y;
  });
}

RMSNorm::RMSNorm(int64_t dim_, double eps_, bool affine, DType dtype) : dim(dim_), eps(eps_) {
  if (dim < 1) fail("nn.RMSNorm", "non-positive size: got dim=", dim, ", expected dim >= 1");
  if (affine) weight = ones({dim}, dtype);
}

Tensor RMSNorm::operator()(const Tensor& x, Loc loc) const {
  const kiln::detail::CallSite site(loc);
  return located(loc, [&]() -> Tensor {
    constexpr std::string_view op = "nn.RMSNorm";
    expect_input(op, x, 1, "[..., dim]");
    if (x.shape()[x.rank() - 1] != dim)
      fail(op, "last dimension does not match: got input ", x.type(), ", expected [..., ", dim,
           "]");
    Tensor y = rms_norm(x, weight, eps, loc);
    detail::summary_note("RMSNorm", y, {weight ? &*weight : nullptr});
    return y;
  });
}

LayerNorm::LayerNorm(const Shape& shape, double eps_, DType dtype, bool elementwise_affine)
    : normalized_shape(shape.begin(), shape.end()), eps(eps_) {
  if (elementwise_affine) {
    weight = ones(shape, dtype);
    bias = zeros(shape, dtype);
  }
}

Tensor LayerNorm::operator()(const Tensor& x, Loc loc) const {
  const kiln::detail::CallSite site(loc);
  return located(loc, [&]() -> Tensor {
    Tensor y = layer_norm(x, Shape(normalized_shape), weight, bias, eps, loc);
    detail::summary_note("LayerNorm", y, {weight ? &*weight : nullptr, bias ? &*bias : nullptr});
    return y;
  });
}

BatchNorm::BatchNorm(int64_t channels_, double momentum_, double eps_, DType dtype_, bool affine)
    : channels(channels_), momentum(momentum_), eps(eps_), dtype(dtype_) {
  if (channels < 1)
    fail("nn.BatchNorm", "non-positive size: got channels=", channels, ", expected >= 1");
  if (affine) {
    weight = ones({channels}, dtype);
    bias = zeros({channels}, dtype);
  }
}

BatchNormState BatchNorm::initial_state() const {
  return {zeros({channels}, dtype), ones({channels}, dtype)};
}

std::pair<Tensor, BatchNormState> BatchNorm::operator()(const Tensor& x, const BatchNormState& s,
                                                        bool training, Loc loc) const {
  const kiln::detail::CallSite site(loc);
  return located(loc, [&]() -> std::pair<Tensor, BatchNormState> {
    constexpr std::string_view op = "nn.BatchNorm";
    expect_input(op, x, 2, "[N, C, ...]");
    if (x.shape()[1] != channels)
      fail(op, "channels do not match: got input ", x.type(), " for ", channels,
           " channels, expected [N, ", channels, ", ...]");
    BatchNormResult r = batch_norm(x, s, weight, bias, training, momentum, eps, loc);
    detail::summary_note("BatchNorm", r.y, {weight ? &*weight : nullptr, bias ? &*bias : nullptr});
    return {r.y, *r.state};
  });
}

}  // namespace kiln::nn
