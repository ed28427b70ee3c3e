// Integer arithmetic that wraps on overflow (as numpy does) instead of being undefined.
#pragma once

#include <type_traits>

namespace kiln::detail {

template <typename T, typename Op>
T wrapping(T a, T b, Op op) {
  if constexpr (std::is_integral_v<T> && std::is_signed_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(op(static_cast<U>(a), static_cast<U>(b)));
  } else {
    return static_cast<T>(op(a, b));
  }
}

}  // namespace kiln::detail
