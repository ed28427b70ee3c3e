// Collectives over a named vmap axis: psum, pmean, pmax, pmin, all_gather, axis_index,
// ppermute, all_to_all, psum_scatter. They are primitives with an `axis_name` attribute whose
// kernels only raise "axis is not bound": the batching rule of the vmap with that name gives
// them their meaning (docs/DESIGN.md, "vmap"). Each rule for its own axis is a named helper in
// two steps, the local part over the batch and then the result; when the axis spans processes
// (pmap), the local parts are combined across them in between (src/distributed/collectives.h).
#include "distributed/collectives.h"

#include <algorithm>
#include <set>
#include <string>
#include <utility>

#include "kiln/transforms.h"
#include "ops/primitives.h"
#include "ops/rules.h"

namespace kiln {
namespace {

Kernel unbound(const char* op) {
  return [op](ops::Ins, const Attrs& a) -> std::vector<Tensor> {
    fail(op, "axis '", a.get<std::string>("axis_name"),
         "' is not bound: got a collective "
         "outside a vmap over that axis, expected it inside vmap(f, ..., axis_name(\"",
         a.get<std::string>("axis_name"), "\"))");
  };
}

// A collective over another (outer) axis acts on each example of this one independently.
bool other_axis(const BatchArgs& b) { return b.attrs.get<std::string>("axis_name") != b.axis_name; }

Tensor sum_over_batch(const BatchArgs& b) {
  const Tensor x = ops::batch_first(b.inputs[0], b.dims[0], b.size);
  return b.size == 1 ? squeeze(x, {0}) : sum(x, {0});
}

// The processes this vmap's axis spans, under pmap: the local part of a collective is then
// combined across them (src/distributed/collectives.h).
const detail::ProcessSpan* spanned(const BatchArgs& b) {
  const detail::AxisScope& s = detail::find_axis(b.primitive.name, std::string(b.axis_name));
  // One process holds the whole axis: its local part is the answer.
  return s.processes && s.processes->sizes.size() > 1 ? &*s.processes : nullptr;
}
const std::string& axis_of(const BatchArgs& b) { return b.attrs.get<std::string>("axis_name"); }
// The size of the whole axis: every process's examples under pmap, else the batch.
int64_t axis_size(const BatchArgs& b) {
  return detail::find_axis(b.primitive.name, std::string(b.axis_name)).size;
}

// The type of one example's x (a batching rule sees the batch axis too, when there is one).
TensorType example_type(const BatchArgs& b) {
  const Tensor& x = b.inputs[0];
  std::vector<int64_t> d = x.shape().dims();
  if (b.dims[0]) d.erase(d.begin() + *b.dims[0]);
  return {x.dtype(), Shape(d)};
}

// An axis of x whose size must be the axis size n (all_to_all's split axis, psum_scatter's
// scatter dimension), normalised.
int sized_axis(std::string_view op, const char* what, int64_t axis, const TensorType& x, int64_t n,
               std::string_view axis_name) {
  const int a = normalize_axis(op, axis, x.shape.rank());
  if (x.shape[a] != n)
    fail(op, what, " ", axis, " must have the size of axis '", axis_name, "': got ", x, " (size ",
         x.shape[a], "), expected size ", n);
  return a;
}

TensorType same_numeric_type(std::string_view op, ops::Types in) {
  ops::expect_dtype(op, in[0], DTypeSet::numeric(), "a numeric dtype");
  return in[0];
}

// ---- pmax and pmin ----

// Both sides of a tie share the derivative equally: d out / d x_j = [x_j == out] / #ties.
std::vector<Tangent> extremum_jvp(const RuleArgs& r, std::span<const Tangent> t) {
  const Primitive& psum = prim::psum();
  const Tensor hit = astype(r.inputs[0] == r.outputs[0], r.inputs[0].dtype());
  return {bind1(psum, {*t[0] * hit}, r.attrs) / bind1(psum, {hit}, r.attrs)};
}
std::vector<Tangent> extremum_vjp(const RuleArgs& r, std::span<const Tangent> ct) {
  const Primitive& psum = prim::psum();
  const Tensor hit = astype(r.inputs[0] == r.outputs[0], r.inputs[0].dtype());
  return {hit * bind1(psum, {*ct[0]}, r.attrs) / bind1(psum, {hit}, r.attrs)};
}

// ---- ppermute's pairs: attribute `perm` = [source0, dest0, source1, dest1, ...] ----

struct PermPair {
  int64_t source, dest;
};

std::vector<PermPair> pairs_of(const Attrs& a) {
  const std::vector<int64_t>& flat = a.get_ints("perm");
  if (flat.size() % 2 != 0)
    fail("ppermute", "perm holds (source, dest) pairs: got ", flat.size(),
         " numbers, expected an even count");
  std::vector<PermPair> pairs;
  for (std::size_t i = 0; i < flat.size(); i += 2) pairs.push_back({flat[i], flat[i + 1]});
  return pairs;
}

std::vector<int64_t> flat_perm(const std::vector<PermPair>& pairs) {
  std::vector<int64_t> flat;
  for (const PermPair& p : pairs) {
    flat.push_back(p.source);
    flat.push_back(p.dest);
  }
  return flat;
}

// Indices in [0, n), each example a source at most once and a destination at most once.
void check_pairs(const std::vector<PermPair>& pairs, int64_t n, std::string_view axis_name) {
  std::set<int64_t> sources, dests;
  for (const PermPair& p : pairs) {
    for (const int64_t i : {p.source, p.dest})
      if (i < 0 || i >= n)
        fail("ppermute", "index out of range: got the pair (", p.source, ", ", p.dest,
             "), expected indices in [0, ", n, ") (the size of axis '", axis_name, "')");
    if (!sources.insert(p.source).second)
      fail("ppermute", "repeated source: got ", p.source,
           " as the source of two pairs, expected each example to send at most once");
    if (!dests.insert(p.dest).second)
      fail("ppermute", "repeated destination: got ", p.dest,
           " as the destination of two pairs, expected each example to receive at most once");
  }
}

// ---- the rules for the vmap whose axis the collective names ----

std::vector<Batched> psum_own_axis(const BatchArgs& b) {
  // The local part: the batch's sum.
  const Tensor local = sum_over_batch(b);
  // The result: the same for every example.
  const detail::ProcessSpan* span = spanned(b);
  if (!span) return {{local, std::nullopt}};
  return {
      {distributed::all_reduce(local, distributed::Reduce::sum, *span, axis_of(b)), std::nullopt}};
}

// pmax (op max) and pmin (op min).
std::vector<Batched> extremum_own_axis(const BatchArgs& b, distributed::Reduce op) {
  // The local part: the batch's max (min).
  const Tensor batch = ops::batch_first(b.inputs[0], b.dims[0], b.size);
  const Tensor local = op == distributed::Reduce::max ? max(batch, {0}) : min(batch, {0});
  // The result: the same for every example.
  const detail::ProcessSpan* span = spanned(b);
  if (!span) return {{local, std::nullopt}};
  return {{distributed::all_reduce(local, op, *span, axis_of(b)), std::nullopt}};
}

std::vector<Batched> all_gather_own_axis(const BatchArgs& b) {
  // The local part: the batch, examples along axis 0.
  const Tensor local = ops::batch_first(b.inputs[0], b.dims[0], b.size);
  // The result: every example receives all of it.
  const detail::ProcessSpan* span = spanned(b);
  if (!span) return {{local, std::nullopt}};
  return {{distributed::all_gather(local, *span, axis_of(b)), std::nullopt}};
}

std::vector<Batched> ppermute_own_axis(const BatchArgs& b) {
  const std::vector<PermPair> pairs = pairs_of(b.attrs);
  check_pairs(pairs, axis_size(b), b.axis_name);
  // The local part: the batch, examples along axis 0.
  const Tensor local = ops::batch_first(b.inputs[0], b.dims[0], b.size);
  // The result: row `dest` is row `source` of its pair; rows no pair sends to are zeros.
  if (const detail::ProcessSpan* span = spanned(b)) {
    std::vector<std::pair<int64_t, int64_t>> perm;
    for (const PermPair& p : pairs) perm.emplace_back(p.source, p.dest);
    return {{distributed::permute(local, perm, *span, axis_of(b)), 0}};
  }
  std::vector<int64_t> source(static_cast<std::size_t>(b.size), 0);
  std::vector<int32_t> received(static_cast<std::size_t>(b.size), 0);
  for (const PermPair& p : pairs) {
    source[static_cast<std::size_t>(p.dest)] = p.source;
    received[static_cast<std::size_t>(p.dest)] = 1;
  }
  const Tensor moved = take(local, tensor(source), 0);
  if (pairs.size() == static_cast<std::size_t>(b.size)) return {{moved, 0}};
  std::vector<int64_t> mask_shape(static_cast<std::size_t>(local.rank()), 1);
  mask_shape[0] = b.size;
  const Tensor mask = astype(tensor(received, Shape(mask_shape)), bool_);
  return {{where(mask, moved, ops::zeros_of({local.dtype(), Shape{}})), 0}};
}

std::vector<Batched> all_to_all_own_axis(const BatchArgs& b) {
  const TensorType example = example_type(b);
  const int rank = example.shape.rank();
  const int split = sized_axis("all_to_all", "split_axis", b.attrs.get_int("split_axis"), example,
                               axis_size(b), b.axis_name);
  const int concat = normalize_axis("all_to_all", b.attrs.get_int("concat_axis"), rank);
  // The local part: the batch, examples (j) along axis 0, example axis k at k + 1.
  const Tensor local = ops::batch_first(b.inputs[0], b.dims[0], b.size);
  // The result: example i takes index i of every example's split axis (local's axis
  // split + 1, now the batch axis) and lays the examples j out along concat_axis.
  Axes rest;  // local's other axes, in order
  for (int k = 1; k <= rank; ++k)
    if (k != split + 1) rest.push_back(k);
  const detail::ProcessSpan* span = spanned(b);
  if (!span) {
    Axes perm = rest;
    perm.insert(perm.begin() + concat, 0);
    perm.insert(perm.begin(), split + 1);
    return {{transpose(local, perm), 0}};
  }
  // Across processes: [N (i), L_p (j), rest...] is exchanged to [L_p (i), N (j), rest...].
  Axes to_send{split + 1, 0};
  to_send.insert(to_send.end(), rest.begin(), rest.end());
  const Tensor received = distributed::all_to_all(transpose(local, to_send), *span, axis_of(b));
  Axes perm;
  for (int k = 2; k <= rank; ++k) perm.push_back(k);
  perm.insert(perm.begin() + concat, 1);
  perm.insert(perm.begin(), 0);
  return {{transpose(received, perm), 0}};
}

std::vector<Batched> psum_scatter_own_axis(const BatchArgs& b) {
  const int sd =
      sized_axis("psum_scatter", "scatter_dimension", b.attrs.get_int("scatter_dimension"),
                 example_type(b), axis_size(b), b.axis_name);
  // The local part: the batch's sum.
  const Tensor local = sum_over_batch(b);
  // The result: example i's part is index i along scatter_dimension, which thus is the batch
  // axis; across processes, this process's rows of the sum over processes.
  const detail::ProcessSpan* span = spanned(b);
  if (!span) return {{local, sd}};
  return {{distributed::reduce_scatter(moveaxis(local, sd, 0), *span, axis_of(b)), 0}};
}

}  // namespace

const Primitive& prim::psum() {
  static const Primitive& p = detail::register_builtin(
      {.name = "psum",
       .arity = 1,
       .type_rule =
           [](ops::Types in, const Attrs&) {
             return std::vector<TensorType>{same_numeric_type("psum", in)};
           },
       .jvp = ops::linear_jvp,
       // Each example's output is the sum over all: its cotangent flows back to every input.
       .vjp = [](const RuleArgs& r, std::span<const Tangent> ct) -> ops::Ts {
         return {bind1(r.primitive, {*ct[0]}, r.attrs)};
       },
       .batch = [](const BatchArgs& b) -> std::vector<Batched> {
         if (other_axis(b)) return ops::batch_elementwise(b);
         return psum_own_axis(b);
       }},
      {{ops::cpu({DTypeSet::numeric()}), unbound("psum")}});
  return p;
}

namespace {

// pmax and pmin: one definition, the reduction apart.
const Primitive& register_extremum(const char* name, distributed::Reduce reduce) {
  return detail::register_builtin(
      {.name = name,
       .arity = 1,
       .type_rule =
           [name](ops::Types in, const Attrs&) {
             return std::vector<TensorType>{same_numeric_type(name, in)};
           },
       .jvp = extremum_jvp,
       .vjp = extremum_vjp,
       .batch = [reduce](const BatchArgs& b) -> std::vector<Batched> {
         if (other_axis(b)) return ops::batch_elementwise(b);
         return extremum_own_axis(b, reduce);
       }},
      {{ops::cpu({DTypeSet::numeric()}), unbound(name)}});
}

}  // namespace

const Primitive& prim::pmax() {
  static const Primitive& p = register_extremum("pmax", distributed::Reduce::max);
  return p;
}

const Primitive& prim::pmin() {
  static const Primitive& p = register_extremum("pmin", distributed::Reduce::min);
  return p;
}

const Primitive& prim::axis_index() {
  static const Primitive& p = detail::register_builtin(
      {.name = "axis_index",
       .arity = 0,
       .type_rule =
           [](ops::Types, const Attrs&) {
             return std::vector<TensorType>{{int32, Shape{}}};
           },
       .differentiable = false,
       .batch = [](const BatchArgs& b) -> std::vector<Batched> {
         // The local part: the batch's positions; under pmap, shifted by the examples of the
         // processes before this one.
         const Tensor local = arange(b.size, int32);
         const detail::ProcessSpan* span = spanned(b);
         if (!span) return {{local, 0}};
         return {{local + weak(local, span->offset()), 0}};
       }},
      {{KernelSignature{.device = Device::cpu, .inputs = {}, .variadic = false},
        unbound("axis_index")}});
  return p;
}

// all_gather{axis_name, axis_size}: every example receives the stacked batch.
const Primitive& prim::all_gather() {
  static const Primitive& p = detail::register_builtin(
      {.name = "all_gather",
       .arity = 1,
       .type_rule =
           [](ops::Types in, const Attrs& a) {
             std::vector<int64_t> d{a.get_int("axis_size")};
             d.insert(d.end(), in[0].shape.begin(), in[0].shape.end());
             return std::vector<TensorType>{{in[0].dtype, Shape(d)}};
           },
       .jvp = ops::linear_jvp,
       // Example j's input is row j of every example's output: the sum of those rows.
       .vjp = [](const RuleArgs& r, std::span<const Tangent> ct) -> ops::Ts {
         const Attrs a{{"axis_name", r.attrs.get<std::string>("axis_name")},
                       {"scatter_dimension", int64_t{0}}};
         return {bind1(prim::psum_scatter(), {*ct[0]}, a)};
       },
       .batch = [](const BatchArgs& b) -> std::vector<Batched> {
         // Another axis: each example gathers on its own; the gathered axis comes first, so
         // this vmap's batch axis sits right after it.
         if (other_axis(b))
           return {{bind1(b.primitive, {ops::batch_first(b.inputs[0], b.dims[0], b.size)}, b.attrs),
                    1}};
         return all_gather_own_axis(b);
       }},
      {{ops::cpu({DTypeSet::all()}), unbound("all_gather")}});
  return p;
}

// ppermute{axis_name, perm}: example dest receives example source's x for each pair of perm.
const Primitive& prim::ppermute() {
  static const Primitive& p = detail::register_builtin(
      {.name = "ppermute",
       .arity = 1,
       .type_rule =
           [](ops::Types in, const Attrs& a) {
             (void)pairs_of(a);  // whole pairs; their range needs the axis size (batching)
             return std::vector<TensorType>{in[0]};
           },
       .jvp = ops::linear_jvp,
       // What was sent from source to dest comes back from dest to source.
       .vjp = [](const RuleArgs& r, std::span<const Tangent> ct) -> ops::Ts {
         std::vector<PermPair> inverse;
         for (const PermPair& q : pairs_of(r.attrs)) inverse.push_back({q.dest, q.source});
         Attrs a = r.attrs;
         a.set("perm", flat_perm(inverse));
         return {bind1(r.primitive, {*ct[0]}, a)};
       },
       .batch = [](const BatchArgs& b) -> std::vector<Batched> {
         if (other_axis(b)) return ops::batch_elementwise(b);
         return ppermute_own_axis(b);
       }},
      {{ops::cpu({DTypeSet::all()}), unbound("ppermute")}});
  return p;
}

// all_to_all{axis_name, split_axis, concat_axis}: example i's result at index j along
// concat_axis is example j's x at index i along split_axis.
const Primitive& prim::all_to_all() {
  static const Primitive& p = detail::register_builtin(
      {.name = "all_to_all",
       .arity = 1,
       .type_rule =
           [](ops::Types in, const Attrs& a) {
             const int rank = in[0].shape.rank();
             const int split = normalize_axis("all_to_all", a.get_int("split_axis"), rank);
             const int concat = normalize_axis("all_to_all", a.get_int("concat_axis"), rank);
             std::vector<int64_t> d = in[0].shape.dims();
             const int64_t n = d[static_cast<std::size_t>(split)];
             d.erase(d.begin() + split);
             d.insert(d.begin() + concat, n);
             return std::vector<TensorType>{{in[0].dtype, Shape(d)}};
           },
       .jvp = ops::linear_jvp,
       // Its own transpose with the axes' roles swapped: the cotangent's concat axis is split
       // back to the examples, and their pieces land on the split axis.
       .vjp = [](const RuleArgs& r, std::span<const Tangent> ct) -> ops::Ts {
         Attrs a = r.attrs;
         a.set("split_axis", r.attrs.get_int("concat_axis"));
         a.set("concat_axis", r.attrs.get_int("split_axis"));
         return {bind1(r.primitive, {*ct[0]}, a)};
       },
       .batch = [](const BatchArgs& b) -> std::vector<Batched> {
         if (other_axis(b))
           return ops::batch_leading([](const Attrs& a, const Tensor&) {
             return ops::shift_int(ops::shift_int(a, "split_axis"), "concat_axis");
           })(b);
         return all_to_all_own_axis(b);
       }},
      {{ops::cpu({DTypeSet::all()}), unbound("all_to_all")}});
  return p;
}

// psum_scatter{axis_name, scatter_dimension}: example i receives the sum over examples of their
// x at index i along scatter_dimension.
const Primitive& prim::psum_scatter() {
  static const Primitive& p = detail::register_builtin(
      {.name = "psum_scatter",
       .arity = 1,
       .type_rule =
           [](ops::Types in, const Attrs& a) {
             TensorType t = same_numeric_type("psum_scatter", in);
             const int sd =
                 normalize_axis("psum_scatter", a.get_int("scatter_dimension"), t.shape.rank());
             std::vector<int64_t> d = t.shape.dims();
             d.erase(d.begin() + sd);
             return std::vector<TensorType>{{t.dtype, Shape(d)}};
           },
       .jvp = ops::linear_jvp,
       // Example i's cotangent goes back to index i along scatter_dimension of every input:
       // gather the cotangents there.
       .vjp = [](const RuleArgs& r, std::span<const Tangent> ct) -> ops::Ts {
         const Tensor& x = r.inputs[0];
         const int sd =
             normalize_axis("psum_scatter", r.attrs.get_int("scatter_dimension"), x.rank());
         const Attrs a{{"axis_name", r.attrs.get<std::string>("axis_name")},
                       {"axis_size", x.shape()[sd]}};
         return {moveaxis(bind1(prim::all_gather(), {*ct[0]}, a), 0, sd)};
       },
       .batch = [](const BatchArgs& b) -> std::vector<Batched> {
         if (!other_axis(b)) return psum_scatter_own_axis(b);
         // Another axis: scatter along the same example axis of the batch; this vmap's batch
         // axis stays where it is, one lower when it came after the scattered one.
         const Tensor x = b.dims[0] ? b.inputs[0] : ops::batch_first(b.inputs[0], {}, b.size);
         const int d = b.dims[0].value_or(0);
         const int sd =
             normalize_axis("psum_scatter", b.attrs.get_int("scatter_dimension"), x.rank() - 1);
         const int full = sd + (d <= sd ? 1 : 0);
         Attrs a = b.attrs;
         a.set("scatter_dimension", int64_t{full});
         return {{bind1(b.primitive, {x}, a), d <= sd ? d : d - 1}};
       }},
      {{ops::cpu({DTypeSet::numeric()}), unbound("psum_scatter")}});
  return p;
}

namespace {

Attrs named(const std::string& axis_name) { return {{"axis_name", axis_name}}; }

}  // namespace

Tensor psum(const Tensor& x, const std::string& axis_name, Loc loc) {
  const detail::CallSite site(loc);
  detail::find_axis("psum", axis_name);
  return bind1(prim::psum(), {x}, named(axis_name), loc);
}
Tensor pmean(const Tensor& x, const std::string& axis_name, Loc loc) {
  const detail::CallSite site(loc);
  const int64_t n = detail::find_axis("pmean", axis_name).size;
  const Tensor xf = astype(x, to_floating(x.dtype()), loc);
  return div(psum(xf, axis_name, loc), scalar_like(xf, static_cast<double>(n)), loc);
}
Tensor pmax(const Tensor& x, const std::string& axis_name, Loc loc) {
  const detail::CallSite site(loc);
  detail::find_axis("pmax", axis_name);
  return bind1(prim::pmax(), {x}, named(axis_name), loc);
}
Tensor pmin(const Tensor& x, const std::string& axis_name, Loc loc) {
  const detail::CallSite site(loc);
  detail::find_axis("pmin", axis_name);
  return bind1(prim::pmin(), {x}, named(axis_name), loc);
}
Tensor all_gather(const Tensor& x, const std::string& axis_name, Loc loc) {
  const detail::CallSite site(loc);
  const int64_t n = detail::find_axis("all_gather", axis_name).size;
  Attrs a = named(axis_name);
  a.set("axis_size", n);
  return bind1(prim::all_gather(), {x}, a, loc);
}
Tensor axis_index(const std::string& axis_name, Loc loc) {
  const detail::CallSite site(loc);
  detail::find_axis("axis_index", axis_name);
  return bind1(prim::axis_index(), {}, named(axis_name), loc);
}
Tensor ppermute(const Tensor& x, const std::string& axis_name,
                const std::vector<std::pair<int64_t, int64_t>>& perm, Loc loc) {
  const detail::CallSite site(loc);
  const int64_t n = detail::find_axis("ppermute", axis_name).size;
  std::vector<PermPair> pairs;
  for (const auto& [source, dest] : perm) pairs.push_back({source, dest});
  check_pairs(pairs, n, axis_name);
  Attrs a = named(axis_name);
  a.set("perm", flat_perm(pairs));
  return bind1(prim::ppermute(), {x}, a, loc);
}
Tensor all_to_all(const Tensor& x, const std::string& axis_name, int64_t split_axis,
                  int64_t concat_axis, Loc loc) {
  const detail::CallSite site(loc);
  const int64_t n = detail::find_axis("all_to_all", axis_name).size;
  sized_axis("all_to_all", "split_axis", split_axis, x.type(), n, axis_name);
  Attrs a = named(axis_name);
  a.set("split_axis", split_axis);
  a.set("concat_axis", concat_axis);
  return bind1(prim::all_to_all(), {x}, a, loc);
}
Tensor psum_scatter(const Tensor& x, const std::string& axis_name, int64_t scatter_dimension,
                    Loc loc) {
  const detail::CallSite site(loc);
  const int64_t n = detail::find_axis("psum_scatter", axis_name).size;
  sized_axis("psum_scatter", "scatter_dimension", scatter_dimension, x.type(), n, axis_name);
  Attrs a = named(axis_name);
  a.set("scatter_dimension", scatter_dimension);
  return bind1(prim::psum_scatter(), {x}, a, loc);
}

// ---- over several axes at once ------------------------------------------------------------

namespace {

std::string joined(const AxisNames& axes) {
  std::string out;
  for (const std::string& a : axes.names) out += (out.empty() ? "" : ", ") + a;
  return out;
}

// The sizes of the named axes, after checking that there is at least one and none twice.
std::vector<int64_t> sizes_of(std::string_view op, const AxisNames& axes) {
  if (axes.names.empty())
    fail(op, "no axis named: got axis_names(), expected one or more axis names");
  std::vector<int64_t> sizes;
  for (auto a = axes.names.begin(); a != axes.names.end(); ++a) {
    if (std::find(axes.names.begin(), a, *a) != a)
      fail(op, "axis '", *a, "' named twice: got (", joined(axes), "), expected distinct axes");
    sizes.push_back(detail::find_axis(op, *a).size);
  }
  return sizes;
}

// How many examples a grid of axes of these sizes holds.
int64_t grid_size(const std::vector<int64_t>& sizes) {
  int64_t n = 1;
  for (const int64_t k : sizes) n *= k;
  return n;
}

// x reduced axis by axis with a one-axis collective.
template <class One>
Tensor each_axis(std::string_view op, const Tensor& x, const AxisNames& axes, Loc loc, One one) {
  const detail::CallSite site(loc);
  sizes_of(op, axes);
  Tensor y = x;
  for (const std::string& a : axes.names) y = one(y, a, loc);
  return y;
}

}  // namespace

Tensor psum(const Tensor& x, const AxisNames& axes, Loc loc) {
  return each_axis("psum", x, axes, loc,
                   [](const Tensor& y, const std::string& a, Loc l) { return psum(y, a, l); });
}
Tensor pmax(const Tensor& x, const AxisNames& axes, Loc loc) {
  return each_axis("pmax", x, axes, loc,
                   [](const Tensor& y, const std::string& a, Loc l) { return pmax(y, a, l); });
}
Tensor pmin(const Tensor& x, const AxisNames& axes, Loc loc) {
  return each_axis("pmin", x, axes, loc,
                   [](const Tensor& y, const std::string& a, Loc l) { return pmin(y, a, l); });
}
Tensor pmean(const Tensor& x, const AxisNames& axes, Loc loc) {
  const detail::CallSite site(loc);
  const int64_t n = grid_size(sizes_of("pmean", axes));
  const Tensor xf = astype(x, to_floating(x.dtype()), loc);
  return div(psum(xf, axes, loc), scalar_like(xf, static_cast<double>(n)), loc);
}
Tensor all_gather(const Tensor& x, const AxisNames& axes, Loc loc) {
  const detail::CallSite site(loc);
  const int64_t n = grid_size(sizes_of("all_gather", axes));
  // The minor axis first, so that the major one ends up in front: [N_0, ..., N_k, x...].
  Tensor y = x;
  for (auto a = axes.names.rbegin(); a != axes.names.rend(); ++a) y = all_gather(y, *a, loc);
  std::vector<int64_t> dims{n};
  for (const int64_t d : x.shape().dims()) dims.push_back(d);
  return reshape(y, Shape(dims), loc);
}
Tensor axis_index(const AxisNames& axes, Loc loc) {
  const detail::CallSite site(loc);
  const std::vector<int64_t> sizes = sizes_of("axis_index", axes);
  Tensor at = axis_index(axes.names[0], loc);
  for (std::size_t i = 1; i < sizes.size(); ++i)
    at = add(mul(at, scalar_like(at, static_cast<double>(sizes[i])), loc),
             axis_index(axes.names[i], loc), loc);
  return at;
}
Tensor psum_scatter(const Tensor& x, const AxisNames& axes, int64_t scatter_dimension, Loc loc) {
  const detail::CallSite site(loc);
  const std::vector<int64_t> sizes = sizes_of("psum_scatter", axes);
  const int d = sized_axis("psum_scatter", "scatter_dimension", scatter_dimension, x.type(),
                           grid_size(sizes), joined(axes));
  // Dimension d as [N_0, ..., N_k]; each axis's scatter takes its own, major first.
  std::vector<int64_t> dims;
  for (int k = 0; k < x.rank(); ++k)
    if (k == d)
      dims.insert(dims.end(), sizes.begin(), sizes.end());
    else
      dims.push_back(x.shape()[k]);
  Tensor y = reshape(x, Shape(dims), loc);
  for (const std::string& a : axes.names) y = psum_scatter(y, a, d, loc);
  return y;
}

}  // namespace kiln
