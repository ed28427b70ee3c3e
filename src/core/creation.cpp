#include <cmath>

#include "detail/dtype_dispatch.h"
#include "detail/copy.h"
#include "kiln/tensor.h"

namespace kiln {
namespace {

// Fills a new contiguous tensor with f(i) for each flat index i; `op` names the creation
// function in errors (an invalid shape, an allocation that cannot be satisfied).
template <typename F>
Tensor generate(std::string_view op, const Shape& shape, DType dtype, F f) {
  Tensor t = detail::allocate(op, TensorType{dtype, shape});
  detail::visit_dtype(dtype, [&]<typename T>() {
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
  if (n < 0 || m < 0)
    fail("eye", "negative size: got ", n, "x", m, ", expected sizes >= 0");
  return generate("eye", Shape{n, m}, dtype, [m](int64_t i) { return i / m == i % m ? 1.0 : 0.0; });
}
Tensor eye(int64_t n, DType dtype) { return eye(n, n, dtype); }

}  // namespace kiln
