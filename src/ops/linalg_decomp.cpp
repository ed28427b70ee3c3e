// Decompositions of [..., m, n] matrices through LAPACK (OpenBLAS): the primitives qr
// (geqrf + orgqr), svd and svdvals (gesdd) and pinv (from gesdd, with its own derivative),
// and the public ops built on them and on the primitives of src/ops/linalg.cpp: lstsq, norm,
// matrix_power (include/kiln/linalg.h).
// Kernels follow linalg.cpp: each matrix is copied into a column-major work buffer (any
// strides), batches of small matrices are spread over Kiln's threads, and every LAPACK
// argument is valid before the call (OpenBLAS's xerbla would print to stderr).
#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <type_traits>

#include "kiln/indexing.h"
#include "kiln/linalg.h"
#include "ops/linalg_common.h"

// LAPACK's Fortran entry points (OpenBLAS), with the hidden lengths of character arguments.
extern "C" {
void sgeqrf_(const blasint* m, const blasint* n, float* a, const blasint* lda, float* tau,
             float* work, const blasint* lwork, blasint* info);
void dgeqrf_(const blasint* m, const blasint* n, double* a, const blasint* lda, double* tau,
             double* work, const blasint* lwork, blasint* info);
void sorgqr_(const blasint* m, const blasint* n, const blasint* k, float* a, const blasint* lda,
             const float* tau, float* work, const blasint* lwork, blasint* info);
void dorgqr_(const blasint* m, const blasint* n, const blasint* k, double* a, const blasint* lda,
             const double* tau, double* work, const blasint* lwork, blasint* info);
void sgesdd_(const char* jobz, const blasint* m, const blasint* n, float* a, const blasint* lda,
             float* s, float* u, const blasint* ldu, float* vt, const blasint* ldvt, float* work,
             const blasint* lwork, blasint* iwork, blasint* info, std::size_t);
void dgesdd_(const char* jobz, const blasint* m, const blasint* n, double* a, const blasint* lda,
             double* s, double* u, const blasint* ldu, double* vt, const blasint* ldvt,
             double* work, const blasint* lwork, blasint* iwork, blasint* info, std::size_t);
}

namespace kiln {
namespace {

using namespace lapack;
using ops::Ins;
using ops::Ts;
using ops::Types;

// ---- LAPACK calls ---------------------------------------------------------------------------

template <typename T>
blasint geqrf(blasint m, blasint n, T* a, T* tau, T* work, blasint lwork) {
  blasint info = 0;
  if constexpr (std::is_same_v<T, float>)
    sgeqrf_(&m, &n, a, &m, tau, work, &lwork, &info);
  else
    dgeqrf_(&m, &n, a, &m, tau, work, &lwork, &info);
  return info;
}
template <typename T>
blasint orgqr(blasint m, blasint n, blasint k, T* a, const T* tau, T* work, blasint lwork) {
  blasint info = 0;
  if constexpr (std::is_same_v<T, float>)
    sorgqr_(&m, &n, &k, a, &m, tau, work, &lwork, &info);
  else
    dorgqr_(&m, &n, &k, a, &m, tau, work, &lwork, &info);
  return info;
}
// jobz 'N' (values), 'S' (reduced vectors) or 'A' (full); ldvt is vt's row count.
template <typename T>
blasint gesdd(char jobz, blasint m, blasint n, T* a, T* s, T* u, blasint ldu, T* vt, blasint ldvt,
              T* work, blasint lwork, blasint* iwork) {
  blasint info = 0;
  if constexpr (std::is_same_v<T, float>)
    sgesdd_(&jobz, &m, &n, a, &m, s, u, &ldu, vt, &ldvt, work, &lwork, iwork, &info, 1);
  else
    dgesdd_(&jobz, &m, &n, a, &m, s, u, &ldu, vt, &ldvt, work, &lwork, iwork, &info, 1);
  return info;
}

// The workspace size a LAPACK routine asks for in a query (lwork = -1), at least `least`.
template <typename T, typename Query>
int64_t queried_lwork(int64_t least, Query&& query) {
  T size = 0;
  query(&size);
  return std::max<int64_t>(least, static_cast<int64_t>(size));
}

template <typename T>
void fill_identity(T* p, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) p[r * cols + c] = r == c ? T{1} : T{0};
}

// ---- qr -------------------------------------------------------------------------------------

struct QrShape {
  int64_t m, n, k, q_cols, r_rows;  // Q [m, q_cols], R [r_rows, n]
};
QrShape qr_shape(const TensorType& a, bool complete) {
  const int64_t m = a.shape[a.shape.rank() - 2], n = a.shape[a.shape.rank() - 1];
  const int64_t k = std::min(m, n);
  return {m, n, k, complete ? m : k, complete ? m : k};
}

template <typename T>
std::vector<Tensor> qr_kernel(const Tensor& a, bool complete) {
  const QrShape s = qr_shape(a.type(), complete);
  Tensor q = empty(with_tail(a.shape(), 2, {s.m, s.q_cols}), a.dtype());
  Tensor r = empty(with_tail(a.shape(), 2, {s.r_rows, s.n}), a.dtype());
  T* pq = q.data<T>();
  T* pr = r.data<T>();
  const int64_t cols = std::max(s.n, s.q_cols);  // the work matrix holds A, then Q
  const auto b = [](int64_t v) { return static_cast<blasint>(v); };
  int64_t lwork = std::max<int64_t>(1, cols);
  if (s.k > 0) {
    lwork = queried_lwork<T>(
        lwork, [&](T* size) { geqrf<T>(b(s.m), b(s.n), nullptr, nullptr, size, -1); });
    lwork = queried_lwork<T>(
        lwork, [&](T* size) { orgqr<T>(b(s.m), b(s.q_cols), b(s.k), nullptr, nullptr, size, -1); });
  }
  for_each_matrix<T>(
      "qr", batch_count(a), std::max(s.m, s.n), s.m * cols + s.k + lwork, [&](int64_t i, T* w) {
        T* qi = pq + i * s.m * s.q_cols;
        T* ri = pr + i * s.r_rows * s.n;
        if (s.k == 0) {  // an empty factorisation: Q is the identity, R empty or zero
          fill_identity(qi, s.m, s.q_cols);
          return std::fill(ri, ri + s.r_rows * s.n, T{0});
        }
        T* tau = w + s.m * cols;
        T* work = tau + s.k;
        load(matrix<T>(a, i), Layout::col_major, w);
        geqrf<T>(b(s.m), b(s.n), w, tau, work, b(lwork));
        for (int64_t row = 0; row < s.r_rows; ++row)
          for (int64_t c = 0; c < s.n; ++c) ri[row * s.n + c] = c >= row ? w[row + c * s.m] : T{0};
        orgqr<T>(b(s.m), b(s.q_cols), b(s.k), w, tau, work, b(lwork));
        store_row_major(w, s.m, s.m, s.q_cols, qi);
      });
  return {q, r};
}

// Derivatives (m >= n, Q [m, n], R [n, n]; the formulas of Walter & Lehmann 2018, as JAX):
// X = dA R^-1, C = Q^T X, Omega = tril(C, -1) - tril(C, -1)^T (skew):
//   dQ = Q (Omega - C) + X,  dR = (C - Omega) R.
// Their adjoint: M = Rbar R^T - Q^T Qbar, N = M with its upper triangle copied to the lower,
//   Abar = (Qbar + Q N) R^-T.
void expect_qr_differentiable(const Tensor& a, const Attrs& attrs) {
  const bool complete = attrs.get_bool("complete");
  const int64_t m = a.dim(-2), n = a.dim(-1);
  if (m < n || (complete && m != n))
    fail("qr", "derivative not implemented for this shape and mode: got ", a.type(),
         complete ? " (complete)" : " (reduced)",
         ", expected m >= n with mode reduced, or a square matrix");
}

Tensor times_inverse_r(const Tensor& y, const Tensor& r, bool transpose) {  // Y R^-1 or Y R^-T
  return mT(triangular(r, mT(y), false, !transpose));
}

Primitive qr_primitive() {
  Primitive p;
  p.name = "qr";
  p.type_rule = [](Types in, const Attrs& attrs) -> std::vector<TensorType> {
    expect_matrices("qr", in[0]);
    const QrShape s = qr_shape(in[0], attrs.get_bool("complete"));
    return {{in[0].dtype, with_tail(in[0].shape, 2, {s.m, s.q_cols})},
            {in[0].dtype, with_tail(in[0].shape, 2, {s.r_rows, s.n})}};
  };
  p.jvp = [](const RuleArgs& r, std::span<const Tangent> t) -> Ts {
    expect_qr_differentiable(r.inputs[0], r.attrs);
    const Tensor &q = r.outputs[0], &rr = r.outputs[1];
    const Tensor x = times_inverse_r(*t[0], rr, false);
    const Tensor c = matmul(mT(q), x);
    const Tensor lower = tril(c, -1);
    const Tensor omega = lower - mT(lower);
    return {matmul(q, omega - c) + x, matmul(c - omega, rr)};
  };
  p.vjp = [](const RuleArgs& r, std::span<const Tangent> ct) -> Ts {
    expect_qr_differentiable(r.inputs[0], r.attrs);
    const Tensor &q = r.outputs[0], &rr = r.outputs[1];
    std::optional<Tensor> m;
    if (ct[1]) m = matmul(*ct[1], mT(rr));
    if (ct[0]) m = m ? *m - matmul(mT(q), *ct[0]) : -matmul(mT(q), *ct[0]);
    const Tensor n = triu(*m) + mT(triu(*m, 1));
    const Tensor qn = matmul(q, n);
    return {times_inverse_r(ct[0] ? *ct[0] + qn : qn, rr, true)};
  };
  p.batch = batch_unary;
  return p;
}

// ---- svd ------------------------------------------------------------------------------------

struct SvdShape {
  int64_t m, n, k, u_cols, vh_rows;  // U [m, u_cols], s [k], Vh [vh_rows, n]
};
SvdShape svd_shape(const TensorType& a, bool full) {
  const int64_t m = a.shape[a.shape.rank() - 2], n = a.shape[a.shape.rank() - 1];
  const int64_t k = std::min(m, n);
  return {m, n, k, full ? m : k, full ? n : k};
}

// Singular values (descending) and, with vectors, U and Vh; NaNs where gesdd fails to
// converge or the input holds NaN/inf (gesdd's behaviour on those is not specified).
template <typename T>
std::vector<Tensor> svd_kernel(const Tensor& a, bool vectors, bool full) {
  const SvdShape s = svd_shape(a.type(), full);
  Tensor sv = empty(with_tail(a.shape(), 2, {s.k}), a.dtype());
  Tensor u, vh;
  if (vectors) {
    u = empty(with_tail(a.shape(), 2, {s.m, s.u_cols}), a.dtype());
    vh = empty(with_tail(a.shape(), 2, {s.vh_rows, s.n}), a.dtype());
  }
  const char jobz = !vectors ? 'N' : full ? 'A' : 'S';
  const auto b = [](int64_t v) { return static_cast<blasint>(v); };
  const int64_t u_size = vectors ? s.m * s.u_cols : 0, vt_size = vectors ? s.vh_rows * s.n : 0;
  const blasint ldu = b(std::max<int64_t>(1, s.m)), ldvt = b(std::max<int64_t>(1, s.vh_rows));
  int64_t lwork = 1;
  if (s.k > 0)
    lwork = queried_lwork<T>(1, [&](T* size) {
      blasint iwork = 0;
      gesdd<T>(jobz, b(s.m), b(s.n), nullptr, nullptr, nullptr, ldu, nullptr, ldvt, size, -1,
               &iwork);
    });
  const int64_t iwork_words = words_for_ints(8 * s.k, sizeof(T));
  for_each_matrix<T>(
      "svd", batch_count(a), std::max(s.m, s.n),
      s.m * s.n + s.k + u_size + vt_size + lwork + iwork_words, [&](int64_t i, T* w) {
        T* si = sv.data<T>() + i * s.k;
        T* ui = vectors ? u.data<T>() + i * u_size : nullptr;
        T* vi = vectors ? vh.data<T>() + i * vt_size : nullptr;
        if (s.k == 0) {  // no singular values: full U and Vh are identities
          if (vectors) {
            fill_identity(ui, s.m, s.u_cols);
            fill_identity(vi, s.vh_rows, s.n);
          }
          return;
        }
        T* x = w;
        T* ws = x + s.m * s.n;
        T* wu = ws + s.k;
        T* wv = wu + u_size;
        T* work = wv + vt_size;
        auto* iwork = reinterpret_cast<blasint*>(work + lwork);
        load(matrix<T>(a, i), Layout::col_major, x);
        const bool finite = std::all_of(x, x + s.m * s.n, [](T v) { return std::isfinite(v); });
        if (!finite ||
            gesdd<T>(jobz, b(s.m), b(s.n), x, ws, wu, ldu, wv, ldvt, work, b(lwork), iwork) != 0) {
          fill_nan(si, s.k);
          if (vectors) {
            fill_nan(ui, u_size);
            fill_nan(vi, vt_size);
          }
          return;
        }
        std::copy(ws, ws + s.k, si);
        if (vectors) {
          store_row_major(wu, s.m, s.m, s.u_cols, ui);
          store_row_major(wv, s.vh_rows, s.vh_rows, s.n, vi);
        }
      });
  if (!vectors) return {sv};
  return {u, sv, vh};
}

// Derivatives of the reduced SVD (Townsend 2016; JAX's rule), V = Vh^T, S = diag(s),
// P = U^T dA V, F_ij = 1 / (s_j^2 - s_i^2) off the diagonal:
//   ds = diag(P),  dU = U (F o (P S + S P^T)) + (I - U U^T) dA V S^-1  (m > k),
//   dV = V (F o (S P + P^T S)) + (I - V V^T) dA^T U S^-1  (n > k).
// The adjoint: Pbar = diag(sbar) + (J + J^T) S + S (K + K^T), J = F o (U^T Ubar),
// K = F o (V^T Vbar), Abar = U Pbar Vh + (I - U U^T) Ubar S^-1 Vh + U S^-1 Vbar^T (I - V V^T).
void expect_svd_differentiable(const Tensor& a, const Attrs& attrs) {
  if (attrs.get_bool("full_matrices") && a.dim(-1) != a.dim(-2))
    fail("svd", "derivative not implemented with full_matrices for non-square matrices: got ",
         a.type(), ", expected full_matrices = false or a square matrix");
}

struct SvdFactors {
  Tensor u, s, vh;
};
SvdFactors reduced_svd(const Tensor& a) {
  const std::vector<Tensor> out = bind(prim::svd(), {a}, {{"full_matrices", false}});
  return {out[0], out[1], out[2]};
}

Primitive svd_primitive() {
  Primitive p;
  p.name = "svd";
  p.type_rule = [](Types in, const Attrs& attrs) -> std::vector<TensorType> {
    expect_matrices("svd", in[0]);
    const SvdShape s = svd_shape(in[0], attrs.get_bool("full_matrices"));
    return {{in[0].dtype, with_tail(in[0].shape, 2, {s.m, s.u_cols})},
            {in[0].dtype, with_tail(in[0].shape, 2, {s.k})},
            {in[0].dtype, with_tail(in[0].shape, 2, {s.vh_rows, s.n})}};
  };
  p.jvp = [](const RuleArgs& r, std::span<const Tangent> t) -> Ts {
    const Tensor& a = r.inputs[0];
    expect_svd_differentiable(a, r.attrs);
    const Tensor &u = r.outputs[0], &s = r.outputs[1], &vh = r.outputs[2];
    const Tensor v = mT(vh), da = *t[0];
    const Tensor p = matmul(mT(u), matmul(da, v));
    const Tensor f = inverse_gaps(s * s);
    const Tensor s_row = expand_dims(s, -2), s_col = expand_dims(s, -1);
    Tensor du = matmul(u, f * (p * s_row + s_col * mT(p)));
    Tensor dv = matmul(v, f * (s_col * p + mT(p) * s_row));
    const int64_t k = s.dim(-1);
    if (a.dim(-2) > k) du = du + (matmul(da, v) - matmul(u, p)) / s_row;
    if (a.dim(-1) > k) dv = dv + (matmul(mT(da), u) - matmul(v, mT(p))) / s_row;
    return {du, diagonal_of(p), mT(dv)};
  };
  p.vjp = [](const RuleArgs& r, std::span<const Tangent> ct) -> Ts {
    const Tensor& a = r.inputs[0];
    expect_svd_differentiable(a, r.attrs);
    const Tensor &u = r.outputs[0], &s = r.outputs[1], &vh = r.outputs[2];
    const Tensor v = mT(vh);
    const Tensor f = inverse_gaps(s * s);
    const Tensor s_row = expand_dims(s, -2), s_col = expand_dims(s, -1);
    const int64_t k = s.dim(-1);
    Tensor pbar = zeros_like(f);
    if (ct[1]) pbar = diag_embed(*ct[1]);
    std::optional<Tensor> extra;  // the terms off U's and V's column spaces
    if (ct[0]) {
      const Tensor utu = matmul(mT(u), *ct[0]);
      const Tensor j = f * utu;
      pbar = pbar + (j + mT(j)) * s_row;
      if (a.dim(-2) > k) extra = matmul((*ct[0] - matmul(u, utu)) / s_row, vh);
    }
    if (ct[2]) {
      const Tensor vbar = mT(*ct[2]);
      const Tensor vtv = matmul(vh, vbar);
      const Tensor kk = f * vtv;
      pbar = pbar + s_col * (kk + mT(kk));
      if (a.dim(-1) > k) {
        const Tensor e = matmul(u / s_row, mT(vbar - matmul(v, vtv)));
        extra = extra ? *extra + e : e;
      }
    }
    const Tensor abar = matmul(u, matmul(pbar, vh));
    return {extra ? abar + *extra : abar};
  };
  p.batch = batch_unary;
  return p;
}

// ds = diag(U^T dA V), sbar -> U diag(sbar) Vh, with U and V from a reduced svd of A.
Primitive svdvals_primitive() {
  Primitive p;
  p.name = "svdvals";
  p.type_rule = [](Types in, const Attrs&) -> std::vector<TensorType> {
    expect_matrices("svdvals", in[0]);
    const SvdShape s = svd_shape(in[0], false);
    return {{in[0].dtype, with_tail(in[0].shape, 2, {s.k})}};
  };
  p.jvp = [](const RuleArgs& r, std::span<const Tangent> t) -> Ts {
    const SvdFactors f = reduced_svd(r.inputs[0]);
    return {sum(f.u * matmul(*t[0], mT(f.vh)), {-2})};
  };
  p.vjp = [](const RuleArgs& r, std::span<const Tangent> ct) -> Ts {
    const SvdFactors f = reduced_svd(r.inputs[0]);
    return {matmul(f.u * expand_dims(*ct[0], -2), f.vh)};
  };
  p.batch = batch_unary;
  return p;
}

// ---- pinv ---------------------------------------------------------------------------------

// V diag(1/s) U^T from a reduced SVD, over the singular values s > rcond * max(s) (the others
// count as zero); NaN input gives NaNs (svd's rule).
template <typename T>
Tensor pinv_kernel(const Tensor& a, double rcond) {
  const int64_t m = a.dim(-2), n = a.dim(-1), k = std::min(m, n);
  Tensor out = empty(with_tail(a.shape(), 2, {n, m}), a.dtype());
  T* po = out.data<T>();
  if (k == 0) {
    std::fill(po, po + out.numel(), T{0});
    return out;
  }
  const std::vector<Tensor> f = svd_kernel<T>(a, true, false);
  const T* pu = f[0].data<T>();
  const T* ps = f[1].data<T>();
  const T* pv = f[2].data<T>();
  detail::parallel_for(
      batch_count(a),
      [&](int64_t b0, int64_t b1) {
        std::vector<T> inv(static_cast<std::size_t>(k));
        for (int64_t b = b0; b < b1; ++b) {
          const T* u = pu + b * m * k;
          const T* s = ps + b * k;
          const T* vh = pv + b * k * n;
          const T cutoff = static_cast<T>(rcond) * s[0];  // s descends
          for (int64_t l = 0; l < k; ++l)
            inv[l] = s[l] > cutoff ? T{1} / s[l] : std::isnan(s[l]) ? s[l] : T{0};
          T* o = po + b * n * m;
          for (int64_t i = 0; i < n; ++i)
            for (int64_t j = 0; j < m; ++j) {
              T acc = 0;
              for (int64_t l = 0; l < k; ++l) acc += vh[l * n + i] * inv[l] * u[j * k + l];
              o[i * m + j] = acc;
            }
        }
      },
      std::max<int64_t>(1, m * n * k / 64));
  return out;
}

// The derivative at constant rank (Golub & Pereyra 1973; JAX's rule), finite at repeated
// singular values where the SVD's is not:
//   dP = -P dA P + P P^T dA^T (I - A P) + (I - P A) dA^T P^T P,
// and its adjoint Abar = -P^T Pbar P^T + (I - A P) Pbar^T P P^T + P^T P Pbar^T (I - P A).
struct PinvProjectors {
  Tensor left, right;  // I - A P [m, m] and I - P A [n, n]
};
PinvProjectors pinv_projectors(const Tensor& a, const Tensor& p) {
  return {eye(a.dim(-2), a.dtype()) - matmul(a, p), eye(a.dim(-1), a.dtype()) - matmul(p, a)};
}

Primitive pinv_primitive() {
  Primitive p;
  p.name = "pinv";
  p.type_rule = [](Types in, const Attrs& attrs) -> std::vector<TensorType> {
    expect_matrices("pinv", in[0]);
    (void)attrs.get_double("rcond");
    const int64_t m = in[0].shape[in[0].shape.rank() - 2], n = in[0].shape[in[0].shape.rank() - 1];
    return {{in[0].dtype, with_tail(in[0].shape, 2, {n, m})}};
  };
  p.jvp = [](const RuleArgs& r, std::span<const Tangent> t) -> Ts {
    const Tensor &a = r.inputs[0], &pa = r.outputs[0], &da = *t[0];
    const PinvProjectors proj = pinv_projectors(a, pa);
    const Tensor dat = mT(da);
    return {-matmul(pa, matmul(da, pa)) + matmul(matmul(pa, mT(pa)), matmul(dat, proj.left)) +
            matmul(proj.right, matmul(dat, matmul(mT(pa), pa)))};
  };
  p.vjp = [](const RuleArgs& r, std::span<const Tangent> ct) -> Ts {
    const Tensor &a = r.inputs[0], &pa = r.outputs[0], &pbar = *ct[0];
    const PinvProjectors proj = pinv_projectors(a, pa);
    const Tensor pt = mT(pa), pbart = mT(pbar);
    return {-matmul(pt, matmul(pbar, pt)) + matmul(proj.left, matmul(pbart, matmul(pa, pt))) +
            matmul(matmul(pt, pa), matmul(pbart, proj.right))};
  };
  p.batch = batch_unary;
  return p;
}

}  // namespace

const Primitive& prim::qr() {
  static const Primitive& p = detail::register_builtin(
      qr_primitive(), float_kernel(1, []<typename T>(Ins in, const Attrs& attrs) {
        return qr_kernel<T>(in[0], attrs.get_bool("complete"));
      }));
  return p;
}

const Primitive& prim::svd() {
  static const Primitive& p = detail::register_builtin(
      svd_primitive(), float_kernel(1, []<typename T>(Ins in, const Attrs& attrs) {
        return svd_kernel<T>(in[0], true, attrs.get_bool("full_matrices"));
      }));
  return p;
}

const Primitive& prim::svdvals() {
  static const Primitive& p = detail::register_builtin(
      svdvals_primitive(), float_kernel(1, []<typename T>(Ins in, const Attrs&) {
        return svd_kernel<T>(in[0], false, false);
      }));
  return p;
}

const Primitive& prim::pinv() {
  static const Primitive& p = detail::register_builtin(
      pinv_primitive(), float_kernel(1, []<typename T>(Ins in, const Attrs& attrs) {
        return std::vector<Tensor>{pinv_kernel<T>(in[0], attrs.get_double("rcond"))};
      }));
  return p;
}

// ---- public ops ---------------------------------------------------------------------------

namespace linalg {
namespace {

const Tensor& matrix_operand(std::string_view op, const Tensor& a) {
  expect_defined(op, a);
  expect_matrices(op, a.type());
  return a;
}

// numpy 2's default cutoff of pinv / lstsq: max(m, n) * machine epsilon of the dtype.
double default_rcond(const Tensor& a) {
  const double eps = a.dtype() == float32 ? std::numeric_limits<float>::epsilon()
                                          : std::numeric_limits<double>::epsilon();
  return static_cast<double>(std::max(a.dim(-2), a.dim(-1))) * eps;
}

}  // namespace

QR qr(const Tensor& a, QrMode mode, Loc loc) {
  const detail::CallSite site(loc);
  const std::vector<Tensor> out =
      bind(prim::qr(), {matrix_operand("qr", a)}, {{"complete", mode == QrMode::complete}}, loc);
  return {out[0], out[1]};
}

SVD svd(const Tensor& a, bool full_matrices, Loc loc) {
  const detail::CallSite site(loc);
  const std::vector<Tensor> out =
      bind(prim::svd(), {matrix_operand("svd", a)}, {{"full_matrices", full_matrices}}, loc);
  return {out[0], out[1], out[2]};
}

Tensor svdvals(const Tensor& a, Loc loc) {
  const detail::CallSite site(loc);
  return bind1(prim::svdvals(), {matrix_operand("svdvals", a)}, {}, loc);
}

Tensor pinv(const Tensor& a, std::optional<double> rcond, Loc loc) {
  const detail::CallSite site(loc);
  matrix_operand("pinv", a);
  return bind1(prim::pinv(), {a}, {{"rcond", rcond.value_or(default_rcond(a))}}, loc);
}

Tensor lstsq(const Tensor& a, const Tensor& b, std::optional<double> rcond, Loc loc) {
  const detail::CallSite site(loc);
  matrix_operand("lstsq", a);
  expect_defined("lstsq", b);
  const DType dt = promote_types(a.dtype(), b.dtype());
  if (dt != float32 && dt != float64)
    fail("lstsq", "unsupported dtype: got ", a.type(), " and ", b.type(),
         ", expected float32 or float64");
  const bool vector = b.rank() == 1;
  if (b.rank() == 0 || b.dim(vector ? -1 : -2) != a.dim(-2))
    fail("lstsq", "shapes do not match: got ", a.type(), " and ", b.type(),
         ", expected b of shape [", a.dim(-2), "] or [..., ", a.dim(-2),
         ", k] for A of shape [..., ", a.dim(-2), ", ", a.dim(-1), "]");
  const Tensor x = ops::cast_if_needed(a, dt, loc), y = ops::cast_if_needed(b, dt, loc);
  return matmul(pinv(x, rcond, loc), y, loc);
}

NormOrd::NormOrd(const char* name) : name_(name ? name : "") {
  if (name_ != "fro" && name_ != "nuc")
    fail("norm", "unknown ord: got \"", name_, "\", expected a number, \"fro\" or \"nuc\"");
}

std::string NormOrd::to_string() const {
  if (!p_) return "\"" + name_ + "\"";
  std::ostringstream os;
  os << *p_;
  return os.str();
}

namespace {

// The ord-norm over `axes` (all of x when empty); `op` names the caller in errors.
Tensor vector_norm_over(std::string_view op, const Tensor& x, const NormOrd& ord, const Axes& axes,
                        bool keepdims, Loc loc) {
  if (!ord.number())
    fail(op, "invalid ord for a vector norm: got ", ord.to_string(),
         ", expected a number (\"fro\" and \"nuc\" are matrix norms)");
  const double p = *ord.number();
  if (p == INFINITY) return max(abs(x, loc), axes, keepdims, loc);
  if (p == -INFINITY) return min(abs(x, loc), axes, keepdims, loc);
  if (p == 0)
    return sum(astype(not_equal(x, zeros_like(x), loc), x.dtype(), loc), axes, keepdims, loc);
  if (p == 1) return sum(abs(x, loc), axes, keepdims, loc);
  if (p == 2) return sqrt(sum(x * x, axes, keepdims, loc), loc);
  return pow(sum(pow(abs(x, loc), p, loc), axes, keepdims, loc), 1.0 / p, loc);
}

// x with axes row and col moved to the end (in that order).
Tensor matrices_last(const Tensor& x, int64_t row, int64_t col, Loc loc) {
  Axes perm;
  for (int64_t d = 0; d < x.rank(); ++d)
    if (d != row && d != col) perm.push_back(d);
  perm.push_back(row);
  perm.push_back(col);
  return transpose(x, perm, loc);
}

Tensor matrix_norm_over(std::string_view op, const Tensor& x, const NormOrd& ord, int64_t row,
                        int64_t col, bool keepdims, Loc loc) {
  Tensor out;
  const Axes both{row, col};
  const std::optional<double> p = ord.number();
  if (ord.name() == "fro") {
    out = sqrt(sum(x * x, both, false, loc), loc);
  } else if (ord.name() == "nuc" || (p && std::abs(*p) == 2)) {
    const Tensor s = svdvals(matrices_last(x, row, col, loc), loc);
    if (s.dim(-1) == 0 && ord.name() != "nuc")
      fail(op, "empty matrices have no ", ord.to_string(), "-norm: got ", x.type(),
           ", expected matrices with at least one row and one column");
    out = ord.name() == "nuc" ? sum(s, {-1}, false, loc)
          : *p > 0            ? max(s, {-1}, false, loc)
                              : min(s, {-1}, false, loc);
  } else if (p && (std::abs(*p) == 1 || std::abs(*p) == INFINITY)) {
    // 1: the largest column sum (sum over rows); inf: the largest row sum.
    const bool columns = std::abs(*p) == 1;
    const int64_t summed = columns ? row : col;
    int64_t kept = columns ? col : row;
    if (kept > summed) --kept;
    const Tensor sums = sum(abs(x, loc), {summed}, false, loc);
    out = *p > 0 ? max(sums, {kept}, false, loc) : min(sums, {kept}, false, loc);
  } else {
    fail(op, "invalid ord for a matrix norm: got ", ord.to_string(),
         ", expected \"fro\", \"nuc\", 1, -1, 2, -2, inf or -inf");
  }
  if (keepdims)
    for (int64_t d : {std::min(row, col), std::max(row, col)}) out = expand_dims(out, d, loc);
  return out;
}

int64_t normalized_axis(std::string_view op, const Tensor& x, int64_t axis) {
  if (axis < -x.rank() || axis >= x.rank())
    fail(op, "axis out of range: got axis ", axis, " for ", x.type(), ", expected -", x.rank(),
         " <= axis < ", x.rank());
  return axis < 0 ? axis + x.rank() : axis;
}

// x, or x in float32 when it holds integers; bool is an Error. Of a complex x, |x|: every norm
// but the spectral ones (matrix ord 2, -2, nuc: singular values, real-only here) depends on
// the magnitudes alone.
Tensor norm_operand(std::string_view op, const Tensor& x, std::optional<NormOrd> matrix_ord,
                    Loc loc) {
  expect_defined(op, x);
  if (x.dtype() == bool_)
    fail(op, "unsupported dtype: got ", x.type(), ", expected a numeric dtype");
  if (is_complex(x.dtype())) {
    const bool spectral =
        matrix_ord && (matrix_ord->name() == "nuc" || matrix_ord->number() == 2.0 ||
                       matrix_ord->number() == -2.0);
    if (spectral)
      fail(op, "unsupported dtype for ord ", matrix_ord->to_string(), ": got ", x.type(),
           ", expected float32 or float64 (singular values of complex matrices are not supported)");
    return abs(x, loc);
  }
  return is_floating(x.dtype()) ? x : astype(x, float32, loc);
}

Tensor matrix_norm_checked(std::string_view op, const Tensor& y, const NormOrd& ord,
                           std::pair<int64_t, int64_t> axes, bool keepdims, Loc loc) {
  const int64_t row = normalized_axis(op, y, axes.first), col = normalized_axis(op, y, axes.second);
  if (row == col)
    fail(op, "duplicate axes: got axis (", axes.first, ", ", axes.second, ") for ", y.type(),
         ", expected two different axes");
  return matrix_norm_over(op, y, ord, row, col, keepdims, loc);
}

}  // namespace

Tensor norm(const Tensor& x, std::optional<NormOrd> ord, std::optional<std::vector<int64_t>> axis,
            bool keepdims, Loc loc) {
  const detail::CallSite site(loc);
  const bool matrix = axis ? axis->size() == 2 : (ord && x.rank() == 2);
  const Tensor y = norm_operand(
      "norm", x, matrix ? std::optional(ord.value_or(NormOrd("fro"))) : std::nullopt, loc);
  if (!axis) {
    if (!ord) return sqrt(sum(y * y, {}, keepdims, loc), loc);
    if (y.rank() != 1 && y.rank() != 2)
      fail("norm", "ord given without axis needs a 1-d or 2-d tensor: got ", y.type(),
           ", expected a vector or a matrix (or pass axis)");
    axis = y.rank() == 1 ? std::vector<int64_t>{0} : std::vector<int64_t>{0, 1};
  }
  if (axis->size() == 1)
    return vector_norm_over("norm", y, ord.value_or(NormOrd(2)),
                            {normalized_axis("norm", y, (*axis)[0])}, keepdims, loc);
  if (axis->size() == 2) {
    return matrix_norm_checked("norm", y, ord.value_or(NormOrd("fro")), {(*axis)[0], (*axis)[1]},
                               keepdims, loc);
  }
  fail("norm", "too many axes: got ", axis->size(), " for ", y.type(),
       ", expected one (a vector norm) or two (a matrix norm)");
}

Tensor vector_norm(const Tensor& x, NormOrd ord, std::optional<std::vector<int64_t>> axis,
                   bool keepdims, Loc loc) {
  const detail::CallSite site(loc);
  const Tensor y = norm_operand("vector_norm", x, std::nullopt, loc);
  Axes axes;  // empty: every axis
  for (int64_t a : axis.value_or(std::vector<int64_t>{})) {
    const int64_t d = normalized_axis("vector_norm", y, a);
    if (std::find(axes.begin(), axes.end(), d) != axes.end())
      fail("vector_norm", "duplicate axis: got axis ", a, " twice for ", y.type(),
           ", expected distinct axes");
    axes.push_back(d);
  }
  return vector_norm_over("vector_norm", y, ord, axes, keepdims, loc);
}

Tensor matrix_norm(const Tensor& x, NormOrd ord, std::pair<int64_t, int64_t> axes, bool keepdims,
                   Loc loc) {
  const detail::CallSite site(loc);
  const Tensor y = norm_operand("matrix_norm", x, ord, loc);
  if (y.rank() < 2)
    fail("matrix_norm", "not matrices: got ", y.type(), ", expected shape [..., m, n]");
  return matrix_norm_checked("matrix_norm", y, ord, axes, keepdims, loc);
}

Tensor matrix_power(const Tensor& a, int64_t n, Loc loc) {
  const detail::CallSite site(loc);
  expect_defined("matrix_power", a);
  if (a.rank() < 2 || a.dim(-1) != a.dim(-2))
    fail("matrix_power", "not square matrices: got ", a.type(), ", expected shape [..., n, n]");
  if (n == 0) return broadcast_to(eye(a.dim(-1), a.dtype()), a.shape(), loc);
  Tensor base = n < 0 ? inv(a, loc) : a;
  uint64_t e = n < 0 ? uint64_t(0) - static_cast<uint64_t>(n) : static_cast<uint64_t>(n);
  std::optional<Tensor> result;
  while (true) {
    if (e & 1) result = result ? matmul(*result, base, loc) : base;
    e >>= 1;
    if (e == 0) return *result;
    base = matmul(base, base, loc);
  }
}

}  // namespace linalg
}  // namespace kiln
