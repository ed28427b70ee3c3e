// Internal to kiln._kiln: what the files binding kiln.nn share (nn.cpp, nn_conv.cpp,
// nn_recurrent.cpp, nn_transformer.cpp).
#pragma once

#include <optional>
#include <sstream>
#include <string>

#include "bindings.h"
#include "pytree.h"

namespace kiln::python {

inline DType dtype_or_f32(py::handle dtype) { return dtype.is_none() ? float32 : to_dtype(dtype); }

inline py::object tensor_or_none(const std::optional<Tensor>& t) {
  if (!t || !t->defined()) return py::none();
  return py::cast(*t);
}

inline std::string type_text(const std::optional<Tensor>& t) {
  return t && t->defined() ? t->type().to_string() : "None";
}

inline std::string number_text(double v) {
  std::ostringstream out;
  out << v;
  return out.str();
}

inline std::string bool_text(bool b) { return b ? "True" : "False"; }

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

}  // namespace kiln::python
