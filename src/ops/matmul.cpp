// Matrix multiplication: the `matmul` primitive ([..., m, k] x [..., k, n] -> [..., m, n], one
// dtype, identical batch dimensions) and the public numpy-style `matmul` built on it (dtype
// promotion, 1-d operands, broadcasting batch dimensions).
//
// float32 runs through oneDNN's matmul or OpenBLAS's sgemm (the rule in src/ops/gemm.cpp),
// float64 through dgemm, complex64/complex128 through cgemm/zgemm. Operands
// whose matrices are row-major or transposed views are passed to gemm as they are (with the
// matching transpose flag); others are copied first. f16/bf16 compute in float32; integers use a
// wrapping i-k-j loop.
#include <cblas.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <optional>
#include <type_traits>

#include "detail/checked.h"
#include "detail/copy.h"
#include "detail/dtype_dispatch.h"
#include "detail/parallel.h"
#include "kiln/ops.h"
#include "ops/gemm.h"
#include "ops/primitives.h"
#include "ops/row_dots.h"
#include "ops/rules.h"

namespace kiln {
namespace {

constexpr std::string_view kOp = "matmul";
const DTypeSet kMatmulDTypes = DTypeSet::numeric() | DTypeSet::complex();

// Raises the type rule's Error unless a @ b is defined: ranks of 2 or more, one numeric dtype,
// equal inner and batch dimensions.
void check_operands(const TensorType& a, const TensorType& b) {
  if (a.shape.rank() < 2 || b.shape.rank() < 2)
    fail(kOp, "operands must have rank >= 2: got ", a, " and ", b,
         ", expected [..., m, k] and [..., k, n] (the public matmul handles 1-d operands)");
  if (a.dtype != b.dtype)
    fail(kOp, "operands differ in dtype: got ", a, " and ", b,
         ", expected one dtype (the public matmul promotes first)");
  if (a.dtype == bool_)
    fail(kOp, "unsupported dtype: got ", a, " and ", b, ", expected a numeric dtype (not bool)");
  const int ra = a.shape.rank(), rb = b.shape.rank();
  const int64_t k = a.shape[ra - 1];
  if (k != b.shape[rb - 2])
    fail(kOp, "inner dimensions differ: got ", a, " and ", b,
         ", expected a.shape[-1] == b.shape[-2] (", k, " vs ", b.shape[rb - 2], ")");
  if (!std::equal(a.shape.begin(), a.shape.end() - 2, b.shape.begin(), b.shape.end() - 2)) {
    const std::vector<int64_t> ba(a.shape.begin(), a.shape.end() - 2);
    const std::vector<int64_t> bb(b.shape.begin(), b.shape.end() - 2);
    fail(kOp, "batch dimensions differ: got ", a, " and ", b, ", expected equal batch dimensions ",
         Shape(ba), " vs ", Shape(bb), " (the public matmul broadcasts first)");
  }
}

// a's shape with b's columns.
Shape out_shape_of(const TensorType& a, const TensorType& b) {
  Shape out = a.shape;
  out[a.shape.rank() - 1] = b.shape[b.shape.rank() - 1];
  return out;
}

std::vector<TensorType> matmul_rule(std::span<const TensorType> in, const Attrs&) {
  check_operands(in[0], in[1]);
  return {{in[0].dtype, out_shape_of(in[0], in[1])}};
}

// Offsets (in elements) of each matrix of a batched operand, for flat batch indices 0..B-1.
std::vector<int64_t> batch_offsets(const Tensor& t) {
  const int nb = t.rank() - 2;
  int64_t count = 1;
  for (int d = 0; d < nb; ++d) count *= t.shape()[d];
  std::vector<int64_t> offs(static_cast<std::size_t>(count), 0);
  const auto& st = t.strides();
  for (int64_t i = 0; i < count; ++i) {
    int64_t rem = i, off = 0;
    for (int d = nb - 1; d >= 0; --d) {
      const int64_t sz = t.shape()[d];
      off += (rem % sz) * st[static_cast<std::size_t>(d)];
      rem /= sz;
    }
    offs[static_cast<std::size_t>(i)] = off;
  }
  return offs;
}

// How a rows x cols matrix with strides (rs, cs) can be handed to gemm without a copy.
struct GemmOperand {
  bool ok = false;
  CBLAS_TRANSPOSE trans = CblasNoTrans;
  int64_t ld = 1;
};
GemmOperand gemm_layout(int64_t rows, int64_t cols, int64_t rs, int64_t cs) {
  if ((cols <= 1 || cs == 1) && (rows <= 1 || rs >= std::max<int64_t>(1, cols)))
    return {true, CblasNoTrans, rows <= 1 ? std::max<int64_t>(1, cols) : rs};
  if ((rows <= 1 || rs == 1) && (cols <= 1 || cs >= std::max<int64_t>(1, rows)))
    return {true, CblasTrans, cols <= 1 ? std::max<int64_t>(1, rows) : cs};
  return {};
}

template <typename T>
void gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t m, int64_t n, int64_t k, const T* a,
          int64_t lda, const T* b, int64_t ldb, T* c, int64_t ldc) {
  const auto i = [](int64_t v) { return static_cast<blasint>(v); };
  detail::set_library_threads();
  if constexpr (std::is_same_v<T, float>) {
    cblas_sgemm(CblasRowMajor, ta, tb, i(m), i(n), i(k), 1.0f, a, i(lda), b, i(ldb), 0.0f, c,
                i(ldc));
  } else if constexpr (std::is_same_v<T, double>) {
    cblas_dgemm(CblasRowMajor, ta, tb, i(m), i(n), i(k), 1.0, a, i(lda), b, i(ldb), 0.0, c, i(ldc));
  } else {  // complex: alpha and beta by pointer; CblasTrans transposes without conjugating
    const T one{1}, zero{0};
    if constexpr (std::is_same_v<T, std::complex<float>>)
      cblas_cgemm(CblasRowMajor, ta, tb, i(m), i(n), i(k), &one, a, i(lda), b, i(ldb), &zero, c,
                  i(ldc));
    else
      cblas_zgemm(CblasRowMajor, ta, tb, i(m), i(n), i(k), &one, a, i(lda), b, i(ldb), &zero, c,
                  i(ldc));
  }
}

// c[1, n] = a[1, k] b[k, n] as a matrix-vector product: a token's step through a layer when
// generating, bound by reading b. OpenBLAS's gemv streamed the matrix at about twice the rate
// of a one-row matmul on oneDNN or sgemm (x[1, 384] @ W[384, 1536] with W stored as
// nn.Linear's [1536, 384]: 65 against 34 GB/s on two threads, 32 against 18 on one). float32
// against a b held by the rows of its transpose, that case, now runs ops::row_dots, which
// reads it faster still.
template <typename T>
void gemv(const GemmOperand& la, const GemmOperand& lb, int64_t k, int64_t n, const T* a,
          const T* b, T* c) {
  const auto i = [](int64_t v) { return static_cast<blasint>(v); };
  // a's k elements: contiguous, or ld apart when a is a transposed view.
  const int64_t inc = la.trans == CblasNoTrans ? 1 : la.ld;
  // b row-major [k, n]: c = bᵀ a; b transposed (stored [n, k]): c = (that [n, k]) a.
  const bool stored_nk = lb.trans != CblasNoTrans;
  const CBLAS_TRANSPOSE t = stored_nk ? CblasNoTrans : CblasTrans;
  const int64_t rows = stored_nk ? n : k, cols = stored_nk ? k : n;
  if constexpr (std::is_same_v<T, float>) {
    if (stored_nk && inc == 1) {
      detail::parallel_for(
          n, [&](int64_t j0, int64_t j1) { ops::row_dots(b, lb.ld, a, c, k, j0, j1); }, k);
      return;
    }
  }
  detail::set_library_threads();
  if constexpr (std::is_same_v<T, float>)
    cblas_sgemv(CblasRowMajor, t, i(rows), i(cols), 1.0f, b, i(lb.ld), a, i(inc), 0.0f, c, 1);
  else
    cblas_dgemv(CblasRowMajor, t, i(rows), i(cols), 1.0, b, i(lb.ld), a, i(inc), 0.0, c, 1);
}

// Where gemm's operand (trans, ld) lies as strides, for oneDNN.
ops::GemmStrides strides(const GemmOperand& l, int64_t batch, int64_t outer = 0) {
  return ops::blas_strides(l.trans != CblasNoTrans, l.ld, batch, outer);
}

// The step s of offsets 0, s, 2s, ...; std::nullopt when they are not evenly spaced.
std::optional<int64_t> even_step(const std::vector<int64_t>& offs) {
  const int64_t step = offs.size() > 1 ? offs[1] - offs[0] : 0;
  for (std::size_t i = 0; i < offs.size(); ++i)
    if (offs[i] != static_cast<int64_t>(i) * step) return std::nullopt;
  return step;
}

// Offsets as a grid of outer x inner entries: offs[o * inner + i] = o * outer_step + i * step.
struct GridSteps {
  int64_t outer_step, step;
};
std::optional<GridSteps> grid_steps(const std::vector<int64_t>& offs, int64_t inner) {
  const auto n = static_cast<int64_t>(offs.size());
  if (inner <= 1 || inner >= n || n % inner != 0) return std::nullopt;
  const GridSteps g{offs[static_cast<std::size_t>(inner)], offs[1]};
  for (int64_t o = 0; o < n / inner; ++o)
    for (int64_t i = 0; i < inner; ++i)
      if (offs[static_cast<std::size_t>(o * inner + i)] != o * g.outer_step + i * g.step)
        return std::nullopt;
  return g;
}

// A batch of float32 products on oneDNN: one call when both operands' matrices are evenly
// spaced, or lie on a grid of two even batch axes, and oneDNN takes that layout (it then splits
// the batch across threads); else one call per product (ops::dnnl_sgemm_each). False when
// oneDNN does not take the layout of one product.
bool dnnl_batch(const GemmOperand& la, const GemmOperand& lb, const std::vector<int64_t>& oa,
                const std::vector<int64_t>& ob, const Shape& batch_dims, int64_t m, int64_t n,
                int64_t k, const float* pa, const float* pb, float* pc) {
  const auto batch = static_cast<int64_t>(oa.size());
  const std::optional<int64_t> sa = even_step(oa), sb = even_step(ob);
  if (sa && sb && ops::dnnl_sgemm({batch, m, n, k, pa, strides(la, *sa), pb, strides(lb, *sb), pc}))
    return true;
  // Two batch axes, each even: the batch dimensions split in two, [B, heads] for instance.
  int64_t inner = 1;
  for (int d = batch_dims.rank() - 1; d > 0; --d) {
    inner *= batch_dims[d];
    const std::optional<GridSteps> ga = grid_steps(oa, inner), gb = grid_steps(ob, inner);
    if (ga && gb &&
        ops::dnnl_sgemm({inner, m, n, k, pa, strides(la, ga->step, ga->outer_step), pb,
                         strides(lb, gb->step, gb->outer_step), pc, batch / inner}))
      return true;
  }
  std::vector<ops::SgemmCall> calls;
  for (std::size_t i = 0; i < oa.size(); ++i)
    calls.push_back({1, m, n, k, pa + oa[i], strides(la, 0), pb + ob[i], strides(lb, 0),
                     pc + static_cast<int64_t>(i) * m * n});
  return ops::dnnl_sgemm_each(calls);
}

// k = 1 (per-example weight gradients under vmap are batches of these): c[i, j] = a[i] * b[j],
// written once. gemm would first clear c (its beta pass) and then add the products: twice
// the memory traffic for the same, exactly rounded, values.
template <typename T>
Tensor outer_product(const Tensor& a, const Tensor& b, int64_t as, int64_t bs, int64_t m, int64_t n,
                     Tensor out) {
  const std::vector<int64_t> oa = batch_offsets(a), ob = batch_offsets(b);
  const T* pa = static_cast<const T*>(a.raw_data());
  const T* pb = static_cast<const T*>(b.raw_data());
  T* pc = out.data<T>();
  detail::parallel_for(
      static_cast<int64_t>(oa.size()) * m,
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const auto bi = static_cast<std::size_t>(r / m);
          const T x = pa[oa[bi] + (r % m) * as];
          const T* brow = pb + ob[bi];
          T* crow = pc + r * n;
          if (bs == 1)
            for (int64_t j = 0; j < n; ++j) crow[j] = x * brow[j];
          else
            for (int64_t j = 0; j < n; ++j) crow[j] = x * brow[j * bs];
        }
      },
      std::max<int64_t>(1, n));
  return out;
}

// Products this small run single-threaded inside OpenBLAS, so batches of them are split
// across our threads instead (OpenBLAS: SMP_THRESHOLD_MIN * GEMM_MULTITHREAD_THRESHOLD).
constexpr int64_t kSmallGemmFlops = 65536 * 4;

template <typename T>
Tensor blas_matmul(Tensor a, Tensor b, const Shape& out_shape) {
  const int ra = a.rank(), rb = b.rank();
  const int64_t m = a.shape()[ra - 2], k = a.shape()[ra - 1], n = b.shape()[rb - 1];
  Tensor out = empty(out_shape, dtype_v<T>);
  if (out.numel() == 0) return out;
  T* pc = out.data<T>();
  if (k == 0) {
    std::fill(pc, pc + out.numel(), T{0});
    return out;
  }
  const auto stride = [](const Tensor& t, int d) {
    return t.strides()[static_cast<std::size_t>(t.rank() + d)];
  };
  if (k == 1) return outer_product<T>(a, b, stride(a, -2), stride(b, -1), m, n, std::move(out));
  GemmOperand la = gemm_layout(m, k, stride(a, -2), stride(a, -1));
  if (!la.ok) {
    a = a.contiguous();
    la = gemm_layout(m, k, stride(a, -2), stride(a, -1));
  }
  GemmOperand lb = gemm_layout(k, n, stride(b, -2), stride(b, -1));
  if (!lb.ok) {
    b = b.contiguous();
    lb = gemm_layout(k, n, stride(b, -2), stride(b, -1));
  }
  const T* pa = static_cast<const T*>(a.raw_data());
  const T* pb = static_cast<const T*>(b.raw_data());
  if (m > INT_MAX || n > INT_MAX || k > INT_MAX || la.ld > INT_MAX || lb.ld > INT_MAX)
    fail(kOp, "matrix too large for BLAS: got ", a.type(), " and ", b.type(),
         ", expected every dimension and leading stride below 2^31");
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    if (m == 1 && out.numel() == n) {  // one row, one matrix
      gemv<T>(la, lb, k, n, pa, pb, pc);
      return out;
    }
  }
  const std::vector<int64_t> oa = batch_offsets(a), ob = batch_offsets(b);
  const int64_t batch = static_cast<int64_t>(oa.size());

  // One big gemm when b is the same matrix for every batch entry and a's batch and row
  // dimensions fold into one row dimension (x @ W with x [..., m, k]): rows = batch * m.
  bool folds = batch > 1 && la.trans == CblasNoTrans && m * batch <= INT_MAX &&
               std::all_of(ob.begin(), ob.end(), [&](int64_t o) { return o == ob[0]; });
  for (int64_t i = 0; folds && i < batch; ++i)
    folds = oa[static_cast<std::size_t>(i)] == i * m * la.ld;
  if constexpr (std::is_same_v<T, float>) {
    if (ops::sgemm_backend() == GemmBackend::onednn &&
        (folds ? ops::dnnl_sgemm(
                     {1, batch * m, n, k, pa, strides(la, 0), pb + ob[0], strides(lb, 0), pc})
               : dnnl_batch(la, lb, oa, ob,
                            Shape(std::vector<int64_t>(out_shape.begin(), out_shape.end() - 2)), m,
                            n, k, pa, pb, pc)))
      return out;
  }
  if (folds) {
    gemm<T>(CblasNoTrans, lb.trans, batch * m, n, k, pa, la.ld, pb + ob[0], lb.ld, pc, n);
    return out;
  }
  const auto one = [&](int64_t i) {
    gemm<T>(la.trans, lb.trans, m, n, k, pa + oa[static_cast<std::size_t>(i)], la.ld,
            pb + ob[static_cast<std::size_t>(i)], lb.ld, pc + i * m * n, n);
  };
  // m * n * k can pass 2^63 (k up to 2^31 with a large output); only small products matter.
  const int64_t flops = m * n > kSmallGemmFlops / k ? kSmallGemmFlops + 1 : m * n * k;
  if (batch > 1 && flops <= kSmallGemmFlops) {
    // parallel_for's grain is in elementwise-op units; gemm does ~64 multiply-adds in that time.
    detail::parallel_for(
        batch,
        [&](int64_t b0, int64_t b1) {
          for (int64_t i = b0; i < b1; ++i) one(i);
        },
        std::max<int64_t>(1, flops / 64));
  } else {
    for (int64_t i = 0; i < batch; ++i) one(i);
  }
  return out;
}

// Integer matmul: i-k-j loops over rows of b, in unsigned arithmetic so overflow wraps.
template <typename T>
Tensor integer_matmul(const Tensor& a, Tensor b, const Shape& out_shape) {
  using U = std::conditional_t<(sizeof(T) < 4), uint32_t, std::make_unsigned_t<T>>;
  const int ra = a.rank(), rb = b.rank();
  const int64_t m = a.shape()[ra - 2], k = a.shape()[ra - 1], n = b.shape()[rb - 1];
  Tensor out = empty(out_shape, dtype_v<T>);
  if (out.numel() == 0) return out;
  if (n > 1 && b.strides()[static_cast<std::size_t>(rb - 1)] != 1) b = b.contiguous();
  const int64_t ars = a.strides()[static_cast<std::size_t>(ra - 2)];
  const int64_t acs = a.strides()[static_cast<std::size_t>(ra - 1)];
  const int64_t brs = b.strides()[static_cast<std::size_t>(rb - 2)];
  const int64_t bcs = n > 1 ? 1 : 0;
  const std::vector<int64_t> oa = batch_offsets(a), ob = batch_offsets(b);
  const T* pa = static_cast<const T*>(a.raw_data());
  const T* pb = static_cast<const T*>(b.raw_data());
  T* pc = out.data<T>();
  const int64_t rows = static_cast<int64_t>(oa.size()) * m;
  detail::parallel_for(
      rows,
      [&](int64_t r0, int64_t r1) {
        std::vector<U> acc(static_cast<std::size_t>(n));
        for (int64_t r = r0; r < r1; ++r) {
          const auto bi = static_cast<std::size_t>(r / m);
          const int64_t i = r % m;
          std::fill(acc.begin(), acc.end(), U{0});
          const T* arow = pa + oa[bi] + i * ars;
          const T* bmat = pb + ob[bi];
          for (int64_t kk = 0; kk < k; ++kk) {
            const U x = static_cast<U>(arow[kk * acs]);
            const T* brow = bmat + kk * brs;
            for (int64_t j = 0; j < n; ++j)
              acc[static_cast<std::size_t>(j)] += static_cast<U>(x * static_cast<U>(brow[j * bcs]));
          }
          T* crow = pc + r * n;
          for (int64_t j = 0; j < n; ++j)
            crow[j] = static_cast<T>(acc[static_cast<std::size_t>(j)]);
        }
      },
      std::max<int64_t>(1, n * k));
  return out;
}

// Checked as the type rule does, without its allocations: a token's step through a model
// calls this a dozen times.
Tensor matmul_kernel_impl(const Tensor& a, const Tensor& b) {
  check_operands(a.type(), b.type());
  const Shape out_shape = out_shape_of(a.type(), b.type());
  if (is_complex(a.dtype()))
    return detail::visit_complex(a.dtype(),
                                 [&]<typename T>() { return blas_matmul<T>(a, b, out_shape); });
  return detail::visit_dtype(a.dtype(), [&]<typename T>() -> Tensor {
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      return blas_matmul<T>(a, b, out_shape);
    } else if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
      Tensor a32 = empty(a.shape(), float32), b32 = empty(b.shape(), float32);
      detail::copy_cast(a, a32);
      detail::copy_cast(b, b32);
      Tensor o32 = blas_matmul<float>(a32, b32, out_shape);
      Tensor out = empty(out_shape, dtype_v<T>);
      detail::copy_cast(o32, out);
      return out;
    } else if constexpr (std::is_same_v<T, bool>) {
      fail(kOp, "unsupported dtype: got ", a.type(), ", expected a numeric dtype (not bool)");
    } else {
      return integer_matmul<T>(a, b, out_shape);
    }
  });
}

// d(AB) = dA B + A dB; the cotangents are ct B^T and A^T ct (batch axes ride along).
Primitive matmul_primitive() {
  Primitive p;
  p.name = "matmul";
  p.arity = 2;
  p.algebra.transposes_as_product = true;
  p.type_rule = matmul_rule;
  p.flops = [](std::span<const TensorType> in, std::span<const TensorType> out, const Attrs&) {
    return 2.0 * static_cast<double>(out[0].shape.numel()) *
           static_cast<double>(in[0].shape[in[0].shape.rank() - 1]);
  };
  p.jvp = [](const RuleArgs& r, std::span<const Tangent> t) -> std::vector<Tangent> {
    const Primitive& self = r.primitive;
    Tangent out;
    if (t[0]) out = bind1(self, {*t[0], r.inputs[1]});
    if (t[1]) {
      const Tensor d = bind1(self, {r.inputs[0], *t[1]});
      out = out ? Tangent(*out + d) : Tangent(d);
    }
    return {out};
  };
  p.vjp = [](const RuleArgs& r, std::span<const Tangent> ct) -> std::vector<Tangent> {
    const Primitive& self = r.primitive;
    return {bind1(self, {*ct[0], swapaxes(r.inputs[1], -1, -2)}),
            bind1(self, {swapaxes(r.inputs[0], -1, -2), *ct[0]})};
  };
  // The batch axis becomes one more leading batch axis; an unbatched operand is broadcast
  // (a stride-0 view, which the kernel recognises as one shared matrix).
  p.batch = [](const BatchArgs& b) -> std::vector<Batched> {
    return {{bind1(b.primitive, {ops::batch_first(b.inputs[0], b.dims[0], b.size),
                                 ops::batch_first(b.inputs[1], b.dims[1], b.size)}),
             0}};
  };
  return p;
}

}  // namespace

const Primitive& prim::matmul() {
  static const Primitive& p = detail::register_builtin(
      matmul_primitive(),
      {{ops::cpu({kMatmulDTypes, kMatmulDTypes}), [](std::span<const Tensor> in, const Attrs&) {
          return std::vector<Tensor>{matmul_kernel_impl(in[0], in[1])};
        }}});
  return p;
}

Tensor matmul(const Tensor& a, const Tensor& b, Loc loc) {
  const detail::CallSite site(loc);
  if (!a.defined() || !b.defined())
    fail(kOp, "undefined operand: got a default-constructed Tensor, expected tensors");
  if (a.rank() == 0 || b.rank() == 0)
    fail(kOp, "0-d operand: got ", a.type(), " and ", b.type(),
         ", expected operands of rank >= 1 (use mul to scale by a scalar)");
  const int64_t ka = a.dim(-1), kb = b.rank() == 1 ? b.dim(0) : b.dim(-2);
  if (ka != kb)
    fail(kOp, "inner dimensions differ: got ", a.type(), " and ", b.type(), ", expected ",
         "a.shape[-1] == b.shape[", b.rank() == 1 ? "0" : "-2", "] (", ka, " vs ", kb, ")");
  // Batch dimensions broadcast (numpy rules); the messages name the original operands.
  const std::vector<int64_t> ba(a.shape().begin(), a.shape().end() - std::min(a.rank(), 2));
  const std::vector<int64_t> bb(b.shape().begin(), b.shape().end() - std::min(b.rank(), 2));
  const int nb = static_cast<int>(std::max(ba.size(), bb.size()));
  std::vector<int64_t> batch(static_cast<std::size_t>(nb));
  for (int i = 0; i < nb; ++i) {
    const int ia = static_cast<int>(ba.size()) - nb + i, ib = static_cast<int>(bb.size()) - nb + i;
    const int64_t da = ia >= 0 ? ba[static_cast<std::size_t>(ia)] : 1;
    const int64_t db = ib >= 0 ? bb[static_cast<std::size_t>(ib)] : 1;
    if (da != db && da != 1 && db != 1)
      fail(kOp, "batch dimensions cannot be broadcast: got ", a.type(), " and ", b.type(),
           ", expected batch dimensions ", Shape(ba), " and ", Shape(bb),
           " to be equal or 1 where they differ (", da, " vs ", db, ")");
    batch[static_cast<std::size_t>(i)] = da == 1 ? db : da;
  }

  DType dt = promote_types(a.dtype(), b.dtype());
  if (dt == bool_) dt = int32;  // like arithmetic on bools elsewhere in Kiln
  Tensor x = ops::cast_if_needed(a, dt, loc), y = ops::cast_if_needed(b, dt, loc);
  const bool a_vec = x.rank() == 1, b_vec = y.rank() == 1;
  if (a_vec) x = expand_dims(x, 0, loc);   // [k] -> [1, k]
  if (b_vec) y = expand_dims(y, -1, loc);  // [k] -> [k, 1]
  const auto full_shape = [&](const Tensor& t) {
    std::vector<int64_t> s = batch;
    s.push_back(t.dim(-2));
    s.push_back(t.dim(-1));
    return Shape(std::move(s));
  };
  Tensor out;
  if (x.rank() > 2 && y.rank() == 2) {
    // A stack of matrices times one matrix is one product, the batch axes folded into the rows
    // (as F.linear does): one GEMM with all the rows, and the gradient of the shared matrix is
    // one product over them rather than a product per batch entry and then their sum.
    int64_t rows = 1;
    for (int64_t d = 0; d + 1 < x.rank(); ++d) rows = detail::checked_mul(kOp, rows, x.dim(d));
    const Tensor product = bind1(prim::matmul(), {reshape(x, {rows, x.dim(-1)}, loc), y}, {}, loc);
    std::vector<int64_t> shape = batch;
    shape.push_back(x.dim(-2));
    shape.push_back(y.dim(-1));
    out = reshape(product, Shape(std::move(shape)), loc);
  } else {
    if (Shape s = full_shape(x); s != x.shape()) x = broadcast_to(x, s, loc);
    if (Shape s = full_shape(y); s != y.shape()) y = broadcast_to(y, s, loc);
    out = bind1(prim::matmul(), {x, y}, {}, loc);
  }
  if (a_vec && b_vec) return squeeze(out, {-2, -1}, loc);
  if (a_vec) return squeeze(out, {-2}, loc);
  if (b_vec) return squeeze(out, {-1}, loc);
  return out;
}

}  // namespace kiln
