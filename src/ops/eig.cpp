// The general eigendecomposition: the primitive eig{vectors} of a square [..., n, n] matrix
// (real or complex) through LAPACK geev, with complex eigenvalues [..., n] and, with vectors,
// right eigenvectors [..., n, n] (columns of unit length, as LAPACK normalises them), and the
// public linalg::eig / linalg::eigvals on it.
//
// Derivatives, for distinct eigenvalues (JAX's convention: Re(sum(ct * t)) pairs them):
//   E = V^-1 dA V,  dw = diag(E),  dV = V (F o E) - V diag(Re(diag(V^H V (F o E)))),
// F_ij = 1 / (w_j - w_i) off the diagonal; the last term keeps the columns at unit length, as
// PyTorch's rule does. The phase of each eigenvector is arbitrary, so only functions that do
// not depend on it (|v|, v v^H, ...) have meaningful eigenvector derivatives. Complex solves
// use the real 2n x 2n form, so the rules are built from differentiable primitives.
#include <algorithm>
#include <cmath>
#include <complex>

#include "detail/dtype_dispatch.h"
#include "kiln/linalg.h"
#include "ops/linalg_common.h"

extern "C" {
void sgeev_(const char* jobvl, const char* jobvr, const blasint* n, float* a, const blasint* lda,
            float* wr, float* wi, float* vl, const blasint* ldvl, float* vr, const blasint* ldvr,
            float* work, const blasint* lwork, blasint* info, std::size_t, std::size_t);
void dgeev_(const char* jobvl, const char* jobvr, const blasint* n, double* a, const blasint* lda,
            double* wr, double* wi, double* vl, const blasint* ldvl, double* vr,
            const blasint* ldvr, double* work, const blasint* lwork, blasint* info, std::size_t,
            std::size_t);
void cgeev_(const char* jobvl, const char* jobvr, const blasint* n, std::complex<float>* a,
            const blasint* lda, std::complex<float>* w, std::complex<float>* vl,
            const blasint* ldvl, std::complex<float>* vr, const blasint* ldvr,
            std::complex<float>* work, const blasint* lwork, float* rwork, blasint* info,
            std::size_t, std::size_t);
void zgeev_(const char* jobvl, const char* jobvr, const blasint* n, std::complex<double>* a,
            const blasint* lda, std::complex<double>* w, std::complex<double>* vl,
            const blasint* ldvl, std::complex<double>* vr, const blasint* ldvr,
            std::complex<double>* work, const blasint* lwork, double* rwork, blasint* info,
            std::size_t, std::size_t);
}

namespace kiln {
namespace {

using namespace lapack;
using ops::Ins;
using ops::Ts;
using ops::Types;

const DTypeSet kEigDTypes = DTypeSet(float32) | float64 | DTypeSet::complex();

// ---- the kernel -------------------------------------------------------------------------------

// geev for element type T (real or complex); w and v are complex, v column-major.
template <typename T>
blasint geev(bool vectors, blasint n, T* a, std::complex<double>* w, T* vr, T* work, blasint lwork,
             T* extra) {
  const char jobvl = 'N', jobvr = vectors ? 'V' : 'N';
  const blasint one = 1, ldvr = vectors ? n : 1;
  blasint info = 0;
  if constexpr (std::is_floating_point_v<T>) {
    T* wr = extra;  // real and imaginary parts, n each
    T* wi = extra + n;
    if constexpr (std::is_same_v<T, float>)
      sgeev_(&jobvl, &jobvr, &n, a, &n, wr, wi, nullptr, &one, vr, &ldvr, work, &lwork, &info, 1,
             1);
    else
      dgeev_(&jobvl, &jobvr, &n, a, &n, wr, wi, nullptr, &one, vr, &ldvr, work, &lwork, &info, 1,
             1);
    if (w)
      for (blasint i = 0; i < n; ++i) w[i] = {wr[i], wi[i]};
  } else {
    using R = typename T::value_type;
    T* values = extra;                           // n complex values
    R* rwork = reinterpret_cast<R*>(extra + n);  // 2n reals
    if constexpr (std::is_same_v<T, std::complex<float>>)
      cgeev_(&jobvl, &jobvr, &n, a, &n, values, nullptr, &one, vr, &ldvr, work, &lwork, rwork,
             &info, 1, 1);
    else
      zgeev_(&jobvl, &jobvr, &n, a, &n, values, nullptr, &one, vr, &ldvr, work, &lwork, rwork,
             &info, 1, 1);
    if (w)
      for (blasint i = 0; i < n; ++i) w[i] = values[i];
  }
  return info;
}

// The complex eigenvector matrix from geev's output: for a real matrix a conjugate pair
// (wi[j] > 0) is stored as the real and imaginary parts in columns j and j + 1.
template <typename T, typename C>
void unpack_vectors(const T* vr, const std::complex<double>* w, int64_t n, C* out) {
  for (int64_t j = 0; j < n; ++j) {
    const bool pair = std::is_floating_point_v<T> && w[j].imag() > 0 && j + 1 < n;
    for (int64_t i = 0; i < n; ++i) {
      if constexpr (std::is_floating_point_v<T>) {
        const T re = vr[i + j * n];
        const T im = pair ? vr[i + (j + 1) * n] : T{0};
        out[i * n + j] = C(re, im);
        if (pair) out[i * n + j + 1] = C(re, -im);
      } else {
        out[i * n + j] = C(vr[i + j * n]);
      }
    }
    if (pair) ++j;
  }
}

template <typename T>
std::vector<Tensor> eig_kernel(const Tensor& a, bool vectors) {
  const int64_t n = a.dim(-1);
  const DType cd = to_complex(a.dtype());
  Tensor w = empty(with_tail(a.shape(), 2, {n}), cd);
  Tensor v = empty(vectors ? a.shape() : Shape{0}, cd);
  const auto b = [](int64_t x) { return static_cast<blasint>(x); };
  int64_t lwork = std::max<int64_t>(1, 4 * n);
  if (n > 0) {  // a workspace query reads no array, but every pointer must be valid
    std::vector<T> dummy(static_cast<std::size_t>(2 * n + 1));
    T size{};
    geev<T>(vectors, b(n), dummy.data(), nullptr, dummy.data(), &size, -1, dummy.data());
    lwork = std::max<int64_t>(lwork, static_cast<int64_t>(std::real(size)));
  }
  // Work: A, the vectors, geev's workspace and 2n extra elements (values or rwork).
  const int64_t work_size = n * n * (vectors ? 2 : 1) + lwork + 3 * n;
  detail::visit_complex(cd, [&]<typename C>() {
    C* pw = w.data<C>();
    C* pv = vectors ? v.data<C>() : nullptr;
    for_each_matrix<T>("eig", batch_count(a), n, work_size, [&](int64_t i, T* work) {
      T* am = work;
      T* vr = am + n * n;
      T* ws = vr + (vectors ? n * n : 0);
      T* extra = ws + lwork;
      const MatrixView<T> m = matrix<T>(a, i);
      load(m, Layout::col_major, am);
      std::vector<std::complex<double>> values(static_cast<std::size_t>(n));
      // Each part, not |x|: a complex64 modulus can overflow where both parts are finite.
      const bool finite = std::all_of(am, am + n * n, [](T x) {
        return std::isfinite(std::real(x)) && std::isfinite(std::imag(x));
      });
      const blasint info =
          finite ? geev<T>(vectors, b(n), am, values.data(), vr, ws, b(lwork), extra) : 1;
      C* wi = pw + i * n;
      C* vi = vectors ? pv + i * n * n : nullptr;
      if (info != 0) {  // no convergence, or NaN/inf input: NaNs, as the other decompositions
        const C nan(std::numeric_limits<typename C::value_type>::quiet_NaN(),
                    std::numeric_limits<typename C::value_type>::quiet_NaN());
        std::fill(wi, wi + n, nan);
        if (vi) std::fill(vi, vi + n * n, nan);
        return;
      }
      for (int64_t k = 0; k < n; ++k) wi[k] = C(values[static_cast<std::size_t>(k)]);
      if (vi) unpack_vectors(vr, values.data(), n, vi);
    });
  });
  return vectors ? std::vector<Tensor>{w, v} : std::vector<Tensor>{w};
}

// ---- derivative rules -------------------------------------------------------------------------

// A^-1 B for complex A [..., n, n] and B [..., n, k], as the real system
// [[Re A, -Im A], [Im A, Re A]] [Re X; Im X] = [Re B; Im B].
Tensor solve_complex(const Tensor& a, const Tensor& b) {
  const Tensor ar = real(a), ai = imag(a);
  const Tensor m = concatenate({concatenate({ar, -ai}, -1), concatenate({ai, ar}, -1)}, -2);
  const Tensor x = linalg::solve(m, concatenate({real(b), imag(b)}, -2));
  const std::vector<Tensor> parts = split(x, 2, -2);
  return complex(parts[0], parts[1]);
}

struct Decomposition {
  Tensor w, v;
};
Decomposition with_vectors(const RuleArgs& r) {
  if (r.attrs.get_bool("vectors")) return {r.outputs[0], r.outputs[1]};
  const std::vector<Tensor> out = bind(prim::eig(), {r.inputs[0]}, {{"vectors", true}});
  return {out[0], out[1]};
}

Ts eig_jvp(const RuleArgs& r, std::span<const Tangent> t) {
  const auto [w, v] = with_vectors(r);
  const Tensor e = solve_complex(v, matmul(astype(*t[0], w.dtype()), v));
  Ts out{diagonal_of(e)};
  if (r.attrs.get_bool("vectors")) {
    const Tensor g = inverse_gaps(w) * e;
    const Tensor dv = matmul(v, g);
    const Tensor kept = real(diagonal_of(matmul(conj(mT(v)), dv)));
    out.push_back(dv - v * expand_dims(astype(kept, w.dtype()), -2));
  }
  return out;
}

Ts eig_vjp(const RuleArgs& r, std::span<const Tangent> ct) {
  const auto [w, v] = with_vectors(r);
  Tensor e_bar = zeros(v.shape(), v.dtype());
  if (ct.size() > 1 && ct[1]) {
    const Tensor g_bar = matmul(mT(v), *ct[1]);
    const Tensor d_bar = -real(diagonal_of(g_bar));      // the unit-length term's cotangent
    const Tensor w_conj = conj(matmul(conj(mT(v)), v));  // (V^H V)^T
    e_bar = inverse_gaps(w) * (g_bar + w_conj * expand_dims(astype(d_bar, v.dtype()), -2));
  }
  if (ct[0]) e_bar = e_bar + diag_embed(*ct[0]);
  const Tensor vt = mT(v);
  const Tensor a_bar = solve_complex(vt, matmul(e_bar, vt));
  return {is_complex(r.inputs[0].dtype()) ? a_bar : real(a_bar)};
}

Primitive eig_primitive() {
  Primitive p;
  p.name = "eig";
  p.arity = 1;
  p.type_rule = [](Types in, const Attrs& a) {
    const TensorType& t = in[0];
    ops::expect_dtype("eig", t, kEigDTypes, "float32, float64, complex64 or complex128");
    if (t.shape.rank() < 2 || t.shape[t.shape.rank() - 1] != t.shape[t.shape.rank() - 2])
      fail("eig", "not square matrices: got ", t, ", expected shape [..., n, n]");
    const DType cd = to_complex(t.dtype);
    std::vector<TensorType> out{{cd, with_tail(t.shape, 2, {t.shape[t.shape.rank() - 1]})}};
    if (a.get_bool("vectors")) out.push_back({cd, t.shape});
    return out;
  };
  p.jvp = eig_jvp;
  p.vjp = eig_vjp;
  p.batch = batch_unary;
  return p;
}

}  // namespace

const Primitive& prim::eig() {
  static const Primitive& p = detail::register_builtin(
      eig_primitive(), {{ops::cpu({kEigDTypes}), [](Ins in, const Attrs& a) {
                           const bool vectors = a.get_bool("vectors");
                           const DType d = in[0].dtype();
                           if (d == float32) return eig_kernel<float>(in[0], vectors);
                           if (d == float64) return eig_kernel<double>(in[0], vectors);
                           if (d == complex64)
                             return eig_kernel<std::complex<float>>(in[0], vectors);
                           return eig_kernel<std::complex<double>>(in[0], vectors);
                         }}});
  return p;
}

namespace linalg {
namespace {

// a, or a in float32 when it holds integers (float16/bfloat16 too: LAPACK has no such type).
Tensor eig_operand(std::string_view op, const Tensor& a) {
  expect_defined(op, a);
  return is_complex(a.dtype()) ? a
                               : ops::cast_if_needed(a, ops::single_or_double(a.dtype()), Loc{});
}

}  // namespace

Eig eig(const Tensor& a, Loc loc) {
  const detail::CallSite site(loc);
  const std::vector<Tensor> out =
      bind(prim::eig(), {eig_operand("eig", a)}, {{"vectors", true}}, loc);
  return {out[0], out[1]};
}

Tensor eigvals(const Tensor& a, Loc loc) {
  const detail::CallSite site(loc);
  return bind1(prim::eig(), {eig_operand("eigvals", a)}, {{"vectors", false}}, loc);
}

}  // namespace linalg
}  // namespace kiln
