// Linear algebra (numpy.linalg / scipy.linalg style), float32 and float64, batched over
// leading axes: a matrix argument is [..., n, n] and every leading axis is a batch axis
// (broadcast between operands, numpy rules). Computed through LAPACK (OpenBLAS); every op
// differentiates (grad, jvp, any order) and batches under vmap into one batched call.
//
// Numerical failures do not raise (they cannot under jit, where values are unknown until
// run): a matrix that is not positive definite gives a Cholesky factor of NaNs, a singular
// matrix gives NaNs from solve and inv, and det 0 (slogdet: sign 0, log|det| -inf). Shapes and
// dtypes are checked eagerly and raise kiln::Error. See docs/OPS.md, "Linear algebra".
#pragma once

#include <utility>

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

}  // namespace kiln::linalg
