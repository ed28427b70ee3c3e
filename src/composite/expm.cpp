// The matrix exponential by scaling and squaring: a Padé approximant, then a fori_loop of
// squarings whose count depends on the matrix's norm (so it sits above transforms).
#include "kiln/control_flow.h"
#include "kiln/linalg.h"
#include "kiln/math_ops.h"
#include "ops/linalg_common.h"

namespace kiln::linalg {
namespace {

using lapack::expect_defined;

// Higham 2005 ("The scaling and squaring method for the matrix exponential revisited"): the
// [13/13] Padé approximant's coefficients, and the 1-norm up to which it is accurate to the
// double unit roundoff.
constexpr double kPade13[] = {64764752532480000.0,
                              32382376266240000.0,
                              7771770303897600.0,
                              1187353796428800.0,
                              129060195264000.0,
                              10559470521600.0,
                              670442572800.0,
                              33522128640.0,
                              1323241920.0,
                              40840800.0,
                              960960.0,
                              16380.0,
                              182.0,
                              1.0};
constexpr double kTheta13 = 5.371920351148152;

// r13(A) = (V - U)^-1 (V + U), U the odd and V the even part of the numerator.
Tensor pade13(const Tensor& a, Loc loc) {
  const double* b = kPade13;
  const Tensor id = broadcast_to(eye(a.dim(-1), a.dtype()), a.shape(), loc);
  const Tensor a2 = matmul(a, a, loc), a4 = matmul(a2, a2, loc), a6 = matmul(a4, a2, loc);
  const Tensor u = matmul(a,
                          matmul(a6, a6 * b[13] + a4 * b[11] + a2 * b[9], loc) + a6 * b[7] +
                              a4 * b[5] + a2 * b[3] + id * b[1],
                          loc);
  const Tensor v = matmul(a6, a6 * b[12] + a4 * b[10] + a2 * b[8], loc) + a6 * b[6] + a4 * b[4] +
                   a2 * b[2] + id * b[0];
  return solve(v - u, v + u, loc);
}

}  // namespace

Tensor expm(const Tensor& a, Loc loc) {
  const detail::CallSite site(loc);
  expect_defined("expm", a);
  lapack::expect_square("expm", a.type());
  if (a.dim(-1) == 0) return a;  // exp of a 0x0 matrix: itself (there is no norm to scale by)
  // s squarings bring each matrix's 1-norm to at most theta13; the count is piecewise constant
  // in A (no derivative), 0 for non-finite norms (the result is then NaN anyway).
  const Tensor norm1 = matrix_norm(a, 1, {-2, -1}, true, loc);
  const Tensor exact = maximum(ceil(log2(norm1 / kTheta13, loc), loc), 0.0, loc);
  const Tensor s = where(isfinite(exact, loc), exact, zeros_like(exact), loc);
  const Tensor r = pade13(a * exp2(-s, loc), loc);
  // Each matrix squares s times: the loop runs max(s) steps, the others keep their value.
  const Tensor steps = astype(max(s, {}, false, loc), int32, loc);
  return fori_loop(
      zeros({}, int32), steps,
      [&](const Tensor& i, const Tensor& x) {
        return where(less(astype(i, a.dtype(), loc), s, loc), matmul(x, x, loc), x, loc);
      },
      r);
}

}  // namespace kiln::linalg
