// kiln::nn GroupNorm and RMSNorm, functional and as layers. Composites of reductions.
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

}  // namespace

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

}  // namespace kiln::nn
