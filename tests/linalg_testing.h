// Comparisons shared by the linear-algebra tests (test_lapack.cpp, test_linalg_decomp.cpp).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kiln/kiln.h"

namespace kiln::testing {

// max |a - b| <= atol + rtol |b| elementwise, NaNs matching.
inline void expect_close(const Tensor& a, const Tensor& b, double rtol, double atol = 0.0) {
  ASSERT_EQ(a.shape(), b.shape());
  const std::vector<double> x = astype(a, float64).to_vector<double>();
  const std::vector<double> y = astype(b, float64).to_vector<double>();
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (std::isnan(y[i])) {
      EXPECT_TRUE(std::isnan(x[i])) << "at " << i;
      continue;
    }
    EXPECT_NEAR(x[i], y[i], atol + rtol * std::abs(y[i])) << "at " << i;
  }
}

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
