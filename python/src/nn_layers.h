// Internal to the Python module: what the files binding kiln.nn's layers (nn.cpp, nn_conv.cpp)
// share.
#pragma once

#include <optional>
#include <string>

#include "bindings.h"

namespace kiln::python {

inline DType dtype_or_f32(py::handle dtype) { return dtype.is_none() ? float32 : to_dtype(dtype); }

inline py::object tensor_or_none(const std::optional<Tensor>& t) {
  if (!t || !t->defined()) return py::none();
  return py::cast(*t);
}

inline std::string type_text(const std::optional<Tensor>& t) {
  return t && t->defined() ? t->type().to_string() : "None";
}

// A tensor-valued field as a Python property: a Tensor, or None when the optional is empty.
template <class T>
void tensor_property(py::class_<T>& cls, const char* name, std::optional<Tensor> T::*member,
                     const char* doc) {
  cls.def_property(
      name, [member](const T& self) { return tensor_or_none(self.*member); },
      [member](T& self, py::handle v) { self.*member = optional_tensor(v); }, doc);
}
template <class T>
void tensor_property(py::class_<T>& cls, const char* name, Tensor T::*member, const char* doc) {
  cls.def_property(
      name, [member](const T& self) { return self.*member; },
      [member](T& self, py::handle v) { self.*member = to_tensor(v); }, doc);
}

// The bound struct's class with value semantics: copy, and registration as a pytree.
template <class T>
py::class_<T> layer_class(py::module_& m, const char* name, const char* doc) {
  py::class_<T> cls(m, name, doc);
  cls.def("__copy__", [](const T& self) { return T(self); });
  cls.def(
      "__deepcopy__", [](const T& self, py::handle) { return T(self); }, py::arg("memo"));
  register_native_tree(cls);
  return cls;
}
// kiln.nn's convolution layers (nn_conv.cpp), bound into the submodule by bind_nn.
void bind_nn_conv(py::module_& nn);

}  // namespace kiln::python
