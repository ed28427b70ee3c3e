// vmap: evaluates a per-example IR function on batched inputs, equation by equation, with
// each primitive's batching rule. Like the AD interpreters it goes through bind, so under a
// trace it records the batched program.
#include "distributed/collectives.h"
#include "kiln/transforms.h"
#include "ops/primitives.h"
#include "ops/rules.h"

namespace kiln {
namespace detail {

namespace {
thread_local std::vector<AxisScope> g_axes;
}

int64_t ProcessSpan::offset() const {
  int64_t o = 0;
  for (int p = 0; p < index; ++p) o += sizes[static_cast<std::size_t>(p)];
  return o;
}

AxisScopeGuard::AxisScopeGuard(std::string name, int64_t size,
                               std::optional<ProcessSpan> processes) {
  g_axes.push_back({std::move(name), size, std::move(processes)});
}
AxisScopeGuard::~AxisScopeGuard() { g_axes.pop_back(); }

const AxisScope& find_axis(std::string_view op, const std::string& name) {
  for (auto it = g_axes.rbegin(); it != g_axes.rend(); ++it)
    if (it->name == name) return *it;
  std::string in_scope;
  for (const AxisScope& a : g_axes)
    if (!a.name.empty()) in_scope += (in_scope.empty() ? "" : ", ") + a.name;
  fail(op, "unknown axis name: got '", name, "', expected one of the named axes in scope: [",
       in_scope, "] (name one with vmap or pmap(f, ..., axis_name(\"", name, "\")))");
}

const AxisScope* find_process_axis() {
  for (const AxisScope& a : g_axes)
    if (a.processes) return &a;
  return nullptr;
}

namespace {

// Batch axis of each flattened leaf, normalised; and the common batch size.
struct VmapInputs {
  std::vector<std::optional<int>> dims;
  int64_t size = -1;
};

VmapInputs vmap_inputs(const TreeDef& def, const std::vector<Tensor>& leaves,
                       const std::optional<InAxes>& in) {
  const std::size_t n_args = def.children.size();
  if (in && in->axes.size() != n_args)
    fail("vmap", "in_axes has ", in->axes.size(), " entries: got ", in->axes.size(),
         " for a function called with ", n_args, " arguments, expected one per argument");
  VmapInputs r;
  std::size_t leaf = 0;
  int64_t first_arg = -1;
  for (std::size_t a = 0; a < n_args; ++a) {
    const std::size_t n_leaves = def.children[a].num_leaves();
    const LeafAxes* per_leaf = in ? std::get_if<LeafAxes>(&in->axes[a]) : nullptr;
    if (per_leaf && per_leaf->axes.size() != n_leaves)
      fail("vmap", "leaf_axes for argument ", a, " lists ", per_leaf->axes.size(), " axes: got ",
           per_leaf->axes.size(), ", expected ", n_leaves,
           " (one per tensor leaf, in flatten order)");
    for (std::size_t k = 0; k < n_leaves; ++k, ++leaf) {
      const std::optional<int> axis =
          per_leaf ? per_leaf->axes[k]
                   : (in ? std::get<std::optional<int>>(in->axes[a]) : std::optional<int>(0));
      const Tensor& t = leaves[leaf];
      if (!axis || !t.defined()) {
        r.dims.push_back(std::nullopt);
        continue;
      }
      if (*axis < -t.rank() || *axis >= t.rank())
        fail("vmap", "axis out of range for argument ", a, ": got in_axes ", *axis,
             " for a tensor ", t.type(), " of rank ", t.rank(), ", expected an axis in [",
             -t.rank(), ", ", t.rank() - 1, "]");
      const int d = *axis < 0 ? *axis + t.rank() : *axis;
      const int64_t n = t.shape()[d];
      if (r.size >= 0 && n != r.size)
        fail("vmap", "inconsistent batch sizes: got ", r.size, " for argument ", first_arg, " and ",
             n, " for argument ", a, " (", t.type(), " along axis ", d,
             "), expected every mapped input to have the same size along its axis");
      if (r.size < 0) first_arg = static_cast<int64_t>(a);
      r.size = n;
      r.dims.push_back(d);
    }
  }
  return r;
}

// Per-example stand-ins for tracing (broadcast scalars: no memory).
std::vector<Tensor> example_stand_ins(const std::vector<Tensor>& leaves,
                                      const std::vector<std::optional<int>>& dims) {
  std::vector<Tensor> out;
  for (std::size_t i = 0; i < leaves.size(); ++i) {
    const Tensor& t = leaves[i];
    if (!t.defined() || !dims[i]) {
      out.push_back(t);
      continue;
    }
    std::vector<int64_t> shape = t.shape().dims();
    shape.erase(shape.begin() + *dims[i]);
    out.push_back(ops::zeros_of({t.dtype(), Shape(shape)}));
  }
  return out;
}

// Moves each result's batch axis to where out_axes asks (broadcasting unbatched results).
std::vector<Tensor> vmap_outputs(std::vector<Batched> results, int64_t size,
                                 const std::optional<OutAxes>& out) {
  if (out && out->axes.size() != 1 && out->axes.size() != results.size())
    fail("vmap", "out_axes has ", out->axes.size(), " entries: got ", out->axes.size(), " for ",
         results.size(), " results, expected one, or one per result");
  std::vector<Tensor> r;
  for (std::size_t i = 0; i < results.size(); ++i) {
    const std::optional<int> want =
        out ? out->axes[out->axes.size() == 1 ? 0 : i] : std::optional<int>(0);
    Batched& b = results[i];
    if (!want) {
      if (b.dim)
        fail("vmap", "result ", i, " varies across the batch: got a batched ", b.value.type(),
             ", expected an unbatched result for out_axes none");
      r.push_back(b.value);
      continue;
    }
    const Tensor front = ops::batch_first(b.value, b.dim, size);
    const int d = normalize_axis("vmap", *want, front.rank());
    r.push_back(d == 0 ? front : moveaxis(front, 0, d));
  }
  return r;
}

}  // namespace

MappedLeaves mapped_leaves(const VmapOptions& options, const TreeDef& args_def,
                           const std::vector<Tensor>& leaves) {
  VmapInputs in = vmap_inputs(args_def, leaves, options.in);
  return {std::move(in.dims), in.size < 0 ? 1 : in.size};
}

FlatTree vmap_call(const VmapOptions& options, const TreeDef& args_def,
                   const std::vector<Tensor>& leaves, const FlatFn& fn) {
  const VmapInputs in = vmap_inputs(args_def, leaves, options.in);
  const int64_t size = in.size < 0 ? 1 : in.size;
  // Under pmap the axis holds every process's examples; this process batches its own.
  int64_t axis_size = size;
  if (options.processes) {
    axis_size = 0;
    for (int64_t n : options.processes->sizes) axis_size += n;
  }
  Staged s;
  {
    AxisScopeGuard scope(options.name, axis_size, options.processes);
    s = stage("vmap", args_def, example_stand_ins(leaves, in.dims), fn);
  }
  std::vector<Batched> ins;
  for (std::size_t i = 0; i < leaves.size(); ++i) ins.push_back({leaves[i], in.dims[i]});
  for (const Tensor& c : s.captures) ins.push_back({c, std::nullopt});
  AxisScopeGuard scope(options.name, axis_size, options.processes);
  std::vector<Batched> outs = batching::evaluate(ir::dce(*s.function), ins, size, options.name);
  return {vmap_outputs(std::move(outs), size, options.out), std::move(s.out_def)};
}

}  // namespace detail

namespace batching {

std::vector<Batched> evaluate(const ir::Function& f, std::span<const Batched> args, int64_t size,
                              std::string_view axis_name) {
  if (args.size() != f.params.size())
    fail("vmap", "@", f.name, " takes ", f.params.size(), " arguments: got ", args.size());
  std::vector<Batched> env(static_cast<std::size_t>(f.next_id()));
  for (std::size_t i = 0; i < args.size(); ++i)
    env[static_cast<std::size_t>(f.params[i].id)] = args[i];
  for (const ir::Constant& c : f.constants)
    env[static_cast<std::size_t>(c.value.id)] = {c.tensor, std::nullopt};
  for (const ir::Equation& e : f.equations) {
    std::vector<Tensor> ins;
    std::vector<std::optional<int>> dims;
    bool any = false;
    for (const ir::Value& v : e.inputs) {
      const Batched& b = env[static_cast<std::size_t>(v.id)];
      ins.push_back(b.value);
      dims.push_back(b.dim);
      any = any || b.dim.has_value();
    }
    // A collective over this vmap's axis needs its rule even with unbatched inputs.
    const bool collective = !axis_name.empty() && e.attrs.has("axis_name") &&
                            e.attrs.get<std::string>("axis_name") == axis_name;
    std::vector<Batched> outs;
    if (!any && !collective) {
      for (Tensor& t : bind(*e.prim, ins, e.attrs)) outs.push_back({std::move(t), std::nullopt});
    } else {
      if (!e.prim->batch)
        fail("vmap", "no batching rule for primitive '", e.prim->name, "'",
             e.prim->where_defined());
      outs = e.prim->batch(BatchArgs{ins, dims, e.attrs, size, axis_name, *e.prim});
    }
    if (outs.size() != e.outputs.size())
      fail("vmap", "batching rule of '", e.prim->name, "' returned ", outs.size(),
           " outputs, expected ", e.outputs.size());
    for (std::size_t k = 0; k < outs.size(); ++k)
      env[static_cast<std::size_t>(e.outputs[k].id)] = outs[k];
  }
  std::vector<Batched> results;
  for (const ir::Value& v : f.results) results.push_back(env[static_cast<std::size_t>(v.id)]);
  return results;
}

}  // namespace batching
}  // namespace kiln

// ---- collectives ------------------------------------------------------------------------
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
  return s.processes ? &*s.processes : nullptr;
}
const std::string& axis_of(const BatchArgs& b) { return b.attrs.get<std::string>("axis_name"); }

}  // namespace

const Primitive& prim::psum() {
  static const Primitive& p = detail::register_builtin(
      {.name = "psum",
       .arity = 1,
       .type_rule = [](ops::Types in, const Attrs&) { return std::vector<TensorType>{in[0]}; },
       .jvp = ops::linear_jvp,
       // Each example's output is the sum over all: its cotangent flows back to every input.
       .vjp = [](const RuleArgs& r, std::span<const Tangent> ct) -> ops::Ts {
         return {bind1(r.primitive, {*ct[0]}, r.attrs)};
       },
       .batch = [](const BatchArgs& b) -> std::vector<Batched> {
         if (other_axis(b)) return ops::batch_elementwise(b);
         const Tensor local = sum_over_batch(b);
         if (!spanned(b)) return {{local, std::nullopt}};
         return {{distributed::all_reduce(local, distributed::Reduce::sum, axis_of(b)),
                  std::nullopt}};
       }},
      {{ops::cpu({DTypeSet::numeric()}), unbound("psum")}});
  return p;
}

const Primitive& prim::pmax() {
  static const Primitive& p = detail::register_builtin(
      {.name = "pmax",
       .arity = 1,
       .type_rule = [](ops::Types in, const Attrs&) { return std::vector<TensorType>{in[0]}; },
       .jvp = [](const RuleArgs& r, std::span<const Tangent> t) -> ops::Ts {
         const Primitive& psum = prim::psum();
         const Tensor hit = astype(r.inputs[0] == r.outputs[0], r.inputs[0].dtype());
         return {bind1(psum, {*t[0] * hit}, r.attrs) / bind1(psum, {hit}, r.attrs)};
       },
       .vjp = [](const RuleArgs& r, std::span<const Tangent> ct) -> ops::Ts {
         const Primitive& psum = prim::psum();
         const Tensor hit = astype(r.inputs[0] == r.outputs[0], r.inputs[0].dtype());
         return {hit * bind1(psum, {*ct[0]}, r.attrs) / bind1(psum, {hit}, r.attrs)};
       },
       .batch = [](const BatchArgs& b) -> std::vector<Batched> {
         if (other_axis(b)) return ops::batch_elementwise(b);
         const Tensor local = max(ops::batch_first(b.inputs[0], b.dims[0], b.size), {0});
         if (!spanned(b)) return {{local, std::nullopt}};
         return {{distributed::all_reduce(local, distributed::Reduce::max, axis_of(b)),
                  std::nullopt}};
       }},
      {{ops::cpu({DTypeSet::numeric()}), unbound("pmax")}});
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
       // Example i's input appears at row i of every example's output: sum those rows.
       .vjp = [](const RuleArgs& r, std::span<const Tangent> ct) -> ops::Ts {
         const Attrs name{{"axis_name", r.attrs.get<std::string>("axis_name")}};
         const Tensor total = bind1(prim::psum(), {*ct[0]}, name);
         const Tensor i = bind1(prim::axis_index(), {}, name);
         return {squeeze(take(total, reshape(i, {1}), 0), {0})};
       },
       .batch = [](const BatchArgs& b) -> std::vector<Batched> {
         // Another axis: each example gathers on its own; the gathered axis comes first, so
         // this vmap's batch axis sits right after it.
         if (other_axis(b))
           return {{bind1(b.primitive, {ops::batch_first(b.inputs[0], b.dims[0], b.size)}, b.attrs),
                    1}};
         const Tensor local = ops::batch_first(b.inputs[0], b.dims[0], b.size);
         const detail::ProcessSpan* span = spanned(b);
         if (!span) return {{local, std::nullopt}};
         return {{distributed::all_gather(local, *span, axis_of(b)), std::nullopt}};
       }},
      {{ops::cpu({DTypeSet::all()}), unbound("all_gather")}});
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

}  // namespace kiln
