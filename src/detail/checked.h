// Arithmetic on sizes that come from users (attributes, arguments): a sum or product that
// does not fit in int64_t raises an Error naming the op instead of wrapping (undefined
// behaviour). Results that do fit are still checked as shapes where shapes are made.
#pragma once

#include <cstdint>
#include <string_view>

#include "kiln/error.h"

namespace kiln::detail {

inline int64_t checked_add(std::string_view op, int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r))
    fail(op, "size overflows: got ", a, " + ", b, ", expected a result below 2^63");
  return r;
}

inline int64_t checked_mul(std::string_view op, int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r))
    fail(op, "size overflows: got ", a, " * ", b, ", expected a result below 2^63");
  return r;
}

}  // namespace kiln::detail
