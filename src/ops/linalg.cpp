// Linear algebra through LAPACK (OpenBLAS): the primitives cholesky, triangular_solve, solve,
// slogdet, eigh and lu ([..., n, n] matrices, float32/float64, identical batch dimensions) and
// lu_pivots_to_permutation, and the public ops of include/kiln/linalg.h built on them (inv,
// det, lu_solve and lu compose).
//
// Kernels copy each matrix into a work buffer in the layout LAPACK wants (any strides, so
// views and broadcast operands need no contiguous copy first), which also keeps LAPACK from
// overwriting inputs. Batches of small matrices are split across Kiln's threads with
// single-threaded LAPACK calls; large matrices use LAPACK's own threads one after another.
// Arguments are validated before every call: OpenBLAS's xerbla would print to stderr.
#include "kiln/linalg.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <limits>
#include <type_traits>

#include "detail/dtype_dispatch.h"
#include "detail/parallel.h"
#include "kiln/indexing.h"
#include "kiln/ops.h"
#include "ops/linalg_common.h"
#include "ops/primitives.h"
#include "ops/rules.h"

// LAPACK's Fortran entry points (OpenBLAS), with the hidden lengths of character arguments.
extern "C" {
void spotrf_(const char* uplo, const blasint* n, float* a, const blasint* lda, blasint* info,
             std::size_t);
void dpotrf_(const char* uplo, const blasint* n, double* a, const blasint* lda, blasint* info,
             std::size_t);
void sgetrf_(const blasint* m, const blasint* n, float* a, const blasint* lda, blasint* ipiv,
             blasint* info);
void dgetrf_(const blasint* m, const blasint* n, double* a, const blasint* lda, blasint* ipiv,
             blasint* info);
void sgetrs_(const char* trans, const blasint* n, const blasint* nrhs, const float* a,
             const blasint* lda, const blasint* ipiv, float* b, const blasint* ldb, blasint* info,
             std::size_t);
void dgetrs_(const char* trans, const blasint* n, const blasint* nrhs, const double* a,
             const blasint* lda, const blasint* ipiv, double* b, const blasint* ldb, blasint* info,
             std::size_t);
void ssyevd_(const char* jobz, const char* uplo, const blasint* n, float* a, const blasint* lda,
             float* w, float* work, const blasint* lwork, blasint* iwork, const blasint* liwork,
             blasint* info, std::size_t, std::size_t);
void dsyevd_(const char* jobz, const char* uplo, const blasint* n, double* a, const blasint* lda,
             double* w, double* work, const blasint* lwork, blasint* iwork, const blasint* liwork,
             blasint* info, std::size_t, std::size_t);
}

namespace kiln {
namespace {

using ops::Ins;
using ops::Ts;
using ops::Types;
using namespace lapack;

// ---- shapes and types -------------------------------------------------------------------

// A [..., n, n] and B [..., n, k] of one dtype and identical batch dimensions -> B's type.
std::vector<TensorType> solve_rule(std::string_view op, Types in) {
  const TensorType &a = in[0], &b = in[1];
  expect_square(op, a);
  if (b.dtype != a.dtype)
    fail(op, "operands differ in dtype: got ", a, " and ", b, ", expected one dtype");
  const int ra = a.shape.rank(), rb = b.shape.rank();
  if (rb != ra || b.shape[rb - 2] != a.shape[ra - 1] ||
      !std::equal(a.shape.begin(), a.shape.end() - 2, b.shape.begin()))
    fail(op, "shapes do not match: got ", a, " and ", b,
         ", expected [..., n, n] and [..., n, k] with the same batch dimensions");
  return {b};
}

// ---- kernels ------------------------------------------------------------------------------

template <typename T>
blasint potrf(blasint n, T* a) {
  blasint info = 0;
  if constexpr (std::is_same_v<T, float>)
    spotrf_("L", &n, a, &n, &info, 1);
  else
    dpotrf_("L", &n, a, &n, &info, 1);
  return info;
}
template <typename T>
blasint getrf(blasint n, T* a, blasint* ipiv) {
  blasint info = 0;
  if constexpr (std::is_same_v<T, float>)
    sgetrf_(&n, &n, a, &n, ipiv, &info);
  else
    dgetrf_(&n, &n, a, &n, ipiv, &info);
  return info;
}
template <typename T>
void getrs(blasint n, blasint k, const T* lu, const blasint* ipiv, T* b) {
  blasint info = 0;
  if constexpr (std::is_same_v<T, float>)
    sgetrs_("N", &n, &k, lu, &n, ipiv, b, &n, &info, 1);
  else
    dgetrs_("N", &n, &k, lu, &n, ipiv, b, &n, &info, 1);
}

// Cholesky of (A + A^T) / 2, lower factor, upper triangle zero; NaNs where potrf fails.
template <typename T>
Tensor cholesky_kernel(const Tensor& a) {
  Tensor out = empty(a.type());
  const int64_t n = a.dim(-1);
  T* po = out.data<T>();
  for_each_matrix<T>("cholesky", batch_count(a), n, n * n, [&](int64_t i, T* w) {
    const MatrixView<T> m = matrix<T>(a, i);
    for (int64_t c = 0; c < n; ++c)
      for (int64_t r = c; r < n; ++r) w[r + c * n] = (m.at(r, c) + m.at(c, r)) / T{2};
    T* o = po + i * n * n;
    if (potrf<T>(static_cast<blasint>(n), w) != 0) return fill_nan(o, n * n);
    for (int64_t r = 0; r < n; ++r)
      for (int64_t c = 0; c < n; ++c) o[r * n + c] = c <= r ? w[r + c * n] : T{0};
  });
  return out;
}

struct TriangularAttrs {
  bool lower, transpose, unit_diagonal;
  explicit TriangularAttrs(const Attrs& a)
      : lower(a.get_bool("lower")),
        transpose(a.get_bool("transpose")),
        unit_diagonal(a.get_bool("unit_diagonal")) {}
};

template <typename T>
Tensor triangular_solve_kernel(const Tensor& a, const Tensor& b, const TriangularAttrs& opt) {
  Tensor out = empty(b.type());
  const int64_t n = a.dim(-1), k = b.dim(-1);
  if (out.numel() == 0) return out;
  T* po = out.data<T>();
  if (k > INT_MAX) fail("triangular_solve", "too many right-hand sides for BLAS: got ", b.type());
  const auto i32 = [](int64_t v) { return static_cast<blasint>(v); };
  for_each_matrix<T>("triangular_solve", batch_count(b), n, n * n, [&](int64_t i, T* w) {
    load(matrix<T>(a, i), Layout::row_major, w);
    T* x = po + i * n * k;
    load(matrix<T>(b, i), Layout::row_major, x);
    const auto uplo = opt.lower ? CblasLower : CblasUpper;
    const auto trans = opt.transpose ? CblasTrans : CblasNoTrans;
    const auto diag = opt.unit_diagonal ? CblasUnit : CblasNonUnit;
    if constexpr (std::is_same_v<T, float>)
      cblas_strsm(CblasRowMajor, CblasLeft, uplo, trans, diag, i32(n), i32(k), 1.0f, w, i32(n), x,
                  i32(k));
    else
      cblas_dtrsm(CblasRowMajor, CblasLeft, uplo, trans, diag, i32(n), i32(k), 1.0, w, i32(n), x,
                  i32(k));
  });
  return out;
}

// LU with partial pivoting; NaNs for a singular matrix (getrs would divide by its zero pivot).
template <typename T>
Tensor solve_kernel(const Tensor& a, const Tensor& b) {
  Tensor out = empty(b.type());
  const int64_t n = a.dim(-1), k = b.dim(-1);
  if (out.numel() == 0) return out;
  if (k > INT_MAX) fail("solve", "too many right-hand sides for LAPACK: got ", b.type());
  T* po = out.data<T>();
  // Work: the LU factors, the right-hand sides (column-major), the pivots.
  const int64_t piv_words = words_for_ints(n, sizeof(T));
  for_each_matrix<T>("solve", batch_count(b), n, n * n + n * k + piv_words, [&](int64_t i, T* w) {
    T* lu = w;
    T* x = w + n * n;
    auto* ipiv = reinterpret_cast<blasint*>(x + n * k);
    load(matrix<T>(a, i), Layout::col_major, lu);
    load(matrix<T>(b, i), Layout::col_major, x);
    T* o = po + i * n * k;
    if (getrf<T>(static_cast<blasint>(n), lu, ipiv) != 0) return fill_nan(o, n * k);
    getrs<T>(static_cast<blasint>(n), static_cast<blasint>(k), lu, ipiv, x);
    for (int64_t r = 0; r < n; ++r)
      for (int64_t c = 0; c < k; ++c) o[r * k + c] = x[r + c * n];
  });
  return out;
}

// sign and log|det| from the LU factors: the product of U's diagonal and the pivots' parity.
template <typename T>
std::vector<Tensor> slogdet_kernel(const Tensor& a) {
  const Shape batch(std::vector<int64_t>(a.shape().begin(), a.shape().end() - 2));
  Tensor sign = empty(batch, a.dtype()), logabs = empty(batch, a.dtype());
  const int64_t n = a.dim(-1);
  T* ps = sign.data<T>();
  T* pl = logabs.data<T>();
  if (n == 0) {  // det of a 0x0 matrix is 1
    std::fill(ps, ps + batch.numel(), T{1});
    std::fill(pl, pl + batch.numel(), T{0});
  }
  const int64_t piv_words = words_for_ints(n, sizeof(T));
  for_each_matrix<T>("slogdet", batch.numel(), n, n * n + piv_words, [&](int64_t i, T* w) {
    auto* ipiv = reinterpret_cast<blasint*>(w + n * n);
    load(matrix<T>(a, i), Layout::col_major, w);
    getrf<T>(static_cast<blasint>(n), w, ipiv);  // info > 0: a zero pivot, det 0 below
    T s = 1, l = 0;
    for (int64_t j = 0; j < n; ++j) {
      const T d = w[j + j * n];
      if (ipiv[j] != j + 1) s = -s;
      s *= d > 0 ? T{1} : d < 0 ? T{-1} : d == 0 ? T{0} : d;
      l += std::log(std::abs(d));
    }
    ps[i] = s;
    pl[i] = l;
  });
  return {sign, logabs};
}

// The permutation that applying LAPACK's row swaps (0-based: row i with row pivots[i], in
// order) makes of 0..size-1: row r of the swapped matrix is row perm[r] of the original.
void apply_swaps(const int32_t* pivots, int64_t count, int32_t* perm, int64_t size) {
  for (int64_t r = 0; r < size; ++r) perm[r] = static_cast<int32_t>(r);
  for (int64_t r = 0; r < count; ++r) std::swap(perm[r], perm[pivots[r]]);
}

// LU with partial pivoting, P^T A = L U: L's strict lower triangle and U in one matrix, the
// 0-based pivots (scipy's) and the permutation. A zero pivot (singular A) is kept, as LAPACK
// leaves it: U then has a zero on its diagonal.
template <typename T>
std::vector<Tensor> lu_kernel(const Tensor& a) {
  const int64_t n = a.dim(-1);
  Tensor lu = empty(a.type());
  const Shape vectors = with_tail(a.shape(), 1, {});
  Tensor pivots = empty(vectors, int32), perm = empty(vectors, int32);
  T* pl = lu.data<T>();
  int32_t* pp = pivots.data<int32_t>();
  int32_t* pm = perm.data<int32_t>();
  const int64_t piv_words = words_for_ints(n, sizeof(T));
  for_each_matrix<T>("lu", batch_count(a), n, n * n + piv_words, [&](int64_t i, T* w) {
    auto* ipiv = reinterpret_cast<blasint*>(w + n * n);
    load(matrix<T>(a, i), Layout::col_major, w);
    getrf<T>(static_cast<blasint>(n), w, ipiv);  // info > 0: a zero pivot, kept
    store_row_major(w, n, n, n, pl + i * n * n);
    int32_t* piv = pp + i * n;
    for (int64_t r = 0; r < n; ++r) piv[r] = static_cast<int32_t>(ipiv[r] - 1);
    apply_swaps(piv, n, pm + i * n, n);
  });
  return {lu, pivots, perm};
}

// Eigenvalues (ascending) and eigenvectors (columns) of (A + A^T) / 2 by divide and conquer;
// NaNs where syevd fails to converge (or the input holds NaN).
template <typename T>
std::vector<Tensor> eigh_kernel(const Tensor& a) {
  const int64_t n = a.dim(-1);
  std::vector<int64_t> ws(a.shape().begin(), a.shape().end() - 1);
  Tensor w = empty(Shape(ws), a.dtype()), v = empty(a.type());
  T* pw = w.data<T>();
  T* pv = v.data<T>();
  // syevd's documented minimum workspaces for eigenvectors: 1 + 6n + 2n^2 and 3 + 5n.
  const int64_t lwork = 1 + 6 * n + 2 * n * n, liwork = 3 + 5 * n;
  if (n > 0 && lwork > INT_MAX)
    fail("eigh", "matrix too large for LAPACK's workspace: got ", a.type(),
         ", expected n below 32768");
  const int64_t iwork_words = words_for_ints(liwork, sizeof(T));
  for_each_matrix<T>("eigh", batch_count(a), n, n * n + lwork + iwork_words, [&](int64_t i, T* x) {
    const MatrixView<T> m = matrix<T>(a, i);
    for (int64_t c = 0; c < n; ++c)
      for (int64_t r = c; r < n; ++r) x[r + c * n] = (m.at(r, c) + m.at(c, r)) / T{2};
    T* work = x + n * n;
    auto* iwork = reinterpret_cast<blasint*>(work + lwork);
    const blasint bn = static_cast<blasint>(n), bl = static_cast<blasint>(lwork),
                  bli = static_cast<blasint>(liwork);
    blasint info = 0;
    T* wi = pw + i * n;
    T* vi = pv + i * n * n;
    bool finite = true;
    for (int64_t k = 0; k < n * n; ++k) finite = finite && std::isfinite(x[k]);
    if (finite) {
      if constexpr (std::is_same_v<T, float>)
        ssyevd_("V", "L", &bn, x, &bn, wi, work, &bl, iwork, &bli, &info, 1, 1);
      else
        dsyevd_("V", "L", &bn, x, &bn, wi, work, &bl, iwork, &bli, &info, 1, 1);
    }
    if (!finite || info != 0) {
      fill_nan(wi, n);
      return fill_nan(vi, n * n);
    }
    for (int64_t r = 0; r < n; ++r)
      for (int64_t c = 0; c < n; ++c) vi[r * n + c] = x[r + c * n];
  });
  return {w, v};
}

// ---- derivative helpers (public ops, so rules trace and differentiate again) --------------

// A constant [n, n] matrix with value(i, j) at (i, j).
template <typename F>
Tensor constant_matrix(int64_t n, DType dtype, F&& value) {
  std::vector<double> v(static_cast<std::size_t>(n * n));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j) v[static_cast<std::size_t>(i * n + j)] = value(i, j);
  return astype(tensor(v, Shape{n, n}), dtype);
}
// The entries a triangular solve reads: one triangle, with or without the diagonal.
Tensor triangle_mask(int64_t n, DType dtype, const TriangularAttrs& opt) {
  return constant_matrix(n, dtype, [&](int64_t i, int64_t j) {
    if (i == j) return opt.unit_diagonal ? 0.0 : 1.0;
    return (opt.lower ? j < i : j > i) ? 1.0 : 0.0;
  });
}

Tensor symmetrize(const Tensor& x) { return (x + mT(x)) * 0.5; }

// Cholesky (Murray 2016, arXiv:1602.07527): dL = L Phi(L^-1 dA L^-T), Phi taking the lower
// triangle with the diagonal halved; dA is symmetrised like the input.
Tensor phi_mask(int64_t n, DType dtype) {
  return constant_matrix(n, dtype, [](int64_t i, int64_t j) {
    return i == j ? 0.5 : j < i ? 1.0 : 0.0;
  });
}

Primitive cholesky_primitive() {
  Primitive p;
  p.name = "cholesky";
  p.type_rule = [](Types in, const Attrs&) -> std::vector<TensorType> {
    expect_square("cholesky", in[0]);
    return {in[0]};
  };
  p.jvp = [](const RuleArgs& r, std::span<const Tangent> t) -> Ts {
    const Tensor& L = r.outputs[0];
    const Tensor y = triangular(L, symmetrize(*t[0]), true, false);  // L^-1 dA
    const Tensor m = triangular(L, mT(y), true, false);              // L^-1 dA L^-T
    return {matmul(L, m * phi_mask(L.dim(-1), L.dtype()))};
  };
  // The adjoint of the JVP: sym(L^-T Phi(L^T Lbar) L^-1).
  p.vjp = [](const RuleArgs& r, std::span<const Tangent> ct) -> Ts {
    const Tensor& L = r.outputs[0];
    const Tensor s = matmul(mT(L), *ct[0]) * phi_mask(L.dim(-1), L.dtype());
    const Tensor w = triangular(L, s, true, true);  // L^-T S
    return {symmetrize(mT(triangular(L, mT(w), true, true)))};
  };
  p.batch = batch_unary;
  return p;
}

// op(A) X = B: dX = op(A)^-1 (dB - op(T dA) X), T the mask of the entries A's solve reads;
// Bbar = op(A)^-T Xbar, Abar = -T(Bbar X^T) (transposed when op transposes).
Primitive triangular_solve_primitive() {
  Primitive p;
  p.name = "triangular_solve";
  p.arity = 2;
  p.type_rule = [](Types in, const Attrs& attrs) {
    (void)TriangularAttrs(attrs);
    return solve_rule("triangular_solve", in);
  };
  p.jvp = [](const RuleArgs& r, std::span<const Tangent> t) -> Ts {
    const TriangularAttrs opt(r.attrs);
    const Tensor &a = r.inputs[0], &x = r.outputs[0];
    std::optional<Tensor> rhs = t[1];
    if (t[0]) {
      const Tensor da = *t[0] * triangle_mask(a.dim(-1), a.dtype(), opt);
      const Tensor d = matmul(opt.transpose ? mT(da) : da, x);
      rhs = rhs ? *rhs - d : -d;
    }
    return {bind1(r.primitive, {a, *rhs}, r.attrs)};
  };
  p.vjp = [](const RuleArgs& r, std::span<const Tangent> ct) -> Ts {
    const TriangularAttrs opt(r.attrs);
    const Tensor &a = r.inputs[0], &x = r.outputs[0];
    Attrs flipped = r.attrs;
    flipped.set("transpose", !opt.transpose);
    const Tensor bbar = bind1(r.primitive, {a, *ct[0]}, flipped);
    const Tensor outer = opt.transpose ? matmul(x, mT(bbar)) : matmul(bbar, mT(x));
    return {-(outer * triangle_mask(a.dim(-1), a.dtype(), opt)), bbar};
  };
  p.batch = [](const BatchArgs& b) -> std::vector<Batched> {
    return {{bind1(b.primitive,
                   {ops::batch_first(b.inputs[0], b.dims[0], b.size),
                    ops::batch_first(b.inputs[1], b.dims[1], b.size)},
                   b.attrs),
             0}};
  };
  return p;
}

// A X = B: dX = A^-1 (dB - dA X); Bbar = A^-T Xbar, Abar = -Bbar X^T.
Primitive solve_primitive() {
  Primitive p;
  p.name = "solve";
  p.arity = 2;
  p.type_rule = [](Types in, const Attrs&) { return solve_rule("solve", in); };
  p.jvp = [](const RuleArgs& r, std::span<const Tangent> t) -> Ts {
    const Tensor &a = r.inputs[0], &x = r.outputs[0];
    std::optional<Tensor> rhs = t[1];
    if (t[0]) rhs = rhs ? *rhs - matmul(*t[0], x) : -matmul(*t[0], x);
    return {bind1(r.primitive, {a, *rhs})};
  };
  p.vjp = [](const RuleArgs& r, std::span<const Tangent> ct) -> Ts {
    const Tensor bbar = bind1(r.primitive, {mT(r.inputs[0]), *ct[0]});
    return {-matmul(bbar, mT(r.outputs[0])), bbar};
  };
  p.batch = [](const BatchArgs& b) -> std::vector<Batched> {
    return {{bind1(b.primitive, {ops::batch_first(b.inputs[0], b.dims[0], b.size),
                                 ops::batch_first(b.inputs[1], b.dims[1], b.size)}),
             0}};
  };
  return p;
}

// d log|det A| = tr(A^-1 dA); the sign is piecewise constant (zero derivative).
Primitive slogdet_primitive() {
  Primitive p;
  p.name = "slogdet";
  p.type_rule = [](Types in, const Attrs&) -> std::vector<TensorType> {
    expect_square("slogdet", in[0]);
    const TensorType t{in[0].dtype,
                       Shape(std::vector<int64_t>(in[0].shape.begin(), in[0].shape.end() - 2))};
    return {t, t};
  };
  p.jvp = [](const RuleArgs& r, std::span<const Tangent> t) -> Ts {
    const Tensor& a = r.inputs[0];
    const Tensor m = bind1(prim::solve(), {a, *t[0]});
    return {std::nullopt, sum(m * eye(a.dim(-1), a.dtype()), {-2, -1})};
  };
  p.vjp = [](const RuleArgs& r, std::span<const Tangent> ct) -> Ts {
    if (!ct[1]) return {std::nullopt};
    const Tensor& a = r.inputs[0];
    const Tensor inv_t =
        bind1(prim::solve(), {mT(a), broadcast_to(eye(a.dim(-1), a.dtype()), a.shape())});
    return {inv_t * expand_dims(expand_dims(*ct[1], -1), -1)};
  };
  p.batch = batch_unary;
  return p;
}

// P^T [..., n, n] from a permutation [..., n] (P^T A = A's rows in perm's order).
Tensor permutation_matrix_t(const Tensor& perm, DType dtype) {
  const Tensor cols = arange(perm.dim(-1), int32);
  return astype(equal(expand_dims(perm, -1), cols), dtype);
}

// P^T A = L U (L unit lower, U upper, both in `lu`), as JAX's lu_jvp_rule: with
// M = L^-1 P^T dA U^-1, dL = L tril(M, -1) and dU = triu(M) U, so d(lu) = dL + dU. The adjoint:
// M̄ = tril(L^T ḡ, -1) + triu(ḡ U^T), Ā = P L^-T M̄ U^-T. Pivots and permutation: integers,
// no derivative.
struct LuFactors {
  Tensor l, u, pt;  // unit-lower L, upper U, P^T
};
LuFactors lu_factors(const RuleArgs& r) {
  const Tensor& lu = r.outputs[0];
  return {tril(lu, -1) + eye(lu.dim(-1), lu.dtype()), triu(lu),
          permutation_matrix_t(r.outputs[2], lu.dtype())};
}

Primitive lu_primitive() {
  Primitive p;
  p.name = "lu";
  p.type_rule = [](Types in, const Attrs&) -> std::vector<TensorType> {
    expect_square("lu", in[0]);
    const TensorType vectors{int32, with_tail(in[0].shape, 1, {})};
    return {in[0], vectors, vectors};
  };
  p.jvp = [](const RuleArgs& r, std::span<const Tangent> t) -> Ts {
    const LuFactors f = lu_factors(r);
    const Tensor la = triangular(f.l, matmul(f.pt, *t[0]), true, false);  // L^-1 P^T dA
    const Tensor m = mT(triangular(f.u, mT(la), false, true));            // ... U^-1
    return {matmul(f.l, tril(m, -1)) + matmul(triu(m), f.u), std::nullopt, std::nullopt};
  };
  p.vjp = [](const RuleArgs& r, std::span<const Tangent> ct) -> Ts {
    const LuFactors f = lu_factors(r);
    const Tensor& g = *ct[0];
    const Tensor mbar = tril(matmul(mT(f.l), g), -1) + triu(matmul(g, mT(f.u)));
    const Tensor x = triangular(f.l, mbar, true, true);            // L^-T M̄
    const Tensor xbar = mT(triangular(f.u, mT(x), false, false));  // ... U^-T
    return {matmul(mT(f.pt), xbar)};
  };
  p.batch = batch_unary;
  return p;
}

Primitive lu_pivots_to_permutation_primitive() {
  Primitive p;
  p.name = "lu_pivots_to_permutation";
  p.type_rule = [](Types in, const Attrs& attrs) -> std::vector<TensorType> {
    if (in[0].dtype != int32 || in[0].shape.rank() < 1)
      fail("lu_pivots_to_permutation", "unsupported operand: got ", in[0],
           ", expected int32 pivots [..., k]");
    const int64_t size = attrs.get_int("size");
    if (size < in[0].shape[in[0].shape.rank() - 1])
      fail("lu_pivots_to_permutation", "permutation shorter than the pivots: got size ", size,
           " for ", in[0], ", expected at least ", in[0].shape[in[0].shape.rank() - 1]);
    return {{int32, with_tail(in[0].shape, 1, {size})}};
  };
  p.differentiable = false;  // integers to integers
  p.batch = batch_unary;
  return p;
}

// The permutation of lu_pivots_to_permutation; a pivot outside [0, size) is an Error.
std::vector<Tensor> lu_pivots_to_permutation_kernel(const Tensor& pivots, int64_t size) {
  const Tensor piv = pivots.contiguous();
  const int64_t k = piv.dim(-1);
  int64_t batch = 1;
  for (int d = 0; d + 1 < piv.rank(); ++d) batch *= piv.dim(d);
  Tensor perm = empty(with_tail(piv.shape(), 1, {size}), int32);
  const int32_t* pp = piv.data<int32_t>();
  for (int64_t i = 0; i < piv.numel(); ++i)
    if (pp[i] < 0 || pp[i] >= size)
      fail("lu_pivots_to_permutation", "pivot out of range: got ", pp[i],
           ", expected 0 <= pivot < ", size);
  for (int64_t b = 0; b < batch; ++b)
    apply_swaps(pp + b * k, k, perm.data<int32_t>() + b * size, size);
  return {perm};
}

// A = V diag(w) V^T (A symmetrised): with M = V^T sym(dA) V, dw = diag(M) and
// dV = V (F o M), F_ij = 1 / (w_j - w_i) off the diagonal, 0 on it; the VJP is the adjoint,
// sym(V (diag(wbar) + F o (V^T Vbar)) V^T). Repeated eigenvalues make F infinite: the
// eigenvectors are not differentiable there (docs/OPS.md).

Primitive eigh_primitive() {
  Primitive p;
  p.name = "eigh";
  p.type_rule = [](Types in, const Attrs&) -> std::vector<TensorType> {
    expect_square("eigh", in[0]);
    const TensorType w{in[0].dtype,
                       Shape(std::vector<int64_t>(in[0].shape.begin(), in[0].shape.end() - 1))};
    return {w, in[0]};
  };
  p.jvp = [](const RuleArgs& r, std::span<const Tangent> t) -> Ts {
    const Tensor &w = r.outputs[0], &v = r.outputs[1];
    const Tensor m = matmul(mT(v), matmul(symmetrize(*t[0]), v));
    return {sum(m * eye(w.dim(-1), w.dtype()), {-1}), matmul(v, inverse_gaps(w) * m)};
  };
  p.vjp = [](const RuleArgs& r, std::span<const Tangent> ct) -> Ts {
    const Tensor &w = r.outputs[0], &v = r.outputs[1];
    std::optional<Tensor> inner;
    if (ct[0]) inner = diag_embed(*ct[0]);
    if (ct[1]) {
      const Tensor f = inverse_gaps(w) * matmul(mT(v), *ct[1]);
      inner = inner ? *inner + f : f;
    }
    return {symmetrize(matmul(v, matmul(*inner, mT(v))))};
  };
  p.batch = batch_unary;
  return p;
}

}  // namespace

const Primitive& prim::cholesky() {
  static const Primitive& p = detail::register_builtin(
      cholesky_primitive(), float_kernel(1, []<typename T>(Ins in, const Attrs&) {
        return std::vector<Tensor>{cholesky_kernel<T>(in[0])};
      }));
  return p;
}

const Primitive& prim::triangular_solve() {
  static const Primitive& p = detail::register_builtin(
      triangular_solve_primitive(), float_kernel(2, []<typename T>(Ins in, const Attrs& attrs) {
        return std::vector<Tensor>{
            triangular_solve_kernel<T>(in[0], in[1], TriangularAttrs(attrs))};
      }));
  return p;
}

const Primitive& prim::solve() {
  static const Primitive& p = detail::register_builtin(
      solve_primitive(), float_kernel(2, []<typename T>(Ins in, const Attrs&) {
        return std::vector<Tensor>{solve_kernel<T>(in[0], in[1])};
      }));
  return p;
}

const Primitive& prim::slogdet() {
  static const Primitive& p = detail::register_builtin(
      slogdet_primitive(),
      float_kernel(1, []<typename T>(Ins in, const Attrs&) { return slogdet_kernel<T>(in[0]); }));
  return p;
}

const Primitive& prim::lu() {
  static const Primitive& p = detail::register_builtin(
      lu_primitive(),
      float_kernel(1, []<typename T>(Ins in, const Attrs&) { return lu_kernel<T>(in[0]); }));
  return p;
}

const Primitive& prim::lu_pivots_to_permutation() {
  static const Primitive& p = detail::register_builtin(
      lu_pivots_to_permutation_primitive(),
      {{ops::cpu({DTypeSet(int32)}), [](Ins in, const Attrs& attrs) {
          return lu_pivots_to_permutation_kernel(in[0], attrs.get_int("size"));
        }}});
  return p;
}

const Primitive& prim::eigh() {
  static const Primitive& p = detail::register_builtin(
      eigh_primitive(),
      float_kernel(1, []<typename T>(Ins in, const Attrs&) { return eigh_kernel<T>(in[0]); }));
  return p;
}

// ---- public ops ---------------------------------------------------------------------------

namespace linalg {
namespace {

// a, checked to be float32/float64 square matrices [..., n, n].
const Tensor& square_operand(std::string_view op, const Tensor& a) {
  expect_defined(op, a);
  expect_square(op, a.type());
  return a;
}

// A [..., n, n] against b [..., n, k] or a vector b [n]: checks, promotes, broadcasts the
// batch dimensions and applies `solve_with` to the primitive-ready pair.
template <typename F>
Tensor solve_like(std::string_view op, const Tensor& a, const Tensor& b, Loc loc, F&& solve_with) {
  expect_defined(op, b);
  square_operand(op, a);
  const DType dt = promote_types(a.dtype(), b.dtype());
  if (dt != float32 && dt != float64)
    fail(op, "unsupported dtype: got ", a.type(), " and ", b.type(),
         ", expected float32 or float64");
  const bool vector = b.rank() == 1;
  if (b.rank() == 0 || b.dim(vector ? -1 : -2) != a.dim(-1))
    fail(op, "shapes do not match: got ", a.type(), " and ", b.type(), ", expected b of shape [",
         a.dim(-1), "] or [..., ", a.dim(-1), ", k] for A of shape [..., ", a.dim(-1), ", ",
         a.dim(-1), "]");
  Tensor x = ops::cast_if_needed(a, dt, loc);
  Tensor y = ops::cast_if_needed(b, dt, loc);
  if (vector) y = expand_dims(y, -1, loc);
  // Batch dimensions broadcast (numpy rules).
  const Shape ba(std::vector<int64_t>(x.shape().begin(), x.shape().end() - 2));
  const Shape bb(std::vector<int64_t>(y.shape().begin(), y.shape().end() - 2));
  const Shape bs = broadcast_shapes(op, ba, bb);
  const std::vector<int64_t> batch(bs.begin(), bs.end());
  const auto with_batch = [&](const Tensor& t) {
    std::vector<int64_t> s = batch;
    s.push_back(t.dim(-2));
    s.push_back(t.dim(-1));
    const Shape full(std::move(s));
    return full == t.shape() ? t : broadcast_to(t, full, loc);
  };
  Tensor out = solve_with(with_batch(x), with_batch(y));
  return vector ? squeeze(out, {-1}, loc) : out;
}

}  // namespace

Tensor cholesky(const Tensor& a, Loc loc) {
  const detail::CallSite site(loc);
  return bind1(prim::cholesky(), {square_operand("cholesky", a)}, {}, loc);
}

Tensor triangular_solve(const Tensor& a, const Tensor& b, TriangularSolveOptions o, Loc loc) {
  const detail::CallSite site(loc);
  return solve_like("triangular_solve", a, b, loc, [&](const Tensor& x, const Tensor& y) {
    return bind1(
        prim::triangular_solve(), {x, y},
        {{"lower", o.lower}, {"transpose", o.transpose}, {"unit_diagonal", o.unit_diagonal}}, loc);
  });
}

Tensor solve(const Tensor& a, const Tensor& b, Loc loc) {
  const detail::CallSite site(loc);
  return solve_like("solve", a, b, loc, [&](const Tensor& x, const Tensor& y) {
    return bind1(prim::solve(), {x, y}, {}, loc);
  });
}

Tensor inv(const Tensor& a, Loc loc) {
  const detail::CallSite site(loc);
  const Tensor x = square_operand("inv", a);
  return bind1(prim::solve(), {x, broadcast_to(eye(x.dim(-1), x.dtype()), x.shape(), loc)}, {},
               loc);
}

std::pair<Tensor, Tensor> slogdet(const Tensor& a, Loc loc) {
  const detail::CallSite site(loc);
  const std::vector<Tensor> out = bind(prim::slogdet(), {square_operand("slogdet", a)}, {}, loc);
  return {out[0], out[1]};
}

Tensor det(const Tensor& a, Loc loc) {
  const detail::CallSite site(loc);
  const auto [sign, logabs] = slogdet(a, loc);
  return sign * exp(logabs, loc);
}

LUFactor lu_factor(const Tensor& a, Loc loc) {
  const detail::CallSite site(loc);
  const std::vector<Tensor> out = bind(prim::lu(), {square_operand("lu_factor", a)}, {}, loc);
  return {out[0], out[1]};
}

Tensor lu_pivots_to_permutation(const Tensor& pivots, int64_t size, Loc loc) {
  const detail::CallSite site(loc);
  expect_defined("lu_pivots_to_permutation", pivots);
  return bind1(prim::lu_pivots_to_permutation(), {pivots}, {{"size", size}}, loc);
}

Tensor lu_solve(const LUFactor& factor, const Tensor& b, int trans, Loc loc) {
  const detail::CallSite site(loc);
  if (trans < 0 || trans > 2)
    fail("lu_solve", "unknown trans: got ", trans, ", expected 0, 1 or 2");
  expect_defined("lu_solve", factor.pivots);
  square_operand("lu_solve", factor.lu);
  const Shape vectors = with_tail(factor.lu.shape(), 1, {});
  if (factor.pivots.type() != TensorType{int32, vectors})
    fail("lu_solve", "pivots do not match the factor: got ", factor.pivots.type(), " for ",
         factor.lu.type(), ", expected ", TensorType{int32, vectors});
  // P^T A = L U, P^T [..., n, n] from the permutation; only lu's triangles are read.
  const Tensor pt = permutation_matrix_t(
      lu_pivots_to_permutation(factor.pivots, factor.lu.dim(-1), loc), factor.lu.dtype());
  const TriangularSolveOptions unit_lower{.lower = true, .unit_diagonal = true};
  const TriangularSolveOptions upper{.lower = false};
  expect_defined("lu_solve", b);
  const bool vector = b.rank() == 1;
  const int64_t n = factor.lu.dim(-1);
  if (b.rank() == 0 || b.dim(vector ? -1 : -2) != n)
    fail("lu_solve", "shapes do not match: got ", factor.lu.type(), " and ", b.type(),
         ", expected b of shape [", n, "] or [..., ", n, ", k]");
  const Tensor rhs = vector ? expand_dims(b, -1, loc) : b;
  Tensor x;
  if (trans == 0) {  // x = U^-1 L^-1 P^T b
    const Tensor y = triangular_solve(factor.lu, matmul(pt, rhs, loc), unit_lower, loc);
    x = triangular_solve(factor.lu, y, upper, loc);
  } else {  // A^T = U^T L^T P^T: x = P L^-T U^-T b
    TriangularSolveOptions ut = upper, lt = unit_lower;
    ut.transpose = lt.transpose = true;
    x = matmul(mT(pt),
               triangular_solve(factor.lu, triangular_solve(factor.lu, rhs, ut, loc), lt, loc),
               loc);
  }
  return vector ? squeeze(x, {-1}, loc) : x;
}

LU lu(const Tensor& a, Loc loc) {
  const detail::CallSite site(loc);
  const std::vector<Tensor> out = bind(prim::lu(), {square_operand("lu", a)}, {}, loc);
  const Tensor& f = out[0];
  return {mT(permutation_matrix_t(out[2], f.dtype())), tril(f, -1, loc) + eye(f.dim(-1), f.dtype()),
          triu(f, 0, loc)};
}

std::pair<Tensor, Tensor> eigh(const Tensor& a, Loc loc) {
  const detail::CallSite site(loc);
  const std::vector<Tensor> out = bind(prim::eigh(), {square_operand("eigh", a)}, {}, loc);
  return {out[0], out[1]};
}

}  // namespace linalg
}  // namespace kiln
