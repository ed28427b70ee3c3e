// DLPack exchange (docs/PYTHON.md, "Tensors, operations and interchange"): Tensor.__dlpack__,
// __dlpack_device__ and kiln.from_dlpack, so that torch.from_dlpack(t) and
// kiln.from_dlpack(torch_tensor) share memory. Written against Debian's dlpack.h (v0.6, the
// version PyTorch 1.13 speaks): a capsule named "dltensor" holds a DLManagedTensor; whoever
// consumes it renames it "used_dltensor" and calls its deleter when done.
#include <dlpack/dlpack.h>

#include <memory>
#include <vector>

#include "bindings.h"

namespace kiln::python {
namespace {

constexpr const char* kCapsule = "dltensor";
constexpr const char* kUsedCapsule = "used_dltensor";

// DLPack 0.6 (Debian's libdlpack-dev) has no bool code, and PyTorch 1.13 neither exports bool
// nor accepts later DLPack's kDLBool (6): bool travels as uint8, the one form both sides read.
DLDataType dl_dtype(DType d) {
  switch (d) {
    case DType::bool_:
    case DType::uint8:
      return {kDLUInt, 8, 1};
    case DType::uint32:
      return {kDLUInt, 32, 1};
    case DType::int32:
      return {kDLInt, 32, 1};
    case DType::int64:
      return {kDLInt, 64, 1};
    case DType::float16:
      return {kDLFloat, 16, 1};
    case DType::bfloat16:
      return {kDLBfloat, 16, 1};
    case DType::float32:
      return {kDLFloat, 32, 1};
    case DType::float64:
      return {kDLFloat, 64, 1};
    case DType::complex64:
      return {kDLComplex, 64, 1};
    case DType::complex128:
      return {kDLComplex, 128, 1};
  }
  return {kDLOpaqueHandle, 0, 1};
}

std::optional<DType> kiln_dtype(DLDataType t) {
  if (t.lanes != 1) return std::nullopt;
  switch (t.code) {
    case kDLUInt:
      if (t.bits == 8) return uint8;
      if (t.bits == 32) return uint32;
      return std::nullopt;
    case kDLInt:
      if (t.bits == 32) return int32;
      if (t.bits == 64) return int64;
      return std::nullopt;
    case kDLFloat:
      if (t.bits == 16) return float16;
      if (t.bits == 32) return float32;
      if (t.bits == 64) return float64;
      return std::nullopt;
    case kDLBfloat:
      return t.bits == 16 ? std::optional<DType>(bfloat16) : std::nullopt;
    case kDLComplex:
      if (t.bits == 64) return complex64;
      if (t.bits == 128) return complex128;
      return std::nullopt;
    default:
      return std::nullopt;
  }
}

// What an exported DLManagedTensor owns: the tensor (so its storage lives) and the arrays the
// DLTensor points into.
struct Exported {
  Tensor tensor;
  std::vector<int64_t> shape, strides;
  DLManagedTensor managed{};
};

// Called by the consumer, on any thread: dropping the tensor can release a Python object (a
// NumPy array the storage views), so it takes the GIL.
void delete_exported(DLManagedTensor* managed) {
  auto* e = static_cast<Exported*>(managed->manager_ctx);
  if (!Py_IsInitialized()) {
    delete e;
    return;
  }
  py::gil_scoped_acquire gil;
  delete e;
}

// The capsule's destructor: an unconsumed capsule still owns its tensor.
void delete_capsule(PyObject* capsule) {
  if (PyCapsule_IsValid(capsule, kUsedCapsule)) return;
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, kCapsule));
  if (managed) {
    managed->deleter(managed);
  } else {
    PyErr_WriteUnraisable(capsule);
  }
  PyErr_Restore(type, value, traceback);
}

py::capsule to_dlpack(const Tensor& x) {
  // A traced tensor has no memory: this raises Kiln's error naming kiln.cond / while_loop.
  if (x.is_traced()) (void)x.item<double>(Loc{});
  // PyTorch 1.13 aborts the process on a negative stride (its storage size overflows), so
  // such views are refused rather than handed to a consumer that may be PyTorch.
  for (int64_t stride : x.strides())
    if (stride < 0)
      fail("__dlpack__", "a view with negative strides cannot be exported: got strides ",
           Shape(x.strides()),
           ", expected non-negative ones (PyTorch has no negative strides and aborts on a "
           "DLPack tensor with them; copy first: kiln.array(x))");
  auto e = std::make_unique<Exported>();
  // DLPack 0.6 cannot mark memory read-only, and its consumers write to it: read-only memory
  // travels as a copy.
  e->tensor = is_read_only(x) ? copy_of(x) : x;
  const Tensor& t = e->tensor;
  e->shape.assign(t.shape().begin(), t.shape().end());
  e->strides = t.strides();
  DLTensor& dl = e->managed.dl_tensor;
  // Element 0 of the view with no byte_offset: PyTorch 1.13 ignores byte_offset.
  dl.data = t.raw_data();
  dl.device = {kDLCPU, 0};
  dl.ndim = t.rank();
  dl.dtype = dl_dtype(t.dtype());
  dl.shape = e->shape.data();
  dl.strides = e->strides.data();
  dl.byte_offset = 0;
  e->managed.manager_ctx = e.get();
  e->managed.deleter = delete_exported;
  PyObject* capsule = PyCapsule_New(&e->managed, kCapsule, delete_capsule);
  if (!capsule) throw py::error_already_set();
  e.release();  // owned by the capsule now
  return py::reinterpret_steal<py::capsule>(capsule);
}

// Releases a consumed DLManagedTensor when the last Kiln view of its memory goes.
struct Imported {
  explicit Imported(DLManagedTensor* m) : managed(m) {}
  Imported(const Imported&) = delete;
  Imported& operator=(const Imported&) = delete;
  DLManagedTensor* managed;
  ~Imported() {
    if (!managed->deleter) return;
    if (!Py_IsInitialized()) {
      managed->deleter(managed);
      return;
    }
    py::gil_scoped_acquire gil;
    managed->deleter(managed);
  }
};

Tensor from_capsule(py::handle capsule) {
  if (!PyCapsule_CheckExact(capsule.ptr()))
    fail("from_dlpack", "not a DLPack capsule: got a ",
         py::str(capsule.get_type().attr("__name__")).cast<std::string>(),
         ", expected an object with __dlpack__ or a 'dltensor' capsule");
  if (!PyCapsule_IsValid(capsule.ptr(), kCapsule))
    fail("from_dlpack", "the capsule cannot be consumed: got one named '",
         PyCapsule_GetName(capsule.ptr()) ? PyCapsule_GetName(capsule.ptr()) : "",
         "', expected an unused 'dltensor' capsule (each capsule is consumed once)");
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), kCapsule));
  const DLTensor& dl = managed->dl_tensor;
  if (dl.device.device_type != kDLCPU)
    fail("from_dlpack", "the tensor is not in CPU memory: got DLPack device type ",
         static_cast<int>(dl.device.device_type), ", expected kDLCPU (1)");
  const std::optional<DType> dtype = kiln_dtype(dl.dtype);
  if (!dtype)
    fail("from_dlpack", "unsupported element type: got DLPack code ",
         static_cast<int>(dl.dtype.code), " with ", static_cast<int>(dl.dtype.bits), " bits and ",
         dl.dtype.lanes, " lanes, expected a bool, integer or float type Kiln has");
  const auto item = static_cast<int64_t>(dtype_size(*dtype));
  std::vector<int64_t> dims(dl.shape, dl.shape + dl.ndim), strides(dims.size());
  int64_t step = 1;
  for (int i = dl.ndim - 1; i >= 0; --i) {
    const auto u = static_cast<std::size_t>(i);
    strides[u] = dl.strides ? dl.strides[i] : step;
    step *= dims[u];
  }
  // Kiln's storage starts at the view's lowest element; strides may be negative.
  int64_t low = 0, high = 0;
  bool empty = false;
  for (std::size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] == 0) empty = true;
    const int64_t reach = strides[i] * (dims[i] - 1);
    (reach < 0 ? low : high) += reach;
  }
  char* first = static_cast<char*>(dl.data) + dl.byte_offset;
  const std::size_t nbytes = empty ? 0 : static_cast<std::size_t>((high - low + 1) * item);
  auto owner = std::make_shared<Imported>(managed);
  PyCapsule_SetName(capsule.ptr(), kUsedCapsule);  // consumed: the owner calls the deleter
  auto impl = std::make_shared<TensorImpl>();
  impl->type = TensorType{*dtype, Shape(std::move(dims))};
  impl->storage = std::make_shared<Storage>(first + low * item, nbytes, Device::cpu, owner);
  impl->strides = std::move(strides);
  impl->offset = -low;
  return Tensor(std::move(impl));
}

}  // namespace

void bind_dlpack(py::module_& m) {
  auto tensor = py::reinterpret_borrow<py::class_<Tensor>>(m.attr("Tensor"));
  tensor.def(
      "__dlpack__",
      [](const Tensor& t, py::handle stream) {
        if (!stream.is_none())
          fail("__dlpack__",
               "a CPU tensor has no stream: got stream=", py::repr(stream).cast<std::string>(),
               ", expected None");
        return to_dlpack(t);
      },
      py::kw_only(), py::arg("stream") = py::none(),
      "A DLPack capsule viewing this tensor's memory (bool travels as uint8, as DLPack 0.6 has "
      "no bool). The capsule keeps the tensor's memory alive until its consumer lets go.");
  tensor.def(
      "__dlpack_device__", [](const Tensor&) { return py::make_tuple(int{kDLCPU}, 0); },
      "(device type, device id): (1, 0), the CPU.");
  m.def(
      "from_dlpack",
      [](py::object x) {
        if (const Tensor* t = tensor_ptr(x)) return *t;
        if (py::hasattr(x, "__dlpack__")) {
          if (py::hasattr(x, "__dlpack_device__")) {
            const auto device = x.attr("__dlpack_device__")().cast<std::pair<int, int>>();
            if (device.first != kDLCPU)
              fail("from_dlpack", "the tensor is not in CPU memory: got DLPack device type ",
                   device.first, ", expected kDLCPU (1)");
          }
          return from_capsule(x.attr("__dlpack__")());
        }
        return from_capsule(x);
      },
      py::arg("x"), R"doc(
A Tensor sharing the memory of `x`: any object with __dlpack__ (a PyTorch tensor, a NumPy array)
or a DLPack capsule, which is consumed. Writes through either side are visible in the other, and
the producer's memory lives as long as a Kiln view of it does.)doc");
}

}  // namespace kiln::python
