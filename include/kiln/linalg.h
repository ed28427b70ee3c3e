// Linear algebra (numpy.linalg / scipy.linalg style), float32 and float64 (eig also complex),
// batched over leading axes: a matrix argument is [..., n, n] and every leading axis is a batch
// axis (broadcast between operands, numpy rules). Computed through LAPACK (OpenBLAS); every op
// differentiates (grad, jvp, any order) and batches under vmap into one batched call.
//
// Numerical failures do not raise (they cannot under jit, where values are unknown until
// run): a matrix that is not positive definite gives a Cholesky factor of NaNs, a singular
// matrix gives NaNs from solve and inv, and det 0 (slogdet: sign 0, log|det| -inf). Shapes and
// dtypes are checked eagerly and raise kiln::Error. See docs/OPS.md, "Linear algebra".
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kiln/tensor.h"

namespace kiln::linalg {

// The lower-triangular L with L L^T = A for a symmetric positive-definite A [..., n, n]. A is
// symmetrised first ((A + A^T) / 2), so both triangles count and the derivative is that of a
// function of symmetric matrices. Not positive definite (or NaN): that matrix's L is all NaN.
Tensor cholesky(const Tensor& a, Loc loc = Loc::current());

struct TriangularSolveOptions {
  bool lower = false;          // A is lower triangular (else upper); the other triangle is unread
  bool transpose = false;      // solve A^T x = b
  bool unit_diagonal = false;  // A's diagonal is taken to be ones (and is unread)
};
// x with op(A) x = b for a triangular A [..., n, n]; b is [..., n, k], or a vector [n] (then
// x is [n]). Only A's triangle counts (zero division gives inf/NaN, as in LAPACK's trsm).
Tensor triangular_solve(const Tensor& a, const Tensor& b, TriangularSolveOptions options = {},
                        Loc loc = Loc::current());

// x with A x = b for a square A [..., n, n] (LU with partial pivoting); b is [..., n, k], or a
// vector [n] (then x is [n]). A singular matrix (an exact zero pivot) gives NaNs.
Tensor solve(const Tensor& a, const Tensor& b, Loc loc = Loc::current());
// A^-1 (solve(A, I)); a singular matrix gives NaNs.
Tensor inv(const Tensor& a, Loc loc = Loc::current());
// The sign (-1, 0 or 1) and the natural log of |det A|, each [...]: first and second.
// Singular: sign 0, log|det| -inf.
std::pair<Tensor, Tensor> slogdet(const Tensor& a, Loc loc = Loc::current());
// det A = sign * exp(log|det A|).
Tensor det(const Tensor& a, Loc loc = Loc::current());

// Eigenvalues (ascending, [..., n]) and eigenvectors (the columns of [..., n, n]) of the
// symmetric (A + A^T) / 2: first w, second V, A = V diag(w) V^T. Each eigenvector's sign is
// LAPACK's choice. Repeated eigenvalues: values are right, eigenvector derivatives are inf/NaN.
// No convergence (or NaN/inf input): that matrix's w and V are NaN.
std::pair<Tensor, Tensor> eigh(const Tensor& a, Loc loc = Loc::current());

// The eigenvalues and right eigenvectors of a general square A [..., n, n] (real or complex),
// as numpy.linalg.eig: complex64 for float32 (and integer) input, complex128 for float64. The
// eigenvectors are the columns of unit length, scaled as LAPACK's geev leaves them; eigenvalues
// come in LAPACK's order. Derivatives hold for distinct eigenvalues; an eigenvector's phase is
// arbitrary, so only phase-independent functions of it have meaningful derivatives. No
// convergence (or NaN/inf input): that matrix's values and vectors are NaN.
struct Eig {
  Tensor eigenvalues, eigenvectors;
};
Eig eig(const Tensor& a, Loc loc = Loc::current());
Tensor eigvals(const Tensor& a, Loc loc = Loc::current());

// scipy.linalg.lu_factor of a square A [..., n, n] (LU with partial pivoting, LAPACK getrf):
// lu holds L's strict lower triangle (its diagonal is ones) and U; pivots (int32 [..., n],
// 0-based as scipy's) say that row i was swapped with row pivots[i], in order. A singular A
// is factored all the same (U has a zero on its diagonal). Differentiable in lu.
struct LUFactor {
  Tensor lu, pivots;
};
LUFactor lu_factor(const Tensor& a, Loc loc = Loc::current());
// scipy.linalg.lu_solve: x with op(A) x = b from A's lu_factor; trans 0: A x = b, 1 (or 2,
// the same for real matrices): A^T x = b. b as in solve.
Tensor lu_solve(const LUFactor& factor, const Tensor& b, int trans = 0, Loc loc = Loc::current());
// scipy.linalg.lu: A = P L U with P a permutation matrix, L unit lower and U upper triangular,
// each [..., n, n] in A's dtype.
struct LU {
  Tensor p, l, u;
};
LU lu(const Tensor& a, Loc loc = Loc::current());
// The permutation [..., size] that the row swaps `pivots` (int32 [..., k], 0-based, k <= size)
// make of 0..size-1: row r of the swapped matrix is row perm[r] of the original (JAX's
// lu_pivots_to_permutation). A pivot outside [0, size) is an Error when the kernel runs.
Tensor lu_pivots_to_permutation(const Tensor& pivots, int64_t size, Loc loc = Loc::current());

// ---- decompositions, least squares, norms, powers (src/ops/linalg_decomp.cpp) -------------

// A = Q R for A [..., m, n], k = min(m, n). reduced: Q [..., m, k] with orthonormal columns,
// R [..., k, n] upper triangular; complete: Q [..., m, m] orthogonal, R [..., m, n]. By
// Householder reflections (LAPACK geqrf + orgqr); R's diagonal may be negative (LAPACK's
// signs, as numpy). Derivatives: m >= n with reduced Q (or complete with m == n); any other
// case raises Error when differentiated (Q's extra columns are not unique).
enum class QrMode { reduced, complete };
struct QR {
  Tensor q, r;
};
QR qr(const Tensor& a, QrMode mode = QrMode::reduced, Loc loc = Loc::current());

// A = U diag(s) Vh for A [..., m, n], k = min(m, n): s [..., k] descending, non-negative;
// full_matrices: U [..., m, m], Vh [..., n, n], else U [..., m, k], Vh [..., k, n]. By
// divide and conquer (LAPACK gesdd). Singular vectors' signs are LAPACK's. Derivatives: with
// full_matrices = false (or m == n); U and Vh's are inf/NaN at repeated singular values (and,
// for m != n, at zero ones). NaN/inf input or no convergence: NaN u, s, vh for that matrix.
struct SVD {
  Tensor u, s, vh;
};
SVD svd(const Tensor& a, bool full_matrices = true, Loc loc = Loc::current());
// The singular values alone (numpy's svd(compute_uv=False)), [..., k] descending; their
// derivative, U diag(s̄) Vh, is defined for every A (a subgradient at repeated values).
Tensor svdvals(const Tensor& a, Loc loc = Loc::current());

// numpy.linalg.pinv: V diag(1/s) U^T over the singular values s > rcond * max(s) (the rest
// count as zero). rcond defaults to max(m, n) * epsilon of the dtype (numpy 2's default).
// Its derivative is the constant-rank formula (finite at repeated singular values, not
// continuous where the rank changes).
Tensor pinv(const Tensor& a, std::optional<double> rcond = std::nullopt, Loc loc = Loc::current());

// numpy.linalg.lstsq's solution: x minimising |A x - b| (the minimum-norm one when A is rank
// deficient), A [..., m, n], b [..., m, k] or a vector [m] (then x is [n]); pinv(A, rcond) b.
Tensor lstsq(const Tensor& a, const Tensor& b, std::optional<double> rcond = std::nullopt,
             Loc loc = Loc::current());

// numpy.linalg.norm's ord: a number (2, 1, inf, -inf, 0 or any p) or "fro" / "nuc".
class NormOrd {
 public:
  NormOrd(double p) : p_(p) {}                         // NOLINT: implicit, like numpy
  NormOrd(int p) : p_(static_cast<double>(p)) {}       // NOLINT
  NormOrd(const char* name);                           // NOLINT: "fro" or "nuc"
  std::optional<double> number() const { return p_; }  // nullopt: a named norm
  const std::string& name() const { return name_; }
  std::string to_string() const;

 private:
  std::optional<double> p_;
  std::string name_;
};
// numpy.linalg.norm. axis: one axis (a vector norm), two (a matrix norm over them), or nullopt:
// all of x as a vector when ord is nullopt (2-norm / Frobenius), else x must be 1-d or 2-d.
// Vector ords: p = sum(|x|^p)^(1/p), inf/-inf = max/min |x|, 0 = the count of non-zeros.
// Matrix ords: "fro", "nuc" (sum of singular values), 1/-1 = max/min column sum of |x|,
// inf/-inf = max/min row sum, 2/-2 = largest/smallest singular value. Float dtypes keep
// theirs; integers become float32. keepdims keeps the reduced axes as size 1.
Tensor norm(const Tensor& x, std::optional<NormOrd> ord = std::nullopt,
            std::optional<std::vector<int64_t>> axis = std::nullopt, bool keepdims = false,
            Loc loc = Loc::current());

// torch.linalg.vector_norm: the ord-norm of x over `axis` (any number of axes; nullopt: all of
// x flattened). Same ords as norm's vector norms; integers become float32.
Tensor vector_norm(const Tensor& x, NormOrd ord = 2,
                   std::optional<std::vector<int64_t>> axis = std::nullopt, bool keepdims = false,
                   Loc loc = Loc::current());
// torch.linalg.matrix_norm: the ord-norm of the matrices over axes `axes` (rows, columns), by
// default the last two. Same ords as norm's matrix norms.
Tensor matrix_norm(const Tensor& x, NormOrd ord = "fro",
                   std::pair<int64_t, int64_t> axes = {-2, -1}, bool keepdims = false,
                   Loc loc = Loc::current());

// A^n for square A [..., n, n] by repeated squaring (matmul); n = 0 gives the identity,
// n < 0 is inv(A)^|n|. Any dtype matmul takes for n >= 0; float32/float64 for n < 0.
Tensor matrix_power(const Tensor& a, int64_t n, Loc loc = Loc::current());

// ---- compositions (src/ops/linalg_composite.cpp) -------------------------------------------

// numpy.linalg.multi_dot: the product of the matrices in order, parenthesised to need the
// fewest scalar multiplications (the classic dynamic programme on their shapes). The first may
// be a vector [n] (a row) and the last a vector [n] (a column); their axes are dropped from
// the result. The others are 2-d. At least two operands.
Tensor multi_dot(const std::vector<Tensor>& arrays, Loc loc = Loc::current());

// numpy.linalg.cond: the condition number of A [..., m, n] in the norm p: nullopt or 2 the
// ratio of the largest to the smallest singular value, -2 its inverse; the other ords ("fro",
// "nuc", 1, -1, inf, -inf; square A) matrix_norm(A, p) * matrix_norm(inv(A), p).
Tensor cond(const Tensor& a, std::optional<NormOrd> p = std::nullopt, Loc loc = Loc::current());

// numpy.linalg.matrix_rank: the number of singular values of A [..., m, n] above a cutoff, as
// int64 [...]. tol: an absolute cutoff; rtol: relative to the largest singular value; neither:
// max(m, n) * eps(dtype) * max(s) (numpy's default). Giving both is an Error.
struct MatrixRankOptions {
  std::optional<double> tol, rtol;
};
Tensor matrix_rank(const Tensor& a, MatrixRankOptions options = {}, Loc loc = Loc::current());

// scipy.linalg.cho_solve: x with A x = b from A's Cholesky factor c (lower: A = c c^T, the
// factor cholesky returns; else upper: A = c^T c), by two triangular solves. b as in solve.
Tensor cho_solve(const Tensor& c, const Tensor& b, bool lower = true, Loc loc = Loc::current());

// numpy.linalg.eigvalsh: eigh's eigenvalues alone, ascending, [..., n].
Tensor eigvalsh(const Tensor& a, Loc loc = Loc::current());

// scipy.linalg.expm: the matrix exponential of A [..., n, n], by scaling and squaring with the
// [13/13] Padé approximant (Higham 2005): A / 2^s with s the fewest squarings that bring its
// 1-norm to 5.37 or less, r13 by one solve, then s squarings (a loop). Differentiable (through
// matmul, solve and the loop); jit and vmap run one loop of max(s) steps over the batch.
Tensor expm(const Tensor& a, Loc loc = Loc::current());

}  // namespace kiln::linalg
