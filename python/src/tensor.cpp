// kiln.Tensor, the dtypes, and conversion from Python values: NumPy arrays and other buffers
// are viewed without a copy where Kiln can (docs/PYTHON.md, "Tensors, operations and interchange").
#include <Python.h>
#include <pybind11/complex.h>
#include <pybind11/numpy.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include "bindings.h"

namespace kiln::python {
namespace {

struct DTypeName {
  DType dtype;
  const char* name;
};
constexpr DTypeName kDTypes[] = {
    {bool_, "bool_"},         {uint8, "uint8"},           {uint32, "uint32"},
    {int32, "int32"},         {int64, "int64"},           {float16, "float16"},
    {bfloat16, "bfloat16"},   {float32, "float32"},       {float64, "float64"},
    {complex64, "complex64"}, {complex128, "complex128"},
};

std::string dtype_str(DType d) {
  if (d == bool_) return "bool";
  for (const DTypeName& n : kDTypes)
    if (n.dtype == d) return n.name;
  return std::string(dtype_name(d));
}

// The dtype of a buffer's struct-module format character, if Kiln has it.
std::optional<DType> dtype_of_format(std::string_view format, py::ssize_t itemsize) {
  if (!format.empty() && (format[0] == '<' || format[0] == '=' || format[0] == '@'))
    format.remove_prefix(1);
  if (format == "Zf") return complex64;
  if (format == "Zd") return complex128;
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
    case DType::complex64:
      return "Zf";
    case DType::complex128:
      return "Zd";
    case DType::bfloat16:
      break;
  }
  return nullptr;
}

// NumPy's dtype for d (NumPy reads complex formats by its own type codes, not PEP 3118's "Zf").
py::dtype numpy_dtype(DType d) {
  if (d == complex64) return py::dtype::of<std::complex<float>>();
  if (d == complex128) return py::dtype::of<std::complex<double>>();
  return py::dtype(format_of(d));
}

// The storages that view read-only memory (a read-only NumPy array or mmap, bytes). Kiln never
// writes to a tensor's memory, but its exports hand that memory to code that may: those of
// these storages are read-only. An entry lives exactly as long as its storage (the storage's
// owner, a HeldBuffer, erases it).
class ReadOnlyStorages {
 public:
  void insert(const Storage* s) {
    const std::lock_guard lock(mutex_);
    storages_.insert(s);
  }
  void erase(const Storage* s) {
    const std::lock_guard lock(mutex_);
    storages_.erase(s);
  }
  bool contains(const Storage* s) {
    const std::lock_guard lock(mutex_);
    return storages_.contains(s);
  }

 private:
  std::mutex mutex_;
  std::unordered_set<const Storage*> storages_;
};

// Never destroyed: storages may outlive the module's statics.
ReadOnlyStorages& read_only_storages() {
  static auto* s = new ReadOnlyStorages;
  return *s;
}

// A Py_buffer held by a Storage: released, with the GIL, when the last view of it goes.
struct HeldBuffer {
  Py_buffer view{};
  const Storage* read_only = nullptr;  // the storage viewing it, when view.readonly
  ~HeldBuffer() {
    if (read_only) read_only_storages().erase(read_only);
    if (!Py_IsInitialized()) return;  // the interpreter is gone: nothing left to release
    py::gil_scoped_acquire gil;
    PyBuffer_Release(&view);
  }
};

// NumPy's bool is any byte (a bool view of uint8 memory can hold 2 or 255); Kiln's is 0 or 1,
// which its kernels and compiled code rely on. A tensor viewing other bytes becomes a copy
// holding 0 and 1 (numpy's truth: any non-zero byte is True).
// The bytes are read directly, not through operations, which inside a trace (a NumPy mask
// closed over by a function under grad or jit) would be traced and have no values.
template <class F>
void for_each_byte(const Tensor& t, F f) {
  const auto* base = static_cast<const uint8_t*>(t.raw_data());
  const std::vector<int64_t>& strides = t.strides();
  std::vector<int64_t> index(static_cast<std::size_t>(t.rank()), 0);
  for (int64_t n = 0; n < t.numel(); ++n) {
    int64_t offset = 0;
    for (std::size_t i = 0; i < index.size(); ++i) offset += index[i] * strides[i];
    f(base[offset]);
    for (int i = t.rank() - 1; i >= 0; --i) {
      if (++index[static_cast<std::size_t>(i)] < t.shape()[i]) break;
      index[static_cast<std::size_t>(i)] = 0;
    }
  }
}

Tensor canonical_bools(const Tensor& t) {
  if (t.dtype() != bool_ || t.numel() == 0) return t;
  bool canonical = true;
  for_each_byte(t, [&](uint8_t b) { canonical = canonical && b <= 1; });
  if (canonical) return t;
  Tensor out = empty(t.type());
  auto* bytes = static_cast<uint8_t*>(out.raw_data());
  for_each_byte(t, [&](uint8_t b) { *bytes++ = b != 0 ? 1 : 0; });
  return out;
}

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
  if (v.readonly) {
    held->read_only = impl->storage.get();
    read_only_storages().insert(held->read_only);
  }
  return canonical_bools(Tensor(std::move(impl)));
}

}  // namespace

Tensor copy_of(const Tensor& t) {
  if (!t.is_contiguous()) return t.contiguous();
  Tensor out = empty(t.type());
  if (t.numel() > 0)
    std::memcpy(out.raw_data(), t.raw_data(),
                static_cast<std::size_t>(t.numel()) * dtype_size(t.dtype()));
  return out;
}

bool is_read_only(const Tensor& t) {
  return !t.is_traced() && read_only_storages().contains(t.storage().get());
}

namespace {

// The values an integer dtype holds, as long long (all of them fit).
struct IntegerRange {
  long long lo, hi;
};
IntegerRange range_of(DType d) {
  switch (d) {
    case DType::uint8:
      return {0, 255};
    case DType::uint32:
      return {0, 4294967295LL};
    case DType::int32:
      return {-2147483648LL, 2147483647LL};
    default:
      return {std::numeric_limits<long long>::min(), std::numeric_limits<long long>::max()};
  }
}

// The Python int `value` when the integer dtype holds it; else OverflowError, as JAX raises.
long long checked_int(py::handle value, DType dtype) {
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(value.ptr(), &overflow);
  if (v == -1 && PyErr_Occurred()) throw py::error_already_set();
  const IntegerRange range = range_of(dtype);
  if (overflow != 0 || v < range.lo || v > range.hi) {
    PyErr_Format(PyExc_OverflowError, "Python int %S too large to convert to %s", value.ptr(),
                 dtype_str(dtype).c_str());
    throw py::error_already_set();
  }
  return v;
}

// The ints of a NumPy array made from Python lists must fit the integer dtype they go to.
void check_python_ints(const py::array& array, DType dtype) {
  if (array.size() == 0) return;
  checked_int(py::int_(array.attr("min")()), dtype);
  checked_int(py::int_(array.attr("max")()), dtype);
}

// A Python int as a 0-d tensor of `dtype`, exactly: an integer dtype must hold it (else
// OverflowError), a floating or complex one gets it rounded once, as float(value) is.
Tensor int_scalar(py::handle value, DType dtype) {
  if (dtype == bool_) {
    const int truth = PyObject_IsTrue(value.ptr());
    if (truth < 0) throw py::error_already_set();
    return full(Shape{}, truth, bool_);
  }
  if (is_inexact(dtype)) {
    const double d = PyLong_AsDouble(value.ptr());
    if (d == -1.0 && PyErr_Occurred()) throw py::error_already_set();
    return full(Shape{}, d, dtype);
  }
  const long long v = checked_int(value, dtype);
  if (dtype == int64) {
    const int64_t exact = v;
    return detail::from_buffer(&exact, 1, int64, Shape{}, Loc{});
  }
  return full(Shape{}, static_cast<double>(v), dtype);  // exact: |v| < 2^32
}

// A Python complex as a 0-d tensor: complex64 by default, as JAX without x64.
Tensor complex_scalar(py::handle value, DType dtype) {
  const Py_complex c = PyComplex_AsCComplex(value.ptr());
  if (PyErr_Occurred()) throw py::error_already_set();
  const std::complex<double> v(c.real, c.imag);
  return astype(detail::from_buffer(&v, 1, complex128, Shape{}, Loc{}), dtype, Loc{});
}

Tensor from_python_value(py::handle value, std::optional<DType> dtype) {
  if (py::isinstance<py::bool_>(value))
    return full(Shape({}), value.cast<bool>() ? 1.0 : 0.0, dtype.value_or(bool_));
  if (py::isinstance<py::int_>(value)) return int_scalar(value, dtype.value_or(int32));
  if (py::isinstance<py::float_>(value))
    return full(Shape({}), value.cast<double>(), dtype.value_or(float32));
  if (PyComplex_Check(value.ptr())) return complex_scalar(value, dtype.value_or(complex64));
  // Anything else goes through NumPy: nested lists, __array__, __array_interface__.
  py::module_ np = py::module_::import("numpy");
  py::array array = np.attr("asarray")(value);
  const char kind = array.dtype().kind();
  const bool from_python = !py::hasattr(value, "dtype");  // nested lists of Python scalars
  if (!dtype && from_python) {
    if (kind == 'f' && array.dtype().itemsize() == 8)
      dtype = float32;  // a Python list of floats: float32, as JAX does
    else if (kind == 'i' || kind == 'u')
      dtype = int32;  // and of ints: int32
    else if (kind == 'c' && array.dtype().itemsize() == 16)
      dtype = complex64;  // and of complex numbers: complex64
  }
  if (from_python && (kind == 'i' || kind == 'u') && dtype && is_integral(*dtype))
    check_python_ints(array, *dtype);
  std::optional<Tensor> t = view_buffer(array);
  if (!t && (kind == 'b' || kind == 'i' || kind == 'u' || kind == 'f' || kind == 'c')) {
    // A layout Kiln cannot view (another byte order, strides that are not whole elements, as
    // a field of a structured array has): a C-ordered copy in the native byte order.
    array = np.attr("ascontiguousarray")(array, array.dtype().attr("newbyteorder")("="));
    t = view_buffer(array);
  }
  if (!t)
    fail("asarray", "cannot convert a value: got a Python ",
         py::str(value.get_type().attr("__name__")).cast<std::string>(), " holding NumPy dtype ",
         py::str(array.dtype()).cast<std::string>(),
         ", expected a bool, integer, floating-point or complex array Kiln has a dtype for");
  // A NumPy array made here (from a list, or by __array__): copied into Kiln's own (aligned)
  // memory, so that the tensor holds no Python object.
  return dtype && *dtype != t->dtype() ? astype(*t, *dtype, Loc{}) : copy_of(*t);
}

}  // namespace

Tensor to_tensor(py::handle value, std::optional<DType> dtype) {
  if (const Tensor* t = tensor_ptr(value)) return dtype ? astype(*t, *dtype, Loc{}) : *t;
  if (PyObject_CheckBuffer(value.ptr())) {
    if (std::optional<Tensor> t = view_buffer(value))
      return dtype && *dtype != t->dtype() ? astype(*t, *dtype, Loc{}) : *t;
  }
  return from_python_value(value, dtype);
}

std::vector<Tensor> to_leaves(const std::vector<py::object>& leaves) {
  std::vector<Tensor> out;
  out.reserve(leaves.size());
  for (const py::object& l : leaves) out.push_back(to_tensor(l));
  return out;
}

Tensor operand(py::handle value, const Tensor& like) {
  if (py::isinstance<py::bool_>(value)) return to_tensor(value);
  if (py::isinstance<py::int_>(value))
    return int_scalar(value, weak_scalar_dtype(like.dtype(), false));
  if (py::isinstance<py::float_>(value)) return scalar_like(like, value.cast<double>(), true);
  if (PyComplex_Check(value.ptr())) return complex_scalar(value, to_complex(like.dtype()));
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
       "float16, bfloat16, float32, float64, complex64, complex128");
}

py::object dtype_object(DType dtype) { return py::cast(dtype); }

namespace {

PyTypeObject* g_tensor_type = nullptr;  // kiln.Tensor, set by bind_tensor

bool is_python_scalar(py::handle v) {
  return PyBool_Check(v.ptr()) || PyLong_CheckExact(v.ptr()) || PyFloat_CheckExact(v.ptr()) ||
         PyLong_Check(v.ptr()) || PyFloat_Check(v.ptr()) || PyComplex_Check(v.ptr());
}

py::tuple shape_tuple(const Shape& shape) {
  py::tuple out(shape.rank());
  for (int i = 0; i < shape.rank(); ++i) out[static_cast<std::size_t>(i)] = py::int_(shape[i]);
  return out;
}

// Raises Kiln's concrete-value error (which names kiln.cond / kiln.while_loop) for a traced
// tensor: Python needs its values here.
void require_concrete(const Tensor& t) {
  if (t.is_traced()) (void)t.item<double>(Loc{});
}

// Whether an export of the tensor's memory may be written through: not when the memory is
// read-only, nor when the view repeats elements (a zero stride on an axis longer than one, as
// broadcast_to makes: numpy's broadcast_to is read-only for the same reason).
bool writable_export(const Tensor& t) {
  for (int i = 0; i < t.rank(); ++i)
    if (t.strides()[static_cast<std::size_t>(i)] == 0 && t.shape()[i] > 1) return false;
  return !is_read_only(t);
}

// The tensor's values as a NumPy array viewing its memory (bfloat16, which NumPy lacks: a
// float32 copy). The array keeps `owner`, the Python tensor, alive.
py::array numpy_view(const Tensor& t, py::handle owner) {
  require_concrete(t);
  if (t.dtype() == bfloat16) {
    Tensor f = astype(t, float32, Loc{});
    return numpy_view(f, py::cast(f));
  }
  const auto item = static_cast<py::ssize_t>(dtype_size(t.dtype()));
  std::vector<py::ssize_t> shape(t.shape().begin(), t.shape().end()), strides;
  for (int64_t s : t.strides()) strides.push_back(static_cast<py::ssize_t>(s) * item);
  py::array a(numpy_dtype(t.dtype()), std::move(shape), std::move(strides), t.raw_data(), owner);
  if (!writable_export(t)) a.attr("setflags")(py::arg("write") = false);
  return a;
}

// ---- the buffer protocol, written as CPython's slots so that no C++ exception can cross them
// (pybind11's def_buffer lets one through, and cannot refuse a traced or bfloat16 tensor).
struct BufferDims {
  std::vector<Py_ssize_t> shape, strides;
};

int tensor_getbuffer(PyObject* self, Py_buffer* view, int flags) {
  view->obj = nullptr;
  try {
    const Tensor* t = tensor_ptr(self);
    if (!t || t->is_traced() || t->dtype() == bfloat16) {
      PyErr_SetString(PyExc_BufferError,
                      !t ? "not a kiln.Tensor"
                      : t->is_traced()
                          ? "a traced tensor has no memory (inside jit, grad or vmap)"
                          : "bfloat16 has no buffer format (np.asarray converts through "
                            "__array__, to float32)");
      return -1;
    }
    const char* format = format_of(t->dtype());
    const auto item = static_cast<Py_ssize_t>(dtype_size(t->dtype()));
    auto dims = std::make_unique<BufferDims>();
    dims->shape.assign(t->shape().begin(), t->shape().end());
    for (int64_t s : t->strides()) dims->strides.push_back(static_cast<Py_ssize_t>(s) * item);
    const bool writable = writable_export(*t);
    if (!writable && (flags & PyBUF_WRITABLE) == PyBUF_WRITABLE) {
      PyErr_SetString(PyExc_BufferError,
                      "the tensor's memory is read-only (it views read-only memory, or repeats "
                      "elements through a zero stride)");
      return -1;
    }
    const bool strided = (flags & PyBUF_STRIDES) == PyBUF_STRIDES;
    if (!strided && !t->is_contiguous()) {
      PyErr_SetString(PyExc_BufferError, "the tensor is not contiguous; ask for strides");
      return -1;
    }
    view->buf = t->raw_data();
    view->len = static_cast<Py_ssize_t>(t->numel()) * item;
    view->readonly = writable ? 0 : 1;
    view->itemsize = item;
    view->format = (flags & PyBUF_FORMAT) ? const_cast<char*>(format) : nullptr;
    view->ndim = t->rank();
    view->shape = (flags & PyBUF_ND) == PyBUF_ND ? dims->shape.data() : nullptr;
    view->strides = strided ? dims->strides.data() : nullptr;
    view->suboffsets = nullptr;
    view->internal = dims.release();
    view->obj = Py_NewRef(self);
    return 0;
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_BufferError, e.what());
    return -1;
  }
}

void tensor_releasebuffer(PyObject*, Py_buffer* view) {
  delete static_cast<BufferDims*>(view->internal);
}

// ---- results and errors of the operator slots (install_slots) ---------------------------

const py::detail::type_info* g_tensor_info = nullptr;

PyObject* wrap(Tensor&& t) {
  return py::detail::type_caster_generic::cast(
             &t, py::return_value_policy::move, py::handle(), g_tensor_info, nullptr,
             [](const void* p) -> void* {
               return new Tensor(std::move(*const_cast<Tensor*>(static_cast<const Tensor*>(p))));
             })
      .ptr();
}

// Sets the Python error for the exception being handled (kiln.Error through the translator
// errors.cpp registers), as pybind11's dispatcher does.
void set_python_error() {
  try {
    throw;
  } catch (py::error_already_set& e) {
    e.restore();
  } catch (...) {
    if (py::detail::apply_exception_translators(
            py::detail::get_local_internals().registered_exception_translators) ||
        py::detail::apply_exception_translators(
            py::detail::get_internals().registered_exception_translators))
      return;
    PyErr_SetString(PyExc_SystemError, "kiln: unknown C++ exception");
  }
}

template <Tensor (*Fn)(const Tensor&, const Tensor&, Loc)>
PyObject* binary_slot(PyObject* a, PyObject* b) {
  try {
    const Tensor* x = tensor_ptr(a);
    const Tensor* y = tensor_ptr(b);
    if (x && y) return wrap(Fn(*x, *y, Loc{}));
    if (x) return wrap(Fn(*x, operand(b, *x), Loc{}));
    return wrap(Fn(operand(a, *y), *y, Loc{}));
  } catch (...) {
    set_python_error();
    return nullptr;
  }
}

// ---- indexing (numpy's rules) ----------------------------------------------------------

// One entry of an index tuple.
struct IndexEntry {
  enum class Kind { integer, slice, new_axis, ellipsis, array } kind;
  int64_t i = 0;
  Slice s;
  Tensor indices;  // array: an integer or bool tensor
};

std::optional<int64_t> slice_bound(PyObject* v) {
  if (v == Py_None) return std::nullopt;
  return to_int(v);
}

IndexEntry parse_index(py::handle v) {
  using Kind = IndexEntry::Kind;
  if (v.is_none()) return {.kind = Kind::new_axis};
  if (v.ptr() == Py_Ellipsis) return {.kind = Kind::ellipsis};
  if (PySlice_Check(v.ptr())) {
    auto* s = reinterpret_cast<PySliceObject*>(v.ptr());
    const std::optional<int64_t> step = slice_bound(s->step);
    return {.kind = Kind::slice,
            .s = Slice{slice_bound(s->start), slice_bound(s->stop), step.value_or(1)}};
  }
  if (PyBool_Check(v.ptr()))
    fail("getitem", "a Python bool is no index: got ", py::repr(v).cast<std::string>(),
         ", expected an int, a slice, None, ..., or an integer or bool tensor");
  if (const Tensor* t = tensor_ptr(v)) return {.kind = Kind::array, .indices = *t};
  if (is_int(v)) return {.kind = Kind::integer, .i = to_int(v)};
  Tensor t = to_tensor(v);
  // An empty list is an (empty) integer index, as in numpy.
  if (t.numel() == 0 && is_floating(t.dtype())) t = astype(t, int64, Loc{});
  return {.kind = Kind::array, .indices = t};
}

// x[i] and x[i, j, ...] with ints in range: one index per int (each one view, made directly
// when eager: docs/PERFORMANCE.md, "Python: indexing"). nullopt: getitem's general path.
std::optional<Tensor> index_ints(const Tensor& x, py::handle key) {
  auto in_range = [](const Tensor& t, PyObject* k) -> std::optional<int64_t> {
    if (!PyLong_CheckExact(k) || t.rank() == 0) return std::nullopt;
    const int64_t n = t.shape()[0];
    int overflow = 0;
    const long long i = PyLong_AsLongLongAndOverflow(k, &overflow);
    if (overflow || i < -n || i >= n) return std::nullopt;
    return i < 0 ? i + n : i;
  };
  if (!PyTuple_CheckExact(key.ptr())) {
    const std::optional<int64_t> i = in_range(x, key.ptr());
    if (!i) return std::nullopt;
    return index(x, *i, Loc{});
  }
  const py::ssize_t n = PyTuple_GET_SIZE(key.ptr());
  if (n == 0 || n > x.rank()) return std::nullopt;
  for (py::ssize_t k = 0; k < n; ++k)
    if (!PyLong_CheckExact(PyTuple_GET_ITEM(key.ptr(), k))) return std::nullopt;
  Tensor y = x;
  for (py::ssize_t k = 0; k < n; ++k) {
    const std::optional<int64_t> i = in_range(y, PyTuple_GET_ITEM(key.ptr(), k));
    if (!i) return std::nullopt;
    y = index(y, *i, Loc{});
  }
  return y;
}

Tensor getitem(const Tensor& x, py::handle key) {
  using Kind = IndexEntry::Kind;
  if (std::optional<Tensor> y = index_ints(x, key)) return std::move(*y);
  std::vector<IndexEntry> entries;
  if (PyTuple_Check(key.ptr())) {
    for (py::handle v : py::reinterpret_borrow<py::tuple>(key)) entries.push_back(parse_index(v));
  } else {
    entries.push_back(parse_index(key));
  }
  int consumed = 0, ellipses = 0;
  bool has_array = false;
  for (IndexEntry& e : entries) {
    if (e.kind == Kind::array) {
      has_array = true;
      if (e.indices.dtype() == bool_) {
        if (e.indices.rank() == 0)
          fail("getitem", "a 0-d bool index is not supported: got ", e.indices.type(),
               ", expected a bool mask with at least one axis");
        consumed += e.indices.rank();
        continue;
      }
      if (!is_integral(e.indices.dtype()))
        fail("getitem", "tensor indices must be integers or bools: got ", e.indices.type(),
             ", expected an integer or bool dtype");
    }
    if (e.kind == Kind::ellipsis) ++ellipses;
    if (e.kind == Kind::integer || e.kind == Kind::slice || e.kind == Kind::array) ++consumed;
  }
  if (ellipses > 1)
    fail("getitem", "an index can only have a single ellipsis: got ", ellipses,
         ", expected at most one");
  if (consumed > x.rank())
    fail("getitem", "too many indices for ", x.type(), ": got ", consumed, ", expected at most ",
         x.rank());

  // Basic indexing first: one slice per axis of x, new axes, the integer-indexed axes to drop.
  // With a tensor index present, integers index as 0-d tensors (numpy's rule).
  struct Advanced {
    int axis;  // in y, x after slicing and new axes
    Tensor indices;
    int entry;  // its place in the index tuple (a mask's indices share one)
  };
  std::vector<Slice> slices(static_cast<std::size_t>(x.rank()));
  std::vector<int64_t> new_axes, drop;
  std::vector<Advanced> advanced;
  int xa = 0, ya = 0;
  for (int entry = 0; entry < static_cast<int>(entries.size()); ++entry) {
    IndexEntry& e = entries[static_cast<std::size_t>(entry)];
    switch (e.kind) {
      case Kind::ellipsis:
        xa += x.rank() - consumed;
        ya += x.rank() - consumed;
        break;
      case Kind::new_axis:
        new_axes.push_back(ya++);
        break;
      case Kind::slice:
        if (e.s.step == 0) fail("getitem", "slice step cannot be zero: got 0, expected non-zero");
        slices[static_cast<std::size_t>(xa++)] = e.s;
        ++ya;
        break;
      case Kind::integer: {
        const int64_t n = x.shape()[xa];
        if (e.i < -n || e.i >= n)
          fail("getitem", "index out of bounds for axis ", xa, " of ", x.type(), ": got ", e.i,
               ", expected ", -n, " <= index < ", n);
        const int64_t i = e.i < 0 ? e.i + n : e.i;
        if (has_array) {
          advanced.push_back({ya, full(Shape{}, static_cast<double>(i), int64), entry});
        } else {
          slices[static_cast<std::size_t>(xa)] = Slice{i, i + 1, 1};
          drop.push_back(ya);
        }
        ++xa, ++ya;
        break;
      }
      case Kind::array: {
        if (e.indices.dtype() != bool_) {
          advanced.push_back({ya++, e.indices, entry});
          ++xa;
          break;
        }
        const Tensor& mask = e.indices;
        for (int k = 0; k < mask.rank(); ++k)
          if (mask.shape()[k] != x.shape()[xa + k])
            fail("getitem", "bool mask shape does not match the indexed axes: got mask ",
                 mask.type(), " at axis ", xa, " of ", x.type(), ", expected the mask's shape ",
                 "to equal those axes' sizes");
        if (mask.is_traced())
          fail("getitem", "a bool mask gives a shape that depends on values: got a traced mask ",
               mask.type(), ", expected a concrete one (inside jit use kiln.where, or ",
               "kiln.nonzero with size=)");
        const auto count = sum(mask, {}, false, Loc{}).item<int64_t>(Loc{});
        for (Tensor& idx : nonzero(mask, count, 0, Loc{})) advanced.push_back({ya++, idx, entry});
        xa += mask.rank();
        break;
      }
    }
  }
  bool whole = true;
  for (const Slice& s : slices) whole = whole && !s.start && !s.stop && s.step == 1;
  Tensor y = whole ? x : slice(x, slices, Loc{});
  for (int64_t a : new_axes) y = expand_dims(y, a, Loc{});
  if (advanced.empty()) return drop.empty() ? y : squeeze(y, drop, Loc{});

  // Advanced indexing: the indexed axes moved to the front and merged into one, the indices
  // combined into one linear index into it, and one take.
  Shape batch = advanced.front().indices.shape();
  for (const Advanced& a : advanced) batch = broadcast_shapes("getitem", batch, a.indices.shape());
  Axes perm;
  std::vector<int64_t> rest_dims{1};
  for (const Advanced& a : advanced) perm.push_back(a.axis);
  for (int i = 0; i < y.rank(); ++i)
    if (std::find(perm.begin(), perm.end(), i) == perm.end()) {
      perm.push_back(i);
      rest_dims.push_back(y.shape()[i]);
    }
  Tensor linear = full(Shape{}, 0.0, int64);
  int64_t stride = 1;
  for (auto a = advanced.rbegin(); a != advanced.rend(); ++a) {
    const int64_t n = y.shape()[a->axis];
    Tensor idx = astype(a->indices, int64, Loc{});
    idx = where(less(idx, scalar_like(idx, 0, false), Loc{}), add(idx, scalar_like(idx, n, false)),
                idx, Loc{});
    if (idx.is_traced()) {
      // As JAX: clamped into range.
      idx = kiln::minimum(kiln::maximum(idx, scalar_like(idx, 0, false), Loc{}),
                          scalar_like(idx, static_cast<double>(std::max<int64_t>(n - 1, 0)), false),
                          Loc{});
    } else if (idx.numel() > 0) {
      const auto lo = min(idx, {}, false, Loc{}).item<int64_t>(Loc{});
      const auto hi = max(idx, {}, false, Loc{}).item<int64_t>(Loc{});
      if (lo < 0 || hi >= n)
        fail("getitem", "index out of bounds for axis ", a->axis, " of size ", n, ": got ",
             lo < 0 ? lo - n : hi, ", expected ", -n, " <= index < ", n);
    }
    linear = add(linear, mul(idx, scalar_like(idx, static_cast<double>(stride), false)), Loc{});
    stride *= n;
  }
  rest_dims[0] = stride;
  Tensor z = reshape(transpose(y, perm, Loc{}), Shape(rest_dims), Loc{});
  Tensor r = take(z, broadcast_to(linear, batch, Loc{}), 0, Loc{});
  bool adjacent = true;
  for (std::size_t k = 1; k < advanced.size(); ++k)
    adjacent = adjacent && advanced[k].entry - advanced[k - 1].entry <= 1;
  const int first = advanced.front().axis;
  if (!adjacent || first == 0) return r;
  // numpy puts the indexed axes where the (adjacent) indices stood.
  const int nb = batch.rank();
  Axes back;
  for (int i = 0; i < first; ++i) back.push_back(nb + i);
  for (int i = 0; i < nb; ++i) back.push_back(i);
  for (int i = nb + first; i < r.rank(); ++i) back.push_back(i);
  return transpose(r, back, Loc{});
}

// ---- operators as CPython's slots -------------------------------------------------------

template <Tensor (*Fn)(const Tensor&, Loc)>
PyObject* unary_slot(PyObject* a) {
  try {
    return wrap(Fn(*tensor_ptr(a), Loc{}));
  } catch (...) {
    set_python_error();
    return nullptr;
  }
}

// ~x: logical not of bools, bitwise not of integers.
Tensor invert(const Tensor& a, Loc loc) {
  return a.dtype() == bool_ ? logical_not(a, loc) : bitwise_not(a, loc);
}

// Python calls it with a tensor first (swapping the operands, and the comparison, for
// `2 < x`). == and != with None or a string are Python's identity tests.
PyObject* richcompare_slot(PyObject* a, PyObject* b, int op) {
  try {
    const Tensor* x = tensor_ptr(a);
    if (!x) Py_RETURN_NOTIMPLEMENTED;
    if ((op == Py_EQ || op == Py_NE) && (b == Py_None || PyUnicode_Check(b)))
      return PyBool_FromLong(op == Py_NE);
    const Tensor y = operand(b, *x);
    switch (op) {
      case Py_LT:
        return wrap(less(*x, y, Loc{}));
      case Py_LE:
        return wrap(less_equal(*x, y, Loc{}));
      case Py_GT:
        return wrap(greater(*x, y, Loc{}));
      case Py_GE:
        return wrap(greater_equal(*x, y, Loc{}));
      case Py_EQ:
        return wrap(equal(*x, y, Loc{}));
      default:
        return wrap(not_equal(*x, y, Loc{}));
    }
  } catch (...) {
    set_python_error();
    return nullptr;
  }
}

PyObject* subscript_slot(PyObject* self, PyObject* key) {
  try {
    return wrap(getitem(*tensor_ptr(self), key));
  } catch (...) {
    set_python_error();
    return nullptr;
  }
}

// `a + b`, `a < b` and `a[i]` are the hot paths of eager code: these slots skip pybind11's
// dispatcher (argument vectors, overload resolution, a type lookup per call) and the generic
// slots' method lookups. The methods pybind11 defines (__add__, ...) stay for introspection and
// explicit calls; this runs after them, as defining a method resets its slot.
void install_slots(py::handle type) {
  g_tensor_info = py::detail::get_type_info(reinterpret_cast<PyTypeObject*>(type.ptr()));
  auto* heap = reinterpret_cast<PyHeapTypeObject*>(type.ptr());
  PyNumberMethods& n = heap->as_number;
  n.nb_add = binary_slot<add>;
  n.nb_subtract = binary_slot<sub>;
  n.nb_multiply = binary_slot<mul>;
  n.nb_true_divide = binary_slot<true_divide>;
  n.nb_matrix_multiply = binary_slot<matmul>;
  n.nb_negative = unary_slot<neg>;
  n.nb_absolute = unary_slot<kiln::abs>;
  n.nb_invert = unary_slot<invert>;
  heap->ht_type.tp_richcompare = richcompare_slot;
  heap->as_mapping.mp_subscript = subscript_slot;
}

// ---- x.at[index].set(v) and friends (JAX's functional updates) -------------------------

// x.at: indexing it gives an IndexedUpdate.
struct UpdateHelper {
  Tensor x;
};
struct IndexedUpdateRef {
  Tensor x;
  py::object index;
};

// x with `v` combined in at x[index]: the flat positions the index selects (numpy's rules,
// through getitem on an arange of positions) scattered into the flattened x.
Tensor update_at(const IndexedUpdateRef& ref, py::handle v, ScatterMode mode) {
  const Tensor& x = ref.x;
  const Tensor positions =
      reshape(arange(0.0, static_cast<double>(x.numel()), 1.0, int64, Loc{}), x.shape(), Loc{});
  const Tensor selected = getitem(positions, ref.index);
  const Tensor updates =
      broadcast_to(astype(operand(v, x), x.dtype(), Loc{}), selected.shape(), Loc{});
  const Tensor flat =
      scatter(flatten(x, Loc{}), flatten(selected, Loc{}), flatten(updates, Loc{}), 0, mode, Loc{});
  return reshape(flat, x.shape(), Loc{});
}

void bind_at(py::class_<Tensor>& tensor) {
  py::class_<UpdateHelper>(tensor, "_At", "x.at[index]: see Tensor.at.")
      .def("__getitem__", [](const UpdateHelper& h, py::object index) {
        return IndexedUpdateRef{h.x, std::move(index)};
      });
  py::class_<IndexedUpdateRef> ref(tensor, "_AtIndex",
                                   "x.at[index].set(v), .add(v), .multiply(v), .min(v), .max(v), "
                                   ".get(): new tensors, x unchanged.");
  ref.def(
      "get", [](const IndexedUpdateRef& r) { return getitem(r.x, r.index); }, "x[index].");
  const std::pair<const char*, ScatterMode> modes[] = {
      {"set", ScatterMode::set}, {"add", ScatterMode::add}, {"multiply", ScatterMode::mul},
      {"mul", ScatterMode::mul}, {"min", ScatterMode::min}, {"max", ScatterMode::max}};
  for (const auto& [name, mode] : modes)
    ref.def(
        name,
        [mode = mode](const IndexedUpdateRef& r, py::handle v) { return update_at(r, v, mode); },
        py::arg("values"),
        "A copy of x with values (broadcast to x[index]) combined in at index; repeated "
        "indices: set keeps the last, the others combine all.");
  tensor.def_property_readonly(
      "at", [](const Tensor& t) { return UpdateHelper{t}; },
      "JAX's functional updates: x.at[index].set(v) is a copy of x with x[index] = v (any "
      "numpy index); also .add, .multiply, .min, .max and .get.");
}

// ---- repr -------------------------------------------------------------------------------

std::string tensor_repr(const Tensor& t) {
  if (t.is_traced())
    return "Tensor(traced, shape=" + py::repr(shape_tuple(t.shape())).cast<std::string>() +
           ", dtype=" + dtype_str(t.dtype()) + ")";
  py::array view = numpy_view(t, py::cast(t));
  py::module_ np = py::module_::import("numpy");
  std::string body;
  if (t.numel() == 0 && t.rank() != 1) {
    body = "[], shape=" + py::repr(shape_tuple(t.shape())).cast<std::string>();
  } else {
    body = np.attr("array2string")(view, py::arg("separator") = ", ", py::arg("prefix") = "Tensor(")
               .cast<std::string>();
  }
  return "Tensor(" + body + ", dtype=" + dtype_str(t.dtype()) + ")";
}

py::object item(const Tensor& t) {
  require_concrete(t);
  if (t.numel() != 1)
    fail("item", "only one-element tensors convert to Python scalars: got ", t.type(),
         ", expected one element");
  if (t.dtype() == bool_) return py::bool_(t.item<bool>(Loc{}));
  if (is_floating(t.dtype())) return py::float_(t.item<double>(Loc{}));
  if (is_complex(t.dtype())) return py::cast(t.item<std::complex<double>>(Loc{}));
  return py::int_(t.item<int64_t>(Loc{}));
}

// x.reshape(2, 3) and x.reshape((2, 3)), as numpy's method takes both.
Shape shape_of_args(const py::args& args) {
  if (args.size() == 1 && !is_int(args[0])) return to_shape(args[0]);
  return to_shape(args);
}

}  // namespace

const Tensor* tensor_ptr(py::handle value) {
  PyObject* o = value.ptr();
  if (Py_TYPE(o) == g_tensor_type) {
    // A kiln.Tensor has no base classes: pybind11's simple layout, the value pointer first.
    const auto* inst = reinterpret_cast<py::detail::instance*>(o);
    if (!inst->simple_holder_constructed)
      throw py::type_error("kiln.Tensor used before its __init__");
    return static_cast<const Tensor*>(inst->simple_value_holder[0]);
  }
  if (!g_tensor_type || !PyObject_TypeCheck(o, g_tensor_type)) return nullptr;
  return &value.cast<const Tensor&>();  // a Python subclass
}

bool is_uninitialised_tensor(PyObject* o) {
  return g_tensor_type && PyObject_TypeCheck(o, g_tensor_type) &&
         !reinterpret_cast<py::detail::instance*>(o)->get_value_and_holder().holder_constructed();
}

Shape to_shape(py::handle value) {
  if (is_int(value)) return Shape{to_int(value)};
  if (const Tensor* t = tensor_ptr(value)) {
    if (t->rank() == 0) return Shape{to_int(value)};
    std::vector<int64_t> dims = t->to_vector<int64_t>(Loc{});
    return Shape(std::move(dims));
  }
  if (!PySequence_Check(value.ptr()))
    fail("shape", "a shape is an int or a sequence of ints: got ",
         py::repr(value).cast<std::string>(), ", expected e.g. 3 or (2, 3)");
  std::vector<int64_t> dims;
  for (py::handle d : py::reinterpret_borrow<py::sequence>(value)) dims.push_back(to_int(d));
  return Shape(std::move(dims));
}

std::optional<Axes> to_axes(py::handle value) {
  if (value.is_none()) return std::nullopt;
  return to_shape(value).dims();
}

std::optional<DType> to_optional_dtype(py::handle value) {
  if (value.is_none()) return std::nullopt;
  return to_dtype(value);
}

std::pair<Tensor, Tensor> operands(py::handle a, py::handle b) {
  if (const Tensor* x = tensor_ptr(a)) return {*x, operand(b, *x)};
  if (const Tensor* y = tensor_ptr(b)) return {operand(a, *y), *y};
  if (is_python_scalar(a) && !is_python_scalar(b)) {
    Tensor y = to_tensor(b);
    return {operand(a, y), y};
  }
  Tensor x = to_tensor(a);
  return {x, operand(b, x)};
}

int64_t to_int(py::handle value) {
  if (const Tensor* t = tensor_ptr(value)) {
    if (t->rank() != 0 || !(is_integral(t->dtype()) || t->dtype() == bool_))
      fail("index", "only 0-d integer tensors are Python ints: got ", t->type(),
           ", expected a 0-d integer tensor");
    return t->item<int64_t>(Loc{});
  }
  if (PyBool_Check(value.ptr()) || !PyIndex_Check(value.ptr()))
    fail("index", "an integer is needed: got ", py::repr(value).cast<std::string>(),
         ", expected an int");
  const auto index = py::reinterpret_steal<py::object>(PyNumber_Index(value.ptr()));
  if (!index) throw py::error_already_set();
  const long long v = PyLong_AsLongLong(index.ptr());
  if (v == -1 && PyErr_Occurred()) throw py::error_already_set();
  return v;
}

bool is_int(py::handle value) {
  PyObject* o = value.ptr();
  if (PyLong_Check(o)) return !PyBool_Check(o);
  return PyIndex_Check(o) && !PySequence_Check(o) && !tensor_ptr(value);
}

Tensor true_divide(const Tensor& a, const Tensor& b, Loc loc) {
  if (is_floating(a.dtype()) || is_floating(b.dtype())) return div(a, b, loc);
  const DType f = to_floating(promote_types(a.dtype(), b.dtype()));
  return div(astype(a, f, loc), astype(b, f, loc), loc);
}

void bind_tensor(py::module_& m) {
  py::enum_<DType> dtype(m, "dtype", "The element type of a Tensor.");
  for (const DTypeName& d : kDTypes) dtype.value(d.name, d.dtype);
  dtype.export_values();
  dtype.def_property_readonly(
      "itemsize", [](DType d) { return dtype_size(d); }, "Bytes per element.");
  dtype.def_property_readonly("name", &dtype_str, "numpy's name: 'float32', 'bool', ...");
  dtype.def("__repr__", [](DType d) {
    for (const DTypeName& n : kDTypes)
      if (n.dtype == d) return "kiln." + std::string(n.name);
    return std::string("kiln.dtype(?)");
  });
  // kl.float32 == np.float32 == "float32", and np.dtype(kl.float32) works (NumPy reads a
  // `dtype` attribute), so NumPy calls take Kiln's dtypes.
  for (const char* name : {"__eq__", "__ne__", "__hash__"}) py::delattr(dtype, name);
  dtype.def("__eq__", [](DType d, py::handle other) {
    if (other.is_none()) return false;
    try {
      return to_dtype(other) == d;
    } catch (const Error&) {
      return false;
    } catch (const py::error_already_set&) {
      return false;
    }
  });
  dtype.def("__ne__", [](py::handle self, py::handle other) {
    return !self.attr("__eq__")(other).cast<bool>();
  });
  dtype.def("__hash__", [](DType d) { return static_cast<int>(d); });
  dtype.def_property_readonly(
      "dtype",
      [](DType d) -> py::object {
        if (d == bfloat16) return py::none();
        return numpy_dtype(d);
      },
      "The NumPy dtype (None for bfloat16, which NumPy lacks).");

  py::class_<Tensor> tensor(m, "Tensor", py::buffer_protocol(), R"doc(
An n-dimensional array: eager (holding memory), or traced inside jit, grad or vmap.

Tensors are immutable values: `x += 1` rebinds x to a new tensor, as for a JAX array. NumPy
arrays convert without a copy (kiln.asarray), and np.asarray(t) views a tensor's memory through
the buffer protocol; bfloat16, which NumPy lacks, converts to a float32 copy through __array__.
torch.from_dlpack(t) and kiln.from_dlpack(torch_tensor) share memory with PyTorch.)doc");
  g_tensor_type = reinterpret_cast<PyTypeObject*>(tensor.ptr());
  auto* heap = reinterpret_cast<PyHeapTypeObject*>(tensor.ptr());
  heap->as_buffer.bf_getbuffer = tensor_getbuffer;
  heap->as_buffer.bf_releasebuffer = tensor_releasebuffer;
  // NumPy defers to Tensor's reflected operators: np_array + t is a Tensor, as in JAX.
  tensor.attr("__array_priority__") = 100;

  tensor.def(py::init([](py::handle value, py::handle dtype) {
               return to_tensor(value, to_optional_dtype(dtype));
             }),
             py::arg("value"), py::arg("dtype") = py::none(),
             "kiln.asarray(value, dtype): shares a NumPy array's memory where it can.");
  tensor.def_property_readonly(
      "dtype", [](const Tensor& t) { return t.dtype(); }, "The element type.");
  tensor.def_property_readonly(
      "shape", [](const Tensor& t) { return shape_tuple(t.shape()); }, "The sizes, a tuple.");
  tensor.def_property_readonly("ndim", &Tensor::rank, "The number of axes.");
  tensor.def_property_readonly("size", &Tensor::numel, "The number of elements.");
  tensor.def_property_readonly(
      "itemsize", [](const Tensor& t) { return dtype_size(t.dtype()); }, "Bytes per element.");
  tensor.def_property_readonly(
      "nbytes", [](const Tensor& t) { return t.numel() * dtype_size(t.dtype()); },
      "Bytes of the elements.");
  tensor.def_property_readonly(
      "T", [](const Tensor& t) { return transpose(t, Loc{}); }, "The axes reversed.");
  tensor.def_property_readonly(
      "is_traced", &Tensor::is_traced,
      "True for a tensor being traced inside jit, grad or vmap (it has no values).");
  tensor.def("__repr__", &tensor_repr);
  tensor.def("__str__", [](const Tensor& t) {
    if (t.is_traced()) return tensor_repr(t);
    return py::str(numpy_view(t, py::cast(t))).cast<std::string>();
  });
  tensor.def("item", &item, "The value of a one-element tensor as a Python bool, int or float.");
  tensor.def(
      "tolist",
      [](py::handle self) { return numpy_view(*tensor_ptr(self), self).attr("tolist")(); },
      "The values as nested Python lists (a Python scalar for a 0-d tensor).");
  tensor.def(
      "numpy", [](py::handle self) { return numpy_view(*tensor_ptr(self), self); },
      "A NumPy array viewing the tensor's memory (bfloat16: a float32 copy).");
  tensor.def(
      "__array__",
      [](py::handle self, py::handle dtype) {
        py::array a = numpy_view(*tensor_ptr(self), self);
        return dtype.is_none() ? py::object(a) : a.attr("astype")(dtype);
      },
      py::arg("dtype") = py::none(),
      "NumPy's conversion: a view of the tensor's memory; bfloat16 (no NumPy dtype) converts "
      "to a float32 copy.");
  tensor.def("__len__", [](const Tensor& t) {
    if (t.rank() == 0) throw py::type_error("len() of a 0-d tensor");
    return t.shape()[0];
  });
  tensor.def("__iter__", [](const Tensor& t) {
    if (t.rank() == 0) throw py::type_error("iteration over a 0-d tensor");
    py::list rows;
    for (int64_t i = 0; i < t.shape()[0]; ++i) rows.append(index(t, i, Loc{}));
    return py::iter(rows);
  });
  tensor.def(
      "__bool__", [](const Tensor& t) { return static_cast<bool>(t); },
      "Truth of a one-element tensor; inside jit use kiln.cond / kiln.while_loop.");
  // float() and int() of a complex value raise TypeError, as they do for a Python complex.
  enum class Target { real, complex };
  auto scalar = [](const char* op, Target target = Target::real) {
    return [op, target](const Tensor& t) {
      require_concrete(t);
      if (t.numel() != 1)
        fail(op, "only one-element tensors convert to Python scalars: got ", t.type(),
             ", expected one element");
      if (is_complex(t.dtype()) && target == Target::real)
        throw py::type_error(std::string(op) + "() of a complex tensor: got " +
                             t.type().to_string() + ", expected a real one (use .real or abs)");
      return t;
    };
  };
  tensor.def("__complex__", [f = scalar("complex", Target::complex)](const Tensor& t) {
    return f(t).item<std::complex<double>>(Loc{});
  });
  tensor.def("__float__",
             [f = scalar("float")](const Tensor& t) { return f(t).item<double>(Loc{}); });
  tensor.def("__int__", [f = scalar("int")](const Tensor& t) {
    const Tensor& u = f(t);
    if (!is_floating(u.dtype())) return py::object(py::int_(u.item<int64_t>(Loc{})));
    // Python's int(float): exact, and ValueError for NaN, OverflowError for infinities.
    auto out = py::reinterpret_steal<py::object>(PyLong_FromDouble(u.item<double>(Loc{})));
    if (!out) throw py::error_already_set();
    return out;
  });
  tensor.def("__index__", [f = scalar("index")](const Tensor& t) {
    if (t.rank() != 0 || !(is_integral(t.dtype()) || t.dtype() == bool_))
      fail("index", "only 0-d integer tensors can be indices: got ", t.type(),
           ", expected a 0-d integer tensor");
    return f(t).item<int64_t>(Loc{});
  });
  tensor.def("__setitem__", [](const Tensor& t, py::handle, py::handle) {
    fail("setitem", "tensors are immutable: got an assignment to an element of ", t.type(),
         ", expected x = x.at[index].set(value), which returns the updated tensor");
  });
  tensor.def(
      "__reduce__",
      [](py::handle self) {
        // Pickled as its values (a NumPy copy) and dtype: bfloat16 travels as float32.
        const Tensor& t = *tensor_ptr(self);
        return py::make_tuple(self.get_type(), py::make_tuple(numpy_view(t, self).attr("copy")(),
                                                              dtype_str(t.dtype())));
      },
      "Pickling: the values and the dtype.");
  tensor.def(
      "__round__",
      [](const Tensor& t, py::handle ndigits) {
        if (ndigits.is_none()) return round(t, Loc{});
        const double scale = std::pow(10.0, static_cast<double>(to_int(ndigits)));
        return div(round(mul(t, scalar_like(t, scale), Loc{}), Loc{}), scalar_like(t, scale),
                   Loc{});
      },
      py::arg("ndigits") = py::none(), "round(x, n): half to even, as numpy.round.");
  tensor.def("__getitem__", &getitem,
             "numpy's indexing: ints, slices (any step), None, ..., integer tensors and lists "
             "(gathers, broadcast together) and bool masks (eager only: the result's size "
             "depends on values).");

  // Operators. Python scalars are weakly typed (`x * 2.0` keeps x's dtype).
#define KILN_BINARY(name, rname, fn)                                                           \
  tensor.def(name, [](const Tensor& a, py::handle b) { return fn(a, operand(b, a), Loc{}); }); \
  tensor.def(rname, [](const Tensor& a, py::handle b) { return fn(operand(b, a), a, Loc{}); });
  KILN_BINARY("__add__", "__radd__", add)
  KILN_BINARY("__sub__", "__rsub__", sub)
  KILN_BINARY("__mul__", "__rmul__", mul)
  KILN_BINARY("__truediv__", "__rtruediv__", true_divide)
  KILN_BINARY("__floordiv__", "__rfloordiv__", floor_divide)
  KILN_BINARY("__mod__", "__rmod__", remainder)
  KILN_BINARY("__pow__", "__rpow__", pow)
  KILN_BINARY("__matmul__", "__rmatmul__", matmul)
  KILN_BINARY("__and__", "__rand__", bitwise_and)
  KILN_BINARY("__or__", "__ror__", bitwise_or)
  KILN_BINARY("__xor__", "__rxor__", bitwise_xor)
  KILN_BINARY("__lshift__", "__rlshift__", left_shift)
  KILN_BINARY("__rshift__", "__rrshift__", right_shift)
#undef KILN_BINARY
#define KILN_COMPARE(name, fn) \
  tensor.def(name, [](const Tensor& a, py::handle b) { return fn(a, operand(b, a), Loc{}); });
  KILN_COMPARE("__lt__", less)
  KILN_COMPARE("__le__", less_equal)
  KILN_COMPARE("__gt__", greater)
  KILN_COMPARE("__ge__", greater_equal)
#undef KILN_COMPARE
  // == and != with a value that is no array (None, a string) are Python's identity tests.
  tensor.def("__eq__", [](const Tensor& a, py::handle b) -> py::object {
    if (b.is_none() || PyUnicode_Check(b.ptr())) return py::bool_(false);
    return py::cast(equal(a, operand(b, a), Loc{}));
  });
  tensor.def("__ne__", [](const Tensor& a, py::handle b) -> py::object {
    if (b.is_none() || PyUnicode_Check(b.ptr())) return py::bool_(true);
    return py::cast(not_equal(a, operand(b, a), Loc{}));
  });
  tensor.def("__neg__", [](const Tensor& a) { return neg(a, Loc{}); });
  tensor.def("__pos__", [](const Tensor& a) { return a; });
  tensor.def("__abs__", [](const Tensor& a) { return abs(a, Loc{}); });
  tensor.def("__invert__", [](const Tensor& a) { return invert(a, Loc{}); });
  bind_at(tensor);
  // No __iadd__ and friends: Python falls back to `x = x + y`, rebinding x (tensors are
  // immutable values, as in JAX).

  // Methods numpy's and PyTorch's users reach for; the rest are the top-level functions bound
  // as methods in ops.cpp.
  tensor.def(
      "astype", [](const Tensor& t, py::handle d) { return astype(t, to_dtype(d), Loc{}); },
      py::arg("dtype"), "A copy converted to dtype (the tensor itself when it has it).");
  tensor.def(
      "reshape",
      [](const Tensor& t, const py::args& shape) {
        return reshape(t, shape_of_args(shape), Loc{});
      },
      "x.reshape(2, 3) or x.reshape((2, 3)); one size may be -1.");
  tensor.def(
      "transpose",
      [](const Tensor& t, const py::args& axes) {
        if (axes.empty() || (axes.size() == 1 && axes[0].is_none())) return transpose(t, Loc{});
        return transpose(t, shape_of_args(axes).dims(), Loc{});
      },
      "x.transpose() reverses the axes; x.transpose(1, 0, 2) or x.transpose((1, 0, 2)) "
      "permutes them (numpy's method, not torch's two-axis swap: see swapaxes).");
  tensor.def(
      "copy", [](const Tensor& t) { return t.is_traced() ? t : copy_of(t); },
      "A copy of the values in new memory.");

  install_slots(tensor);

  m.def(
      "asarray",
      [](py::object value, py::object dtype) { return to_tensor(value, to_optional_dtype(dtype)); },
      py::arg("value"), py::arg("dtype") = py::none(), R"doc(
A Tensor of `value`: a kiln.Tensor as is; a NumPy array (or any buffer) of a dtype Kiln has,
viewed without a copy (writes through either are visible in the other, and the array stays alive
as long as a view of it does); Python scalars and nested lists copied, with JAX's dtypes (bool,
int32, float32). `dtype` converts (a copy).)doc");
  m.def(
      "array",
      [](py::object value, py::object dtype) {
        const Tensor t = to_tensor(value, to_optional_dtype(dtype));
        return t.is_traced() ? t : copy_of(t);
      },
      py::arg("value"), py::arg("dtype") = py::none(),
      "A Tensor holding a copy of `value` (asarray shares a NumPy array's memory instead).");
  m.def(
      "set_num_threads", [](int n) { set_num_threads(n); }, py::arg("n"),
      "The number of threads Kiln's loops, OpenBLAS and oneDNN use (one OpenMP pool; initially "
      "KILN_NUM_THREADS or OMP_NUM_THREADS).");
  m.def(
      "num_threads", [] { return num_threads(); }, "The number of threads Kiln's loops use.");
  m.def(
      "set_flush_denormal", [](bool on) { set_flush_denormal(on); }, py::arg("on"),
      "Flush denormals to zero in float arithmetic (x86's FTZ and DAZ) on every thread that "
      "computes for Kiln, as torch.set_flush_denormal; off by default.");
  m.def(
      "flush_denormal", [] { return flush_denormal(); },
      "Whether denormals flush to zero (set_flush_denormal).");
  py::class_<RuntimeInfo>(m, "RuntimeInfo",
                          "What this process computes with (kl.runtime_info()): gemm_backend (the "
                          "library of float32 matrix products, \"onednn\" or \"openblas\"), "
                          "blas_kernels (OpenBLAS's core name), cpu_isa (the widest vector "
                          "instructions Kiln detected: avx512, avx2 or baseline), num_threads.")
      .def_property_readonly(
          "gemm_backend",
          [](const RuntimeInfo& r) { return std::string(gemm_backend_name(r.gemm_backend)); })
      .def_readonly("blas_kernels", &RuntimeInfo::blas_kernels)
      .def_readonly("cpu_isa", &RuntimeInfo::cpu_isa)
      .def_readonly("num_threads", &RuntimeInfo::num_threads)
      .def("__repr__", [](const RuntimeInfo& r) {
        return "RuntimeInfo(gemm_backend='" + std::string(gemm_backend_name(r.gemm_backend)) +
               "', blas_kernels='" + r.blas_kernels + "', cpu_isa='" + r.cpu_isa +
               "', num_threads=" + std::to_string(r.num_threads) + ")";
      });
  m.def("runtime_info", &runtime_info,
        "The float32 GEMM backend, OpenBLAS's kernels, the CPU's vector instructions and the "
        "thread count (docs/PYTHON.md).");
  m.def(
      "set_gemm_backend",
      [](std::optional<std::string> name) {
        if (!name) return set_gemm_backend(std::nullopt);
        for (GemmBackend b : {GemmBackend::onednn, GemmBackend::openblas})
          if (gemm_backend_name(b) == *name) return set_gemm_backend(b);
        fail("set_gemm_backend", "unknown backend: got \"", *name,
             "\", expected \"onednn\", \"openblas\" or None");
      },
      py::arg("name"),
      "Runs float32 matrix products on \"onednn\" or \"openblas\"; None returns to KILN_GEMM "
      "or the default rule.");
}

}  // namespace kiln::python
