#include "kiln/tensor.h"

#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <ostream>
#include <sstream>

#include "detail/copy.h"
#include "detail/dtype_dispatch.h"
#include "detail/strided.h"
#include "detail/trace_hooks.h"

namespace kiln {

std::string_view device_name(Device d) {
  switch (d) {
    case Device::cpu: return "cpu";
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

namespace {
std::atomic<int64_t> g_current_bytes{0};
std::atomic<int64_t> g_peak_bytes{0};
}  // namespace

MemoryStats memory_stats() { return {g_current_bytes.load(), g_peak_bytes.load()}; }
void reset_peak_memory() { g_peak_bytes.store(g_current_bytes.load()); }

Storage::Storage(std::size_t nbytes, Device device) : nbytes_(nbytes), device_(device) {
  const std::size_t rounded = (std::max<std::size_t>(nbytes, 1) + 63) / 64 * 64;
  data_ = std::aligned_alloc(64, rounded);
  if (!data_) throw std::bad_alloc();
  const int64_t now = g_current_bytes.fetch_add(static_cast<int64_t>(nbytes)) + static_cast<int64_t>(nbytes);
  int64_t peak = g_peak_bytes.load();
  while (now > peak && !g_peak_bytes.compare_exchange_weak(peak, now)) {
  }
}
Storage::~Storage() {
  std::free(data_);
  g_current_bytes.fetch_sub(static_cast<int64_t>(nbytes_));
}

const TensorImpl& Tensor::checked() const {
  if (!impl_)
    fail("tensor", "used an undefined tensor: got a default-constructed Tensor, expected one "
                   "created by an operation");
  return *impl_;
}

void Tensor::check_access(DType want, const char* what) const {
  const TensorImpl& t = checked();
  if (t.tracer) detail::throw_concrete_value_error(what, *this);
  if (t.type.dtype != want)
    fail(what, "element type mismatch: got a tensor of ", dtype_name(t.type.dtype),
         ", expected ", dtype_name(want));
}

int64_t Tensor::dim(int axis) const {
  return shape()[normalize_axis("dim", axis, rank())];
}

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
  return detail::visit_dtype(t.type.dtype, [&]<typename S>() {
    return detail::convert<T>(*static_cast<const S*>(raw_data()));
  });
}

template <typename T>
std::vector<T> Tensor::to_vector(Loc) const {
  const TensorImpl& t = checked();
  if (t.tracer) detail::throw_concrete_value_error("to_vector", *this);
  std::vector<T> out(static_cast<std::size_t>(numel()));
  if (out.empty()) return out;
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

#define KILN_INSTANTIATE_READ(T)                 \
  template T Tensor::item<T>(Loc) const;         \
  template std::vector<T> Tensor::to_vector<T>(Loc) const;
KILN_INSTANTIATE_READ(uint8_t)
KILN_INSTANTIATE_READ(uint32_t)
KILN_INSTANTIATE_READ(int32_t)
KILN_INSTANTIATE_READ(int64_t)
KILN_INSTANTIATE_READ(Half)
KILN_INSTANTIATE_READ(BFloat16)
KILN_INSTANTIATE_READ(float)
KILN_INSTANTIATE_READ(double)
template bool Tensor::item<bool>(Loc) const;
#undef KILN_INSTANTIATE_READ

// ---- creation -----------------------------------------------------------------

namespace {
// No single buffer larger than physical memory can be used, and asking the allocator for one
// can abort (under sanitizers) or succeed only to be killed later (overcommit), so such a
// request fails up front.
std::size_t physical_memory() {
  static const std::size_t bytes = [] {
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    return pages > 0 && page > 0 ? static_cast<std::size_t>(pages) * static_cast<std::size_t>(page)
                                 : std::numeric_limits<std::size_t>::max();
  }();
  return bytes;
}
}  // namespace

Tensor detail::allocate(std::string_view op, const TensorType& type) {
  // Cannot overflow: a valid shape has at most Shape::kMaxNumel elements of at most 8 bytes.
  const std::size_t nbytes =
      static_cast<std::size_t>(type.shape.numel(op)) * dtype_size(type.dtype);
  if (nbytes > physical_memory())
    fail(op, "cannot allocate ", type, ": got a request for ", nbytes,
         " bytes, expected at most the machine's physical memory (", physical_memory(), " bytes)");
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
Tensor from_buffer(const void* data, std::size_t count, DType dtype, const Shape& shape,
                   Loc loc) {
  const detail::CallSite site(loc);
  if (static_cast<int64_t>(count) != shape.numel("tensor"))
    fail("tensor", "value count does not match the shape: got ", count, " values for shape ",
         shape, " (", shape.numel(), " elements) at ", loc.file_name(), ":", loc.line(),
         ", expected equal counts");
  Tensor t = allocate("tensor", TensorType{dtype, shape});
  if (count) std::memcpy(t.raw_data(), data, count * dtype_size(dtype));
  return t;
}
}  // namespace detail

}  // namespace kiln
