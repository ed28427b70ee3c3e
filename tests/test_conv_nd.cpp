// conv1d/conv3d, conv_transpose1d/2d/3d, adaptive_avg_pool2d and interpolate against PyTorch
// 1.13 (values and gradients, tests/reference/conv_nd_ref.py), float64 finite differences,
// jit vs eager, vmap vs a loop, and their errors.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "kiln/kiln.h"
#include "testing.h"

using namespace kiln;
using kiln::testing::at;
using kiln::testing::expect_error;

namespace {

using kiln::testing::expect_allclose;

const io::TensorFile& ref() {
  static const io::TensorFile file = kiln::testing::reference("conv_nd");
  return file;
}

using Binary = std::function<Tensor(const Tensor&, const Tensor&)>;

// The cases of conv_nd_ref.py's CONVS, with the same options.
struct ConvCase {
  std::string name;
  Binary f;
};
std::vector<ConvCase> conv_cases() {
  return {
      {"conv1d",
       [](const Tensor& x, const Tensor& w) {
         return conv1d(x, w, {.stride = 2, .padding = 1, .dilation = 2, .groups = 2});
       }},
      {"conv1d_plain", [](const Tensor& x, const Tensor& w) { return conv1d(x, w); }},
      {"conv3d",
       [](const Tensor& x, const Tensor& w) {
         return conv3d(
             x, w, {.stride = {1, 2, 1}, .padding = {1, 0, 1}, .dilation = {1, 1, 2}, .groups = 2});
       }},
      {"conv3d_plain", [](const Tensor& x, const Tensor& w) { return conv3d(x, w); }},
      {"conv3d_depthwise",
       [](const Tensor& x, const Tensor& w) {
         return conv3d(x, w, {.padding = {1, 1, 1}, .groups = 3});
       }},
      {"conv_transpose1d",
       [](const Tensor& x, const Tensor& w) {
         return conv_transpose1d(x, w,
                                 {.stride = 2, .padding = 1, .output_padding = 1, .groups = 2});
       }},
      {"conv_transpose2d",
       [](const Tensor& x, const Tensor& w) {
         return conv_transpose2d(x, w,
                                 {.stride = {2, 1},
                                  .padding = {1, 0},
                                  .output_padding = {1, 0},
                                  .dilation = {1, 2},
                                  .groups = 2});
       }},
      {"conv_transpose2d_wide",
       [](const Tensor& x, const Tensor& w) {
         return conv_transpose2d(
             x, w,
             {.stride = {1, 2}, .padding = {0, 1}, .output_padding = {1, 1}, .dilation = {2, 1}});
       }},
      {"conv_transpose3d",
       [](const Tensor& x, const Tensor& w) {
         return conv_transpose3d(
             x, w,
             {.stride = {2, 2, 2}, .padding = {0, 1, 0}, .output_padding = {1, 0, 1}, .groups = 2});
       }},
  };
}

Tensor case_at(const std::string& name, const std::string& what) {
  return at(ref(), name + "/" + what);
}

}  // namespace

TEST(ConvNd, ValuesAndGradientsMatchPyTorch) {
  for (const ConvCase& c : conv_cases()) {
    SCOPED_TRACE(c.name);
    const Tensor x = case_at(c.name, "in0"), w = case_at(c.name, "in1"), r = case_at(c.name, "r");
    expect_allclose(c.f(x, w), case_at(c.name, "y"), {.rtol = 1e-12, .atol = 1e-12}, "f64 value");
    // f32 runs through oneDNN (or im2col where it declines).
    expect_allclose(c.f(astype(x, float32), astype(w, float32)), case_at(c.name, "y"),
                    {.rtol = 1e-5, .atol = 1e-5}, "f32 value");
    const auto [gx, gw] = grad([&](const Tensor& a, const Tensor& b) { return sum(c.f(a, b) * r); },
                               argnums<0, 1>)(x, w);
    expect_allclose(gx, case_at(c.name, "grad0"), {.rtol = 1e-12, .atol = 1e-12}, "input gradient");
    expect_allclose(gw, case_at(c.name, "grad1"), {.rtol = 1e-12, .atol = 1e-12},
                    "weight gradient");
    const auto [gx32, gw32] =
        grad([&](const Tensor& a, const Tensor& b) { return sum(c.f(a, b) * astype(r, float32)); },
             argnums<0, 1>)(astype(x, float32), astype(w, float32));
    expect_allclose(gx32, case_at(c.name, "grad0"), {.rtol = 1e-5, .atol = 1e-5},
                    "f32 input gradient");
    expect_allclose(gw32, case_at(c.name, "grad1"), {.rtol = 1e-5, .atol = 1e-5},
                    "f32 weight gradient");
  }
}

namespace {

// Central differences in float64 of sum(f(x) * r) with respect to x.
std::vector<double> numeric_grad(const std::function<Tensor(const Tensor&)>& f, const Tensor& x,
                                 const Tensor& r) {
  std::vector<double> v = x.to_vector<double>(), g(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    std::vector<double> p = v, m = v;
    p[i] += 1e-6;
    m[i] -= 1e-6;
    g[i] = (sum(f(tensor(p, x.shape())) * r).item<double>() -
            sum(f(tensor(m, x.shape())) * r).item<double>()) /
           2e-6;
  }
  return g;
}
void expect_grad_matches_differences(const std::function<Tensor(const Tensor&)>& f, const Tensor& x,
                                     const std::string& what) {
  const Tensor r = random::normal(random::key(3), f(x).shape(), float64);
  const std::vector<double> g =
      grad([&](const Tensor& a) { return sum(f(a) * r); })(x).to_vector<double>();
  const std::vector<double> n = numeric_grad(f, x, r);
  for (std::size_t i = 0; i < g.size(); ++i)
    ASSERT_NEAR(g[i], n[i], 1e-6 * (1 + std::abs(n[i]))) << what << " at " << i;
}

}  // namespace

TEST(ConvNd, GradientsMatchFiniteDifferences) {
  for (const char* name : {"conv1d", "conv3d_plain", "conv_transpose2d_wide", "conv_transpose3d"}) {
    for (const ConvCase& c : conv_cases()) {
      if (c.name != name) continue;
      const Tensor x = case_at(c.name, "in0"), w = case_at(c.name, "in1");
      expect_grad_matches_differences([&](const Tensor& a) { return c.f(a, w); }, x,
                                      c.name + " input");
      expect_grad_matches_differences([&](const Tensor& b) { return c.f(x, b); }, w,
                                      c.name + " weight");
    }
  }
  // Second order: the transposed convolution's derivative is conv's, differentiated again.
  const Tensor x = case_at("conv_transpose1d", "in0"), w = case_at("conv_transpose1d", "in1");
  const auto f = conv_cases()[5].f;
  expect_grad_matches_differences(
      [&](const Tensor& b) {
        return grad([&](const Tensor& a) { return sum(f(a, b) * f(a, b)); })(x);
      },
      w, "second order");
}

TEST(ConvNd, JitMatchesEager) {
  const std::vector<ConvCase> cases = conv_cases();
  for (const ConvCase& c : cases) {
    SCOPED_TRACE(c.name);
    const Tensor x = case_at(c.name, "in0"), w = case_at(c.name, "in1");
    expect_allclose(jit(c.f)(x, w), c.f(x, w), {.rtol = 1e-12, .atol = 1e-12}, "jit");
    const auto g = [&](const Tensor& a, const Tensor& b) {
      return grad([&](const Tensor& u) { return sum(sin(c.f(u, b))); })(a);
    };
    expect_allclose(jit(g)(x, w), g(x, w), {.rtol = 1e-12, .atol = 1e-12}, "jit of grad");
  }
  const Tensor img = case_at("adaptive/3x4", "in0");
  const auto resample = [](const Tensor& a) {
    return sum(adaptive_avg_pool2d(a, {3, 4})) +
           sum(interpolate(a, {.size = std::pair<int64_t, int64_t>{9, 4},
                               .mode = InterpolateMode::bilinear}) *
               2.0) +
           sum(interpolate(a, {.scale_factor = std::pair{1.5, 0.5}}));
  };
  expect_allclose(jit(resample)(img), resample(img), {.rtol = 1e-12, .atol = 1e-12}, "resampling");
  expect_allclose(jit(grad(resample))(img), grad(resample)(img), {.rtol = 1e-12, .atol = 1e-12},
                  "resampling gradient");
}

TEST(ConvNd, VmapMatchesLoop) {
  for (const ConvCase& c : conv_cases()) {
    SCOPED_TRACE(c.name);
    const Tensor x = case_at(c.name, "in0"), w = case_at(c.name, "in1");
    const Tensor ws = stack({w, w * 0.5, -w});
    // Shared weight: the batch folds into N; per-example weights: a loop.
    const Tensor xs = stack({x, x * 2.0, x + 1.0});
    const Tensor shared = vmap([&](const Tensor& a) { return c.f(a, w); })(xs);
    const Tensor both = vmap(c.f)(xs, ws);
    for (int64_t i = 0; i < 3; ++i) {
      expect_allclose(index(shared, i), c.f(index(xs, i), w), {.rtol = 1e-12, .atol = 1e-12},
                      "shared weight");
      expect_allclose(index(both, i), c.f(index(xs, i), index(ws, i)),
                      {.rtol = 1e-12, .atol = 1e-12}, "batched weight");
    }
  }
  const Tensor img = case_at("adaptive/3x4", "in0");
  const Tensor imgs = stack({img, img * 3.0});
  const auto f = [](const Tensor& a) {
    return adaptive_avg_pool2d(a, {5, 3}) +
           interpolate(a, {.size = std::pair<int64_t, int64_t>{5, 3},
                           .mode = InterpolateMode::bilinear,
                           .align_corners = true}) +
           interpolate(a, {.size = std::pair<int64_t, int64_t>{5, 3}});
  };
  const Tensor batched = vmap(f)(imgs);
  for (int64_t i = 0; i < 2; ++i)
    expect_allclose(index(batched, i), f(index(imgs, i)), {.rtol = 1e-12, .atol = 1e-12}, "vmap");
}

TEST(Resample, ValuesAndGradientsMatchPyTorch) {
  for (const auto& [oh, ow] :
       std::vector<std::pair<int64_t, int64_t>>{{3, 4}, {7, 10}, {1, 1}, {5, 3}, {9, 13}}) {
    const std::string name = "adaptive/" + std::to_string(oh) + "x" + std::to_string(ow);
    SCOPED_TRACE(name);
    const Tensor x = case_at(name, "in0"), r = case_at(name, "r");
    const auto f = [oh = oh, ow = ow](const Tensor& a) { return adaptive_avg_pool2d(a, {oh, ow}); };
    expect_allclose(f(x), case_at(name, "y"), {.rtol = 1e-12, .atol = 1e-12}, "value");
    expect_allclose(f(astype(x, float32)), case_at(name, "y"), {.rtol = 1e-6, .atol = 1e-6},
                    "f32 value");
    expect_allclose(grad([&](const Tensor& a) { return sum(f(a) * r); })(x), case_at(name, "grad0"),
                    {.rtol = 1e-12, .atol = 1e-12}, "gradient");
  }
  using P = std::pair<int64_t, int64_t>;
  using S = std::pair<double, double>;
  const InterpolateMode nearest = InterpolateMode::nearest, bilinear = InterpolateMode::bilinear;
  const std::vector<std::pair<std::string, InterpolateOptions>> cases{
      {"nearest_size", {.size = P{7, 3}}},
      {"nearest_double", {.size = P{8, 10}}},
      {"nearest_scale", {.scale_factor = S{1.7, 0.6}, .mode = nearest}},
      {"nearest_scale_same_size", {.scale_factor = S{1.2, 1.1}}},
      {"bilinear_size", {.size = P{7, 9}, .mode = bilinear}},
      {"bilinear_size_corners", {.size = P{7, 9}, .mode = bilinear, .align_corners = true}},
      {"bilinear_down", {.size = P{3, 2}, .mode = bilinear}},
      {"bilinear_scale", {.scale_factor = S{1.5, 0.6}, .mode = bilinear}},
      {"bilinear_scale_corners",
       {.scale_factor = S{2.0, 2.0}, .mode = bilinear, .align_corners = true}},
      {"bilinear_one_corners", {.size = P{1, 1}, .mode = bilinear, .align_corners = true}},
  };
  for (const auto& [name, o] : cases) {
    for (const char* dt : {"f64", "f32"}) {
      const std::string key = "resize/" + name + "/" + dt;
      SCOPED_TRACE(key);
      const Tensor x = case_at(key, "in0"), r = case_at(key, "r");
      const double tol = x.dtype() == float64 ? 1e-12 : 1e-6;
      const auto f = [&o = o](const Tensor& a) { return interpolate(a, o); };
      expect_allclose(f(x), case_at(key, "y"), {.rtol = tol, .atol = tol}, "value");
      // PyTorch's backward of this one takes the identity its forward does not (out == in with
      // a scale factor): its gradient is not its forward's; ours (checked by finite
      // differences below) is.
      if (name == "nearest_scale_same_size") continue;
      expect_allclose(grad([&](const Tensor& a) { return sum(f(a) * r); })(x),
                      case_at(key, "grad0"), {.rtol = tol, .atol = tol}, "gradient");
    }
  }
  // Nearest keeps integer dtypes; bilinear and the adaptive average compute in floating point.
  const Tensor x = case_at("resize/nearest_scale/f64", "in0");
  const Tensor xi = astype(x * 10.0, int32);
  const Tensor yi = interpolate(xi, {.scale_factor = S{1.7, 0.6}});
  EXPECT_EQ(yi.dtype(), int32);
  expect_allclose(yi,
                  astype(interpolate(astype(xi, float64), {.scale_factor = S{1.7, 0.6}}), int32),
                  {.rtol = 0, .atol = 0}, "int32 nearest");
  EXPECT_EQ(adaptive_avg_pool2d(xi, {2, 3}).dtype(), float32);
  EXPECT_EQ(interpolate(xi, {.size = P{2, 3}, .mode = bilinear}).dtype(), float32);
}

TEST(Resample, GradientsMatchFiniteDifferences) {
  const Tensor x = case_at("adaptive/3x4", "in0");
  expect_grad_matches_differences(
      [](const Tensor& a) {
        return adaptive_avg_pool2d(a, {5, 3});
      },
      x, "adaptive");
  expect_grad_matches_differences(
      [](const Tensor& a) {
        return interpolate(a, {.scale_factor = std::pair{1.2, 1.1}});
      },
      x, "nearest");
  expect_grad_matches_differences(
      [](const Tensor& a) {
        return interpolate(
            a, {.scale_factor = std::pair{1.5, 0.6}, .mode = InterpolateMode::bilinear});
      },
      x, "bilinear");
}

TEST(Resample, OneAndThreeDimensionalInterpolateGradientsMatchFiniteDifferences) {
  const Tensor x1 = random::normal(random::key(4), {2, 3, 7}, float64);
  const Tensor x3 = random::normal(random::key(5), {1, 2, 3, 4, 5}, float64);
  expect_grad_matches_differences(
      [](const Tensor& a) {
        return interpolate(a, {.scale_factor = 1.7, .mode = InterpolateMode::linear});
      },
      x1, "linear");
  expect_grad_matches_differences(
      [](const Tensor& a) {
        return interpolate(a, {.size = std::array<int64_t, 3>{4, 3, 7},
                               .mode = InterpolateMode::trilinear,
                               .align_corners = true});
      },
      x3, "trilinear");
  expect_grad_matches_differences(
      [](const Tensor& a) {
        return interpolate(a, {.scale_factor = std::array{1.5, 0.6, 1.3}});
      },
      x3, "nearest 3-d");
}

// grid_sample's gradients w.r.t. the input and the grid (VJP) and its JVP w.r.t. the grid,
// against float64 central differences, for every mode, padding mode and align_corners.
TEST(Resample, GridSampleDerivativesMatchFiniteDifferences) {
  const Tensor x4 = random::normal(random::key(6), {2, 3, 5, 7}, float64);
  const Tensor x5 = random::normal(random::key(7), {1, 2, 3, 4, 5}, float64);
  // Grids reaching past [-1, 1], so that every padding mode matters.
  const Tensor g4 = random::uniform(random::key(8), {2, 4, 3, 2}, float64, -1.6, 1.6);
  const Tensor g5 = random::uniform(random::key(9), {1, 2, 3, 2, 3}, float64, -1.6, 1.6);
  for (const GridSampleMode mode :
       {GridSampleMode::bilinear, GridSampleMode::nearest, GridSampleMode::bicubic}) {
    for (const GridSamplePadding padding :
         {GridSamplePadding::zeros, GridSamplePadding::border, GridSamplePadding::reflection}) {
      for (const bool corners : {false, true}) {
        const GridSampleOptions o{mode, padding, corners};
        const std::string what = std::to_string(static_cast<int>(mode)) + "/" +
                                 std::to_string(static_cast<int>(padding)) + "/" +
                                 std::to_string(corners);
        for (const auto& [x, g] : std::vector<std::pair<Tensor, Tensor>>{{x4, g4}, {x5, g5}}) {
          if (mode == GridSampleMode::bicubic && x.rank() == 5) continue;
          SCOPED_TRACE(what + " rank " + std::to_string(x.rank()));
          expect_grad_matches_differences([&](const Tensor& a) { return grid_sample(a, g, o); }, x,
                                          "input");
          const auto at_grid = [&](const Tensor& b) { return grid_sample(x, b, o); };
          expect_grad_matches_differences(at_grid, g, "grid");
          const Tensor r = random::normal(random::key(3), at_grid(g).shape(), float64);
          const Tensor dg = random::normal(random::key(10), g.shape(), float64);
          const double directional =
              sum(tensor(numeric_grad(at_grid, g, r), g.shape()) * dg).item<double>();
          const Tensor tangent = jvp(at_grid, std::tuple{g}, std::tuple{dg}).second;
          EXPECT_NEAR(sum(tangent * r).item<double>(), directional,
                      1e-6 * (1 + std::abs(directional)))
              << "jvp";
        }
      }
    }
  }
}

TEST(ConvNd, EmptyBatch) {
  EXPECT_EQ(conv3d(zeros({0, 2, 3, 3, 3}), ones({4, 2, 2, 2, 2})).shape(), (Shape{0, 4, 2, 2, 2}));
  EXPECT_EQ(conv1d(zeros({0, 2, 5}), ones({4, 2, 2})).shape(), (Shape{0, 4, 4}));
  EXPECT_EQ(conv_transpose2d(zeros({0, 2, 3, 3}), ones({2, 4, 2, 2}), {.stride = {2, 2}}).shape(),
            (Shape{0, 4, 6, 6}));
  EXPECT_EQ(interpolate(zeros({0, 2, 3, 3}), {.size = std::pair<int64_t, int64_t>{5, 1}}).shape(),
            (Shape{0, 2, 5, 1}));
}

TEST(ConvNd, Errors) {
  expect_error(
      [] {
        conv1d(ones({2, 4, 5, 5}), ones({2, 4, 3}));
      },
      "conv1d", {"input must have rank 3", "f32[2,4,5,5]", "[N, C, W]"});
  expect_error(
      [] {
        conv3d(ones({1, 4, 5, 5, 5}), ones({2, 4, 3, 3}));
      },
      "conv3d", {"weight must have rank 5", "[O, C/groups, KD, KH, KW]"});
  expect_error(
      [] {
        conv3d(ones({1, 4, 5, 5, 5}), ones({2, 4, 3, 3, 3}), {.groups = 3});
      },
      "conv3d", {"input channels not divisible by groups", "groups=3"});
  expect_error(
      [] {
        conv1d(ones({1, 4, 5}), ones({3, 2, 3}), {.groups = 2});
      },
      "conv1d", {"output channels not divisible by groups", "f32[3,2,3]"});
  expect_error(
      [] {
        conv3d(ones({1, 1, 5, 2, 5}), ones({1, 1, 3, 3, 3}));
      },
      "conv3d", {"kernel larger than the padded input", "3x3x3", "5x2x5"});
  expect_error(
      [] {
        conv1d(ones({1, 1, 5}), ones({1, 1, 3}), {.stride = 0});
      },
      "conv1d", {"non-positive stride", "[0]"});
  expect_error(
      [] {
        conv3d(ones({1, 1, 5, 5, 5}), ones({1, 1, 3, 3, 3}), {.padding = {0, -1, 0}});
      },
      "conv3d", {"negative padding", "[0, -1, 0]"});
  expect_error(
      [] {
        bind1(primitive("conv"), {ones({1, 1, 3, 3, 3, 3}), ones({1, 1, 1, 1, 1, 1})},
              {{"stride", std::vector<int64_t>{1, 1, 1, 1}},
               {"padding", std::vector<int64_t>{0, 0, 0, 0}},
               {"dilation", std::vector<int64_t>{1, 1, 1, 1}},
               {"groups", int64_t{1}}});
      },
      "conv", {"'stride' has the wrong length", "expected 1, 2 or 3 values"});
  // Transposed: the weight is [C, O/groups, *k]; the output size must be positive.
  expect_error(
      [] {
        conv_transpose2d(ones({1, 4, 3, 3}), ones({3, 2, 2, 2}));
      },
      "conv_transpose2d", {"weight does not match the input channels", "(3 vs 4)"});
  expect_error(
      [] {
        conv_transpose1d(ones({1, 4, 3}), ones({4, 2, 2}), {.groups = 3});
      },
      "conv_transpose1d", {"input channels not divisible by groups"});
  expect_error(
      [] {
        conv_transpose1d(ones({1, 4, 3}), ones({4, 2, 2}), {.groups = 0});
      },
      "conv_transpose1d", {"non-positive groups"});
  expect_error(
      [] {
        conv_transpose2d(ones({1, 2, 2, 2}), ones({2, 2, 2, 2}), {.padding = {2, 0}});
      },
      "conv_transpose2d", {"output size not positive", "-1"});
  expect_error(
      [] {
        conv_transpose3d(ones({1, 2, 2, 2, 2}), ones({2, 2, 2, 2, 2}),
                         {.stride = {2, 2, 2}, .output_padding = {0, 2, 0}});
      },
      "conv_transpose3d", {"output_padding not smaller than stride or dilation", "[0, 2, 0]"});
  expect_error(
      [] {
        conv_transpose1d(ones({1, 2, 3, 3}), ones({2, 2, 2}));
      },
      "conv_transpose1d", {"input must have rank 3"});
  expect_error(
      [] {
        conv_transpose3d(ones({1, 2, 3, 3, 3}), ones({2, 2, 2}));
      },
      "conv_transpose3d", {"weight must have rank 5", "[C, O/groups, KD, KH, KW]"});
}

TEST(Resample, Errors) {
  using P = std::pair<int64_t, int64_t>;
  expect_error(
      [] {
        adaptive_avg_pool2d(ones({2, 3, 4}), {2, 2});
      },
      "adaptive_avg_pool2d", {"input must have rank 4", "f32[2,3,4]"});
  expect_error(
      [] {
        adaptive_avg_pool2d(ones({1, 1, 4, 4}), {0, 2});
      },
      "adaptive_avg_pool2d", {"non-positive output size", "[0, 2]"});
  expect_error(
      [] {
        adaptive_avg_pool2d(ones({1, 1, 0, 4}), {1, 1});
      },
      "adaptive_avg_pool2d", {"empty image"});
  expect_error([] { interpolate(ones({1, 1, 4, 4}), {}); }, "interpolate", {"neither"});
  expect_error(
      [] {
        interpolate(ones({1, 1, 4, 4}), {.size = P{2, 2}, .scale_factor = std::pair{2.0, 2.0}});
      },
      "interpolate", {"both"});
  expect_error(
      [] {
        interpolate(ones({1, 1, 4, 4}), {.size = P{2, -1}});
      },
      "interpolate", {"non-positive output size", "[2, -1]"});
  expect_error(
      [] {
        interpolate(ones({1, 1, 4, 4}), {.scale_factor = std::pair{0.1, 1.0}});
      },
      "interpolate", {"bad scale_factor", "f32[1,1,4,4]"});
  expect_error(
      [] {
        interpolate(ones({1, 1, 4, 4}), {.scale_factor = std::pair{NAN, 1.0}});
      },
      "interpolate", {"bad scale_factor"});
  expect_error(
      [] {
        interpolate(ones({1, 1, 4, 4}), {.size = P{2, 2}, .align_corners = true});
      },
      "interpolate",
      {"align_corners with a mode other than linear, bilinear, bicubic or trilinear"});
}
