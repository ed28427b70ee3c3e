// conv2d, max_pool2d and avg_pool2d against naive direct loops in double precision written
// here (independent of the library's im2col + gemm kernels), plus hand-computed values.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "kiln/kiln.h"
#include "testing.h"

using namespace kiln;

namespace {

using kiln::testing::expect_allclose;

using kiln::testing::random_values;

Tensor make(const std::vector<double>& v, const Shape& shape, DType dt = float32) {
  return astype(tensor(v, shape), dt);
}

struct ConvCase {
  int64_t N, C, H, W, O, KH, KW;
  int64_t sh = 1, sw = 1, ph = 0, pw = 0, dh = 1, dw = 1, groups = 1;
};

std::string describe(const ConvCase& c) {
  return "N=" + std::to_string(c.N) + " C=" + std::to_string(c.C) + " H=" + std::to_string(c.H) +
         " W=" + std::to_string(c.W) + " O=" + std::to_string(c.O) + " K=" + std::to_string(c.KH) +
         "x" + std::to_string(c.KW) + " s=" + std::to_string(c.sh) + "," + std::to_string(c.sw) +
         " p=" + std::to_string(c.ph) + "," + std::to_string(c.pw) + " d=" + std::to_string(c.dh) +
         "," + std::to_string(c.dw) + " g=" + std::to_string(c.groups);
}

// Direct convolution (cross-correlation, as in PyTorch) with zero padding.
std::vector<double> ref_conv(const ConvCase& c, const std::vector<double>& x,
                             const std::vector<double>& w, int64_t& OH, int64_t& OW) {
  OH = (c.H + 2 * c.ph - c.dh * (c.KH - 1) - 1) / c.sh + 1;
  OW = (c.W + 2 * c.pw - c.dw * (c.KW - 1) - 1) / c.sw + 1;
  const int64_t Cg = c.C / c.groups, Og = c.O / c.groups;
  std::vector<double> out(static_cast<std::size_t>(c.N * c.O * OH * OW), 0.0);
  for (int64_t n = 0; n < c.N; ++n)
    for (int64_t o = 0; o < c.O; ++o) {
      const int64_t g = o / Og;
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow) {
          double s = 0;
          for (int64_t ci = 0; ci < Cg; ++ci)
            for (int64_t kh = 0; kh < c.KH; ++kh)
              for (int64_t kw = 0; kw < c.KW; ++kw) {
                const int64_t ih = oh * c.sh - c.ph + kh * c.dh;
                const int64_t iw = ow * c.sw - c.pw + kw * c.dw;
                if (ih < 0 || ih >= c.H || iw < 0 || iw >= c.W) continue;
                const int64_t channel = g * Cg + ci;
                s += x[static_cast<std::size_t>(((n * c.C + channel) * c.H + ih) * c.W + iw)] *
                     w[static_cast<std::size_t>(((o * Cg + ci) * c.KH + kh) * c.KW + kw)];
              }
          out[static_cast<std::size_t>(((n * c.O + o) * OH + oh) * OW + ow)] = s;
        }
    }
  return out;
}

void check_conv(const ConvCase& c, DType dt, uint32_t seed) {
  SCOPED_TRACE(describe(c) + " " + std::string(dtype_name(dt)));
  const auto x = random_values(c.N * c.C * c.H * c.W, seed);
  const auto w = random_values(c.O * (c.C / c.groups) * c.KH * c.KW, seed + 1000);
  int64_t OH = 0, OW = 0;
  const auto want = ref_conv(c, x, w, OH, OW);
  const Tensor out = conv2d(make(x, Shape{c.N, c.C, c.H, c.W}, dt),
                            make(w, Shape{c.O, c.C / c.groups, c.KH, c.KW}, dt),
                            {.stride = {c.sh, c.sw},
                             .padding = {c.ph, c.pw},
                             .dilation = {c.dh, c.dw},
                             .groups = c.groups});
  EXPECT_EQ(out.dtype(), dt);
  const double tol = dt == float64 ? 1e-12 : 1e-5;
  expect_allclose(out, tensor(want, Shape{c.N, c.O, OH, OW}), {.rtol = tol, .atol = tol});
}

const std::vector<ConvCase>& conv_cases() {
  static const std::vector<ConvCase> cases = {
      {.N = 1, .C = 1, .H = 5, .W = 5, .O = 1, .KH = 3, .KW = 3},
      {.N = 2, .C = 3, .H = 8, .W = 7, .O = 4, .KH = 3, .KW = 3},
      {.N = 2, .C = 3, .H = 9, .W = 9, .O = 5, .KH = 3, .KW = 3, .sh = 2, .sw = 2},
      {.N = 2, .C = 3, .H = 6, .W = 6, .O = 4, .KH = 3, .KW = 3, .ph = 1, .pw = 1},
      {.N = 1, .C = 2, .H = 10, .W = 11, .O = 3, .KH = 3, .KW = 3, .dh = 2, .dw = 3},
      {.N = 2, .C = 4, .H = 7, .W = 7, .O = 6, .KH = 3, .KW = 3, .groups = 2},
      {.N = 2, .C = 6, .H = 7, .W = 5, .O = 6, .KH = 3, .KW = 3, .ph = 1, .pw = 1, .groups = 6},
      {.N = 3, .C = 5, .H = 6, .W = 6, .O = 4, .KH = 1, .KW = 1},                    // 1x1 path
      {.N = 2, .C = 4, .H = 6, .W = 6, .O = 4, .KH = 1, .KW = 1, .groups = 2},       // 1x1, groups
      {.N = 2, .C = 3, .H = 7, .W = 7, .O = 2, .KH = 1, .KW = 1, .sh = 2, .sw = 2},  // strided 1x1
      {.N = 1,
       .C = 2,
       .H = 7,
       .W = 9,
       .O = 3,
       .KH = 2,
       .KW = 4,
       .sh = 3,
       .sw = 2,
       .ph = 2,
       .pw = 1,
       .dh = 2,
       .dw = 1},
      {.N = 2,
       .C = 6,
       .H = 9,
       .W = 8,
       .O = 9,
       .KH = 3,
       .KW = 2,
       .sh = 2,
       .sw = 1,
       .ph = 1,
       .pw = 2,
       .dh = 1,
       .dw = 2,
       .groups = 3},
      {.N = 1, .C = 1, .H = 3, .W = 3, .O = 1, .KH = 3, .KW = 3},  // 1x1 output
      {.N = 1, .C = 1, .H = 1, .W = 1, .O = 2, .KH = 3, .KW = 3, .ph = 1, .pw = 1},
      {.N = 1,
       .C = 1,
       .H = 4,
       .W = 4,
       .O = 1,
       .KH = 2,
       .KW = 2,
       .sh = 5,
       .sw = 5,
       .ph = 2,
       .pw = 2},
  };
  return cases;
}

}  // namespace

TEST(Conv2d, HandComputed) {
  // x = 1..16 as 4x4, all-ones 2x2 kernel, stride 2: sums of the four 2x2 blocks.
  const Tensor x = reshape(arange(1.0, 17.0, 1.0), Shape{1, 1, 4, 4});
  const Tensor w = ones({1, 1, 2, 2});
  const Tensor y = conv2d(x, w, {.stride = {2, 2}});
  EXPECT_EQ(y.shape(), (Shape{1, 1, 2, 2}));
  EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{14, 22, 46, 54}));
  // Padding 1, stride 3 on the same input: windows over the corners (zeros around).
  const Tensor z = conv2d(x, w, {.stride = {3, 3}, .padding = {1, 1}});
  EXPECT_EQ(z.shape(), (Shape{1, 1, 2, 2}));
  EXPECT_EQ(z.to_vector<float>(), (std::vector<float>{1, 7, 22, 54}));
  // Two groups, each output channel sees only its own input channel.
  const Tensor x2 = reshape(arange(0.0, 8.0, 1.0, float64), Shape{1, 2, 2, 2});
  const Tensor w2 = reshape(tensor({1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 2.0}), Shape{2, 1, 2, 2});
  EXPECT_EQ(conv2d(x2, w2, {.groups = 2}).to_vector<double>(), (std::vector<double>{0.0, 14.0}));
}

TEST(Conv2d, MatchesDirectConvolution) {
  uint32_t seed = 1;
  for (DType dt : {float32, float64})
    for (const ConvCase& c : conv_cases()) check_conv(c, dt, seed++);
}

TEST(Conv2d, BatchedSmallImagesAndLargeImages) {
  // Small images are batched into one gemm (then scattered); large ones go image by image.
  check_conv({.N = 9, .C = 3, .H = 5, .W = 5, .O = 4, .KH = 3, .KW = 3, .ph = 1, .pw = 1}, float32,
             70);
  check_conv({.N = 7, .C = 4, .H = 6, .W = 6, .O = 6, .KH = 3, .KW = 3, .groups = 2}, float64, 71);
  check_conv({.N = 300, .C = 2, .H = 4, .W = 4, .O = 3, .KH = 2, .KW = 2}, float32, 72);
  check_conv({.N = 2, .C = 3, .H = 70, .W = 80, .O = 5, .KH = 3, .KW = 3, .ph = 1, .pw = 1},
             float32, 73);
  check_conv({.N = 2, .C = 8, .H = 40, .W = 40, .O = 16, .KH = 1, .KW = 1}, float32, 74);
}

// float32 convolutions and their two gradients run through oneDNN, float64 through Kiln's
// im2col kernels (whose gradients test_ad_rules checks against finite differences): the two
// must agree on every geometry, including those oneDNN declines and hands back.
TEST(Conv2d, Float32GradientsMatchTheFloat64Ones) {
  std::vector<ConvCase> cases = conv_cases();
  cases.push_back({.N = 4, .C = 32, .H = 14, .W = 14, .O = 64, .KH = 5, .KW = 5, .ph = 2, .pw = 2});
  cases.push_back({.N = 3, .C = 1, .H = 28, .W = 28, .O = 8, .KH = 3, .KW = 3, .ph = 1, .pw = 1});
  // Pointwise and single-channel: one product per image, each adding to the weight gradient.
  cases.push_back({.N = 3, .C = 1, .H = 5, .W = 6, .O = 4, .KH = 1, .KW = 1});
  uint32_t seed = 500;
  for (const ConvCase& c : cases) {
    SCOPED_TRACE(describe(c));
    const Conv2dOptions o{.stride = {c.sh, c.sw},
                          .padding = {c.ph, c.pw},
                          .dilation = {c.dh, c.dw},
                          .groups = c.groups};
    const auto xv = random_values(c.N * c.C * c.H * c.W, seed++);
    const auto wv = random_values(c.O * (c.C / c.groups) * c.KH * c.KW, seed++);
    const Shape xs{c.N, c.C, c.H, c.W}, ws{c.O, c.C / c.groups, c.KH, c.KW};
    const Tensor y64 = conv2d(make(xv, xs, float64), make(wv, ws, float64), o);
    const Tensor dy = random::normal(random::key(seed++), y64.shape(), float64);
    auto grads = [&](DType dt) {
      auto f = [&](const Tensor& x, const Tensor& w) {
        return sum(conv2d(x, w, o) * astype(dy, dt));
      };
      return grad(f, argnums<0, 1>)(make(xv, xs, dt), make(wv, ws, dt));
    };
    const auto [dx64, dw64] = grads(float64);
    // float32 on each GEMM backend: the im2col products (a single-channel input's weight
    // gradient, what oneDNN declines) follow matmul's backend.
    for (GemmBackend backend : {GemmBackend::onednn, GemmBackend::openblas}) {
      SCOPED_TRACE(gemm_backend_name(backend));
      set_gemm_backend(backend);
      const auto [dx32, dw32] = grads(float32);
      expect_allclose(dx32, dx64, {.rtol = 1e-4, .atol = 1e-4});
      expect_allclose(dw32, dw64, {.rtol = 1e-4, .atol = 1e-4});
    }
    set_gemm_backend(std::nullopt);
  }
}

// In compiled code the passes share their operands' reorders into oneDNN's layouts (the two
// forwards and both weight gradients read x, both gradients of each layer read its output's
// gradient, a weight is read in two layouts): gradients of a two-layer network equal the
// interpreter's, whose kernels reorder every operand themselves, bit for bit.
TEST(Conv2d, CompiledPassesSharingReordersMatchTheInterpreter) {
  const Conv2dOptions same{.padding = {1, 1}};
  auto f = [&](const Tensor& x, const Tensor& w1, const Tensor& w2, const Tensor& w3) {
    const Tensor h = nn::relu(conv2d(x, w1, same) + conv2d(x, w2, same));
    const Tensor y = conv2d(h, w3, same);
    return sum(y * y);
  };
  const Tensor x = random::normal(random::key(1), {4, 32, 10, 10});
  const Tensor w1 = random::normal(random::key(2), {64, 32, 3, 3}) * 0.1f;
  const Tensor w2 = random::normal(random::key(3), {64, 32, 3, 3}) * 0.1f;
  const Tensor w3 = random::normal(random::key(4), {16, 64, 3, 3}) * 0.1f;
  auto grads = [&](ir::Backend backend) {
    return jit(grad(f, argnums<0, 1, 2, 3>), JitOptions{.backend = backend})(x, w1, w2, w3);
  };
  const auto compiled = grads(ir::Backend::llvm), interpreted = grads(ir::Backend::interpreter);
  const auto again = grads(ir::Backend::llvm);
  auto expect_same = [](const Tensor& a, const Tensor& b) {
    EXPECT_EQ(a.to_vector<float>(), b.to_vector<float>());
  };
  expect_same(std::get<0>(compiled), std::get<0>(interpreted));
  expect_same(std::get<1>(compiled), std::get<1>(interpreted));
  expect_same(std::get<2>(compiled), std::get<2>(interpreted));
  expect_same(std::get<3>(compiled), std::get<3>(interpreted));
  expect_same(std::get<0>(again), std::get<0>(compiled));
}

// A user's kernel may keep a buffer and refill it on each call: convolving it, or returning it
// to a convolution, gives each call's own result inside compiled code, as eagerly (the copies
// that built-in kernels share within a call are off for a user's code, and the copies of what
// it returns are forgotten).
const Primitive& kept_buffer_primitive(std::string name, bool convolve) {
  static const Tensor w = random::normal(random::key(5), {32, 16, 3, 3}) * 0.1f;
  static const Tensor kept = zeros({2, 16, 6, 6});
  Primitive p;
  p.name = name;
  p.arity = 1;
  p.type_rule = [name, convolve](std::span<const TensorType> in, const Attrs&) {
    if (in[0] != TensorType{float32, Shape{2, 16, 6, 6}})
      fail(name, "got ", in[0], ", expected f32[2,16,6,6]");
    return std::vector<TensorType>{{float32, Shape{2, convolve ? 32 : 16, 6, 6}}};
  };
  return register_primitive(
      std::move(p),
      {{KernelSignature{.inputs = {DTypeSet(float32)}},
        [convolve](std::span<const Tensor> in, const Attrs&) {
          const std::vector<float> v = in[0].to_vector<float>();
          std::copy(v.begin(), v.end(), kept.data<float>());
          return std::vector<Tensor>{convolve ? conv2d(kept, w, {.padding = {1, 1}}) : kept};
        }}});
}

TEST(Conv2d, AUserKernelsKeptBufferGetsEachCallsResult) {
  static const Primitive& conv_of_kept = kept_buffer_primitive("test_conv_of_a_kept_buffer", true);
  static const Primitive& refilled = kept_buffer_primitive("test_a_refilled_buffer", false);
  const Tensor w2 = random::normal(random::key(8), {8, 16, 3, 3});
  auto conv_inside = [&](const Tensor& a, const Tensor& b) {
    return bind1(conv_of_kept, {a}) + bind1(conv_of_kept, {b}) * 2.0f;
  };
  auto conv_after = [&](const Tensor& a, const Tensor& b) {
    const Tensor ca = conv2d(bind1(refilled, {a}), w2, {.padding = {1, 1}});
    return ca + conv2d(bind1(refilled, {b}), w2, {.padding = {1, 1}}) * 2.0f;
  };
  const Tensor a = random::normal(random::key(6), {2, 16, 6, 6});
  const Tensor b = random::normal(random::key(7), {2, 16, 6, 6});
  for (const auto& f : {std::function(conv_inside), std::function(conv_after)}) {
    const Tensor want = f(a, b);  // eagerly: each convolution runs before the next refill
    EXPECT_EQ(jit(f, JitOptions{.backend = ir::Backend::llvm})(a, b).to_vector<float>(),
              want.to_vector<float>());
  }
}

TEST(Conv2d, HalfPrecision) {
  for (DType dt : {float16, bfloat16}) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    const ConvCase c{.N = 2, .C = 3, .H = 6, .W = 6, .O = 2, .KH = 3, .KW = 3, .ph = 1, .pw = 1};
    // Values k/8 in [-1, 1] are exact in both formats.
    auto x = random_values(2 * 3 * 6 * 6, 5), w = random_values(2 * 3 * 3 * 3, 6);
    for (double& v : x) v = std::round(v * 8) / 8;
    for (double& v : w) v = std::round(v * 8) / 8;
    int64_t OH = 0, OW = 0;
    const auto want = ref_conv(c, x, w, OH, OW);
    const Tensor out =
        conv2d(make(x, Shape{2, 3, 6, 6}, dt), make(w, Shape{2, 3, 3, 3}, dt), {.padding = {1, 1}});
    EXPECT_EQ(out.dtype(), dt);
    expect_allclose(out, tensor(want, Shape{2, 2, OH, OW}),
                    {.rtol = dt == float16 ? 1e-3 : 8e-3, .atol = 1e-2});
  }
}

TEST(Conv2d, StridedInputsAndPromotion) {
  // An NHWC buffer viewed as NCHW (a permuted, non-contiguous view).
  const ConvCase c{.N = 2, .C = 3, .H = 5, .W = 6, .O = 2, .KH = 2, .KW = 3, .ph = 1, .pw = 0};
  const auto nhwc = random_values(2 * 5 * 6 * 3, 9);
  std::vector<double> nchw(nhwc.size());
  for (int64_t n = 0; n < 2; ++n)
    for (int64_t h = 0; h < 5; ++h)
      for (int64_t w = 0; w < 6; ++w)
        for (int64_t ch = 0; ch < 3; ++ch)
          nchw[((n * 3 + ch) * 5 + h) * 6 + w] = nhwc[((n * 5 + h) * 6 + w) * 3 + ch];
  const auto wv = random_values(2 * 3 * 2 * 3, 10);
  int64_t OH = 0, OW = 0;
  const auto want = ref_conv(c, nchw, wv, OH, OW);
  const Tensor x = permute(make(nhwc, Shape{2, 5, 6, 3}), {0, 3, 1, 2});
  ASSERT_FALSE(x.is_contiguous());
  expect_allclose(conv2d(x, make(wv, Shape{2, 3, 2, 3}), {.padding = {1, 0}}),
                  tensor(want, Shape{2, 2, OH, OW}), {.rtol = 1e-5, .atol = 1e-5});
  // Integer inputs compute in float32; f32 with f64 promotes to f64.
  const Tensor xi = astype(reshape(arange(1.0, 17.0, 1.0), Shape{1, 1, 4, 4}), int32);
  const Tensor yi = conv2d(xi, ones({1, 1, 2, 2}, int32), {.stride = {2, 2}});
  EXPECT_EQ(yi.dtype(), float32);
  EXPECT_EQ(yi.to_vector<float>(), (std::vector<float>{14, 22, 46, 54}));
  EXPECT_EQ(conv2d(ones({1, 1, 3, 3}), ones({1, 1, 2, 2}, float64)).dtype(), float64);
}

TEST(Conv2d, EmptyBatchAndChannels) {
  EXPECT_EQ(conv2d(zeros({0, 3, 5, 5}), zeros({4, 3, 3, 3})).shape(), (Shape{0, 4, 3, 3}));
  EXPECT_EQ(conv2d(zeros({2, 3, 5, 5}), zeros({0, 3, 3, 3})).shape(), (Shape{2, 0, 3, 3}));
  const Tensor y = conv2d(zeros({2, 0, 5, 5}), zeros({4, 0, 3, 3}));
  EXPECT_EQ(y.shape(), (Shape{2, 4, 3, 3}));
  EXPECT_EQ(y.to_vector<float>(), std::vector<float>(72, 0.0f));
}

namespace {
void expect_error(std::string_view op, const std::function<void()>& f,
                  const std::vector<std::string>& pieces) {
  try {
    f();
    ADD_FAILURE() << "expected kiln::Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.op(), op);
    const std::string msg = e.what();
    for (const std::string& p : pieces)
      EXPECT_NE(msg.find(p), std::string::npos) << "message: " << msg << "\nmissing: " << p;
  }
}
}  // namespace

TEST(Conv2d, Errors) {
  const Tensor x = ones({2, 4, 5, 5});
  expect_error("conv2d",
               [] {
                 conv2d(ones({5, 5}), ones({2, 4, 3, 3}));
               },
               {"input must have rank 4 (or 3, unbatched)", "f32[5,5]", "[N, C, H, W]"});
  expect_error("conv2d",
               [&] {
                 conv2d(x, ones({2, 4, 3}));
               },
               {"weight must have rank 4", "f32[2,4,3]"});
  expect_error("conv2d",
               [&] {
                 conv2d(x, ones({2, 3, 3, 3}));
               },
               {"weight channels do not match", "f32[2,4,5,5]", "f32[2,3,3,3]", "(3 vs 4)"});
  expect_error("conv2d",
               [&] {
                 conv2d(x, ones({2, 4, 3, 3}), {.groups = 3});
               },
               {"input channels not divisible by groups", "groups=3"});
  expect_error("conv2d",
               [&] {
                 conv2d(x, ones({3, 2, 3, 3}), {.groups = 2});
               },
               {"output channels not divisible by groups", "f32[3,2,3,3]"});
  expect_error("conv2d",
               [&] {
                 conv2d(x, ones({2, 4, 3, 3}), {.groups = 0});
               },
               {"non-positive groups"});
  expect_error("conv2d",
               [&] {
                 conv2d(x, ones({2, 4, 6, 3}));
               },
               {"kernel larger than the padded input", "f32[2,4,5,5]", "f32[2,4,6,3]", "6x3"});
  expect_error("conv2d",
               [&] {
                 conv2d(x, ones({2, 4, 3, 3}), {.dilation = {3, 1}});
               },
               {"kernel larger than the padded input", "7x3"});
  expect_error("conv2d",
               [&] {
                 conv2d(x, ones({2, 4, 3, 3}), {.stride = {0, 1}});
               },
               {"non-positive stride", "[0, 1]"});
  expect_error("conv2d",
               [&] {
                 conv2d(x, ones({2, 4, 3, 3}), {.dilation = {1, -1}});
               },
               {"non-positive dilation", "[1, -1]"});
  expect_error("conv2d",
               [&] {
                 conv2d(x, ones({2, 4, 3, 3}), {.padding = {-1, 0}});
               },
               {"negative padding", "[-1, 0]"});
  expect_error("conv2d",
               [&] {
                 bind1(primitive("conv"), {x, ones({2, 4, 3, 3}, float64)},
                       {{"stride", std::vector<int64_t>{1, 1}},
                        {"padding", std::vector<int64_t>{0, 0}},
                        {"dilation", std::vector<int64_t>{1, 1}},
                        {"groups", int64_t{1}}});
               },
               {"differ in dtype", "f32[2,4,5,5]", "f64[2,4,3,3]"});
  expect_error("conv2d",
               [&] {
                 bind1(primitive("conv"), {ones({1, 1, 3, 3}, int32), ones({1, 1, 1, 1}, int32)},
                       {{"stride", std::vector<int64_t>{1, 1}},
                        {"padding", std::vector<int64_t>{0, 0}},
                        {"dilation", std::vector<int64_t>{1, 1}},
                        {"groups", int64_t{1}}});
               },
               {"unsupported dtype", "i32[1,1,3,3]"});
  expect_error("conv2d",
               [&] {
                 bind1(primitive("conv"), {ones({1, 1, 3, 3}), ones({1, 1, 1, 1})},
                       {{"stride", std::vector<int64_t>{1, 1}},
                        {"padding", std::vector<int64_t>{0}},
                        {"dilation", std::vector<int64_t>{1, 1}},
                        {"groups", int64_t{1}}});
               },
               {"'padding' has the wrong length", "[0]", "expected 2 values (height, width)"});
}

// ---- pooling ------------------------------------------------------------------------

namespace {

struct PoolCase {
  int64_t N, C, H, W, KH, KW, sh, sw, ph, pw;
};

// max: padding is -inf (never chosen); avg: padding counts as zeros in a KH*KW divisor.
std::vector<double> ref_pool(const PoolCase& c, const std::vector<double>& x, bool is_max,
                             int64_t& OH, int64_t& OW) {
  OH = (c.H + 2 * c.ph - c.KH) / c.sh + 1;
  OW = (c.W + 2 * c.pw - c.KW) / c.sw + 1;
  std::vector<double> out;
  for (int64_t p = 0; p < c.N * c.C; ++p)
    for (int64_t oh = 0; oh < OH; ++oh)
      for (int64_t ow = 0; ow < OW; ++ow) {
        double acc = is_max ? -std::numeric_limits<double>::infinity() : 0.0;
        for (int64_t kh = 0; kh < c.KH; ++kh)
          for (int64_t kw = 0; kw < c.KW; ++kw) {
            const int64_t ih = oh * c.sh - c.ph + kh, iw = ow * c.sw - c.pw + kw;
            const bool inside = ih >= 0 && ih < c.H && iw >= 0 && iw < c.W;
            const double v = inside ? x[static_cast<std::size_t>((p * c.H + ih) * c.W + iw)]
                                    : (is_max ? -std::numeric_limits<double>::infinity() : 0.0);
            if (is_max) {
              if (std::isnan(v) || v > acc) acc = std::isnan(acc) ? acc : v;
            } else {
              acc += v;
            }
          }
        out.push_back(is_max ? acc : acc / static_cast<double>(c.KH * c.KW));
      }
  return out;
}

}  // namespace

TEST(Pool2d, HandComputed) {
  const Tensor x = reshape(arange(1.0, 17.0, 1.0), Shape{1, 1, 4, 4});
  EXPECT_EQ(max_pool2d(x).to_vector<float>(), (std::vector<float>{6, 8, 14, 16}));
  EXPECT_EQ(avg_pool2d(x).to_vector<float>(), (std::vector<float>{3.5, 5.5, 11.5, 13.5}));
  // Padding 1 with a 2x2 kernel, stride 2: corner windows hold a single input value.
  const Tensor a = avg_pool2d(x, {.kernel = {2, 2}, .stride = {{2, 2}}, .padding = {1, 1}});
  EXPECT_EQ(a.shape(), (Shape{1, 1, 3, 3}));
  EXPECT_EQ(a.to_vector<float>(),
            (std::vector<float>{0.25f, 1.25f, 1.0f, 3.5f, 8.5f, 5.0f, 3.25f, 7.25f, 4.0f}));
  // Max-pool padding never wins, even over negative values.
  const Tensor m = max_pool2d(neg(x), {.kernel = {2, 2}, .stride = {{2, 2}}, .padding = {1, 1}});
  EXPECT_EQ(m.to_vector<float>(), (std::vector<float>{-1, -2, -4, -5, -6, -8, -13, -14, -16}));
  // Stride defaults to the kernel; overlapping windows with an explicit stride.
  EXPECT_EQ(max_pool2d(x, {.kernel = {3, 3}, .stride = {{1, 1}}}).to_vector<float>(),
            (std::vector<float>{11, 12, 15, 16}));
}

TEST(Pool2d, MatchesDirectLoops) {
  const std::vector<PoolCase> cases = {
      {2, 3, 8, 8, 2, 2, 2, 2, 0, 0}, {1, 2, 7, 9, 3, 3, 2, 2, 1, 1},
      {2, 2, 5, 6, 3, 2, 1, 3, 1, 1}, {1, 1, 6, 6, 4, 4, 3, 1, 2, 0},
      {3, 4, 9, 7, 1, 1, 2, 2, 0, 0}, {1, 3, 33, 35, 3, 3, 2, 2, 1, 1},
      {2, 1, 4, 4, 4, 4, 1, 1, 2, 2}, {1, 2, 9, 40, 3, 3, 1, 1, 1, 1},
      {1, 2, 8, 41, 5, 4, 1, 3, 2, 2}};
  uint32_t seed = 40;
  for (const PoolCase& c : cases)
    for (DType dt : {float32, float64})
      for (bool is_max : {true, false}) {
        SCOPED_TRACE(std::string(is_max ? "max" : "avg") + " " + std::string(dtype_name(dt)) +
                     " case " + std::to_string(&c - cases.data()));
        // Negative values make -inf versus zero padding observable.
        const auto x = random_values(c.N * c.C * c.H * c.W, seed++, -2.0, -0.5);
        int64_t OH = 0, OW = 0;
        const auto want = ref_pool(c, x, is_max, OH, OW);
        const Pool2dOptions o{
            .kernel = {c.KH, c.KW}, .stride = {{c.sh, c.sw}}, .padding = {c.ph, c.pw}};
        const Tensor xt = make(x, Shape{c.N, c.C, c.H, c.W}, dt);
        const Tensor y = is_max ? max_pool2d(xt, o) : avg_pool2d(xt, o);
        EXPECT_EQ(y.dtype(), dt);
        expect_allclose(y, tensor(want, Shape{c.N, c.C, OH, OW}),
                        {.rtol = dt == float64 ? 1e-12 : 1e-6, .atol = 1e-6});
      }
}

TEST(Pool2d, HalfPrecisionNanAndStridedInput) {
  for (DType dt : {float16, bfloat16}) {
    const Tensor x = astype(reshape(arange(1.0, 17.0, 1.0), Shape{1, 1, 4, 4}), dt);
    EXPECT_EQ(max_pool2d(x).dtype(), dt);
    EXPECT_EQ(max_pool2d(x).to_vector<float>(), (std::vector<float>{6, 8, 14, 16}));
    EXPECT_EQ(avg_pool2d(x).to_vector<float>(), (std::vector<float>{3.5, 5.5, 11.5, 13.5}));
  }
  // NaN propagates through max pooling, wherever it sits in the window.
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const Tensor xn = tensor({1.0, nan, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, nan}, Shape{1, 1, 3, 3});
  const auto r = max_pool2d(xn, {.kernel = {2, 2}, .stride = {{1, 1}}}).to_vector<double>();
  ASSERT_EQ(r.size(), 4u);
  EXPECT_TRUE(std::isnan(r[0]));
  EXPECT_TRUE(std::isnan(r[1]));
  EXPECT_EQ(r[2], 8.0);
  EXPECT_TRUE(std::isnan(r[3]));
  // A transposed (non-contiguous) input.
  const Tensor x = reshape(arange(1.0, 17.0, 1.0), Shape{1, 1, 4, 4});
  const Tensor xt = swapaxes(x, 2, 3);
  ASSERT_FALSE(xt.is_contiguous());
  EXPECT_EQ(max_pool2d(xt).to_vector<float>(), (std::vector<float>{6, 14, 8, 16}));
  // Integers pool in float32.
  EXPECT_EQ(max_pool2d(astype(x, int32)).dtype(), float32);
}

// The max-pool gradient goes to each window's first maximum (a NaN window: its last NaN,
// the forward's choice). 2x2 windows with stride 2 take their own fast path (float32: four
// windows at a time, then the rest one by one); an odd width leaves the last column outside
// every window. Other windows run a row of outputs at a time, padded ones included.
TEST(Pool2d, MaxGradientRoutesToTheFirstMaximum) {
  for (const auto& [k, st, W, pad] : {std::tuple<int64_t, int64_t, int64_t, int64_t>{2, 2, 7, 0},
                                      {2, 2, 23, 0},
                                      {3, 2, 7, 0},
                                      {2, 1, 7, 0},
                                      {3, 1, 37, 1},
                                      {3, 2, 38, 1},
                                      {4, 3, 41, 2}}) {
    SCOPED_TRACE("kernel " + std::to_string(k) + " stride " + std::to_string(st) + " width " +
                 std::to_string(W) + " padding " + std::to_string(pad));
    const int64_t N = 2, C = 3, H = 6;
    std::vector<double> xv = random_values(N * C * H * W, 900);
    xv[3] = xv[4] = xv[W + 3] = 5.0;  // a tie in the first plane
    xv[2 * W + 1] = NAN;
    if (W > 20) {
      const int64_t plane = H * W;
      // Two NaNs in one window (the last wins), in the second plane; windows whose maximum
      // is a tie of -0 and +0 (the first wins) in -1s, in the third; windows of -inf only
      // at the plane's corner, next to the padding where there is one (their first element
      // takes the gradient), in the fourth.
      xv[plane + 8] = xv[plane + W + 9] = NAN;
      for (int64_t h = 0; h < 6; ++h)
        for (int64_t w = 10; w < 16; ++w) xv[2 * plane + h * W + w] = -1.0;
      xv[2 * plane + 2 * W + 13] = -0.0;
      xv[2 * plane + 3 * W + 12] = 0.0;
      for (int64_t h = 0; h < 3; ++h)
        for (int64_t w = 0; w < 4; ++w) xv[3 * plane + h * W + w] = -INFINITY;
    }
    for (DType dt : {float32, float64}) {
      SCOPED_TRACE(std::string(dtype_name(dt)));
      const Tensor x = make(xv, Shape{N, C, H, W}, dt);
      const Pool2dOptions o{
          .kernel = {k, k}, .stride = std::pair<int64_t, int64_t>{st, st}, .padding = {pad, pad}};
      const Tensor y = max_pool2d(x, o);
      const int64_t OH = y.shape()[2], OW = y.shape()[3];
      const Tensor dy = random::normal(random::key(7), y.shape(), dt);
      const Tensor dx = grad([&](const Tensor& a) { return sum(max_pool2d(a, o) * dy); })(x);
      const std::vector<double> xs = x.to_vector<double>(), dys = dy.to_vector<double>();
      std::vector<double> want(xs.size(), 0.0), want_y;
      for (int64_t p = 0; p < N * C; ++p)
        for (int64_t oh = 0; oh < OH; ++oh)
          for (int64_t ow = 0; ow < OW; ++ow) {
            int64_t best = -1;
            for (int64_t h = std::max<int64_t>(oh * st - pad, 0);
                 h < std::min(oh * st - pad + k, H); ++h)
              for (int64_t w = std::max<int64_t>(ow * st - pad, 0);
                   w < std::min(ow * st - pad + k, W); ++w) {
                const int64_t i = (p * H + h) * W + w;
                const auto u = static_cast<std::size_t>(i);
                if (best < 0 || xs[u] > xs[static_cast<std::size_t>(best)] || std::isnan(xs[u]))
                  best = i;
              }
            want[static_cast<std::size_t>(best)] +=
                dys[static_cast<std::size_t>((p * OH + oh) * OW + ow)];
            want_y.push_back(xs[static_cast<std::size_t>(best)]);
          }
      // The forward pass, NaN window included.
      expect_allclose(y, tensor(want_y, y.shape()), {.rtol = 0, .atol = 0, .equal_nan = true});
      expect_allclose(dx, tensor(want, x.shape()), {.rtol = 1e-6, .atol = 1e-6});
    }
  }
}

TEST(Pool2d, Errors) {
  const Tensor x = ones({1, 2, 4, 4});
  for (const std::string op : {"max_pool2d", "avg_pool2d"}) {
    auto pool = [&](const Tensor& t, const Pool2dOptions& o) {
      return op == "max_pool2d" ? max_pool2d(t, o) : avg_pool2d(t, o);
    };
    expect_error(op, [&] { pool(ones({2, 4, 4}), {}); }, {"input must have rank 4", "f32[2,4,4]"});
    expect_error(op,
                 [&] {
                   pool(x, {.kernel = {5, 2}, .stride = std::nullopt});
                 },
                 {"kernel larger than the padded input", "f32[1,2,4,4]", "[5, 2]"});
    expect_error(op,
                 [&] {
                   pool(x, {.kernel = {2, 0}, .stride = std::nullopt});
                 },
                 {"non-positive kernel", "[2, 0]"});
    expect_error(op,
                 [&] {
                   pool(x, {.kernel = {2, 2}, .stride = {{0, 2}}});
                 },
                 {"non-positive stride", "[0, 2]"});
    expect_error(op,
                 [&] {
                   pool(x, {.kernel = {2, 2}, .stride = std::nullopt, .padding = {0, -1}});
                 },
                 {"negative padding", "[0, -1]"});
    expect_error(op,
                 [&] {
                   pool(x, {.kernel = {2, 2}, .stride = std::nullopt, .padding = {2, 0}});
                 },
                 {"padding larger than half the kernel", "[2, 0]", "[2, 2]"});
  }
}
