// Runs a template lambda for the C++ type of a runtime dtype.
#pragma once

#include <complex>
#include <cstdint>

#include "kiln/dtype.h"
#include "kiln/error.h"

namespace kiln::detail {

template <typename T>
inline constexpr bool is_complex_v = false;
template <typename T>
inline constexpr bool is_complex_v<std::complex<T>> = true;

// Calls f.template operator()<T>() with T the element type of d, for the real dtypes: kernels
// that also take complex values use visit_any_dtype, so generic code need not compile for them.
template <typename F>
decltype(auto) visit_dtype(DType d, F&& f) {
  switch (d) {
    case DType::bool_:
      return f.template operator()<bool>();
    case DType::uint8:
      return f.template operator()<uint8_t>();
    case DType::uint32:
      return f.template operator()<uint32_t>();
    case DType::int32:
      return f.template operator()<int32_t>();
    case DType::int64:
      return f.template operator()<int64_t>();
    case DType::float16:
      return f.template operator()<Half>();
    case DType::bfloat16:
      return f.template operator()<BFloat16>();
    case DType::float32:
      return f.template operator()<float>();
    case DType::float64:
      return f.template operator()<double>();
    case DType::complex64:
    case DType::complex128:
      fail("dtype", "complex values are not supported here: got ", dtype_name(d),
           ", expected a real dtype");
  }
  fail("dtype", "unknown dtype code ", static_cast<int>(d));
}

// Complex dtypes only (c64, c128).
template <typename F>
decltype(auto) visit_complex(DType d, F&& f) {
  if (d == DType::complex64) return f.template operator()<std::complex<float>>();
  if (d == DType::complex128) return f.template operator()<std::complex<double>>();
  fail("dtype", "not a complex dtype: got ", dtype_name(d), ", expected complex64 or complex128");
}

// Every dtype, complex included.
template <typename F>
decltype(auto) visit_any_dtype(DType d, F&& f) {
  if (is_complex(d)) return visit_complex(d, std::forward<F>(f));
  return visit_dtype(d, std::forward<F>(f));
}

// Floating dtypes only (f16, bf16, f32, f64).
template <typename F>
decltype(auto) visit_floating(DType d, F&& f) {
  switch (d) {
    case DType::float16:
      return f.template operator()<Half>();
    case DType::bfloat16:
      return f.template operator()<BFloat16>();
    case DType::float32:
      return f.template operator()<float>();
    case DType::float64:
      return f.template operator()<double>();
    default:
      fail("dtype", "expected a floating dtype, got ", dtype_name(d));
  }
}

// The type arithmetic runs in: float for the 16-bit formats, the type itself otherwise.
template <typename T>
struct compute_type {
  using type = T;
};
template <>
struct compute_type<Half> {
  using type = float;
};
template <>
struct compute_type<BFloat16> {
  using type = float;
};
template <typename T>
using compute_t = typename compute_type<T>::type;

// Accumulator for sums: double for every float (accuracy of long sums), int64 for integers.
template <typename T>
using accum_t = std::conditional_t<
    std::is_floating_point_v<compute_t<T>>, double,
    std::conditional_t<std::is_same_v<T, bool>, int64_t,
                       std::conditional_t<std::is_unsigned_v<T>, uint64_t, int64_t>>>;

}  // namespace kiln::detail
