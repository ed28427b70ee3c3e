// Optimisers over trees of tensors: SGD (momentum, Nesterov, weight decay), Adam and AdamW,
// learning-rate schedules and gradient clipping by global norm (docs/OPTIM.md).
//
// An update is a pure function of (params, grads, state) built from Kiln ops, so it runs eagerly
// and inside jit (together with the loss and its gradient). The state is a tree (OptState<P>)
// that checkpoints with the model. The template functions here only flatten and unflatten
// trees; the algorithms work on lists of leaves and live in src/optim/optim.cpp.
#pragma once

#include <concepts>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/tensor.h"
#include "kiln/tree.h"

namespace kiln::optim {

// ---- learning-rate schedules --------------------------------------------------------------

// A learning rate as a function of the step (an i32 scalar tensor: the number of updates done
// before this one, so the first update sees 0). It is computed with Kiln ops, so under jit the
// step is a traced value and the schedule becomes part of the compiled program. Built-in
// schedules compute in float64; the optimiser casts the rate to each parameter's dtype.
// A double converts implicitly to a constant schedule, so `.lr = 1e-3` works.
class Schedule {
 public:
  using Fn = std::function<Tensor(const Tensor& step)>;

  Schedule() = default;    // unset: calling it raises Error
  Schedule(double value);  // NOLINT: implicit, a constant learning rate
  // Any callable Tensor(const Tensor& step) returning a real scalar tensor.
  // clang-format off
  template <class F>
    requires(!std::is_same_v<std::remove_cvref_t<F>, Schedule> &&
             !std::is_arithmetic_v<std::remove_cvref_t<F>> &&
             std::is_invocable_r_v<Tensor, const F&, const Tensor&>)
  Schedule(F f) : fn_(std::move(f)) {}  // NOLINT: implicit, so `.lr = [](const Tensor&) {...}`
  // clang-format on

  // The rate at `step` (an integer scalar tensor, possibly traced) as a float64 scalar.
  Tensor operator()(const Tensor& step) const;
  // Eager convenience for printing and tests: the rate at an integer step. Not under a trace.
  double operator()(int64_t step) const;

  bool is_set() const { return static_cast<bool>(fn_); }
  // The value when the schedule is a constant (made from a double or constant()).
  std::optional<double> constant_value() const { return constant_; }

 private:
  Fn fn_;
  std::optional<double> constant_;
};

// lr at every step.
Schedule constant(double lr);
// lr * gamma^floor(step / step_size), as torch.optim.lr_scheduler.StepLR.
Schedule step_decay(double lr, int64_t step_size, double gamma);
// final_lr + (lr - final_lr) * (1 + cos(pi * min(step, decay_steps) / decay_steps)) / 2: cosine
// from lr at step 0 to final_lr at decay_steps, then constant (optax.cosine_decay_schedule with
// alpha = final_lr / lr; torch's CosineAnnealingLR over its first half-period).
Schedule cosine_decay(double lr, int64_t decay_steps, double final_lr = 0.0);
// Linear warmup, then `after` (which sees step - warmup_steps): for step < warmup_steps the rate
// is init_lr + (after(0) - init_lr) * step / warmup_steps, from step warmup_steps on it is
// after(step - warmup_steps). With init_lr = 0 the first update uses a rate of 0, as in optax's
// linear_schedule / warmup_cosine_decay_schedule. warmup_steps = 0 gives `after` itself.
Schedule linear_warmup(int64_t warmup_steps, Schedule after, double init_lr = 0.0);
// schedules[0] until boundaries[0], then schedules[1](step - boundaries[0]) until boundaries[1],
// and so on (optax.join_schedules). Needs one boundary fewer than schedules, non-decreasing.
Schedule join(std::vector<Schedule> schedules, std::vector<int64_t> boundaries);
// optax.warmup_cosine_decay_schedule: linear_warmup(warmup_steps, cosine_decay(peak_lr,
// decay_steps - warmup_steps, end_lr), init_lr). decay_steps counts the warmup too.
Schedule warmup_cosine_decay(double init_lr, double peak_lr, int64_t warmup_steps,
                             int64_t decay_steps, double end_lr = 0.0);

// ---- optimiser state ----------------------------------------------------------------------

// The state of an optimiser for parameters of type P: a tree, so it goes through jit and
// checkpoints with the model. `step` is an i32 scalar (updates done); `slots` hold
// parameter-shaped trees in the parameters' dtypes ("momentum" for SGD with momentum, "mu" and
// "nu" for Adam and AdamW). tree_names gives "step", "slots.mu.layers.0.w", ...
template <class P>
struct OptState {
  Tensor step;
  std::map<std::string, P> slots;
};

// KILN_TREE(OptState<P>, step, slots), written out for the template.
template <class P>
constexpr auto kiln_tree_fields(::kiln::detail::TreeTag<OptState<P>>) {
  return std::make_tuple(::kiln::detail::tree_field("step", &OptState<P>::step),
                         ::kiln::detail::tree_field("slots", &OptState<P>::slots));
}
template <class P>
constexpr const char* kiln_tree_name(::kiln::detail::TreeTag<OptState<P>>) {
  return "OptState";
}

// ---- algorithms on leaves -----------------------------------------------------------------

// An optimisation algorithm on flat lists of leaves; Optimizer wraps it for trees. Built-ins
// come from sgd(), adam() and adamw(); derive from it for another algorithm. Implementations
// are immutable (shared by every copy of an Optimizer) and must only use Kiln ops on tensors,
// so that an update can be traced.
class Algorithm {
 public:
  virtual ~Algorithm() = default;
  virtual std::string name() const = 0;  // "sgd", "adam", "adamw"
  // Names of the parameter-shaped slots in the state, sorted.
  virtual std::vector<std::string> slot_names() const = 0;
  // The learning rate at `step` (float64 scalar).
  virtual Tensor learning_rate(const Tensor& step) const = 0;
  // Clip the gradients to this global norm before the update (nullopt: no clipping).
  virtual std::optional<double> clip_norm() const { return std::nullopt; }
  // One update. params and grads are aligned, defined, floating and of equal types; `step` is
  // the number of updates done so far (i32 scalar); slots[name][i] belongs to params[i] and
  // is replaced by its new value. Returns the new parameters.
  virtual std::vector<Tensor> apply(std::span<const Tensor> params, std::span<const Tensor> grads,
                                    const Tensor& step,
                                    std::map<std::string, std::vector<Tensor>>& slots) const = 0;
};

namespace detail {

// A flattened tree.
struct FlatTree {
  std::vector<Tensor> leaves;
  TreeDef def;
};
// The leaves of an OptState.
struct FlatState {
  Tensor step;
  std::map<std::string, std::vector<Tensor>> slots;
};
struct FlatUpdate {
  std::vector<Tensor> params;
  FlatState state;
};

FlatState init_leaves(const Algorithm& algorithm, const FlatTree& params);
// How clipping completes the gradients' sum of squares: unset when the leaves are the whole
// gradient; a psum over the processes when each holds a shard of it (kiln/zero.h).
using SumAcross = std::function<Tensor(const Tensor&)>;
// Checks the gradients and the state against the parameters (structure, each leaf's shape and
// dtype), clips, applies the algorithm to the leaves that have a gradient and counts the step.
FlatUpdate update_leaves(const Algorithm& algorithm, const FlatTree& params, const FlatTree& grads,
                         const Tensor& step, const std::map<std::string, FlatTree>& slots,
                         const SumAcross& across = {});
Tensor global_norm_leaves(std::span<const Tensor> leaves);

// An update on leaves applied to trees: params, grads and the state's slots flattened,
// on_leaves(params, grads, step, slots) -> FlatUpdate, its results unflattened.
template <Tree P, class OnLeaves>
std::pair<P, OptState<P>> update_tree(const P& params, const P& grads, const OptState<P>& state,
                                      const OnLeaves& on_leaves) {
  auto [p_leaves, p_def] = tree_flatten(params);
  auto [g_leaves, g_def] = tree_flatten(grads);
  std::map<std::string, FlatTree> slots;
  for (const auto& [name, slot] : state.slots) {
    auto [leaves, def] = tree_flatten(slot);
    slots.emplace(name, FlatTree{std::move(leaves), std::move(def)});
  }
  FlatUpdate u = on_leaves(FlatTree{std::move(p_leaves), p_def},
                           FlatTree{std::move(g_leaves), std::move(g_def)}, state.step, slots);
  OptState<P> next;
  next.step = std::move(u.state.step);
  for (const auto& [name, slot] : u.state.slots)
    next.slots.emplace(name, tree_unflatten<P>(p_def, slot));
  return {tree_unflatten<P>(p_def, u.params), std::move(next)};
}
std::vector<Tensor> clip_leaves(std::span<const Tensor> leaves, double max_norm,
                                const SumAcross& across = {});

}  // namespace detail

// ---- the optimiser ------------------------------------------------------------------------

// A value type, cheap to copy: a shared pointer to an immutable Algorithm.
class Optimizer {
 public:
  explicit Optimizer(std::shared_ptr<const Algorithm> algorithm);

  // The state before the first update: step 0 and zero-filled slots shaped like params.
  template <Tree P>
  OptState<P> init(const P& params) const {
    auto [leaves, def] = tree_flatten(params);
    detail::FlatState s =
        detail::init_leaves(*algorithm_, detail::FlatTree{std::move(leaves), def});
    OptState<P> out;
    out.step = std::move(s.step);
    for (const auto& [name, slot] : s.slots) out.slots.emplace(name, tree_unflatten<P>(def, slot));
    return out;
  }

  // One step: (new params, new state). A pure function built from Kiln ops (jit it together
  // with the loss). grads must have the structure of params and each leaf its shape and dtype;
  // a leaf whose gradient is an undefined Tensor is left as it is (its slots too), as PyTorch
  // skips parameters whose .grad is None.
  template <Tree P>
  std::pair<P, OptState<P>> update(const P& params, const P& grads,
                                   const OptState<P>& state) const {
    return detail::update_tree(params, grads, state,
                               [this](const detail::FlatTree& p, const detail::FlatTree& g,
                                      const Tensor& step, const auto& slots) {
                                 return detail::update_leaves(*algorithm_, p, g, step, slots);
                               });
  }

  // The learning rate the update after `step` updates uses (float64 scalar; works traced).
  Tensor learning_rate(const Tensor& step) const;
  // The same, eagerly, as a double.
  double learning_rate(int64_t step) const;

  std::string name() const;
  std::vector<std::string> slot_names() const;
  const Algorithm& algorithm() const { return *algorithm_; }

 private:
  std::shared_ptr<const Algorithm> algorithm_;
};

// torch.optim.SGD: g += weight_decay * p; with momentum, b = g on the first update and
// b = momentum * b + (1 - dampening) * g after it; the step direction is b, or g + momentum * b
// with Nesterov; p -= lr * direction.
struct SGDOptions {
  Schedule lr;  // required, as in torch
  double momentum = 0.0;
  double dampening = 0.0;
  bool nesterov = false;  // needs momentum > 0 and dampening = 0
  double weight_decay = 0.0;
  std::optional<double> clip_norm;  // clip_by_global_norm of the gradients first
};
Optimizer sgd(const SGDOptions& options);

// Which parameters Adam's and AdamW's weight decay applies to: all of them, or only those of
// rank 2 and more — weight matrices and embeddings, not biases or normalisation scales (GPT-2's
// rule, and what nanoGPT's two parameter groups do with PyTorch).
enum class DecayOn { all, matrices };

// torch.optim.Adam: g += weight_decay * p (L2, coupled); m = b1 m + (1 - b1) g;
// v = b2 v + (1 - b2) g^2; p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps), with t
// the 1-based update count.
struct AdamOptions {
  Schedule lr = 1e-3;
  double b1 = 0.9;
  double b2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  DecayOn decay_on = DecayOn::all;
  std::optional<double> clip_norm;
};
Optimizer adam(const AdamOptions& options = {});

// torch.optim.AdamW: p *= 1 - lr * weight_decay (decoupled), then the Adam step without L2.
struct AdamWOptions {
  Schedule lr = 1e-3;
  double b1 = 0.9;
  double b2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
  DecayOn decay_on = DecayOn::all;
  std::optional<double> clip_norm;
};
Optimizer adamw(const AdamWOptions& options = {});

// ---- gradient clipping --------------------------------------------------------------------

// sqrt of the sum of squares of every leaf (undefined leaves skipped), as a scalar in the
// leaves' promoted dtype, at least float32 (float32 for an empty tree). Works traced.
template <Tree P>
Tensor global_norm(const P& tree) {
  return detail::global_norm_leaves(tree_leaves(tree));
}

// Every leaf times min(1, max_norm / (global_norm + 1e-6)), as torch.nn.utils.clip_grad_norm_.
// Works traced (no data-dependent C++ control flow).
template <Tree P>
P clip_by_global_norm(const P& grads, double max_norm) {
  auto [leaves, def] = tree_flatten(grads);
  return tree_unflatten<P>(def, detail::clip_leaves(leaves, max_norm));
}

}  // namespace kiln::optim
