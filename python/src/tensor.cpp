// kiln.Tensor, the dtypes, and conversion from Python values: NumPy arrays and other buffers
// are viewed without a copy where Kiln can (docs/PYTHON.md, "Interchange").
#include <Python.h>
#include <pybind11/numpy.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bindings.h"

namespace kiln::python {
namespace {

struct DTypeName {
  DType dtype;
  const char* name;
};
constexpr DTypeName kDTypes[] = {
    {bool_, "bool_"},       {uint8, "uint8"},     {uint32, "uint32"},
    {int32, "int32"},       {int64, "int64"},     {float16, "float16"},
    {bfloat16, "bfloat16"}, {float32, "float32"}, {float64, "float64"},
};

// The dtype of a buffer's struct-module format character, if Kiln has it.
std::optional<DType> dtype_of_format(std::string_view format, py::ssize_t itemsize) {
  if (!format.empty() && (format[0] == '<' || format[0] == '=' || format[0] == '@'))
    format.remove_prefix(1);
  if (format.size() != 1) return std::nullopt;
  switch (format[0]) {
    case '?':
      return bool_;
    case 'B':
      return uint8;
    case 'e':
      return float16;
    case 'f':
      return float32;
    case 'd':
      return float64;
    case 'i':
    case 'l':
    case 'q':
    case 'I':
    case 'L':
    case 'Q': {
      const bool is_unsigned = format[0] == 'I' || format[0] == 'L' || format[0] == 'Q';
      if (is_unsigned) return itemsize == 4 ? std::optional<DType>(uint32) : std::nullopt;
      if (itemsize == 4) return int32;
      if (itemsize == 8) return int64;
      return std::nullopt;
    }
    default:
      return std::nullopt;
  }
}

const char* format_of(DType d) {
  switch (d) {
    case DType::bool_:
      return "?";
    case DType::uint8:
      return "B";
    case DType::uint32:
      return "I";
    case DType::int32:
      return "i";
    case DType::int64:
      return "q";
    case DType::float16:
      return "e";
    case DType::float32:
      return "f";
    case DType::float64:
      return "d";
    case DType::bfloat16:
      break;
  }
  return nullptr;
}

// A Py_buffer held by a Storage: released, with the GIL, when the last view of it goes.
struct HeldBuffer {
  Py_buffer view{};
  ~HeldBuffer() {
    if (!Py_IsInitialized()) return;  // the interpreter is gone: nothing left to release
    py::gil_scoped_acquire gil;
    PyBuffer_Release(&view);
  }
};

// A view of `obj`'s memory when it exports a buffer Kiln can address, else nullopt.
std::optional<Tensor> view_buffer(py::handle obj) {
  auto held = std::make_shared<HeldBuffer>();
  if (PyObject_GetBuffer(obj.ptr(), &held->view, PyBUF_RECORDS_RO) != 0) {
    PyErr_Clear();
    held->view.obj = nullptr;  // nothing to release
    return std::nullopt;
  }
  const Py_buffer& v = held->view;
  const std::optional<DType> dtype = dtype_of_format(v.format ? v.format : "B", v.itemsize);
  if (!dtype || static_cast<py::ssize_t>(dtype_size(*dtype)) != v.itemsize) return std::nullopt;
  std::vector<int64_t> dims(v.shape, v.shape + v.ndim);
  std::vector<int64_t> strides(static_cast<std::size_t>(v.ndim));
  // Kiln's storage starts at the lowest address of the view; strides may be negative.
  int64_t low = 0, high = 0;
  bool empty = false;
  for (int i = 0; i < v.ndim; ++i) {
    const py::ssize_t s = v.strides ? v.strides[i] : 0;
    if (s % v.itemsize != 0) return std::nullopt;
    strides[static_cast<std::size_t>(i)] = s / v.itemsize;
    if (dims[static_cast<std::size_t>(i)] == 0) empty = true;
    const int64_t reach = static_cast<int64_t>(s) * (dims[static_cast<std::size_t>(i)] - 1);
    (reach < 0 ? low : high) += empty ? 0 : reach;
  }
  if (!v.strides && v.ndim > 0)
    strides = [&] {
      std::vector<int64_t> c(static_cast<std::size_t>(v.ndim));
      int64_t step = 1;
      for (int i = v.ndim - 1; i >= 0; --i) {
        c[static_cast<std::size_t>(i)] = step;
        step *= dims[static_cast<std::size_t>(i)];
      }
      high = (step - 1) * v.itemsize;
      return c;
    }();
  char* base = static_cast<char*>(v.buf) + low;
  const std::size_t nbytes = empty ? 0 : static_cast<std::size_t>(high - low + v.itemsize);
  auto impl = std::make_shared<TensorImpl>();
  impl->type = TensorType{*dtype, Shape(dims)};
  impl->storage = std::make_shared<Storage>(base, nbytes, Device::cpu, held);
  impl->strides = std::move(strides);
  impl->offset = -low / v.itemsize;
  return Tensor(std::move(impl));
}

Tensor from_python_value(py::handle value, std::optional<DType> dtype) {
  if (py::isinstance<py::bool_>(value))
    return full(Shape({}), value.cast<bool>() ? 1.0 : 0.0, dtype.value_or(bool_));
  if (py::isinstance<py::int_>(value))
    return full(Shape({}), value.cast<double>(), dtype.value_or(int32));
  if (py::isinstance<py::float_>(value))
    return full(Shape({}), value.cast<double>(), dtype.value_or(float32));
  // Anything else goes through NumPy: nested lists, __array__, __array_interface__.
  py::module_ np = py::module_::import("numpy");
  py::array array = np.attr("asarray")(value);
  if (!dtype) {
    const char kind = array.dtype().kind();
    if (kind == 'f' && array.dtype().itemsize() == 8 && !py::hasattr(value, "dtype"))
      dtype = float32;  // a Python list of floats: float32, as JAX does
    else if (kind == 'i' && !py::hasattr(value, "dtype"))
      dtype = int32;
  }
  std::optional<Tensor> t = view_buffer(array);
  if (!t)
    fail("asarray", "cannot convert a value: got a Python ",
         py::str(value.get_type().attr("__name__")).cast<std::string>(), " holding NumPy dtype ",
         py::str(array.dtype()).cast<std::string>(),
         ", expected a bool, integer or floating-point array Kiln has a dtype for");
  // A temporary NumPy array: copy, so the tensor does not keep it alive.
  return dtype && *dtype != t->dtype() ? astype(*t, *dtype, Loc{})
                                       : astype(*t, t->dtype(), Loc{}).contiguous();
}

}  // namespace

Tensor to_tensor(py::handle value, std::optional<DType> dtype) {
  if (py::isinstance<Tensor>(value)) {
    const Tensor& t = value.cast<const Tensor&>();
    return dtype && *dtype != t.dtype() ? astype(t, *dtype, Loc{}) : t;
  }
  if (PyObject_CheckBuffer(value.ptr())) {
    if (std::optional<Tensor> t = view_buffer(value))
      return dtype && *dtype != t->dtype() ? astype(*t, *dtype, Loc{}) : *t;
  }
  return from_python_value(value, dtype);
}

Tensor operand(py::handle value, const Tensor& like) {
  if (py::isinstance<py::bool_>(value)) return to_tensor(value);
  if (py::isinstance<py::int_>(value)) return scalar_like(like, value.cast<double>(), false);
  if (py::isinstance<py::float_>(value)) return scalar_like(like, value.cast<double>(), true);
  return to_tensor(value);
}

DType to_dtype(py::handle value) {
  if (py::isinstance<DType>(value)) return value.cast<DType>();
  if (value.is(py::handle(reinterpret_cast<PyObject*>(&PyBool_Type)))) return bool_;
  if (value.is(py::handle(reinterpret_cast<PyObject*>(&PyLong_Type)))) return int32;
  if (value.is(py::handle(reinterpret_cast<PyObject*>(&PyFloat_Type)))) return float32;
  std::string name;
  if (py::isinstance<py::str>(value)) {
    name = value.cast<std::string>();
  } else {
    // NumPy dtypes and scalar types: numpy.dtype(value).name
    py::module_ np = py::module_::import("numpy");
    name = py::str(np.attr("dtype")(value).attr("name")).cast<std::string>();
  }
  if (name == "bool") name = "bool_";
  for (const DTypeName& d : kDTypes)
    if (name == d.name) return d.dtype;
  fail("dtype", "unknown dtype: got ", py::repr(value).cast<std::string>(),
       ", expected a kiln dtype, a NumPy dtype or one of bool_, uint8, uint32, int32, int64, "
       "float16, bfloat16, float32, float64");
}

py::object dtype_object(DType dtype) { return py::cast(dtype); }

void bind_tensor(py::module_& m) {
  py::enum_<DType> dtype(m, "dtype", "The element type of a Tensor.");
  for (const DTypeName& d : kDTypes) dtype.value(d.name, d.dtype);
  dtype.export_values();
  dtype.def_property_readonly("itemsize", [](DType d) { return dtype_size(d); });
  dtype.def("__repr__", [](DType d) {
    for (const DTypeName& n : kDTypes)
      if (n.dtype == d) return "kiln." + std::string(n.name);
    return std::string("kiln.dtype(?)");
  });

  py::class_<Tensor> tensor(m, "Tensor", py::buffer_protocol(),
                            "An n-dimensional array: eager, or traced inside a transformation.");
  tensor.def(py::init([](py::handle value, py::object dtype) {
               return to_tensor(
                   value, dtype.is_none() ? std::nullopt : std::optional<DType>(to_dtype(dtype)));
             }),
             py::arg("value"), py::arg("dtype") = py::none());
  tensor.def_property_readonly("dtype", [](const Tensor& t) { return t.dtype(); });
  tensor.def_property_readonly("shape", [](const Tensor& t) {
    py::tuple out(t.rank());
    for (int i = 0; i < t.rank(); ++i) out[i] = t.shape().dims()[static_cast<std::size_t>(i)];
    return out;
  });
  tensor.def_property_readonly("ndim", &Tensor::rank);
  tensor.def_property_readonly("size", &Tensor::numel);
  tensor.def("__repr__", [](const Tensor& t) { return to_string(t); });
  tensor.def_buffer([](const Tensor& t) {
    const char* format = format_of(t.dtype());
    if (!format)
      fail("buffer",
           "bfloat16 has no buffer format: got a bfloat16 tensor, expected another dtype (convert "
           "with astype)");
    const auto item = static_cast<py::ssize_t>(dtype_size(t.dtype()));
    std::vector<py::ssize_t> shape(t.shape().dims().begin(), t.shape().dims().end());
    std::vector<py::ssize_t> strides;
    for (int64_t s : t.strides()) strides.push_back(static_cast<py::ssize_t>(s) * item);
    return py::buffer_info(t.raw_data(), item, format, t.rank(), shape, strides, false);
  });

  m.def(
      "asarray",
      [](py::handle value, py::object dtype) {
        return to_tensor(value,
                         dtype.is_none() ? std::nullopt : std::optional<DType>(to_dtype(dtype)));
      },
      py::arg("value"), py::arg("dtype") = py::none(),
      "A Tensor of `value`, sharing its memory when it is a NumPy array Kiln can view.");
}

}  // namespace kiln::python
