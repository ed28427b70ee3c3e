// Tensor: a reference-counted handle to a strided view of typed storage, or to a traced value.
#pragma once

#include <concepts>
#include <cstdint>
#include <initializer_list>
#include <iosfwd>
#include <memory>
#include <source_location>
#include <string>
#include <type_traits>
#include <vector>

#include "kiln/dtype.h"
#include "kiln/error.h"
#include "kiln/shape.h"

namespace kiln {

using Loc = std::source_location;

enum class Device : uint8_t { cpu };
std::string_view device_name(Device d);

// A dtype and a shape: everything the type rules and the IR know of a value.
struct TensorType {
  DType dtype = float32;
  Shape shape;
  std::string to_string() const;  // "f32[2,3]"
  bool operator==(const TensorType&) const = default;
};
std::ostream& operator<<(std::ostream& os, const TensorType& t);

// A 64-byte aligned buffer. Views share it through shared_ptr. Large ones come from the caching
// allocator (include/kiln/runtime.h).
class Storage {
 public:
  Storage(std::size_t nbytes, Device device);
  // Memory owned elsewhere (a NumPy array, a DLPack tensor): `owner` stays alive as long as
  // this storage does, and is what releases the memory.
  Storage(void* data, std::size_t nbytes, Device device, std::shared_ptr<void> owner);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const { return data_; }
  std::size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }

 private:
  void* data_;
  std::size_t nbytes_;
  Device device_;
  std::shared_ptr<void> owner_;  // set for borrowed memory
};

namespace detail {
class Tracer;  // a value being recorded into an IR function (src/ir)
}

struct TensorImpl {
  TensorType type;
  // Concrete tensors: strided view of storage, strides and offset in elements.
  std::shared_ptr<Storage> storage;
  std::vector<int64_t> strides;
  int64_t offset = 0;
  // Traced tensors have a tracer instead of storage.
  std::shared_ptr<detail::Tracer> tracer;
};

class Tensor {
 public:
  Tensor() = default;  // undefined until assigned; ops on it raise Error
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  bool defined() const { return impl_ != nullptr; }
  const TensorType& type() const { return checked().type; }
  DType dtype() const { return checked().type.dtype; }
  const Shape& shape() const { return checked().type.shape; }
  int rank() const { return shape().rank(); }
  int64_t numel() const { return shape().numel(); }
  int64_t dim(int axis) const;  // negative axes count from the end

  // Concrete data access (kernels and readers). Throw on traced tensors.
  bool is_traced() const { return impl_ && impl_->tracer != nullptr; }
  const std::vector<int64_t>& strides() const;
  int64_t offset() const;
  const std::shared_ptr<Storage>& storage() const;
  bool is_contiguous() const;
  Device device() const;
  // Pointer to element 0 of the view. T must match dtype().
  template <typename T>
  T* data() const {
    check_access(dtype_v<std::remove_const_t<T>>, "data");
    return static_cast<T*>(impl_->storage->data()) + impl_->offset;
  }
  void* raw_data() const;  // element 0 of the view, untyped

  // Reading back values. T converts from the tensor's dtype like static_cast.
  template <typename T>
  T item(Loc loc = Loc::current()) const;
  template <typename T>
  std::vector<T> to_vector(Loc loc = Loc::current()) const;

  // Truth value of a one-element tensor, for a C++ `if`. On a traced tensor it raises an
  // Error pointing to kiln::cond / kiln::while_loop (C++ control flow cannot be traced).
  explicit operator bool() const;

  // A contiguous copy, or this tensor when it already is contiguous.
  Tensor contiguous() const;

  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  // True when both handles refer to the same storage (views share it).
  bool shares_storage_with(const Tensor& other) const;

 private:
  const TensorImpl& checked() const;
  void check_access(DType want, const char* what) const;
  std::shared_ptr<TensorImpl> impl_;
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);
std::string to_string(const Tensor& t);

// ---- creation ---------------------------------------------------------------

// A new contiguous, uninitialised tensor. An invalid shape or an allocation that cannot be
// satisfied (over the machine's physical memory, or refused) raises an Error.
Tensor empty(const Shape& shape, DType dtype = float32);
Tensor empty(const TensorType& type);

namespace detail {
// empty() for the creation function `op`, whose name its errors carry.
Tensor allocate(std::string_view op, const TensorType& type);
Tensor from_buffer(const void* data, std::size_t count, DType dtype, const Shape& shape, Loc loc);
}  // namespace detail

template <typename T>
requires std::is_arithmetic_v<T> Tensor tensor(const std::vector<T>& values, const Shape& shape,
                                               Loc loc = Loc::current()) {
  if constexpr (std::is_same_v<T, bool>) {
    std::vector<uint8_t> bytes(values.begin(), values.end());
    return detail::from_buffer(bytes.data(), bytes.size(), bool_, shape, loc);
  } else if constexpr (std::is_same_v<T, long long> || std::is_same_v<T, long>) {
    std::vector<int64_t> v(values.begin(), values.end());
    return detail::from_buffer(v.data(), v.size(), int64, shape, loc);
  } else if constexpr (std::is_same_v<T, int>) {
    return detail::from_buffer(values.data(), values.size(), int32, shape, loc);
  } else if constexpr (std::is_same_v<T, unsigned> || std::is_same_v<T, uint8_t> ||
                       std::is_same_v<T, float> || std::is_same_v<T, double>) {
    return detail::from_buffer(values.data(), values.size(), dtype_v<T>, shape, loc);
  } else {
    std::vector<double> v(values.begin(), values.end());
    return detail::from_buffer(v.data(), v.size(), float64, shape, loc);
  }
}
// 1-d from values; C++ float gives float32, double float64, int int32, int64_t int64.
template <typename T>
requires std::is_arithmetic_v<T> Tensor tensor(std::initializer_list<T> values,
                                               Loc loc = Loc::current()) {
  std::vector<T> v(values);
  return tensor(v, Shape{static_cast<int64_t>(v.size())}, loc);
}
template <typename T>
requires std::is_arithmetic_v<T> Tensor tensor(std::initializer_list<T> values, const Shape& shape,
                                               Loc loc = Loc::current()) {
  return tensor(std::vector<T>(values), shape, loc);
}
template <typename T>
requires std::is_arithmetic_v<T> Tensor tensor(const std::vector<T>& values,
                                               Loc loc = Loc::current()) {
  return tensor(values, Shape{static_cast<int64_t>(values.size())}, loc);
}
// 0-d scalar.
template <typename T>
requires std::is_arithmetic_v<T> Tensor tensor(T value, Loc loc = Loc::current()) {
  return tensor(std::vector<T>{value}, Shape{}, loc);
}

// Complex tensors: std::complex<float> gives complex64, std::complex<double> complex128.
template <typename T>
requires std::is_floating_point_v<T> Tensor tensor(const std::vector<std::complex<T>>& values,
                                                   const Shape& shape, Loc loc = Loc::current()) {
  return detail::from_buffer(values.data(), values.size(), dtype_v<std::complex<T>>, shape, loc);
}
template <typename T>
requires std::is_floating_point_v<T> Tensor tensor(const std::vector<std::complex<T>>& values,
                                                   Loc loc = Loc::current()) {
  return tensor(values, Shape{static_cast<int64_t>(values.size())}, loc);
}
template <typename T>
requires std::is_floating_point_v<T> Tensor tensor(std::complex<T> value,
                                                   Loc loc = Loc::current()) {
  return tensor(std::vector<std::complex<T>>{value}, Shape{}, loc);
}

Tensor zeros(const Shape& shape, DType dtype = float32);
Tensor ones(const Shape& shape, DType dtype = float32);
Tensor full(const Shape& shape, double value, DType dtype = float32);
Tensor zeros_like(const Tensor& t);
Tensor ones_like(const Tensor& t);
Tensor full_like(const Tensor& t, double value);
// Values start, start+step, ... below stop.
Tensor arange(double start, double stop, double step = 1.0, DType dtype = float32,
              Loc loc = Loc::current());
// 0, 1, ..., stop-1 (int64 by default).
template <std::integral I>
Tensor arange(I stop, DType dtype = int64, Loc loc = Loc::current()) {
  return arange(0.0, static_cast<double>(stop), 1.0, dtype, loc);
}
Tensor linspace(double start, double stop, int64_t num, DType dtype = float32,
                Loc loc = Loc::current());
Tensor eye(int64_t n, DType dtype = float32);
Tensor eye(int64_t n, int64_t m, DType dtype = float32);

}  // namespace kiln
