// kiln::nn's activations with parameters (elu, leaky_relu, PyTorch's softplus and their
// layers), GroupNorm and RMSNorm, and the losses with a reduction (huber_loss, kl_div,
// nll_loss) plus label-smoothed cross entropy: values and gradients against PyTorch 1.13
// (RMSNorm: numpy), generated at build time by tests/reference/nn_functions_ref.py; gradients
// against float64 finite differences; edge values; errors; jit vs eager; vmap vs a loop.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "kiln/kiln.h"
#include "testing.h"

using namespace kiln;

namespace {

using kiln::testing::expect_allclose;
using kiln::testing::expect_error;
using kiln::testing::numeric_grad;

// A value tests/reference/nn_functions_ref.py wrote.
Tensor R(const std::string& name) {
  static const io::TensorFile file = kiln::testing::reference("nn_functions");
  return kiln::testing::at(file, name);
}

double tol_for(DType d) { return d == float64 ? 1e-12 : 2e-6; }

Tensor sample(const Shape& s, uint32_t seed, double lo = -2.0, double hi = 2.0) {
  return tensor(kiln::testing::random_values(s.numel(), seed, lo, hi), s);
}

using Fn = std::function<Tensor(const Tensor&)>;

// grad(fs[k]) at points[k] against float64 central differences.
void expect_grads_match_fd(const std::vector<Fn>& fs, const std::vector<Tensor>& points) {
  for (std::size_t k = 0; k < fs.size(); ++k) {
    const std::vector<double> g = grad(fs[k])(points[k]).to_vector<double>();
    const std::vector<double> n = numeric_grad(fs[k], points[k]);
    for (std::size_t i = 0; i < g.size(); ++i)
      EXPECT_NEAR(g[i], n[i], 1e-6) << "f" << k << " at " << i;
  }
}
struct NamedActivation {
  std::string name;
  Fn f;
};
const std::vector<NamedActivation>& activations() {
  static const std::vector<NamedActivation> all{
      {"gelu", [](const Tensor& x) { return nn::gelu(x); }},
      {"gelu_tanh", [](const Tensor& x) { return nn::gelu(x, true); }},
      {"silu", [](const Tensor& x) { return nn::silu(x); }},
      {"elu", [](const Tensor& x) { return nn::elu(x); }},
      {"elu_half", [](const Tensor& x) { return nn::elu(x, 0.5); }},
      {"leaky_relu", [](const Tensor& x) { return nn::leaky_relu(x); }},
      {"leaky_relu_02", [](const Tensor& x) { return nn::leaky_relu(x, 0.2); }},
      {"softplus", [](const Tensor& x) { return nn::softplus(x, 1.0); }},
      {"softplus_b2_t5", [](const Tensor& x) { return nn::softplus(x, 2.0, 5.0); }},
      {"softplus_b05", [](const Tensor& x) { return nn::softplus(x, 0.5); }},
  };
  return all;
}

// ---- activations ----------------------------------------------------------------------------

TEST(NnActivations, MatchTorchValuesAndGradients) {
  for (const std::string d : {"f32", "f64"}) {
    const Tensor x = R("act/" + d + "/x");
    for (const auto& [name, f] : activations()) {
      const std::string key = "act/" + d + "/" + name;
      const Tensor y = f(x);
      EXPECT_EQ(y.dtype(), x.dtype()) << key;
      expect_allclose(y, R(key), {.rtol = tol_for(x.dtype()) / 2, .atol = tol_for(x.dtype()) / 2},
                      key);
      const Fn total = [&f = f](const Tensor& a) { return sum(f(a)); };
      expect_allclose(grad(total)(x), R(key + "/grad"),
                      {.rtol = tol_for(x.dtype()) / 2, .atol = tol_for(x.dtype()) / 2},
                      key + " grad");
    }
  }
}

TEST(NnActivations, LayersCallTheirFunctions) {
  const Tensor x = R("act/f64/x");
  expect_allclose(nn::ELU{}(x), R("act/f64/elu"), {.rtol = 0, .atol = 0}, "ELU");
  expect_allclose(nn::ELU{0.5}(x), R("act/f64/elu_half"), {.rtol = 5e-16, .atol = 5e-16},
                  "ELU(0.5)");
  expect_allclose(nn::LeakyReLU{}(x), R("act/f64/leaky_relu"), {.rtol = 0, .atol = 0}, "LeakyReLU");
  expect_allclose(nn::LeakyReLU{0.2}(x), R("act/f64/leaky_relu_02"), {.rtol = 0, .atol = 0},
                  "LeakyReLU(0.2)");
  expect_allclose(nn::Softplus{}(x), R("act/f64/softplus"), {.rtol = 5e-16, .atol = 5e-16},
                  "Softplus");
  expect_allclose(nn::Softplus{.beta = 2.0, .threshold = 5.0}(x), R("act/f64/softplus_b2_t5"),
                  {.rtol = 5e-16, .atol = 5e-16}, "Softplus(2, 5)");
  expect_allclose(nn::GELU(true)(x), R("act/f64/gelu_tanh"), {.rtol = 5e-15, .atol = 5e-15},
                  "GELU(tanh)");
  expect_allclose(nn::SiLU()(x), R("act/f64/silu"), {.rtol = 5e-15, .atol = 5e-15}, "SiLU");
  // Static leaves: a Sequential of them has no parameters and keeps its settings.
  const nn::Sequential seq(nn::LeakyReLU{0.2}, nn::ELU{0.5}, nn::Softplus{.beta = 2.0});
  EXPECT_EQ(nn::parameter_count(seq), 0);
  const auto [leaves, def] = tree_flatten(seq);
  using Seq = nn::Sequential<nn::LeakyReLU, nn::ELU, nn::Softplus>;
  EXPECT_EQ(tree_unflatten<Seq>(def, leaves).get<0>().negative_slope, 0.2);
  EXPECT_NE(nn::summary(seq, x).find("Softplus"), std::string::npos);
}

TEST(NnActivations, EdgeValues) {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::nan("");
  const Tensor x = tensor(std::vector<double>{-inf, -0.0, 0.0, inf, nan});
  // elu uses expm1, so elu(-0) is -0 (PyTorch's exp(x) - 1 gives +0) and tiny x keep digits.
  const std::vector<double> e = nn::elu(x, 0.5).to_vector<double>();
  EXPECT_EQ(e[0], -0.5);
  EXPECT_TRUE(e[1] == 0.0 && std::signbit(e[1]));
  EXPECT_TRUE(e[2] == 0.0 && !std::signbit(e[2]));
  EXPECT_EQ(e[3], inf);
  EXPECT_TRUE(std::isnan(e[4]));
  EXPECT_EQ(nn::elu(tensor(std::vector<double>{-1e-300})).item<double>(), -1e-300);
  const std::vector<double> l = nn::leaky_relu(x).to_vector<double>();
  EXPECT_EQ(l[0], -inf);
  EXPECT_TRUE(l[1] == 0.0 && std::signbit(l[1]));  // 0.01 * -0, as PyTorch
  EXPECT_EQ(l[3], inf);
  EXPECT_TRUE(std::isnan(l[4]));
  const std::vector<double> s = nn::softplus(x, 2.0).to_vector<double>();
  EXPECT_EQ(s[0], 0.0);
  EXPECT_NEAR(s[1], std::log(2.0) / 2, 1e-16);
  EXPECT_EQ(s[3], inf);
  EXPECT_TRUE(std::isnan(s[4]));
  // Empty and 0-d keep their shapes.
  EXPECT_EQ(nn::elu(zeros({0, 3})).shape(), Shape({0, 3}));
  EXPECT_EQ(nn::Softplus{}(zeros({0})).shape(), Shape({0}));
  EXPECT_EQ(nn::leaky_relu(full(Shape{}, -2.0, float32)).item<float>(), -0.02f);
  // The branch not taken puts no NaN into derivatives, far out either side.
  const Tensor far = tensor(std::vector<double>{-800.0, -0.0, 0.0, 800.0});
  for (const auto& [name, f] : activations()) {
    const Fn total = [&f = f](const Tensor& a) { return sum(f(a)); };
    for (double g : grad(total)(far).to_vector<double>()) EXPECT_TRUE(std::isfinite(g)) << name;
  }
  // Derivatives at 0 take the negative branch, as PyTorch: elu' = alpha, leaky' = slope.
  auto d0 = [](const Fn& f) {
    return grad([&](const Tensor& a) { return sum(f(a)); })(zeros({1}, float64)).item<double>();
  };
  EXPECT_EQ(d0([](const Tensor& a) { return nn::elu(a, 0.5); }), 0.5);
  EXPECT_EQ(d0([](const Tensor& a) { return nn::leaky_relu(a, 0.2); }), 0.2);
  // softplus(x, beta)'' at 0 is beta / 4 (the smooth formula, not a kink).
  const Tensor zero = zeros({1}, float64);
  const double curvature =
      grad([](const Tensor& a) {
        return sum(grad([](const Tensor& b) { return sum(nn::softplus(b, 2.0)); })(a));
      })(zero)
          .item<double>();
  EXPECT_NEAR(curvature, 0.5, 1e-15);
}

TEST(NnActivations, Errors) {
  const Tensor ints = tensor(std::vector<int64_t>{1, -2});
  expect_error([&] { (void)nn::elu(ints); }, "nn.elu", {"must be floating point", "i64[2]"});
  expect_error([&] { (void)nn::leaky_relu(ints); }, "nn.leaky_relu", {"must be floating point"});
  expect_error([&] { (void)nn::softplus(ints, 1.0); }, "nn.softplus", {"must be floating point"});
  expect_error([&] { (void)nn::softplus(ones({2}), 0.0); }, "nn.softplus",
               {"beta out of range", "got 0"});
  expect_error([&] { (void)nn::Softplus{.beta = -1.0}(ones({2})); }, "nn.softplus",
               {"beta out of range"});
  expect_error([&] { (void)nn::ELU{}(Tensor{}); }, "nn.elu", {"undefined input"});
}

// ---- GroupNorm and RMSNorm --------------------------------------------------------------------

TEST(NnNorms, GroupNormMatchesTorchWithGradients) {
  for (const std::string d : {"f32", "f64"}) {
    const std::string p = "gn/" + d + "/";
    const Tensor x = R(p + "x"), r = R(p + "r");
    const double tol = tol_for(x.dtype()) * 10;
    nn::GroupNorm layer(3, 6, 1e-5, true, x.dtype());
    layer.weight = R(p + "w");
    layer.bias = R(p + "b");
    expect_allclose(layer(x), R(p + "y"), {.rtol = tol / 2, .atol = tol / 2}, p + "layer");
    expect_allclose(nn::group_norm(x, 3, R(p + "w"), R(p + "b")), R(p + "y"),
                    {.rtol = tol / 2, .atol = tol / 2}, p + "functional");
    expect_allclose(nn::GroupNorm(3, 6, 1e-5, false, x.dtype())(x), R(p + "plain"),
                    {.rtol = tol / 2, .atol = tol / 2}, p + "plain");
    expect_allclose(nn::GroupNorm(2, 4, 0.1, true, x.dtype())(R(p + "x2")), R(p + "y2"),
                    {.rtol = tol / 2, .atol = tol / 2}, p + "[N, C]");
    // Gradients with respect to the input and to the layer (a GroupNorm-shaped tree).
    const Tensor gx = grad([&](const Tensor& a) { return sum(layer(a) * r); })(x);
    expect_allclose(gx, R(p + "gx"), {.rtol = tol / 2, .atol = tol / 2}, p + "d/dx");
    const nn::GroupNorm gl = grad([&](const nn::GroupNorm& m) { return sum(m(x) * r); })(layer);
    expect_allclose(*gl.weight, R(p + "gw"), {.rtol = tol / 2, .atol = tol / 2}, p + "d/dweight");
    expect_allclose(*gl.bias, R(p + "gb"), {.rtol = tol / 2, .atol = tol / 2}, p + "d/dbias");
    EXPECT_EQ(gl.num_groups, 3);
  }
}

TEST(NnNorms, RMSNormMatchesItsDefinition) {
  const Tensor x = R("rms/x"), w = R("rms/w");
  nn::RMSNorm layer(5, 1e-6, true, float64);
  layer.weight = w;
  expect_allclose(layer(x), R("rms/y"), {.rtol = 5e-15, .atol = 5e-15}, "layer");
  expect_allclose(nn::rms_norm(x, w), R("rms/y"), {.rtol = 5e-15, .atol = 5e-15}, "functional");
  expect_allclose(nn::rms_norm(astype(x, float32), astype(w, float32)), R("rms/y"),
                  {.rtol = 1e-6, .atol = 1e-6}, "f32");
  // Without affine: the normalised input and no parameters.
  const nn::RMSNorm plain(5, 1e-6, false, float64);
  EXPECT_EQ(nn::parameter_count(plain), 0);
  expect_allclose(plain(x) * w, R("rms/y"), {.rtol = 5e-15, .atol = 5e-15}, "no affine");
  EXPECT_EQ(nn::parameter_count(nn::GroupNorm(2, 4, 1e-5, false)), 0);
  const auto names = nn::named_parameters(nn::GroupNorm(2, 4));
  ASSERT_EQ(names.size(), 2u);
  EXPECT_EQ(names[0].first, "weight");
  EXPECT_EQ(names[1].first, "bias");
}

TEST(NnNorms, GradientsMatchFiniteDifferences) {
  const Tensor x = sample(Shape{2, 4, 3}, 1), r = sample(Shape{2, 4, 3}, 2);
  const Tensor w = sample(Shape{4}, 3), b = sample(Shape{4}, 4), w3 = sample(Shape{3}, 5);
  const std::vector<Fn> fs{
      [&](const Tensor& a) { return sum(nn::group_norm(a, 2, w, b) * r); },
      [&](const Tensor& a) { return sum(nn::group_norm(x, 2, a, b) * r); },
      [&](const Tensor& a) { return sum(nn::group_norm(a, 4, std::nullopt, std::nullopt) * r); },
      [&](const Tensor& a) { return sum(nn::rms_norm(a, w3) * r); },
      [&](const Tensor& a) { return sum(nn::rms_norm(x, a) * r); },
  };
  expect_grads_match_fd(fs, {x, w, x, x, w3});
}

TEST(NnNorms, EdgeValuesAndErrors) {
  // Empty batches keep their shape; a constant group normalises to 0 (eps keeps it finite).
  EXPECT_EQ(nn::GroupNorm(2, 4)(zeros({0, 4, 3})).shape(), Shape({0, 4, 3}));
  EXPECT_EQ(nn::RMSNorm(3)(zeros({0, 3})).shape(), Shape({0, 3}));
  for (float v : nn::GroupNorm(2, 4)(full({1, 4, 2}, 7.0)).to_vector<float>()) EXPECT_EQ(v, 0.0f);
  for (float v : nn::RMSNorm(3)(zeros({2, 3})).to_vector<float>()) EXPECT_EQ(v, 0.0f);
  expect_error([] { (void)nn::GroupNorm(4, 6); }, "nn.GroupNorm",
               {"channels not divisible into groups", "num_groups=4", "channels=6"});
  expect_error(
      [] {
        (void)nn::GroupNorm(2, 4)(zeros({2, 6, 3}));
      },
      "nn.GroupNorm", {"channels do not match", "f32[2,6,3]", "expected [N, 4, ...]"});
  expect_error([] { (void)nn::GroupNorm(2, 4)(zeros({4})); }, "nn.GroupNorm",
               {"too few dimensions", "[N, C, ...]"});
  expect_error(
      [] {
        (void)nn::group_norm(zeros({2, 6}), 4, std::nullopt, std::nullopt);
      },
      "nn.group_norm", {"channels not divisible into groups"});
  expect_error(
      [] {
        (void)nn::group_norm(zeros({2, 6}), 3, ones({5}), std::nullopt);
      },
      "nn.group_norm", {"weight does not match the channels", "expected [6]"});
  expect_error(
      [] {
        (void)nn::group_norm(zeros({2, 6}, int32), 3, std::nullopt, std::nullopt);
      },
      "nn.group_norm", {"must be floating point"});
  expect_error(
      [] {
        (void)nn::RMSNorm(4)(zeros({2, 3}));
      },
      "nn.RMSNorm", {"last dimension does not match", "expected [..., 4]"});
  expect_error([] { (void)nn::RMSNorm(0); }, "nn.RMSNorm", {"non-positive size"});
  expect_error(
      [] {
        (void)nn::rms_norm(zeros({2, 3}), ones({2}));
      },
      "nn.rms_norm", {"weight does not match", "expected [3]"});
  expect_error([] { (void)nn::rms_norm(full(Shape{}, 1.0), std::nullopt); }, "nn.rms_norm",
               {"too few dimensions"});
}

// ---- losses -----------------------------------------------------------------------------------

struct NamedReduction {
  std::string name;
  nn::Reduction reduction;
};
const std::vector<NamedReduction> kReductions{
    {"none", nn::Reduction::none}, {"sum", nn::Reduction::sum}, {"mean", nn::Reduction::mean}};

// The gradients of sum(loss) with respect to both arguments.
auto grads2(const std::function<Tensor(const Tensor&, const Tensor&)>& f, const Tensor& a,
            const Tensor& b) {
  return grad([&](const Tensor& x, const Tensor& y) { return sum(f(x, y)); }, argnums<0, 1>)(a, b);
}

TEST(NnLosses, HuberMatchesTorch) {
  const Tensor p = R("huber/p"), t = R("huber/t");
  for (const auto& [delta, tag] : {std::pair{1.0, "d1"}, std::pair{0.5, "d05"}}) {
    for (const auto& [name, red] : kReductions) {
      const std::string key = std::string("huber/") + tag + "/" + name;
      auto f = [&, delta = delta, red = red](const Tensor& a, const Tensor& b) {
        return nn::huber_loss(a, b, delta, red);
      };
      expect_allclose(f(p, t), R(key), {.rtol = 5e-16, .atol = 5e-16}, key);
      const auto [gp, gt] = grads2(f, p, t);
      expect_allclose(gp, R(key + "/gp"), {.rtol = 5e-16, .atol = 5e-16}, key + " d/dp");
      expect_allclose(gt, R(key + "/gt"), {.rtol = 5e-16, .atol = 5e-16}, key + " d/dt");
    }
  }
  // float32, and the default delta and reduction.
  expect_allclose(nn::huber_loss(astype(p, float32), astype(t, float32)), R("huber/d1/mean"),
                  {.rtol = 5e-7, .atol = 5e-7}, "f32");
}

TEST(NnLosses, KlDivMatchesTorch) {
  const Tensor in = R("kl/input"), t = R("kl/target"), lt = R("kl/log_target");
  const std::vector<NamedReduction> reductions{{"none", nn::Reduction::none},
                                               {"sum", nn::Reduction::sum},
                                               {"mean", nn::Reduction::mean},
                                               {"batchmean", nn::Reduction::batchmean}};
  for (const auto& [name, red] : reductions) {
    for (const bool log_target : {false, true}) {
      const std::string key = std::string("kl/") + (log_target ? "log/" : "") + name;
      auto f = [red = red, log_target](const Tensor& a, const Tensor& b) {
        return nn::kl_div(a, b, red, log_target);
      };
      const Tensor target = log_target ? lt : t;
      expect_allclose(f(in, target), R(key), {.rtol = 5e-15, .atol = 5e-15}, key);
      const auto [gi, gt] = grads2(f, in, target);
      expect_allclose(gi, R(key + "/gi"), {.rtol = 5e-15, .atol = 5e-15}, key + " d/dinput");
      // d/dtarget at target = 0: PyTorch's is NaN (log 0 - input + 1 with 0 * inf); kiln's
      // xlogy term contributes 0 there, leaving -input.
      std::vector<double> want = R(key + "/gt").to_vector<double>();
      std::vector<double> got = gt.to_vector<double>();
      if (!log_target) {
        const std::size_t zero = 1 * 5 + 2;
        EXPECT_TRUE(std::isnan(want[zero])) << key;
        EXPECT_TRUE(std::isfinite(got[zero])) << key;
        want[zero] = got[zero] = 0.0;
      }
      expect_allclose(tensor(got), tensor(want), {.rtol = 5e-15, .atol = 5e-15},
                      key + " d/dtarget");
    }
  }
  // xlogy's edges as PyTorch: 0 log 0 = 0, 0 * -inf = NaN, a negative target NaN.
  const double inf = std::numeric_limits<double>::infinity();
  expect_allclose(nn::kl_div(tensor(std::vector<double>{-1.0, -inf, -2.0, 0.5}),
                             tensor(std::vector<double>{0.0, 0.0, -0.5, 0.3}), nn::Reduction::none),
                  R("kl/edge"), {.rtol = 5e-16, .atol = 5e-16, .equal_nan = true}, "edges");
  // batchmean of a 0-d input is the plain sum, as PyTorch.
  EXPECT_NEAR(nn::kl_div(full(Shape{}, -1.0, float64), full(Shape{}, 0.5, float64),
                         nn::Reduction::batchmean)
                  .item<double>(),
              0.5 * (std::log(0.5) + 1.0), 1e-16);
}

TEST(NnLosses, NllAndLabelSmoothedCrossEntropyMatchTorch) {
  const Tensor lp = R("nll/logp"), labels = R("nll/labels"), logits = R("nll/logits");
  for (const auto& [name, red] : kReductions) {
    auto f = [&, red = red](const Tensor& a) { return nn::nll_loss(a, labels, -100, red); };
    expect_allclose(f(lp), R("nll/" + name), {.rtol = 5e-16, .atol = 5e-16}, "nll " + name);
    expect_allclose(grad([&](const Tensor& a) { return sum(f(a)); })(lp),
                    R("nll/" + name + "/grad"), {.rtol = 5e-16, .atol = 5e-16}, "nll grad " + name);
  }
  expect_allclose(nn::nll_loss(lp, R("nll/labels_wrapped"), 2), R("nll/ignore2"),
                  {.rtol = 5e-16, .atol = 5e-16}, "ignore_index 2");
  expect_allclose(nn::nll_loss(astype(lp, float32), astype(labels, int32)), R("nll/mean"),
                  {.rtol = 5e-7, .atol = 5e-7}, "f32, int32 labels");
  for (const double e : {0.0, 0.1, 0.3, 1.0}) {
    const std::string key = "ce/" + std::to_string(e).substr(0, 3);
    auto f = [&](const Tensor& a) { return nn::cross_entropy(a, labels, e); };
    expect_allclose(f(logits), R(key), {.rtol = 5e-15, .atol = 5e-15}, key);
    expect_allclose(grad(f)(logits), R(key + "/grad"), {.rtol = 5e-15, .atol = 5e-15},
                    key + " grad");
  }
}

TEST(NnLosses, IgnoredPositionsAndAccuracy) {
  const Tensor lp = log_softmax(sample(Shape{3, 4}, 6), -1);
  const Tensor all_ignored = full(Shape{3}, -100.0, int64);
  EXPECT_TRUE(std::isnan(nn::nll_loss(lp, all_ignored).item<double>()));  // 0 / 0, as PyTorch
  EXPECT_EQ(nn::nll_loss(lp, all_ignored, -100, nn::Reduction::sum).item<double>(), 0.0);
  const std::vector<double> none =
      nn::nll_loss(lp, tensor(std::vector<int64_t>{1, -100, 3}), -100, nn::Reduction::none)
          .to_vector<double>();
  EXPECT_EQ(none[1], 0.0);
  EXPECT_EQ(none[0], -lp.to_vector<double>()[1]);
  // accuracy counts only the positions that are not ignored: 1 hit of 2.
  const Tensor logits = tensor(std::vector<double>{0, 5, 0, 5, 0, 0, 0, 0, 5}, Shape{3, 3});
  const Tensor labels = tensor(std::vector<int64_t>{1, -100, 0});
  EXPECT_EQ(nn::accuracy(logits, labels).item<float>(), 0.5f);
  EXPECT_NEAR(nn::accuracy(logits, labels, std::nullopt).item<float>(), 1.0f / 3, 1e-7);
  EXPECT_EQ(nn::accuracy(logits, tensor(std::vector<int64_t>{1, 0, 0}), 0).item<float>(), 1.0f);
}

TEST(NnLosses, GradientsMatchFiniteDifferences) {
  const Tensor p = sample(Shape{7}, 7), t = sample(Shape{7}, 8);
  const Tensor lp = log_softmax(sample(Shape{2, 4}, 9), -1);
  const Tensor q = softmax(sample(Shape{2, 4}, 10), -1);
  const std::vector<Fn> fs{
      [&](const Tensor& a) { return nn::huber_loss(a, t, 0.7); },
      [&](const Tensor& a) { return nn::huber_loss(p, a, 0.7, nn::Reduction::sum); },
      [&](const Tensor& a) { return nn::kl_div(a, q, nn::Reduction::batchmean); },
      [&](const Tensor& a) { return nn::kl_div(lp, a, nn::Reduction::batchmean); },
      [&](const Tensor& a) { return nn::kl_div(lp, a, nn::Reduction::sum, true); },
      [&](const Tensor& a) { return sum(nn::elu(a, 0.7) + nn::leaky_relu(a, 0.1)); },
      [&](const Tensor& a) { return sum(nn::softplus(a, 3.0, 2.0)); },
  };
  expect_grads_match_fd(fs, {p, t, lp, q, lp, p, p});
}

TEST(NnLosses, Errors) {
  expect_error([] { (void)nn::huber_loss(ones({3}), ones({2})); }, "nn.huber_loss",
               {"differ in shape", "f32[3]", "f32[2]"});
  expect_error([] { (void)nn::huber_loss(ones({3}), ones({3}), 0.0); }, "nn.huber_loss",
               {"delta out of range", "got 0"});
  expect_error([] { (void)nn::huber_loss(ones({3}), ones({3}), 1.0, nn::Reduction::batchmean); },
               "nn.huber_loss", {"unsupported reduction", "got batchmean"});
  expect_error([] { (void)nn::kl_div(ones({3}), ones({3, 1})); }, "nn.kl_div", {"differ in shape"});
  expect_error([] { (void)nn::kl_div(ones({3}), ones({3}, int32)); }, "nn.kl_div",
               {"target must be floating point"});
  const Tensor lp = log_softmax(zeros({2, 3}), -1);
  expect_error(
      [&] {
        (void)nn::nll_loss(lp, tensor(std::vector<int64_t>{0, 3}));
      },
      "nn.nll_loss", {"label out of range", "got 3", "expected labels in [0, 3)"});
  expect_error([&] { (void)nn::nll_loss(lp, ones({2})); }, "nn.nll_loss",
               {"labels must be integers"});
  expect_error(
      [&] {
        (void)nn::nll_loss(lp, tensor(std::vector<int64_t>{0, 1, 2}));
      },
      "nn.nll_loss", {"labels do not match the log-probabilities"});
  expect_error(
      [&] {
        (void)nn::nll_loss(lp, tensor(std::vector<int64_t>{0, 1}), -100, nn::Reduction::batchmean);
      },
      "nn.nll_loss", {"unsupported reduction"});
  // Traced labels are checked when the function runs, naming nll_loss.
  auto traced = jit([](const Tensor& a, const Tensor& l) { return nn::nll_loss(a, l); });
  expect_error(
      [&] {
        (void)traced(lp, tensor(std::vector<int64_t>{-1, 0}));
      },
      "nn.nll_loss", {"label out of range", "got -1"});
}

TEST(NnFunctionsDtypes, HalfPrecisionKeepsItsDtype) {
  const Tensor x = sample(Shape{2, 4, 3}, 16), t = sample(Shape{2, 4, 3}, 17);
  const std::vector<Fn> fs{
      [](const Tensor& a) { return nn::elu(a, 0.5); },
      [](const Tensor& a) { return nn::leaky_relu(a, 0.2); },
      [](const Tensor& a) { return nn::softplus(a, 2.0); },
      [](const Tensor& a) { return nn::group_norm(a, 2, std::nullopt, std::nullopt); },
      [](const Tensor& a) { return nn::rms_norm(a, std::nullopt); },
      [&](const Tensor& a) { return nn::huber_loss(a, astype(t, a.dtype())); },
  };
  for (const DType d : {float16, bfloat16})
    for (std::size_t k = 0; k < fs.size(); ++k) {
      const Tensor y = fs[k](astype(x, d));
      EXPECT_EQ(y.dtype(), d) << k;
      expect_allclose(
          y, fs[k](x),
          {.rtol = (d == float16 ? 4e-3 : 3e-2) / 2, .atol = (d == float16 ? 4e-3 : 3e-2) / 2},
          "f" + std::to_string(k));
    }
}

// ---- transforms -------------------------------------------------------------------------------

TEST(NnFunctionsTransforms, JitMatchesEager) {
  const Tensor x = sample(Shape{2, 4, 3}, 11), t = sample(Shape{2, 4, 3}, 12);
  const Tensor labels = tensor(std::vector<int64_t>{0, -100, 3, 1, 2, 0}, Shape{2, 3});
  auto f = [&](const Tensor& a) {
    const Tensor act = nn::elu(a, 0.5) + nn::leaky_relu(a, 0.2) + nn::softplus(a, 2.0, 3.0) +
                       nn::gelu(a, true) + nn::silu(a);
    const Tensor lp = log_softmax(moveaxis(a, 1, 2), -1);
    return sum(nn::group_norm(act, 2, std::nullopt, std::nullopt)) +
           sum(nn::rms_norm(act, std::nullopt) * t) + nn::huber_loss(a, t, 0.5) +
           nn::kl_div(lp, softmax(moveaxis(t, 1, 2), -1), nn::Reduction::batchmean) +
           nn::nll_loss(lp, labels) + nn::cross_entropy(moveaxis(a, 1, 2), labels, 0.2);
  };
  expect_allclose(jit(f)(x), f(x), {.rtol = 5e-13, .atol = 5e-13}, "value");
  expect_allclose(jit(grad(f))(x), grad(f)(x), {.rtol = 5e-13, .atol = 5e-13}, "gradient");
  // f32 through the compiler's fusible elementwise code.
  const Tensor xf = astype(x, float32);
  auto acts = [](const Tensor& a) {
    return nn::elu(a) + nn::leaky_relu(a) + nn::softplus(a, 2.0) + nn::rms_norm(a, std::nullopt);
  };
  expect_allclose(jit(acts)(xf), acts(xf), {.rtol = 5e-6, .atol = 5e-6}, "f32 activations");
}

TEST(NnFunctionsTransforms, VmapMatchesALoop) {
  const Tensor xs = sample(Shape{3, 2, 4, 2}, 13), ts = sample(Shape{3, 2, 4, 2}, 14);
  const nn::GroupNorm gn(2, 4, 1e-5, true, float64);
  auto f = [&](const Tensor& a, const Tensor& b) {
    return gn(nn::elu(a, 0.5)) + nn::rms_norm(nn::softplus(a, 2.0), std::nullopt) +
           nn::huber_loss(a, b, 0.5, nn::Reduction::none) +
           nn::kl_div(a, softmax(b, -1), nn::Reduction::none);
  };
  const Tensor batched = vmap(f)(xs, ts);
  for (int64_t i = 0; i < 3; ++i)
    expect_allclose(index(batched, i), f(index(xs, i), index(ts, i)),
                    {.rtol = 5e-13, .atol = 5e-13}, "example");
  // Per-example losses with a reduction: one scalar each.
  auto loss = [](const Tensor& a, const Tensor& b) {
    return nn::huber_loss(a, b) + nn::kl_div(a, softmax(b, -1), nn::Reduction::batchmean);
  };
  const Tensor per = vmap(loss)(xs, ts);
  ASSERT_EQ(per.shape(), Shape({3}));
  for (int64_t i = 0; i < 3; ++i)
    expect_allclose(index(per, i), loss(index(xs, i), index(ts, i)), {.rtol = 5e-13, .atol = 5e-13},
                    "loss example");
  // nll_loss with per-example labels (some ignored) under vmap.
  const Tensor lps = log_softmax(sample(Shape{3, 4, 5}, 15), -1);
  const Tensor ls =
      tensor(std::vector<int64_t>{0, 4, -100, 2, 1, 1, 3, -100, 4, 0, 2, 3}, Shape{3, 4});
  const Tensor nll =
      vmap([](const Tensor& a, const Tensor& l) { return nn::nll_loss(a, l); })(lps, ls);
  for (int64_t i = 0; i < 3; ++i)
    expect_allclose(index(nll, i), nn::nll_loss(index(lps, i), index(ls, i)),
                    {.rtol = 5e-16, .atol = 5e-16}, "nll example");
}

}  // namespace
