// Dynamic loss scaling for float16 training (docs/NN.md, "Mixed precision"), the rule of
// torch.cuda.amp.GradScaler: the loss is multiplied by a scale before differentiation so that
// small float16 gradients do not flush to zero; the gradients are divided by it again; a step
// whose gradients overflowed (inf or NaN) is skipped and the scale halved, and after
// `growth_interval` steps without overflow the scale doubles. All of it is tensor ops on a small
// state tree, so it runs inside jit with the training step.
#pragma once

#include <cstdint>
#include <utility>

#include "kiln/tensor.h"
#include "kiln/tree.h"

namespace kiln::optim {

struct LossScaleOptions {
  double init_scale = 65536.0;  // 2^16
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;  // steps without overflow before the scale grows
};

// The scaler's state: checkpoint it with the model.
struct LossScale {
  Tensor scale;       // f32[]
  Tensor good_steps;  // i32[]: steps since the scale last changed or overflowed
};
KILN_TREE(LossScale, scale, good_steps);

namespace detail {
std::pair<std::vector<Tensor>, Tensor> unscale_leaves(std::span<const Tensor> grads,
                                                      const Tensor& scale);
std::vector<Tensor> select_leaves(const Tensor& keep, std::span<const Tensor> updated,
                                  std::span<const Tensor> previous);
}  // namespace detail

class LossScaler {
 public:
  // Error "[optim.loss_scale] ..." for a scale or factor that is not positive and finite, a
  // growth factor below 1, a backoff factor not in (0, 1), or a growth interval below 1.
  explicit LossScaler(const LossScaleOptions& options = {});

  LossScale init() const;
  // loss * scale, in the loss's dtype (compute the loss in float32).
  Tensor scale(const Tensor& loss, const LossScale& state) const;
  // The gradients divided by the scale, and whether all of them are finite (a bool[]).
  template <Tree P>
  std::pair<P, Tensor> unscale(const P& grads, const LossScale& state) const {
    auto [leaves, def] = tree_flatten(grads);
    auto [unscaled, finite] = detail::unscale_leaves(leaves, state.scale);
    return {tree_unflatten<P>(def, unscaled), finite};
  }
  // The state after a step whose gradients were `finite` (or not).
  LossScale update(const LossScale& state, const Tensor& finite) const;

 private:
  LossScaleOptions options_;
};

// `updated` where keep is true, else `previous`, leaf by leaf (same structure): applies an
// optimiser step only when the gradients were finite, without C++ control flow.
template <Tree T>
T select(const Tensor& keep, const T& updated, const T& previous) {
  auto [a, def] = tree_flatten(updated);
  auto b = tree_flatten(previous);
  kiln::detail::check_same_structure("optim.select", def, b.second, 2);
  return tree_unflatten<T>(def, detail::select_leaves(keep, a, b.first));
}

}  // namespace kiln::optim
