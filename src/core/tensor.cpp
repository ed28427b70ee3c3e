#include "kiln/tensor.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <ostream>
#include <span>

#include "core/allocator.h"
#include "detail/copy.h"
#include "detail/dtype_dispatch.h"
#include "detail/strided.h"
#include "detail/trace_hooks.h"

namespace kiln {

std::string_view device_name(Device d) {
  switch (d) {
    case Device::cpu:
      return "cpu";
  }
  return "unknown";
}

std::string TensorType::to_string() const {
  std::string s(dtype_name(dtype));
  s += "[";
  for (int i = 0; i < shape.rank(); ++i) {
    if (i) s += ",";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}
std::ostream& operator<<(std::ostream& os, const TensorType& t) { return os << t.to_string(); }

Storage::Storage(std::size_t nbytes, Device device)
    : data_(detail::allocate_block(nbytes)), nbytes_(nbytes), device_(device) {}
Storage::Storage(void* data, std::size_t nbytes, Device device, std::shared_ptr<void> owner)
    : data_(data), nbytes_(nbytes), device_(device), owner_(std::move(owner)) {}
Storage::~Storage() {
  if (!owner_) detail::free_block(data_, nbytes_);
}

const TensorImpl& Tensor::checked() const {
  if (!impl_)
    fail("tensor",
         "used an undefined tensor: got a default-constructed Tensor, expected one "
         "created by an operation");
  return *impl_;
}

void Tensor::check_access(DType want, const char* what) const {
  const TensorImpl& t = checked();
  if (t.tracer) detail::throw_concrete_value_error(what, *this);
  if (t.type.dtype != want)
    fail(what, "element type mismatch: got a tensor of ", dtype_name(t.type.dtype), ", expected ",
         dtype_name(want));
}

int64_t Tensor::dim(int axis) const { return shape()[normalize_axis("dim", axis, rank())]; }

const std::vector<int64_t>& Tensor::strides() const {
  if (checked().tracer) detail::throw_concrete_value_error("strides", *this);
  return impl_->strides;
}
int64_t Tensor::offset() const {
  if (checked().tracer) detail::throw_concrete_value_error("offset", *this);
  return impl_->offset;
}
const std::shared_ptr<Storage>& Tensor::storage() const {
  if (checked().tracer) detail::throw_concrete_value_error("storage", *this);
  return impl_->storage;
}
Device Tensor::device() const { return is_traced() ? Device::cpu : storage()->device(); }

void* Tensor::raw_data() const {
  const auto& s = storage();
  return static_cast<char*>(s->data()) +
         impl_->offset * static_cast<int64_t>(dtype_size(impl_->type.dtype));
}

bool Tensor::is_contiguous() const {
  const auto& st = strides();
  const Shape& sh = shape();
  if (sh.numel() == 0) return true;  // no element to address: any strides will do (as numpy)
  int64_t expect = 1;
  for (int i = sh.rank() - 1; i >= 0; --i) {
    if (sh[i] != 1 && st[static_cast<std::size_t>(i)] != expect) return false;
    expect *= sh[i];
  }
  return true;
}

Tensor::operator bool() const {
  if (checked().tracer) detail::throw_concrete_value_error("bool", *this);
  if (numel() != 1)
    fail("bool", "truth value of a tensor with several elements is ambiguous: got ", type(),
         ", expected one element (use any() or all())");
  return item<bool>();
}

bool Tensor::shares_storage_with(const Tensor& other) const {
  return defined() && other.defined() && !is_traced() && !other.is_traced() &&
         impl_->storage == other.impl_->storage;
}

Tensor Tensor::contiguous() const {
  if (checked().tracer || is_contiguous()) return *this;
  Tensor out = empty(type());
  detail::copy_cast(*this, out);
  return out;
}

template <typename T>
T Tensor::item(Loc loc) const {
  const detail::CallSite site(loc);
  const TensorImpl& t = checked();
  if (t.tracer) detail::throw_concrete_value_error("item", *this);
  if (t.type.shape.numel() != 1)
    fail("item", "expected a tensor with exactly one element: got ", t.type.to_string(), " (",
         t.type.shape.numel(), " elements)", " at ", loc.file_name(), ":", loc.line());
  return detail::visit_any_dtype(t.type.dtype, [&]<typename S>() {
    return detail::convert<T>(*static_cast<const S*>(raw_data()));
  });
}

template <typename T>
std::vector<T> Tensor::to_vector(Loc) const {
  const TensorImpl& t = checked();
  if (t.tracer) detail::throw_concrete_value_error("to_vector", *this);
  std::vector<T> out(static_cast<std::size_t>(numel()));
  if (out.empty()) return out;
  if (dtype() == dtype_v<T> && is_contiguous()) {  // read in place: no buffer to convert into
    const T* p = data<const T>();
    std::copy(p, p + out.size(), out.begin());
    return out;
  }
  Tensor dst = empty(Shape(shape()), dtype_v<T>);
  detail::copy_cast(*this, dst);
  const T* p = dst.data<const T>();
  std::copy(p, p + out.size(), out.begin());
  return out;
}

template <>
std::vector<bool> Tensor::to_vector<bool>(Loc) const {
  const TensorImpl& t = checked();
  if (t.tracer) detail::throw_concrete_value_error("to_vector", *this);
  Tensor dst = empty(Shape(shape()), bool_);
  detail::copy_cast(*this, dst);
  const bool* p = dst.data<const bool>();
  return std::vector<bool>(p, p + numel());
}

#define KILN_INSTANTIATE_READ(T)         \
  template T Tensor::item<T>(Loc) const; \
  template std::vector<T> Tensor::to_vector<T>(Loc) const;
KILN_INSTANTIATE_READ(uint8_t)
KILN_INSTANTIATE_READ(uint32_t)
KILN_INSTANTIATE_READ(int32_t)
KILN_INSTANTIATE_READ(int64_t)
KILN_INSTANTIATE_READ(Half)
KILN_INSTANTIATE_READ(BFloat16)
KILN_INSTANTIATE_READ(float)
KILN_INSTANTIATE_READ(double)
KILN_INSTANTIATE_READ(std::complex<float>)
KILN_INSTANTIATE_READ(std::complex<double>)
template bool Tensor::item<bool>(Loc) const;
#undef KILN_INSTANTIATE_READ

// ---- creation -----------------------------------------------------------------

Tensor detail::allocate(std::string_view op, const TensorType& type) {
  // Cannot overflow: a valid shape has at most Shape::kMaxNumel = INT64_MAX / 8 elements of at
  // most 16 bytes, under 2^64.
  const std::size_t nbytes =
      static_cast<std::size_t>(type.shape.numel(op)) * dtype_size(type.dtype);
  // No single buffer larger than physical memory can be used, and asking the allocator for one
  // can abort (under sanitizers) or succeed only to be killed later (overcommit).
  if (nbytes > detail::physical_memory())
    fail(op, "cannot allocate ", type, ": got a request for ", nbytes,
         " bytes, expected at most the machine's physical memory (", detail::physical_memory(),
         " bytes)");
  auto impl = std::make_shared<TensorImpl>();
  impl->type = type;
  impl->strides = contiguous_strides(type.shape);
  try {
    impl->storage = std::make_shared<Storage>(nbytes, Device::cpu);
  } catch (const std::bad_alloc&) {
    fail(op, "out of memory allocating ", type, ": got a request for ", nbytes,
         " bytes, expected one the system can satisfy");
  }
  return Tensor(std::move(impl));
}

Tensor empty(const TensorType& type) { return detail::allocate("empty", type); }
Tensor empty(const Shape& shape, DType dtype) { return empty(TensorType{dtype, shape}); }

namespace detail {
Tensor from_buffer(const void* data, std::size_t count, DType dtype, const Shape& shape, Loc loc) {
  const detail::CallSite site(loc);
  if (static_cast<int64_t>(count) != shape.numel("tensor"))
    fail("tensor", "value count does not match the shape: got ", count, " values for shape ", shape,
         " (", shape.numel(), " elements) at ", loc.file_name(), ":", loc.line(),
         ", expected equal counts");
  Tensor t = allocate("tensor", TensorType{dtype, shape});
  if (count) std::memcpy(t.raw_data(), data, count * dtype_size(dtype));
  // A bool is stored as 0 or 1, which kernels and compiled code rely on: any other byte is true.
  if (dtype == bool_)
    for (uint8_t& b : std::span(static_cast<uint8_t*>(t.raw_data()), count)) b = b != 0;
  return t;
}
}  // namespace detail

namespace {

// Fills a new contiguous tensor with f(i) for each flat index i; `op` names the creation
// function in errors (an invalid shape, an allocation that cannot be satisfied).
template <typename F>
Tensor generate(std::string_view op, const Shape& shape, DType dtype, F f) {
  Tensor t = detail::allocate(op, TensorType{dtype, shape});
  detail::visit_any_dtype(dtype, [&]<typename T>() {
    T* p = t.data<T>();
    const int64_t n = t.numel();
    for (int64_t i = 0; i < n; ++i) p[i] = detail::convert<T>(f(i));
  });
  return t;
}

Tensor filled(std::string_view op, const Shape& shape, double value, DType dtype) {
  return generate(op, shape, dtype, [value](int64_t) { return value; });
}

}  // namespace

Tensor full(const Shape& shape, double value, DType dtype) {
  return filled("full", shape, value, dtype);
}
Tensor zeros(const Shape& shape, DType dtype) { return filled("zeros", shape, 0.0, dtype); }
Tensor ones(const Shape& shape, DType dtype) { return filled("ones", shape, 1.0, dtype); }
Tensor zeros_like(const Tensor& t) { return filled("zeros_like", t.shape(), 0.0, t.dtype()); }
Tensor ones_like(const Tensor& t) { return filled("ones_like", t.shape(), 1.0, t.dtype()); }
Tensor full_like(const Tensor& t, double value) {
  return filled("full_like", t.shape(), value, t.dtype());
}

Tensor arange(double start, double stop, double step, DType dtype, Loc loc) {
  const detail::CallSite site(loc);
  if (step == 0 || !std::isfinite(start) || !std::isfinite(stop) || !std::isfinite(step))
    fail("arange", "invalid range: got start=", start, ", stop=", stop, ", step=", step, " at ",
         loc.file_name(), ":", loc.line(), ", expected finite values and a non-zero step");
  const double count = std::max(0.0, std::ceil((stop - start) / step));
  // Checked before the conversion, which is undefined beyond int64_t (and the quotient can be
  // infinite: arange(-1e308, 1e308, 1e-308)).
  if (!(count <= static_cast<double>(Shape::kMaxNumel)))
    fail("arange", "too many elements: got start=", start, ", stop=", stop, ", step=", step, " (",
         count, " elements) at ", loc.file_name(), ":", loc.line(), ", expected at most ",
         Shape::kMaxNumel);
  const auto n = static_cast<int64_t>(count);
  return generate("arange", Shape{n}, dtype,
                  [=](int64_t i) { return start + static_cast<double>(i) * step; });
}

Tensor linspace(double start, double stop, int64_t num, DType dtype, Loc loc) {
  const detail::CallSite site(loc);
  if (num < 0)
    fail("linspace", "negative count: got num=", num, " at ", loc.file_name(), ":", loc.line(),
         ", expected num >= 0");
  const double step = num > 1 ? (stop - start) / static_cast<double>(num - 1) : 0.0;
  return generate("linspace", Shape{num}, dtype, [=](int64_t i) {
    return num > 1 && i == num - 1 ? stop : start + static_cast<double>(i) * step;
  });
}

Tensor eye(int64_t n, int64_t m, DType dtype) {
  if (n < 0 || m < 0) fail("eye", "negative size: got ", n, "x", m, ", expected sizes >= 0");
  return generate("eye", Shape{n, m}, dtype, [m](int64_t i) { return i / m == i % m ? 1.0 : 0.0; });
}
Tensor eye(int64_t n, DType dtype) { return eye(n, n, dtype); }

}  // namespace kiln
