// What the LAPACK-backed primitives share (src/ops/linalg.cpp, src/ops/linalg_decomp.cpp):
// type checks, strided views of one matrix of a batch, the batch loop over Kiln's threads, the
// float32/float64 kernel registration, and small helpers their derivative rules use.
#pragma once

#include <cblas.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <limits>
#include <string_view>
#include <vector>

#include "detail/parallel.h"
#include "kiln/ops.h"
#include "ops/primitives.h"
#include "ops/rules.h"

namespace kiln::lapack {

// Throws unless t is a float32/float64 stack of matrices [..., m, n].
inline void expect_matrices(std::string_view op, const TensorType& t) {
  if (t.dtype != float32 && t.dtype != float64)
    fail(op, "unsupported dtype: got ", t, ", expected float32 or float64");
  if (t.shape.rank() < 2) fail(op, "not matrices: got ", t, ", expected shape [..., m, n]");
}

// Throws unless t is a float32/float64 stack of square matrices [..., n, n].
inline void expect_square(std::string_view op, const TensorType& t) {
  if (t.dtype != float32 && t.dtype != float64)
    fail(op, "unsupported dtype: got ", t, ", expected float32 or float64");
  if (t.shape.rank() < 2 || t.shape[t.shape.rank() - 1] != t.shape[t.shape.rank() - 2])
    fail(op, "not square matrices: got ", t, ", expected shape [..., n, n]");
}

inline void expect_defined(std::string_view op, const Tensor& t) {
  if (!t.defined())
    fail(op, "undefined operand: got a default-constructed Tensor, expected a tensor");
}

// t's shape with its last `drop` axes replaced by `tail`.
inline Shape with_tail(const Shape& s, int drop, std::vector<int64_t> tail) {
  std::vector<int64_t> out(s.begin(), s.end() - drop);
  out.insert(out.end(), tail.begin(), tail.end());
  return Shape(std::move(out));
}

// Matrix `index` (a flat batch index) of a [..., rows, cols] tensor, as a strided view.
template <typename T>
struct MatrixView {
  const T* data;
  int64_t rows, cols, row_stride, col_stride;
  T at(int64_t i, int64_t j) const { return data[i * row_stride + j * col_stride]; }
};
template <typename T>
MatrixView<T> matrix(const Tensor& t, int64_t index) {
  const int r = t.rank();
  int64_t offset = 0;
  for (int d = r - 3; d >= 0; --d) {
    const int64_t size = t.shape()[d];
    offset += (index % size) * t.strides()[static_cast<std::size_t>(d)];
    index /= size;
  }
  return {static_cast<const T*>(t.raw_data()) + offset, t.shape()[r - 2], t.shape()[r - 1],
          t.strides()[static_cast<std::size_t>(r - 2)],
          t.strides()[static_cast<std::size_t>(r - 1)]};
}

enum class Layout { row_major, col_major };
template <typename T>
void load(const MatrixView<T>& m, Layout layout, T* dst) {
  for (int64_t i = 0; i < m.rows; ++i)
    for (int64_t j = 0; j < m.cols; ++j)
      dst[layout == Layout::row_major ? i * m.cols + j : i + j * m.rows] = m.at(i, j);
}
// The column-major rows x cols matrix src (leading dimension ld) into row-major dst.
template <typename T>
void store_row_major(const T* src, int64_t ld, int64_t rows, int64_t cols, T* dst) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[r * cols + c] = src[r + c * ld];
}

// The number of matrices in a [..., r, c] tensor.
inline int64_t batch_count(const Tensor& t) {
  int64_t count = 1;
  for (int d = 0; d < t.rank() - 2; ++d) count *= t.shape()[d];
  return count;
}

// Runs f(i, work) for every matrix i of a batch, `work` a buffer of `work_size` elements.
// Small matrices are spread over Kiln's threads (LAPACK then runs serially inside the
// parallel region); large ones take LAPACK's threads in turn. n: the largest dimension.
template <typename T, typename F>
void for_each_matrix(std::string_view op, int64_t batch, int64_t n, int64_t work_size, F&& f) {
  if (n > INT_MAX / 2 || work_size > std::numeric_limits<int64_t>::max() / 2)
    fail(op, "matrix too large for LAPACK: got n = ", n, ", expected n below 2^30");
  if (n == 0) return;  // nothing to compute, and LAPACK would reject lda = 0
  constexpr int64_t kSmall = 256;
  const auto run = [&](int64_t b0, int64_t b1) {
    std::vector<T> work(static_cast<std::size_t>(work_size));
    for (int64_t i = b0; i < b1; ++i) f(i, work.data());
  };
  detail::set_library_threads();  // for the calls made outside a parallel region
  if (batch > 1 && n <= kSmall)
    detail::parallel_for(batch, run, std::max<int64_t>(1, n * n * n / 64));
  else
    run(0, batch);
}

// The number of `word`-byte elements that hold `count` LAPACK integers (pivots, iwork) at the
// end of a work buffer.
inline int64_t words_for_ints(int64_t count, std::size_t word) {
  return (count * static_cast<int64_t>(sizeof(blasint)) + static_cast<int64_t>(word) - 1) /
         static_cast<int64_t>(word);
}

template <typename T>
void fill_nan(T* p, int64_t count) {
  std::fill(p, p + count, std::numeric_limits<T>::quiet_NaN());
}

// Runs kernel.template operator()<T> for float (float32) or double (float64) inputs.
template <typename K>
std::vector<KernelRegistration> float_kernel(int arity, K kernel) {
  KernelSignature signature = ops::cpu({});
  signature.inputs.assign(static_cast<std::size_t>(arity), ops::kSingleOrDouble);
  return {{signature, [kernel](ops::Ins in, const Attrs& attrs) {
             return in[0].dtype() == float32 ? kernel.template operator()<float>(in, attrs)
                                             : kernel.template operator()<double>(in, attrs);
           }}};
}

// ---- derivative helpers (public ops, so rules trace and differentiate again) --------------

inline Tensor mT(const Tensor& x) { return swapaxes(x, -1, -2); }
// The diagonals of x [..., n, n] as [..., n], by arithmetic (so it differentiates as sum does).
inline Tensor diagonal_of(const Tensor& x) { return sum(x * eye(x.dim(-1), x.dtype()), {-1}); }
inline Tensor diag_embed(const Tensor& d) { return expand_dims(d, -1) * eye(d.dim(-1), d.dtype()); }
// F_ij = 1 / (w_j - w_i) off the diagonal, 0 on it, for w [..., n] (eigenvector and
// singular-vector derivatives); infinite where two entries of w are equal.
inline Tensor inverse_gaps(const Tensor& w) {
  const Tensor id = eye(w.dim(-1), w.dtype());
  const Tensor gaps = expand_dims(w, -2) - expand_dims(w, -1);  // w_j - w_i
  return (1.0 - id) / (gaps + id);
}
// op(A)^-1 B for a triangular A (non-unit diagonal), through the primitive.
inline Tensor triangular(const Tensor& a, const Tensor& b, bool lower, bool transpose) {
  return bind1(prim::triangular_solve(), {a, b},
               {{"lower", lower}, {"transpose", transpose}, {"unit_diagonal", false}});
}
// A batching rule for a one-input primitive: the batch axis to the front, one batched call.
inline std::vector<Batched> batch_unary(const BatchArgs& b) {
  std::vector<Batched> out;
  for (Tensor& t : bind(b.primitive, {ops::batch_first(b.inputs[0], b.dims[0], b.size)}, b.attrs))
    out.push_back({std::move(t), 0});
  return out;
}

}  // namespace kiln::lapack
