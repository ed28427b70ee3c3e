// vmap: evaluates a per-example IR function on batched inputs, equation by equation, with
// each primitive's batching rule. Like the AD interpreters it goes through bind, so under a
// trace it records the batched program.
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
  // pmap with one example per process, its common use: the example runs as it is, unbatched,
  // and only the collectives over the axis take their rules (batching::evaluate gives them
  // unbatched inputs too), instead of every equation paying for a batch of one.
  const bool one_example = options.processes && size == 1;
  std::vector<Batched> ins;
  for (std::size_t i = 0; i < leaves.size(); ++i)
    ins.push_back(one_example && in.dims[i] ? Batched{squeeze(leaves[i], {*in.dims[i]}), {}}
                                            : Batched{leaves[i], in.dims[i]});
  for (const Tensor& c : s.captures) ins.push_back({c, std::nullopt});
  AxisScopeGuard scope(options.name, axis_size, options.processes);
  std::vector<Batched> outs = batching::evaluate(ir::dce(*s.function), ins, size, options.name);
  return {vmap_outputs(std::move(outs), size, options.out), std::move(s.out_def)};
}

}  // namespace detail

namespace batching {

// A collective over the axis takes its batching rule even with unbatched inputs, since its
// result depends on the axis; so does an equation whose sub-functions hold one.
bool uses_axis(const ir::Equation& e, std::string_view axis) {
  for (const auto& [name, value] : e.attrs.items()) {
    if (const auto* s = std::get_if<std::string>(&value); s && name == "axis_name" && *s == axis)
      return true;
    if (const auto* f = std::get_if<FunctionRef>(&value); f && *f)
      for (const ir::Equation& inner : (*f)->equations)
        if (uses_axis(inner, axis)) return true;
  }
  return false;
}

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
    std::vector<Batched> outs;
    if (!any && (axis_name.empty() || !uses_axis(e, axis_name))) {
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
