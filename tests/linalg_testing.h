// The gradient check shared by the linear-algebra tests (test_lapack.cpp, test_linalg_decomp.cpp).
#pragma once

#include <gtest/gtest.h>

#include <source_location>

#include "kiln/kiln.h"
#include "testing.h"

namespace kiln::testing {

// The gradient of a scalar f at x along `direction` against central differences (float64),
// within rtol / 2 * (1 + |fd|), which is within rtol * max(1, |fd|).
template <typename F>
void expect_grad_fd(F f, const Tensor& x, const Tensor& direction, double rtol = 1e-6,
                    std::source_location at = std::source_location::current()) {
  const Tensor g = grad(f)(x);
  const double h = 1e-6;
  const Tensor up = f(x + direction * h), down = f(x - direction * h);
  const double fd = (up.item<double>() - down.item<double>()) / (2 * h);
  expect_allclose(sum(g * direction), {fd}, {.rtol = rtol / 2, .atol = rtol / 2},
                  "directional derivative", at);
}

}  // namespace kiln::testing
