// Reductions over a set of axes (reduce_sum, reduce_prod, reduce_max, reduce_min, reduce_and,
// reduce_or), argmax/argmin over one axis, and the composite ops built from them.
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>

#include "detail/dtype_dispatch.h"
#include "detail/parallel.h"
#include "detail/strided.h"
#include "kiln/ops.h"
#include "ops/primitives.h"
#include "ops/rules.h"

namespace kiln {
namespace {

// The `axes` attribute normalised (sorted, each in [0, rank)), or an Error naming the
// primitive: it may count from the end, so the type rule, the kernel and every derivative rule
// read it here and never index a shape with it directly.
std::vector<int> reduced_axes(std::string_view op, const Attrs& a, int rank) {
  return normalize_axes(op, a.get_ints("axes"), rank, false);
}

Shape reduced_shape(const Shape& s, const std::vector<int>& axes) {
  Shape out;
  for (int i = 0; i < s.rank(); ++i)
    if (!std::binary_search(axes.begin(), axes.end(), i)) out.dims().push_back(s[i]);
  return out;
}

// Splits x's dims into kept and reduced ones (each with its strides) for the loops below.
struct ReduceLayout {
  std::vector<int64_t> kept_shape, kept_strides, red_shape, red_strides;
  int64_t kept_count = 1, red_count = 1;
};
ReduceLayout layout(const Tensor& x, const std::vector<int>& axes) {
  ReduceLayout L;
  for (int i = 0; i < x.rank(); ++i) {
    const bool red = std::binary_search(axes.begin(), axes.end(), i);
    (red ? L.red_shape : L.kept_shape).push_back(x.shape()[i]);
    (red ? L.red_strides : L.kept_strides).push_back(x.strides()[static_cast<std::size_t>(i)]);
  }
  for (int64_t d : L.kept_shape) L.kept_count *= d;
  for (int64_t d : L.red_shape) L.red_count *= d;
  return L;
}

// Offset of flat index i of a (shape, strides) sub-space.
int64_t offset_of(int64_t i, const std::vector<int64_t>& shape, const std::vector<int64_t>& st) {
  int64_t off = 0;
  for (std::size_t d = shape.size(); d-- > 0;) {
    off += (i % shape[d]) * st[d];
    i /= shape[d];
  }
  return off;
}

// Each reducer: identity, combine, and whether it needs a non-empty input.
struct SumR {
  static constexpr lowering::Reduction lowered = lowering::Reduction::sum;  // compiled loops
  static constexpr bool needs_elements = false;
  template <typename A>
  static A identity() {
    return A{0};
  }
  template <typename A>
  static A combine(A a, A b) {
    return a + b;
  }
};
struct ProdR {
  static constexpr lowering::Reduction lowered = lowering::Reduction::prod;  // compiled loops
  static constexpr bool needs_elements = false;
  template <typename A>
  static A identity() {
    return A{1};
  }
  template <typename A>
  static A combine(A a, A b) {
    return a * b;
  }
};
struct MaxR {
  static constexpr lowering::Reduction lowered = lowering::Reduction::max;  // compiled loops
  static constexpr bool needs_elements = true;
  template <typename A>
  static A identity() {
    if constexpr (std::is_floating_point_v<A>)
      return -std::numeric_limits<A>::infinity();
    else
      return std::numeric_limits<A>::lowest();
  }
  // NaN propagates, and +0 beats -0: the result does not depend on the order of combining
  // (threads, vector lanes), as the compiled reductions rely on.
  template <typename A>
  static A combine(A a, A b) {
    if constexpr (std::is_floating_point_v<A>) {
      if (a != a || b != b) return a + b;
      if (a == b) return std::signbit(a) ? b : a;
    }
    return a > b ? a : b;
  }
};
struct MinR {
  static constexpr lowering::Reduction lowered = lowering::Reduction::min;  // compiled loops
  static constexpr bool needs_elements = true;
  template <typename A>
  static A identity() {
    if constexpr (std::is_floating_point_v<A>)
      return std::numeric_limits<A>::infinity();
    else
      return std::numeric_limits<A>::max();
  }
  template <typename A>
  static A combine(A a, A b) {
    if constexpr (std::is_floating_point_v<A>) {
      if (a != a || b != b) return a + b;
      if (a == b) return std::signbit(a) ? a : b;
    }
    return a < b ? a : b;
  }
};
struct AndR {
  static constexpr lowering::Reduction lowered = lowering::Reduction::all;  // compiled loops
  static constexpr bool needs_elements = false;
  template <typename A>
  static A identity() {
    return true;
  }
  template <typename A>
  static A combine(A a, A b) {
    return a && b;
  }
};
struct OrR {
  static constexpr lowering::Reduction lowered = lowering::Reduction::any;  // compiled loops
  static constexpr bool needs_elements = false;
  template <typename A>
  static A identity() {
    return false;
  }
  template <typename A>
  static A combine(A a, A b) {
    return a || b;
  }
};

// Accumulator: sums and products of floats in double, of integers in 64 bits (wrapping);
// max/min in the compute type; and/or in bool; complex sums and products in complex<double>.
template <typename R, typename T>
using acc_for = std::conditional_t<
    std::is_same_v<R, AndR> || std::is_same_v<R, OrR>, bool,
    std::conditional_t<
        std::is_same_v<R, SumR> || std::is_same_v<R, ProdR>,
        std::conditional_t<
            detail::is_complex_v<T>, std::complex<double>,
            std::conditional_t<std::is_floating_point_v<detail::compute_t<T>>, double, uint64_t>>,
        detail::compute_t<T>>>;

template <typename R, typename T>
void reduce_kernel(const Tensor& x, const std::vector<int>& axes, const Tensor& out) {
  using A = acc_for<R, T>;
  const ReduceLayout L = layout(x, axes);
  const T* px = static_cast<const T*>(x.raw_data());
  T* po = static_cast<T*>(out.raw_data());
  auto load = [](T v) -> A {
    if constexpr (std::is_same_v<A, uint64_t>)
      return static_cast<A>(static_cast<int64_t>(v));
    else
      return static_cast<A>(static_cast<detail::compute_t<T>>(v));
  };
  auto store = [](A v) -> T {
    if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>)
      return T(static_cast<float>(v));
    else
      return static_cast<T>(v);
  };
  const bool inner_kept = !L.kept_strides.empty() && L.kept_strides.back() == 1 &&
                          L.kept_shape.back() > 1 &&
                          (L.red_strides.empty() || L.red_strides.back() != 1);
  if (inner_kept && L.red_count > 1) {
    // The innermost memory dimension is kept: accumulate whole rows (vectorises) for each
    // reduced index, in parallel over blocks of the kept space.
    const int64_t inner = L.kept_shape.back();
    const int64_t outer = L.kept_count / inner;
    std::vector<int64_t> outer_shape(L.kept_shape.begin(), L.kept_shape.end() - 1);
    std::vector<int64_t> outer_strides(L.kept_strides.begin(), L.kept_strides.end() - 1);
    detail::parallel_for(
        outer * inner,
        [&](int64_t b, int64_t e) {
          constexpr int64_t kBlock = 1024;
          // unique_ptr, not vector: vector<bool> packs bits.
          std::unique_ptr<A[]> acc(new A[kBlock]);
          for (int64_t start = b; start < e;) {
            const int64_t o = start / inner, j0 = start % inner;
            const int64_t len = std::min({kBlock, inner - j0, e - start});
            std::fill(acc.get(), acc.get() + len, R::template identity<A>());
            const T* base = px + offset_of(o, outer_shape, outer_strides) + j0;
            for (int64_t r = 0; r < L.red_count; ++r) {
              const T* row = base + offset_of(r, L.red_shape, L.red_strides);
              for (int64_t j = 0; j < len; ++j) acc[j] = R::combine(acc[j], load(row[j]));
            }
            for (int64_t j = 0; j < len; ++j) po[start + j] = store(acc[j]);
            start += len;
          }
        },
        L.red_count);
    return;
  }
  // Otherwise one output at a time; the reduced space is walked with an odometer whose
  // innermost dimension is usually contiguous.
  const auto red = detail::coalesce<1>(L.red_shape, {&L.red_strides});
  const std::vector<int64_t>& rs = red.shape;
  const std::vector<int64_t>& rst = red.strides[0];
  const int rr = static_cast<int>(rs.size());
  if (L.kept_count == 1 && rr == 1 && L.red_count >= detail::kParallelGrain) {
    // One output over many elements (sum of a whole tensor): split the elements across
    // threads, four independent accumulators each so the adds pipeline, then combine.
    const T* base = px + offset_of(0, L.kept_shape, L.kept_strides);
    const int64_t n = L.red_count, st = rst[0];
    const int chunks = std::max(
        1, std::min<int>(detail::thread_count(), static_cast<int>(n / detail::kParallelGrain)));
    std::unique_ptr<A[]> part(new A[static_cast<std::size_t>(chunks)]);
#pragma omp parallel for num_threads(chunks) \
    schedule(static, 1) if (chunks > 1 && !omp_in_parallel() && !detail::serial_thread)
    for (int c = 0; c < chunks; ++c) {
      detail::apply_flush_denormal();
      const int64_t b = n * c / chunks, e = n * (c + 1) / chunks;
      A acc[4] = {R::template identity<A>(), R::template identity<A>(), R::template identity<A>(),
                  R::template identity<A>()};
      int64_t k = b;
      for (; k + 4 <= e; k += 4)
        for (int j = 0; j < 4; ++j) acc[j] = R::combine(acc[j], load(base[(k + j) * st]));
      for (; k < e; ++k) acc[0] = R::combine(acc[0], load(base[k * st]));
      part[c] = R::combine(R::combine(acc[0], acc[1]), R::combine(acc[2], acc[3]));
    }
    A total = R::template identity<A>();
    for (int c = 0; c < chunks; ++c) total = R::combine(total, part[c]);
    po[0] = store(total);
    return;
  }
  detail::parallel_for(
      L.kept_count,
      [&](int64_t b, int64_t e) {
        std::vector<int64_t> idx(static_cast<std::size_t>(rr));
        for (int64_t o = b; o < e; ++o) {
          const T* base = px + offset_of(o, L.kept_shape, L.kept_strides);
          A acc = R::template identity<A>();
          if (L.red_count > 0) {
            std::fill(idx.begin(), idx.end(), 0);
            int64_t off = 0;
            const int64_t inner = rs.back(), ist = rst.back();
            for (int64_t row = 0; row < L.red_count / inner; ++row) {
              const T* p = base + off;
              if (ist == 1) {
                for (int64_t k = 0; k < inner; ++k) acc = R::combine(acc, load(p[k]));
              } else {
                for (int64_t k = 0; k < inner; ++k) acc = R::combine(acc, load(p[k * ist]));
              }
              for (int d = rr - 2; d >= 0; --d) {
                const auto u = static_cast<std::size_t>(d);
                off += rst[u];
                if (++idx[u] < rs[u]) break;
                off -= rst[u] * rs[u];
                idx[u] = 0;
              }
            }
          }
          po[o] = store(acc);
        }
      },
      std::max<int64_t>(L.red_count, 1));
}

// A tensor reduced like r's output (axes dropped) broadcast back over r's input's shape.
Tensor expand_back(const Tensor& y, const RuleArgs& r) {
  const Tensor& x = r.inputs[0];
  std::vector<int64_t> dims = x.shape().dims();
  for (int ax : reduced_axes(r.primitive.name, r.attrs, x.rank()))
    dims[static_cast<std::size_t>(ax)] = 1;
  return broadcast_to(reshape(y, Shape(dims)), x.shape());
}

// Rules for each reduction, written with primitives so they differentiate again.
struct SumRules {
  static ops::Ts jvp(const RuleArgs& r, std::span<const Tangent> t) {
    return ops::linear_jvp(r, t);
  }
  static ops::Ts vjp(const RuleArgs& r, std::span<const Tangent> ct) {
    return {expand_back(*ct[0], r)};
  }
};
// The derivative of a product with respect to x_i is the product of the others: the
// exclusive prefix product times the exclusive suffix product over the reduced elements, each
// a log-depth scan of multiplies (as in JAX). No division and no branch on zeros, so it is
// right where x has zeros and differentiates again (a product's second derivatives are not
// zero at its zeros; a where-based rule that returns constant 0 there gets them wrong).
Tensor exclusive_cumprod_last(const Tensor& a) {
  const int r = a.rank();
  const int64_t n = a.shape()[r - 1];
  if (n == 0) return a;
  auto shifted = [&](const Tensor& t, int64_t d) {  // t[..., i - d], ones for i < d
    std::vector<Slice> sl(static_cast<std::size_t>(r));
    sl.back() = Slice{0, n - d, 1};
    std::vector<std::pair<int64_t, int64_t>> w(static_cast<std::size_t>(r), {0, 0});
    w.back() = {d, 0};
    return pad(slice(t, sl), w, 1.0);
  };
  Tensor inclusive = a;
  for (int64_t d = 1; d < n; d *= 2) inclusive = inclusive * shifted(inclusive, d);
  return shifted(inclusive, 1);
}
Tensor prod_partials(const RuleArgs& r) {
  const Tensor& x = r.inputs[0];
  const std::vector<int> axes = reduced_axes(r.primitive.name, r.attrs, x.rank());
  Axes perm;  // kept axes, then the reduced ones
  for (int i = 0; i < x.rank(); ++i)
    if (!std::binary_search(axes.begin(), axes.end(), i)) perm.push_back(i);
  perm.insert(perm.end(), axes.begin(), axes.end());
  const Tensor xt = transpose(x, perm);
  std::vector<int64_t> dims(xt.shape().begin(),
                            xt.shape().end() - static_cast<std::ptrdiff_t>(axes.size()));
  int64_t n = 1;
  for (int a : axes) n *= x.shape()[a];
  dims.push_back(n);
  const Tensor flat = reshape(xt, Shape(dims));
  const int64_t last = flat.rank() - 1;
  const Tensor others =
      exclusive_cumprod_last(flat) * flip(exclusive_cumprod_last(flip(flat, {last})), {last});
  Axes inverse(perm.size());
  for (std::size_t i = 0; i < perm.size(); ++i)
    inverse[static_cast<std::size_t>(perm[i])] = static_cast<int64_t>(i);
  return transpose(reshape(others, xt.shape()), inverse);
}
struct ProdRules {
  static ops::Ts jvp(const RuleArgs& r, std::span<const Tangent> t) {
    return {bind1(prim::reduce_sum(), {*t[0] * prod_partials(r)}, r.attrs)};
  }
  static ops::Ts vjp(const RuleArgs& r, std::span<const Tangent> ct) {
    return {expand_back(*ct[0], r) * prod_partials(r)};
  }
};
// max/min: the derivative is shared equally among the elements that attain the extreme.
Tensor extreme_weights(const RuleArgs& r) {
  const Tensor& x = r.inputs[0];
  const Tensor hit = astype(x == expand_back(r.outputs[0], r), x.dtype());
  const Tensor count = bind1(prim::reduce_sum(), {hit}, r.attrs);
  return hit / expand_back(count, r);
}
struct ExtremeRules {
  static ops::Ts jvp(const RuleArgs& r, std::span<const Tangent> t) {
    return {bind1(prim::reduce_sum(), {*t[0] * extreme_weights(r)}, r.attrs)};
  }
  static ops::Ts vjp(const RuleArgs& r, std::span<const Tangent> ct) {
    return {expand_back(*ct[0], r) * extreme_weights(r)};
  }
};
template <typename R>
struct RulesOf {
  using type = void;
};
template <>
struct RulesOf<SumR> {
  using type = SumRules;
};
template <>
struct RulesOf<ProdR> {
  using type = ProdRules;
};
template <>
struct RulesOf<MaxR> {
  using type = ExtremeRules;
};
template <>
struct RulesOf<MinR> {
  using type = ExtremeRules;
};

template <typename R>
const Primitive& define_reduce(std::string name, DTypeSet domain, std::string_view desc, Loc loc) {
  TypeRule rule = [name, domain, desc](ops::Types in, const Attrs& a) {
    ops::expect_dtype(name, in[0], domain, desc);
    const std::vector<int> axes = reduced_axes(name, a, in[0].shape.rank());
    if (R::needs_elements)
      for (int ax : axes)
        if (in[0].shape[ax] == 0)
          fail(name, "reduction over an empty axis: got ", in[0], " reducing axis ", ax,
               ", expected a non-empty axis (this reduction has no identity)");
    return std::vector<TensorType>{{in[0].dtype, reduced_shape(in[0].shape, axes)}};
  };
  Kernel kernel = [name](ops::Ins in, const Attrs& a) {
    const std::vector<int> axes = reduced_axes(name, a, in[0].rank());
    Tensor out = empty(reduced_shape(in[0].shape(), axes), in[0].dtype());
    if constexpr (std::is_same_v<R, SumR> || std::is_same_v<R, ProdR>) {  // complex values too
      if (is_complex(in[0].dtype())) {
        detail::visit_complex(in[0].dtype(),
                              [&]<typename T>() { reduce_kernel<R, T>(in[0], axes, out); });
        return std::vector<Tensor>{out};
      }
    }
    detail::visit_dtype(in[0].dtype(), [&]<typename T>() {
      constexpr bool logical = std::is_same_v<R, AndR> || std::is_same_v<R, OrR>;
      if constexpr (logical == std::is_same_v<T, bool>) reduce_kernel<R, T>(in[0], axes, out);
    });
    return std::vector<Tensor>{out};
  };
  Primitive prim{.name = std::move(name), .arity = 1, .type_rule = std::move(rule)};
  prim.lowering = lowering::Lowering{.reduction = R::lowered};
  prim.batch =
      ops::batch_leading([](const Attrs& a, const Tensor&) { return ops::shift_ints(a, "axes"); });
  using Rules = typename RulesOf<R>::type;
  if constexpr (std::is_void_v<Rules>) {
    prim.differentiable = false;
  } else {
    prim.jvp = Rules::jvp;
    prim.vjp = Rules::vjp;
  }
  return detail::register_builtin(std::move(prim), {{ops::cpu({domain}), std::move(kernel)}}, loc);
}

// argmax/argmin{axis}: first index of the extreme value (NaN counts as the extreme).
template <bool IsMax>
const Primitive& define_arg(std::string name, Loc loc) {
  TypeRule rule = [name](ops::Types in, const Attrs& a) {
    ops::expect_dtype(name, in[0], DTypeSet::numeric(), "a numeric dtype");
    const int ax = normalize_axis(name, a.get_int("axis"), in[0].shape.rank());
    if (in[0].shape[ax] == 0)
      fail(name, "empty axis: got ", in[0], " along axis ", ax, ", expected a non-empty axis");
    return std::vector<TensorType>{{int64, reduced_shape(in[0].shape, {ax})}};
  };
  Kernel kernel = [name](ops::Ins in, const Attrs& a) {
    const Tensor& x = in[0];
    const int ax = normalize_axis(name, a.get_int("axis"), x.rank());
    Tensor out = empty(reduced_shape(x.shape(), {ax}), int64);
    const ReduceLayout L = layout(x, {ax});
    int64_t* po = out.data<int64_t>();
    detail::visit_dtype(x.dtype(), [&]<typename T>() {
      if constexpr (!std::is_same_v<T, bool>) {
        using C = detail::compute_t<T>;
        const T* px = static_cast<const T*>(x.raw_data());
        const int64_t n = L.red_shape[0], st = L.red_strides[0];
        detail::parallel_for(
            L.kept_count,
            [&](int64_t b, int64_t e) {
              for (int64_t o = b; o < e; ++o) {
                const T* p = px + offset_of(o, L.kept_shape, L.kept_strides);
                int64_t best = 0;
                C bv = static_cast<C>(p[0]);
                for (int64_t k = 1; k < n && bv == bv; ++k) {
                  const C v = static_cast<C>(p[k * st]);
                  if (v != v || (IsMax ? v > bv : v < bv)) {
                    best = k;
                    bv = v;
                  }
                }
                po[o] = best;
              }
            },
            L.red_count);
      }
    });
    return std::vector<Tensor>{out};
  };
  return detail::register_builtin({.name = name,
                                   .arity = 1,
                                   .type_rule = std::move(rule),
                                   .differentiable = false,
                                   .batch = ops::batch_leading([](const Attrs& a, const Tensor&) {
                                     return ops::shift_int(a, "axis");
                                   })},
                                  {{ops::cpu({DTypeSet::numeric()}), std::move(kernel)}}, loc);
}

}  // namespace

// The tables: accessor (src/ops/primitives.h), reducer, IR name (and domain). A primitive's
// definition is its line here.
#define KILN_REDUCE(accessor, R, domain, desc)                                             \
  const Primitive& prim::accessor() {                                                      \
    static const Primitive& p = define_reduce<R>(#accessor, domain, desc, Loc::current()); \
    return p;                                                                              \
  }
KILN_REDUCE(reduce_sum, SumR, DTypeSet::numeric() | DTypeSet::complex(),
            "a numeric or complex dtype")
KILN_REDUCE(reduce_prod, ProdR, DTypeSet::numeric() | DTypeSet::complex(),
            "a numeric or complex dtype")
KILN_REDUCE(reduce_max, MaxR, DTypeSet::numeric(), "a numeric dtype")
KILN_REDUCE(reduce_min, MinR, DTypeSet::numeric(), "a numeric dtype")
KILN_REDUCE(reduce_and, AndR, bool_, "bool")
KILN_REDUCE(reduce_or, OrR, bool_, "bool")
#undef KILN_REDUCE
#define KILN_ARG(accessor, IsMax)                                             \
  const Primitive& prim::accessor() {                                         \
    static const Primitive& p = define_arg<IsMax>(#accessor, Loc::current()); \
    return p;                                                                 \
  }
KILN_ARG(argmax, true)
KILN_ARG(argmin, false)
#undef KILN_ARG

namespace {

std::vector<int> axes_of(std::string_view op, const Tensor& x, const Axes& axes) {
  return normalize_axes(op, axes, x.rank(), true);
}

// Reshapes a reduced result back to rank r with size-1 reduced axes.
Tensor keep_dims(const Tensor& y, const Tensor& x, const std::vector<int>& axes, Loc loc) {
  const detail::CallSite site(loc);
  std::vector<int64_t> dims = x.shape().dims();
  for (int a : axes) dims[static_cast<std::size_t>(a)] = 1;
  return reshape(y, Shape(dims), loc);
}

Tensor reduce(const Primitive& p, const Tensor& x, const Axes& axes, bool keepdims, Loc loc) {
  const detail::CallSite site(loc);
  const std::vector<int> ax = axes_of(p.name, x, axes);
  Tensor y = ax.empty() ? x : bind1(p, {x}, {{"axes", Axes(ax.begin(), ax.end())}}, loc);
  return keepdims ? keep_dims(y, x, ax, loc) : y;
}

int64_t count_over(const Tensor& x, const std::vector<int>& axes) {
  int64_t n = 1;
  for (int a : axes) n *= x.shape()[a];
  return n;
}

Tensor arg(const Primitive& p, const Tensor& x, std::optional<int64_t> axis, bool keepdims,
           Loc loc) {
  const detail::CallSite site(loc);
  Tensor v = x.dtype() == bool_ ? astype(x, int32, loc) : x;
  if (!axis) {
    Tensor flat = bind1(p, {reshape(v, Shape{v.numel()}, loc)}, {{"axis", int64_t{0}}}, loc);
    return keepdims
               ? reshape(flat, Shape(std::vector<int64_t>(static_cast<std::size_t>(x.rank()), 1)),
                         loc)
               : flat;
  }
  const int a = normalize_axis(p.name, *axis, x.rank());
  Tensor y = bind1(p, {v}, {{"axis", int64_t{a}}}, loc);
  return keepdims ? keep_dims(y, x, {a}, loc) : y;
}

// Sums of bool count trues (int64), like numpy.
Tensor numeric(const Tensor& x, Loc loc) { return x.dtype() == bool_ ? astype(x, int64, loc) : x; }

// Exponentials are taken of x - shift, shift = the max over the axes (kept). The shift cancels
// out of every result, so it is a stop_gradient: derivatives are exactly those of the formula
// (and cheaper). It is 0 where the max is infinite (all -inf, or an inf present), so that
// inf - inf never makes a NaN, and 0 over an empty axis, which has no max.
Tensor exp_shift(std::string_view op, const Tensor& xf, const Axes& axes, Loc loc) {
  const detail::CallSite site(loc);
  if (count_over(xf, axes_of(op, xf, axes)) == 0) return scalar_like(xf, 0.0);
  const Tensor m = stop_gradient(max(xf, axes, true, loc), loc);
  return where(abs(m, loc) == INFINITY, scalar_like(m, 0.0), m, loc);
}

}  // namespace

Tensor sum(const Tensor& x, const Axes& axes, bool keepdims, Loc loc) {
  const detail::CallSite site(loc);
  return reduce(prim::reduce_sum(), numeric(x, loc), axes, keepdims, loc);
}
Tensor prod(const Tensor& x, const Axes& axes, bool keepdims, Loc loc) {
  const detail::CallSite site(loc);
  return reduce(prim::reduce_prod(), numeric(x, loc), axes, keepdims, loc);
}
Tensor max(const Tensor& x, const Axes& axes, bool keepdims, Loc loc) {
  const detail::CallSite site(loc);
  return reduce(prim::reduce_max(), numeric(x, loc), axes, keepdims, loc);
}
Tensor min(const Tensor& x, const Axes& axes, bool keepdims, Loc loc) {
  const detail::CallSite site(loc);
  return reduce(prim::reduce_min(), numeric(x, loc), axes, keepdims, loc);
}
Tensor any(const Tensor& x, const Axes& axes, bool keepdims, Loc loc) {
  const detail::CallSite site(loc);
  return reduce(prim::reduce_or(), ops::cast_if_needed(x, bool_, loc), axes, keepdims, loc);
}
Tensor all(const Tensor& x, const Axes& axes, bool keepdims, Loc loc) {
  const detail::CallSite site(loc);
  return reduce(prim::reduce_and(), ops::cast_if_needed(x, bool_, loc), axes, keepdims, loc);
}
Tensor argmax(const Tensor& x, std::optional<int64_t> axis, bool keepdims, Loc loc) {
  const detail::CallSite site(loc);
  return arg(prim::argmax(), x, axis, keepdims, loc);
}
Tensor argmin(const Tensor& x, std::optional<int64_t> axis, bool keepdims, Loc loc) {
  const detail::CallSite site(loc);
  return arg(prim::argmin(), x, axis, keepdims, loc);
}

namespace {

// The float dtype mean, var, logsumexp, softmax and log_softmax (compositions of several
// primitives) work in: 16-bit floats widen to float32, so that the intermediate results are not
// rounded to 16 bits on the way and the result is rounded once, as a kernel's would be.
DType working_float(DType d) {
  const DType f = to_floating(d);
  return f == float16 || f == bfloat16 ? float32 : f;
}

}  // namespace

Tensor mean(const Tensor& x, const Axes& axes, bool keepdims, Loc loc) {
  const detail::CallSite site(loc);
  const Tensor xf = ops::cast_if_needed(x, working_float(x.dtype()), loc);
  const int64_t n = count_over(x, axes_of("mean", x, axes));
  const Tensor out =
      div(sum(xf, axes, keepdims, loc), scalar_like(xf, static_cast<double>(n)), loc);
  return ops::cast_if_needed(out, to_floating(x.dtype()), loc);
}

namespace {
// |c|^2 elementwise, real: c * conj(c)'s real part for complex values (numpy's var of them).
Tensor squared_magnitude(const Tensor& c, Loc loc) {
  return is_complex(c.dtype()) ? real(mul(c, conj(c, loc), loc), loc) : mul(c, c, loc);
}
}  // namespace

Tensor var(const Tensor& x, const Axes& axes, bool keepdims, int64_t ddof, Loc loc) {
  const detail::CallSite site(loc);
  const Tensor xf = ops::cast_if_needed(x, working_float(x.dtype()), loc);
  const int64_t n = count_over(x, axes_of("var", x, axes));
  const Tensor centered = sub(xf, mean(xf, axes, true, loc), loc);
  const Tensor ss = sum(squared_magnitude(centered, loc), axes, keepdims, loc);
  const Tensor out =
      div(ss, scalar_like(ss, static_cast<double>(std::max<int64_t>(n - ddof, 0))), loc);
  return ops::cast_if_needed(out, real_part_dtype(to_floating(x.dtype())), loc);
}

namespace {

// x with its NaNs replaced by `fill` (a select: the derivative there is 0).
Tensor nan_filled(const Tensor& x, double fill, Loc loc) {
  return where(isnan(x, loc), full({}, fill, x.dtype()), x, loc);
}
// The number of non-NaN elements over the axes, in x's dtype.
Tensor count_not_nan(const Tensor& x, const Axes& axes, bool keepdims, Loc loc) {
  return astype(sum(logical_not(isnan(x, loc), loc), axes, keepdims, loc), x.dtype(), loc);
}
// The reduction of x without its NaNs (replaced by `neutral`), NaN where all are NaN.
Tensor nan_extreme(Tensor (*reduce_fn)(const Tensor&, const Axes&, bool, Loc), const Tensor& x,
                   double neutral, const Axes& axes, bool keepdims, Loc loc) {
  if (!is_floating(x.dtype())) return reduce_fn(x, axes, keepdims, loc);
  const Tensor none = all(isnan(x, loc), axes, keepdims, loc);
  return where(none, full({}, NAN, x.dtype()),
               reduce_fn(nan_filled(x, neutral, loc), axes, keepdims, loc), loc);
}

}  // namespace

Tensor nansum(const Tensor& x, const Axes& axes, bool keepdims, Loc loc) {
  const detail::CallSite site(loc);
  return sum(is_inexact(x.dtype()) ? nan_filled(x, 0.0, loc) : x, axes, keepdims, loc);
}
Tensor nanprod(const Tensor& x, const Axes& axes, bool keepdims, Loc loc) {
  const detail::CallSite site(loc);
  return prod(is_inexact(x.dtype()) ? nan_filled(x, 1.0, loc) : x, axes, keepdims, loc);
}
Tensor nanmax(const Tensor& x, const Axes& axes, bool keepdims, Loc loc) {
  const detail::CallSite site(loc);
  return nan_extreme(&max, x, -INFINITY, axes, keepdims, loc);
}
Tensor nanmin(const Tensor& x, const Axes& axes, bool keepdims, Loc loc) {
  const detail::CallSite site(loc);
  return nan_extreme(&min, x, INFINITY, axes, keepdims, loc);
}
// The sum over the count of non-NaN elements: 0 / 0 = NaN where all are NaN, as numpy.
Tensor nanmean(const Tensor& x, const Axes& axes, bool keepdims, Loc loc) {
  const detail::CallSite site(loc);
  if (!is_inexact(x.dtype())) return mean(x, axes, keepdims, loc);
  const Tensor xf = ops::cast_if_needed(x, working_float(x.dtype()), loc);
  const Tensor out =
      div(nansum(xf, axes, keepdims, loc), count_not_nan(xf, axes, keepdims, loc), loc);
  return ops::cast_if_needed(out, x.dtype(), loc);
}
// The squared deviations from nanmean over max(count - ddof, 0), with NaNs left out.
Tensor nanvar(const Tensor& x, const Axes& axes, bool keepdims, int64_t ddof, Loc loc) {
  const detail::CallSite site(loc);
  if (!is_inexact(x.dtype())) return var(x, axes, keepdims, ddof, loc);
  const Tensor xf = ops::cast_if_needed(x, working_float(x.dtype()), loc);
  const Tensor centered = nan_filled(sub(xf, nanmean(xf, axes, true, loc), loc), 0.0, loc);
  const Tensor ss = sum(squared_magnitude(centered, loc), axes, keepdims, loc);
  const Tensor count = astype(count_not_nan(xf, axes, keepdims, loc), ss.dtype(), loc);
  const Tensor dof = maximum(sub(count, scalar_like(ss, static_cast<double>(ddof)), loc),
                             scalar_like(ss, 0.0), loc);
  return ops::cast_if_needed(div(ss, dof, loc), real_part_dtype(x.dtype()), loc);
}
Tensor nanstd(const Tensor& x, const Axes& axes, bool keepdims, int64_t ddof, Loc loc) {
  const detail::CallSite site(loc);
  return sqrt(nanvar(x, axes, keepdims, ddof, loc), loc);
}

// The empty sum is 0, so the log-sum-exp over an empty axis is -inf (as numpy's
// logaddexp.reduce and scipy's logsumexp), a constant: its tangent is 0, as the empty sum's,
// not log's 0 / 0.
Tensor logsumexp(const Tensor& x, const Axes& axes, bool keepdims, Loc loc) {
  const detail::CallSite site(loc);
  const Tensor xf = ops::cast_if_needed(x, working_float(x.dtype()), loc);
  const std::vector<int> ax = axes_of("logsumexp", x, axes);
  const Axes all_axes(ax.begin(), ax.end());
  const Tensor m = exp_shift("logsumexp", xf, all_axes, loc);
  const Tensor s = sum(exp(sub(xf, m, loc), loc), all_axes, true, loc);
  const Tensor out =
      count_over(xf, ax) == 0 ? full(s.shape(), -INFINITY, s.dtype()) : add(log(s, loc), m, loc);
  return ops::cast_if_needed(keepdims ? out : squeeze(out, all_axes, loc), to_floating(x.dtype()),
                             loc);
}

// (x - shift) - log(sum(exp(x - shift))), not x - logsumexp(x): the latter adds the shift
// back first and loses what it rounds away (log 2 next to 1e7 in float32 is 0.69 -> 1).
Tensor log_softmax(const Tensor& x, int64_t axis, Loc loc) {
  const detail::CallSite site(loc);
  const Tensor xf = ops::cast_if_needed(x, working_float(x.dtype()), loc);
  const Tensor shifted = sub(xf, exp_shift("log_softmax", xf, {axis}, loc), loc);
  const Tensor out = sub(shifted, log(sum(exp(shifted, loc), {axis}, true, loc), loc), loc);
  return ops::cast_if_needed(out, to_floating(x.dtype()), loc);
}

Tensor softmax(const Tensor& x, int64_t axis, Loc loc) {
  const detail::CallSite site(loc);
  const Tensor xf = ops::cast_if_needed(x, working_float(x.dtype()), loc);
  const Tensor e = exp(sub(xf, exp_shift("softmax", xf, {axis}, loc), loc), loc);
  return ops::cast_if_needed(div(e, sum(e, {axis}, true, loc), loc), to_floating(x.dtype()), loc);
}

}  // namespace kiln
