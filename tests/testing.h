// Helpers shared by the test files.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <iomanip>
#include <optional>
#include <random>
#include <source_location>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/error.h"
#include "kiln/io.h"
#include "kiln/ir.h"
#include "kiln/ops.h"
#include "kiln/primitive.h"

namespace kiln::testing {

// An environment variable set for the scope (then unset): settings Kiln reads when it compiles.
struct EnvVar {
  std::string name;
  EnvVar(std::string n, const std::string& value) : name(std::move(n)) {
    setenv(name.c_str(), value.c_str(), 1);
  }
  ~EnvVar() { unsetenv(name.c_str()); }
  EnvVar(const EnvVar&) = delete;
  EnvVar& operator=(const EnvVar&) = delete;
};

// Kiln's thread count set for a scope, the previous count restored on leaving it (also when a
// failed ASSERT leaves the test early).
struct Threads {
  int saved = num_threads();
  explicit Threads(int n) { set_num_threads(n); }
  ~Threads() { set_num_threads(saved); }
  Threads(const Threads&) = delete;
  Threads& operator=(const Threads&) = delete;
};

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

// The one closeness check of the tests (the overloads below only gather values), by the rule of
// kiln::isclose and numpy.isclose: |got - want| <= atol + rtol |want| element by element (the
// defaults are numpy's); a NaN matches only a NaN at the same position, and only with
// tol.equal_nan; an infinity matches only the same infinity. Computed here, not with
// kiln::isclose, which tests check. A failure, reported at the caller's line, names `what`, how
// many elements differ, and the one furthest past its bound: flat index, got, want and the bound.
inline void expect_allclose(const std::vector<double>& got, const std::vector<double>& want,
                            Closeness tol = {}, std::string_view what = "",
                            std::source_location at = std::source_location::current()) {
  const std::string name(what.empty() ? "values" : what);
  if (got.size() != want.size()) {
    ADD_FAILURE_AT(at.file_name(), at.line())
        << name << ": " << got.size() << " elements, want " << want.size();
    return;
  }
  std::optional<std::size_t> worst;
  double worst_excess = 0.0;
  std::size_t differing = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], w = want[i];
    double excess = 0.0;  // how far past its bound; infinite for a NaN or infinity mismatch
    if (std::isnan(g) || std::isnan(w))
      excess = tol.equal_nan && std::isnan(g) && std::isnan(w) ? 0.0 : INFINITY;
    else if (std::isinf(g) || std::isinf(w))
      excess = g == w ? 0.0 : INFINITY;
    else
      excess = std::abs(g - w) - (tol.atol + tol.rtol * std::abs(w));
    if (excess <= 0.0) continue;
    ++differing;
    if (!worst || excess > worst_excess) {
      worst = i;
      worst_excess = excess;
    }
  }
  if (!worst) return;
  const double g = got[*worst], w = want[*worst];
  std::ostringstream why;
  why << std::setprecision(17);
  if (std::isinf(worst_excess))
    why << "a NaN or infinity matches only itself"
        << (tol.equal_nan ? "" : " (NaN with equal_nan)");
  else
    why << "|got - want| " << std::abs(g - w) << " > bound " << tol.atol + tol.rtol * std::abs(w)
        << " (rtol " << tol.rtol << ", atol " << tol.atol << ")";
  ADD_FAILURE_AT(at.file_name(), at.line())
      << std::setprecision(17) << name << ": " << differing << " of " << got.size()
      << " elements differ; worst at flat index " << *worst << ": got " << g << ", want " << w
      << ", " << why.str();
}

// Tensors of one shape and dtype. A floating `got` may be checked against a float64 `want`: a
// reference computed in double precision.
inline void expect_allclose(const Tensor& got, const Tensor& want, Closeness tol = {},
                            std::string_view what = "",
                            std::source_location at = std::source_location::current()) {
  const bool reference = want.dtype() == float64 && is_floating(got.dtype());
  if (got.shape() != want.shape() || (got.dtype() != want.dtype() && !reference)) {
    ADD_FAILURE_AT(at.file_name(), at.line())
        << (what.empty() ? "values" : what) << ": " << got.type() << ", want " << want.type();
    return;
  }
  expect_allclose(astype(got, float64).to_vector<double>(),
                  astype(want, float64).to_vector<double>(), tol, what, at);
}

// A tensor against values listed in row-major order (any dtype, same element count).
inline void expect_allclose(const Tensor& got, const std::vector<double>& want, Closeness tol = {},
                            std::string_view what = "",
                            std::source_location at = std::source_location::current()) {
  expect_allclose(astype(got, float64).to_vector<double>(), want, tol, what, at);
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

// How many outputs of primitive `name` the compiled function `f` (a jit) stores
// channel-blocked for these arguments (CompiledInfo::channel_blocked).
template <typename Jitted, typename... Args>
int blocked_outputs(Jitted&& f, const std::string& name, const Args&... args) {
  const ir::CompiledInfo info = f.compiled(args...);
  int n = 0;
  for (const ir::Equation& e : f.lower(args...).equations)
    if (e.prim->name == name)
      for (const ir::Value& v : e.outputs)
        n += static_cast<int>(
            std::count(info.channel_blocked.begin(), info.channel_blocked.end(), v.id));
  return n;
}

}  // namespace kiln::testing
