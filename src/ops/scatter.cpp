// The scatter variants besides scatter_add (src/ops/gather.cpp): scatter_set, scatter_mul,
// scatter_max and scatter_min, in numpy.take's index layout along one axis: updates have x's shape
// with the indices' shape at `axis`, and updates[..., j, ...] goes to x[..., indices[j], ...].
// Indices are int32 or int64, negative ones count from the end, out-of-range ones raise (as for
// take). Repeated indices: set keeps the last update in index order; mul/max/min combine them all.
//
// Derivatives: scatter_set is linear in (x, updates) jointly; only the update that wins a
// position gets its cotangent. scatter_mul's derivative for an update is the product of
// everything else at its position, computed without dividing by zero (zeros are counted).
// scatter_max/min pass the tangent of whichever of x and the updates attain the result, averaged
// over ties (as JAX's scatter_max does).
#include <cmath>
#include <functional>
#include <limits>

#include "detail/copy.h"
#include "detail/dtype_dispatch.h"
#include "detail/wrapping.h"
#include "kiln/indexing.h"
#include "ops/primitives.h"
#include "ops/rules.h"

namespace kiln {
namespace {

const DTypeSet kIndex = DTypeSet(int32) | int64;

enum class Combine { set, mul, max, min };

// updates' type for x, indices and axis: x's shape with the indices' shape at axis.
Shape updates_shape(const Shape& x, int axis, const Shape& idx) {
  std::vector<int64_t> d(x.begin(), x.begin() + axis);
  d.insert(d.end(), idx.begin(), idx.end());
  d.insert(d.end(), x.begin() + axis + 1, x.end());
  return Shape(d);
}

std::vector<TensorType> scatter_rule(std::string_view op, ops::Types in, const Attrs& a) {
  ops::expect_dtype(op, in[1], kIndex, "integer indices (i32 or i64)");
  ops::expect_dtype(op, in[0], DTypeSet::numeric(), "a numeric dtype");
  const int axis = normalize_axis(op, a.get_int("axis"), in[0].shape.rank());
  const TensorType want{in[0].dtype, updates_shape(in[0].shape, axis, in[1].shape)};
  if (in[2] != want)
    fail(op, "updates do not match: got ", ops::types_str(in), ", expected updates of type ", want,
         " (x's shape with the indices' shape at axis ", axis, ")");
  return {in[0]};
}

// Combines the updates into `out`, which holds x's values (contiguous, x's type): the kernels
// write into a copy of x, compiled code that owns x into x itself (Primitive::in_place).
template <Combine C>
void scatter_into(std::string_view op, ops::Ins in, const Tensor& out, const Attrs& a) {
  const int axis = normalize_axis(op, a.get_int("axis"), in[0].rank());
  const Shape& s = in[0].shape();
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < axis; ++i) outer *= s[i];
  for (int i = axis + 1; i < s.rank(); ++i) inner *= s[i];
  const int64_t n = s[axis];
  std::vector<int64_t> idx = in[1].to_vector<int64_t>();
  for (int64_t& i : idx) {
    if (i < -n || i >= n)
      fail(op, "index out of range: got ", i, " for an axis of size ", n, ", expected [", -n, ", ",
           n - 1, "]");
    if (i < 0) i += n;
  }
  const auto m = static_cast<int64_t>(idx.size());
  const Tensor upd = in[2].contiguous();
  detail::visit_dtype(out.dtype(), [&]<typename T>() {
    if constexpr (!std::is_same_v<T, bool>) {
      using V = detail::compute_t<T>;
      T* po = out.data<T>();
      const T* pu = upd.data<const T>();
      // Serial in j for each o, so that "last wins" and the order of combining are defined.
      for (int64_t o = 0; o < outer; ++o)
        for (int64_t j = 0; j < m; ++j)
          for (int64_t k = 0; k < inner; ++k) {
            T& dst = po[(o * n + idx[static_cast<std::size_t>(j)]) * inner + k];
            const T u = pu[(o * m + j) * inner + k];
            const V cur = static_cast<V>(dst), v = static_cast<V>(u);
            if constexpr (C == Combine::set)
              dst = u;
            else if constexpr (C == Combine::mul && std::is_integral_v<T>)
              dst = detail::wrapping(dst, u, std::multiplies<>{});  // as numpy, not UB
            else if constexpr (C == Combine::mul)
              dst = static_cast<T>(cur * v);
            else if constexpr (C == Combine::max)
              dst = (v != v || v > cur) ? u : dst;  // NaN propagates
            else
              dst = (v != v || v < cur) ? u : dst;
          }
    }
  });
}

template <Combine C>
Tensor scatter_kernel(std::string_view op, ops::Ins in, const Attrs& a) {
  Tensor out = empty(in[0].type());
  detail::copy_cast(in[0], out);
  scatter_into<C>(op, in, out, a);
  return out;
}

// With unbatched indices the batch axis leads x and the updates and the axis moves by one;
// with batched indices each example scatters on its own.
std::vector<Batched> batch_scatter(const BatchArgs& b) {
  if (b.dims[1]) return ops::batch_by_loop(b);
  const Tensor x = ops::batch_first(b.inputs[0], b.dims[0], b.size);
  const Tensor u = ops::batch_first(b.inputs[2], b.dims[2], b.size);
  const int axis = normalize_axis(b.primitive.name, b.attrs.get_int("axis"), x.rank() - 1);
  Attrs a = b.attrs;
  a.set("axis", int64_t{axis + 1});
  return {{bind1(b.primitive, {x, b.inputs[1], u}, a), 0}};
}

Tensor or_zeros(const Tangent& t, const Tensor& like) {
  return t ? *t : ops::zeros_of(like.type());
}

// The indices' mask reshaped to broadcast against the updates (size-1 axes around it).
Tensor spread(const Tensor& mask, const Shape& x, int axis) {
  std::vector<int64_t> d(static_cast<std::size_t>(axis), 1);
  d.insert(d.end(), mask.shape().begin(), mask.shape().end());
  d.insert(d.end(), static_cast<std::size_t>(x.rank() - axis - 1), 1);
  return reshape(mask, Shape(d));
}

// Where update j is the last one written to its position (the one scatter_set keeps).
Tensor winners(const Tensor& idx, int64_t n) {
  const Tensor order = reshape(arange(idx.numel(), int64), idx.shape());
  const Tensor last =
      bind1(prim::scatter_set(), {full(Shape{n}, -1.0, int64), idx, order}, {{"axis", int64_t{0}}});
  return equal(take(last, idx), order);
}

Primitive with_set_rules(Primitive p) {
  p.batch = batch_scatter;
  p.jvp = [](const RuleArgs& r, std::span<const Tangent> t) -> ops::Ts {
    return {bind1(r.primitive,
                  {or_zeros(t[0], r.inputs[0]), r.inputs[1], or_zeros(t[2], r.inputs[2])},
                  r.attrs)};
  };
  p.vjp = [](const RuleArgs& r, std::span<const Tangent> ct) -> ops::Ts {
    const Tensor& x = r.inputs[0];
    const int axis = normalize_axis("scatter_set", r.attrs.get_int("axis"), x.rank());
    const Tensor kept = spread(winners(r.inputs[1], x.shape()[axis]), x.shape(), axis);
    const Tensor g = bind1(prim::gather(), {*ct[0], r.inputs[1]}, r.attrs);
    return {bind1(r.primitive, {*ct[0], r.inputs[1], ops::zeros_of(r.inputs[2].type())}, r.attrs),
            std::nullopt, where(kept, g, zeros({}, g.dtype()))};
  };
  return p;
}

// Update j's cofactor: the product of the other updates at its position, written so that its
// own derivatives are right where updates are zero (the Hessian of a product of zeros is not).
// With Z the updates at the position that are zero and m their number:
//   u_j != 0: (product of the non-zero ones / u_j) * (product of Z, through scatter_mul, whose
//             rules differentiate it again);
//   u_j == 0: (product of the non-zero ones) * (product of Z without u_j): 1 when m = 1, the
//             other zero update (the sum of Z minus u_j) when m = 2, else 0 — exact to every
//             order for m <= 2; for m >= 3, derivatives of order m and above read 0.
Tensor cofactor(const RuleArgs& r) {
  const Tensor& u = r.inputs[2];
  const Tensor ones = ones_like(r.inputs[0]);
  const Tensor zero = zeros({}, u.dtype()), one = scalar_like(u, 1.0), two = scalar_like(u, 2.0);
  const Tensor is_zero = equal(u, zero);
  const Tensor nonzero_u = where(is_zero, one, u);
  auto at_updates = [&](const Primitive& p, const Tensor& v, const Tensor& init) {
    return bind1(prim::gather(), {bind1(p, {init, r.inputs[1], v}, r.attrs), r.inputs[1]}, r.attrs);
  };
  const Tensor none = ops::zeros_of(ones.type());
  const Tensor nonzero_product = at_updates(prim::scatter_mul(), nonzero_u, ones);
  const Tensor zero_product = at_updates(prim::scatter_mul(), where(is_zero, u, one), ones);
  const Tensor zero_sum = at_updates(prim::scatter_add(), where(is_zero, u, zero), none);
  const Tensor zero_count = at_updates(prim::scatter_add(), astype(is_zero, u.dtype()), none);
  const Tensor other_zeros =
      where(equal(zero_count, one), one, where(equal(zero_count, two), zero_sum - u, zero));
  return where(is_zero, nonzero_product * other_zeros, nonzero_product / nonzero_u * zero_product);
}

Primitive with_product_rules(Primitive p) {
  p.batch = batch_scatter;
  // out = x * P with P the product of the updates at each position: linear in x given P, and
  // in each update given its cofactor.
  auto product = [](const RuleArgs& r) {
    return bind1(prim::scatter_mul(), {ones_like(r.inputs[0]), r.inputs[1], r.inputs[2]}, r.attrs);
  };
  p.jvp = [product](const RuleArgs& r, std::span<const Tangent> t) -> ops::Ts {
    const Tensor& x = r.inputs[0];
    Tensor out = t[0] ? *t[0] * product(r) : ops::zeros_of(x.type());
    if (t[2]) {
      const Tensor gx = bind1(prim::gather(), {x, r.inputs[1]}, r.attrs);
      out = out + bind1(prim::scatter_add(),
                        {ops::zeros_of(x.type()), r.inputs[1], *t[2] * cofactor(r) * gx}, r.attrs);
    }
    return {out};
  };
  p.vjp = [product](const RuleArgs& r, std::span<const Tangent> ct) -> ops::Ts {
    const Tensor g = bind1(prim::gather(), {*ct[0] * r.inputs[0], r.inputs[1]}, r.attrs);
    return {*ct[0] * product(r), std::nullopt, g * cofactor(r)};
  };
  return p;
}

// Which of x and the updates attain the result, and how many per position (ties share).
struct Attained {
  Tensor by_x, by_u, count;
};
Attained attained(const RuleArgs& r) {
  const Tensor& x = r.inputs[0];
  const Tensor& out = r.outputs[0];
  const Tensor by_x = equal(x, out);
  const Tensor by_u = equal(r.inputs[2], bind1(prim::gather(), {out, r.inputs[1]}, r.attrs));
  const Tensor count =
      astype(by_x, x.dtype()) +
      bind1(prim::scatter_add(), {ops::zeros_of(x.type()), r.inputs[1], astype(by_u, x.dtype())},
            r.attrs);
  return {by_x, by_u, count};
}

Primitive with_extremal_rules(Primitive p) {
  p.batch = batch_scatter;
  p.jvp = [](const RuleArgs& r, std::span<const Tangent> t) -> ops::Ts {
    const Attained a = attained(r);
    const Tensor zero = zeros({}, r.inputs[0].dtype());
    const Tensor from_x = where(a.by_x, or_zeros(t[0], r.inputs[0]), zero);
    const Tensor from_u = bind1(prim::scatter_add(),
                                {ops::zeros_of(r.inputs[0].type()), r.inputs[1],
                                 where(a.by_u, or_zeros(t[2], r.inputs[2]), zero)},
                                r.attrs);
    return {(from_x + from_u) / a.count};
  };
  p.vjp = [](const RuleArgs& r, std::span<const Tangent> ct) -> ops::Ts {
    const Attained a = attained(r);
    const Tensor zero = zeros({}, r.inputs[0].dtype());
    const Tensor g = *ct[0] / a.count;
    return {where(a.by_x, g, zero), std::nullopt,
            where(a.by_u, bind1(prim::gather(), {g, r.inputs[1]}, r.attrs), zero)};
  };
  return p;
}

template <Combine C>
const Primitive& define_scatter(const char* name, Primitive (*rules)(Primitive), Loc loc) {
  const std::string op = name;
  Primitive p =
      rules(Primitive{.name = op, .arity = 3, .type_rule = [op](ops::Types in, const Attrs& a) {
                        return scatter_rule(op, in, a);
                      }});
  p.in_place = Primitive::InPlace{.input = 0,
                                  .write = [op](ops::Ins in, const Tensor& target, const Attrs& a) {
                                    scatter_into<C>(op, in, target, a);
                                  }};
  return detail::register_builtin(std::move(p),
                                  {{ops::cpu({DTypeSet::numeric(), kIndex, DTypeSet::numeric()}),
                                    [op](ops::Ins in, const Attrs& a) {
                                      return std::vector<Tensor>{scatter_kernel<C>(op, in, a)};
                                    }}},
                                  loc);
}

}  // namespace

const Primitive& prim::scatter_set() {
  static const Primitive& p =
      define_scatter<Combine::set>("scatter_set", with_set_rules, Loc::current());
  return p;
}
const Primitive& prim::scatter_mul() {
  static const Primitive& p =
      define_scatter<Combine::mul>("scatter_mul", with_product_rules, Loc::current());
  return p;
}
const Primitive& prim::scatter_max() {
  static const Primitive& p =
      define_scatter<Combine::max>("scatter_max", with_extremal_rules, Loc::current());
  return p;
}
const Primitive& prim::scatter_min() {
  static const Primitive& p =
      define_scatter<Combine::min>("scatter_min", with_extremal_rules, Loc::current());
  return p;
}

Tensor scatter(const Tensor& x, const Tensor& indices, const Tensor& updates, int64_t axis,
               ScatterMode mode, Loc loc) {
  const detail::CallSite site(loc);
  if (!is_integral(indices.dtype()) || indices.dtype() == bool_)
    fail("scatter", "non-integer indices: got ", indices.type(), ", expected an integer dtype");
  const Tensor idx = indices.dtype() == int32 ? indices : ops::cast_if_needed(indices, int64, loc);
  const int ax = normalize_axis("scatter", axis, x.rank());
  const Tensor u = broadcast_to(ops::cast_if_needed(updates, x.dtype(), loc),
                                updates_shape(x.shape(), ax, idx.shape()), loc);
  const Attrs a{{"axis", axis}};
  switch (mode) {
    case ScatterMode::set:
      return bind1(prim::scatter_set(), {x, idx, u}, a, loc);
    case ScatterMode::add:
      return scatter_add(x, idx, u, axis, loc);
    case ScatterMode::mul:
      return bind1(prim::scatter_mul(), {x, idx, u}, a, loc);
    case ScatterMode::max:
      return bind1(prim::scatter_max(), {x, idx, u}, a, loc);
    case ScatterMode::min:
      return bind1(prim::scatter_min(), {x, idx, u}, a, loc);
  }
  fail("scatter", "unknown mode");
}

Tensor IndexedUpdate::get(Loc loc) const { return take(x, indices, axis, loc); }
Tensor IndexedUpdate::set(const Tensor& v, Loc loc) const {
  return scatter(x, indices, v, axis, ScatterMode::set, loc);
}
Tensor IndexedUpdate::add(const Tensor& v, Loc loc) const {
  return scatter(x, indices, v, axis, ScatterMode::add, loc);
}
Tensor IndexedUpdate::mul(const Tensor& v, Loc loc) const {
  return scatter(x, indices, v, axis, ScatterMode::mul, loc);
}
Tensor IndexedUpdate::max(const Tensor& v, Loc loc) const {
  return scatter(x, indices, v, axis, ScatterMode::max, loc);
}
Tensor IndexedUpdate::min(const Tensor& v, Loc loc) const {
  return scatter(x, indices, v, axis, ScatterMode::min, loc);
}

}  // namespace kiln
