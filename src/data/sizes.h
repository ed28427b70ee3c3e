// Checked size arithmetic for kiln::data. Sizes computed from file headers, options or
// arguments are combined only through these, so an overflow is seen (and becomes an Error or an
// unknown size) instead of wrapping around.
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <span>

namespace kiln::data::detail {

// The product of sizes >= 0, or nullopt when it does not fit in int64. As in Kiln's strides
// (partial products of the sizes, zeros counted as 1), a zero makes the product 0 but is left out
// of the overflow check: [0, 2^40, 2^40] does not fit.
inline std::optional<int64_t> checked_product(std::span<const int64_t> factors) {
  int64_t bound = 1;
  bool zero = false;
  for (const int64_t f : factors) {
    zero = zero || f == 0;
    if (f < 0 || __builtin_mul_overflow(bound, std::max<int64_t>(f, 1), &bound))
      return std::nullopt;
  }
  return zero ? 0 : bound;
}
inline std::optional<int64_t> checked_product(std::initializer_list<int64_t> factors) {
  return checked_product(std::span<const int64_t>(factors.begin(), factors.size()));
}

// The sum of sizes >= 0, or nullopt when it does not fit in int64.
inline std::optional<int64_t> checked_sum(std::initializer_list<int64_t> terms) {
  int64_t sum = 0;
  for (const int64_t t : terms)
    if (t < 0 || __builtin_add_overflow(sum, t, &sum)) return std::nullopt;
  return sum;
}

// ceil(n / d) for n >= 0 and d >= 1, without the overflow of (n + d - 1) / d.
inline int64_t ceil_div(int64_t n, int64_t d) { return n / d + (n % d != 0); }

}  // namespace kiln::data::detail
