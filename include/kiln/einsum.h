// Tensor products: einsum, tensordot, outer, kron. Each is a composition of primitives
// (diagonal by reshape and slice, reduce_sum, transpose, reshape, matmul, mul), so it runs
// eagerly, traces, jits, differentiates and batches through theirs. Operands are promoted to
// one dtype; bool is rejected (use logical ops).
#pragma once

#include <string_view>
#include <utility>
#include <vector>

#include "kiln/ops.h"

namespace kiln {

// numpy.einsum: "ij,jk->ik", implicit output ("ij,jk" gives the labels seen once, in order of
// character code, after the ellipsis's axes), repeated labels in one operand take a diagonal
// ("ii->i"), "..." stands for the axes no letter names and broadcasts like numpy (size-1 axes
// also broadcast against any size). Labels absent from the output are summed. With more than
// two operands, pairs are contracted in the order of opt_einsum's greedy path (the pair whose
// result shrinks the total size most first), each as one (batched) matmul.
Tensor einsum(std::string_view subscripts, const std::vector<Tensor>& operands,
              Loc loc = Loc::current());
template <typename... Ts>
requires(std::same_as<std::remove_cvref_t<Ts>, Tensor>&&...) Tensor
    einsum(std::string_view subscripts, const Ts&... operands) {
  return einsum(subscripts, std::vector<Tensor>{operands...}, Loc::current());
}

// numpy.tensordot: sums the product over the last `axes` axes of a and the first `axes` of b.
Tensor tensordot(const Tensor& a, const Tensor& b, int64_t axes = 2, Loc loc = Loc::current());
// ... or over the paired axes a_axes[i] with b_axes[i] (negative counts from the end).
Tensor tensordot(const Tensor& a, const Tensor& b, const std::pair<Axes, Axes>& axes,
                 Loc loc = Loc::current());
// numpy.outer: both flattened; out[i, j] = a[i] * b[j].
Tensor outer(const Tensor& a, const Tensor& b, Loc loc = Loc::current());
// numpy.dot: a product with a 0-d operand, the inner product of 1-d ones, matmul of 2-d ones,
// and otherwise the sum over a's last axis and b's second to last (b's only, for 1-d b).
Tensor dot(const Tensor& a, const Tensor& b, Loc loc = Loc::current());
// numpy.cross of 3-vectors along `axis` of a and of b (each of size 3 there; the other axes
// broadcast); the result holds the vectors along `axis`.
Tensor cross(const Tensor& a, const Tensor& b, int64_t axis = -1, Loc loc = Loc::current());
// numpy.kron: the Kronecker product; the lower rank operand gets leading size-1 axes.
Tensor kron(const Tensor& a, const Tensor& b, Loc loc = Loc::current());

}  // namespace kiln
