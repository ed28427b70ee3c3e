// Copying between strided views, converting dtypes on the way.
#pragma once

#include <limits>
#include <type_traits>

#include "detail/dtype_dispatch.h"
#include "kiln/tensor.h"

namespace kiln::detail {

// dst = src (same shape), converting each element like static_cast (bool: x != 0).
void copy_cast(const Tensor& src, const Tensor& dst);

// convert() between two real element types.
template <typename To, typename From>
inline To convert_real(From v) {
  constexpr bool from_half = std::is_same_v<From, Half> || std::is_same_v<From, BFloat16>;
  using F = std::conditional_t<from_half, float, From>;
  const F x = static_cast<F>(v);
  if constexpr (std::is_same_v<To, bool>) {
    return x != F{0};
  } else if constexpr (std::is_same_v<To, Half> || std::is_same_v<To, BFloat16>) {
    return To(static_cast<float>(x));
  } else if constexpr (std::is_integral_v<To> && std::is_floating_point_v<F>) {
    if (x != x) return To{0};
    if (x <= static_cast<F>(std::numeric_limits<To>::min())) return std::numeric_limits<To>::min();
    if (x >= static_cast<F>(std::numeric_limits<To>::max())) return std::numeric_limits<To>::max();
    return static_cast<To>(x);
  } else {
    return static_cast<To>(x);
  }
}

// Converts one element between C++ element types, like static_cast but defined for every
// value: bool means "not zero"; float to integer saturates and maps NaN to 0; complex to real
// keeps the real part (as numpy's astype), real to complex has imaginary part 0.
template <typename To, typename From>
inline To convert(From v) {
  if constexpr (is_complex_v<From> && is_complex_v<To>) {
    return To(v);
  } else if constexpr (is_complex_v<From>) {
    if constexpr (std::is_same_v<To, bool>)
      return v != From{};
    else
      return convert<To>(v.real());
  } else if constexpr (is_complex_v<To>) {
    return To(convert<typename To::value_type>(v), 0);
  } else {
    return convert_real<To>(v);
  }
}

}  // namespace kiln::detail
