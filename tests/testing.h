// Helpers shared by the test files.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kiln/error.h"
#include "kiln/io.h"
#include "kiln/ir.h"
#include "kiln/ops.h"
#include "kiln/primitive.h"

namespace kiln::testing {

// Runs fn, expects a kiln::Error whose message starts with "[op] " and contains each part.
inline void expect_error(const std::function<void()>& fn, const std::string& op,
                         const std::vector<std::string>& parts) {
  try {
    fn();
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind("[" + op + "] ", 0), 0u) << msg;
    EXPECT_EQ(e.op(), op) << msg;
    for (const std::string& p : parts)
      EXPECT_NE(msg.find(p), std::string::npos) << "missing '" << p << "' in: " << msg;
    return;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected a kiln::Error from " << op
                  << ", got another exception: " << e.what();
    return;
  }
  ADD_FAILURE() << "expected a kiln::Error from " << op;
}

// n uniform values in [lo, hi) from a fixed seed: inputs independent of Kiln's own RNG.
inline std::vector<double> random_values(int64_t n, uint32_t seed, double lo = -1.0,
                                         double hi = 1.0) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> v(static_cast<std::size_t>(n));
  for (double& x : v) x = dist(gen);
  return v;
}

// Within tol of want, relative to max(1, |want|), in float64; NaN and infinities must match.
inline void expect_close(const Tensor& got, const Tensor& want, double tol,
                         const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  const std::vector<double> g = astype(got, float64).to_vector<double>();
  const std::vector<double> w = astype(want, float64).to_vector<double>();
  for (std::size_t i = 0; i < g.size(); ++i) {
    if (std::isnan(w[i]) || std::isinf(w[i])) {
      ASSERT_TRUE(std::isnan(w[i]) ? std::isnan(g[i]) : g[i] == w[i]) << what << " at " << i;
      continue;
    }
    ASSERT_NEAR(g[i], w[i], tol * std::max(1.0, std::abs(w[i]))) << what << " at " << i;
  }
}

// Within tol of want, relative to 1 + |want|, element by element.
inline void expect_close(const Tensor& got, const std::vector<double>& want, double tol) {
  const std::vector<double> g = got.to_vector<double>();
  ASSERT_EQ(g.size(), want.size());
  for (std::size_t i = 0; i < g.size(); ++i)
    EXPECT_NEAR(g[i], want[i], tol * (1 + std::abs(want[i]))) << "element " << i;
}

// Central finite differences of a scalar function, element by element, in float64.
inline std::vector<double> fd_grad(const std::function<double(const Tensor&)>& f, const Tensor& x,
                                   double h = 1e-6) {
  std::vector<double> v = x.to_vector<double>(), g(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    std::vector<double> p = v, m = v;
    p[i] += h;
    m[i] -= h;
    g[i] = (f(tensor(p, x.shape())) - f(tensor(m, x.shape()))) / (2 * h);
  }
  return g;
}
// The same for f returning a 0-d tensor.
inline std::vector<double> numeric_grad(const std::function<Tensor(const Tensor&)>& f,
                                        const Tensor& x) {
  return fd_grad([&](const Tensor& t) { return f(t).item<double>(); }, x);
}

#ifdef KILN_REFERENCE_DIR
// Reference values a script computed with numpy / scipy at build time: `name` is the file a
// `kiln_reference_file(<test> <name>)` line in tests/CMakeLists.txt generates from
// tests/reference/<name>_ref.py. `at(file, "case")` raises if the script did not write it.
inline io::TensorFile reference(const std::string& name) {
  return io::load_tensors(std::string(KILN_REFERENCE_DIR) + "/" + name + ".safetensors");
}
inline Tensor at(const io::TensorFile& file, const std::string& name) {
  const Tensor* t = file.find(name);
  if (!t) throw Error("reference", "no tensor '" + name + "' in the reference file");
  return *t;
}
#endif

}  // namespace kiln::testing
