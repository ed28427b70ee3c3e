// Shape primitives. reshape (of contiguous data), transpose, broadcast_to, slice and flip are
// views that share the input's storage; concatenate and pad copy.
#include <algorithm>
#include <cstring>
#include <numeric>

#include "detail/checked.h"
#include "detail/copy.h"
#include "detail/strided.h"
#include "ir/trace.h"
#include "kiln/ops.h"
#include "ops/primitives.h"
#include "ops/rules.h"

namespace kiln {
namespace {

Tensor make_view(const Tensor& base, Shape shape, std::vector<int64_t> strides, int64_t offset) {
  auto impl = std::make_shared<TensorImpl>();
  impl->type = TensorType{base.dtype(), std::move(shape)};
  impl->storage = base.storage();
  impl->strides = std::move(strides);
  impl->offset = offset;
  return Tensor(std::move(impl));
}

std::vector<Tensor> one(Tensor t) { return std::vector<Tensor>{std::move(t)}; }

// Whether an op on x runs now, on x's data: no trace is recording and x is concrete. View ops
// then make their view directly (the helpers their kernels use), skipping bind's type rule,
// attribute map and kernel lookup, which cost several times the view itself: x[0] from
// Python is an index, a slice and a squeeze (docs/PERFORMANCE.md, "Python: indexing").
// A user kernel registered over the primitive's (register_kernel) keeps it on bind.
bool eager(const Primitive& p, const Tensor& x) {
  return !detail::trace_active() && !x.is_traced() && detail::builtin_kernels_only(p);
}

// reshape's view of x as shape s (s.numel() == x.numel()), when the data allows one: x
// contiguous, or s only inserts or removes size-1 axes (squeeze, expand_dims, index), which
// keeps the other axes' strides. nullopt: reshape copies.
std::optional<Tensor> reshape_view(const Tensor& x, const Shape& s) {
  if (x.is_contiguous()) return make_view(x, s, contiguous_strides(s), x.offset());
  std::vector<int64_t> xd, xst, sd;
  for (int i = 0; i < x.rank(); ++i)
    if (x.shape()[i] != 1) {
      xd.push_back(x.shape()[i]);
      xst.push_back(x.strides()[static_cast<std::size_t>(i)]);
    }
  for (int64_t d : s)
    if (d != 1) sd.push_back(d);
  if (xd != sd) return std::nullopt;
  std::vector<int64_t> st(static_cast<std::size_t>(s.rank()));
  int64_t inner = 1;  // stride a size-1 axis gets: as if contiguous from here in
  std::size_t k = xst.size();
  for (int i = s.rank() - 1; i >= 0; --i) {
    const auto u = static_cast<std::size_t>(i);
    if (s[i] != 1) {
      st[u] = xst[--k];
      inner = st[u] * s[i];
    } else {
      st[u] = inner;
    }
  }
  return make_view(x, s, std::move(st), x.offset());
}

// Sums a gradient of `shape` down to the shape it was broadcast from (numpy rules).
Tensor unbroadcast(const Tensor& g, const Shape& to) {
  const int lead = g.rank() - to.rank();
  Axes axes;
  for (int i = 0; i < g.rank(); ++i)
    if (i < lead || (to[i - lead] == 1 && g.shape()[i] != 1)) axes.push_back(i);
  return reshape(axes.empty() ? g : sum(g, axes), to);
}

}  // namespace

// ---- reshape{shape} --------------------------------------------------------------

const Primitive& prim::reshape() {
  static const Primitive& p = detail::register_builtin(
      {.name = "reshape",
       .arity = 1,
       .type_rule =
           [](ops::Types in, const Attrs& a) {
             Shape s(a.get_ints("shape"));
             s.check("reshape");
             if (s.numel() != in[0].shape.numel())
               fail("reshape", "element count differs: got ", in[0], " (", in[0].shape.numel(),
                    " elements) to shape ", s, " (", s.numel(),
                    " elements), expected the same number of elements");
             return std::vector<TensorType>{{in[0].dtype, s}};
           },
       .jvp = ops::linear_jvp,
       .vjp = [](const RuleArgs& r, std::span<const Tangent> ct) -> ops::Ts {
         return {reshape(*ct[0], r.inputs[0].shape())};
       },
       .batch = ops::batch_leading([](const Attrs& a, const Tensor& x) {
         return ops::prepend_int(a, "shape", x.shape()[0]);
       }),
       .algebra = {.reshapes = true, .rearranges = true},
       .lowering = lowering::Lowering{.index_map = lowering::IndexMap::reshape}},
      {{ops::cpu({DTypeSet::all()}), [](ops::Ins in, const Attrs& a) {
          Shape s(a.get_ints("shape"));
          if (std::optional<Tensor> view = reshape_view(in[0], s)) return one(std::move(*view));
          const Tensor x = in[0].contiguous();
          return one(make_view(x, s, contiguous_strides(s), x.offset()));
        }}});
  return p;
}

// ---- transpose{perm} -------------------------------------------------------------

const Primitive& prim::transpose() {
  static const Primitive& p = detail::register_builtin(
      {.name = "transpose",
       .arity = 1,
       .type_rule =
           [](ops::Types in, const Attrs& a) {
             const auto& perm = a.get_ints("perm");
             const int r = in[0].shape.rank();
             std::vector<int64_t> sorted = perm;
             std::sort(sorted.begin(), sorted.end());
             std::vector<int64_t> iota(static_cast<std::size_t>(r));
             std::iota(iota.begin(), iota.end(), 0);
             if (sorted != iota)
               fail("transpose", "invalid permutation: got ", Shape(perm), " for ", in[0],
                    ", expected a permutation of 0..", r - 1);
             Shape out;
             for (int64_t p : perm) out.dims().push_back(in[0].shape[static_cast<int>(p)]);
             return std::vector<TensorType>{{in[0].dtype, out}};
           },
       .jvp = ops::linear_jvp,
       .vjp = [](const RuleArgs& r, std::span<const Tangent> ct) -> ops::Ts {
         const auto& perm = r.attrs.get_ints("perm");
         Axes inverse(perm.size());
         for (std::size_t i = 0; i < perm.size(); ++i)
           inverse[static_cast<std::size_t>(perm[i])] = static_cast<int64_t>(i);
         return {transpose(*ct[0], inverse)};
       },
       .batch = ops::batch_leading([](const Attrs& a, const Tensor&) {
         return ops::prepend_int(ops::shift_ints(a, "perm"), "perm", 0);
       }),
       .algebra = {.permutation_attr = "perm", .rearranges = true},
       .lowering = lowering::Lowering{.index_map = lowering::IndexMap::transpose}},
      {{ops::cpu({DTypeSet::all()}), [](ops::Ins in, const Attrs& a) {
          const Tensor& x = in[0];
          Shape s;
          std::vector<int64_t> st;
          for (int64_t p : a.get_ints("perm")) {
            s.dims().push_back(x.shape()[static_cast<int>(p)]);
            st.push_back(x.strides()[static_cast<std::size_t>(p)]);
          }
          return one(make_view(x, s, st, x.offset()));
        }}});
  return p;
}

// ---- broadcast_to{shape}: numpy broadcasting of x to a larger shape ---------------

const Primitive& prim::broadcast_to() {
  static const Primitive& p = detail::register_builtin(
      {.name = "broadcast_to",
       .arity = 1,
       .type_rule =
           [](ops::Types in, const Attrs& a) {
             Shape s(a.get_ints("shape"));
             const Shape& xs = in[0].shape;
             bool ok = xs.rank() <= s.rank();
             for (int i = 0; ok && i < xs.rank(); ++i) {
               const int64_t d = xs[i], t = s[s.rank() - xs.rank() + i];
               ok = d == t || d == 1;
             }
             if (!ok)
               fail(
                   "broadcast_to", "cannot broadcast: got ", in[0], " to shape ", s,
                   ", expected each trailing dimension of the input to equal the target's or be 1");
             return std::vector<TensorType>{{in[0].dtype, s}};
           },
       .jvp = ops::linear_jvp,
       .vjp = [](const RuleArgs& r, std::span<const Tangent> ct) -> ops::Ts {
         return {unbroadcast(*ct[0], r.inputs[0].shape())};
       },
       .batch = [](const BatchArgs& b) -> std::vector<Batched> {
         // Batch axis in front, then size-1 axes so the example's axes line up at the end.
         const Tensor x = ops::batch_first(b.inputs[0], b.dims[0], b.size);
         const auto& target = b.attrs.get_ints("shape");
         std::vector<int64_t> dims{b.size};
         dims.insert(dims.end(), target.size() - static_cast<std::size_t>(x.rank() - 1), 1);
         dims.insert(dims.end(), x.shape().begin() + 1, x.shape().end());
         std::vector<int64_t> out{b.size};
         out.insert(out.end(), target.begin(), target.end());
         return {{broadcast_to(reshape(x, Shape(dims)), Shape(out)), 0}};
       },
       .algebra = {.reshapes = true, .expands = true, .rearranges = true},
       .lowering = lowering::Lowering{.index_map = lowering::IndexMap::broadcast}},
      {{ops::cpu({DTypeSet::all()}), [](ops::Ins in, const Attrs& a) {
          Shape s(a.get_ints("shape"));
          return one(make_view(in[0], s, detail::broadcast_strides(in[0], s), in[0].offset()));
        }}});
  return p;
}

namespace {

// ---- slice{start, stop, step}: per axis, 0 <= start <= stop <= dim, step >= 1 ---------

// Elements in [start, stop) taken every `step`, without forming stop - start + step - 1,
// which overflows for a step near 2^63.
int64_t slice_count(int64_t start, int64_t stop, int64_t step) {
  return stop == start ? 0 : (stop - start - 1) / step + 1;
}

// slice's view (its kernel, and slice's eager short path).
Tensor slice_view(const Tensor& x, const std::vector<int64_t>& start,
                  const std::vector<int64_t>& stop, const std::vector<int64_t>& step) {
  Shape s;
  std::vector<int64_t> st;
  int64_t off = x.offset();
  for (std::size_t i = 0; i < start.size(); ++i) {
    const int64_t n = slice_count(start[i], stop[i], step[i]);
    s.dims().push_back(n);
    // With two elements or more, step < size and the product stays inside the storage.
    st.push_back(n > 1 ? x.strides()[i] * step[i] : x.strides()[i]);
    if (n > 0) off += start[i] * x.strides()[i];
  }
  return make_view(x, std::move(s), std::move(st), off);
}

}  // namespace

const Primitive& prim::slice() {
  static const Primitive& p = detail::register_builtin(
      {.name = "slice",
       .arity = 1,
       .type_rule =
           [](ops::Types in, const Attrs& a) {
             const auto &start = a.get_ints("start"), &stop = a.get_ints("stop"),
                        &step = a.get_ints("step");
             const Shape& xs = in[0].shape;
             const auto r = static_cast<std::size_t>(xs.rank());
             if (start.size() != r || stop.size() != r || step.size() != r)
               fail("slice", "wrong number of bounds: got ", start.size(), " for ", in[0],
                    ", expected one start, stop and step per axis (", r, ")");
             Shape out;
             for (std::size_t i = 0; i < r; ++i) {
               if (start[i] < 0 || stop[i] < start[i] || stop[i] > xs[static_cast<int>(i)] ||
                   step[i] < 1)
                 fail("slice", "bounds out of range on axis ", i, ": got start=", start[i],
                      ", stop=", stop[i], ", step=", step[i], " for ", in[0],
                      ", expected 0 <= start <= stop <= size and step >= 1");
               out.dims().push_back(slice_count(start[i], stop[i], step[i]));
             }
             return std::vector<TensorType>{{in[0].dtype, out}};
           },
       .jvp = ops::linear_jvp,
       .vjp = [](const RuleArgs& r, std::span<const Tangent> ct) -> ops::Ts {
         // An axis that kept one element or none may carry any step (IR can say step=2^62);
         // step 1 says the same, and spares the transpose padding that element to a whole step.
         std::vector<int64_t> step = r.attrs.get_ints("step");
         for (std::size_t i = 0; i < step.size(); ++i)
           if (ct[0]->shape()[static_cast<int>(i)] <= 1) step[i] = 1;
         return {ops::unslice(*ct[0], r.inputs[0].shape(), r.attrs.get_ints("start"), step)};
       },
       .batch = ops::batch_leading([](const Attrs& a, const Tensor& x) {
         return ops::prepend_int(
             ops::prepend_int(ops::prepend_int(a, "start", 0), "stop", x.shape()[0]), "step", 1);
       }),
       .algebra = {.rearranges = true},
       .lowering = lowering::Lowering{.index_map = lowering::IndexMap::slice}},
      {{ops::cpu({DTypeSet::all()}), [](ops::Ins in, const Attrs& a) {
          return one(
              slice_view(in[0], a.get_ints("start"), a.get_ints("stop"), a.get_ints("step")));
        }}});
  return p;
}

// ---- flip{axes}: reverses the given axes (a view with negative strides) -------------

const Primitive& prim::flip() {
  static const Primitive& p = detail::register_builtin(
      {.name = "flip",
       .arity = 1,
       .type_rule =
           [](ops::Types in, const Attrs& a) {
             normalize_axes("flip", a.get_ints("axes"), in[0].shape.rank(), false);
             return std::vector<TensorType>{in[0]};
           },
       .jvp = ops::linear_jvp,
       .vjp = ops::linear_jvp,  // flip is its own transpose
       .batch = ops::batch_leading(
           [](const Attrs& a, const Tensor&) { return ops::shift_ints(a, "axes"); }),
       .algebra = {.rearranges = true}},
      {{ops::cpu({DTypeSet::all()}), [](ops::Ins in, const Attrs& a) {
          const Tensor& x = in[0];
          std::vector<int64_t> st = x.strides();
          int64_t off = x.offset();
          for (int ax : normalize_axes("flip", a.get_ints("axes"), x.rank(), false)) {
            const auto u = static_cast<std::size_t>(ax);
            if (x.shape()[ax] > 0) off += (x.shape()[ax] - 1) * st[u];
            st[u] = -st[u];
          }
          return one(make_view(x, x.shape(), st, off));
        }}});
  return p;
}

// ---- concatenate{axis} -------------------------------------------------------------

const Primitive& prim::concatenate() {
  static const Primitive& p = detail::register_builtin(
      {.name = "concatenate",
       .arity = 1,
       .variadic = true,
       .type_rule =
           [](ops::Types in, const Attrs& a) {
             const int r = in[0].shape.rank();
             if (r == 0)
               fail("concatenate", "zero-dimensional inputs: got ", ops::types_str(in),
                    ", expected tensors of rank >= 1");
             const int axis = normalize_axis("concatenate", a.get_int("axis"), r);
             Shape out = in[0].shape;
             for (std::size_t i = 1; i < in.size(); ++i) {
               bool ok = in[i].dtype == in[0].dtype && in[i].shape.rank() == r;
               for (int d = 0; ok && d < r; ++d) ok = d == axis || in[i].shape[d] == out[d];
               if (!ok)
                 fail("concatenate", "inputs differ: got ", ops::types_str(in),
                      ", expected one dtype and equal sizes except along axis ", axis);
               out[axis] = detail::checked_add("concatenate", out[axis], in[i].shape[axis]);
             }
             return std::vector<TensorType>{{in[0].dtype, out}};
           },
       .jvp = ops::linear_jvp,
       .vjp = [](const RuleArgs& r, std::span<const Tangent> ct) -> ops::Ts {
         const int axis = normalize_axis("concatenate", r.attrs.get_int("axis"), ct[0]->rank());
         ops::Ts out;
         int64_t at = 0;
         for (const Tensor& x : r.inputs) {
           std::vector<Slice> sl(static_cast<std::size_t>(axis) + 1);
           sl.back() = Slice{at, at + x.shape()[axis], 1};
           out.push_back(slice(*ct[0], sl));
           at += x.shape()[axis];
         }
         return out;
       },
       .batch = [](const BatchArgs& b) -> std::vector<Batched> {
         std::vector<Tensor> ins;
         for (std::size_t i = 0; i < b.inputs.size(); ++i)
           ins.push_back(ops::batch_first(b.inputs[i], b.dims[i], b.size));
         const int axis = normalize_axis("concatenate", b.attrs.get_int("axis"), ins[0].rank() - 1);
         Attrs a = b.attrs;
         a.set("axis", int64_t{axis + 1});
         return {{bind1(b.primitive, ins, a), 0}};
       }},
      {{ops::cpu_variadic(DTypeSet::all()), [](ops::Ins in, const Attrs& a) {
          const int axis = normalize_axis("concatenate", a.get_int("axis"), in[0].rank());
          Shape s = in[0].shape();
          for (std::size_t i = 1; i < in.size(); ++i) s[axis] += in[i].shape()[axis];
          Tensor out = empty(s, in[0].dtype());
          int64_t pos = 0;
          for (const Tensor& x : in) {
            // Copy x into the matching window of out, viewed with out's strides.
            Tensor window = make_view(out, x.shape(), out.strides(),
                                      pos * out.strides()[static_cast<std::size_t>(axis)]);
            detail::copy_cast(x, window);
            pos += x.shape()[axis];
          }
          return one(out);
        }}});
  return p;
}

// ---- pad{low, high, value}: constant padding ----------------------------------------

const Primitive& prim::pad() {
  static const Primitive& p = detail::register_builtin(
      {.name = "pad",
       .arity = 1,
       .type_rule =
           [](ops::Types in, const Attrs& a) {
             const auto &lo = a.get_ints("low"), &hi = a.get_ints("high");
             const int r = in[0].shape.rank();
             if (static_cast<int>(lo.size()) != r || static_cast<int>(hi.size()) != r)
               fail("pad", "wrong number of widths: got ", lo.size(), " for ", in[0],
                    ", expected one (before, after) pair per axis (", r, ")");
             Shape out = in[0].shape;
             for (int i = 0; i < r; ++i) {
               const auto u = static_cast<std::size_t>(i);
               if (lo[u] < 0 || hi[u] < 0)
                 fail("pad", "negative width on axis ", i, ": got (", lo[u], ", ", hi[u],
                      "), expected widths >= 0");
               out[i] =
                   detail::checked_add("pad", detail::checked_add("pad", out[i], lo[u]), hi[u]);
             }
             return std::vector<TensorType>{{in[0].dtype, out}};
           },
       .jvp = [](const RuleArgs& r, std::span<const Tangent> t) -> ops::Ts {
         Attrs a = r.attrs;
         a.set("value", 0.0);  // the padding value is a constant: its tangent is zero
         return {bind1(r.primitive, {*t[0]}, a)};
       },
       .vjp = [](const RuleArgs& r, std::span<const Tangent> ct) -> ops::Ts {
         const auto& lo = r.attrs.get_ints("low");
         std::vector<Slice> sl;
         for (int i = 0; i < r.inputs[0].rank(); ++i) {
           const int64_t b = lo[static_cast<std::size_t>(i)];
           sl.push_back(Slice{b, b + r.inputs[0].shape()[i], 1});
         }
         return {slice(*ct[0], sl)};
       },
       .batch = ops::batch_leading([](const Attrs& a, const Tensor&) {
         return ops::prepend_int(ops::prepend_int(a, "low", 0), "high", 0);
       }),
       .algebra = {.pads = true}},
      {{ops::cpu({DTypeSet::all()}), [](ops::Ins in, const Attrs& a) {
          const Tensor& x = in[0];
          const auto& lo = a.get_ints("low");
          Shape s = x.shape();
          for (int i = 0; i < s.rank(); ++i)
            s[i] +=
                lo[static_cast<std::size_t>(i)] + a.get_ints("high")[static_cast<std::size_t>(i)];
          Tensor out = full(s, a.get_double("value"), x.dtype());
          int64_t off = 0;
          for (int i = 0; i < s.rank(); ++i)
            off += lo[static_cast<std::size_t>(i)] * out.strides()[static_cast<std::size_t>(i)];
          detail::copy_cast(x, make_view(out, x.shape(), out.strides(), off));
          return one(out);
        }}});
  return p;
}

// ---- public ops --------------------------------------------------------------------

Tensor reshape(const Tensor& x, const Shape& shape, Loc loc) {
  const detail::CallSite site(loc);
  std::vector<int64_t> dims = shape.dims();
  int infer = -1;
  int64_t known = 1;
  bool overflow = false;  // then `known` exceeds any element count: nothing can be inferred
  for (std::size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] == -1) {
      if (infer >= 0)
        fail("reshape", "more than one -1: got ", shape, ", expected at most one inferred size");
      infer = static_cast<int>(i);
    } else if (dims[i] < 0) {
      fail("reshape", "negative dimension: got ", shape, ", expected sizes >= 0 (or one -1)");
    } else {
      overflow = overflow || __builtin_mul_overflow(known, dims[i], &known);
    }
  }
  if (infer >= 0) {
    if (overflow || known == 0 || x.numel() % known != 0)
      fail("reshape", "cannot infer the -1: got ", x.type(), " to shape ", shape,
           ", expected the other sizes to multiply to a divisor of the element count ", x.numel());
    dims[static_cast<std::size_t>(infer)] = x.numel() / known;
  }
  Shape s(dims);
  if (s == x.shape()) return x;
  if (eager(prim::reshape(), x) && s.numel("reshape") == x.numel())
    if (std::optional<Tensor> view = reshape_view(x, s)) return std::move(*view);
  return bind1(prim::reshape(), {x}, {{"shape", dims}}, loc);
}

Tensor flatten(const Tensor& x, Loc loc) { return reshape(x, Shape{x.numel()}, loc); }

Tensor transpose(const Tensor& x, Loc loc) {
  const detail::CallSite site(loc);
  Axes perm(static_cast<std::size_t>(x.rank()));
  std::iota(perm.rbegin(), perm.rend(), 0);
  return transpose(x, perm, loc);
}

Tensor transpose(const Tensor& x, const Axes& perm, Loc loc) {
  const detail::CallSite site(loc);
  Axes p = perm;
  for (int64_t& a : p)
    if (a < 0) a += x.rank();
  Axes iota(p.size());
  std::iota(iota.begin(), iota.end(), 0);
  if (p == iota && static_cast<int>(p.size()) == x.rank()) return x;
  return bind1(prim::transpose(), {x}, {{"perm", p}}, loc);
}
Tensor permute(const Tensor& x, const Axes& perm, Loc loc) { return transpose(x, perm, loc); }

Tensor swapaxes(const Tensor& x, int64_t a, int64_t b, Loc loc) {
  const detail::CallSite site(loc);
  Axes perm(static_cast<std::size_t>(x.rank()));
  std::iota(perm.begin(), perm.end(), 0);
  std::swap(perm[static_cast<std::size_t>(normalize_axis("swapaxes", a, x.rank()))],
            perm[static_cast<std::size_t>(normalize_axis("swapaxes", b, x.rank()))]);
  return transpose(x, perm, loc);
}

Tensor moveaxis(const Tensor& x, int64_t from, int64_t to, Loc loc) {
  const detail::CallSite site(loc);
  const int f = normalize_axis("moveaxis", from, x.rank());
  const int t = normalize_axis("moveaxis", to, x.rank());
  Axes perm;
  for (int i = 0; i < x.rank(); ++i)
    if (i != f) perm.push_back(i);
  perm.insert(perm.begin() + t, f);
  return transpose(x, perm, loc);
}

Tensor broadcast_to(const Tensor& x, const Shape& shape, Loc loc) {
  const detail::CallSite site(loc);
  if (x.shape() == shape) return x;
  return bind1(prim::broadcast_to(), {x}, {{"shape", shape.dims()}}, loc);
}

Tensor expand_dims(const Tensor& x, int64_t axis, Loc loc) {
  const detail::CallSite site(loc);
  const int a = normalize_axis("expand_dims", axis, x.rank() + 1);
  std::vector<int64_t> dims = x.shape().dims();
  dims.insert(dims.begin() + a, 1);
  return reshape(x, Shape(dims), loc);
}

Tensor squeeze(const Tensor& x, const Axes& axes, Loc loc) {
  const detail::CallSite site(loc);
  std::vector<int64_t> dims;
  if (axes.empty()) {
    for (int64_t d : x.shape())
      if (d != 1) dims.push_back(d);
  } else {
    const std::vector<int> ax = normalize_axes("squeeze", axes, x.rank(), false);
    for (int a : ax)
      if (x.shape()[a] != 1)
        fail("squeeze", "axis ", a, " has size ", x.shape()[a], ": got ", x.type(),
             ", expected size-1 axes only");
    for (int i = 0; i < x.rank(); ++i)
      if (!std::binary_search(ax.begin(), ax.end(), i)) dims.push_back(x.shape()[i]);
  }
  return reshape(x, Shape(dims), loc);
}

Tensor flip(const Tensor& x, const Axes& axes, Loc loc) {
  const detail::CallSite site(loc);
  Axes ax = axes;
  if (ax.empty())
    for (int i = 0; i < x.rank(); ++i) ax.push_back(i);
  if (ax.empty()) return x;
  return bind1(prim::flip(), {x}, {{"axes", ax}}, loc);
}

Tensor slice(const Tensor& x, const std::vector<Slice>& slices, Loc loc) {
  const detail::CallSite site(loc);
  if (static_cast<int>(slices.size()) > x.rank())
    fail("slice", "too many slices: got ", slices.size(), " for ", x.type(),
         ", expected at most one per axis");
  Axes start, stop, step, flips;
  for (int i = 0; i < x.rank(); ++i) {
    const int64_t n = x.shape()[i];
    Slice s = i < static_cast<int>(slices.size()) ? slices[static_cast<std::size_t>(i)] : Slice{};
    if (s.step == 0)
      fail("slice", "zero step on axis ", i, ": got step=0, expected a non-zero step");
    auto clamp = [&](std::optional<int64_t> v, int64_t dflt, int64_t lo, int64_t hi) {
      if (!v) return dflt;
      int64_t w = *v < 0 ? *v + n : *v;
      return std::clamp(w, lo, hi);
    };
    int64_t b, e;  // [b, e) on the axis, or on the flipped axis for a negative step
    if (s.step > 0) {
      b = clamp(s.start, 0, 0, n);
      e = std::max(b, clamp(s.stop, n, 0, n));
    } else {
      // Python semantics for a negative step: walk down from start (inclusive) to stop
      // (exclusive). Expressed as a forward slice of the flipped axis.
      const int64_t from = clamp(s.start, n - 1, -1, n - 1), to = clamp(s.stop, -1, -1, n - 1);
      b = n - 1 - from;
      e = std::max(b, n - 1 - to);
      flips.push_back(i);
    }
    // |step| in unsigned arithmetic: -INT64_MIN is no int64_t. A step of at least e - b takes
    // one element (or none), as step 1 does, which keeps steps below the axis size.
    const uint64_t mag =
        s.step > 0 ? static_cast<uint64_t>(s.step) : 0 - static_cast<uint64_t>(s.step);
    const bool one = mag >= static_cast<uint64_t>(e - b);
    start.push_back(b);
    stop.push_back(one ? std::min(e, b + 1) : e);
    step.push_back(one ? 1 : static_cast<int64_t>(mag));
  }
  Tensor y = flips.empty() ? x : flip(x, flips, loc);
  bool whole = true;
  for (int i = 0; i < x.rank(); ++i) {
    const auto u = static_cast<std::size_t>(i);
    whole = whole && start[u] == 0 && stop[u] == x.shape()[i] && step[u] == 1;
  }
  if (whole) return y;
  if (eager(prim::slice(), y)) return slice_view(y, start, stop, step);
  return bind1(prim::slice(), {y}, {{"start", start}, {"stop", stop}, {"step", step}}, loc);
}

Tensor index(const Tensor& x, int64_t i, Loc loc) {
  const detail::CallSite site(loc);
  if (x.rank() == 0)
    fail("index", "cannot index a 0-d tensor: got ", x.type(), ", expected rank >= 1");
  const int64_t n = x.shape()[0];
  if (i < -n || i >= n)
    fail("index", "index out of range: got ", i, " for axis 0 of ", x.type(), ", expected [", -n,
         ", ", n - 1, "]");
  const int64_t j = i < 0 ? i + n : i;
  if (eager(prim::slice(), x) && eager(prim::reshape(), x)) {  // the view slice and squeeze make
    const std::vector<int64_t>& xs = x.strides();
    return make_view(x, Shape(std::vector<int64_t>(x.shape().begin() + 1, x.shape().end())),
                     std::vector<int64_t>(xs.begin() + 1, xs.end()), x.offset() + j * xs[0]);
  }
  Tensor s = slice(x, {Slice{j, j + 1, 1}}, loc);
  return squeeze(s, {0}, loc);
}

Tensor concatenate(const std::vector<Tensor>& xs, int64_t axis, Loc loc) {
  const detail::CallSite site(loc);
  if (xs.empty()) fail("concatenate", "no inputs: got 0 tensors, expected at least one");
  if (xs.size() == 1) return xs.front();
  DType dt = xs.front().dtype();
  for (const Tensor& x : xs) dt = promote_types(dt, x.dtype());
  std::vector<Tensor> ins;
  for (const Tensor& x : xs) ins.push_back(ops::cast_if_needed(x, dt, loc));
  return bind1(prim::concatenate(), ins, {{"axis", axis}}, loc);
}

Tensor stack(const std::vector<Tensor>& xs, int64_t axis, Loc loc) {
  const detail::CallSite site(loc);
  if (xs.empty()) fail("stack", "no inputs: got 0 tensors, expected at least one");
  for (const Tensor& x : xs)
    if (x.shape() != xs.front().shape())
      fail("stack", "shapes differ: got ", xs.front().type(), " and ", x.type(),
           ", expected every input to have the same shape");
  const int a = normalize_axis("stack", axis, xs.front().rank() + 1);
  std::vector<Tensor> parts;
  for (const Tensor& x : xs) parts.push_back(expand_dims(x, a, loc));
  return concatenate(parts, a, loc);
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& indices, int64_t axis,
                          Loc loc) {
  const detail::CallSite site(loc);
  const int a = normalize_axis("split", axis, x.rank());
  const int64_t n = x.shape()[a];
  std::vector<Tensor> out;
  int64_t prev = 0;
  std::vector<int64_t> bounds = indices;
  bounds.push_back(n);
  for (int64_t b : bounds) {
    // numpy: part k is x[indices[k-1]:indices[k]] with Python slice semantics (negative
    // indices count from the end; a bound below the previous one gives an empty part).
    const int64_t e = std::clamp<int64_t>(b < 0 ? b + n : b, 0, n);
    std::vector<Slice> sl(static_cast<std::size_t>(a) + 1);
    sl.back() = Slice{prev, std::max(prev, e), 1};
    out.push_back(slice(x, sl, loc));
    prev = e;
  }
  return out;
}

std::vector<Tensor> split(const Tensor& x, int64_t sections, int64_t axis, Loc loc) {
  const detail::CallSite site(loc);
  const int a = normalize_axis("split", axis, x.rank());
  if (sections <= 0 || x.shape()[a] % sections != 0)
    fail("split", "unequal sections: got ", sections, " sections of axis ", a, " (size ",
         x.shape()[a], ") of ", x.type(), ", expected a positive divisor of the size");
  std::vector<int64_t> idx;
  const int64_t len = x.shape()[a] / sections;
  for (int64_t i = 1; i < sections; ++i) idx.push_back(i * len);
  return split(x, idx, a, loc);
}

Tensor pad(const Tensor& x, const std::vector<std::pair<int64_t, int64_t>>& widths, double value,
           Loc loc) {
  const detail::CallSite site(loc);
  Axes lo, hi;
  for (const auto& [b, e] : widths) {
    lo.push_back(b);
    hi.push_back(e);
  }
  return bind1(prim::pad(), {x}, {{"low", lo}, {"high", hi}, {"value", value}}, loc);
}

}  // namespace kiln
