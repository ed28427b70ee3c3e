// The GPT of examples/support/gpt_model.h (make demo-gpt's model): gradients of a tiny
// configuration against central finite differences in float64, the compiled step against the
// interpreter, and the key/value cache's logits against the whole-sequence forward at every
// position, with generation under jit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "../examples/support/gpt_model.h"
#include "kiln/kiln.h"
#include "testing.h"

using namespace kiln;

namespace {

const gpt::Config kTiny{.layers = 2, .heads = 2, .d_model = 8, .block_size = 6, .vocab = 256};

gpt::Model as_f64(const gpt::Model& m) {
  return tree_map([](const Tensor& t) { return astype(t, float64); }, m);
}

// Tokens [B, T] drawn from a fixed key.
Tensor tokens(int64_t B, int64_t T, uint64_t seed) {
  return random::randint(random::key(seed), {B, T}, 0, 256, int64);
}

TEST(GptModel, GradientsMatchCentralDifferencesInFloat64) {
  const gpt::Model m = as_f64(gpt::init(kTiny, random::key(1)));
  const Tensor x = tokens(2, 5, 2), y = tokens(2, 5, 3);
  const auto f = [&](const gpt::Model& p) { return gpt::loss(p, x, y); };
  const gpt::Model g = grad(f)(m);
  auto [leaves, def] = tree_flatten(m);
  const std::vector<Tensor> grads = tree_leaves(g);
  ASSERT_EQ(leaves.size(), grads.size());
  // Every leaf, at a few of its elements (the first, the middle and the last).
  for (std::size_t i = 0; i < leaves.size(); ++i) {
    const int64_t n = leaves[i].numel();
    for (int64_t j : {int64_t{0}, n / 2, n - 1}) {
      auto shifted = [&](double h) {
        std::vector<Tensor> l = leaves;
        std::vector<double> v = l[i].to_vector<double>();
        v[static_cast<std::size_t>(j)] += h;
        l[i] = tensor(v, l[i].shape());
        return f(tree_unflatten<gpt::Model>(def, l)).item<double>();
      };
      const double h = 1e-6, fd = (shifted(h) - shifted(-h)) / (2 * h);
      const double got = grads[i].to_vector<double>()[static_cast<std::size_t>(j)];
      EXPECT_NEAR(got, fd, 1e-6 + 1e-5 * std::abs(fd)) << "leaf " << i << " element " << j;
    }
  }
}

TEST(GptModel, TheCompiledGradientEqualsTheInterpreters) {
  const gpt::Model m = gpt::init(kTiny, random::key(4));
  const Tensor x = tokens(3, 6, 5), y = tokens(3, 6, 6);
  const auto f = [](const gpt::Model& p, const Tensor& a, const Tensor& b) {
    return value_and_grad([&](const gpt::Model& q) { return gpt::loss(q, a, b); })(p);
  };
  const auto [l1, g1] = jit(f, JitOptions{.backend = ir::Backend::llvm})(m, x, y);
  const auto [l2, g2] = jit(f, JitOptions{.backend = ir::Backend::interpreter})(m, x, y);
  kiln::testing::expect_allclose(l1, l2, {.rtol = 1e-6, .atol = 1e-7});
  const std::vector<Tensor> a = tree_leaves(g1), b = tree_leaves(g2);
  for (std::size_t i = 0; i < a.size(); ++i)
    kiln::testing::expect_allclose(a[i], b[i], {.rtol = 1e-4, .atol = 1e-6},
                                   "leaf " + std::to_string(i));
}

TEST(GptModel, TheCacheGivesTheWholeSequencesLogitsAtEveryPosition) {
  const gpt::Model m = gpt::init(kTiny, random::key(7));
  const Tensor x = tokens(2, kTiny.block_size, 8);
  const std::vector<float> want = gpt::logits(m, x).to_vector<float>();  // [2, T, 256]
  gpt::KvCache cache = gpt::empty_cache(m, 2);
  for (int64_t t = 0; t < kTiny.block_size; ++t) {
    const Tensor column = reshape(slice(x, {Slice(), Slice(t, t + 1)}), {2});
    // Reading the whole cache, and only the positions up to t.
    auto [z, next] = gpt::decode_step(m, cache, column, tensor(t));
    const Tensor z_span = gpt::decode_step(m, cache, column, tensor(t), t + 1).first;
    cache = next;
    for (const Tensor& logits : {z, z_span}) {
      const std::vector<float> got = logits.to_vector<float>();  // [2, 256]
      for (int64_t b = 0; b < 2; ++b)
        for (int64_t v = 0; v < 256; ++v)
          EXPECT_NEAR(got[static_cast<std::size_t>(b * 256 + v)],
                      want[static_cast<std::size_t>((b * kTiny.block_size + t) * 256 + v)], 1e-5)
              << "position " << t << ", sequence " << b << ", token " << v;
    }
  }
  const Tensor column = tensor(std::vector<int64_t>{1, 2}, {2});
  for (const int64_t bad : {int64_t{0}, kTiny.block_size + 1})
    EXPECT_THROW((void)gpt::decode_step(m, cache, column, tensor(int64_t{0}), bad), Error) << bad;
}

// generate runs a loop per span of positions, each reading the cache up to its span's end: it
// draws the tokens that decode_step over the whole cache gives, a token at a time, with the
// same keys. The logits may differ in the order of the attention's sums, so the weights are
// scaled for logits far enough apart that no draw hangs on a rounding; many sequences, so
// that a key left unread at a span's last position changes some draw.
TEST(GptModel, GenerationOverSeveralSpansDrawsWhatTheWholeCacheDoes) {
  gpt::Config c = kTiny;
  c.block_size = 2 * gpt::kFirstGenerationSpan + 8;  // three spans
  const gpt::Model m =
      tree_map([](const Tensor& t) { return t * 20.0f; }, gpt::init(c, random::key(12)));
  constexpr int64_t B = 32, P = 2;
  const int64_t T = c.block_size, n = T - P;
  const gpt::Sampling sampling{.temperature = 1.0};
  const Tensor prompt = tokens(B, P, 13), key = random::key(14);
  const auto gen = [&](const gpt::Model& p, const Tensor& pr, const Tensor& k) {
    return gpt::generate(p, pr, n, sampling, k);
  };
  const std::vector<int64_t> got = jit(gen)(m, prompt, key).to_vector<int64_t>();  // [B, T]
  std::vector<int64_t> want = concatenate({prompt, zeros({B, n}, int64)}, 1).to_vector<int64_t>();
  auto at = [&](int64_t b, int64_t t) -> int64_t& {
    return want[static_cast<std::size_t>(b * T + t)];
  };
  const Tensor keys = random::split(key, T);
  gpt::KvCache cache = gpt::empty_cache(m, B);
  for (int64_t t = 0; t + 1 < T; ++t) {
    std::vector<int64_t> column;
    for (int64_t b = 0; b < B; ++b) column.push_back(at(b, t));
    auto [z, next] = gpt::decode_step(m, cache, tensor(column, {B}), tensor(t));
    cache = next;
    if (t + 1 < P) continue;
    const std::vector<int64_t> drawn = gpt::pick(z, sampling, index(keys, t)).to_vector<int64_t>();
    for (int64_t b = 0; b < B; ++b) at(b, t + 1) = drawn[static_cast<std::size_t>(b)];
  }
  const auto first = std::mismatch(got.begin(), got.end(), want.begin()).first - got.begin();
  EXPECT_EQ(first, static_cast<std::ptrdiff_t>(got.size()))
      << "first differing token: sequence " << first / T << ", position " << first % T;
}

TEST(GptModel, GenerationKeepsThePromptAndIsTheSameCompiled) {
  const gpt::Model m = gpt::init(kTiny, random::key(9));
  const Tensor prompt = tokens(2, 2, 10), key = random::key(11);
  const gpt::Sampling sampling{.temperature = 1.0, .top_k = 3};
  const auto gen = [&](const gpt::Model& p, const Tensor& pr, const Tensor& k) {
    return gpt::generate(p, pr, 4, sampling, k);
  };
  const Tensor eager = gen(m, prompt, key), compiled = jit(gen)(m, prompt, key);
  ASSERT_EQ(eager.shape(), Shape({2, 6}));
  EXPECT_EQ(eager.to_vector<int64_t>(), compiled.to_vector<int64_t>());
  const std::vector<int64_t> out = eager.to_vector<int64_t>(), p = prompt.to_vector<int64_t>();
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t t = 0; t < 2; ++t)
      EXPECT_EQ(out[static_cast<std::size_t>(b * 6 + t)], p[static_cast<std::size_t>(b * 2 + t)]);
  // Greedy: each new token is the argmax of the whole sequence's logits before it.
  const std::vector<int64_t> greedy =
      gpt::generate(m, prompt, 4, {.temperature = 0}, key).to_vector<int64_t>();
  const std::vector<float> z =
      gpt::logits(m, tensor(greedy, {2, 6})).to_vector<float>();  // [2, 6, 256]
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t t = 1; t < 5; ++t) {
      const float* row = z.data() + (b * 6 + t) * 256;
      EXPECT_EQ(greedy[static_cast<std::size_t>(b * 6 + t + 1)],
                std::max_element(row, row + 256) - row)
          << "sequence " << b << ", position " << t + 1;
    }
}

}  // namespace
