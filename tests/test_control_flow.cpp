// Structured control flow: cond, switch_, while_loop, fori_loop, scan — eager, traced, and
// under jit, grad, jvp and vmap (docs/CONTROL_FLOW.md).
#include <gtest/gtest.h>
#include <kiln/kiln.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "testing.h"

namespace kiln {
namespace {

using kiln::testing::expect_allclose;

using P = std::pair<Tensor, Tensor>;

template <class F>
void expect_error(F f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "expected an Error";
  } catch (const Error& e) {
    for (const std::string& p : parts)
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what() << "\nmissing: " << p;
  }
}

Tensor newton_sqrt(const Tensor& a) {
  auto s = while_loop([&](const P& s) { return abs(s.first * s.first - a) > 1e-10; },
                      [&](const P& s) {
                        return P{0.5 * (s.first + a / s.first), s.second + 1};
                      },
                      P{a, zeros({}, int32)});
  return s.first;
}

// ---- 1. eager semantics, traced primitives, errors, printing -----------------------------

TEST(ControlFlow, CondEagerRunsOnlyTheChosenBranch) {
  int calls_t = 0, calls_f = 0;
  const Tensor x = tensor({1.0, 2.0});
  // Both branches are traced (to check their types); only the chosen one computes.
  auto run = [](int& calls, const Tensor& v) {
    if (!v.is_traced()) ++calls;
    return v;
  };
  Tensor y = cond(
      sum(x) > 0.0, [&](const Tensor& v) { return run(calls_t, v) * 2.0; },
      [&](const Tensor& v) { return run(calls_f, v) - 1.0; }, x);
  expect_allclose(y, {2, 4}, {.rtol = 1e-10, .atol = 1e-10});
  EXPECT_EQ(calls_t, 1);
  EXPECT_EQ(calls_f, 0);
  Tensor z = cond(
      sum(x) < 0.0, [](const Tensor& v) { return v * 2.0; },
      [](const Tensor& v) { return v - 1.0; }, x);
  expect_allclose(z, {0, 1}, {.rtol = 1e-10, .atol = 1e-10});
}

TEST(ControlFlow, SwitchClampsTheIndex) {
  const Tensor x = tensor(3.0);
  auto f = [&](int i) {
    return switch_(
        tensor(i), [&] { return x; }, [&] { return x * 2.0; }, [&] { return x * 3.0; });
  };
  expect_allclose(f(0), {3}, {.rtol = 1e-10, .atol = 1e-10});
  expect_allclose(f(1), {6}, {.rtol = 1e-10, .atol = 1e-10});
  expect_allclose(f(7), {9}, {.rtol = 1e-10, .atol = 1e-10});
  expect_allclose(f(-2), {3}, {.rtol = 1e-10, .atol = 1e-10});
  auto j = jit([](const Tensor& i, const Tensor& v) {
    return switch_(
        i, [&] { return v; }, [&] { return v * 2.0; }, [&] { return v * 3.0; });
  });
  expect_allclose(j(tensor(1), x), {6}, {.rtol = 1e-10, .atol = 1e-10});
  expect_allclose(j(tensor(5), x), {9}, {.rtol = 1e-10, .atol = 1e-10});
}

TEST(ControlFlow, WhileAndForiEager) {
  expect_allclose(newton_sqrt(tensor(2.0)), {std::sqrt(2.0)}, {.rtol = 1e-10, .atol = 1e-10});
  const Tensor s = fori_loop(
      0, 5, [](const Tensor& i, const Tensor& c) { return c + astype(i, float64); }, tensor(0.0));
  expect_allclose(s, {10}, {.rtol = 1e-10, .atol = 1e-10});
  const Tensor s2 = fori_loop(
      tensor(1), tensor(4), [](const Tensor& i, const Tensor& c) { return c * astype(i, float64); },
      tensor(1.0));
  expect_allclose(s2, {6}, {.rtol = 1e-10, .atol = 1e-10});
}

TEST(ControlFlow, ScanEagerForwardAndReverse) {
  const Tensor xs = tensor({1.0, 2.0, 3.0});
  auto f = [](const Tensor& c, const Tensor& x) { return P{c + x, c * 10.0 + x}; };
  auto [c, ys] = scan(f, tensor(0.0), xs);
  expect_allclose(c, {6}, {.rtol = 1e-10, .atol = 1e-10});
  expect_allclose(ys, {1, 12, 33}, {.rtol = 1e-10, .atol = 1e-10});
  auto [cr, ysr] = scan(f, tensor(0.0), xs, ScanOptions{.reverse = true});
  expect_allclose(cr, {6}, {.rtol = 1e-10, .atol = 1e-10});
  expect_allclose(ysr, {51, 32, 3},
                  {.rtol = 1e-10, .atol = 1e-10});  // i=2: 0*10+3; i=1: 3*10+2; i=0: 5*10+1
}

TEST(ControlFlow, JitMatchesEager) {
  auto prog = [](const Tensor& a, const Tensor& xs) {
    Tensor r = newton_sqrt(a);
    auto [h, ys] = scan(
        [&](const Tensor& h, const Tensor& x) {
          Tensor n = tanh(h * r + x);
          return P{n, n};
        },
        zeros({2}, float64), xs);
    Tensor y = cond(
        sum(h) > 0.0, [&] { return h * 2.0; }, [&] { return h - 1.0; });
    auto rev = scan(
        [&](const Tensor& c, const Tensor& x) {
          return P{c * 0.5 + x, c};
        },
        zeros({2}, float64), xs, ScanOptions{.reverse = true});
    return std::make_tuple(y, ys, rev.first, rev.second);
  };
  const Tensor a = tensor(3.0),
               xs = tensor(std::vector<double>{0.1, -0.2, 0.3, 0.4, -0.5, 0.6}, {3, 2});
  auto e = prog(a, xs);
  auto j = jit(prog)(a, xs);
  expect_allclose(std::get<0>(j), std::get<0>(e).to_vector<double>(),
                  {.rtol = 1e-10, .atol = 1e-10});
  expect_allclose(std::get<1>(j), std::get<1>(e).to_vector<double>(),
                  {.rtol = 1e-10, .atol = 1e-10});
  expect_allclose(std::get<2>(j), std::get<2>(e).to_vector<double>(),
                  {.rtol = 1e-10, .atol = 1e-10});
  expect_allclose(std::get<3>(j), std::get<3>(e).to_vector<double>(),
                  {.rtol = 1e-10, .atol = 1e-10});
}

// A scan that carries and yields nothing (what a Python `for` whose body keeps no state
// becomes) is dead code for the passes, not an equation without outputs to crash on.
TEST(ControlFlow, JitOfAScanThatCarriesAndYieldsNothing) {
  auto prog = [](const Tensor& xs) {
    scan(
        [](const std::tuple<>&, const Tensor&) {
          return std::pair{std::tuple<>{}, std::tuple<>{}};
        },
        std::tuple<>{}, xs);
    return xs * 2.0;
  };
  const Tensor xs = tensor(std::vector<double>{1, 2, 3, 4, 5, 6}, {3, 2});
  for (ir::Backend backend : {ir::Backend::interpreter, ir::Backend::llvm})
    expect_allclose(jit(prog, JitOptions{.backend = backend})(xs), {2, 4, 6, 8, 10, 12},
                    {.rtol = 1e-10, .atol = 1e-10});
  EXPECT_NO_THROW(ir::optimize(trace(prog, xs)));
}

// Carries with a zero-size axis (an empty batch) run compiled as they do eagerly, whatever
// strides the empty carry has (a reversed empty view among them).
TEST(ControlFlow, JitLoopsWithEmptyCarries) {
  for (const Tensor& init : {zeros({2, 0}, float64), flip(zeros({0, 3}, float64), {0})}) {
    auto loops = [](const Tensor& c) {
      const Tensor f = fori_loop(
          0, 3, [](const Tensor&, const Tensor& c) { return c + 1.0; }, c);
      const Tensor w = while_loop([](const P& s) { return s.second < 2; },
                                  [](const P& s) {
                                    return P{s.first * 2.0, s.second + 1};
                                  },
                                  P{c, zeros({}, int32)})
                           .first;
      auto [h, ys] = scan(
          [](const Tensor& h, const Tensor& x) {
            return P{h + x, h};
          },
          c, stack({c, c}));
      return std::make_tuple(f, w, h, ys);
    };
    const auto e = loops(init);
    for (ir::Backend backend : {ir::Backend::interpreter, ir::Backend::llvm}) {
      const auto j = jit(loops, JitOptions{.backend = backend})(init);
      EXPECT_EQ(std::get<0>(j).type(), std::get<0>(e).type());
      EXPECT_EQ(std::get<1>(j).type(), std::get<1>(e).type());
      EXPECT_EQ(std::get<2>(j).type(), std::get<2>(e).type());
      EXPECT_EQ(std::get<3>(j).type(), std::get<3>(e).type());
    }
  }
}

TEST(ControlFlow, PrintedIrShowsSubFunctionsAndRoundTrips) {
  auto f = [](const Tensor& a, const Tensor& xs) {
    Tensor r = newton_sqrt(a);
    auto [h, ys] = scan([&](const Tensor& h, const Tensor& x) { return P{h + x * r, h}; }, a, xs);
    return cond(
        h > 0.0, [&] { return h * 2.0; }, [&] { return h - r; });
  };
  const ir::Function fn = trace(f, tensor(2.0), tensor({1.0, 2.0}));
  const std::string text = ir::print(fn);
  for (const char* s : {"while", "cond_fn", "body_fn", "scan", "length=2", "reverse=false", "cond",
                        "branch0", "branch1"})
    EXPECT_NE(text.find(s), std::string::npos) << s << " missing in\n" << text;
  ir::verify(fn);
  auto parsed = ir::parse(text);
  EXPECT_EQ(ir::print(*parsed), text);
  const std::vector<Tensor> args{tensor(2.0), tensor({1.0, 2.0})};
  expect_allclose(ir::evaluate(*parsed, args)[0], f(args[0], args[1]).to_vector<double>(),
                  {.rtol = 1e-10, .atol = 1e-10});
}

TEST(ControlFlow, PassesFoldConstantPredicatesAndReachIntoBodies) {
  // A constant predicate: the cond disappears and the chosen branch is inlined.
  auto f = jit([](const Tensor& x) {
    return cond(
        tensor(true), [&] { return sin(x) * 1.0; }, [&] { return cos(x); });
  });
  const Tensor x = tensor({0.25, 0.5});
  const std::string folded = ir::print(f.lower(x));
  EXPECT_EQ(folded,
            "func @jit(%arg0: f64[2]) -> f64[2] {\n"
            "  %0 = sin %arg0 : f64[2]\n"
            "  return %0\n"
            "}");
  EXPECT_EQ(f(x).to_vector<double>(), sin(x).to_vector<double>());
  // A loop body is optimised too: x * 1 - 0 inside it is gone.
  auto g = jit([](const Tensor& x) {
    return while_loop([](const Tensor& v) { return sum(v) < 10.0; },
                      [](const Tensor& v) { return (v * 1.0 - 0.0) * 2.0; }, x);
  });
  const std::string loop = ir::print(g.lower(x));
  EXPECT_EQ(loop.find("sub"), std::string::npos) << loop;
  EXPECT_EQ(g(x).to_vector<double>(), (std::vector<double>{4.0, 8.0}));
}

TEST(ControlFlow, ErrorsNameTheLeafAndTypes) {
  auto mismatched = [](const Tensor& x) {
    return cond(
        x > 0.0,
        [&] {
          return P{x, x};
        },
        [&] {
          return P{x, astype(x, float32)};
        });
  };
  expect_error([&] { trace(mismatched, tensor(1.0)); },
               {"cond", "[1]", "f32[]", "f64[]", "true_fn", "false_fn"});
  auto shape = [](const Tensor& x) {
    return cond(
        sum(x) > 0.0, [&] { return x; }, [&] { return sum(x); });
  };
  expect_error([&] { trace(shape, tensor({1.0, 2.0})); }, {"cond", "f64[2]", "f64[]"});
  auto pred = [](const Tensor& x) {
    return cond(
        x, [&] { return x; }, [&] { return x; });
  };
  expect_error([&] { pred(tensor({1.0, 2.0})); }, {"predicate", "f64[2]", "bool[]"});
  auto body = [](const Tensor& x) {
    return while_loop([](const P& s) { return s.first < 3.0; },
                      [](const P& s) {
                        return P{s.first + 1.0, astype(s.second, float32)};
                      },
                      P{x, x});
  };
  expect_error([&] { body(tensor(0.0)); }, {"while_loop", "[1]", "f32[]", "f64[]"});
  expect_error([&] { trace(body, tensor(0.0)); }, {"while_loop", "[1]", "f32[]", "f64[]"});
  auto cpred = [](const Tensor& x) {
    return while_loop([](const Tensor& s) { return s; }, [](const Tensor& s) { return s; }, x);
  };
  expect_error([&] { trace(cpred, tensor({1.0})); }, {"bool scalar", "f64[1]"});
}

// Eager calls accept exactly the programs that traced calls accept: a branch that does not
// run, or a loop body that never runs, is still checked.
TEST(ControlFlow, EagerChecksWhatTracingChecks) {
  auto shape = [](const Tensor& x) {
    return cond(
        sum(x) > 0.0, [&] { return x; }, [&] { return sum(x); });
  };
  for (const Tensor& x : {tensor({1.0, 2.0}), tensor({-1.0, -2.0})}) {  // either branch taken
    expect_error([&] { shape(x); }, {"[cond] branch results differ", "f64[2]", "f64[]"});
    expect_error([&] { jit(shape)(x); }, {"[cond] branch results differ", "f64[2]", "f64[]"});
  }
  auto three = [](const Tensor& i, const Tensor& x) {
    return switch_(
        i, [&] { return x; }, [&] { return x * 2.0; }, [&] { return astype(x, float32); });
  };
  expect_error([&] { three(tensor(0), tensor({1.0})); },
               {"[switch] branch results differ", "f32[1]"});
  expect_error([&] { jit(three)(tensor(0), tensor({1.0})); },
               {"[switch] branch results differ", "f32[1]"});
  auto never_runs = [](const Tensor& x) {
    return while_loop([](const Tensor& s) { return sum(s) > 10.0; },
                      [](const Tensor& s) {
                        return concatenate({s, s});
                      },
                      x);
  };
  expect_error([&] { never_runs(tensor({1.0})); }, {"while_loop", "body_fn", "f64[2]", "f64[1]"});
  expect_error([&] { jit(never_runs)(tensor({1.0})); },
               {"while_loop", "body_fn", "f64[2]", "f64[1]"});
}

TEST(ControlFlow, LoopBoundsAreChecked) {
  // fori_loop counts in int32: bounds it cannot hold are an Error, not a wrapped counter.
  auto body = [](const Tensor&, const Tensor& c) { return c; };
  expect_error([&] { fori_loop(INT64_MIN, INT64_MAX, body, tensor(0.0)); },
               {"[fori_loop]", "int32"});
  expect_error([&] { fori_loop(0, int64_t{1} << 40, body, tensor(0.0)); },
               {"[fori_loop]", "int32"});
  EXPECT_EQ(fori_loop(5, -5, body, tensor(1.5)).item<double>(), 1.5);  // no steps
  // A scan built by hand (as parsed IR would be) with a negative length.
  const FunctionRef carry_only =
      ir::trace_function("body", {TensorType{float64, Shape{}}}, [](const std::vector<Tensor>& p) {
        return std::vector<Tensor>{p[0] * 2.0};
      }).function;
  const Attrs a{{"body", carry_only},
                {"length", int64_t{-5}},
                {"reverse", false},
                {"num_carry", int64_t{1}},
                {"num_xs", int64_t{0}}};
  expect_error([&] { bind(primitive("scan"), {tensor(1.0)}, a); },
               {"[scan] negative length", "-5"});
}

// ---- 2. forward mode ----------------------------------------------------------------------

TEST(ControlFlow, JvpThroughCondWhileScan) {
  auto f = [](const Tensor& a) {
    Tensor r = newton_sqrt(a);
    auto [h, ys] = scan(
        [&](const Tensor& h, const Tensor& x) {
          return P{h * a + x, h};
        },
        r, tensor({1.0, 2.0}));
    return cond(
        h > 0.0, [&] { return h * h; }, [&] { return -h; });
  };
  const double a = 2.0, eps = 1e-6;
  auto [y, t] = jvp(f, std::tuple<Tensor>{tensor(a)}, std::tuple<Tensor>{tensor(1.0)});
  const double fd =
      (f(tensor(a + eps)).item<double>() - f(tensor(a - eps)).item<double>()) / (2 * eps);
  EXPECT_NEAR(t.item<double>(), fd, 1e-5 * (1 + std::abs(fd)));
  expect_allclose(y, {f(tensor(a)).item<double>()}, {.rtol = 1e-10, .atol = 1e-10});
}

// ---- 3. reverse mode ----------------------------------------------------------------------

TEST(ControlFlow, NewtonSqrtGradEagerAndJit) {
  for (double a : {2.0, 9.0, 0.5}) {
    expect_allclose(grad(newton_sqrt)(tensor(a)), {1 / (2 * std::sqrt(a))},
                    {.rtol = 1e-8, .atol = 1e-8});
    expect_allclose(jit(grad(newton_sqrt))(tensor(a)), {1 / (2 * std::sqrt(a))},
                    {.rtol = 1e-8, .atol = 1e-8});
  }
}

TEST(ControlFlow, ForiLoopGrads) {
  auto f = [](const Tensor& x) {
    return fori_loop(
        0, 3, [&](const Tensor&, const Tensor& c) { return c * x; }, tensor(1.0));
  };
  expect_allclose(grad(f)(tensor(2.0)), {12}, {.rtol = 1e-10, .atol = 1e-10});
  auto g = [](const Tensor& x) {
    return fori_loop(
        tensor(0), tensor(3), [&](const Tensor&, const Tensor& c) { return c * x; }, tensor(1.0));
  };
  expect_allclose(grad(g)(tensor(2.0)), {12}, {.rtol = 1e-10, .atol = 1e-10});
  expect_allclose(jit(grad(g))(tensor(2.0)), {12}, {.rtol = 1e-10, .atol = 1e-10});
}

struct Rnn {
  Tensor w, u;
};

Tensor rnn_scan(const Tensor& w, const Tensor& u, const Tensor& xs) {
  auto [h, ys] = scan(
      [&](const Tensor& h, const Tensor& x) {
        Tensor n = tanh(matmul(w, h) + matmul(u, x));
        return P{n, sum(n * n)};
      },
      zeros({3}, float64), xs);
  return sum(h) + sum(ys);
}
Tensor rnn_unrolled(const Tensor& w, const Tensor& u, const Tensor& xs) {
  Tensor h = zeros({3}, float64), total = tensor(0.0);
  for (int64_t i = 0; i < xs.shape()[0]; ++i) {
    h = tanh(matmul(w, h) + matmul(u, index(xs, i)));
    total = total + sum(h * h);
  }
  return sum(h) + total;
}

TEST(ControlFlow, RnnScanGradsMatchUnrolledAndFiniteDifferences) {
  const Tensor w = random::normal(random::key(1), {3, 3}, float64) * 0.5;
  const Tensor u = random::normal(random::key(2), {3, 2}, float64) * 0.5;
  const Tensor xs = random::normal(random::key(3), {50, 2}, float64);
  auto [gw, gu] = grad(rnn_scan, argnums<0, 1>)(w, u, xs);
  auto [rw, ru] = grad(rnn_unrolled, argnums<0, 1>)(w, u, xs);
  expect_allclose(gw, rw.to_vector<double>(), {.rtol = 1e-9, .atol = 1e-9});
  expect_allclose(gu, ru.to_vector<double>(), {.rtol = 1e-9, .atol = 1e-9});
  auto [jw, ju] = jit(grad(rnn_scan, argnums<0, 1>))(w, u, xs);
  expect_allclose(jw, rw.to_vector<double>(), {.rtol = 1e-9, .atol = 1e-9});
  // finite differences on w
  std::vector<double> wv = w.to_vector<double>(), fd(9);
  const double eps = 1e-6;
  for (int k = 0; k < 9; ++k) {
    std::vector<double> p = wv, m = wv;
    p[k] += eps;
    m[k] -= eps;
    fd[k] = (rnn_scan(tensor(p, {3, 3}), u, xs).item<double>() -
             rnn_scan(tensor(m, {3, 3}), u, xs).item<double>()) /
            (2 * eps);
  }
  expect_allclose(gw, fd, {.rtol = 1e-5, .atol = 1e-5});
}

// Counts equations of `prim` in f and every sub-function it holds.
int count_prim(const ir::Function& f, const std::string& prim) {
  int n = 0;
  for (const ir::Equation& e : f.equations) {
    n += e.prim->name == prim;
    for (const auto& [name, value] : e.attrs.items())
      if (const auto* sub = std::get_if<FunctionRef>(&value)) n += count_prim(**sub, prim);
  }
  return n;
}
const ir::Function* scan_body(const ir::Function& f, bool reverse) {
  for (const ir::Equation& e : f.equations)
    if (e.prim->name == "scan" && e.attrs.get_bool("reverse") == reverse)
      return e.attrs.get<FunctionRef>("body").get();
  return nullptr;
}

// Reverse mode through scan keeps each step's residuals (here 1 - tanh^2) from the forward
// scan instead of recomputing the step's forward inside the backward scan, and the xs
// cotangent nobody asked for is pruned, so a step costs what the unrolled loop's does.
TEST(ControlFlow, ScanGradStoresResidualsInsteadOfRecomputingTheForward) {
  const Tensor w = random::normal(random::key(1), {3, 3}, float64) * 0.5;
  const Tensor u = random::normal(random::key(2), {3, 2}, float64) * 0.5;
  const Tensor xs = random::normal(random::key(3), {7, 2}, float64);
  const ir::Function g = jit(grad(rnn_scan, argnums<0, 1>)).lower(w, u, xs);
  const ir::Function* fwd = scan_body(g, false);
  const ir::Function* bwd = scan_body(g, true);
  ASSERT_TRUE(fwd && bwd) << g;
  EXPECT_EQ(count_prim(*fwd, "tanh"), 1) << g;
  EXPECT_EQ(count_prim(*bwd, "tanh"), 0) << g;
  // Per step, as many products as the loop unrolled at trace time has (which also skips
  // the first step's carry cotangent: h0 is a constant).
  const ir::Function unrolled = jit(grad(rnn_unrolled, argnums<0, 1>)).lower(w, u, xs);
  EXPECT_EQ(count_prim(*fwd, "matmul"), 2) << g;
  EXPECT_EQ(7 * (count_prim(*fwd, "matmul") + count_prim(*bwd, "matmul")),
            count_prim(unrolled, "matmul") + 1)
      << g << unrolled;
  // The same gradients as the unrolled loop, eagerly and jitted.
  auto [rw, ru] = grad(rnn_unrolled, argnums<0, 1>)(w, u, xs);
  auto [gw, gu] = grad(rnn_scan, argnums<0, 1>)(w, u, xs);
  auto [jw, ju] = jit(grad(rnn_scan, argnums<0, 1>))(w, u, xs);
  expect_allclose(gw, rw.to_vector<double>(), {.rtol = 1e-12, .atol = 1e-12});
  expect_allclose(gu, ru.to_vector<double>(), {.rtol = 1e-12, .atol = 1e-12});
  expect_allclose(jw, rw.to_vector<double>(), {.rtol = 1e-12, .atol = 1e-12});
  expect_allclose(ju, ru.to_vector<double>(), {.rtol = 1e-12, .atol = 1e-12});
}

// A while loop's reverse pass carries its body's pullback as a sub-function, staged once: the
// compiled function compiles it with the loop's other bodies, and the backward walk evaluates
// it per step instead of differentiating the body at every step. Gradients as the eager ones.
TEST(ControlFlow, WhileGradCarriesItsBodysPullback) {
  auto f = [](const Tensor& x, const Tensor& n) {
    const auto s = while_loop([&](const P& s) { return s.second < n; },
                              [](const P& s) {
                                return P{sin(s.first) * 1.5, s.second + 1};
                              },
                              P{x, zeros({}, int32)});
    return sum(s.first);
  };
  const Tensor x = tensor(std::vector<double>{0.3, -0.7, 1.1}), n = tensor(int32_t{5});
  const ir::Function g = jit(grad(f)).lower(x, n);
  const ir::Equation* wg = nullptr;
  for (const ir::Equation& e : g.equations)
    if (e.prim->name == "while_grad") wg = &e;
  ASSERT_TRUE(wg) << g;
  ASSERT_TRUE(wg->attrs.has("pullback_fn")) << g;
  EXPECT_EQ(count_prim(*wg->attrs.get<FunctionRef>("pullback_fn"), "cos"), 1) << g;
  const std::vector<double> want = grad(f)(x, n).to_vector<double>();
  for (ir::Backend backend : {ir::Backend::interpreter, ir::Backend::llvm})
    expect_allclose(jit(grad(f), JitOptions{.backend = backend})(x, n), want,
                    {.rtol = 1e-15, .atol = 1e-15});
  // Against the analytic derivative: each step multiplies by 1.5 cos(x_k).
  std::vector<double> analytic;
  for (double v : x.to_vector<double>()) {
    double d = 1;
    for (int k = 0; k < 5; ++k) {
      d *= 1.5 * std::cos(v);
      v = 1.5 * std::sin(v);
    }
    analytic.push_back(d);
  }
  expect_allclose(grad(f)(x, n), analytic, {.rtol = 1e-12, .atol = 1e-12});
}

// The two-layer body of bench_scan: h' = tanh(tanh(W h + U x) W). The backward reads h (for
// dW), n1 and h' (for tanh'); h' is the next step's h, and when it is also a ys output it is
// stacked there already. Either way only h and n1 are stacked as residuals, as the loop
// unrolled at trace time keeps them, forwards and reversed.
TEST(ControlFlow, ScanGradStoresANextCarryOrYsOnlyOnce) {
  const Tensor w = random::normal(random::key(1), {3, 3}, float64) * 0.5;
  const Tensor u = random::normal(random::key(2), {3, 2}, float64) * 0.5;
  const Tensor xs = random::normal(random::key(3), {6, 2}, float64);
  auto step = [](const Tensor& w, const Tensor& u, const Tensor& h, const Tensor& x) {
    return tanh(matmul(w, tanh(matmul(w, h) + matmul(u, x))));
  };
  auto scanned = [&](bool with_ys, bool reverse) {
    return [=](const Tensor& w, const Tensor& u, const Tensor& xs) {
      auto [h, ys] = scan(
          [&](const Tensor& h, const Tensor& x) {
            const Tensor n = step(w, u, h, x);
            return P{n, with_ys ? n : zeros({3}, float64)};  // unused ys are dropped
          },
          ones({3}, float64), xs, ScanOptions{.reverse = reverse});
      return sum(h * h) + sum(ys * ys);
    };
  };
  auto unrolled = [&](bool with_ys, bool reverse) {
    return [=](const Tensor& w, const Tensor& u, const Tensor& xs) {
      Tensor h = ones({3}, float64), total = tensor(0.0);
      const int64_t n = xs.shape()[0];
      for (int64_t i = 0; i < n; ++i) {
        h = step(w, u, h, index(xs, reverse ? n - 1 - i : i));
        if (with_ys) total = total + sum(h * h);
      }
      return sum(h * h) + total;
    };
  };
  auto forward_scan = [](const ir::Function& f) -> const ir::Equation* {
    for (const ir::Equation& e : f.equations)
      if (e.prim->name == "scan" && !e.attrs.get<FunctionRef>("body")->name.ends_with("_bwd"))
        return &e;
    return nullptr;
  };
  for (const bool with_ys : {false, true})
    for (const bool reverse : {false, true}) {
      SCOPED_TRACE(std::string(with_ys ? "ys" : "no ys") + (reverse ? ", reversed" : ""));
      const ir::Function g = jit(grad(scanned(with_ys, reverse), argnums<0, 1>)).lower(w, u, xs);
      const ir::Equation* fwd = forward_scan(g);
      ASSERT_TRUE(fwd) << g;
      const auto stacked =
          fwd->outputs.size() - static_cast<std::size_t>(fwd->attrs.get_int("num_carry"));
      EXPECT_EQ(stacked, with_ys ? 3u : 2u) << g;  // h and n1 (and the ys)
      // The cotangent of sum(h * h) reads the final carry: the primal scan that computes it
      // merges into the forward scan (ir::merge_scans), leaving forward and backward.
      EXPECT_EQ(count_prim(g, "scan"), 2) << g;
      auto [rw, ru] = grad(unrolled(with_ys, reverse), argnums<0, 1>)(w, u, xs);
      auto [gw, gu] = grad(scanned(with_ys, reverse), argnums<0, 1>)(w, u, xs);
      auto [jw, ju] = jit(grad(scanned(with_ys, reverse), argnums<0, 1>))(w, u, xs);
      expect_allclose(gw, rw.to_vector<double>(), {.rtol = 1e-12, .atol = 1e-12});
      expect_allclose(gu, ru.to_vector<double>(), {.rtol = 1e-12, .atol = 1e-12});
      expect_allclose(jw, rw.to_vector<double>(), {.rtol = 1e-12, .atol = 1e-12});
      expect_allclose(ju, ru.to_vector<double>(), {.rtol = 1e-12, .atol = 1e-12});
    }
}

// ir::merge_scans: scans over the same operands merge when their carries evolve identically
// (their ys may differ), and stay apart when they do not.
TEST(ControlFlow, SiblingScansWithEqualCarriesMerge) {
  auto two_scans = [](double second_rate) {
    return [=](const Tensor& c0, const Tensor& xs) {
      auto [c1, ys1] = scan(
          [](const Tensor& c, const Tensor& x) {
            return P{c * 2.0 + x, c};
          },
          c0, xs);
      auto [c2, ys2] = scan(
          [=](const Tensor& c, const Tensor& x) {
            return P{c * second_rate + x, exp(c)};
          },
          c0, xs);
      return sum(c1) + sum(ys1) + 3.0 * sum(c2) + sum(ys2);
    };
  };
  const Tensor c0 = tensor({0.5, -0.25}), xs = tensor({0.1, 0.2, 0.3, -0.1, 0.0, 0.4}, {3, 2});
  for (const double rate : {2.0, 3.0}) {
    SCOPED_TRACE(rate);
    const ir::Function f = jit(two_scans(rate)).lower(c0, xs);
    EXPECT_EQ(count_prim(f, "scan"), rate == 2.0 ? 1 : 2) << f;
    // Against the loop in doubles.
    std::vector<double> c = c0.to_vector<double>(), d = c, x = xs.to_vector<double>();
    double want = 0;
    for (int t = 0; t < 3; ++t)
      for (int i = 0; i < 2; ++i) {
        want += c[i] + std::exp(d[i]);
        c[i] = c[i] * 2.0 + x[t * 2 + i];
        d[i] = d[i] * rate + x[t * 2 + i];
      }
    for (int i = 0; i < 2; ++i) want += c[i] + 3.0 * d[i];
    EXPECT_NEAR(jit(two_scans(rate))(c0, xs).item<double>(), want, 1e-12);
    EXPECT_NEAR(two_scans(rate)(c0, xs).item<double>(), want, 1e-12);
  }
}

// checkpoint around the body brings back per-step rematerialisation: the forward scan then
// stacks only what the checkpoint reads, and the backward recomputes the step.
TEST(ControlFlow, CheckpointedScanBodyStoresOnlyItsInputs) {
  const Tensor w = random::normal(random::key(1), {3, 3}, float64) * 0.5;
  const Tensor xs = random::normal(random::key(3), {6, 3}, float64);
  auto loss = [](bool remat) {
    return [remat](const Tensor& w, const Tensor& xs) {
      auto step = [&](const Tensor& h, const Tensor& x) { return tanh(exp(matmul(w, h)) * x); };
      auto [h, ys] = scan(
          [&](const Tensor& h, const Tensor& x) {
            Tensor n = remat ? checkpoint(step)(h, x) : step(h, x);
            return std::pair{n, std::tuple<>{}};
          },
          ones({3}, float64), xs);
      return sum(h);
    };
  };
  const ir::Function plain = jit(grad(loss(false))).lower(w, xs);
  const ir::Function remat = jit(grad(loss(true))).lower(w, xs);
  // Residuals are the forward scan's stacked outputs beyond its carry.
  auto stacked = [](const ir::Function& f) {
    for (const ir::Equation& e : f.equations)
      if (e.prim->name == "scan" && !e.attrs.get_bool("reverse"))
        return static_cast<int>(e.outputs.size() - e.attrs.get_int("num_carry"));
    return -1;
  };
  EXPECT_EQ(stacked(remat), 1) << remat;  // the incoming carry only
  EXPECT_GT(stacked(plain), 1) << plain;  // carry, exp(w h) and 1 - tanh^2, say
  EXPECT_EQ(count_prim(*scan_body(plain, true), "exp"), 0) << plain;
  EXPECT_GT(count_prim(*scan_body(remat, true), "exp"), 0) << remat;
  const Tensor a = grad(loss(false))(w, xs), b = grad(loss(true))(w, xs);
  expect_allclose(b, a.to_vector<double>(), {.rtol = 1e-12, .atol = 1e-12});
  expect_allclose(jit(grad(loss(true)))(w, xs), a.to_vector<double>(),
                  {.rtol = 1e-12, .atol = 1e-12});
}

TEST(ControlFlow, GradOfGradThroughCondAndScan) {
  auto f = [](const Tensor& x) {
    return cond(
        x > 0.0, [&] { return x * x * x; }, [&] { return sin(x); });
  };
  auto d2 = grad([&](const Tensor& x) { return grad(f)(x); });
  expect_allclose(d2(tensor(2.0)), {12}, {.rtol = 1e-10, .atol = 1e-10});
  expect_allclose(d2(tensor(-1.0)), {-std::sin(-1.0)}, {.rtol = 1e-10, .atol = 1e-10});
  auto s = [](const Tensor& x) {
    auto [c, ys] = scan(
        [&](const Tensor& c, const Tensor& v) {
          return P{c * x + v, c};
        },
        x, tensor({1.0, 2.0}));
    return c;  // ((x*x + 1) * x + 2) = x^3 + x + 2
  };
  auto s2 = grad([&](const Tensor& x) { return grad(s)(x); });
  expect_allclose(grad(s)(tensor(2.0)), {13}, {.rtol = 1e-10, .atol = 1e-10});
  expect_allclose(s2(tensor(2.0)), {12}, {.rtol = 1e-10, .atol = 1e-10});
  expect_allclose(jit(s2)(tensor(2.0)), {12}, {.rtol = 1e-10, .atol = 1e-10});
}

// An adaptive explicit Euler integrator for dy/dt = -k y (1 + y^2) on [0, T]: step size
// h = min(h_max, tol / |f(y)|), steps until t >= T, so the number of steps depends on k and y0.
// Carry: (t, y, steps).
using Ode = std::tuple<Tensor, Tensor, Tensor>;
constexpr double kOdeT = 1.0, kOdeHmax = 0.1, kOdeTol = 0.05;
Ode ode_solve(const Tensor& k, const Tensor& y0) {
  return while_loop([](const Ode& s) { return std::get<0>(s) < kOdeT; },
                    [&](const Ode& s) {
                      const Tensor& y = std::get<1>(s);
                      const Tensor f = -k * y * (1.0 + y * y);
                      const Tensor h = minimum(kOdeTol / abs(f), kOdeHmax);
                      return Ode{std::get<0>(s) + h, y + h * f, std::get<2>(s) + 1};
                    },
                    Ode{zeros({}, float64), y0, zeros({}, int32)});
}
Tensor ode_final(const Tensor& k, const Tensor& y0) { return std::get<1>(ode_solve(k, y0)); }
// The same integrator on plain doubles (the independent reference): (final y, steps).
std::pair<double, int> ode_native(double k, double y) {
  double t = 0;
  int n = 0;
  while (t < kOdeT) {
    const double f = -k * y * (1 + y * y), h = std::min(kOdeHmax, kOdeTol / std::abs(f));
    t += h;
    y += h * f;
    ++n;
  }
  return {y, n};
}

TEST(ControlFlow, AdaptiveStepOdeGradMatchesFiniteDifferences) {
  // The step count depends on the data.
  EXPECT_NE(ode_native(0.5, 1.0).second, ode_native(3.0, 2.0).second);
  auto g = grad(ode_final, argnums<0, 1>);
  auto jg = jit(grad(ode_final, argnums<0, 1>));
  const double eps = 1e-6;
  for (auto [k, y0] : {std::pair{2.0, 1.5}, std::pair{0.7, 0.8}, std::pair{3.0, -2.0}}) {
    const auto [y, n] = ode_native(k, y0);
    // Forward: same state and step count as the native loop.
    const Ode s = ode_solve(tensor(k), tensor(y0));
    EXPECT_EQ(std::get<2>(s).item<int32_t>(), n);
    EXPECT_NEAR(std::get<1>(s).item<double>(), y, 1e-12);
    // FD is valid only where the step count is locally constant: check it at every FD point.
    for (double dk : {-eps, eps}) EXPECT_EQ(ode_native(k + dk, y0).second, n) << k << " " << y0;
    for (double dy : {-eps, eps}) EXPECT_EQ(ode_native(k, y0 + dy).second, n) << k << " " << y0;
    const double fd_k = (ode_native(k + eps, y0).first - ode_native(k - eps, y0).first) / (2 * eps);
    const double fd_y = (ode_native(k, y0 + eps).first - ode_native(k, y0 - eps).first) / (2 * eps);
    auto [gk, gy] = g(tensor(k), tensor(y0));
    auto [jk, jy] = jg(tensor(k), tensor(y0));
    for (const Tensor* t : {&gk, &jk}) expect_allclose(*t, {fd_k}, {.rtol = 1e-6, .atol = 1e-6});
    for (const Tensor* t : {&gy, &jy}) expect_allclose(*t, {fd_y}, {.rtol = 1e-6, .atol = 1e-6});
    EXPECT_GT(n, 10);
  }
}

// switch_ with three branches: a per-branch analytic derivative for each.
Tensor three_way(const Tensor& i, const Tensor& x) {
  return switch_(
      i, [&] { return sin(x); }, [&] { return x * x * x; }, [&] { return exp(0.5 * x); });
}
double three_way_native(int i, double x) {
  i = std::clamp(i, 0, 2);
  return i == 0 ? std::sin(x) : i == 1 ? x * x * x : std::exp(0.5 * x);
}
double three_way_d(int i, double x) {
  i = std::clamp(i, 0, 2);
  return i == 0 ? std::cos(x) : i == 1 ? 3 * x * x : 0.5 * std::exp(0.5 * x);
}

TEST(ControlFlow, SwitchThreeBranchesJvpGradAndBatchedIndex) {
  const double x = 0.7;
  for (int i : {0, 1, 2, 5, -1}) {
    auto f = [i](const Tensor& v) { return three_way(tensor(i), v); };
    auto [y, t] = jvp(f, std::tuple<Tensor>{tensor(x)}, std::tuple<Tensor>{tensor(1.0)});
    expect_allclose(y, {three_way_native(i, x)}, {.rtol = 1e-10, .atol = 1e-10});
    expect_allclose(t, {three_way_d(i, x)}, {.rtol = 1e-10, .atol = 1e-10});
    auto [jy, jt] = jit([&](const Tensor& v) {
      return jvp(f, std::tuple<Tensor>{v}, std::tuple<Tensor>{tensor(1.0)});
    })(tensor(x));
    expect_allclose(jt, {three_way_d(i, x)}, {.rtol = 1e-10, .atol = 1e-10});
    expect_allclose(grad(three_way, argnums<1>)(tensor(i), tensor(x)), {three_way_d(i, x)},
                    {.rtol = 1e-10, .atol = 1e-10});
    expect_allclose(jit(grad(three_way, argnums<1>))(tensor(i), tensor(x)), {three_way_d(i, x)},
                    {.rtol = 1e-10, .atol = 1e-10});
  }
  // vmap with a batched index: each example picks its branch (incl. out-of-range ones).
  const std::vector<int> idx{2, 0, 1, 1, 7, 0};
  const std::vector<double> xv{0.3, -1.2, 2.0, -0.5, 1.1, 0.9};
  const Tensor I = tensor(idx), X = tensor(xv);
  std::vector<double> want_y, want_d, loop_y;
  for (std::size_t b = 0; b < idx.size(); ++b) {
    want_y.push_back(three_way_native(idx[b], xv[b]));
    want_d.push_back(three_way_d(idx[b], xv[b]));
    loop_y.push_back(three_way(index(I, static_cast<int64_t>(b)), index(X, static_cast<int64_t>(b)))
                         .item<double>());
  }
  expect_allclose(tensor(loop_y), want_y, {.rtol = 1e-10, .atol = 1e-10});
  expect_allclose(vmap(three_way)(I, X), want_y, {.rtol = 1e-10, .atol = 1e-10});
  expect_allclose(jit(vmap(three_way))(I, X), want_y, {.rtol = 1e-10, .atol = 1e-10});
  expect_allclose(vmap(grad(three_way, argnums<1>))(I, X), want_d, {.rtol = 1e-10, .atol = 1e-10});
  expect_allclose(jit(vmap(grad(three_way, argnums<1>)))(I, X), want_d,
                  {.rtol = 1e-10, .atol = 1e-10});
  // vmap of jvp with a batched index
  auto tang = [](const Tensor& i, const Tensor& v) {
    return jvp([&](const Tensor& u) { return three_way(i, u); }, std::tuple<Tensor>{v},
               std::tuple<Tensor>{ones_like(v)})
        .second;
  };
  expect_allclose(vmap(tang)(I, X), want_d, {.rtol = 1e-10, .atol = 1e-10});
}

// ScanOptions::unroll: the emitted scan's body runs `unroll` steps; results are unchanged.
Tensor rnn_scan_unroll(const Tensor& w, const Tensor& u, const Tensor& xs, int64_t unroll,
                       bool reverse) {
  auto [h, ys] = scan(
      [&](const Tensor& h, const Tensor& x) {
        Tensor n = tanh(matmul(w, h) + matmul(u, x));
        return P{n, sum(n * n) * x};
      },
      zeros({3}, float64), xs, ScanOptions{.reverse = reverse, .unroll = unroll});
  return sum(h) + sum(ys * ys);
}

TEST(ControlFlow, ScanUnrollMatchesUnroll1IncludingGrads) {
  const Tensor w = random::normal(random::key(1), {3, 3}, float64) * 0.5;
  const Tensor u = random::normal(random::key(2), {3, 2}, float64) * 0.5;
  const Tensor xs = random::normal(random::key(3), {23, 2}, float64);
  for (bool rev : {false, true}) {
    auto ref = [rev](const Tensor& w, const Tensor& u, const Tensor& xs) {
      return rnn_scan_unroll(w, u, xs, 1, rev);
    };
    const double y1 = ref(w, u, xs).item<double>();
    auto [gw1, gu1, gx1] = grad(ref, argnums<0, 1, 2>)(w, u, xs);
    for (int64_t k : {2, 3, 5, 23, 40}) {
      auto f = [k, rev](const Tensor& w, const Tensor& u, const Tensor& xs) {
        return rnn_scan_unroll(w, u, xs, k, rev);
      };
      expect_allclose(jit(f)(w, u, xs), {y1}, {.rtol = 1e-12, .atol = 1e-12});
      auto [gw, gu, gx] = grad(f, argnums<0, 1, 2>)(w, u, xs);
      expect_allclose(gw, gw1.to_vector<double>(), {.rtol = 1e-12, .atol = 1e-12});
      expect_allclose(gu, gu1.to_vector<double>(), {.rtol = 1e-12, .atol = 1e-12});
      expect_allclose(gx, gx1.to_vector<double>(), {.rtol = 1e-12, .atol = 1e-12});
      auto [jw, ju, jx] = jit(grad(f, argnums<0, 1, 2>))(w, u, xs);
      expect_allclose(jw, gw1.to_vector<double>(), {.rtol = 1e-12, .atol = 1e-12});
      expect_allclose(jx, gx1.to_vector<double>(), {.rtol = 1e-12, .atol = 1e-12});
    }
  }
  // The emitted scan runs length / unroll iterations (+ a short scan for the remainder).
  auto f5 = [](const Tensor& w, const Tensor& u, const Tensor& xs) {
    return rnn_scan_unroll(w, u, xs, 5, false);
  };
  const std::string text = ir::print(trace(f5, w, u, xs));
  EXPECT_NE(text.find("length=4"), std::string::npos) << text;
  EXPECT_NE(text.find("length=3"), std::string::npos) << text;
  EXPECT_EQ(text.find("length=23"), std::string::npos) << text;
  // The eager result (unroll ignored) is the same too; fori_loop-style length-only scans work.
  expect_allclose(rnn_scan_unroll(w, u, xs, 4, false),
                  {rnn_scan_unroll(w, u, xs, 1, false).item<double>()},
                  {.rtol = 1e-12, .atol = 1e-12});
  auto count = jit([](const Tensor& x) {
    return scan(
               [](const Tensor& c, const std::tuple<>&) {
                 return std::pair{c * 1.5 + 1.0, std::tuple<>{}};
               },
               x, std::tuple<>{}, ScanOptions{.length = 7, .unroll = 3})
        .first;
  });
  double c = 2.0;
  for (int i = 0; i < 7; ++i) c = c * 1.5 + 1.0;
  expect_allclose(count(tensor(2.0)), {c}, {.rtol = 1e-10, .atol = 1e-10});
  expect_error(
      [&] { jit([&](const Tensor& x) { return rnn_scan_unroll(w, u, x, 0, false); })(xs); },
      {"scan", "unroll", "0", "23"});
}

// ---- 4. vmap -----------------------------------------------------------------------------

TEST(ControlFlow, VmapWhileWithPerExampleTripCounts) {
  const Tensor a = tensor({1.0, 4.0, 100.0, 0.01});
  const Tensor got = vmap(newton_sqrt)(a);
  std::vector<double> want;
  for (int i = 0; i < 4; ++i) want.push_back(newton_sqrt(index(a, i)).item<double>());
  expect_allclose(got, want, {.rtol = 1e-12, .atol = 1e-12});
  auto count = [](const Tensor& n) {
    return while_loop([&](const P& s) { return s.first < n; },
                      [](const P& s) {
                        return P{s.first + 1.0, s.second * 2.0};
                      },
                      P{tensor(0.0), tensor(1.0)})
        .second;
  };
  expect_allclose(vmap(count)(tensor({0.0, 1.0, 3.0, 5.0})), {1, 2, 8, 32},
                  {.rtol = 1e-10, .atol = 1e-10});
  expect_allclose(jit(vmap(count))(tensor({0.0, 1.0, 3.0, 5.0})), {1, 2, 8, 32},
                  {.rtol = 1e-10, .atol = 1e-10});
  // (at a = 1 the loop runs zero times: the program is the identity there, derivative 1)
  expect_allclose(vmap(grad(newton_sqrt))(tensor({1.0, 4.0, 9.0})), {1.0, 0.25, 1.0 / 6},
                  {.rtol = 1e-8, .atol = 1e-8});
  // grad of the vmapped loop: the batched predicate's loop, differentiated as a whole.
  auto total = [&](const Tensor& a) { return sum(vmap(newton_sqrt)(a)); };
  expect_allclose(grad(total)(tensor({1.0, 4.0, 9.0})), {1.0, 0.25, 1.0 / 6},
                  {.rtol = 1e-8, .atol = 1e-8});
  expect_allclose(jit(grad(total))(tensor({1.0, 4.0, 9.0})), {1.0, 0.25, 1.0 / 6},
                  {.rtol = 1e-8, .atol = 1e-8});
}

TEST(ControlFlow, VmapCondSharedAndPerExamplePredicate) {
  auto f = [](const Tensor& x, const Tensor& p) {
    return cond(
        p > 0.0, [&] { return x * 2.0; }, [&] { return x - 1.0; });
  };
  expect_allclose(vmap(f, in_axes(0, none))(tensor({1.0, 2.0}), tensor(1.0)), {2, 4},
                  {.rtol = 1e-10, .atol = 1e-10});
  expect_allclose(vmap(f)(tensor({1.0, 2.0, 3.0}), tensor({1.0, -1.0, 1.0})), {2, 1, 6},
                  {.rtol = 1e-10, .atol = 1e-10});
  // the branch not taken produces NaN; its gradient must not leak into the one taken
  auto g = [](const Tensor& x) {
    return cond(
        x > 0.0, [&] { return sqrt(x); }, [&] { return x; });
  };
  expect_allclose(vmap(grad(g))(tensor({4.0, -1.0})), {0.25, 1}, {.rtol = 1e-10, .atol = 1e-10});
}

TEST(ControlFlow, VmapScanBatchedXsAndCarry) {
  auto f = [](const Tensor& c0, const Tensor& xs) {
    return scan([](const Tensor& c, const Tensor& x) { return P{c * 0.5 + x, c}; }, c0, xs);
  };
  const Tensor c0 = tensor({1.0, 2.0});
  const Tensor xs = tensor(std::vector<double>{1, 2, 3, 4, 5, 6}, {2, 3});
  auto [c, ys] = vmap(f)(c0, xs);
  for (int b = 0; b < 2; ++b) {
    auto [ce, yse] = f(index(c0, b), index(xs, b));
    expect_allclose(index(c, b), ce.to_vector<double>(), {.rtol = 1e-10, .atol = 1e-10});
    expect_allclose(index(ys, b), yse.to_vector<double>(), {.rtol = 1e-10, .atol = 1e-10});
  }
}

}  // namespace
}  // namespace kiln
