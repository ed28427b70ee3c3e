// Gather and scatter along one axis: gather (numpy.take), gather_along (take_along_axis) and
// their transposes scatter_add and scatter_add_along. Indices are int32 or int64; negative
// indices count from the end; out-of-range indices raise.
#include <cstring>

#include "detail/copy.h"
#include "detail/dtype_dispatch.h"
#include "detail/parallel.h"
#include "kiln/ops.h"
#include "ops/axis_lines.h"
#include "ops/primitives.h"
#include "ops/rules.h"

namespace kiln {
namespace {

const DTypeSet kIndex = DTypeSet(int32) | int64;
const DTypeSet kAddable = DTypeSet::numeric() | DTypeSet::complex();  // what scatter_add sums

void expect_index(std::string_view op, const TensorType& t) {
  ops::expect_dtype(op, t, kIndex, "integer indices (i32 or i64)");
}

// Indices as int64 with negatives resolved; throws naming the first bad index.
std::vector<int64_t> resolve(std::string_view op, const Tensor& idx, int64_t n) {
  std::vector<int64_t> v = idx.to_vector<int64_t>();
  for (int64_t& i : v) {
    if (i < -n || i >= n)
      fail(op, "index out of range: got ", i, " for an axis of size ", n, ", expected [", -n, ", ",
           n - 1, "]");
    if (i < 0) i += n;
  }
  return v;
}

Tensor value_or_zeros(const Tangent& t, const Tensor& like) {
  return t ? *t : ops::zeros_of(like.type());
}

// Batching: with unbatched indices the batch axis simply leads x (and the updates); with
// batched indices each example gathers on its own, one primitive call per example.
std::vector<Batched> batch_indexed(const BatchArgs& b) {
  const Primitive& p = b.primitive;
  if (b.dims[1]) return ops::batch_by_loop(b);
  std::vector<Tensor> ins{ops::batch_first(b.inputs[0], b.dims[0], b.size), b.inputs[1]};
  if (b.inputs.size() == 3) ins.push_back(ops::batch_first(b.inputs[2], b.dims[2], b.size));
  const int axis = normalize_axis(p.name, b.attrs.get_int("axis"), ins[0].rank() - 1);
  Attrs a = b.attrs;
  a.set("axis", int64_t{axis + 1});
  return {{bind1(p, ins, a), 0}};
}

// gather-like (x, idx) and scatter-like (x, idx, updates) pairs are each other's transposes.
// The transpose comes as its accessor, called only when a rule runs: calling it while this
// primitive registers would start registering each of the pair inside the other.
using Accessor = const Primitive& (*)();
Primitive with_gather_rules(Primitive p, Accessor scatter) {
  p.batch = p.name == "gather_along" ? BatchRule(ops::batch_by_loop) : BatchRule(batch_indexed);
  p.jvp = [](const RuleArgs& r, std::span<const Tangent> t) -> ops::Ts {
    return {bind1(r.primitive, {*t[0], r.inputs[1]}, r.attrs)};
  };
  p.vjp = [scatter](const RuleArgs& r, std::span<const Tangent> ct) -> ops::Ts {
    return {bind1(scatter(), {ops::zeros_of(r.inputs[0].type()), r.inputs[1], *ct[0]}, r.attrs),
            std::nullopt};
  };
  return p;
}
Primitive with_scatter_rules(Primitive p, Accessor gather) {
  p.batch =
      p.name == "scatter_add_along" ? BatchRule(ops::batch_by_loop) : BatchRule(batch_indexed);
  p.jvp = [](const RuleArgs& r, std::span<const Tangent> t) -> ops::Ts {
    return {
        bind1(r.primitive,
              {value_or_zeros(t[0], r.inputs[0]), r.inputs[1], value_or_zeros(t[2], r.inputs[2])},
              r.attrs)};
  };
  p.vjp = [gather](const RuleArgs& r, std::span<const Tangent> ct) -> ops::Ts {
    return {*ct[0], std::nullopt, bind1(gather(), {*ct[0], r.inputs[1]}, r.attrs)};
  };
  return p;
}

Shape take_shape(const Shape& x, int axis, const Shape& idx) {
  std::vector<int64_t> d(x.begin(), x.begin() + axis);
  d.insert(d.end(), idx.begin(), idx.end());
  d.insert(d.end(), x.begin() + axis + 1, x.end());
  return Shape(d);
}

// Moves element blocks of `inner` elements of dtype-size bytes.
void copy_block(void* dst, const void* src, int64_t inner, std::size_t elem) {
  std::memcpy(dst, src, static_cast<std::size_t>(inner) * elem);
}

}  // namespace

const Primitive& prim::gather() {
  static const Primitive& p = detail::register_builtin(
      with_gather_rules(
          Primitive{.name = "gather",
                    .arity = 2,
                    .type_rule =
                        [](ops::Types in, const Attrs& a) {
                          expect_index("gather", in[1]);
                          const int axis =
                              normalize_axis("gather", a.get_int("axis"), in[0].shape.rank());
                          return std::vector<TensorType>{
                              {in[0].dtype, take_shape(in[0].shape, axis, in[1].shape)}};
                        }},
          prim::scatter_add),
      {{ops::cpu({DTypeSet::all(), kIndex}), [](ops::Ins in, const Attrs& a) {
          const Tensor x = in[0].contiguous();
          const int axis = normalize_axis("gather", a.get_int("axis"), x.rank());
          const ops::AxisLines s = ops::axis_lines(x.shape(), axis);
          const std::vector<int64_t> idx = resolve("gather", in[1], s.n);
          const auto m = static_cast<int64_t>(idx.size());
          Tensor out = empty(take_shape(x.shape(), axis, in[1].shape()), x.dtype());
          const std::size_t elem = dtype_size(x.dtype());
          const char* px = static_cast<const char*>(x.raw_data());
          char* po = static_cast<char*>(out.raw_data());
          const auto blk = static_cast<int64_t>(elem) * s.inner;
          detail::parallel_for(
              s.outer * m,
              [&](int64_t b, int64_t e) {
                for (int64_t t = b; t < e; ++t) {
                  const int64_t o = t / m, j = t % m;
                  copy_block(po + t * blk, px + (o * s.n + idx[static_cast<std::size_t>(j)]) * blk,
                             s.inner, elem);
                }
              },
              s.inner);
          return std::vector<Tensor>{out};
        }}});
  return p;
}

namespace {

// Accumulates updates [outer, m, inner] into a copy of x at index_of(o, j, k) along axis (serial
// per output row so that repeated indices add up deterministically).
template <typename IndexOf>
Tensor scatter_into(const Tensor& x0, const Tensor& upd0, int axis, int64_t m, IndexOf index_of) {
  Tensor out = empty(x0.type());
  detail::copy_cast(x0, out);
  const Tensor upd = upd0.contiguous();
  const ops::AxisLines s = ops::axis_lines(x0.shape(), axis);
  detail::visit_any_dtype(x0.dtype(), [&]<typename T>() {
    if constexpr (!std::is_same_v<T, bool>) {
      T* po = out.data<T>();
      const T* pu = upd.data<const T>();
      detail::parallel_for(
          s.outer,
          [&](int64_t b, int64_t e) {
            for (int64_t o = b; o < e; ++o)
              for (int64_t j = 0; j < m; ++j)
                for (int64_t k = 0; k < s.inner; ++k) {
                  const int64_t src = (o * m + j) * s.inner + k;
                  T& dst = po[(o * s.n + index_of(o, j, k)) * s.inner + k];
                  dst = static_cast<T>(static_cast<detail::compute_t<T>>(dst) +
                                       static_cast<detail::compute_t<T>>(pu[src]));
                }
          },
          m * s.inner);
    }
  });
  return out;
}

}  // namespace

const Primitive& prim::scatter_add() {
  static const Primitive& p = detail::register_builtin(
      with_scatter_rules(
          Primitive{
              .name = "scatter_add",
              .arity = 3,
              .type_rule =
                  [](ops::Types in, const Attrs& a) {
                    expect_index("scatter_add", in[1]);
                    ops::expect_dtype("scatter_add", in[0], kAddable, "a numeric or complex dtype");
                    const int axis =
                        normalize_axis("scatter_add", a.get_int("axis"), in[0].shape.rank());
                    const TensorType want{in[0].dtype, take_shape(in[0].shape, axis, in[1].shape)};
                    if (in[2] != want)
                      fail("scatter_add", "updates do not match: got ", ops::types_str(in),
                           ", expected updates of type ", want,
                           " (x's shape with the indices' shape at axis ", axis, ")");
                    return std::vector<TensorType>{in[0]};
                  }},
          prim::gather),
      {{ops::cpu({kAddable, kIndex, kAddable}), [](ops::Ins in, const Attrs& a) {
          const int axis = normalize_axis("scatter_add", a.get_int("axis"), in[0].rank());
          const ops::AxisLines s = ops::axis_lines(in[0].shape(), axis);
          const std::vector<int64_t> idx = resolve("scatter_add", in[1], s.n);
          const auto m = static_cast<int64_t>(idx.size());
          return std::vector<Tensor>{scatter_into(
              in[0], in[2], axis, m,
              [&](int64_t, int64_t j, int64_t) { return idx[static_cast<std::size_t>(j)]; })};
        }}});
  return p;
}

namespace {

// take_along_axis: idx has x's rank and x's sizes except along axis.
void expect_along(std::string_view op, const TensorType& x, const TensorType& idx, int axis) {
  bool ok = idx.shape.rank() == x.shape.rank();
  for (int i = 0; ok && i < x.shape.rank(); ++i) ok = i == axis || idx.shape[i] == x.shape[i];
  if (!ok)
    fail(op, "indices do not match: got x ", x, " and indices ", idx,
         ", expected indices of x's rank with x's sizes except along axis ", axis);
}

}  // namespace

const Primitive& prim::gather_along() {
  static const Primitive& p = detail::register_builtin(
      with_gather_rules(Primitive{.name = "gather_along",
                                  .arity = 2,
                                  .type_rule =
                                      [](ops::Types in, const Attrs& a) {
                                        expect_index("gather_along", in[1]);
                                        const int axis = normalize_axis(
                                            "gather_along", a.get_int("axis"), in[0].shape.rank());
                                        expect_along("gather_along", in[0], in[1], axis);
                                        return std::vector<TensorType>{{in[0].dtype, in[1].shape}};
                                      }},
                        prim::scatter_add_along),
      {{ops::cpu({DTypeSet::all(), kIndex}), [](ops::Ins in, const Attrs& a) {
          const Tensor x = in[0].contiguous();
          const int axis = normalize_axis("gather_along", a.get_int("axis"), x.rank());
          const ops::AxisLines s = ops::axis_lines(x.shape(), axis);
          const int64_t m = in[1].shape()[axis];
          const std::vector<int64_t> idx = resolve("gather_along", in[1], s.n);
          Tensor out = empty(in[1].shape(), x.dtype());
          detail::visit_any_dtype(x.dtype(), [&]<typename T>() {
            const T* px = x.data<const T>();
            T* po = out.data<T>();
            detail::parallel_for(s.outer * m * s.inner, [&](int64_t b, int64_t e) {
              for (int64_t t = b; t < e; ++t) {
                const int64_t o = t / (m * s.inner), k = t % s.inner;
                po[t] = px[(o * s.n + idx[static_cast<std::size_t>(t)]) * s.inner + k];
              }
            });
          });
          return std::vector<Tensor>{out};
        }}});
  return p;
}

const Primitive& prim::scatter_add_along() {
  static const Primitive& p = detail::register_builtin(
      with_scatter_rules(
          Primitive{.name = "scatter_add_along",
                    .arity = 3,
                    .type_rule =
                        [](ops::Types in, const Attrs& a) {
                          expect_index("scatter_add_along", in[1]);
                          ops::expect_dtype("scatter_add_along", in[0], kAddable,
                                            "a numeric or complex dtype");
                          const int axis = normalize_axis("scatter_add_along", a.get_int("axis"),
                                                          in[0].shape.rank());
                          expect_along("scatter_add_along", in[0], in[1], axis);
                          if (in[2] != TensorType{in[0].dtype, in[1].shape})
                            fail("scatter_add_along", "updates do not match: got ",
                                 ops::types_str(in),
                                 ", expected updates of x's dtype and the indices' shape");
                          return std::vector<TensorType>{in[0]};
                        }},
          prim::gather_along),
      {{ops::cpu({kAddable, kIndex, kAddable}), [](ops::Ins in, const Attrs& a) {
          const int axis = normalize_axis("scatter_add_along", a.get_int("axis"), in[0].rank());
          const ops::AxisLines s = ops::axis_lines(in[0].shape(), axis);
          const int64_t m = in[1].shape()[axis];
          const std::vector<int64_t> idx = resolve("scatter_add_along", in[1], s.n);
          return std::vector<Tensor>{
              scatter_into(in[0], in[2], axis, m, [&](int64_t o, int64_t j, int64_t k) {
                return idx[static_cast<std::size_t>((o * m + j) * s.inner + k)];
              })};
        }}});
  return p;
}

namespace {

Tensor as_index(const Tensor& idx, Loc loc) {
  const detail::CallSite site(loc);
  if (idx.dtype() == int32 || idx.dtype() == int64) return idx;
  if (is_integral(idx.dtype())) return astype(idx, int64, loc);
  fail("take", "non-integer indices: got ", idx.type(), ", expected an integer dtype");
}

}  // namespace

Tensor take(const Tensor& x, const Tensor& indices, int64_t axis, Loc loc) {
  const detail::CallSite site(loc);
  return bind1(prim::gather(), {x, as_index(indices, loc)}, {{"axis", axis}}, loc);
}

Tensor take_along_axis(const Tensor& x, const Tensor& indices, int64_t axis, Loc loc) {
  const detail::CallSite site(loc);
  const int a = normalize_axis("take_along_axis", axis, x.rank());
  if (indices.rank() != x.rank())
    fail("take_along_axis", "rank mismatch: got x ", x.type(), " and indices ", indices.type(),
         ", expected indices of the same rank");
  // Broadcast x and the indices against each other on every axis but `axis`, like numpy.
  std::vector<int64_t> xs = x.shape().dims(), is = indices.shape().dims();
  for (int i = 0; i < x.rank(); ++i) {
    if (i == a) continue;
    const auto u = static_cast<std::size_t>(i);
    const int64_t d = broadcast_shapes("take_along_axis", Shape{xs[u]}, Shape{is[u]})[0];
    xs[u] = is[u] = d;
  }
  return bind1(
      prim::gather_along(),
      {broadcast_to(x, Shape(xs), loc), broadcast_to(as_index(indices, loc), Shape(is), loc)},
      {{"axis", int64_t{a}}}, loc);
}

Tensor scatter_add(const Tensor& x, const Tensor& indices, const Tensor& updates, int64_t axis,
                   Loc loc) {
  const detail::CallSite site(loc);
  return bind1(prim::scatter_add(),
               {x, as_index(indices, loc), ops::cast_if_needed(updates, x.dtype(), loc)},
               {{"axis", axis}}, loc);
}

Tensor one_hot(const Tensor& labels, int64_t num_classes, DType dtype, Loc loc) {
  const detail::CallSite site(loc);
  if (!is_integral(labels.dtype()))
    fail("one_hot", "non-integer labels: got ", labels.type(), ", expected an integer dtype");
  if (num_classes < 0)
    fail("one_hot", "negative class count: got ", num_classes, ", expected >= 0");
  std::vector<int64_t> out = labels.shape().dims();
  out.push_back(num_classes);
  Shape(std::move(out)).check("one_hot");
  // Classes in int64: in the labels' dtype they would saturate (u8 labels, 300 classes).
  const Tensor classes = arange(num_classes, int64);
  return astype(equal(expand_dims(labels, -1, loc), classes, loc), dtype, loc);
}

}  // namespace kiln
