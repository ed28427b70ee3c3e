// Meshes of processes with named axes and shard_map over them (docs/DESIGN.md, "pmap and the
// distributed runtime"): each mesh axis is a vmap level whose axis spans the processes on one
// line of the mesh, each holding one position along it, so the collectives of a level run
// among that line's processes (ProcessSpan::group).
#include <numeric>
#include <set>
#include <sstream>

#include "detail/checked.h"
#include "distributed/collectives.h"
#include "distributed/runtime.h"
#include "kiln/distributed.h"
#include "kiln/impl/staging.h"

namespace kiln {
namespace distributed {

Mesh::Mesh(std::vector<MeshAxis> axes) : axes_(std::move(axes)) {
  if (axes_.empty()) fail("Mesh", "a mesh needs at least one axis: got none");
  std::set<std::string> seen;
  int64_t processes = 1;
  for (const MeshAxis& a : axes_) {
    if (a.name.empty()) fail("Mesh", "an axis has no name: got ", to_string());
    if (!seen.insert(a.name).second)
      fail("Mesh", "axis '", a.name, "' appears twice: got ", to_string());
    if (a.size < 1) fail("Mesh", "axis '", a.name, "' has size ", a.size, ": expected >= 1");
    processes = kiln::detail::checked_mul("Mesh", processes, a.size);
  }
  if (processes != process_count())
    fail("Mesh", "the mesh ", to_string(), " holds ", processes, " processes: got ",
         process_count(), " processes, expected the axis sizes to multiply to their number");
  int64_t rest = process_index();
  coords_.resize(axes_.size());
  for (std::size_t k = axes_.size(); k-- > 0;) {
    coords_[k] = rest % axes_[k].size;
    rest /= axes_[k].size;
  }
}

std::size_t Mesh::find(const std::string& axis) const {
  for (std::size_t k = 0; k < axes_.size(); ++k)
    if (axes_[k].name == axis) return k;
  fail("Mesh", "no axis '", axis, "' in the mesh ", to_string());
}

int64_t Mesh::size(const std::string& axis) const { return axes_[find(axis)].size; }
int64_t Mesh::index(const std::string& axis) const { return coords_[find(axis)]; }

std::vector<int64_t> Mesh::group(const std::string& axis) const {
  const std::size_t k = find(axis);
  int64_t stride = 1;
  for (std::size_t j = k + 1; j < axes_.size(); ++j) stride *= axes_[j].size;
  const int64_t first = process_index() - coords_[k] * stride;
  std::vector<int64_t> ranks;
  for (int64_t i = 0; i < axes_[k].size; ++i) ranks.push_back(first + i * stride);
  return ranks;
}

std::string Mesh::to_string() const {
  std::ostringstream os;
  os << "{";
  for (std::size_t k = 0; k < axes_.size(); ++k)
    os << (k ? ", " : "") << axes_[k].name << ": " << axes_[k].size;
  os << "}";
  return os.str();
}

bool Spec::names(const std::string& axis) const {
  for (const auto& d : dims)
    for (const std::string& a : d)
      if (a == axis) return true;
  return false;
}

namespace {

std::string spec_text(const Spec& s) {
  std::ostringstream os;
  os << "spec(";
  for (std::size_t d = 0; d < s.dims.size(); ++d) {
    os << (d ? ", " : "");
    if (s.dims[d].empty()) os << "none";
    for (std::size_t i = 0; i < s.dims[d].size(); ++i)
      os << (i ? "+" : "") << "'" << s.dims[d][i] << "'";
  }
  os << ")";
  return os.str();
}

// Each axis of the mesh at most once, and only the mesh's axes.
void check_spec(std::string_view op, const Spec& s, const Mesh& mesh, const std::string& what) {
  std::set<std::string> seen;
  for (const auto& d : s.dims)
    for (const std::string& a : d) {
      bool known = false;
      for (const MeshAxis& m : mesh.axes()) known = known || m.name == a;
      if (!known)
        fail(op, what, " names the axis '", a, "': got ", spec_text(s),
             ", expected axes of the mesh ", mesh.to_string());
      if (!seen.insert(a).second)
        fail(op, what, " splits over the axis '", a, "' twice: got ", spec_text(s));
    }
}

}  // namespace

Tensor local_block(const Tensor& global, const Mesh& mesh, const Spec& spec) {
  check_spec("local_block", spec, mesh, "the spec");
  if (static_cast<int>(spec.dims.size()) > global.rank())
    fail("local_block", "the spec lists ", spec.dims.size(), " dimensions: got ", spec_text(spec),
         " for ", global.type(), ", expected at most its rank");
  std::vector<Slice> slices;
  for (std::size_t d = 0; d < spec.dims.size(); ++d) {
    int64_t parts = 1, at = 0;
    for (const std::string& a : spec.dims[d]) {
      parts *= mesh.size(a);
      at = at * mesh.size(a) + mesh.index(a);
    }
    const int64_t n = global.shape()[static_cast<int>(d)];
    if (n % parts != 0)
      fail("local_block", "dimension ", d, " of ", global.type(), " does not split into ", parts,
           " equal blocks over ", spec_text(spec), " on the mesh ", mesh.to_string());
    const int64_t len = n / parts;
    slices.push_back(Slice{at * len, (at + 1) * len});
  }
  return slice(global, slices);
}

Tensor assemble(const Tensor& block, const Spec& spec) {
  if (static_cast<int>(spec.dims.size()) > block.rank())
    fail("assemble", "the spec lists ", spec.dims.size(), " dimensions: got ", spec_text(spec),
         " for ", block.type(), ", expected at most its rank");
  Tensor x = block;
  for (std::size_t d = 0; d < spec.dims.size(); ++d) {
    // Minor axis first: each gather puts its blocks in front of the ones gathered before.
    for (auto a = spec.dims[d].rbegin(); a != spec.dims[d].rend(); ++a) {
      const Tensor stacked = moveaxis(all_gather(x, *a), 0, static_cast<int64_t>(d));
      std::vector<int64_t> dims = x.shape().dims();
      dims[d] *= stacked.shape()[static_cast<int>(d)];
      x = reshape(stacked, Shape(dims));
    }
  }
  return x;
}

}  // namespace distributed

namespace detail {

using distributed::Spec;

class ShardMapCache {
 public:
  ShardMapCache(distributed::Mesh mesh, distributed::InSpecs in, distributed::OutSpecs out)
      : mesh(std::move(mesh)),
        in(std::move(in)),
        out(std::move(out)),
        jit(make_jit_cache("shard_map", std::nullopt)) {
    const int n = distributed::process_count();
    for (const distributed::MeshAxis& a : this->mesh.axes()) {
      ProcessSpan span{std::vector<int64_t>(static_cast<std::size_t>(a.size), 1),
                       static_cast<int>(this->mesh.index(a.name)), this->mesh.group(a.name)};
      std::vector<int64_t> everyone(static_cast<std::size_t>(n));
      std::iota(everyone.begin(), everyone.end(), 0);
      if (span.group == everyone) span.group.clear();  // MPI_COMM_WORLD itself
      spans.push_back(std::move(span));
    }
    for (const Spec& s : this->out.leaves)
      distributed::check_spec("shard_map", s, this->mesh, "an out spec");
  }
  distributed::Mesh mesh;
  distributed::InSpecs in;
  distributed::OutSpecs out;
  std::shared_ptr<JitCache> jit;
  std::vector<ProcessSpan> spans;  // per mesh axis
  std::set<std::size_t> checked;   // signatures whose results' replicas were checked
};

std::shared_ptr<ShardMapCache> make_shard_map_cache(distributed::Mesh mesh, distributed::InSpecs in,
                                                    distributed::OutSpecs out) {
  return std::make_shared<ShardMapCache>(std::move(mesh), std::move(in), std::move(out));
}

namespace {

// The spec of every argument leaf, checked against the leaf and the mesh.
std::vector<Spec> leaf_specs(const ShardMapCache& c, const TreeDef& def,
                             const std::vector<Tensor>& leaves) {
  const std::size_t n_args = def.children.size();
  if (c.in.args.size() != n_args)
    fail("shard_map", "in_specs has ", c.in.args.size(), " entries: got ", c.in.args.size(),
         " for a function called with ", n_args, " arguments, expected one per argument");
  std::vector<Spec> specs;
  for (std::size_t a = 0; a < n_args; ++a) {
    const std::size_t n = def.children[a].num_leaves();
    if (const auto* per_leaf = std::get_if<distributed::LeafSpecs>(&c.in.args[a])) {
      if (per_leaf->specs.size() != n)
        fail("shard_map", "the leaf specs of argument ", a, " list ", per_leaf->specs.size(),
             " specs: got ", per_leaf->specs.size(), ", expected ", n,
             " (one per tensor leaf, in flatten order)");
      specs.insert(specs.end(), per_leaf->specs.begin(), per_leaf->specs.end());
    } else {
      specs.insert(specs.end(), n, std::get<Spec>(c.in.args[a]));
    }
  }
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const std::string what = "the spec of argument leaf " + std::to_string(i);
    distributed::check_spec("shard_map", specs[i], c.mesh, what);
    if (leaves[i].defined() && static_cast<int>(specs[i].dims.size()) > leaves[i].rank())
      fail("shard_map", what, " lists ", specs[i].dims.size(), " dimensions: got ",
           distributed::spec_text(specs[i]), " for ", leaves[i].type(),
           ", expected at most its rank");
  }
  return specs;
}

// How many of the mesh's axes a spec names: the unit axes a leaf carries through the levels.
int named_axes(const distributed::Mesh& mesh, const Spec& s) {
  int n = 0;
  for (const distributed::MeshAxis& a : mesh.axes()) n += s.names(a.name);
  return n;
}

// Which of f's results differ between the processes along `axis`, given which parameters do:
// JAX's replication check. A value varies when an input does, except that psum, pmax, pmin
// and all_gather over the axis give every process the same; axis_index, ppermute, all_to_all
// and psum_scatter over it vary; a sub-function that uses the axis varies (conservatively).
std::vector<bool> varying_results(const ir::Function& f, const std::vector<bool>& params,
                                  const std::string& axis) {
  std::vector<bool> varies(static_cast<std::size_t>(f.next_id()), false);
  for (std::size_t i = 0; i < params.size() && i < f.params.size(); ++i)
    varies[static_cast<std::size_t>(f.params[i].id)] = params[i];
  static const std::set<std::string> same_everywhere = {"psum", "pmax", "pmin", "all_gather"};
  for (const ir::Equation& e : f.equations) {
    bool out = false;
    for (const ir::Value& v : e.inputs) out = out || varies[static_cast<std::size_t>(v.id)];
    const bool own = e.attrs.has("axis_name") && e.attrs.get<std::string>("axis_name") == axis;
    if (own) {
      out = !same_everywhere.count(e.prim->name);
    } else {
      out = out || batching::uses_axis(e, axis);
    }
    for (const ir::Value& v : e.outputs) varies[static_cast<std::size_t>(v.id)] = out;
  }
  std::vector<bool> results;
  for (const ir::Value& v : f.results) results.push_back(varies[static_cast<std::size_t>(v.id)]);
  return results;
}

// Raises an Error when a result varies along a mesh axis its out spec does not name (checked
// once per signature: it stages f).
void check_replicas(const ShardMapCache& c, const TreeDef& args_def,
                    const std::vector<Tensor>& leaves, const std::vector<Spec>& specs,
                    const FlatFn& fn) {
  std::vector<std::unique_ptr<AxisScopeGuard>> scopes;
  for (std::size_t k = 0; k < c.mesh.axes().size(); ++k)
    scopes.push_back(
        std::make_unique<AxisScopeGuard>(c.mesh.axes()[k].name, c.mesh.axes()[k].size, c.spans[k]));
  const Staged s = stage("shard_map", args_def, leaves, fn);
  for (const distributed::MeshAxis& a : c.mesh.axes()) {
    std::vector<bool> params;
    for (const Spec& spec : specs) params.push_back(spec.names(a.name));
    const std::vector<bool> varies = varying_results(*s.function, params, a.name);
    if (c.out.leaves.size() != 1 && c.out.leaves.size() != varies.size())
      fail("shard_map", "out_specs has ", c.out.leaves.size(), " entries: got ",
           c.out.leaves.size(), " for ", varies.size(),
           " result leaves, expected one, or one per result leaf");
    for (std::size_t i = 0; i < varies.size(); ++i) {
      const Spec& out = c.out.leaves[c.out.leaves.size() == 1 ? 0 : i];
      if (varies[i] && !out.names(a.name))
        fail("shard_map", "result leaf ", i, " varies along the mesh axis '", a.name,
             "' that its out spec ", distributed::spec_text(out),
             " does not name: expected a spec naming it, or the result reduced (psum) or "
             "gathered (all_gather) over it");
    }
  }
}

std::size_t mix(std::size_t h, std::size_t v) {
  return h ^ (v + 0x9e3779b97f4a7c15 + (h << 6) + (h >> 2));
}

// Mesh level k and the ones inside it: a vmap over axis k spanning its line of processes, each
// leaf batched (a unit axis in front) where its spec names the axis.
FlatFn level(const ShardMapCache& c, std::size_t k, const TreeDef& args_def,
             const std::vector<Spec>& specs, const FlatFn& fn) {
  if (k == c.mesh.axes().size()) return fn;
  return [&c, k, &args_def, &specs, &fn](const std::vector<Tensor>& in, TreeDef& out_def) {
    const std::string& axis = c.mesh.axes()[k].name;
    VmapOptions o;
    o.name = axis;
    o.processes = c.spans[k];
    InAxes in_axes;
    std::size_t leaf = 0;
    for (const TreeDef& arg : args_def.children) {
      LeafAxes per_leaf;
      for (std::size_t i = 0; i < arg.num_leaves(); ++i, ++leaf)
        per_leaf.axes.push_back(specs[leaf].names(axis) ? std::optional<int>(0) : std::nullopt);
      in_axes.axes.emplace_back(std::move(per_leaf));
    }
    o.in = std::move(in_axes);
    OutAxes out_axes;
    for (const Spec& s : c.out.leaves)
      out_axes.axes.push_back(s.names(axis) ? std::optional<int>(0) : std::nullopt);
    o.out = std::move(out_axes);
    // Replicas along this axis: grad of the whole shard_map treats each replicated argument
    // as one value (its gradient adds up every process's part) and each replicated result as
    // one value held by every process (each copy gets its share of the cotangent).
    const ProcessSpan& span = c.spans[k];
    const bool spread = span.sizes.size() > 1;
    std::vector<Tensor> args = in;
    for (std::size_t i = 0; i < args.size(); ++i)
      if (spread && args[i].defined() && !specs[i].names(axis))
        args[i] = distributed::broadcast_over(args[i], span, axis);
    FlatTree r = vmap_call(o, args_def, args, level(c, k + 1, args_def, specs, fn));
    for (std::size_t i = 0; i < r.leaves.size(); ++i) {
      const Spec& s = c.out.leaves[c.out.leaves.size() == 1 ? 0 : i];
      if (spread && r.leaves[i].defined() && !s.names(axis))
        r.leaves[i] = distributed::replicated_over(r.leaves[i], span, axis);
    }
    out_def = std::move(r.def);
    return std::move(r.leaves);
  };
}

}  // namespace

FlatTree shard_map_call(ShardMapCache& c, const TreeDef& args_def,
                        const std::vector<Tensor>& leaves, const FlatFn& fn) {
  if (const AxisScope* outer = find_process_axis())
    fail("shard_map", "nested: got a shard_map inside a pmap or shard_map over '", outer->name,
         "', expected one at a time (give the outer one's axes to the mesh)");
  const std::vector<Spec> specs = leaf_specs(c, args_def, leaves);
  // Every process must bring the same mesh (its lines' communicators are made together) and
  // blocks of the same structure, dtypes and shapes.
  std::size_t h = mix(args_def.hash(), std::hash<std::string>{}(c.mesh.to_string()));
  for (const Tensor& t : leaves) {
    h = mix(h, t.defined() ? static_cast<std::size_t>(t.dtype()) : 0xdead);
    if (t.defined())
      for (int d = 0; d < t.rank(); ++d) h = mix(h, static_cast<std::size_t>(t.shape()[d]));
  }
  distributed::exchange_sizes(
      1, h,
      [&] {
        std::string text = args_def.to_string() + " with (";
        for (std::size_t i = 0; i < leaves.size(); ++i)
          text += (i ? ", " : "") +
                  (leaves[i].defined() ? leaves[i].type().to_string() : std::string("undefined"));
        return text + ")";
      },
      "shard_map");
  if (!c.checked.count(h)) {
    check_replicas(c, args_def, leaves, specs, fn);
    c.checked.insert(h);  // only once it passed: a failed check fails again
  }
  std::vector<Tensor> in;
  for (std::size_t i = 0; i < leaves.size(); ++i) {
    const int units = named_axes(c.mesh, specs[i]);
    if (!leaves[i].defined() || units == 0) {
      in.push_back(leaves[i]);
      continue;
    }
    std::vector<int64_t> dims(static_cast<std::size_t>(units), 1);
    for (int64_t n : leaves[i].shape().dims()) dims.push_back(n);
    in.push_back(reshape(leaves[i], Shape(dims)));
  }
  FlatTree r = jit_call(*c.jit, args_def, in, level(c, 0, args_def, specs, fn));
  for (std::size_t i = 0; i < r.leaves.size(); ++i) {
    const Spec& s = c.out.leaves[c.out.leaves.size() == 1 ? 0 : i];
    const int units = named_axes(c.mesh, s);
    if (units == 0 || !r.leaves[i].defined()) continue;
    const std::vector<int64_t>& d = r.leaves[i].shape().dims();
    r.leaves[i] = reshape(r.leaves[i], Shape(std::vector<int64_t>(d.begin() + units, d.end())));
  }
  return r;
}

}  // namespace detail
}  // namespace kiln
