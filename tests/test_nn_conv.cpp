// The convolution layers nn::Conv1d/2d/3d and nn::ConvTranspose1d/2d/3d, and the bias,
// unbatched inputs and padding rules of the functional convolutions: values against the
// functional convolution without bias plus a hand-made broadcast bias (and hand-padded
// inputs), gradients against float64 finite differences, PyTorch's initialisation bounds, the
// tree, and the errors. PyTorch itself checks the same in python/tests/test_conv_layers.py.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kiln/kiln.h"
#include "testing.h"
#include "tree_testing.h"

using namespace kiln;
using kiln::testing::expect_allclose;
using kiln::testing::expect_error;
using kiln::testing::expect_tree_allclose;
using kiln::testing::finite_differences;

namespace {

Tensor normal(uint64_t seed, const Shape& shape) {
  return random::normal(random::key(seed), shape, float64);
}

// bias [O] broadcast over y [N, O, *spatial] by hand.
Tensor plus_bias(const Tensor& y, const Tensor& bias) {
  std::vector<int64_t> dims(static_cast<std::size_t>(y.rank()), 1);
  dims[1] = bias.shape()[0];
  return y + reshape(bias, Shape(dims));
}

// The layer's value against `reference` (the functional op without bias), batched and
// unbatched, and its gradients with respect to its parameters and input against finite
// differences.
template <class L, class F>
void check_layer(const L& layer, const Tensor& x, F reference) {
  const Tensor want = plus_bias(reference(x), *layer.bias);
  expect_allclose(layer(x), want, {.rtol = 1e-12, .atol = 1e-12}, "batched");
  expect_allclose(layer(index(x, 0)), index(want, 0), {.rtol = 1e-12, .atol = 1e-12}, "unbatched");
  const Tensor c = normal(99, want.shape());
  const auto loss = [&](const L& l) { return sum(l(x) * c); };
  expect_tree_allclose(
      grad(loss)(layer),
      finite_differences<L>([&](const L& l) { return loss(l).template item<double>(); }, layer),
      {.rtol = 1e-7, .atol = 1e-7});
  const auto loss_x = [&](const Tensor& in) { return sum(layer(in) * c); };
  expect_allclose(grad(loss_x)(x),
                  finite_differences<Tensor>(
                      [&](const Tensor& in) { return loss_x(in).template item<double>(); }, x),
                  {.rtol = 1e-7, .atol = 1e-7}, "input gradient");
}

}  // namespace

TEST(ConvLayers, Conv1dIsTheFunctionalOpPlusBias) {
  const nn::Conv1d l(4, 6, 3, random::key(1),
                     {.stride = 2, .padding = 1, .dilation = 2, .groups = 2, .dtype = float64});
  check_layer(l, normal(2, {2, 4, 9}), [&](const Tensor& x) {
    return conv1d(x, l.weight, {.stride = 2, .padding = 1, .dilation = 2, .groups = 2});
  });
}

TEST(ConvLayers, Conv2dIsTheFunctionalOpPlusBias) {
  const nn::Conv2d l(2, 3, {3, 2}, random::key(3), {.padding = {1, 0}, .dtype = float64});
  check_layer(l, normal(4, {2, 2, 5, 4}), [&](const Tensor& x) {
    return conv2d(x, l.weight, {.padding = {1, 0}});
  });
}

TEST(ConvLayers, Conv3dIsTheFunctionalOpPlusBias) {
  const nn::Conv3d l(2, 2, {2, 1, 2}, random::key(5),
                     {.stride = {1, 2, 1}, .padding = {0, 1, 1}, .dtype = float64});
  check_layer(l, normal(6, {2, 2, 3, 4, 3}), [&](const Tensor& x) {
    return conv3d(x, l.weight, {.stride = {1, 2, 1}, .padding = {0, 1, 1}});
  });
}

TEST(ConvLayers, ConvTransposeIsTheFunctionalOpPlusBias) {
  const nn::ConvTranspose1d t1(4, 6, 3, random::key(7),
                               {.stride = 2, .output_padding = 1, .groups = 2, .dtype = float64});
  EXPECT_EQ(t1.weight.shape(), (Shape{4, 3, 3}));
  check_layer(t1, normal(8, {2, 4, 5}), [&](const Tensor& x) {
    return conv_transpose1d(x, t1.weight, {.stride = 2, .output_padding = 1, .groups = 2});
  });
  const nn::ConvTranspose2d t2(2, 3, {2, 3}, random::key(9),
                               {.stride = {2, 1}, .padding = {1, 1}, .dtype = float64});
  check_layer(t2, normal(10, {2, 2, 3, 3}), [&](const Tensor& x) {
    return conv_transpose2d(x, t2.weight, {.stride = {2, 1}, .padding = {1, 1}});
  });
  const nn::ConvTranspose3d t3(2, 2, {2, 2, 1}, random::key(11),
                               {.dilation = {1, 2, 1}, .dtype = float64});
  check_layer(t3, normal(12, {2, 2, 2, 2, 3}), [&](const Tensor& x) {
    return conv_transpose3d(x, t3.weight, {.dilation = {1, 2, 1}});
  });
}

// padding_mode reflect against a hand-reflected input: [x2, x1, x0, ..., x5, x4, x3].
TEST(ConvLayers, PaddingModesPadTheInputAsPyTorch) {
  const Tensor x = normal(13, {1, 2, 6});
  const auto by_hand = [&](std::vector<int64_t> order) {
    return take(x, tensor(order, Shape{static_cast<int64_t>(order.size())}), 2);
  };
  struct Case {
    nn::PaddingMode mode;
    std::vector<int64_t> order;
  };
  for (const Case& c : {Case{nn::PaddingMode::reflect, {2, 1, 0, 1, 2, 3, 4, 5, 4, 3}},
                        Case{nn::PaddingMode::replicate, {0, 0, 0, 1, 2, 3, 4, 5, 5, 5}},
                        Case{nn::PaddingMode::circular, {4, 5, 0, 1, 2, 3, 4, 5, 0, 1}}}) {
    const nn::Conv1d l(2, 3, 3, random::key(14),
                       {.padding = 2, .padding_mode = c.mode, .dtype = float64});
    const Tensor want = plus_bias(conv1d(by_hand(c.order), l.weight), *l.bias);
    expect_allclose(l(x), want, {.rtol = 1e-12, .atol = 1e-12},
                    "padding mode " + std::to_string(static_cast<int>(c.mode)));
  }
}

// "same" with an odd total padding (kernel 2): the extra one after, as PyTorch.
TEST(ConvLayers, SamePaddingKeepsTheSize) {
  const Tensor x = normal(15, {2, 5, 4});
  const Tensor w = normal(16, {3, 2, 2, 3});
  const Tensor want = conv2d(pad(x, {{0, 0}, {0, 1}, {1, 1}}), w);
  expect_allclose(conv2d(x, w, {.padding = PaddingRule::same}), want,
                  {.rtol = 1e-12, .atol = 1e-12}, "same, unbatched");
  expect_allclose(conv2d(x, w, {.padding = PaddingRule::valid}), conv2d(x, w),
                  {.rtol = 1e-12, .atol = 1e-12}, "valid");
  const nn::Conv2d l(2, 3, {2, 3}, random::key(17),
                     {.padding = PaddingRule::same, .bias = false, .dtype = float64});
  EXPECT_EQ(l(x).shape(), (Shape{3, 5, 4}));
  const nn::Conv2d reflect(2, 3, {2, 3}, random::key(17),
                           {.padding = PaddingRule::same,
                            .bias = false,
                            .padding_mode = nn::PaddingMode::reflect,
                            .dtype = float64});
  expect_allclose(reflect(x), conv2d(pad(x, {{0, 0}, {0, 1}, {1, 1}}, PadMode::reflect), l.weight),
                  {.rtol = 1e-12, .atol = 1e-12}, "same, reflect");
}

TEST(ConvLayers, FunctionalBiasPromotesAndBroadcasts) {
  const Tensor x = normal(18, {1, 2, 4, 4}), w = normal(19, {3, 2, 3, 3});
  const Tensor b = astype(normal(20, {3}), float32);
  const Tensor y = conv2d(astype(x, float32), astype(w, float32), {.bias = b});
  EXPECT_EQ(y.dtype(), float32);
  expect_allclose(conv2d(x, w, {.bias = b}), plus_bias(conv2d(x, w), astype(b, float64)),
                  {.rtol = 1e-12, .atol = 1e-12}, "f32 bias on f64 operands");
  const Tensor t = conv_transpose2d(x, normal(21, {2, 3, 2, 2}), {.stride = {2, 2}, .bias = b});
  EXPECT_EQ(t.shape(), (Shape{1, 3, 8, 8}));
}

TEST(ConvLayers, InitialisationIsPyTorchs) {
  // U(±1/sqrt(fan_in)) for weight and bias, fan_in = weight.shape[1] * prod(kernel).
  const nn::Conv3d c(4, 8, {3, 3, 3}, random::key(22), {.groups = 2});
  const nn::ConvTranspose2d t(4, 8, {3, 3}, random::key(23), {.groups = 2});
  struct Case {
    const Tensor& weight;
    const Tensor& bias;
    double fan_in;
  };
  for (const Case& k : {Case{c.weight, *c.bias, 2.0 * 27}, Case{t.weight, *t.bias, 4.0 * 9}}) {
    const double bound = 1 / std::sqrt(k.fan_in);
    const double wmax = max(abs(k.weight)).item<double>();
    EXPECT_LE(wmax, bound);
    EXPECT_GT(wmax, 0.8 * bound);
    EXPECT_LE(max(abs(k.bias)).item<double>(), bound);
  }
  EXPECT_EQ(t.weight.shape(), (Shape{4, 4, 3, 3}));
}

TEST(ConvLayers, AreTrees) {
  const nn::ConvTranspose3d t(2, 4, {1, 2, 3}, random::key(24),
                              {.stride = {2, 1, 1}, .output_padding = {1, 0, 0}});
  const auto [leaves, def] = tree_flatten(t);
  EXPECT_EQ(tree_names(def), (std::vector<std::string>{"weight", "bias"}));
  const auto back = tree_unflatten<nn::ConvTranspose3d>(def, leaves);
  EXPECT_EQ(back.stride, t.stride);
  EXPECT_EQ(back.output_padding, t.output_padding);
  const nn::Conv1d c(
      2, 4, 3, random::key(25),
      {.padding = PaddingRule::same, .bias = false, .padding_mode = nn::PaddingMode::circular});
  const auto [cl, cd] = tree_flatten(c);
  const auto cb = tree_unflatten<nn::Conv1d>(cd, cl);
  EXPECT_EQ(cb.padding.rule, PaddingRule::same);
  EXPECT_EQ(cb.padding_mode, nn::PaddingMode::circular);
  EXPECT_FALSE(cb.bias.has_value());
}

TEST(ConvLayers, Errors) {
  const Tensor x = ones({1, 4, 5, 5});
  expect_error(
      [&] {
        conv2d(x, ones({2, 4, 3, 3}), {.bias = ones({3})});
      },
      "conv2d", {"bias does not match the output channels", "f32[3]", "expected [2]"});
  expect_error(
      [&] {
        conv_transpose1d(ones({4, 5}), ones({4, 2, 3}), {.groups = 2, .bias = ones({2})});
      },
      "conv_transpose1d", {"bias does not match the output channels", "expected [4]"});
  expect_error(
      [&] {
        conv3d(ones({4, 5}), ones({2, 4, 1, 1, 1}));
      },
      "conv3d", {"input must have rank 5 (or 4, unbatched)", "f32[4,5]", "[C, D, H, W]"});
  expect_error(
      [&] {
        conv1d(ones({1, 2, 5}), ones({2, 2, 3}), {.stride = 2, .padding = PaddingRule::same});
      },
      "conv1d", {"padding='same' needs stride 1"});
  expect_error(
      [] {
        nn::Conv2d(2, 4, {3, 3}, random::key(0), {.stride = {1, 2}, .padding = PaddingRule::same});
      },
      "nn.Conv2d", {"padding='same' needs stride 1", "[1, 2]"});
  expect_error(
      [] {
        nn::ConvTranspose2d(3, 4, {3, 3}, random::key(0), {.groups = 2});
      },
      "nn.ConvTranspose2d", {"channels not divisible by groups"});
  expect_error([] { nn::Conv1d(2, 4, 0, random::key(0)); }, "nn.Conv1d",
               {"non-positive size", "kernel=[0]"});
  const nn::Conv3d c(2, 2, {1, 1, 1}, random::key(0));
  expect_error(
      [&] {
        c(ones({2, 2, 2}));
      },
      "nn.Conv3d", {"input must have rank 5 (or 4, unbatched)", "f32[2,2,2]"});
}
