// Dynamic loss scaling (include/kiln/loss_scale.h).
#include "kiln/loss_scale.h"

#include <cmath>

#include "kiln/math_ops.h"
#include "kiln/ops.h"

namespace kiln::optim {

namespace {
constexpr const char* kOp = "optim.loss_scale";
}

LossScaler::LossScaler(const LossScaleOptions& o) : options_(o) {
  if (!(o.init_scale > 0) || !std::isfinite(o.init_scale))
    fail(kOp, "init_scale must be positive and finite: got ", o.init_scale);
  if (!(o.growth_factor >= 1) || !std::isfinite(o.growth_factor))
    fail(kOp, "growth_factor must be finite and >= 1: got ", o.growth_factor);
  if (!(o.backoff_factor > 0 && o.backoff_factor < 1))
    fail(kOp, "backoff_factor must be in (0, 1): got ", o.backoff_factor);
  if (o.growth_interval < 1) fail(kOp, "growth_interval must be >= 1: got ", o.growth_interval);
}

LossScale LossScaler::init() const {
  return {full(Shape{}, options_.init_scale, float32), tensor(int32_t{0})};
}

Tensor LossScaler::scale(const Tensor& loss, const LossScale& state) const {
  return loss * astype(state.scale, loss.dtype());
}

LossScale LossScaler::update(const LossScale& state, const Tensor& finite) const {
  const Tensor good = state.good_steps + 1;
  const Tensor grow =
      greater_equal(good, full(Shape{}, static_cast<double>(options_.growth_interval), int32));
  const Tensor grown = where(grow, state.scale * options_.growth_factor, state.scale);
  return {where(finite, grown, state.scale * options_.backoff_factor),
          where(logical_and(finite, logical_not(grow)), good, zeros(Shape{}, int32))};
}

namespace detail {

std::pair<std::vector<Tensor>, Tensor> unscale_leaves(std::span<const Tensor> grads,
                                                      const Tensor& scale) {
  std::vector<Tensor> out(grads.begin(), grads.end());
  Tensor finite = tensor(true);
  const Tensor inverse = 1.0 / scale;  // float32, as torch's GradScaler
  for (Tensor& g : out) {
    if (!g.defined()) continue;
    // In float32, or complex64 for a complex gradient (float32 would drop its imaginary part).
    g = astype(astype(g, is_complex(g.dtype()) ? complex64 : float32) * inverse, g.dtype());
    finite = logical_and(finite, all(isfinite(g)));
  }
  return {std::move(out), finite};
}

std::vector<Tensor> select_leaves(const Tensor& keep, std::span<const Tensor> updated,
                                  std::span<const Tensor> previous) {
  std::vector<Tensor> out(updated.size());
  for (std::size_t i = 0; i < updated.size(); ++i)
    if (updated[i].defined() || previous[i].defined())
      out[i] = where(keep, updated[i], previous[i]);
  return out;
}

}  // namespace detail

}  // namespace kiln::optim
