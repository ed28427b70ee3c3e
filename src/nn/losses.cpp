// kiln::nn losses with a reduction: huber_loss, kl_div, nll_loss, and the label picking that
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
  return {-picked, kept};
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

}  // namespace

Tensor reduce_kept(const Tensor& per, const std::optional<Tensor>& kept, Reduction reduction,
                   std::string_view op, Loc loc) {
  if (!kept) return reduce(per, reduction, op, loc);
  // where, not a product with the mask, so that an ignored position's inf adds nothing.
  const Tensor masked = where(*kept, per, scalar_like(per, 0.0), loc);
  if (reduction != Reduction::mean) return reduce(masked, reduction, op, loc);
  return sum(masked, {}, false, loc) / sum(astype(*kept, per.dtype(), loc), {}, false, loc);
}

Tensor huber_loss(const Tensor& prediction, const Tensor& target, double delta, Reduction reduction,
                  Loc loc) {
  const kiln::detail::CallSite site(loc);
  return located(loc, [&]() -> Tensor {
    constexpr std::string_view op = "nn.huber_loss";
    expect_pair(op, prediction, "prediction", target, "target");
    if (!(delta > 0.0)) fail(op, "delta out of range: got ", delta, ", expected a positive value");
    const Tensor d = prediction - target;
    const Tensor a = abs(d, loc);
    const Tensor per = where(a < delta, 0.5 * d * d, delta * (a - 0.5 * delta), loc);
    return reduce(per, reduction, op, loc);
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
                Reduction reduction, Loc loc) {
  const kiln::detail::CallSite site(loc);
  return located(loc, [&]() -> Tensor {
    constexpr std::string_view op = "nn.nll_loss";
    expect_labels(op, "log-probabilities", log_probs, labels);
    const auto [nll, kept] = pick_labels(op, log_probs, labels, ignore_index, loc);
    return reduce_kept(nll, kept, reduction, op, loc);
  });
}

}  // namespace kiln::nn
