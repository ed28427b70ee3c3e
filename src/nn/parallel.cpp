// Tensor-parallel layers of include/kiln/nn.h (Megatron-LM's layout): compositions of ops and
// the named collectives, so grad, jit and shard_map handle them like any other layer.
#include "kiln/nn.h"
#include "kiln/transforms.h"
#include "nn/checks.h"

namespace kiln::nn {

namespace {

// ids relative to this block, and whether the block holds them.
struct Held {
  Tensor local, inside;
};
Held held(const Tensor& ids, int64_t rows, const std::string& axis) {
  const Tensor start = astype(axis_index(axis), ids.dtype()) * rows;
  const Tensor local = ids - start;
  const Tensor inside = logical_and(greater_equal(local, zeros_like(local)),
                                    less(local, full_like(local, static_cast<double>(rows))));
  return {where(inside, local, zeros_like(local)), inside};
}

}  // namespace

Tensor row_parallel_linear(const Linear& block, const Tensor& x, const std::string& axis, Loc loc) {
  const kiln::detail::CallSite site(loc);
  return located(loc, [&]() -> Tensor {
    constexpr std::string_view op = "nn.row_parallel_linear";
    const int64_t in = block.weight.shape()[1];
    if (x.rank() < 1 || x.shape()[x.rank() - 1] != in)
      fail(op, "input features do not match the weight's block: got input ", x.type(),
           " and weight ", block.weight.type(), ", expected input [..., ", in,
           "] (this process's block of the features)");
    Tensor y = psum(matmul(x, transpose(block.weight)), axis);
    if (block.bias) y = y + *block.bias;
    return y;
  });
}

Tensor parallel_embedding(const Embedding& block, const Tensor& ids, const std::string& axis,
                          Loc loc) {
  const kiln::detail::CallSite site(loc);
  return located(loc, [&]() -> Tensor {
    if (!ids.defined() || !is_integral(ids.dtype()))
      fail("nn.parallel_embedding", "ids must be integers: got ",
           ids.defined() ? ids.type() : TensorType{}, ", expected an integer tensor");
    const Held h = held(ids, block.weight.shape()[0], axis);
    const Tensor rows = take(block.weight, h.local, 0);
    return psum(where(expand_dims(h.inside, -1), rows, zeros_like(rows)), axis);
  });
}

Tensor parallel_cross_entropy(const Tensor& logits, const Tensor& labels, const std::string& axis,
                              Loc loc) {
  const kiln::detail::CallSite site(loc);
  return located(loc, [&]() -> Tensor {
    constexpr std::string_view op = "nn.parallel_cross_entropy";
    if (logits.rank() != 2 || labels.rank() != 1 || labels.shape()[0] != logits.shape()[0] ||
        !is_integral(labels.dtype()) || !is_floating(logits.dtype()))
      fail(op, "expected float logits [N, C / M] and integer labels [N]: got ", logits.type(),
           " and ", labels.type());
    // log Σ exp over every process's classes, shifted by the global max (a constant for the
    // derivative, as in logsumexp).
    const Tensor m = stop_gradient(pmax(max(logits, {1}, true), axis));
    const Tensor lse = log(psum(sum(exp(logits - m), {1}, true), axis)) + m;
    const Held h = held(labels, logits.shape()[1], axis);
    const Tensor picked = squeeze(take_along_axis(logits, expand_dims(h.local, 1), 1), {1});
    const Tensor label_logit = psum(where(h.inside, picked, zeros_like(picked)), axis);
    return mean(squeeze(lse, {1}) - label_logit);
  });
}

}  // namespace kiln::nn
