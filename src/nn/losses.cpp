// kiln::nn losses, each with a reduction: cross_entropy, nll_loss, mse, l1_loss, huber_loss,
// smooth_l1_loss, the two binary cross-entropies and kl_div, and the label picking that
// nll_loss, cross_entropy and accuracy share. Composites of existing primitives.
#include <cmath>

#include "kiln/nn.h"
#include "kiln/primitive.h"
#include "nn/checks.h"
#include "ops/primitives.h"

namespace kiln::nn {

PickedLabels pick_labels(std::string_view op, const Tensor& logp, const Tensor& labels,
                         std::optional<int64_t> ignore_index, Loc loc) {
  const int64_t classes = logp.shape()[logp.rank() - 1];
  Attrs check{{"classes", classes}, {"op", std::string(op)}};
  if (ignore_index) check.set("ignore_index", *ignore_index);
  // int64, so that a negative ignore_index compares as itself with unsigned labels too.
  const Tensor checked = astype(bind1(prim::check_labels(), {labels}, check, loc), int64, loc);
  std::optional<Tensor> kept;
  if (ignore_index)
    kept = not_equal(checked, tensor(std::vector<int64_t>{*ignore_index}, Shape{}), loc);
  // Ignored positions read class 0 (any valid index will do); reduce_kept masks them out.
  const Tensor index = kept ? where(*kept, checked, zeros(Shape{}, int64), loc) : checked;
  const Tensor picked =
      squeeze(take_along_axis(logp, expand_dims(index, -1, loc), -1, loc), {-1}, loc);
  return {-picked, kept, index};
}

namespace {

// batchmean is the sum over everything / shape[0] (the whole sum for a 0-d input, as PyTorch).
Tensor reduce(const Tensor& per, Reduction reduction, std::string_view op, Loc loc) {
  switch (reduction) {
    case Reduction::none:
      return per;
    case Reduction::sum:
      return sum(per, {}, false, loc);
    case Reduction::mean:
      return mean(per, {}, false, loc);
    case Reduction::batchmean:
      break;
  }
  if (op != "nn.kl_div")
    fail(op,
         "unsupported reduction: got batchmean, expected none, sum or mean (batchmean is "
         "for kl_div)");
  const Tensor total = sum(per, {}, false, loc);
  return per.rank() == 0 ? total : total / static_cast<double>(per.shape()[0]);
}

// An elementwise loss's two floating-point arguments of one shape.
void expect_pair(std::string_view op, const Tensor& a, std::string_view a_name, const Tensor& b,
                 std::string_view b_name) {
  expect_floating(op, a_name, a);
  expect_floating(op, b_name, b);
  if (a.shape() != b.shape())
    fail(op, a_name, " and ", b_name, " differ in shape: got ", a.type(), " and ", b.type(),
         ", expected equal shapes");
}

// An optional tensor that must broadcast to `like`'s shape without growing it.
void expect_broadcasts(std::string_view op, std::string_view what, const std::optional<Tensor>& w,
                       const Tensor& like) {
  if (!w) return;
  expect_floating(op, what, *w);
  if (broadcast_shapes(op, w->shape(), like.shape()) != like.shape())
    fail(op, what, " does not broadcast to the input: got ", what, " ", w->type(), " and input ",
         like.type(), ", expected a shape that broadcasts to ", like.shape());
}

// A class weight must be [C].
void expect_class_weight(std::string_view op, const std::optional<Tensor>& weight,
                         const Tensor& scores) {
  if (!weight) return;
  expect_floating(op, "weight", *weight);
  const int64_t classes = scores.shape()[scores.rank() - 1];
  if (weight->rank() != 1 || weight->shape()[0] != classes)
    fail(op, "weight does not match the classes: got weight ", weight->type(), " and input ",
         scores.type(), ", expected weight [", classes, "]");
}

// The labels' class weights (ignored positions read class 0's; reduce_kept masks them), which
// scale nll and, with Reduction::mean, count as the positions' shares of the denominator.
std::optional<Tensor> weigh_labels(PickedLabels& picked, const std::optional<Tensor>& weight,
                                   Loc loc) {
  if (!weight) return std::nullopt;
  Tensor w = take(astype(*weight, picked.nll.dtype(), loc), picked.index, 0, loc);
  picked.nll = picked.nll * w;
  return w;
}

// d^2 / 2 where |d| < delta, else delta (|d| - delta / 2).
Tensor huber(const Tensor& d, double delta, Loc loc) {
  const Tensor a = abs(d, loc);
  return where(a < delta, 0.5 * d * d, delta * (a - 0.5 * delta), loc);
}

// log p clamped below at -100, as PyTorch's binary_cross_entropy: p = 0 gives -100 and feeds
// log a 1, so the unchosen branch puts no inf into the derivative. A negative p (from a
// probability outside [0, 1]) and NaN give NaN.
Tensor clamped_log(const Tensor& p, Loc loc) {
  const Tensor low = scalar_like(p, -100.0);
  const Tensor zero = p == 0.0;
  const Tensor lp = log(where(zero, scalar_like(p, 1.0), p, loc), loc);
  return where(zero, low, where(lp < -100.0, low, lp, loc), loc);
}

}  // namespace

Tensor reduce_kept(const Tensor& per, const std::optional<Tensor>& kept, Reduction reduction,
                   std::string_view op, Loc loc, const std::optional<Tensor>& counts) {
  if (!kept && !counts) return reduce(per, reduction, op, loc);
  const Tensor zero = scalar_like(per, 0.0);
  // where, not a product with the mask, so that an ignored position's inf adds nothing.
  const Tensor masked = kept ? where(*kept, per, zero, loc) : per;
  if (reduction != Reduction::mean) return reduce(masked, reduction, op, loc);
  const Tensor n = counts ? (kept ? where(*kept, *counts, zero, loc) : *counts)
                          : astype(*kept, per.dtype(), loc);
  return sum(masked, {}, false, loc) / sum(n, {}, false, loc);
}

namespace {

// cross_entropy with probabilities [..., C] as the target (PyTorch's soft targets): the mean
// is over the positions, whatever the weights.
Tensor soft_cross_entropy(const Tensor& logp, const Tensor& probs, double label_smoothing,
                          Reduction reduction, const std::optional<Tensor>& weight,
                          std::string_view op, Loc loc) {
  Tensor t = astype(probs, logp.dtype(), loc);
  if (label_smoothing > 0.0) {
    const auto c = static_cast<double>(logp.shape()[logp.rank() - 1]);
    t = (1.0 - label_smoothing) * t + label_smoothing / c;
  }
  if (weight) t = t * astype(*weight, logp.dtype(), loc);
  return reduce(-sum(logp * t, {-1}, false, loc), reduction, op, loc);
}

}  // namespace

Tensor cross_entropy(const Tensor& logits, const Tensor& labels, double label_smoothing,
                     std::optional<int64_t> ignore_index, Reduction reduction,
                     const std::optional<Tensor>& weight, Loc loc) {
  const kiln::detail::CallSite site(loc);
  return located(loc, [&]() -> Tensor {
    constexpr std::string_view op = "nn.cross_entropy";
    if (!(label_smoothing >= 0.0 && label_smoothing <= 1.0))
      fail(op, "label smoothing out of range: got ", label_smoothing,
           ", expected a value in [0, 1]");
    // A floating target of the logits' shape is probabilities; anything else must be labels.
    if (logits.defined() && labels.defined() && is_floating(labels.dtype()) &&
        labels.shape() == logits.shape()) {
      expect_pair(op, logits, "logits", labels, "probabilities");
      expect_input(op, logits, 1, "logits [..., C]");
      expect_class_weight(op, weight, logits);
      return soft_cross_entropy(log_softmax(logits, -1, loc), labels, label_smoothing, reduction,
                                weight, op, loc);
    }
    expect_labels(op, "logits", logits, labels);
    expect_class_weight(op, weight, logits);
    const Tensor logp = log_softmax(logits, -1, loc);
    PickedLabels picked = pick_labels(op, logp, labels, ignore_index, loc);
    const std::optional<Tensor> counts = weigh_labels(picked, weight, loc);
    if (label_smoothing > 0.0) {
      const auto c = static_cast<double>(logits.shape()[logits.rank() - 1]);
      const Tensor all = weight ? logp * astype(*weight, logp.dtype(), loc) : logp;
      picked.nll =
          (1.0 - label_smoothing) * picked.nll - (label_smoothing / c) * sum(all, {-1}, false, loc);
    }
    return reduce_kept(picked.nll, picked.kept, reduction, op, loc, counts);
  });
}

namespace {

// A loss of d = prediction - target per element (per(d)), reduced; prediction and target are
// floating and of one shape.
template <class F>
Tensor difference_loss(std::string_view op, const Tensor& prediction, const Tensor& target,
                       Reduction reduction, Loc loc, F&& per) {
  const kiln::detail::CallSite site(loc);
  return located(loc, [&]() -> Tensor {
    expect_pair(op, prediction, "prediction", target, "target");
    return reduce(per(prediction - target), reduction, op, loc);
  });
}

}  // namespace

Tensor mse(const Tensor& prediction, const Tensor& target, Reduction reduction, Loc loc) {
  return difference_loss("nn.mse", prediction, target, reduction, loc,
                         [&](const Tensor& d) { return square(d, loc); });
}

Tensor l1_loss(const Tensor& prediction, const Tensor& target, Reduction reduction, Loc loc) {
  return difference_loss("nn.l1_loss", prediction, target, reduction, loc,
                         [&](const Tensor& d) { return abs(d, loc); });
}

Tensor smooth_l1_loss(const Tensor& prediction, const Tensor& target, double beta,
                      Reduction reduction, Loc loc) {
  constexpr std::string_view op = "nn.smooth_l1_loss";
  return difference_loss(op, prediction, target, reduction, loc, [&](const Tensor& d) {
    if (!(beta >= 0.0 && std::isfinite(beta)))
      fail(op, "beta out of range: got ", beta, ", expected a finite value >= 0");
    // huber(d, beta) / beta is the smooth L1 loss; beta = 0 is the L1 loss itself.
    return beta == 0.0 ? abs(d, loc) : huber(d, beta, loc) * (1.0 / beta);
  });
}

Tensor binary_cross_entropy_with_logits(const Tensor& logits, const Tensor& targets,
                                        Reduction reduction,
                                        const std::optional<Tensor>& pos_weight,
                                        const std::optional<Tensor>& weight, Loc loc) {
  const kiln::detail::CallSite site(loc);
  return located(loc, [&]() -> Tensor {
    constexpr std::string_view op = "nn.binary_cross_entropy_with_logits";
    expect_floating(op, "logits", logits);
    if (!targets.defined() || logits.shape() != targets.shape())
      fail(op, "logits and targets differ in shape: got ", logits.type(), " and ",
           targets.defined() ? targets.type() : TensorType{}, ", expected equal shapes");
    expect_broadcasts(op, "pos_weight", pos_weight, logits);
    expect_broadcasts(op, "weight", weight, logits);
    // -[pw t log s + (1 - t) log(1 - s)] with s = sigmoid(x): log s = -softplus(-x) and
    // log(1 - s) = -softplus(x). Two non-negative terms, so nothing cancels at large |x|, and
    // softplus is smooth, so the curvature at x = 0 is the true 1/4 (Newton steps need it).
    const Tensor t = astype(targets, logits.dtype(), loc);
    Tensor positive = t * softplus(-logits, loc);
    if (pos_weight) positive = positive * astype(*pos_weight, logits.dtype(), loc);
    Tensor per = positive + (1.0 - t) * softplus(logits, loc);
    if (weight) per = per * astype(*weight, logits.dtype(), loc);
    return reduce(per, reduction, op, loc);
  });
}

Tensor binary_cross_entropy(const Tensor& probabilities, const Tensor& targets, Reduction reduction,
                            const std::optional<Tensor>& weight, Loc loc) {
  const kiln::detail::CallSite site(loc);
  return located(loc, [&]() -> Tensor {
    constexpr std::string_view op = "nn.binary_cross_entropy";
    expect_pair(op, probabilities, "probabilities", targets, "targets");
    expect_broadcasts(op, "weight", weight, probabilities);
    const Tensor& p = probabilities;
    const Tensor t = astype(targets, p.dtype(), loc);
    Tensor per = -(t * clamped_log(p, loc) + (1.0 - t) * clamped_log(1.0 - p, loc));
    if (weight) per = per * astype(*weight, p.dtype(), loc);
    return reduce(per, reduction, op, loc);
  });
}

Tensor huber_loss(const Tensor& prediction, const Tensor& target, double delta, Reduction reduction,
                  Loc loc) {
  constexpr std::string_view op = "nn.huber_loss";
  return difference_loss(op, prediction, target, reduction, loc, [&](const Tensor& d) {
    if (!(delta > 0.0)) fail(op, "delta out of range: got ", delta, ", expected a positive value");
    return huber(d, delta, loc);
  });
}

Tensor kl_div(const Tensor& input, const Tensor& target, Reduction reduction, bool log_target,
              Loc loc) {
  const kiln::detail::CallSite site(loc);
  return located(loc, [&]() -> Tensor {
    constexpr std::string_view op = "nn.kl_div";
    expect_pair(op, input, "input", target, "target");
    Tensor per;
    if (log_target) {
      per = exp(target, loc) * (target - input);
    } else {
      // xlogy(t, t) - t input, as PyTorch 1.13: 0 log 0 = 0 (with a zero derivative in t
      // there, where log would give -inf), t < 0 gives NaN, and t = 0 with input -inf NaN.
      const Tensor zero = target == 0.0;
      const Tensor safe = where(zero, scalar_like(target, 1.0), target, loc);
      per = where(zero, scalar_like(target, 0.0), target * log(safe, loc), loc) - target * input;
    }
    return reduce(per, reduction, op, loc);
  });
}

Tensor nll_loss(const Tensor& log_probs, const Tensor& labels, std::optional<int64_t> ignore_index,
                Reduction reduction, const std::optional<Tensor>& weight, Loc loc) {
  const kiln::detail::CallSite site(loc);
  return located(loc, [&]() -> Tensor {
    constexpr std::string_view op = "nn.nll_loss";
    expect_labels(op, "log-probabilities", log_probs, labels);
    expect_class_weight(op, weight, log_probs);
    PickedLabels picked = pick_labels(op, log_probs, labels, ignore_index, loc);
    const std::optional<Tensor> counts = weigh_labels(picked, weight, loc);
    return reduce_kept(picked.nll, picked.kept, reduction, op, loc, counts);
  });
}

}  // namespace kiln::nn
