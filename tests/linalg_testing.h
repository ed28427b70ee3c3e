// Comparisons shared by the linear-algebra tests (test_lapack.cpp, test_linalg_decomp.cpp).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kiln/kiln.h"

namespace kiln::testing {

// The gradient of a scalar f at x along `direction` against central differences (float64).
template <typename F>
void expect_grad_fd(F f, const Tensor& x, const Tensor& direction, double rtol = 1e-6) {
  const Tensor g = grad(f)(x);
  const double h = 1e-6;
  const Tensor up = f(x + direction * h), down = f(x - direction * h);
  const double fd = (up.item<double>() - down.item<double>()) / (2 * h);
  EXPECT_NEAR(sum(g * direction).item<double>(), fd, rtol * std::max(1.0, std::abs(fd)));
}

}  // namespace kiln::testing
