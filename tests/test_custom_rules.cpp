// custom_vjp's residual form, custom_vjp(f, fwd, bwd): gradients against analytic values and
// float64 finite differences; fwd runs once per forward pass and its residuals are saved, not
// recomputed; jit on both backends, vmap(grad), two uses in one program, grad of grad,
// checkpoint around it, and the errors.
#include <gtest/gtest.h>
#include <kiln/kiln.h>

#include <cmath>
#include <functional>
#include <string>

#include "testing.h"

namespace kiln {
namespace {

using testing::expect_allclose;
using testing::fd_grad;

std::vector<double> map(const Tensor& a, const std::function<double(double)>& fn) {
  std::vector<double> v = a.to_vector<double>();
  for (double& e : v) e = fn(e);
  return v;
}

std::vector<double> times(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> out(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) out[i] = a[i] * b[i];
  return out;
}

// JAX's example: f(x, y) = sin(x) y, whose fwd saves (cos(x), sin(x), y). The counters see
// how often each function is traced.
struct SinTimes {
  std::shared_ptr<int> f_calls = std::make_shared<int>(0);
  std::shared_ptr<int> fwd_calls = std::make_shared<int>(0);
  std::shared_ptr<int> bwd_calls = std::make_shared<int>(0);

  auto function() const {
    using Res = std::tuple<Tensor, Tensor, Tensor>;
    return custom_vjp(
        [n = f_calls](const Tensor& x, const Tensor& y) {
          ++*n;
          return sin(x) * y;
        },
        [n = fwd_calls](const Tensor& x, const Tensor& y) {
          ++*n;
          return std::pair<Tensor, Res>{sin(x) * y, Res{cos(x), sin(x), y}};
        },
        [n = bwd_calls](const Res& res, const Tensor& g) {
          ++*n;
          const auto& [cos_x, sin_x, y] = res;
          return std::tuple<Tensor, Tensor>{cos_x * g * y, sin_x * g};
        });
  }
};

Tensor xs() { return tensor({0.3, -1.2, 2.0, 0.7}); }
Tensor ys() { return tensor({1.5, 0.4, -0.8, 2.2}); }

TEST(CustomVjpResiduals, GradientsMatchAnalyticValuesAndFiniteDifferences) {
  const auto f = SinTimes{}.function();
  auto loss = [f](const Tensor& x, const Tensor& y) { return sum(f(x, y) * f(x, y)); };
  const Tensor x = xs(), y = ys();
  // d/dx sum((sin x y)^2) = 2 sin x cos x y^2, d/dy = 2 sin^2 x y.
  const std::vector<double> sx = map(x, [](double v) { return std::sin(v); }),
                            cx = map(x, [](double v) { return std::cos(v); }),
                            yv = y.to_vector<double>();
  std::vector<double> want_x(4), want_y(4);
  for (std::size_t i = 0; i < 4; ++i) {
    want_x[i] = 2 * sx[i] * cx[i] * yv[i] * yv[i];
    want_y[i] = 2 * sx[i] * sx[i] * yv[i];
  }
  const auto [gx, gy] = grad(loss, argnums<0, 1>)(x, y);
  expect_allclose(gx, want_x, {.rtol = 1e-14, .atol = 1e-14});
  expect_allclose(gy, want_y, {.rtol = 1e-14, .atol = 1e-14});
  expect_allclose(gx, fd_grad([&](const Tensor& v) { return loss(v, y).item<double>(); }, x),
                  {.rtol = 1e-8, .atol = 1e-8});
  expect_allclose(gy, fd_grad([&](const Tensor& v) { return loss(x, v).item<double>(); }, y),
                  {.rtol = 1e-8, .atol = 1e-8});
  expect_allclose(f(x, y), times(sx, yv),
                  {.rtol = 1e-15, .atol = 1e-15});  // not differentiated: fwd's output
}

TEST(CustomVjpResiduals, FwdRunsOnceAndItsResidualsAreSaved) {
  const SinTimes counted;
  const auto f = counted.function();
  auto loss = [f](const Tensor& x, const Tensor& y) { return sum(f(x, y)); };
  const Tensor g = grad(loss)(xs(), ys());
  EXPECT_EQ(*counted.fwd_calls, 1);
  EXPECT_EQ(*counted.bwd_calls, 1);
  expect_allclose(g,
                  times(map(xs(), [](double v) { return std::cos(v); }), ys().to_vector<double>()),
                  {.rtol = 1e-14, .atol = 1e-14});
  // In the gradient program sin and cos are computed only inside fwd: the backward pass reads
  // fwd's residuals, which are results of the one custom_vjp equation.
  const ir::Function program = trace(grad(loss), xs(), ys());
  int custom = 0, top_level_trig = 0;
  for (const ir::Equation& e : program.equations) {
    custom += e.prim->name == "custom_vjp";
    top_level_trig += e.prim->name == "sin" || e.prim->name == "cos";
  }
  EXPECT_EQ(custom, 1) << ir::print(program);
  EXPECT_EQ(top_level_trig, 0) << ir::print(program);
  EXPECT_EQ(ir::print(*ir::parse(ir::print(program))), ir::print(program));  // the text form
}

TEST(CustomVjpResiduals, JitOnBothBackendsMatchesEager) {
  const auto f = SinTimes{}.function();
  auto loss = [f](const Tensor& x, const Tensor& y) { return sum(f(x, y) * y); };
  const auto [ex, ey] = grad(loss, argnums<0, 1>)(xs(), ys());
  for (ir::Backend backend : {ir::Backend::interpreter, ir::Backend::llvm}) {
    const auto step = jit(grad(loss, argnums<0, 1>), JitOptions{.backend = backend});
    const auto [gx, gy] = step(xs(), ys());
    expect_allclose(gx, ex.to_vector<double>(), {.rtol = 1e-14, .atol = 1e-14});
    expect_allclose(gy, ey.to_vector<double>(), {.rtol = 1e-14, .atol = 1e-14});
    const auto [again, unused] = step(xs() * 2.0, ys());
    (void)unused;
    expect_allclose(again,
                    std::get<0>(grad(loss, argnums<0, 1>)(xs() * 2.0, ys())).to_vector<double>(),
                    {.rtol = 1e-14, .atol = 1e-14});
  }
}

TEST(CustomVjpResiduals, VmapOfGradMatchesALoop) {
  const auto f = SinTimes{}.function();
  auto loss = [f](const Tensor& x, const Tensor& y) { return sum(f(x, y)); };
  const Tensor bx = reshape(tensor({0.3, -1.2, 2.0, 0.7, 1.1, -0.4}), Shape{3, 2});
  const Tensor y = tensor({1.5, -0.8});
  const Tensor per_example = vmap(grad(loss), in_axes(0, none))(bx, y);
  ASSERT_EQ(per_example.shape(), (Shape{3, 2}));
  for (int64_t i = 0; i < 3; ++i) {
    const Tensor xi = index(bx, i);
    const std::vector<double> want =
        times(map(xi, [](double v) { return std::cos(v); }), y.to_vector<double>());
    expect_allclose(index(per_example, i), want, {.rtol = 1e-14, .atol = 1e-14});
  }
  const Tensor jitted = jit(vmap(grad(loss), in_axes(0, none)))(bx, y);
  expect_allclose(jitted, per_example.to_vector<double>(), {.rtol = 1e-14, .atol = 1e-14});
}

TEST(CustomVjpResiduals, TwoUsesInOneProgram) {
  const auto f = SinTimes{}.function();
  // g(x) = sum(f(f(x, y), y)): g' = cos(sin(x) y) y * cos(x) y.
  auto loss = [f](const Tensor& x, const Tensor& y) { return sum(f(f(x, y), y)); };
  const Tensor x = xs(), y = ys();
  const std::vector<double> xv = x.to_vector<double>(), yv = y.to_vector<double>();
  std::vector<double> want(4);
  for (std::size_t i = 0; i < 4; ++i)
    want[i] = std::cos(std::sin(xv[i]) * yv[i]) * yv[i] * std::cos(xv[i]) * yv[i];
  expect_allclose(grad(loss)(x, y), want, {.rtol = 1e-14, .atol = 1e-14});
  expect_allclose(jit(grad(loss))(x, y), want, {.rtol = 1e-14, .atol = 1e-14});
  expect_allclose(grad(loss)(x, y),
                  fd_grad([&](const Tensor& v) { return loss(v, y).item<double>(); }, x),
                  {.rtol = 1e-8, .atol = 1e-8});
}

TEST(CustomVjpResiduals, GradOfGradDifferentiatesTheRules) {
  const auto f = SinTimes{}.function();
  // d/dx sum(sin(x) y) = cos(x) y; d2/dx2 = -sin(x) y: the second derivative reaches cos(x)
  // through the residual, so it needs fwd's derivative too.
  auto loss = [f](const Tensor& x, const Tensor& y) { return sum(f(x, y)); };
  auto first = [loss](const Tensor& x, const Tensor& y) { return sum(grad(loss)(x, y)); };
  const Tensor x = xs(), y = ys();
  const std::vector<double> want =
      times(map(x, [](double v) { return -std::sin(v); }), y.to_vector<double>());
  expect_allclose(grad(first)(x, y), want, {.rtol = 1e-14, .atol = 1e-14});
  expect_allclose(jit(grad(first))(x, y), want, {.rtol = 1e-14, .atol = 1e-14});
  // And with respect to y: d/dy sum(cos(x) y) = cos(x), through bwd's use of the residual y.
  expect_allclose(grad(first, argnums<1>)(x, y), map(x, [](double v) { return std::cos(v); }),
                  {.rtol = 1e-14, .atol = 1e-14});
}

TEST(CustomVjpResiduals, CheckpointAroundIt) {
  const auto f = SinTimes{}.function();
  auto loss = [f](const Tensor& x, const Tensor& y) { return sum(checkpoint(f)(x, y) * x); };
  const Tensor x = xs(), y = ys();
  // d/dx sum(sin(x) y x) = cos(x) y x + sin(x) y.
  const std::vector<double> xv = x.to_vector<double>(), yv = y.to_vector<double>();
  std::vector<double> want(4);
  for (std::size_t i = 0; i < 4; ++i)
    want[i] = std::cos(xv[i]) * yv[i] * xv[i] + std::sin(xv[i]) * yv[i];
  expect_allclose(grad(loss)(x, y), want, {.rtol = 1e-14, .atol = 1e-14});
  expect_allclose(jit(grad(loss))(x, y), want, {.rtol = 1e-14, .atol = 1e-14});
}

TEST(CustomVjpResiduals, GradOfAJittedFunctionAndOfAScanUsingIt) {
  const auto f = SinTimes{}.function();
  auto loss = [f](const Tensor& x, const Tensor& y) { return sum(f(x, y)); };
  const Tensor x = xs(), y = ys();
  const std::vector<double> want =
      times(map(x, [](double v) { return std::cos(v); }), y.to_vector<double>());
  expect_allclose(grad(jit(loss))(x, y), want,
                  {.rtol = 1e-14, .atol = 1e-14});  // through the optimised IR of a call
  // A scan stores the residuals of each step (its residual split keeps fwd in the forward
  // scan): c <- f(c, y_t) over three rows of y.
  const Tensor rows =
      reshape(tensor({1.5, 0.4, -0.8, 2.2, 0.3, -1.1, 0.9, 0.6, 1.2, -0.5, 0.7, 1.0}), Shape{3, 4});
  auto chain = [f](const Tensor& c0, const Tensor& ys_) {
    const auto [c, unused] = scan(
        [f](const Tensor& c, const Tensor& yt) {
          return std::pair<Tensor, Tensor>{f(c, yt), c};
        },
        c0, ys_);
    (void)unused;
    return sum(c);
  };
  const Tensor g = grad(chain)(x, rows);
  expect_allclose(g, fd_grad([&](const Tensor& v) { return chain(v, rows).item<double>(); }, x),
                  {.rtol = 1e-8, .atol = 1e-8});
  expect_allclose(jit(grad(chain))(x, rows), g.to_vector<double>(), {.rtol = 1e-14, .atol = 1e-14});
  // The backward scan (the last one) reads the stacked residuals: no fwd, sin or cos in it.
  const ir::Function program = trace(grad(chain), x, rows);
  const ir::Equation* backward = nullptr;
  for (const ir::Equation& e : program.equations)
    if (e.prim->name == "scan") backward = &e;
  ASSERT_NE(backward, nullptr);
  for (const ir::Equation& e : backward->attrs.get<FunctionRef>("body")->equations)
    EXPECT_TRUE(e.prim->name != "custom_vjp" && e.prim->name != "sin" && e.prim->name != "cos")
        << ir::print(program);
}

// The rule is what reverse mode uses: a clipped gradient differs from the true one.
TEST(CustomVjpResiduals, ClipsGradientsWithAResidual) {
  auto clip_grad =
      custom_vjp([](const Tensor& x, const Tensor&) { return x; },
                 [](const Tensor& x, const Tensor& bound) {
                   return std::pair<Tensor, Tensor>{x, bound};
                 },
                 [](const Tensor& bound, const Tensor& g) {
                   return std::tuple<Tensor, Tensor>{clip(g, -bound, bound), zeros_like(bound)};
                 });
  auto loss = [&](const Tensor& x) {
    return sum(clip_grad(x, tensor(2.0)) * tensor({5.0, 0.5, -3.0}));
  };
  expect_allclose(grad(loss)(tensor({1.0, 1.0, 1.0})), {2.0, 0.5, -2.0},
                  {.rtol = 1e-15, .atol = 1e-15});
  expect_allclose(jit(grad(loss))(tensor({1.0, 1.0, 1.0})), {2.0, 0.5, -2.0},
                  {.rtol = 1e-15, .atol = 1e-15});
}

TEST(CustomVjpResiduals, ForwardModeIsAnError) {
  const auto f = SinTimes{}.function();
  auto g = [f](const Tensor& x) { return f(x, ys()); };
  try {
    (void)jvp(g, std::tuple<Tensor>{xs()}, std::tuple<Tensor>{ones_like(xs())});
    FAIL() << "jvp through a custom_vjp should fail";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("forward-mode"), std::string::npos) << e.what();
  }
}

TEST(CustomVjpResiduals, ABwdOfTheWrongTypesIsAnError) {
  auto f = custom_vjp([](const Tensor& x) { return x * 2.0; },
                      [](const Tensor& x) {
                        return std::pair<Tensor, Tensor>{x * 2.0, x};
                      },
                      [](const Tensor&, const Tensor& g) {
                        return std::tuple<Tensor>{sum(g)};  // a scalar for an f64[4] argument
                      });
  try {
    (void)grad([&](const Tensor& x) { return sum(f(x)); })(xs());
    FAIL() << "a bwd with a wrong cotangent type should fail";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("one cotangent per argument"), std::string::npos)
        << e.what();
  }
}

TEST(CustomVjpResiduals, AFwdWhoseOutputDiffersFromFIsAnError) {
  auto f = custom_vjp(
      [](const Tensor& x) {
        return std::vector<Tensor>{x, x};
      },
      [](const Tensor& x) {
        return std::pair<std::vector<Tensor>, Tensor>{{x}, x};
      },
      [](const Tensor&, const std::vector<Tensor>& g) { return std::tuple<Tensor>{g[0]}; });
  EXPECT_THROW((void)f(xs()), Error);
}

}  // namespace
}  // namespace kiln
