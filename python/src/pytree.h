// Internal to kiln._kiln: Python values as trees (tree.cpp), shared by the transformations
// (transforms.cpp) and control flow (control_flow.cpp). See docs/PYTHON.md, "Pytrees".
//
// A Python tree flattens to its leaves and a kiln::TreeDef that describes it completely, so
// that TreeDef is at once the Python-side treedef (kiln.tree.TreeDef wraps it; unflatten
// rebuilds the Python value from it alone) and what the staging core keys caches and names
// parameters by:
//   kiln.Tensor, NumPy array, Python or NumPy scalar -> leaf (any other object is a leaf too,
//                               which to_tensor rejects when it enters a transformation)
//   None       -> optional with no child        str -> static leaf (jit specialises on it)
//   list       -> vector      tuple -> tuple    dict -> map, keys sorted (non-str keys interned)
//   namedtuple, dataclass, kiln.tree.register'd type, bound C++ tree (NativeTree)
//              -> structure whose type_name is "Name#k", k the type's index in the registry
// Static values that are not strings (static dataclass fields, registered types' aux data,
// static_argnums) are interned: a static leaf holding their index in a table that keeps them.
#pragma once

#include <span>
#include <vector>

#include "bindings.h"

namespace kiln::python::pytree {

// How deeply containers may nest in a tree flattened from Python: flatten raises kiln.Error past
// it (and for a tree that contains itself), so that neither it nor any walk over the TreeDef it
// makes can run out of stack. Python's own default recursion limit.
inline constexpr int kMaxTreeDepth = 1000;

// Appends the leaves of `value` as they are. is_leaf (kiln.tree's predicate; null or None for
// none) makes leaves of the nodes for which it returns true.
TreeDef flatten(py::handle value, std::vector<py::object>& leaves, py::handle is_leaf = {});
// Appends the leaves of `value` as Tensors (to_tensor): how values enter a transformation.
TreeDef flatten_tensors(py::handle value, std::vector<Tensor>& leaves);
// `value` flattened, its leaves as Tensors.
detail::FlatTree flatten_tree(py::handle value);
// The Python value of `def` with these leaves (exactly def.num_leaves() of them).
py::object unflatten(const TreeDef& def, std::span<const py::object> leaves);
py::object unflatten_tensors(const TreeDef& def, std::span<const Tensor> leaves);

// A static leaf for `value`: strings by value, other hashable objects interned.
TreeDef static_leaf(py::handle value);
// The Python object of a static leaf made by static_leaf.
py::object static_value(const TreeDef& def);

// A tuple node with `def` as its one child: the argument tuple of a one-argument call.
TreeDef one_arg(TreeDef def);

// The one adaptor of Python callables to the staging core: f(*args, **kwargs) on the leaves of
// the argument tuple `args_def`, its result flattened. Like the core's flat_fn (staging.h) it
// refers to f, args_def and kwargs (nothing is copied on jit's hot path), so it must not outlive
// them: the core uses a FlatFn only within the call it was given to. A Python exception in f
// crosses Kiln's C++ as py::error_already_set.
detail::FlatFn python_fn(const py::object& f, const TreeDef& args_def,
                         const py::dict* kwargs = nullptr);
detail::FlatFn python_fn(py::object&& f, const TreeDef& args_def,
                         const py::dict* kwargs = nullptr) = delete;  // it would dangle
detail::FlatFn python_fn(const py::object& f, TreeDef&& args_def,
                         const py::dict* kwargs = nullptr) = delete;

// `prefix` is a tree prefix of the tree `def` describes (in_axes, out_axes): calls
// emit(leaf of prefix) once for every leaf of `def` under it, in flatten order.
void broadcast_prefix(std::string_view op, py::handle prefix, const TreeDef& def,
                      const std::function<void(py::handle)>& emit);

}  // namespace kiln::python::pytree
