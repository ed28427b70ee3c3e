// Jacobians of flat trees: jacfwd maps jvp over the basis of the chosen argument leaves and
// jacrev maps the pullback over the basis of the result leaves, each with one vmap.
#include "detail/checked.h"
#include "transforms/core.h"

namespace kiln::detail {
namespace {

struct Picked {
  std::vector<std::size_t> leaves;  // indices into the argument leaves, in argnums order
  std::vector<TensorType> types;
};

Picked pick(std::string_view op, const std::vector<int>& argnums, const TreeDef& args_def,
            const std::vector<Tensor>& leaves) {
  const std::vector<TensorType> types = leaf_types(op, leaves);
  Picked p;
  for (std::size_t i = 0; i < argnums.size(); ++i)
    for (std::size_t j = 0; j < i; ++j)
      if (argnums[i] == argnums[j])
        fail(op, "argnums repeats an argument: got ", argnums[i], " twice, expected each once");
  const std::vector<std::string> paths = tree_paths(args_def);
  for (const LeafRange& r : picked_ranges(op, argnums, args_def))
    for (std::size_t k = r.begin; k < r.end; ++k) {
      if (!is_floating(types[k].dtype))
        fail(op, "cannot differentiate with respect to argument leaf ", paths[k], ": got ",
             types[k], ", expected a floating dtype");
      p.leaves.push_back(k);
      p.types.push_back(types[k]);
    }
  return p;
}

int64_t total_numel(std::string_view op, const std::vector<TensorType>& types) {
  int64_t n = 0;
  for (const TensorType& t : types) n = checked_add(op, n, t.shape.numel());
  return n;
}

// The rows of eye(n) for each type in turn, shaped [n, *type.shape]: together the standard
// basis of the flattened, concatenated tensors.
std::vector<Tensor> basis(const std::vector<TensorType>& types, int64_t n) {
  std::vector<Tensor> out;
  int64_t at = 0;
  for (const TensorType& t : types) {
    const int64_t k = t.shape.numel();
    std::vector<int64_t> shape{n};
    shape.insert(shape.end(), t.shape.begin(), t.shape.end());
    out.push_back(reshape(slice(eye(n, n, t.dtype), {Slice{}, Slice{at, at + k}}), Shape(shape)));
    at += k;
  }
  return out;
}

std::vector<int64_t> concat_dims(const Shape& a, const Shape& b) {
  std::vector<int64_t> d = a.dims();
  d.insert(d.end(), b.begin(), b.end());
  return d;
}

// Rows [at, at + k) of a stacked [n, ...] tensor.
Tensor rows(const Tensor& stacked, int64_t at, int64_t k) {
  return slice(stacked, {Slice{at, at + k}});
}

}  // namespace

FlatJacobian jacfwd_call(const std::vector<int>& argnums, const TreeDef& args_def,
                         const std::vector<Tensor>& leaves, const FlatFn& fn) {
  const Picked p = pick("jacfwd", argnums, args_def, leaves);
  const int64_t n = total_numel("jacfwd", p.types);
  // Columns of J, one per basis vector: vmap over the tangents of the picked leaves, the
  // primals shared (unbatched).
  FlatJacobian j;
  const FlatFn column = [&](const std::vector<Tensor>& in, TreeDef& out_def) {
    const std::vector<Tensor> primals(in.begin(),
                                      in.begin() + static_cast<std::ptrdiff_t>(leaves.size()));
    std::vector<Tangent> tangents(leaves.size());
    for (std::size_t i = 0; i < p.leaves.size(); ++i) tangents[p.leaves[i]] = in[leaves.size() + i];
    JvpFlat r = jvp_along(args_def, primals, std::move(tangents), fn);
    out_def = r.out.def;
    return r.tangents;
  };
  std::vector<TreeDef> one_leaf(p.leaves.size());
  std::vector<Tensor> ins = leaves;
  const std::vector<Tensor> b = basis(p.types, n);
  ins.insert(ins.end(), b.begin(), b.end());
  VmapOptions o;
  o.in = InAxes{{std::optional<int>(), std::optional<int>(0)}};
  const FlatTree cols = vmap_call(o, tuple_of({args_def, tuple_of(one_leaf)}), ins, column);
  j.out_def = cols.def;
  for (const Tensor& c : cols.leaves) {
    const Shape out(std::vector<int64_t>(c.shape().begin() + 1, c.shape().end()));
    int64_t at = 0;
    for (const TensorType& t : p.types) {
      const int64_t k = t.shape.numel();
      // [k, *out] -> [*out, *in]
      const Tensor m = transpose(reshape(rows(c, at, k), {k, out.numel()}));
      j.blocks.push_back(reshape(m, Shape(concat_dims(out, t.shape))));
      at += k;
    }
  }
  return j;
}

FlatJacobian jacrev_call(const std::vector<int>& argnums, const TreeDef& args_def,
                         const std::vector<Tensor>& leaves, const FlatFn& fn) {
  const Picked p = pick("jacrev", argnums, args_def, leaves);
  VjpFlat r = vjp_call(args_def, leaves, fn);
  const std::vector<TensorType> out_types = types_of(r.out.leaves);
  const int64_t m = total_numel("jacrev", out_types);
  // Rows of J, one per basis vector of the result: vmap over the pullback's cotangents.
  const FlatFn row = [&](const std::vector<Tensor>& ct, TreeDef& out_def) {
    const std::vector<Tensor> all = r.pullback(ct, r.out.def);
    std::vector<Tensor> picked;
    for (const std::size_t k : p.leaves) picked.push_back(all[k]);
    out_def = tuple_of(std::vector<TreeDef>(picked.size()));
    return picked;
  };
  const FlatTree rws = vmap_call({}, tuple_of({r.out.def}), basis(out_types, m), row);
  FlatJacobian j{.out_def = r.out.def, .blocks = {}};
  int64_t at = 0;
  for (const TensorType& o : out_types) {
    const int64_t k = o.shape.numel();
    for (std::size_t i = 0; i < p.types.size(); ++i)  // [k, *in] -> [*out, *in]
      j.blocks.push_back(
          reshape(rows(rws.leaves[i], at, k), Shape(concat_dims(o.shape, p.types[i].shape))));
    at += k;
  }
  return j;
}

}  // namespace kiln::detail
