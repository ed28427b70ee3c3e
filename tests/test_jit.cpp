// jit: per-signature specialisation, caching, nesting, thread safety, recompile logging.
#include <gtest/gtest.h>
#include <kiln/kiln.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <map>
#include <thread>

#include "testing.h"

struct Params {
  kiln::Tensor w, b;
};
KILN_TREE(Params, w, b);

namespace kiln {
namespace {

using kiln::testing::expect_allclose;

Tensor predict(const Params& p, const Tensor& x) { return tanh(matmul(x, p.w) + p.b); }

// Independent reference: the same model with plain loops in double.
std::vector<double> predict_ref(const std::vector<double>& w, const std::vector<double>& b,
                                const std::vector<double>& x, int n, int k, int m) {
  std::vector<double> out(static_cast<std::size_t>(n * m));
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < m; ++j) {
      double s = b[static_cast<std::size_t>(j)];
      for (int l = 0; l < k; ++l)
        s += x[static_cast<std::size_t>(i * k + l)] * w[static_cast<std::size_t>(l * m + j)];
      out[static_cast<std::size_t>(i * m + j)] = std::tanh(s);
    }
  return out;
}

TEST(Jit, ComputesWhatEagerComputesAndCachesPerSignature) {
  std::atomic<int> traces = 0;
  auto f = jit([&](const Params& p, const Tensor& x) {
    ++traces;
    return predict(p, x);
  });
  const std::vector<double> w{0.1, -0.2, 0.3, 0.4, -0.5, 0.6}, b{0.05, -0.05};
  const Params p{tensor(w, {3, 2}), tensor(b, {2})};
  const std::vector<double> xv{1, 2, 3, -1, 0.5, 2};
  const Tensor x = tensor(xv, {2, 3});
  const std::vector<double> got = f(p, x).to_vector<double>();
  const std::vector<double> want = predict_ref(w, b, xv, 2, 3, 2);
  for (std::size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-12);
  EXPECT_EQ(traces, 1);
  f(p, x * 2.0);  // same signature: no new trace
  EXPECT_EQ(traces, 1);
  EXPECT_EQ(f.cache_size(), 1u);
  f(p, tensor(std::vector<double>(12, 1.0), {4, 3}));  // new shape: a second specialisation
  EXPECT_EQ(traces, 2);
  EXPECT_EQ(f.cache_size(), 2u);
  f(Params{astype(p.w, float32), astype(p.b, float32)}, astype(x, float32));  // new dtypes
  EXPECT_EQ(f.cache_size(), 3u);
}

TEST(Jit, StaticLeavesArePartOfTheSignature) {
  std::atomic<int> traces = 0;
  auto f = jit([&](const Tensor& x, int power) {
    ++traces;
    Tensor y = x;
    for (int i = 1; i < power; ++i) y = y * x;
    return y;
  });
  const Tensor x = tensor({2.0, 3.0});
  EXPECT_EQ(f(x, 3).to_vector<double>(), (std::vector<double>{8, 27}));
  EXPECT_EQ(f(x, 2).to_vector<double>(), (std::vector<double>{4, 9}));
  EXPECT_EQ(f(x, 3).to_vector<double>(), (std::vector<double>{8, 27}));
  EXPECT_EQ(traces, 2);
}

TEST(Jit, LowerShowsTheOptimisedIr) {
  auto f = jit([](const Tensor& x) { return (x * 1.0 - 0.0) * sin(x) + sin(x); });
  const std::string ir = ir::print(f.lower(tensor({1.f, 2.f})));
  // x*1-0 disappears, the two sin(x) merge.
  EXPECT_EQ(ir,
            "func @jit(%arg0: f32[2]) -> f32[2] {\n"
            "  %0 = sin %arg0 : f32[2]\n"
            "  %1 = mul %arg0, %0 : f32[2]\n"
            "  %2 = add %1, %0 : f32[2]\n"
            "  return %2\n"
            "}");
}

TEST(Jit, NestedJitBecomesACall) {
  auto inner = jit([](const Tensor& x) { return exp(x); }, "inner");
  auto outer = jit([&](const Tensor& x) { return inner(x) * 2.0; }, "outer");
  const Tensor x = tensor({0.0, 1.0});
  const std::vector<double> got = outer(x).to_vector<double>();
  EXPECT_NEAR(got[0], 2.0, 1e-12);
  EXPECT_NEAR(got[1], 2.0 * std::exp(1.0), 1e-12);
  const std::string ir = ir::print(outer.lower(x));
  EXPECT_NE(ir.find("call %arg0 {fn=func @inner("), std::string::npos) << ir;
}

TEST(Jit, InnerFunctionClosingOverOuterTracersWorks) {
  auto outer = jit([](const Tensor& x) {
    const Tensor y = x + 1.0;
    auto inner = jit([&](const Tensor& z) { return z * y; });  // captures a tracer
    return inner(x);
  });
  EXPECT_EQ(outer(tensor({1.0, 2.0})).to_vector<double>(), (std::vector<double>{2, 6}));
}

TEST(Jit, TreesInAndOut) {
  auto step = jit([](const Params& p, double lr) {
    return tree_map([&](const Tensor& t) { return t - lr * t; }, p);
  });
  const Params p{ones({2, 2}), ones({2})};
  const Params q = step(p, 0.25);
  EXPECT_EQ(q.w.to_vector<float>(), (std::vector<float>(4, 0.75f)));
  EXPECT_EQ(q.b.to_vector<float>(), (std::vector<float>(2, 0.75f)));
}

TEST(Jit, SafeFromTwoThreadsAtOnce) {
  std::atomic<int> traces = 0;
  auto f = jit([&](const Tensor& x) {
    ++traces;
    return sum(x * x);
  });
  std::atomic<int> wrong = 0;
  auto work = [&](double scale) {
    for (int i = 0; i < 200; ++i) {
      const Tensor x = tensor({scale, 2 * scale});
      if (f(x).item<double>() != 5 * scale * scale) ++wrong;
    }
  };
  std::thread a(work, 1.0), b(work, 3.0);
  a.join();
  b.join();
  EXPECT_EQ(wrong, 0);
  EXPECT_EQ(traces, 1);
}

TEST(Jit, ErrorsInsideJitNameTheUsersLine) {
  auto f = jit([](const Tensor& x) { return reshape(x, {5}); });
  try {
    f(tensor({1.f, 2.f}));
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("test_jit.cpp"), std::string::npos) << e.what();
  }
  auto g = jit([](const Tensor& a, const Tensor& b) { return div(a, b); });
  try {
    g(tensor({1, 2}), tensor({1, 0}));  // integer division by zero at run time
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("test_jit.cpp"), std::string::npos) << e.what();
  }
}

TEST(Jit, LogsWhyItRecompiles) {
  ::setenv("KILN_LOG_RECOMPILES", "1", 1);
  auto f = jit([](const Params& p, const Tensor& x) { return predict(p, x); }, "predict");
  const Params p{ones({3, 2}), zeros({2})};
  ::testing::internal::CaptureStderr();
  f(p, ones({4, 3}));
  f(p, ones({8, 3}));
  f(Params{ones({3, 2}), zeros({2})}, ones({8, 3}));  // a hit: nothing logged
  const std::string log = ::testing::internal::GetCapturedStderr();
  ::unsetenv("KILN_LOG_RECOMPILES");
  EXPECT_NE(log.find("[jit] predict: recompiling (specialisation 2): argument [1] changed from "
                     "f32[4,3] to f32[8,3]"),
            std::string::npos)
      << log;
  EXPECT_EQ(log.find("specialisation 3"), std::string::npos) << log;
}

// The cache is keyed by structure, static values, dtypes and shapes, each of which must tell
// signatures apart (and nothing else may).
TEST(Jit, TheCacheTellsSignaturesApartByStructureStaticValuesDTypesAndShapes) {
  int traces = 0;
  auto f = jit([&traces](const std::map<std::string, Tensor>& m, int scale) {
    ++traces;
    Tensor s = zeros({});
    for (const auto& [name, t] : m) s = s + sum(astype(t, float32));
    return s * static_cast<double>(scale);
  });
  const std::map<std::string, Tensor> a{{"w", ones({2})}}, b{{"v", ones({2})}};
  EXPECT_FLOAT_EQ(f(a, 3).item<float>(), 6.f);
  EXPECT_FLOAT_EQ(f(std::map<std::string, Tensor>{{"w", full({2}, 2.0)}}, 3).item<float>(), 12.f);
  EXPECT_EQ(traces, 1);  // new values, same signature: a hit
  f(b, 3);               // another key
  f(a, 4);               // another static value
  f(std::map<std::string, Tensor>{{"w", ones({2}, float64)}}, 3);  // another dtype
  f(std::map<std::string, Tensor>{{"w", ones({3})}}, 3);           // another shape
  EXPECT_EQ(traces, 5);
  f(b, 3);
  f(a, 4);
  EXPECT_EQ(traces, 5);
}

TEST(Jit, ACallOfItselfOnTheSignatureBeingTracedIsAnError) {
  std::function<Tensor(const Tensor&)> self;
  auto f = jit([&self](const Tensor& x) { return self(x) + 1.0; }, "recurse");
  self = [&f](const Tensor& x) { return f(x); };
  try {
    f(ones({3}));
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(
        std::string(e.what()).find("[recurse] the function calls itself with the signature "
                                   "it is being traced for: got a recursive call on (f32[3])"),
        std::string::npos)
        << e.what();
  }
}

TEST(Trace, BranchingOnATracedValueSuggestsCond) {
  try {
    trace([](const Tensor& x) { return x > 0.0 ? x : -x; }, tensor(1.0));
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("kiln::cond"), std::string::npos) << e.what();
  }
  // Eagerly the same code runs: a one-element tensor has a truth value.
  EXPECT_TRUE(static_cast<bool>(tensor(1.0) > 0.0));
}

TEST(Trace, ShowsReadableIrForTrees) {
  const Params p{ones({3, 2}), zeros({2})};
  const std::string ir = ir::print(trace(predict, p, ones({4, 3})));
  EXPECT_NE(ir.find("func @f(%w: f32[3,2], %b: f32[2], %arg1: f32[4,3])"), std::string::npos) << ir;
  EXPECT_NE(ir.find("tanh"), std::string::npos) << ir;
}

// Bodies that hold scalar constants, which jit folds while it compiles. Each maps x: f64[2, 3]
// to a tensor.
struct Body {
  const char* name;
  std::function<Tensor(const Tensor&)> f;
};
std::vector<Body> bodies_with_constants() {
  const nn::LayerNorm ln(Shape{3}, 1e-5, float64);
  const nn::BatchNorm bn(3, 0.1, 1e-5, float64);
  return {
      {"add_scalar", [](const Tensor& x) { return x + 2.5; }},
      {"relu", [](const Tensor& x) { return nn::relu(x - 0.1); }},
      {"mean", [](const Tensor& x) { return mean(x, {1}); }},
      {"var", [](const Tensor& x) { return var(x, {0}); }},
      {"logsumexp", [](const Tensor& x) { return logsumexp(x, {1}); }},
      {"log_softmax", [](const Tensor& x) { return log_softmax(x); }},
      {"cross_entropy",
       [](const Tensor& x) {
         return nn::cross_entropy(x, tensor({2, 0}));
       }},
      {"layer_norm", [ln](const Tensor& x) { return ln(x); }},
      {"batch_norm", [bn](const Tensor& x) { return bn(x, bn.initial_state(), true).first; }},
      {"scan",
       [](const Tensor& x) {
         return scan(
                    [](const Tensor& c, const Tensor& r) {
                      return std::pair{c * 0.5 + r, c};
                    },
                    zeros({3}, float64), x)
             .first;
       }},
      {"cond",
       [](const Tensor& x) {
         return cond(
             sum(x) > 0.0, [](const Tensor& a) { return a * 2.0; },
             [](const Tensor& a) { return a - 1.0; }, x);
       }},
      {"while_loop",
       [](const Tensor& x) {
         return while_loop([](const Tensor& a) { return sum(abs(a)) < 50.0; },
                           [](const Tensor& a) { return a * 1.5 + 0.25; }, x);
       }},
  };
}

// A jitted function first called inside another transformation compiles there (constant
// folding must compute, not record into the outer trace). The reference is the same
// transformation of the plain function.
TEST(Jit, NeverCalledJittedFunctionsComposeWithEveryTransformation) {
  const Tensor x = tensor({0.3, -1.2, 2.0, 0.7, 0.1, -0.4}, {2, 3});
  const Tensor w = tensor({1.0, -2.0, 0.5, 0.25, 3.0, -1.0}, {2, 3});
  for (const Body& b : bodies_with_constants()) {
    const std::string name = b.name;
    auto loss = [&](const std::function<Tensor(const Tensor&)>& f) {
      return [f](const Tensor& a) {
        const Tensor y = f(a);
        return sum(y * y);
      };
    };
    expect_allclose(grad(loss(jit(b.f)))(x), grad(loss(b.f))(x), {.rtol = 0, .atol = 1e-12},
                    name + " under grad");
    {
      auto [y, pb] = vjp(jit(b.f), x);
      auto [y0, pb0] = vjp(b.f, x);
      expect_allclose(y, y0, {.rtol = 0, .atol = 1e-12}, name + " under vjp");
      expect_allclose(std::get<0>(pb(ones_like(y))), std::get<0>(pb0(ones_like(y0))),
                      {.rtol = 0, .atol = 1e-12}, name + " under vjp (pullback)");
    }
    expect_allclose(jvp(jit(b.f), std::tuple{x}, std::tuple{w}).second,
                    jvp(b.f, std::tuple{x}, std::tuple{w}).second, {.rtol = 0, .atol = 1e-12},
                    name + " under jvp");
    expect_allclose(jit([f = jit(b.f)](const Tensor& a) { return f(a); })(x), b.f(x),
                    {.rtol = 0, .atol = 1e-12}, name + " under jit");
    const Tensor xs = stack({x, x * 0.5, -x});
    expect_allclose(vmap(jit(b.f))(xs), vmap(b.f)(xs), {.rtol = 0, .atol = 1e-12},
                    name + " under vmap");
  }
}

// Recursion on smaller static shapes, the base case decided in C++: each level is its own
// specialisation, traced while the enclosing one is being traced.
TEST(Jit, CallsItselfOnSmallerInputs) {
  std::function<Tensor(const Tensor&)> total;
  auto jf = jit([&total](const Tensor& x) {
    if (x.shape()[0] == 1) return x;
    const int64_t h = x.shape()[0] / 2;
    return total(slice(x, {Slice{0, h}})) + total(slice(x, {Slice{h, std::nullopt}}));
  });
  total = [jf](const Tensor& x) { return jf(x); };
  const Tensor x = tensor({1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0});
  EXPECT_EQ(total(x).to_vector<double>(), (std::vector<double>{36.0}));  // 1 + ... + 8
  EXPECT_EQ(jf.cache_size(), 4u);                                        // lengths 8, 4, 2, 1
}

// Recursion on the very signature being traced can never finish: an Error, not a hang.
TEST(Jit, RecursionOnTheSameSignatureIsAnError) {
  std::function<Tensor(const Tensor&)> self;
  auto jf = jit([&self](const Tensor& x) { return self(x) + 1.0; }, "runaway");
  self = [jf](const Tensor& x) { return jf(x); };
  testing::expect_error([&] { self(tensor({1.0})); }, "runaway", {"the function calls itself"});
  EXPECT_EQ(jf.cache_size(), 0u);
  // Nothing was left claimed: the next call traces (and fails) again rather than waiting.
  testing::expect_error([&] { self(tensor({1.0})); }, "runaway", {"the function calls itself"});
}

// jit computes what eager computes, signed zeros included: the simplifier drops only the
// identities exact in IEEE arithmetic.
TEST(Jit, SimplifierKeepsTheSignOfZero) {
  const Tensor neg_zero = tensor({-0.0, 1.5});
  struct Case {
    const char* what;
    std::function<Tensor(const Tensor&)> f;
    bool removed;  // the op is an exact identity, so the optimised IR has no equation left
  };
  const std::vector<Case> cases = {
      {"x + 0.0", [](const Tensor& x) { return x + 0.0; }, false},
      {"0.0 + x", [](const Tensor& x) { return 0.0 + x; }, false},
      {"x - (-0.0)", [](const Tensor& x) { return x - (-0.0); }, false},
      {"x + (-0.0)", [](const Tensor& x) { return x + (-0.0); }, true},
      {"(-0.0) + x", [](const Tensor& x) { return (-0.0) + x; }, true},
      {"x - 0.0", [](const Tensor& x) { return x - 0.0; }, true},
      {"x * 1.0", [](const Tensor& x) { return x * 1.0; }, true},
      {"x / 1.0", [](const Tensor& x) { return x / 1.0; }, true},
  };
  for (const Case& c : cases) {
    const std::vector<double> eager = c.f(neg_zero).to_vector<double>();
    auto jf = jit(c.f);
    const std::vector<double> jitted = jf(neg_zero).to_vector<double>();
    ASSERT_EQ(eager.size(), jitted.size());
    for (std::size_t i = 0; i < eager.size(); ++i) {
      EXPECT_EQ(eager[i], jitted[i]) << c.what;
      EXPECT_EQ(std::signbit(eager[i]), std::signbit(jitted[i])) << c.what << " at " << i;
    }
    EXPECT_EQ(jf.lower(neg_zero).equations.empty(), c.removed) << c.what << "\n"
                                                               << jf.lower(neg_zero);
  }
  // Integers have one zero: x + 0 is x.
  EXPECT_TRUE(jit([](const Tensor& x) { return x + 0; }).lower(tensor({1, 2})).equations.empty());
}

}  // namespace
}  // namespace kiln
