// Checks and error locations shared by the files of kiln::nn (src/nn/*.cpp); not public API.
#pragma once

#include <optional>
#include <string_view>

#include "kiln/error.h"
#include "kiln/nn.h"
#include "kiln/ops.h"
#include "kiln/tensor.h"

namespace kiln::nn {

// Runs f; an Error from nn's own checks gets the caller's file:line, as the ops' errors do.
template <class F>
auto located(Loc loc, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const Error& e) {
    kiln::detail::rethrow_at(e, loc);
  }
}

inline void expect_floating(std::string_view op, std::string_view what, const Tensor& t) {
  if (!t.defined())
    fail(op, "undefined ", what, ": got a default-constructed Tensor, expected a tensor");
  if (!is_floating(t.dtype()))
    fail(op, what, " must be floating point: got ", t.type(), ", expected f16, bf16, f32 or f64");
}

inline void expect_input(std::string_view op, const Tensor& x, int min_rank,
                         std::string_view layout) {
  if (!x.defined())
    fail(op, "undefined input: got a default-constructed Tensor, expected a tensor");
  if (x.rank() < min_rank)
    fail(op, "input has too few dimensions: got ", x.type(), ", expected ", layout);
}

// Integer labels [...] for scores [..., C] (`what`: logits, log-probabilities).
inline void expect_labels(std::string_view op, std::string_view what, const Tensor& scores,
                          const Tensor& labels) {
  expect_floating(op, what, scores);
  if (!labels.defined() || !is_integral(labels.dtype()))
    fail(op, "labels must be integers: got ", labels.defined() ? labels.type() : TensorType{},
         ", expected an integer tensor");
  if (scores.rank() < 1 || labels.rank() != scores.rank() - 1)
    fail(op, "labels do not match the ", what, ": got ", what, " ", scores.type(), " and labels ",
         labels.type(), ", expected ", what, " [..., C] and labels [...]");
  for (int i = 0; i < labels.rank(); ++i)
    if (labels.shape()[i] != scores.shape()[i])
      fail(op, "labels do not match the ", what, ": got ", what, " ", scores.type(), " and labels ",
           labels.type(), ", expected labels of shape ",
           Shape(std::vector<int64_t>(scores.shape().begin(), scores.shape().end() - 1)));
}

// The per-position negative log-likelihood -logp[..., label] of log-probabilities [..., C]
// and integer labels [...], and which positions count (none ignored: nullopt). Labels are
// checked by the check_labels primitive, so traced ones are checked when the function runs;
// an ignored position reads class 0 and must be masked by the caller (reduce_kept does).
struct PickedLabels {
  Tensor nll;
  std::optional<Tensor> kept;
  Tensor index;  // the class each position read (0 where ignored)
};
PickedLabels pick_labels(std::string_view op, const Tensor& logp, const Tensor& labels,
                         std::optional<int64_t> ignore_index, Loc loc);

// per-position values reduced over the kept positions: ignored ones are 0 (none), add nothing
// (sum), and are not counted (mean; NaN when nothing is kept, as in PyTorch). With `counts`
// the mean divides by their sum over the kept positions instead of the kept positions' number.
Tensor reduce_kept(const Tensor& per, const std::optional<Tensor>& kept, Reduction reduction,
                   std::string_view op, Loc loc,
                   const std::optional<Tensor>& counts = std::nullopt);

}  // namespace kiln::nn
