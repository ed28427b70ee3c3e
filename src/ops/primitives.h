// Every built-in primitive by handle: prim::add(), prim::matmul(), prim::while_(), ...
//
// Each accessor is defined in the file that defines its primitive and registers the primitive
// on its first call (a function-local static), so code uses a primitive through a C++ symbol
// instead of looking a name up in the registry. detail::register_builtin_primitives
// (primitives.cpp) calls every accessor; the registry calls it once before any look-up by
// name, walk of all_primitives() or registration of a user's primitive (core/builtins.h).
//
// Naming rule: an accessor is named like its primitive in the IR, with a trailing underscore
// where that name is a C++ keyword or alternative token: and_, or_, not_, xor_, while_.
#pragma once

#include <vector>

#include "core/builtins.h"
#include "kiln/primitive.h"

// The built-in primitives, listed once: it declares the accessors below and the registry
// registers every entry. A new built-in primitive is one entry here and its accessor where
// it is defined.
// One family per line, which clang-format cannot keep stable inside a macro:
// clang-format off
#define KILN_BUILTIN_PRIMITIVES(X)                                                              \
  /* src/ops/unary.cpp */                                                                       \
  X(neg) X(abs) X(sign) X(exp) X(log) X(log1p) X(expm1) X(sqrt) X(rsqrt) X(sin) X(cos) X(tan)   \
  X(tanh) X(sigmoid) X(erf) X(floor) X(ceil) X(round) X(not_) X(isnan) X(convert)               \
  X(stop_gradient)                                                                              \
  /* src/ops/binary.cpp */                                                                      \
  X(add) X(sub) X(mul) X(div) X(pow) X(max) X(min) X(eq) X(ne) X(lt) X(le) X(gt) X(ge) X(and_) \
  X(or_) X(xor_) X(select)                                                                      \
  /* src/ops/reduce.cpp */                                                                      \
  X(reduce_sum) X(reduce_prod) X(reduce_max) X(reduce_min) X(reduce_and) X(reduce_or)           \
  X(argmax) X(argmin)                                                                           \
  /* src/ops/shape.cpp */                                                                       \
  X(reshape) X(transpose) X(broadcast_to) X(slice) X(flip) X(concatenate) X(pad)                \
  /* src/ops/gather.cpp */                                                                      \
  X(gather) X(scatter_add) X(gather_along) X(scatter_add_along)                                 \
  /* src/ops/matmul.cpp */                                                                      \
  X(matmul)                                                                                     \
  /* src/ops/conv.cpp */                                                                        \
  X(conv) X(conv_input_grad) X(conv_weight_grad) X(max_pool2d_grad) X(max_pool2d)               \
  X(avg_pool2d)                                                                                 \
  /* src/ops/random.cpp */                                                                      \
  X(random_bits) X(random_uniform) X(random_split) X(random_fold_in) X(random_permutation)      \
  /* src/ops/random_distributions.cpp */                                                        \
  X(random_truncated_normal) X(random_gamma) X(random_gumbel_top_k) X(random_poisson)                             \
  /* src/nn/nn.cpp */                                                                           \
  X(check_labels)                                                                               \
  /* src/transforms/function_primitives.cpp */                                                  \
  X(call) X(checkpoint) X(custom_jvp) X(custom_vjp)                                             \
  /* src/transforms/collectives.cpp */                                                          \
  X(psum) X(pmax) X(pmin) X(axis_index) X(all_gather) X(ppermute) X(all_to_all)                 \
  X(psum_scatter)                                                                               \
  /* src/distributed/collectives.cpp */                                                         \
  X(process_all_reduce) X(process_all_gather) X(process_reduce_scatter) X(process_all_to_all)   \
  X(process_permute) X(process_broadcast) X(process_replicated) X(process_all_gather_start)     \
  X(process_all_gather_done) X(process_reduce_scatter_start) X(process_reduce_scatter_done)     \
  /* src/transforms/cond.cpp, while_loop.cpp, scan.cpp */                                       \
  X(cond) X(while_) X(while_grad) X(scan)                                                       \
  /* src/ops/math.cpp */                                                                        \
  X(trunc) X(log2) X(log10) X(exp2) X(sinh) X(cosh) X(asin) X(acos) X(atan) X(asinh) X(acosh)  \
  X(atanh) X(erfinv) X(erfc) X(lgamma) X(digamma) X(polygamma) X(isinf) X(isfinite) X(remainder)        \
  X(fmod) X(floor_divide) X(atan2) X(hypot) X(copysign) X(logaddexp) X(bitwise_and)             \
  X(bitwise_or) X(bitwise_xor) X(bitwise_not) X(left_shift) X(right_shift)                      \
  /* src/ops/sort.cpp */                                                                        \
  X(sort) X(cumsum) X(cumprod) X(cummax) X(cummin) X(cumlogsumexp) X(searchsorted)             \
  /* src/ops/linalg.cpp */                                                                      \
  X(cholesky) X(triangular_solve) X(solve) X(slogdet) X(eigh) X(lu) X(lu_pivots_to_permutation) \
  /* src/ops/nonzero.cpp */                                                                     \
  X(nonzero)                                                                                    \
  /* src/ops/scatter.cpp */                                                                     \
  X(scatter_set) X(scatter_mul) X(scatter_max) X(scatter_min)                                   \
  /* src/ops/linalg_decomp.cpp */                                                               \
  X(qr) X(svd) X(svdvals) X(pinv)                                                               \
  /* src/ops/complex.cpp */                                                                     \
  X(complex) X(real) X(imag) X(conj) X(complex_abs)                                             \
  /* src/ops/fft.cpp */                                                                         \
  X(fft) X(rfft) X(irfft)                                                                       \
  /* src/ops/eig.cpp */                                                                         \
  X(eig)
// clang-format on

namespace kiln::prim {

#define KILN_DECLARE_PRIMITIVE(name) const Primitive& name();
KILN_BUILTIN_PRIMITIVES(KILN_DECLARE_PRIMITIVE)
#undef KILN_DECLARE_PRIMITIVE

}  // namespace kiln::prim
