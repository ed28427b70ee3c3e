// random::multivariate_normal (include/kiln/random.h): a composition of random::normal and
// linalg::cholesky, so it is keyed, jit-able, differentiable in mean and cov, and batches
// under vmap as those do (one batched cholesky).
#include "kiln/linalg.h"
#include "kiln/ops.h"
#include "kiln/random.h"
#include "ops/rules.h"

namespace kiln::random {
namespace {

Shape batch_of(const Tensor& t, int drop) {
  return Shape(std::vector<int64_t>(t.shape().begin(), t.shape().end() - drop));
}

Tensor draw(const Tensor& key, const Tensor& mean, const Tensor& cov,
            const std::optional<Shape>& shape, Loc loc) {
  const detail::CallSite site(loc);
  constexpr std::string_view op = "multivariate_normal";
  if (!mean.defined() || !cov.defined())
    fail(op, "undefined operand: got a default-constructed Tensor, expected a tensor");
  if (mean.rank() < 1 || cov.rank() < 2 || cov.dim(-1) != cov.dim(-2) ||
      cov.dim(-1) != mean.dim(-1))
    fail(op, "shapes do not match: got mean ", mean.type(), " and cov ", cov.type(),
         ", expected mean [..., d] and cov [..., d, d]");
  const DType dt = promote_types(mean.dtype(), cov.dtype());
  if (!is_floating(dt))
    fail(op, "unsupported dtypes: got mean ", mean.type(), " and cov ", cov.type(),
         ", expected floating dtypes");
  const Shape batch = broadcast_shapes(op, batch_of(mean, 1), batch_of(cov, 2));
  if (shape && broadcast_shapes(op, *shape, batch) != *shape)
    fail(op, "shape does not fit: got shape ", *shape, " for the batch shape ", batch,
         " of mean and cov, expected a shape the batch shape broadcast to");
  // cholesky takes float32/float64: half precision computes in float32.
  const DType compute = dt == float64 ? float64 : float32;
  const Tensor l = linalg::cholesky(ops::cast_if_needed(cov, compute, loc), loc);
  std::vector<int64_t> zs(shape ? shape->begin() : batch.begin(),
                          shape ? shape->end() : batch.end());
  zs.push_back(mean.dim(-1));
  const Tensor z = normal(key, Shape(std::move(zs)), compute, loc);
  const Tensor x = ops::cast_if_needed(mean, compute, loc) +
                   squeeze(matmul(l, expand_dims(z, -1, loc), loc), {-1}, loc);
  return ops::cast_if_needed(x, dt, loc);
}

}  // namespace

Tensor multivariate_normal(const Tensor& key, const Tensor& mean, const Tensor& cov, Loc loc) {
  return draw(key, mean, cov, std::nullopt, loc);
}

Tensor multivariate_normal(const Tensor& key, const Tensor& mean, const Tensor& cov,
                           const Shape& shape, Loc loc) {
  return draw(key, mean, cov, shape, loc);
}

}  // namespace kiln::random
