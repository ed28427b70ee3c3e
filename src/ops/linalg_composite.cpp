// Linear algebra composed of the primitives of src/ops/linalg.cpp and linalg_decomp.cpp and of
// the tensor ops (include/kiln/linalg.h, "compositions"): they trace, differentiate and batch
// through the rules of what they are built from.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kiln/linalg.h"
#include "kiln/math_ops.h"
#include "ops/linalg_common.h"

namespace kiln::linalg {
namespace {

using lapack::expect_defined;

// ---- multi_dot ------------------------------------------------------------------------------

// The split of an optimal chain product: split[i][j] = k means (i..k)(k+1..j).
struct ChainOrder {
  int64_t count;
  std::vector<int64_t> split;  // count x count, row-major
  int64_t at(int64_t i, int64_t j) const { return split[static_cast<std::size_t>(i * count + j)]; }
};

// The classic O(n^3) dynamic programme over the dimensions p: matrix i is p[i] x p[i + 1].
// Costs in double: products of three int64 sizes can overflow int64 and only compare here.
ChainOrder chain_order(const std::vector<int64_t>& p) {
  const int64_t n = static_cast<int64_t>(p.size()) - 1;
  const auto idx = [n](int64_t i, int64_t j) { return static_cast<std::size_t>(i * n + j); };
  std::vector<double> cost(static_cast<std::size_t>(n * n), 0.0);
  ChainOrder order{n, std::vector<int64_t>(static_cast<std::size_t>(n * n), 0)};
  const auto dim = [&](int64_t i) { return static_cast<double>(p[static_cast<std::size_t>(i)]); };
  for (int64_t len = 2; len <= n; ++len)
    for (int64_t i = 0; i + len - 1 < n; ++i) {
      const int64_t j = i + len - 1;
      cost[idx(i, j)] = std::numeric_limits<double>::infinity();
      for (int64_t k = i; k < j; ++k) {
        const double c = cost[idx(i, k)] + cost[idx(k + 1, j)] + dim(i) * dim(k + 1) * dim(j + 1);
        if (c < cost[idx(i, j)]) {
          cost[idx(i, j)] = c;
          order.split[idx(i, j)] = k;
        }
      }
    }
  return order;
}

Tensor chain_product(const std::vector<Tensor>& m, const ChainOrder& order, int64_t i, int64_t j,
                     Loc loc) {
  if (i == j) return m[static_cast<std::size_t>(i)];
  const int64_t k = order.at(i, j);
  return matmul(chain_product(m, order, i, k, loc), chain_product(m, order, k + 1, j, loc), loc);
}

// ---- cond -----------------------------------------------------------------------------------

bool is_two_norm(const std::optional<NormOrd>& p) {
  return !p || (p->number() && std::abs(*p->number()) == 2);
}

}  // namespace

Tensor multi_dot(const std::vector<Tensor>& arrays, Loc loc) {
  const detail::CallSite site(loc);
  if (arrays.size() < 2)
    fail("multi_dot", "too few operands: got ", arrays.size(), ", expected at least two");
  std::vector<Tensor> m;
  for (std::size_t i = 0; i < arrays.size(); ++i) {
    const Tensor& a = arrays[i];
    expect_defined("multi_dot", a);
    const bool end = i == 0 || i + 1 == arrays.size();
    if (a.rank() != 2 && !(end && a.rank() == 1))
      fail("multi_dot", "operand ", i, " has the wrong rank: got ", a.type(),
           end ? ", expected a vector or a matrix" : ", expected a matrix");
    // A first vector is a row, a last one a column; their unit axes are squeezed at the end.
    m.push_back(a.rank() == 2 ? a : expand_dims(a, i == 0 ? 0 : 1, loc));
  }
  std::vector<int64_t> p{m[0].dim(0)};
  for (std::size_t i = 0; i < m.size(); ++i) {
    if (i > 0 && m[i].dim(0) != p.back())
      fail("multi_dot", "shapes do not chain: got ", m[i - 1].type(), " then ", m[i].type(),
           " (operands ", i - 1, " and ", i,
           "), expected the columns of one to match the rows "
           "of the next");
    p.push_back(m[i].dim(1));
  }
  Tensor out = chain_product(m, chain_order(p), 0, static_cast<int64_t>(m.size()) - 1, loc);
  Axes squeezed;
  if (arrays.front().rank() == 1) squeezed.push_back(0);
  if (arrays.back().rank() == 1) squeezed.push_back(1);
  return squeezed.empty() ? out : squeeze(out, squeezed, loc);
}

Tensor cond(const Tensor& a, std::optional<NormOrd> p, Loc loc) {
  const detail::CallSite site(loc);
  expect_defined("cond", a);
  lapack::expect_matrices("cond", a.type());
  if (is_two_norm(p)) {
    const Tensor s = svdvals(a, loc);
    if (s.dim(-1) == 0)
      fail("cond", "empty matrices have no condition number: got ", a.type(),
           ", expected matrices with at least one row and one column");
    const Tensor largest = max(s, {-1}, false, loc), smallest = min(s, {-1}, false, loc);
    return p && *p->number() < 0 ? smallest / largest : largest / smallest;
  }
  lapack::expect_square("cond", a.type());
  const Tensor r =
      matrix_norm(a, *p, {-2, -1}, false, loc) * matrix_norm(inv(a, loc), *p, {-2, -1}, false, loc);
  // numpy's rule: a NaN that inv made of a singular matrix (one without NaNs) is inf.
  const Tensor singular =
      logical_and(isnan(r, loc), logical_not(any(isnan(a, loc), {-2, -1}, false, loc), loc), loc);
  return where(singular, scalar_like(r, INFINITY), r, loc);
}

Tensor matrix_rank(const Tensor& a, MatrixRankOptions o, Loc loc) {
  const detail::CallSite site(loc);
  expect_defined("matrix_rank", a);
  lapack::expect_matrices("matrix_rank", a.type());
  if (o.tol && o.rtol)
    fail("matrix_rank", "both tol and rtol given: got tol = ", *o.tol, " and rtol = ", *o.rtol,
         ", expected at most one");
  const Tensor s = svdvals(a, loc);
  if (s.dim(-1) == 0)
    return zeros(Shape(std::vector<int64_t>(s.shape().begin(), s.shape().end() - 1)), int64);
  Tensor cutoff;
  if (o.tol) {
    cutoff = full({}, *o.tol, a.dtype());
  } else {
    const double eps = a.dtype() == float32 ? std::numeric_limits<float>::epsilon()
                                            : std::numeric_limits<double>::epsilon();
    const double rtol = o.rtol.value_or(static_cast<double>(std::max(a.dim(-2), a.dim(-1))) * eps);
    cutoff = max(s, {-1}, true, loc) * rtol;
  }
  return sum(astype(greater(s, cutoff, loc), int64, loc), {-1}, false, loc);
}

Tensor cho_solve(const Tensor& c, const Tensor& b, bool lower, Loc loc) {
  const detail::CallSite site(loc);
  // A = L L^T: x = L^-T (L^-1 b); A = U^T U: x = U^-1 (U^-T b).
  const Tensor y = triangular_solve(c, b, {.lower = lower, .transpose = !lower}, loc);
  return triangular_solve(c, y, {.lower = lower, .transpose = lower}, loc);
}

Tensor eigvalsh(const Tensor& a, Loc loc) { return eigh(a, loc).first; }

}  // namespace kiln::linalg
