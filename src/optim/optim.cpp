// The optimisers, schedules and clipping of include/kiln/optim.h, on flat lists of leaves.
// Everything that touches a tensor is a Kiln op, so the same code runs eagerly and traced.
// Scalar hyperparameter arithmetic that depends on the step (schedules, bias corrections) is
// done on float64 0-d tensors and cast to each parameter's dtype where it meets the parameter.
#include "kiln/optim.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <sstream>

#include "kiln/ops.h"

namespace kiln::optim {

namespace {

Tensor f64_scalar(double v) { return full(Shape{}, v, float64); }

Tensor cast(const Tensor& x, DType d) { return x.dtype() == d ? x : astype(x, d); }

Tensor step_as_f64(const Tensor& step) { return cast(step, float64); }

void check_finite(const char* op, const char* what, double v) {
  if (!std::isfinite(v)) fail(op, what, " must be finite: got ", v);
}

// A float64 scalar cast to each dtype it is used with, once per dtype.
class PerDType {
 public:
  explicit PerDType(Tensor value) : value_(std::move(value)) {}
  const Tensor& as(DType d) {
    for (const auto& [dt, t] : cast_)
      if (dt == d) return t;
    cast_.emplace_back(d, cast(value_, d));
    return cast_.back().second;
  }

 private:
  Tensor value_;
  std::vector<std::pair<DType, Tensor>> cast_;
};

// The dotted leaf names of a tree, computed only when an error needs them.
class LeafNames {
 public:
  explicit LeafNames(const TreeDef& def) : def_(def) {}
  std::string operator[](std::size_t i) const {
    if (!names_) names_ = tree_names(def_);
    const std::string& n = (*names_)[i];
    return n.empty() ? std::string("(root)") : "'" + n + "'";
  }

 private:
  const TreeDef& def_;
  mutable std::optional<std::vector<std::string>> names_;
};

std::string join_names(const std::vector<std::string>& names) {
  std::string out = "{";
  for (std::size_t i = 0; i < names.size(); ++i) out += (i ? ", \"" : "\"") + names[i] + "\"";
  return out + "}";
}

}  // namespace

// ---- Schedule -----------------------------------------------------------------------------

Schedule::Schedule(double value) : constant_(value) {
  fn_ = [value](const Tensor&) { return f64_scalar(value); };
}

Tensor Schedule::operator()(const Tensor& step) const {
  if (!fn_)
    fail("optim.schedule",
         "the schedule is not set: got a default-constructed Schedule, "
         "expected a learning rate (a double or a schedule)");
  if (!step.defined() || step.rank() != 0 || !is_integral(step.dtype()))
    fail("optim.schedule", "the step must be an integer scalar: got ",
         step.defined() ? step.type().to_string() : std::string("an undefined tensor"),
         ", expected i32[]");
  const Tensor r = fn_(step);
  if (!r.defined() || r.rank() != 0 || r.dtype() == bool_)
    fail("optim.schedule", "a schedule must return a real scalar: got ",
         r.defined() ? r.type().to_string() : std::string("an undefined tensor"),
         ", expected a 0-d tensor such as f64[]");
  return cast(r, float64);
}

double Schedule::operator()(int64_t step) const {
  if (step < 0 || step > std::numeric_limits<int32_t>::max())
    fail("optim.schedule", "step out of range: got ", step, ", expected 0 <= step < 2^31");
  return (*this)(tensor(static_cast<int32_t>(step))).item<double>();
}

Schedule constant(double lr) { return Schedule(lr); }

Schedule step_decay(double lr, int64_t step_size, double gamma) {
  if (step_size <= 0) fail("optim.step_decay", "step_size must be positive: got ", step_size);
  check_finite("optim.step_decay", "lr", lr);
  check_finite("optim.step_decay", "gamma", gamma);
  return Schedule([=](const Tensor& step) {
    const Tensor k = floor(step_as_f64(step) / static_cast<double>(step_size));
    return pow(f64_scalar(gamma), k) * lr;
  });
}

Schedule cosine_decay(double lr, int64_t decay_steps, double final_lr) {
  if (decay_steps <= 0)
    fail("optim.cosine_decay", "decay_steps must be positive: got ", decay_steps);
  check_finite("optim.cosine_decay", "lr", lr);
  check_finite("optim.cosine_decay", "final_lr", final_lr);
  return Schedule([=](const Tensor& step) {
    const double n = static_cast<double>(decay_steps);
    const Tensor t = minimum(step_as_f64(step), n) / n;
    const Tensor c = (cos(t * std::numbers::pi) + 1.0) * 0.5;
    return c * (lr - final_lr) + final_lr;
  });
}

Schedule join(std::vector<Schedule> schedules, std::vector<int64_t> boundaries) {
  if (schedules.size() != boundaries.size() + 1)
    fail("optim.join", "needs one boundary fewer than schedules: got ", schedules.size(),
         " schedules and ", boundaries.size(), " boundaries");
  for (std::size_t i = 0; i < schedules.size(); ++i)
    if (!schedules[i].is_set()) fail("optim.join", "schedule ", i, " is not set");
  for (std::size_t i = 0; i < boundaries.size(); ++i)
    if (boundaries[i] < 0 || (i > 0 && boundaries[i] < boundaries[i - 1]))
      fail("optim.join", "boundaries must be non-negative and non-decreasing: got ", boundaries[i],
           " at position ", i);
  if (schedules.size() == 1) return schedules[0];
  return Schedule(
      [schedules = std::move(schedules), boundaries = std::move(boundaries)](const Tensor& step) {
        Tensor out = schedules[0](step);
        for (std::size_t i = 0; i < boundaries.size(); ++i) {
          // The later schedule never sees a negative step, even where its value is not selected.
          const Tensor shifted = maximum(step - boundaries[i], 0);
          out = where(step < boundaries[i], out, schedules[i + 1](shifted));
        }
        return out;
      });
}

Schedule linear_warmup(int64_t warmup_steps, Schedule after, double init_lr) {
  if (warmup_steps < 0)
    fail("optim.linear_warmup", "warmup_steps must be non-negative: got ", warmup_steps);
  if (!after.is_set()) fail("optim.linear_warmup", "the schedule after the warmup is not set");
  check_finite("optim.linear_warmup", "init_lr", init_lr);
  if (warmup_steps == 0) return after;
  const double n = static_cast<double>(warmup_steps);
  Schedule ramp([after, init_lr, n](const Tensor& step) {
    const Tensor peak = after(zeros(Shape{}, step.dtype()));
    return (peak - init_lr) * (minimum(step_as_f64(step), n) / n) + init_lr;
  });
  return join({std::move(ramp), std::move(after)}, {warmup_steps});
}

Schedule warmup_cosine_decay(double init_lr, double peak_lr, int64_t warmup_steps,
                             int64_t decay_steps, double end_lr) {
  if (warmup_steps < 0 || decay_steps <= warmup_steps)
    fail("optim.warmup_cosine_decay",
         "needs 0 <= warmup_steps < decay_steps: got warmup_steps=", warmup_steps,
         ", decay_steps=", decay_steps);
  return linear_warmup(warmup_steps, cosine_decay(peak_lr, decay_steps - warmup_steps, end_lr),
                       init_lr);
}

// ---- leaf-level helpers -------------------------------------------------------------------

namespace detail {

namespace {

void check_param(const char* op, const Tensor& p, const LeafNames& names, std::size_t i) {
  if (!is_floating(p.dtype()))
    fail(op, "parameter ", names[i], " has dtype ", dtype_name(p.dtype()), ": got ",
         p.type().to_string(),
         ", expected a floating-point tensor (keep integer tensors out of the optimised tree, "
         "or make them static leaves)");
}

// "got f32[3,4], expected f32[4,3]" checks of one leaf against its parameter.
void check_like(const std::string& what, const Tensor& t, const Tensor& p, const LeafNames& names,
                std::size_t i) {
  if (!t.defined())
    fail("optim.update", what, " for ", names[i],
         " is an undefined tensor: got undefined, expected ", p.type().to_string());
  if (t.shape() != p.shape())
    fail("optim.update", what, " for ", names[i], " has the wrong shape: got ",
         t.type().to_string(), ", expected ", p.type().to_string());
  if (t.dtype() != p.dtype())
    fail("optim.update", what, " for ", names[i], " has the wrong dtype: got ",
         t.type().to_string(), ", expected ", p.type().to_string());
}

}  // namespace

FlatState init_leaves(const Algorithm& algorithm, const FlatTree& params) {
  const LeafNames names(params.def);
  for (std::size_t i = 0; i < params.leaves.size(); ++i)
    if (params.leaves[i].defined()) check_param("optim.init", params.leaves[i], names, i);
  FlatState s;
  s.step = tensor(int32_t{0});
  for (const std::string& name : algorithm.slot_names()) {
    std::vector<Tensor>& slot = s.slots[name];
    slot.reserve(params.leaves.size());
    for (const Tensor& p : params.leaves) slot.push_back(p.defined() ? zeros_like(p) : Tensor());
  }
  return s;
}

FlatUpdate update_leaves(const Algorithm& algorithm, const FlatTree& params, const FlatTree& grads,
                         const Tensor& step, const std::map<std::string, FlatTree>& slots,
                         const SumAcross& across) {
  constexpr const char* op = "optim.update";
  if (!step.defined() || step.dtype() != int32 || step.rank() != 0)
    fail(op, "state.step must be an i32 scalar: got ",
         step.defined() ? step.type().to_string() : std::string("an undefined tensor"),
         ", expected i32[] (use the state from init())");
  if (auto d = first_difference(grads.def, params.def))
    fail(op, "the gradients do not have the parameters' structure: at ", *d,
         " (gradients vs parameters)");

  const std::vector<std::string> want = algorithm.slot_names();
  std::vector<std::string> have;
  for (const auto& [name, slot] : slots) have.push_back(name);
  if (have != want)
    fail(op, "the state has the wrong slots for ", algorithm.name(), ": got ", join_names(have),
         ", expected ", join_names(want), " (is it the state of another optimizer?)");
  for (const auto& [name, slot] : slots)
    if (auto d = first_difference(slot.def, params.def))
      fail(op, "state slot \"", name, "\" does not have the parameters' structure: at ", *d,
           " (slot vs parameters)");

  const std::size_t n = params.leaves.size();
  const LeafNames names(params.def);
  std::vector<std::size_t> active;  // leaves with a gradient
  for (std::size_t i = 0; i < n; ++i) {
    const Tensor& p = params.leaves[i];
    const Tensor& g = grads.leaves[i];
    if (!p.defined()) {
      if (g.defined())
        fail(op, "gradient for ", names[i],
             " is set but the parameter is an undefined tensor: got ", g.type().to_string(),
             ", expected no gradient");
      continue;
    }
    check_param(op, p, names, i);
    for (const auto& [name, slot] : slots)
      check_like("state slot \"" + name + "\"", slot.leaves[i], p, names, i);
    if (!g.defined()) continue;  // as PyTorch skips a parameter whose .grad is None
    check_like("gradient", g, p, names, i);
    active.push_back(i);
  }

  std::vector<Tensor> ps, gs;
  std::map<std::string, std::vector<Tensor>> ss;
  for (std::size_t i : active) {
    ps.push_back(params.leaves[i]);
    gs.push_back(grads.leaves[i]);
    for (const auto& [name, slot] : slots) ss[name].push_back(slot.leaves[i]);
  }
  for (const std::string& name : want) ss[name];  // present even with no active leaf
  // 16-bit float leaves update in float32 and are rounded once at the end: in bfloat16, b2 =
  // 0.999 would be 1.0, and every rounded intermediate would lose part of a small update.
  std::vector<DType> stored;
  for (std::size_t k = 0; k < ps.size(); ++k) {
    stored.push_back(ps[k].dtype());
    if (stored[k] != float16 && stored[k] != bfloat16) continue;
    ps[k] = astype(ps[k], float32);
    gs[k] = astype(gs[k], float32);
    for (auto& [name, slot] : ss) slot[k] = astype(slot[k], float32);
  }
  if (auto c = algorithm.clip_norm()) gs = clip_leaves(gs, *c, across);
  std::vector<Tensor> new_ps = algorithm.apply(ps, gs, step, ss);
  if (new_ps.size() != ps.size())
    fail(op, algorithm.name(), " returned the wrong number of parameters: got ", new_ps.size(),
         ", expected ", ps.size());

  for (const auto& [name, updated] : ss)
    if (updated.size() != active.size())
      fail(op, algorithm.name(), " returned the wrong number of leaves for slot \"", name,
           "\": got ", updated.size(), ", expected ", active.size());
  for (std::size_t k = 0; k < ps.size(); ++k) {
    if (stored[k] != float16 && stored[k] != bfloat16) continue;
    new_ps[k] = astype(new_ps[k], stored[k]);
    for (auto& [name, slot] : ss) slot[k] = astype(slot[k], stored[k]);
  }

  FlatUpdate out;
  out.params = params.leaves;
  for (const auto& [name, slot] : slots) out.state.slots[name] = slot.leaves;
  for (std::size_t k = 0; k < active.size(); ++k) {
    const std::size_t i = active[k];
    out.params[i] = std::move(new_ps[k]);
    for (auto& [name, slot] : out.state.slots) slot[i] = ss.at(name)[k];
  }
  out.state.step = step + 1;
  return out;
}

// tree_norm's ord 2: float32 at least, gradient 0 at an all-zero tree.
Tensor global_norm_leaves(std::span<const Tensor> leaves) {
  return kiln::detail::leaves_norm(leaves, 2.0);
}

std::vector<Tensor> clip_leaves(std::span<const Tensor> leaves, double max_norm,
                                const SumAcross& across) {
  if (!(max_norm > 0) || !std::isfinite(max_norm))
    fail("optim.clip_by_global_norm", "max_norm must be positive and finite: got ", max_norm);
  const Tensor norm =
      across ? sqrt(across(kiln::detail::leaves_dot(leaves, leaves))) : global_norm_leaves(leaves);
  // torch.nn.utils.clip_grad_norm_: clip_coef = max_norm / (norm + 1e-6), clamped to 1.
  PerDType coef(minimum(max_norm / (norm + 1e-6), 1.0));
  std::vector<Tensor> out(leaves.begin(), leaves.end());
  for (Tensor& t : out)
    if (t.defined()) t = t * coef.as(t.dtype());
  return out;
}

}  // namespace detail

// ---- Optimizer ----------------------------------------------------------------------------

Optimizer::Optimizer(std::shared_ptr<const Algorithm> algorithm)
    : algorithm_(std::move(algorithm)) {
  if (!algorithm_) fail("optim.Optimizer", "the algorithm is null");
}

Tensor Optimizer::learning_rate(const Tensor& step) const {
  return cast(algorithm_->learning_rate(step), float64);
}

double Optimizer::learning_rate(int64_t step) const {
  if (step < 0 || step > std::numeric_limits<int32_t>::max())
    fail("optim.learning_rate", "step out of range: got ", step, ", expected 0 <= step < 2^31");
  return learning_rate(tensor(static_cast<int32_t>(step))).item<double>();
}

std::string Optimizer::name() const { return algorithm_->name(); }
std::vector<std::string> Optimizer::slot_names() const { return algorithm_->slot_names(); }

// ---- the algorithms -----------------------------------------------------------------------

namespace {

void check_lr(const char* op, const Schedule& lr) {
  if (!lr.is_set())
    fail(op,
         "the learning rate is not set: got a default-constructed Schedule, expected "
         ".lr = a double or a schedule");
  if (auto c = lr.constant_value(); c && (!std::isfinite(*c) || *c < 0))
    fail(op, "invalid learning rate: got ", *c, ", expected a finite value >= 0");
}

void check_clip(const char* op, const std::optional<double>& clip) {
  if (clip && (!(*clip > 0) || !std::isfinite(*clip)))
    fail(op, "clip_norm must be positive and finite: got ", *clip);
}

void check_range(const char* op, const char* what, double v, double lo, bool hi_open, double hi) {
  const bool ok = std::isfinite(v) && v >= lo && (hi_open ? v < hi : v <= hi);
  if (!ok)
    fail(op, "invalid ", what, ": got ", v, ", expected ", lo, " <= ", what,
         hi_open ? " < " : " <= ", hi);
}

constexpr double kInf = std::numeric_limits<double>::infinity();

class SGD final : public Algorithm {
 public:
  explicit SGD(SGDOptions o) : o_(std::move(o)) {}
  std::string name() const override { return "sgd"; }
  std::vector<std::string> slot_names() const override {
    if (o_.momentum != 0) return {"momentum"};
    return {};
  }
  Tensor learning_rate(const Tensor& step) const override { return o_.lr(step); }
  std::optional<double> clip_norm() const override { return o_.clip_norm; }

  std::vector<Tensor> apply(std::span<const Tensor> params, std::span<const Tensor> grads,
                            const Tensor& step,
                            std::map<std::string, std::vector<Tensor>>& slots) const override {
    PerDType lr(o_.lr(step));
    const double mu = o_.momentum;
    std::optional<Tensor> first;  // step == 0, only needed with dampening
    if (mu != 0 && o_.dampening != 0) first = step == 0;
    std::vector<Tensor> out;
    out.reserve(params.size());
    for (std::size_t i = 0; i < params.size(); ++i) {
      const Tensor& p = params[i];
      Tensor g = grads[i];
      if (o_.weight_decay != 0) g = g + p * o_.weight_decay;
      Tensor d = g;
      if (mu != 0) {
        Tensor& b = slots.at("momentum")[i];
        // PyTorch starts the buffer at g; from zeros, mu * 0 + g is exactly g when
        // dampening is 0, so only a non-zero dampening needs the first-step branch.
        if (o_.dampening == 0) {
          b = b * mu + g;
        } else {
          b = where(*first, g, b * mu + g * (1.0 - o_.dampening));
        }
        d = o_.nesterov ? g + b * mu : b;
      }
      out.push_back(p - lr.as(p.dtype()) * d);
    }
    return out;
  }

 private:
  SGDOptions o_;
};

// Adam and AdamW; `decoupled` selects AdamW's weight decay.
class Adam final : public Algorithm {
 public:
  Adam(Schedule lr, double b1, double b2, double eps, double wd, DecayOn decay_on, bool decoupled,
       std::optional<double> clip)
      : lr_(std::move(lr)),
        b1_(b1),
        b2_(b2),
        eps_(eps),
        wd_(wd),
        decay_on_(decay_on),
        decoupled_(decoupled),
        clip_(clip) {}
  std::string name() const override { return decoupled_ ? "adamw" : "adam"; }
  std::vector<std::string> slot_names() const override { return {"mu", "nu"}; }
  Tensor learning_rate(const Tensor& step) const override { return lr_(step); }
  std::optional<double> clip_norm() const override { return clip_; }

  std::vector<Tensor> apply(std::span<const Tensor> params, std::span<const Tensor> grads,
                            const Tensor& step,
                            std::map<std::string, std::vector<Tensor>>& slots) const override {
    const Tensor lr = lr_(step);
    const Tensor t = cast(step + 1, float64);  // PyTorch counts from 1 after its increment
    const Tensor bc1 = 1.0 - pow(f64_scalar(b1_), t);
    const Tensor bc2 = 1.0 - pow(f64_scalar(b2_), t);
    PerDType step_size(lr / bc1);
    PerDType bc2_sqrt(sqrt(bc2));
    std::optional<PerDType> decay;  // AdamW: 1 - lr * wd
    if (decoupled_ && wd_ != 0) decay.emplace(1.0 - lr * wd_);
    std::vector<Tensor>& mu = slots.at("mu");
    std::vector<Tensor>& nu = slots.at("nu");
    std::vector<Tensor> out;
    out.reserve(params.size());
    for (std::size_t i = 0; i < params.size(); ++i) {
      Tensor p = params[i];
      Tensor g = grads[i];
      const DType dt = p.dtype();
      const bool decays = decay_on_ == DecayOn::all || p.rank() >= 2;
      if (decay && decays)
        p = p * decay->as(dt);
      else if (!decoupled_ && wd_ != 0 && decays)
        g = g + p * wd_;
      mu[i] = mu[i] * b1_ + g * (1.0 - b1_);
      nu[i] = nu[i] * b2_ + square(g) * (1.0 - b2_);
      const Tensor denom = sqrt(nu[i]) / bc2_sqrt.as(dt) + eps_;
      out.push_back(p - (mu[i] / denom) * step_size.as(dt));
    }
    return out;
  }

 private:
  Schedule lr_;
  double b1_, b2_, eps_, wd_;
  DecayOn decay_on_;
  bool decoupled_;
  std::optional<double> clip_;
};

void check_adam(const char* op, const Schedule& lr, double b1, double b2, double eps, double wd,
                const std::optional<double>& clip) {
  check_lr(op, lr);
  check_range(op, "b1", b1, 0.0, true, 1.0);
  check_range(op, "b2", b2, 0.0, true, 1.0);
  check_range(op, "eps", eps, 0.0, false, kInf);
  check_range(op, "weight_decay", wd, 0.0, false, kInf);
  check_clip(op, clip);
}

}  // namespace

Optimizer sgd(const SGDOptions& o) {
  constexpr const char* op = "optim.sgd";
  check_lr(op, o.lr);
  check_range(op, "momentum", o.momentum, 0.0, false, kInf);
  check_range(op, "dampening", o.dampening, 0.0, false, 1.0);
  check_range(op, "weight_decay", o.weight_decay, 0.0, false, kInf);
  if (o.nesterov && (o.momentum <= 0 || o.dampening != 0))
    fail(op, "Nesterov momentum requires a momentum and zero dampening: got momentum=", o.momentum,
         ", dampening=", o.dampening);
  check_clip(op, o.clip_norm);
  return Optimizer(std::make_shared<const SGD>(o));
}

Optimizer adam(const AdamOptions& o) {
  check_adam("optim.adam", o.lr, o.b1, o.b2, o.eps, o.weight_decay, o.clip_norm);
  return Optimizer(std::make_shared<const Adam>(o.lr, o.b1, o.b2, o.eps, o.weight_decay, o.decay_on,
                                                false, o.clip_norm));
}

Optimizer adamw(const AdamWOptions& o) {
  check_adam("optim.adamw", o.lr, o.b1, o.b2, o.eps, o.weight_decay, o.clip_norm);
  return Optimizer(std::make_shared<const Adam>(o.lr, o.b1, o.b2, o.eps, o.weight_decay, o.decay_on,
                                                true, o.clip_norm));
}

}  // namespace kiln::optim
