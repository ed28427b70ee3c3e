// The registry of Python types whose values are C++ trees (bindings.h, NativeTree).
#include <unordered_map>

#include "bindings.h"

namespace kiln::python {
namespace {
// Keyed by the type object, which a bound class keeps alive for the module's lifetime.
std::unordered_map<PyObject*, NativeTree>& native_trees() {
  static std::unordered_map<PyObject*, NativeTree> trees;
  return trees;
}
}  // namespace

void register_native_tree(py::handle type, NativeTree tree) {
  native_trees()[type.ptr()] = std::move(tree);
}

const NativeTree* find_native_tree(py::handle type) {
  auto it = native_trees().find(type.ptr());
  return it == native_trees().end() ? nullptr : &it->second;
}

}  // namespace kiln::python
