// The points where concrete-only requests meet traced tensors.
#pragma once

#include <string_view>

#include "kiln/tensor.h"

namespace kiln::detail {

// Raised when code asks a traced tensor for a concrete value (item, to_vector, a C++ `if`).
[[noreturn]] void throw_concrete_value_error(std::string_view what, const Tensor& t);

}  // namespace kiln::detail
