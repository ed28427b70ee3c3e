// Channel-blocked images, [N, C/b, H, W, b] (docs/DESIGN.md, "Channel-blocked values"): every
// primitive's ChannelBlocked rule against its own kernel, bit for bit, in every layout its
// operands may take, blocks of 8 and 16; the transposes and block kernels of 2x2 pooling on
// every instruction set; and compiled training steps that keep images blocked between
// convolutions against the interpreter.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "kiln/kiln.h"
#include "kiln/nn.h"
#include "math/vector_math.h"
#include "ops/conv_dnnl.h"
#include "ops/pool_direct.h"
#include "testing.h"

namespace {

using namespace kiln;
using Blocked = Primitive::ChannelBlocked;
using kiln::testing::blocked_outputs;
using kiln::testing::Threads;

Tensor image(const Shape& s, unsigned seed) { return random::normal(random::key(seed), s); }

// Max pooling's input with ties (values rounded to halves) and NaN in some windows.
Tensor pooled_input(const Shape& s, unsigned seed) {
  std::vector<float> v = image(s, seed).to_vector<float>();
  for (std::size_t i = 0; i < v.size(); ++i) {
    v[i] = std::round(v[i] * 2) / 2;
    if (i % 37 == 5) v[i] = NAN;
  }
  return tensor(v, s);
}

// The reference layouts, written out: element (n, c, h, w) of [N, C, H, W] at
// ((n·C/b + c/b)·H·W + h·W + w)·b + c % b.
Tensor to_blocked(const Tensor& t, int64_t b) {
  const Shape& s = t.shape();
  const std::vector<float> in = t.contiguous().to_vector<float>();
  std::vector<float> out(in.size());
  const int64_t C = s[1], HW = s[2] * s[3];
  for (int64_t n = 0; n < s[0]; ++n)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t p = 0; p < HW; ++p)
        out[static_cast<std::size_t>(((n * C / b + c / b) * HW + p) * b + c % b)] =
            in[static_cast<std::size_t>((n * C + c) * HW + p)];
  return tensor(out, s);
}
Tensor from_blocked(const Tensor& t, int64_t b) {
  const Shape& s = t.shape();
  const std::vector<float> in = t.to_vector<float>();
  std::vector<float> out(in.size());
  const int64_t C = s[1], HW = s[2] * s[3];
  for (int64_t n = 0; n < s[0]; ++n)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t p = 0; p < HW; ++p)
        out[static_cast<std::size_t>((n * C + c) * HW + p)] =
            in[static_cast<std::size_t>(((n * C / b + c / b) * HW + p) * b + c % b)];
  return tensor(out, s);
}

void expect_same_bits(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  const std::vector<float> g = got.to_vector<float>(), w = want.to_vector<float>();
  for (std::size_t i = 0; i < g.size(); ++i)
    ASSERT_EQ(std::bit_cast<uint32_t>(g[i]), std::bit_cast<uint32_t>(w[i]))
        << what << ": element " << i << " is " << g[i] << ", expected " << w[i];
}

Attrs conv_attrs() {
  return {{"stride", std::vector<int64_t>{1, 1}},
          {"padding", std::vector<int64_t>{1, 1}},
          {"dilation", std::vector<int64_t>{1, 1}},
          {"groups", int64_t{1}}};
}
Attrs with(Attrs a, const char* name, std::vector<int64_t> v) {
  a.set(name, std::move(v));
  return a;
}
Attrs pool_attrs() {
  return {{"kernel", std::vector<int64_t>{2, 2}},
          {"stride", std::vector<int64_t>{2, 2}},
          {"padding", std::vector<int64_t>{0, 0}}};
}

struct Case {
  std::vector<Tensor> inputs;
  Attrs attrs;
};

// One case per primitive with a ChannelBlocked rule: 16 and 32 channels, both block sizes
// dividing them; odd image sides, whose last row and column 2x2 pooling leaves out.
std::map<std::string, Case> cases() {
  const Tensor x = image({2, 16, 7, 9}, 1), w = image({32, 16, 3, 3}, 2),
               dy = image({2, 32, 7, 9}, 3);
  const Tensor px = pooled_input({3, 32, 9, 7}, 4), pdy = image({3, 32, 4, 3}, 5);
  return {
      {"conv", {{x, w}, conv_attrs()}},
      {"conv_input_grad", {{dy, w}, with(conv_attrs(), "input_size", {7, 9})}},
      {"conv_weight_grad", {{dy, x}, with(conv_attrs(), "kernel_size", {3, 3})}},
      {"max_pool2d", {{px}, pool_attrs()}},
      {"max_pool2d_grad", {{px, pdy}, pool_attrs()}},
  };
}

TEST(ChannelBlocked, EveryRuleGivesItsKernelsBitsInEveryLayout) {
  const std::map<std::string, Case> table = cases();
  int rules = 0;
  for (const Primitive* p : all_primitives()) {
    if (!p->channel_blocked) continue;
    ++rules;
    const auto it = table.find(p->name);
    ASSERT_NE(it, table.end()) << p->name << " has a ChannelBlocked rule but no case here";
    const Blocked& rule = *p->channel_blocked;
    const Case& c = it->second;
    const Tensor want = bind1(*p, c.inputs, c.attrs);
    std::vector<TensorType> types;
    for (const Tensor& t : c.inputs) types.push_back(t.type());
    for (const int64_t b : {8, 16}) {
      ASSERT_TRUE(rule.applies(types, c.attrs, b)) << p->name << " in blocks of " << b;
      // Every subset of the inputs that may be blocked, with the output either way.
      const auto subsets = int64_t{1} << rule.inputs.size();
      for (int64_t mask = 0; mask < subsets; ++mask)
        for (const bool out_blocked : {false, true}) {
          if (out_blocked && !rule.output) continue;
          Blocked::Call call{.block = b, .inputs = {}, .output = out_blocked};
          std::vector<Tensor> ins = c.inputs;
          for (std::size_t k = 0; k < rule.inputs.size(); ++k)
            if (mask >> k & 1) {
              call.inputs.push_back(rule.inputs[k]);
              ins[static_cast<std::size_t>(rule.inputs[k])] =
                  to_blocked(ins[static_cast<std::size_t>(rule.inputs[k])], b);
            }
          const Tensor out = empty(want.type());
          rule.write(ins, call, out, c.attrs);
          expect_same_bits(out_blocked ? from_blocked(out, b) : out, want,
                           p->name + " in blocks of " + std::to_string(b) + ", inputs mask " +
                               std::to_string(mask) + (out_blocked ? ", output blocked" : ""));
        }
    }
  }
  EXPECT_EQ(rules, static_cast<int>(table.size())) << "a case here for a rule that is gone";
}

TEST(ChannelBlocked, RulesDeclineWhatTheyCannotLayOut) {
  const Primitive& conv = primitive("conv");
  const Primitive& pool = primitive("max_pool2d");
  auto takes = [](const Primitive& p, std::vector<TensorType> in, const Attrs& a, int64_t b) {
    return p.channel_blocked->applies(in, a, b);
  };
  const TensorType x{float32, {2, 16, 8, 8}}, w{float32, {32, 16, 3, 3}};
  EXPECT_TRUE(takes(conv, {x, w}, conv_attrs(), 16));
  EXPECT_FALSE(takes(conv, {{float32, {2, 24, 8, 8}}, {float32, {32, 24, 3, 3}}}, conv_attrs(), 16))
      << "channels no multiple of the block";
  EXPECT_FALSE(takes(conv, {{float64, {2, 16, 8, 8}}, {float64, {32, 16, 3, 3}}}, conv_attrs(), 16))
      << "float64 runs Kiln's own kernels";
  EXPECT_FALSE(takes(conv, {{float32, {2, 1, 8, 8}}, {float32, {16, 1, 3, 3}}}, conv_attrs(), 1))
      << "a single-channel input runs the direct kernels";
  Attrs grouped = conv_attrs();
  grouped.set("groups", int64_t{2});
  EXPECT_FALSE(takes(conv, {x, {float32, {32, 8, 3, 3}}}, grouped, 16)) << "grouped";
  EXPECT_FALSE(takes(conv, {{float32, {2, 16, 8}}, {float32, {32, 16, 3}}},
                     {{"stride", std::vector<int64_t>{1}},
                      {"padding", std::vector<int64_t>{1}},
                      {"dilation", std::vector<int64_t>{1}},
                      {"groups", int64_t{1}}},
                     16))
      << "1-d";
  EXPECT_TRUE(takes(pool, {x}, pool_attrs(), 16));
  Attrs three = pool_attrs();
  three.set("kernel", std::vector<int64_t>{3, 3});
  EXPECT_FALSE(takes(pool, {x}, three, 16)) << "a window other than 2x2";
  EXPECT_FALSE(takes(pool, {{float32, {2, 12, 8, 8}}}, pool_attrs(), 8)) << "12 channels";
}

// The transposes and block kernels of 2x2 pooling on every instruction set the CPU has, against
// the reference layouts and the plane kernels.
TEST(ChannelBlocked, PoolingKernelsAgreeOnEveryInstructionSet) {
  using math::Isa;
  for (const Isa isa : {Isa::sse4, Isa::avx2, Isa::avx512}) {
    if (isa > math::detected_isa()) continue;
    for (const int64_t b : {4, 8, 16})
      for (const auto& [H, W] : std::vector<std::pair<int64_t, int64_t>>{{9, 7}, {8, 8}, {2, 33}}) {
        const ops::Planes2x2 g{H, W};
        const Tensor x = pooled_input({1, b, H, W}, 7), dy = image({1, b, H / 2, W / 2}, 8);
        const std::string at = "b=" + std::to_string(b) + " " + std::to_string(H) + "x" +
                               std::to_string(W) + " at isa " +
                               std::to_string(static_cast<int>(isa));
        // Transposes, both ways.
        Tensor block = empty(x.type()), back = empty(x.type());
        ops::channels_to_block(x.data<const float>(), H * W, b, block.data<float>(), isa);
        expect_same_bits(block, to_blocked(x, b), "channels_to_block " + at);
        ops::block_to_channels(block.data<const float>(), H * W, b, back.data<float>(), isa);
        expect_same_bits(back, x, "block_to_channels " + at);
        // The block kernels against the plane kernels.
        const Tensor y = empty(dy.type()), yb = empty(dy.type());
        ops::max_pool_2x2(g, x.data<const float>(), y.data<float>(), 0, b, isa);
        ops::max_pool_2x2_block(g, b, block.data<const float>(), yb.data<float>(), isa);
        expect_same_bits(from_blocked(yb, b), y, "max_pool_2x2_block " + at);
        const Tensor dx = empty(x.type()), dxb = empty(x.type());
        ops::max_pool_2x2_grad(g, x.data<const float>(), dy.data<const float>(), dx.data<float>(),
                               0, b, isa);
        ops::max_pool_2x2_block_grad(g, b, block.data<const float>(),
                                     to_blocked(dy, b).data<const float>(), dxb.data<float>(), isa);
        expect_same_bits(from_blocked(dxb, b), dx, "max_pool_2x2_block_grad " + at);
      }
  }
}

const JitOptions kCompiled{.name = "compiled", .backend = ir::Backend::llvm};
const JitOptions kInterpreted{.name = "interpreted", .backend = ir::Backend::interpreter};

// A CNN's loss: conv (C -> 32, 3x3) + bias, relu, 2x2 pool, conv (32 -> 32) + bias, relu, pool,
// a dense layer. Its inner images are what compiled code keeps blocked.
Tensor cnn_loss(const Tensor& w1, const Tensor& b1, const Tensor& w2, const Tensor& b2,
                const Tensor& w3, const Tensor& x) {
  const Conv2dOptions same{.padding = {1, 1}};
  auto layer = [&](const Tensor& in, const Tensor& w, const Tensor& b) {
    return max_pool2d(nn::relu(conv2d(in, w, same) + reshape(b, {1, b.shape()[0], 1, 1})));
  };
  const Tensor h = layer(layer(x, w1, b1), w2, b2);
  const Tensor flat = reshape(h, {h.shape()[0], h.shape()[1] * h.shape()[2] * h.shape()[3]});
  return mean(square(matmul(flat, w3)));
}

struct CnnCase {
  std::vector<Tensor> args;  // w1, b1, w2, b2, w3, x
};
CnnCase cnn_case(int64_t C, int64_t H, int64_t W) {
  const int64_t flat = 32 * (H / 4) * (W / 4);
  return {{image({32, C, 3, 3}, 11) * 0.3f, image({32}, 12) * 0.1f,
           image({32, 32, 3, 3}, 13) * 0.1f, image({32}, 14) * 0.1f, image({flat, 10}, 15) * 0.05f,
           image({4, C, H, W}, 16)}};
}

auto cnn_step(const JitOptions& o) {
  return jit(value_and_grad(cnn_loss, argnums<0, 1, 2, 3, 4>), o);
}

// The compiled step keeps the second convolution's images blocked (its input, output and their
// gradients, through the bias-relu groups and the poolings), with the interpreter's bits, on 1
// to 3 threads (3 splits the relu backward's rows, whose bias gradient is a total, inside a
// channel block). The test also runs with KILN_ISA below the host's (tests/CMakeLists.txt),
// where a block of 16 channels takes several vectors, or scalars.
TEST(ChannelBlocked, CompiledTrainingStepKeepsImagesBlockedWithTheInterpretersBits) {
  const std::optional<int64_t> block = ops::dnnl_channel_block();
  if (!block) GTEST_SKIP() << "oneDNN lays images out plainly on this machine";
  for (const auto& [C, threads] :
       std::vector<std::pair<int64_t, int>>{{16, 1}, {16, 2}, {16, 3}, {1, 2}}) {
    SCOPED_TRACE("input channels " + std::to_string(C) + ", threads " + std::to_string(threads));
    const Threads scope(threads);
    const CnnCase c = cnn_case(C, 12, 20);
    auto compiled = cnn_step(kCompiled);
    const auto& a = c.args;
    const ir::CompiledInfo info = compiled.compiled(a[0], a[1], a[2], a[3], a[4], a[5]);
    const ir::Function lowered = compiled.lower(a[0], a[1], a[2], a[3], a[4], a[5]);
    // Which primitives make the blocked values.
    std::map<std::string, int> made;
    for (const ir::Equation& e : lowered.equations)
      for (const ir::Value& v : e.outputs)
        if (std::count(info.channel_blocked.begin(), info.channel_blocked.end(), v.id))
          ++made[std::string(e.prim->name)];
    EXPECT_EQ(made["conv"], C == 16 ? 2 : 1) << info;
    EXPECT_EQ(made["conv_input_grad"], 1) << info;
    EXPECT_EQ(made["max_pool2d"], 1) << "the first pooling, the second convolution's input\n"
                                     << info;
    EXPECT_EQ(made["max_pool2d_grad"], C == 16 ? 2 : 1) << info;
    const auto [l, g] = compiled(a[0], a[1], a[2], a[3], a[4], a[5]);
    const auto [li, gi] = cnn_step(kInterpreted)(a[0], a[1], a[2], a[3], a[4], a[5]);
    expect_same_bits(l, li, "loss");
    const std::vector<Tensor> got = {std::get<0>(g), std::get<1>(g), std::get<2>(g), std::get<3>(g),
                                     std::get<4>(g)},
                              want = {std::get<0>(gi), std::get<1>(gi), std::get<2>(gi),
                                      std::get<3>(gi), std::get<4>(gi)};
    for (std::size_t k = 0; k < got.size(); ++k)
      expect_same_bits(got[k], want[k], "gradient " + std::to_string(k));
  }
}

// A sum over every element of a blocked image (the rows' totals add each channel block's lanes
// into one slot, in order) and over its channels per image, compiled against the interpreter.
TEST(ChannelBlocked, SumsOverBlockedImagesHaveTheInterpretersBits) {
  const std::optional<int64_t> block = ops::dnnl_channel_block();
  if (!block) GTEST_SKIP() << "oneDNN lays images out plainly on this machine";
  const Tensor x = image({3, 16, 16, 16}, 31), w = image({32, 16, 3, 3}, 32) * 0.2f,
               b = image({32}, 33);
  auto loss = [](const Tensor& x, const Tensor& w, const Tensor& b) {
    const Tensor y = nn::relu(conv2d(x, w, {.padding = {1, 1}}) + reshape(b, {1, 32, 1, 1}));
    return sum(max_pool2d(y)) + sum(square(y)) * 0.5f;
  };
  for (const int threads : {1, 2, 3}) {
    SCOPED_TRACE("threads " + std::to_string(threads));
    const Threads scope(threads);
    auto compiled = jit(value_and_grad(loss, argnums<0, 1, 2>), kCompiled);
    EXPECT_EQ(blocked_outputs(compiled, "conv", x, w, b), 1) << "the sums' image is not blocked";
    const auto [l, g] = compiled(x, w, b);
    const auto [li, gi] = jit(value_and_grad(loss, argnums<0, 1, 2>), kInterpreted)(x, w, b);
    expect_same_bits(l, li, "loss");
    expect_same_bits(std::get<0>(g), std::get<0>(gi), "dx");
    expect_same_bits(std::get<1>(g), std::get<1>(gi), "dw");
    expect_same_bits(std::get<2>(g), std::get<2>(gi), "db");
  }
  // A row group's total of an inner node: per pixel, a sum over the images and channels (the
  // lanes, kept indices, add into one slot each), beside each image's channel means.
  auto centred = [](const Tensor& x, const Tensor& w) {
    const Tensor y = conv2d(x, w, {.padding = {1, 1}});
    return std::pair{max_pool2d(y - mean(y, {2, 3}, true)), sum(y * y, {0, 1})};
  };
  for (const int threads : {1, 2, 3}) {
    SCOPED_TRACE("threads " + std::to_string(threads));
    const Threads scope(threads);
    EXPECT_EQ(blocked_outputs(jit(centred, kCompiled), "conv", x, w), 1)
        << "the centred image is not blocked";
    const auto [p, q] = jit(centred, kCompiled)(x, w);
    const auto [pi, qi] = jit(centred, kInterpreted)(x, w);
    expect_same_bits(p, pi, "the pooled centred images");
    expect_same_bits(q, qi, "the per-pixel sums");
  }
}

// KILN_CHANNEL_BLOCKS=0 (a ctest entry of its own) keeps every image plain, with the same bits.
TEST(ChannelBlocked, TheEnvironmentTurnsItOff) {
  const char* v = std::getenv("KILN_CHANNEL_BLOCKS");
  if (!v || std::string(v) != "0") GTEST_SKIP() << "run with KILN_CHANNEL_BLOCKS=0";
  EXPECT_FALSE(ops::dnnl_channel_block().has_value());
  const CnnCase c = cnn_case(16, 12, 20);
  const auto& a = c.args;
  auto compiled = cnn_step(kCompiled);
  EXPECT_TRUE(compiled.compiled(a[0], a[1], a[2], a[3], a[4], a[5]).channel_blocked.empty());
  const auto [l, g] = compiled(a[0], a[1], a[2], a[3], a[4], a[5]);
  const auto [li, gi] = cnn_step(kInterpreted)(a[0], a[1], a[2], a[3], a[4], a[5]);
  expect_same_bits(l, li, "loss");
  expect_same_bits(std::get<2>(g), std::get<2>(gi), "the second convolution's weight gradient");
}

// Images whose channels are no multiple of the block, or that the caller receives, stay plain.
TEST(ChannelBlocked, ResultsAndUnevenChannelsStayPlain) {
  const std::optional<int64_t> block = ops::dnnl_channel_block();
  if (!block) GTEST_SKIP() << "oneDNN lays images out plainly on this machine";
  const Tensor x = image({2, 16, 8, 8}, 21), w = image({*block * 2 + 4, 16, 3, 3}, 22);
  auto conv_relu = [](const Tensor& x, const Tensor& w) {
    return nn::relu(conv2d(x, w, {.padding = {1, 1}}));
  };
  EXPECT_TRUE(jit(conv_relu, kCompiled).compiled(x, w).channel_blocked.empty())
      << "channels no multiple of the block";
  const Tensor w16 = image({32, 16, 3, 3}, 23);
  auto returned = [](const Tensor& x, const Tensor& w) {
    const Tensor y = conv2d(x, w, {.padding = {1, 1}});
    return std::pair{y, max_pool2d(nn::relu(y))};
  };
  const ir::CompiledInfo info = jit(returned, kCompiled).compiled(x, w16);
  const ir::Function lowered = jit(returned, kCompiled).lower(x, w16);
  EXPECT_EQ(
      std::count(info.channel_blocked.begin(), info.channel_blocked.end(), lowered.results[0].id),
      0)
      << info;
  const auto [y, p] = jit(returned, kCompiled)(x, w16);
  const auto [yi, pi] = jit(returned, kInterpreted)(x, w16);
  expect_same_bits(y, yi, "the returned convolution");
  expect_same_bits(p, pi, "its pooling");
}

}  // namespace
