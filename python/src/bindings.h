// Internal to the Python module kiln._kiln (docs/PYTHON.md): what its files share. Each file
// binds one part of Kiln's API; module.cpp calls them in order.
#pragma once

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <functional>
#include <optional>
#include <span>
#include <string>

#include "kiln/kiln.h"

namespace kiln::python {
// True for a kiln.Tensor (or subclass) instance made by __new__ without __init__: it holds no
// Tensor, and pybind11 would hand bindings uninitialised memory for it.
bool is_uninitialised_tensor(PyObject* o);
}  // namespace kiln::python

// Every binding that takes a Tensor (arguments, `self`, py::cast) refuses an uninitialised
// instance with a TypeError.
namespace pybind11::detail {
template <>
class type_caster<kiln::Tensor> : public type_caster_base<kiln::Tensor> {
 public:
  bool load(handle src, bool convert) {
    if (kiln::python::is_uninitialised_tensor(src.ptr()))
      throw type_error("kiln.Tensor used before its __init__");
    return type_caster_base<kiln::Tensor>::load(src, convert);
  }
};
}  // namespace pybind11::detail

namespace kiln::python {

namespace py = pybind11;

// One function per part of the API, each in the file of its name; module.cpp calls them in
// this order.
void bind_errors(py::module_& m);        // kiln.Error
void bind_tensor(py::module_& m);        // kiln.Tensor, dtypes, asarray, NumPy's buffers
void bind_dlpack(py::module_& m);        // __dlpack__, from_dlpack
void bind_ops(py::module_& m);           // the operations, on the top level
void bind_random(py::module_& m);        // kiln.random
void bind_tree(py::module_& m);          // pytrees, kiln.tree
void bind_transforms(py::module_& m);    // grad, vjp, jvp, vmap, jit, ...; collectives
void bind_control_flow(py::module_& m);  // cond, switch, while_loop, fori_loop, scan
void bind_nn(py::module_& m);            // kiln.nn
void bind_optim(py::module_& m);         // kiln.optim
void bind_data(py::module_& m);          // kiln.data
void bind_io(py::module_& m);            // kiln.io: safetensors
void bind_fft(py::module_& m);           // kiln.fft: numpy.fft
void bind_profile(py::module_& m);       // kiln.profile, kiln.machine_peak
void bind_distributed(py::module_& m);   // meshes, specs, shard_map
// Parts of kiln.nn that bind_nn calls with the submodule: the recurrent layers
// (nn_recurrent.cpp), the transformer layers (nn_transformer.cpp) and the convolution layers
// (nn_conv.cpp).
void bind_nn_recurrent(py::module_& nn);
void bind_nn_transformer(py::module_& nn);
void bind_nn_conv(py::module_& nn);
// kiln.data.BpeTokenizer (tokenizer.cpp), which bind_data calls with the submodule.
void bind_tokenizer(py::module_& data);

// An Error's message for Python: Kiln's C++ location replaced by the user's Python line.
std::string python_message(const Error& e);

// A Python value as a Tensor. A kiln.Tensor is taken as is; an object with the buffer protocol
// or __array_interface__ (a NumPy array) shares its memory when Kiln can view it (a supported
// dtype, strides in whole elements) and is copied otherwise; Python scalars and nested lists are
// copied (bool -> bool, int -> int32, float -> float32, as JAX does). `dtype` converts.
Tensor to_tensor(py::handle value, std::optional<DType> dtype = std::nullopt);
// kiln.tree.flatten's leaves (Tensors, arrays, scalars) as Tensors, each through to_tensor.
std::vector<Tensor> to_leaves(const std::vector<py::object>& leaves);
// An operand next to `like` in arithmetic: a Python scalar is weakly typed (`x * 2.0` keeps x's
// dtype, as in C++); anything else goes through to_tensor.
Tensor operand(py::handle value, const Tensor& like);
// kiln.float32, a NumPy dtype or type, a name ("float32"), or Python's bool, int or float.
DType to_dtype(py::handle value);
// The Python object for a dtype (kiln.float32, ...).
py::object dtype_object(DType dtype);

// Python types whose values are C++ trees (nn layers, optimiser states; kiln/tree.h): the pytree
// code flattens them into Tensor leaves and a TreeDef, and rebuilds them from those.
struct NativeTree {
  std::function<detail::FlatTree(py::handle value)> flatten;
  std::function<py::object(const TreeDef& def, std::span<const Tensor> leaves)> unflatten;
};
void register_native_tree(py::handle type, NativeTree tree);
// nullptr when `type` is not registered.
const NativeTree* find_native_tree(py::handle type);
// Registers a bound C++ tree type T.
template <class T>
void register_native_tree(const py::class_<T>& cls) {
  register_native_tree(cls, NativeTree{
                                .flatten =
                                    [](py::handle value) {
                                      auto [leaves, def] = tree_flatten(value.cast<const T&>());
                                      return detail::FlatTree{std::move(leaves), std::move(def)};
                                    },
                                .unflatten =
                                    [](const TreeDef& def, std::span<const Tensor> leaves) {
                                      return py::cast(tree_unflatten<T>(def, leaves));
                                    },
                            });
}

// Runs `f`, Kiln's C++ only (arguments converted before), with the GIL released: the long
// operations (matmul, einsum, tensordot, convolutions, kiln.linalg, kiln.fft) let other Python
// threads run meanwhile.
template <class F>
auto without_gil(F&& f) {
  py::gil_scoped_release released;
  return f();
}

// ---- py-tensor: what tensor.cpp, ops.cpp, random.cpp and dlpack.cpp share ----
// The Tensor a Python object holds, or nullptr when it is not a kiln.Tensor (fast: no lookup).
const Tensor* tensor_ptr(py::handle value);
// A shape from an int or a sequence of ints.
Shape to_shape(py::handle value);
// None -> nullopt (all axes); an int or a sequence of ints -> those axes (possibly none).
std::optional<Axes> to_axes(py::handle value);
// None -> nullopt, else to_dtype.
std::optional<DType> to_optional_dtype(py::handle value);
// None -> nullopt, else to_tensor.
inline std::optional<Tensor> optional_tensor(py::handle value) {
  if (value.is_none()) return std::nullopt;
  return to_tensor(value);
}
// The operands of a binary operation: a Python scalar is weakly typed next to the other one.
std::pair<Tensor, Tensor> operands(py::handle a, py::handle b);
// A Python int from an index-like object (int, NumPy integer, 0-d integer tensor).
int64_t to_int(py::handle value);
// True for a Python int (not a bool) or a NumPy integer scalar: not an array or a tensor.
bool is_int(py::handle value);
// A copy of a concrete tensor's values in new contiguous memory.
Tensor copy_of(const Tensor& t);
// True when a concrete tensor views read-only memory (a read-only NumPy array, bytes): what
// exports it must not let anyone write to.
bool is_read_only(const Tensor& t);
// Python's `/` (numpy.true_divide): integers and bools divide as floats.
Tensor true_divide(const Tensor& a, const Tensor& b, Loc loc);
// A convolution's int-or-tuple argument (PyTorch's): one int for every spatial axis, or N ints.
template <int N>
ConvSizes<N> to_conv_sizes(py::handle value, const char* op, const char* what);
// A convolution's padding: as to_conv_sizes, or PyTorch's strings "valid" and "same".
template <int N>
ConvPadding<N> to_conv_padding(py::handle value, const char* op);
// py-nn: the names of a pytree's leaves (its TreeDef from pytree::flatten), as kiln::tree_names
// gives them for C++ trees ("layers.0.weight"): checkpoints' keys and optimiser messages.
std::vector<std::string> leaf_names(const TreeDef& def);
// py-transforms: what a transformation or a control-flow construct calls for the Python function
// f (transforms.cpp): while kiln.jit traces, f with its Python control flow converted
// (kiln.autograph's hook), else f.
py::object entering(const py::object& f);
// Python's repr of v, for error messages (errors.cpp).
std::string repr_of(py::handle v);
// py-transforms: a callable running `call`, with f's functools metadata (transforms.cpp).
py::object wrap(py::handle f, std::function<py::object(const py::args&, const py::kwargs&)> call);

}  // namespace kiln::python
