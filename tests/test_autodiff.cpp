// Autodiff compositions: grad/jvp/vjp/hessian on whole programs, against analytic values and
// float64 finite differences; custom rules, stop_gradient, checkpoint; eager vs jit.
#include <gtest/gtest.h>
#include <kiln/kiln.h>

#include <algorithm>
#include <cmath>
#include <functional>

#include "testing.h"

struct Params {
  kiln::Tensor w, b;
};
KILN_TREE(Params, w, b);

struct Cnn {
  kiln::Tensor conv, fc;
};
KILN_TREE(Cnn, conv, fc);

namespace kiln {
namespace {

using testing::expect_allclose;
using testing::fd_grad;

TEST(Grad, SinTimesXMatchesTheAnalyticDerivative) {
  auto f = [](const Tensor& x) { return sum(sin(x) * x); };
  const Tensor x = tensor({0.5, 1.0, 2.0});
  std::vector<double> want;
  for (double v : {0.5, 1.0, 2.0}) want.push_back(std::sin(v) + v * std::cos(v));
  expect_allclose(grad(f)(x), want, {.rtol = 1e-14, .atol = 1e-14});
  expect_allclose(jit(grad(f))(x), want, {.rtol = 1e-14, .atol = 1e-14});
}

TEST(Grad, ThirdDerivativeOfSinIsMinusCos) {
  auto d = [](auto f) { return [f](const Tensor& x) { return grad(f)(x); }; };
  auto third = d(d(d([](const Tensor& x) { return sin(x); })));
  for (double v : {-1.0, 0.3, 2.0})
    EXPECT_NEAR(third(tensor(v)).item<double>(), -std::cos(v), 1e-14);
}

TEST(Hessian, RosenbrockMatchesTheAnalyticMatrix) {
  auto rosen = [](const Tensor& x) {
    const Tensor a = slice(x, {Slice{0, 1, 1}}), b = slice(x, {Slice{1, 2, 1}});
    return sum((1.0 - a) * (1.0 - a) + 100.0 * (b - a * a) * (b - a * a));
  };
  const double x = 0.7, y = -0.4;
  const std::vector<double> want{2 - 400 * (y - x * x) + 800 * x * x, -400 * x, -400 * x, 200};
  expect_allclose(hessian(rosen)(tensor({x, y})), want, {.rtol = 1e-12, .atol = 1e-12});
}

TEST(Hessian, VectorProductViaJvpOfGradMatchesHessianTimesV) {
  auto f = [](const Tensor& x) { return sum(tanh(x) * exp(x * 0.5)); };
  const Tensor x = tensor({0.1, -0.7, 1.3}), v = tensor({1.0, 2.0, -0.5});
  auto [g, hvp] = jvp([&](const Tensor& z) { return grad(f)(z); }, std::tuple<Tensor>{x},
                      std::tuple<Tensor>{v});
  const Tensor hv = matmul(hessian(f)(x), v);
  expect_allclose(hvp, hv.to_vector<double>(), {.rtol = 1e-12, .atol = 1e-12});
}

TEST(Grad, StructArgumentsGiveStructGradientsAndMultipleArgnums) {
  auto loss = [](const Params& p, const Tensor& x, const Tensor& y) {
    const Tensor pred = matmul(x, p.w) + p.b;
    return mean((pred - y) * (pred - y));
  };
  const Params p{tensor({0.5, -1.0, 2.0}, {3, 1}), tensor({0.1})};
  const Tensor x = tensor({1.0, 2.0, 3.0, -1.0, 0.5, 0.0}, {2, 3}), y = tensor({1.0, -2.0}, {2, 1});
  auto [value, g] = value_and_grad(loss)(p, x, y);
  // Independent reference: the gradient of the mean squared error by hand.
  const double r0 = (0.5 - 2.0 + 6.0 + 0.1) - 1.0, r1 = (-0.5 - 0.5 + 0.0 + 0.1) + 2.0;
  EXPECT_NEAR(value.item<double>(), (r0 * r0 + r1 * r1) / 2, 1e-12);
  expect_allclose(g.w, {r0 * 1 + r1 * -1, r0 * 2 + r1 * 0.5, r0 * 3 + r1 * 0},
                  {.rtol = 1e-12, .atol = 1e-12});
  expect_allclose(g.b, {r0 + r1}, {.rtol = 1e-12, .atol = 1e-12});
  auto [gp, gy] = grad(loss, argnums<0, 2>)(p, x, y);
  expect_allclose(gp.w, g.w.to_vector<double>(), {.rtol = 1e-14, .atol = 1e-14});
  expect_allclose(gy, {-r0, -r1}, {.rtol = 1e-12, .atol = 1e-12});
}

TEST(Grad, HasAuxReturnsTheAuxiliaryValue) {
  auto f = [](const Tensor& x) { return std::pair{sum(x * x), x * 3.0}; };
  auto [g, aux] = grad(f, has_aux)(tensor({1.0, 2.0}));
  expect_allclose(g, {2.0, 4.0}, {.rtol = 1e-15, .atol = 1e-15});
  expect_allclose(aux, {3.0, 6.0}, {.rtol = 1e-15, .atol = 1e-15});
}

TEST(Grad, NonScalarLossIsAnError) {
  EXPECT_THROW(grad([](const Tensor& x) { return x * 2.0; })(tensor({1.0, 2.0})), Error);
}

TEST(Vjp, PullbackGivesTransposedJacobianProducts) {
  auto f = [](const Tensor& x) { return sin(x) * 2.0; };
  const Tensor x = tensor({0.2, 0.4});
  auto [y, pullback] = vjp(f, x);
  auto [ct] = pullback(tensor({1.0, -1.0}));
  expect_allclose(ct, {2 * std::cos(0.2), -2 * std::cos(0.4)}, {.rtol = 1e-14, .atol = 1e-14});
}

TEST(Jacobian, ForwardAndReverseAgreeWithFiniteDifferences) {
  auto f = [](const Tensor& x) { return stack({sum(x * x), prod(x)}); };
  const Tensor x = tensor({1.5, -2.0, 0.5});
  const std::vector<double> want{3.0, -4.0, 1.0, -1.0, 0.75, -3.0};
  expect_allclose(jacfwd(f)(x), want, {.rtol = 1e-12, .atol = 1e-12});
  expect_allclose(jacrev(f)(x), want, {.rtol = 1e-12, .atol = 1e-12});
}

TEST(Grad, SafeWhereHasNoNanAtZero) {
  // The documented safe form: keep the unsafe branch's input away from the singularity too.
  auto safe_sqrt = [](const Tensor& x) {
    const Tensor pos = x > 0.0;
    return sum(where(pos, sqrt(where(pos, x, ones_like(x))), zeros_like(x)));
  };
  expect_allclose(grad(safe_sqrt)(tensor({0.0, 4.0})), {0.0, 0.25}, {.rtol = 1e-15, .atol = 1e-15});
}

TEST(Grad, SoftmaxFamilyIsStableForLargeLogits) {
  const Tensor logits = tensor({1000.0, 0.0, -1000.0});
  auto lse = [](const Tensor& x) { return logsumexp(x); };
  expect_allclose(grad(lse)(logits), {1.0, 0.0, 0.0}, {.rtol = 1e-15, .atol = 1e-15});
  auto xent = [](const Tensor& x) { return -sum(log_softmax(x) * tensor({0.0, 1.0, 0.0})); };
  expect_allclose(grad(xent)(logits), {1.0, -1.0, 0.0}, {.rtol = 1e-15, .atol = 1e-15});
  auto sm = [](const Tensor& x) { return sum(softmax(x) * tensor({1.0, 2.0, 3.0})); };
  const std::vector<double> g = grad(sm)(logits).to_vector<double>();
  for (double v : g) EXPECT_TRUE(std::isfinite(v));
}

TEST(Grad, StopGradientBlocksTheFlow) {
  auto f = [](const Tensor& x) { return sum(x * stop_gradient(x)); };
  expect_allclose(grad(f)(tensor({1.0, -3.0})), {1.0, -3.0}, {.rtol = 1e-15, .atol = 1e-15});
}

TEST(CustomRules, CustomJvpGivesAStableLog1pexp) {
  // log(1 + e^x) with the derivative sigmoid(x): the naive rule is NaN at x = 1000.
  auto log1pexp = custom_jvp([](const Tensor& x) { return where(x > 30.0, x, log1p(exp(x))); },
                             [](const std::tuple<Tensor>& p, const std::tuple<Tensor>& t) {
                               return std::get<0>(t) * sigmoid(std::get<0>(p));
                             });
  auto f = [&](const Tensor& x) { return sum(log1pexp(x)); };
  const Tensor x = tensor({0.0, 1000.0, -5.0});
  expect_allclose(grad(f)(x), {0.5, 1.0, 1.0 / (1.0 + std::exp(5.0))},
                  {.rtol = 1e-14, .atol = 1e-14});
  expect_allclose(jit(grad(f))(x), {0.5, 1.0, 1.0 / (1.0 + std::exp(5.0))},
                  {.rtol = 1e-14, .atol = 1e-14});
  auto [y, t] = jvp(log1pexp, std::tuple<Tensor>{x}, std::tuple<Tensor>{ones_like(x)});
  expect_allclose(t, {0.5, 1.0, 1.0 / (1.0 + std::exp(5.0))}, {.rtol = 1e-14, .atol = 1e-14});
}

TEST(CustomRules, CustomVjpClipsGradientsInTheBackwardPass) {
  auto clip_grad = custom_vjp([](const Tensor& x) { return x; },
                              [](const std::tuple<Tensor>&, const Tensor&, const Tensor& ct) {
                                return std::tuple<Tensor>{clip(ct, -1.0, 1.0)};
                              });
  auto f = [&](const Tensor& x) { return sum(clip_grad(x) * tensor({5.0, 0.5, -3.0})); };
  expect_allclose(grad(f)(tensor({1.0, 1.0, 1.0})), {1.0, 0.5, -1.0},
                  {.rtol = 1e-15, .atol = 1e-15});
  expect_allclose(jit(grad(f))(tensor({1.0, 1.0, 1.0})), {1.0, 0.5, -1.0},
                  {.rtol = 1e-15, .atol = 1e-15});
}

TEST(Checkpoint, SameGradientsAsWithout) {
  auto block = [](const Tensor& x) { return tanh(x * 1.5) * sin(x); };
  auto plain = [&](const Tensor& x) { return sum(block(block(x))); };
  auto remat = [&](const Tensor& x) {
    auto cb = checkpoint(block);
    return sum(cb(cb(x)));
  };
  const Tensor x = tensor({0.3, -1.2, 2.0});
  const std::vector<double> want = grad(plain)(x).to_vector<double>();
  expect_allclose(grad(remat)(x), want, {.rtol = 1e-14, .atol = 1e-14});
  expect_allclose(jit(grad(remat))(x), want, {.rtol = 1e-14, .atol = 1e-14});
  EXPECT_NE(ir::print(trace(remat, x)).find("checkpoint"), std::string::npos);
}

// How often `op` runs in the optimised program of f's gradient, checkpoints inlined as when
// compiled.
template <class F>
int64_t count_in_gradient(F f, const std::string& op, const Tensor& x, const Tensor& w) {
  const ir::Function g = ir::inline_calls(ir::optimize(trace(grad(f, argnums<0, 1>), x, w)));
  return std::count_if(g.equations.begin(), g.equations.end(),
                       [&](const ir::Equation& e) { return e.prim->name == op; });
}

TEST(Checkpoint, PolicyStoresAllButTheNamedPrimitives) {
  auto block = [](const Tensor& x, const Tensor& w) { return tanh(matmul(x, w)) * 0.5 + x; };
  auto two = [&](auto b) {
    return [b](const Tensor& x, const Tensor& w) { return sum(sin(b(b(x, w), w))); };
  };
  auto plain = two(block);
  auto everything = two(checkpoint(block));
  auto all_but_tanh = two(checkpoint(block, CheckpointPolicy{{"tanh"}}));
  auto nothing = two(checkpoint(block, CheckpointPolicy{}));
  const Tensor x = random::normal(random::key(1), {3, 4}, float64);
  const Tensor w = random::normal(random::key(2), {4, 4}, float64);
  const auto [gx, gw] = grad(plain, argnums<0, 1>)(x, w);
  for (const ir::Backend backend : {ir::Backend::interpreter, ir::Backend::llvm})
    for (const auto& f : std::vector<std::function<Tensor(const Tensor&, const Tensor&)>>{
             everything, all_but_tanh, nothing}) {
      const auto [hx, hw] = jit(grad(f, argnums<0, 1>), {.backend = backend})(x, w);
      expect_allclose(hx, gx.to_vector<double>(), {.rtol = 1e-13, .atol = 1e-13});
      expect_allclose(hw, gw.to_vector<double>(), {.rtol = 1e-13, .atol = 1e-13});
    }
  // Plain reverse mode runs each block's product once forward; a checkpoint recomputes it in
  // the backward pass; the policy keeps the products and recomputes only tanh.
  const int64_t matmuls = count_in_gradient(plain, "matmul", x, w);
  const int64_t tanhs = count_in_gradient(plain, "tanh", x, w);
  EXPECT_EQ(tanhs, 2);
  EXPECT_EQ(count_in_gradient(everything, "matmul", x, w), matmuls + 2);
  EXPECT_EQ(count_in_gradient(all_but_tanh, "matmul", x, w), matmuls);
  EXPECT_EQ(count_in_gradient(all_but_tanh, "tanh", x, w), tanhs + 2);
  EXPECT_EQ(count_in_gradient(nothing, "matmul", x, w), matmuls);
  EXPECT_EQ(count_in_gradient(nothing, "tanh", x, w), tanhs);
  EXPECT_THROW(checkpoint(block, CheckpointPolicy{{"tanh,exp"}})(x, w), Error);
  EXPECT_THROW(checkpoint(block, CheckpointPolicy{{"allgather"}})(x, w), Error);
}

// The policy under the other transformations: eager reverse mode (which recomputes), second
// derivatives and vmap of grad under jit, against the same without a checkpoint; and the
// program with the pullback marked prints and parses back to the same text.
TEST(Checkpoint, PolicyComposesWithTheOtherTransformations) {
  auto block = [](const Tensor& x) { return tanh(x * 1.5) * sin(x); };
  auto plain = [&](const Tensor& x) { return sum(block(block(x))); };
  auto remat = [&](const Tensor& x) {
    auto cb = checkpoint(block, CheckpointPolicy{{"sin"}});
    return sum(cb(cb(x)));
  };
  const Tensor x = tensor({0.3, -1.2, 2.0});
  const Closeness tight{.rtol = 1e-12, .atol = 1e-12};
  expect_allclose(grad(remat)(x), grad(plain)(x).to_vector<double>(), tight);
  expect_allclose(jit(hessian(remat))(x), hessian(plain)(x).to_vector<double>(), tight);
  const Tensor xs = random::normal(random::key(3), {4, 3}, float64);
  expect_allclose(jit(vmap(grad(remat)))(xs), vmap(grad(plain))(xs).to_vector<double>(), tight);
  const ir::Function g = trace(grad(remat), x);
  const std::string text = ir::print(g);
  EXPECT_NE(text.find("primals"), std::string::npos);
  EXPECT_EQ(ir::print(*ir::parse(text)), text);
}

TEST(Grad, MlpMatchesFiniteDifferences) {
  const Tensor x = random::normal(random::key(1), {4, 3}, float64);
  const Tensor w2 = random::normal(random::key(2), {5, 2}, float64);
  auto loss = [&](const Tensor& w1) {
    const Tensor h = maximum(matmul(x, w1), 0.0);
    return mean(logsumexp(matmul(tanh(h), w2), {1}));
  };
  const Tensor w1 = random::normal(random::key(3), {3, 5}, float64);
  expect_allclose(grad(loss)(w1),
                  fd_grad([&](const Tensor& w) { return loss(w).item<double>(); }, w1),
                  {.rtol = 1e-7, .atol = 1e-7});
}

TEST(Grad, SmallCnnMatchesFiniteDifferences) {
  const Tensor images = random::normal(random::key(4), {2, 1, 6, 6}, float64);
  const Tensor labels = tensor(std::vector<int64_t>{1, 0}, Shape{2});
  auto loss = [&](const Cnn& p) {
    Tensor h = conv2d(images, p.conv, {.stride = {1, 1}, .padding = {1, 1}});
    h = max_pool2d(maximum(h, 0.0));  // [2, 2, 3, 3]
    const Tensor logits = matmul(reshape(h, {2, 18}), p.fc);
    const Tensor logp = log_softmax(logits);
    return -mean(sum(logp * one_hot(labels, 3, float64), {1}));
  };
  const Cnn p{random::normal(random::key(5), {2, 1, 3, 3}, float64),
              random::normal(random::key(6), {18, 3}, float64)};
  const Cnn g = grad(loss)(p);
  expect_allclose(g.conv,
                  fd_grad(
                      [&](const Tensor& c) {
                        return loss({c, p.fc}).item<double>();
                      },
                      p.conv),
                  {.rtol = 1e-6, .atol = 1e-6});
  expect_allclose(g.fc,
                  fd_grad(
                      [&](const Tensor& f) {
                        return loss({p.conv, f}).item<double>();
                      },
                      p.fc),
                  {.rtol = 1e-6, .atol = 1e-6});
  const Cnn gj = jit(grad(loss))(p);
  expect_allclose(gj.conv, g.conv.to_vector<double>(), {.rtol = 1e-12, .atol = 1e-12});
}

TEST(Grad, ConvWithStrideDilationGroupsMatchesFiniteDifferences) {
  const Tensor x = random::normal(random::key(7), {1, 4, 7, 6}, float64);
  const Tensor w = random::normal(random::key(8), {6, 2, 2, 3}, float64);
  const Conv2dOptions o{.stride = {2, 1}, .padding = {1, 2}, .dilation = {2, 1}, .groups = 2};
  const Tensor wt = random::normal(random::key(9), conv2d(x, w, o).shape(), float64);
  auto lx = [&](const Tensor& xx) { return sum(conv2d(xx, w, o) * wt); };
  auto lw = [&](const Tensor& ww) { return sum(conv2d(x, ww, o) * wt); };
  expect_allclose(grad(lx)(x), fd_grad([&](const Tensor& v) { return lx(v).item<double>(); }, x),
                  {.rtol = 1e-7, .atol = 1e-7});
  expect_allclose(grad(lw)(w), fd_grad([&](const Tensor& v) { return lw(v).item<double>(); }, w),
                  {.rtol = 1e-7, .atol = 1e-7});
}

TEST(Grad, PoolingMatchesFiniteDifferences) {
  const Tensor x = random::normal(random::key(10), {1, 2, 5, 5}, float64);
  const Pool2dOptions o{
      .kernel = {3, 3}, .stride = std::pair<int64_t, int64_t>{2, 2}, .padding = {1, 1}};
  const Tensor wt = random::normal(random::key(11), max_pool2d(x, o).shape(), float64);
  auto lmax = [&](const Tensor& v) { return sum(max_pool2d(v, o) * wt); };
  auto lavg = [&](const Tensor& v) { return sum(avg_pool2d(v, o) * wt); };
  expect_allclose(grad(lmax)(x),
                  fd_grad([&](const Tensor& v) { return lmax(v).item<double>(); }, x),
                  {.rtol = 1e-7, .atol = 1e-7});
  expect_allclose(grad(lavg)(x),
                  fd_grad([&](const Tensor& v) { return lavg(v).item<double>(); }, x),
                  {.rtol = 1e-7, .atol = 1e-7});
}

TEST(Ir, GradientProgramIsSmallAfterOptimisation) {
  auto f = [](const Tensor& x) { return sum(sin(x) * x); };
  const Tensor x = tensor({0.5, 1.0, 2.0});
  EXPECT_EQ(ir::print(ir::optimize(trace(grad(f), x))),
            "func @f(%arg0: f64[3]) -> f64[3] {\n"
            "  %0 = sin %arg0 : f64[3]\n"
            "  %1 = cos %arg0 : f64[3]\n"
            "  %2 = mul %arg0, %1 : f64[3]\n"
            "  %3 = add %0, %2 : f64[3]\n"
            "  return %3\n"
            "}");
}

TEST(Grad, JitStepUpdatesParameters) {
  auto loss = [](const Params& p, const Tensor& x, const Tensor& y) {
    const Tensor pred = matmul(x, p.w) + p.b;
    return mean((pred - y) * (pred - y));
  };
  auto step = jit([&](const Params& p, const Tensor& x, const Tensor& y) {
    const Params g = grad(loss)(p, x, y);
    return tree_map([](const Tensor& w, const Tensor& d) { return w - 0.1 * d; }, p, g);
  });
  Params p{ones({3, 1}), zeros({1})};
  const Tensor x = ones({4, 3}), y = zeros({4, 1});
  const Params eager_g = grad(loss)(p, x, y);
  const Params q = step(p, x, y);
  expect_allclose(q.w, (p.w - 0.1 * eager_g.w).to_vector<double>(), {.rtol = 1e-6, .atol = 1e-6});
  EXPECT_LT(loss(q, x, y).item<float>(), loss(p, x, y).item<float>());
}

// ---- reverse mode computes only what was asked for -------------------------------------

// counted_mul(a, b) = a * b (floats of one type); every kernel run is counted, so a test sees
// which cotangents reverse mode computed.
int g_counted_mul_runs = 0;
const Primitive& counted_mul_p = []() -> const Primitive& {
  Primitive p;
  p.name = "test_counted_mul";
  p.arity = 2;
  p.type_rule = [](std::span<const TensorType> in, const Attrs&) {
    if (in[0] != in[1] || !is_floating(in[0].dtype))
      fail("test_counted_mul", "got ", in[0], " and ", in[1], ", expected two floats of one type");
    return std::vector<TensorType>{in[0]};
  };
  p.vjp = [](const RuleArgs& r, std::span<const Tangent> ct) {
    const Primitive& self = r.primitive;  // the rule's own primitive
    return std::vector<Tangent>{bind1(self, {*ct[0], r.inputs[1]}),
                                bind1(self, {*ct[0], r.inputs[0]})};
  };
  return register_primitive(
      std::move(p), {{KernelSignature{.device = Device::cpu,
                                      .inputs = {DTypeSet::floating(), DTypeSet::floating()}},
                      [](std::span<const Tensor> in, const Attrs&) {
                        ++g_counted_mul_runs;
                        return std::vector<Tensor>{mul(in[0], in[1])};
                      }}});
}();

// kept(x) = x + 0 as a fresh tensor, not differentiable; remembers its last output's storage,
// so a test can see whether reverse mode still holds that forward value.
std::weak_ptr<Storage> g_kept_storage;
const Primitive& kept_p = []() -> const Primitive& {
  Primitive p;
  p.name = "test_kept";
  p.differentiable = false;
  p.type_rule = [](std::span<const TensorType> in, const Attrs&) {
    return std::vector<TensorType>{in[0]};
  };
  return register_primitive(
      std::move(p), {{KernelSignature{.device = Device::cpu, .inputs = {DTypeSet::floating()}},
                      [](std::span<const Tensor> in, const Attrs&) {
                        Tensor out = in[0].contiguous();
                        if (out.shares_storage_with(in[0])) out = mul(in[0], ones_like(in[0]));
                        g_kept_storage = out.storage();
                        return std::vector<Tensor>{out};
                      }}});
}();

TEST(ReverseMode, EagerGradComputesNoCotangentForClosedOverData) {
  const Tensor X = tensor({1.0, 2.0, 3.0, 4.0});
  auto loss = [&](const Tensor& w) { return sum(bind1(counted_mul_p, {X, w})); };
  g_counted_mul_runs = 0;
  const Tensor g = grad(loss)(zeros({4}, float64));
  EXPECT_EQ(g.to_vector<double>(), X.to_vector<double>());  // d/dw sum(X * w) = X
  EXPECT_EQ(g_counted_mul_runs, 2);  // the forward product and w's cotangent; none for X
}

TEST(ReverseMode, EagerGradComputesNoCotangentForArgumentsNotAskedFor) {
  auto loss = [](const Tensor& w, const Tensor& X) { return sum(bind1(counted_mul_p, {X, w})); };
  const Tensor X = tensor({1.0, -2.0, 0.5});
  g_counted_mul_runs = 0;
  const Tensor g = grad(loss)(ones({3}, float64), X);
  EXPECT_EQ(g.to_vector<double>(), X.to_vector<double>());
  EXPECT_EQ(g_counted_mul_runs, 2);
  g_counted_mul_runs = 0;
  const auto [gw, gx] = grad(loss, argnums<0, 1>)(ones({3}, float64), X);
  EXPECT_EQ(gx.to_vector<double>(), (std::vector<double>{1, 1, 1}));
  EXPECT_EQ(g_counted_mul_runs, 3);  // both asked for
}

TEST(ReverseMode, EagerVjpKeepsOnlyTheForwardValuesItsPullbackReads) {
  const Tensor X = tensor({1.0, 2.0, 3.0});
  auto f = [&](const Tensor& w) {
    return sum(bind1(counted_mul_p, {X, w})) + sum(bind1(kept_p, {X}));
  };
  g_counted_mul_runs = 0;
  auto [y, pullback] = vjp(f, tensor({0.5, 0.5, 0.5}));
  EXPECT_DOUBLE_EQ(y.item<double>(), 3.0 + 6.0);
  EXPECT_TRUE(g_kept_storage.expired()) << "the pullback holds a forward value it never reads";
  const Tensor g = std::get<0>(pullback(tensor(2.0)));
  EXPECT_EQ(g.to_vector<double>(), (std::vector<double>{2, 4, 6}));
  EXPECT_EQ(g_counted_mul_runs, 2);  // forward, then w's cotangent only
}

TEST(ReverseMode, EagerHessianOfALossOverDataDoesNotDifferentiateTheData) {
  const Tensor X = tensor({1.0, 2.0, -1.0, 0.5, 3.0, 1.0}, {3, 2});
  auto loss = [&](const Tensor& w) { return mean(square(matmul(X, w))); };
  // H = 2/n X^T X, analytically.
  const std::vector<double> x = X.to_vector<double>();
  std::vector<double> h(4, 0.0);
  for (int i = 0; i < 3; ++i)
    for (int a = 0; a < 2; ++a)
      for (int b = 0; b < 2; ++b)
        h[static_cast<std::size_t>(a * 2 + b)] += 2.0 / 3.0 *
                                                  x[static_cast<std::size_t>(i * 2 + a)] *
                                                  x[static_cast<std::size_t>(i * 2 + b)];
  expect_allclose(hessian(loss)(tensor({0.3, -0.7})), h, {.rtol = 1e-12, .atol = 1e-12});
  reset_peak_memory_stats();
  const int64_t before = memory_stats().bytes_in_use;
  const Tensor big = zeros({20000, 20}, float64);  // 3.2 MB of data
  auto big_loss = [&](const Tensor& w) { return mean(square(matmul(big, w))); };
  (void)grad(big_loss)(zeros({20}, float64));
  // The forward product is 160 kB; a cotangent for `big` would be another 3.2 MB.
  EXPECT_LT(memory_stats().peak_bytes_in_use - before, 3'200'000 + 1'000'000);
}

}  // namespace
}  // namespace kiln
