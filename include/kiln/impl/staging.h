// Internal: the one staging path every transformation enters (docs/DESIGN.md, "Staging").
// Not part of the API users read; included by kiln/transforms.h and kiln/control_flow.h.
//
// The core is not a template: it works on flat lists of tensors, a TreeDef for their
// structure (static leaves included) and a FlatFn. The typed front ends flatten their
// arguments, build a FlatFn from the user's callable and unflatten what the core returns; a
// Python binding or pmap calls the same core with FlatFns of their own.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/ir.h"
#include "kiln/tree.h"

namespace kiln::detail {

// A function on flat tensors: the leaves of its arguments in, the leaves of its result out;
// it sets `out_def` to the structure of its result.
using FlatFn = std::function<std::vector<Tensor>(const std::vector<Tensor>&, TreeDef& out_def)>;

// A tree, flattened.
struct FlatTree {
  std::vector<Tensor> leaves;
  TreeDef def;
};

// A traced function: its parameters are the argument leaves, then `captures`, the values of
// enclosing traces it closes over (to be passed along with the leaves).
struct Staged {
  std::shared_ptr<const ir::Function> function;
  std::vector<Tensor> captures;
  TreeDef out_def;
  // The function's full argument list for these argument leaves.
  std::vector<Tensor> inputs(std::span<const Tensor> leaves) const;
};

// Traces fn on abstract values of the argument leaves' types; parameters are named after
// their tree paths in args_def. An Error names `name` if a leaf is undefined.
Staged stage(std::string name, const TreeDef& args_def, std::span<const Tensor> leaves,
             const FlatFn& fn);
// The same on bare types (control flow: bodies whose arguments are a carry).
Staged stage(std::string name, const std::vector<TensorType>& types, const FlatFn& fn);

// The types of the leaves; an Error names `op` if one is undefined.
std::vector<TensorType> leaf_types(std::string_view op, std::span<const Tensor> leaves);
// Parameter names for the flattened leaves of an argument tuple: "[1].w" -> "w", "[0]" -> "arg0".
std::vector<std::string> param_names(const TreeDef& args_def);
// The leaf range [begin, end) of each argument of a flattened argument tuple.
struct LeafRange {
  std::size_t begin = 0, end = 0;
  std::size_t size() const { return end - begin; }
};
std::vector<LeafRange> arg_ranges(const TreeDef& args_def);

// ---- typed front end -----------------------------------------------------------------------

// Flattens an argument list as the tree std::tuple<Args...>, without copying the arguments.
template <class... Args>
FlatTree flatten_args(const Args&... args) {
  FlatTree out;
  out.def.kind = TreeDef::Kind::tuple;
  auto add = [&](const auto& a) {
    auto [leaves, def] = tree_flatten(a);
    out.leaves.insert(out.leaves.end(), leaves.begin(), leaves.end());
    out.def.children.push_back(std::move(def));
  };
  (add(args), ...);
  return out;
}

// f can be called with these arguments and returns a tree of tensors. The transformations
// check it first, so a wrong function gives one static_assert line, not pages of templates.
template <class F, class... Args>
concept returns_tree = std::is_invocable_v<F, const Args&...> &&
    Tree<std::decay_t<std::invoke_result_t<F, const Args&...>>>;
#define KILN_DETAIL_NOT_TREE_FN                                                           \
  "the function must be callable with these arguments and return a tree of tensors (see " \
  "docs/TREES.md)"

template <class F, class... Args>
using result_of = std::decay_t<std::invoke_result_t<const F&, const Args&...>>;

// f as a FlatFn over the argument tuple described by args_def (f may be const or not). It
// refers to f and args_def, so it must not outlive them: the transformations use it within
// the call that made it (a jit call makes one per call; copying nothing keeps that cheap).
template <class... Args, class F>
FlatFn flat_fn(F& f, const TreeDef& args_def) {
  return [&f, &args_def](const std::vector<Tensor>& in, TreeDef& out_def) {
    auto args = tree_unflatten<std::tuple<std::decay_t<Args>...>>(args_def, in);
    auto [leaves, def] = tree_flatten(std::apply(f, args));
    out_def = std::move(def);
    return leaves;
  };
}
template <class... Args, class F>
FlatFn flat_fn(F& f, TreeDef&& args_def) = delete;  // it would dangle

// The K-th argument's leaves of a flattened argument tuple, as that argument's type.
template <class A>
A unflatten_arg(const TreeDef& args_def, std::size_t k, std::span<const Tensor> leaves) {
  return tree_unflatten<std::decay_t<A>>(args_def.children.at(k), leaves);
}

}  // namespace kiln::detail
