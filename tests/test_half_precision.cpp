// float16 and bfloat16 end to end: each op on 16-bit inputs against the same op in
// float32 on the same (exactly widened) values, rounded once to the 16-bit dtype. An op that
// computes in float32 and rounds once is within one unit in the last place (ulp) of that
// reference (float32 summation order can move a result across a rounding boundary); one that
// accumulated in 16 bits would be off by far more (the sums below would stall at 256 in
// bfloat16). Tolerance: 1 ulp of the 16-bit dtype at the reference's magnitude, plus 1 ulp at
// the magnitude of the terms for results that cancel.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kiln/kiln.h"
#include "testing.h"

namespace kiln {
namespace {

const DType kHalves[] = {float16, bfloat16};

// 2^-10 for float16 (11 significant bits), 2^-7 for bfloat16 (8).
double epsilon(DType d) { return d == float16 ? 0x1p-10 : 0x1p-7; }

// Random values exactly representable in dtype.
Tensor half_values(const Shape& shape, uint32_t seed, DType dtype, double scale = 1.0) {
  return astype(tensor(testing::random_values(shape.numel(), seed, -scale, scale), shape), dtype);
}

// got (16-bit) against want32 (float32) rounded to got's dtype; `terms` is the magnitude of
// what was summed to make each element (for cancellation), 0 when nothing cancels.
void expect_rounded(const Tensor& got, const Tensor& want32, DType dtype, double terms,
                    const std::string& what) {
  ASSERT_EQ(got.type(), (TensorType{dtype, want32.shape()})) << what;
  const std::vector<double> g = got.to_vector<double>();
  const std::vector<double> w = astype(astype(want32, dtype), float64).to_vector<double>();
  int bad = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    const double tol = epsilon(dtype) * (std::abs(w[i]) + terms);
    if (!(std::abs(g[i] - w[i]) <= tol) && ++bad <= 3)
      ADD_FAILURE() << what << " " << dtype << " [" << i << "]: " << g[i] << " vs " << w[i];
  }
}

Tensor f32(const Tensor& x) { return astype(x, float32); }

TEST(HalfPrecision, Elementwise) {
  for (DType d : kHalves) {
    const Tensor a = half_values(Shape{300}, 1, d, 3), b = half_values(Shape{300}, 2, d, 3);
    expect_rounded(a + b, f32(a) + f32(b), d, 0, "add");
    expect_rounded(a * b, f32(a) * f32(b), d, 0, "mul");
    expect_rounded(a / b, f32(a) / f32(b), d, 0, "div");
    expect_rounded(exp(a), exp(f32(a)), d, 0, "exp");
    expect_rounded(tanh(a), tanh(f32(a)), d, 0, "tanh");
    expect_rounded(sigmoid(a), sigmoid(f32(a)), d, 0, "sigmoid");
    expect_rounded(log(abs(a)), log(abs(f32(a))), d, 0, "log");
    // Compiled: fused code rounds after each op as eager does.
    const auto chain = [](const Tensor& x, const Tensor& y) { return tanh(x * y + 1.0) * exp(-x); };
    expect_rounded(jit(chain)(a, b), f32(chain(a, b)), d, 0, "jit chain");
  }
}

TEST(HalfPrecision, ReductionsAccumulateInFloat32) {
  for (DType d : kHalves) {
    // 4096 ones: exact in float32; a 16-bit accumulator stops at 256 (bf16) or 2048 (f16).
    const Tensor ones4096 = ones(Shape{4096}, d);
    EXPECT_EQ(sum(ones4096).item<double>(), 4096.0) << d;
    EXPECT_EQ(jit([](const Tensor& x) { return sum(x); })(ones4096).item<double>(), 4096.0) << d;
    EXPECT_EQ(sum(reshape(ones4096, Shape{64, 64}), {0}).to_vector<double>()[5], 64.0) << d;
    EXPECT_EQ(mean(ones4096).item<double>(), 1.0) << d;
    const Tensor x = half_values(Shape{16, 256}, 3, d, 2);
    expect_rounded(sum(x, {1}), sum(f32(x), {1}), d, 2 * 256, "sum");
    expect_rounded(mean(x, {0}), mean(f32(x), {0}), d, 2, "mean");
    expect_rounded(var(x, {1}), var(f32(x), {1}), d, 4, "var");
    expect_rounded(max(x, {1}), max(f32(x), {1}), d, 0, "max");
    expect_rounded(logsumexp(x, {1}), logsumexp(f32(x), {1}), d, 0, "logsumexp");
  }
}

TEST(HalfPrecision, MatmulAndConvComputeInFloat32) {
  for (DType d : kHalves) {
    const Tensor a = half_values(Shape{3, 16, 64}, 4, d), b = half_values(Shape{64, 8}, 5, d);
    expect_rounded(matmul(a, b), matmul(f32(a), f32(b)), d, 64, "matmul");
    expect_rounded(jit([](const Tensor& x, const Tensor& y) { return matmul(x, y); })(a, b),
                   matmul(f32(a), f32(b)), d, 64, "jit matmul");
    const Tensor x = half_values(Shape{2, 3, 9, 9}, 6, d), w = half_values(Shape{4, 3, 3, 3}, 7, d);
    const Conv2dOptions o{.padding = {1, 1}};
    expect_rounded(conv2d(x, w, o), conv2d(f32(x), f32(w), o), d, 27, "conv2d");
  }
}

TEST(HalfPrecision, SoftmaxAndCrossEntropy) {
  for (DType d : kHalves) {
    const Tensor logits = half_values(Shape{8, 100}, 8, d, 6);
    expect_rounded(softmax(logits), softmax(f32(logits)), d, 0, "softmax");
    expect_rounded(log_softmax(logits), log_softmax(f32(logits)), d, 0, "log_softmax");
    const Tensor labels = tensor({1, 5, 99, 0, 42, 7, 63, 2});
    expect_rounded(nn::cross_entropy(logits, labels), nn::cross_entropy(f32(logits), labels), d, 0,
                   "cross_entropy");
  }
}

TEST(HalfPrecision, GradientsOfMatmulAndSoftmax) {
  for (DType d : kHalves) {
    const Tensor x = half_values(Shape{16, 32}, 9, d), w = half_values(Shape{32, 10}, 10, d);
    const Tensor labels = tensor({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2, 3, 4, 5});
    const auto loss = [&](const Tensor& wt) { return nn::cross_entropy(matmul(x, wt), labels); };
    const Tensor g = grad(loss)(w);
    const Tensor g32 = grad(
        [&](const Tensor& wt) { return nn::cross_entropy(matmul(f32(x), wt), labels); })(f32(w));
    // Several rounded intermediates (logits, softmax, the cotangent) feed the gradient: 8 ulps
    // of the largest gradient entry.
    const double scale = max(abs(g32)).item<double>();
    expect_rounded(g, g32, d, 8 * scale, "grad");
  }
}

TEST(HalfPrecision, OptimisersUpdateInFloat32AndRoundOnce) {
  // Three Adam steps on 16-bit parameters equal the steps on their float32 values with float32
  // slots, rounded: b2 = 0.999 is 1.0 in bfloat16, which a 16-bit update would use.
  for (DType d : kHalves) {
    const optim::Optimizer opt = optim::adam({.lr = 0.01});
    std::vector<Tensor> p{half_values(Shape{64}, 11, d)}, p32{f32(p[0])};
    auto s = opt.init(p);
    auto s32 = opt.init(p32);
    for (int k = 0; k < 3; ++k) {
      const Tensor g = half_values(Shape{64}, 12 + static_cast<uint32_t>(k), d);
      std::tie(p, s) = opt.update(p, std::vector<Tensor>{g}, s);
      // The reference keeps float32 parameters and slots, rounded to 16 bits after each step
      // as the 16-bit run stores them.
      std::tie(p32, s32) = opt.update(p32, std::vector<Tensor>{f32(g)}, s32);
      p32[0] = f32(astype(p32[0], d));
      for (auto& [name, slot] : s32.slots) slot[0] = f32(astype(slot[0], d));
    }
    for (const auto& [name, slot] : s.slots) EXPECT_EQ(slot[0].dtype(), d) << name;
    expect_rounded(p[0], p32[0], d, 0, "adam parameters");
    expect_rounded(s.slots.at("nu")[0], s32.slots.at("nu")[0], d, 0, "adam nu");
  }
}

TEST(HalfPrecision, MixedPrecisionGradientsReachFloat32MasterWeights) {
  // The recipe of docs/NN.md: float32 parameters, the forward pass cast to bfloat16, the loss
  // in float32. The gradient comes back through astype as float32.
  const Tensor w = f32(tensor(testing::random_values(32 * 10, 13), Shape{32, 10}));
  const Tensor x = half_values(Shape{16, 32}, 14, bfloat16);
  const Tensor labels = tensor({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2, 3, 4, 5});
  const auto loss = [&](const Tensor& master) {
    const Tensor logits = matmul(x, astype(master, bfloat16));
    return nn::cross_entropy(astype(logits, float32), labels);
  };
  const Tensor g = grad(loss)(w);
  EXPECT_EQ(g.dtype(), float32);
  const Tensor g32 = grad([&](const Tensor& master) {
    return nn::cross_entropy(matmul(f32(x), master), labels);
  })(f32(astype(w, bfloat16)));
  const double scale = max(abs(g32)).item<double>();
  expect_rounded(astype(g, bfloat16), g32, bfloat16, 8 * scale, "mixed-precision grad");
  // tree_norm of 16-bit leaves is a float32.
  EXPECT_EQ(tree_norm(std::vector<Tensor>{x}).dtype(), float32);
}

// ---- loss scaling ---------------------------------------------------------------------------

TEST(LossScaler, KeepsSmallFloat16GradientsFromFlushingToZero) {
  // d/dw of sum((w * x) * c) is c * x ~ 1e-8, below half of float16's smallest subnormal
  // (2^-24 ~ 6e-8), so it flushes to 0 in a float16 backward pass; scaled by 2^15 it is a
  // normal float16 (~3e-4), and unscaled in float32 it is c * x again.
  const Tensor w = ones(Shape{8});
  const Tensor x = astype(tensor(testing::random_values(8, 15, 0.01, 0.02)), float16);
  const Tensor c = astype(tensor(1e-6), float16);
  const auto loss = [&](const Tensor& master) {
    return astype(sum((astype(master, float16) * x) * c), float32);
  };
  EXPECT_EQ(max(abs(grad(loss)(w))).item<float>(), 0.0f);
  const optim::LossScaler scaler({.init_scale = 32768});
  const optim::LossScale state = scaler.init();
  const Tensor scaled = grad([&](const Tensor& m) { return scaler.scale(loss(m), state); })(w);
  auto [g, finite] = scaler.unscale(scaled, state);
  EXPECT_TRUE(finite.item<bool>());
  const std::vector<double> got = g.to_vector<double>(), xs = x.to_vector<double>();
  const double cv = c.item<double>();
  for (std::size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], cv * xs[i], 2e-3 * cv * xs[i]);
}

TEST(LossScaler, SkipsOverflowingStepsAndAdjustsTheScale) {
  const optim::LossScaler scaler({.init_scale = 1024, .growth_interval = 2});
  optim::LossScale s = scaler.init();
  EXPECT_EQ(s.scale.type(), (TensorType{float32, Shape{}}));
  const std::vector<Tensor> params{tensor({1.0f, 2.0f})};
  // An overflowed gradient: not finite, the step is not taken, the scale halves.
  auto [bad, bad_finite] = scaler.unscale(std::vector<Tensor>{tensor({INFINITY, 1.0f})}, s);
  EXPECT_FALSE(bad_finite.item<bool>());
  const std::vector<Tensor> stepped{params[0] - 0.1f * bad[0]};
  const std::vector<Tensor> kept = optim::select(bad_finite, stepped, params);
  EXPECT_EQ(kept[0].to_vector<float>(), (std::vector<float>{1.0f, 2.0f}));
  s = scaler.update(s, bad_finite);
  EXPECT_EQ(s.scale.item<float>(), 512.0f);
  // Finite steps: the gradients are divided by the scale; after 2 of them the scale doubles.
  auto [good, good_finite] = scaler.unscale(std::vector<Tensor>{tensor({512.0f, -1024.0f})}, s);
  EXPECT_TRUE(good_finite.item<bool>());
  EXPECT_EQ(good[0].to_vector<float>(), (std::vector<float>{1.0f, -2.0f}));
  s = scaler.update(s, good_finite);
  EXPECT_EQ(s.scale.item<float>(), 512.0f);
  EXPECT_EQ(s.good_steps.item<int32_t>(), 1);
  s = scaler.update(s, good_finite);
  EXPECT_EQ(s.scale.item<float>(), 1024.0f);
  EXPECT_EQ(s.good_steps.item<int32_t>(), 0);
  // The same under jit.
  const auto step = jit([&](const optim::LossScale& st, const Tensor& g) {
    auto [u, finite] = scaler.unscale(std::vector<Tensor>{g}, st);
    return scaler.update(st, finite);
  });
  EXPECT_EQ(step(s, tensor({NAN})).scale.item<float>(), 512.0f);
  testing::expect_error([] { optim::LossScaler({.backoff_factor = 1.5}); }, "optim.loss_scale",
                        {"backoff_factor", "1.5"});
  testing::expect_error([] { optim::LossScaler({.init_scale = 0}); }, "optim.loss_scale",
                        {"init_scale"});
}

}  // namespace
}  // namespace kiln
