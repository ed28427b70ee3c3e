// The one staging path (docs/DESIGN.md, "Staging"): every transformation traces its function here.
#include "kiln/impl/staging.h"

#include <cctype>

namespace kiln::detail {

std::vector<Tensor> Staged::inputs(std::span<const Tensor> leaves) const {
  std::vector<Tensor> all(leaves.begin(), leaves.end());
  all.insert(all.end(), captures.begin(), captures.end());
  return all;
}

std::vector<TensorType> leaf_types(std::string_view op, std::span<const Tensor> leaves) {
  std::vector<TensorType> types;
  for (const Tensor& t : leaves) {
    if (!t.defined())
      fail(op,
           "undefined tensor in the arguments: got a default-constructed Tensor, "
           "expected every tensor argument to hold a value");
    types.push_back(t.type());
  }
  return types;
}

std::vector<std::string> param_names(const TreeDef& args_def) {
  std::vector<std::string> out;
  for (const std::string& path : tree_paths(args_def)) {
    // "[1].w" -> "w"; "[0]" -> "arg0"; "[2][\"k\"].b" -> "k_b".
    const std::size_t close = path.find(']');
    std::string rest = close == std::string::npos ? path : path.substr(close + 1);
    std::string name;
    for (char c : rest) {
      if (std::isalnum(static_cast<unsigned char>(c))) {
        name += c;
      } else if (!name.empty() && name.back() != '_') {
        name += '_';
      }
    }
    while (!name.empty() && name.back() == '_') name.pop_back();
    if (name.empty() || std::isdigit(static_cast<unsigned char>(name[0])))
      name = "arg" + path.substr(1, close == std::string::npos ? 0 : close - 1) +
             (name.empty() ? "" : "_" + name);
    out.push_back(name);
  }
  return out;
}

TreeDef tuple_of(std::vector<TreeDef> children) {
  TreeDef d;
  d.kind = TreeDef::Kind::tuple;
  d.children = std::move(children);
  return d;
}

std::vector<TensorType> types_of(std::span<const Tensor> ts) {
  std::vector<TensorType> r;
  for (const Tensor& t : ts) r.push_back(t.type());
  return r;
}

std::vector<LeafRange> arg_ranges(const TreeDef& args_def) {
  std::vector<LeafRange> r;
  std::size_t at = 0;
  for (const TreeDef& c : args_def.children) {
    r.push_back({at, at + c.num_leaves()});
    at += c.num_leaves();
  }
  return r;
}

namespace {
Staged stage_types(std::string name, const std::vector<TensorType>& types, const FlatFn& fn,
                   const std::vector<std::string>& names) {
  Staged s;
  ir::Traced t = ir::trace_function(
      std::move(name), types,
      [&](const std::vector<Tensor>& params) { return fn(params, s.out_def); }, names);
  s.function = std::move(t.function);
  s.captures = std::move(t.captures);
  return s;
}
}  // namespace

Staged stage(std::string name, const TreeDef& args_def, std::span<const Tensor> leaves,
             const FlatFn& fn) {
  const std::vector<TensorType> types = leaf_types(name, leaves);
  return stage_types(std::move(name), types, fn, param_names(args_def));
}

Staged stage(std::string name, const std::vector<TensorType>& types, const FlatFn& fn) {
  return stage_types(std::move(name), types, fn, {});
}

}  // namespace kiln::detail
