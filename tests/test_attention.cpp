// nn::scaled_dot_product_attention, nn::attention_weights and nn::MultiheadAttention.
//
// Values and gradients against PyTorch 1.13 (tests/reference/attention_ref.py: the math path
// of F.scaled_dot_product_attention written out, and torch.nn.MultiheadAttention with its
// weights stored and loaded here), gradients against float64 finite differences, jit and vmap
// against eager, the masks (causal, padding, fully masked rows), dropout and the errors.
#include <gtest/gtest.h>
#include <kiln/kiln.h>

#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "nn_checks.h"
#include "testing.h"
#include "tree_testing.h"

namespace kiln {
namespace {

using kiln::testing::expect_allclose;
using kiln::testing::expect_grad_matches_fd;
using kiln::testing::expect_tree_allclose;

using nn_checks::tol_of;
using testing::expect_error;
using QKV = std::tuple<Tensor, Tensor, Tensor>;

const io::TensorFile& refs() {
  static const io::TensorFile file = testing::reference("attention");
  return file;
}
Tensor stored(const std::string& name, DType dtype = float64) {
  return nn_checks::ref_in(refs(), name, dtype);
}

// The options of one reference case: the masks it stored, and its flags.
nn::AttentionOptions case_options(const std::string& name, DType dtype) {
  nn::AttentionOptions o;
  const io::TensorFile& file = refs();
  if (file.find(name + "/attn_mask")) o.attn_mask = stored(name + "/attn_mask", dtype);
  if (file.find(name + "/key_padding_mask"))
    o.key_padding_mask = stored(name + "/key_padding_mask", dtype);
  o.is_causal = name.find("causal") != std::string::npos;
  if (name == "sdpa_scale") o.scale = 0.7;
  return o;
}

void check_sdpa_case(const std::string& name, DType dtype) {
  SCOPED_TRACE(name + " " + std::string(dtype_name(dtype)));
  const nn::AttentionOptions o = case_options(name, dtype);
  const QKV qkv{stored(name + "/q", dtype), stored(name + "/k", dtype), stored(name + "/v", dtype)};
  const auto& [q, k, v] = qkv;
  const double tol = tol_of(dtype);
  expect_allclose(nn::scaled_dot_product_attention(q, k, v, o), stored(name + "/out"),
                  {.rtol = tol, .atol = tol}, "out");
  expect_allclose(nn::attention_weights(q, k, o), stored(name + "/weights"),
                  {.rtol = tol, .atol = tol}, "weights");
  const Tensor cot = stored(name + "/cot", dtype);
  const QKV g = grad([&](const QKV& in) {
    const auto& [a, b, c] = in;
    return sum(nn::scaled_dot_product_attention(a, b, c, o) * cot);
  })(qkv);
  expect_allclose(std::get<0>(g), stored(name + "/grad_q"), {.rtol = 10 * tol, .atol = 10 * tol},
                  "grad q");
  expect_allclose(std::get<1>(g), stored(name + "/grad_k"), {.rtol = 10 * tol, .atol = 10 * tol},
                  "grad k");
  expect_allclose(std::get<2>(g), stored(name + "/grad_v"), {.rtol = 10 * tol, .atol = 10 * tol},
                  "grad v");
}

const std::vector<std::string> kSdpaCases{"sdpa_plain",      "sdpa_broadcast",   "sdpa_scale",
                                          "sdpa_causal",     "sdpa_causal_rect", "sdpa_bool_mask",
                                          "sdpa_float_mask", "sdpa_kpm",         "sdpa_causal_kpm"};

TEST(Attention, ValuesAndGradientsMatchPyTorchFloat64) {
  for (const std::string& name : kSdpaCases) check_sdpa_case(name, float64);
}

TEST(Attention, ValuesAndGradientsMatchPyTorchFloat32) {
  for (const std::string& name : kSdpaCases) check_sdpa_case(name, float32);
}

// Row 1 of the reference's bool mask allows no key: weights, output and gradients are 0 there,
// and nothing is NaN.
TEST(Attention, FullyMaskedRowGivesZerosNotNaN) {
  const std::string name = "sdpa_bool_mask";
  const nn::AttentionOptions o = case_options(name, float32);
  const Tensor q = stored(name + "/q", float32), k = stored(name + "/k", float32);
  const Tensor v = stored(name + "/v", float32);
  const Tensor out = nn::scaled_dot_product_attention(q, k, v, o);
  EXPECT_FALSE(any(isnan(out)).item<bool>());
  EXPECT_TRUE(all(slice(out, {Slice{}, Slice{1, 2}}) == 0.0).item<bool>());
  const Tensor gq =
      grad([&](const Tensor& a) { return sum(nn::scaled_dot_product_attention(a, k, v, o)); })(q);
  EXPECT_FALSE(any(isnan(gq)).item<bool>());
  EXPECT_TRUE(all(slice(gq, {Slice{}, Slice{1, 2}}) == 0.0).item<bool>());
  // A huge score on a masked key cannot leak into the gradient (exp overflow times 0).
  const Tensor big = q * 1e4;
  const Tensor gbig =
      grad([&](const Tensor& a) { return sum(nn::scaled_dot_product_attention(a, k, v, o)); })(big);
  EXPECT_FALSE(any(isnan(gbig)).item<bool>());
}

TEST(Attention, GradientsMatchFiniteDifferences) {
  const QKV qkv{random::normal(random::key(1), {2, 3, 4}, float64),
                random::normal(random::key(2), {2, 5, 4}, float64),
                random::normal(random::key(3), {2, 5, 2}, float64)};
  nn::AttentionOptions o;
  o.is_causal = true;
  o.key_padding_mask = tensor(std::vector<double>{0, 0, 1, 0, 0, 1, 0, 0, 0, 0}, {2, 5}) > 0.5;
  const Tensor cot = random::normal(random::key(4), {2, 3, 2}, float64);
  const auto loss = [&](const QKV& in) {
    const auto& [a, b, c] = in;
    return sum(sin(nn::scaled_dot_product_attention(a, b, c, o)) * cot);
  };
  expect_grad_matches_fd(loss, qkv, {.rtol = 1e-7, .atol = 1e-7});
}

TEST(Attention, JitAndVmapMatchEager) {
  const Tensor q = random::normal(random::key(5), {3, 2, 4, 8});
  const Tensor k = random::normal(random::key(6), {3, 2, 6, 8});
  const Tensor v = random::normal(random::key(7), {3, 2, 6, 5});
  const Tensor kpm = random::bernoulli(random::key(8), 0.3, {3, 1, 6});
  const auto f = [&](const Tensor& a, const Tensor& b, const Tensor& c, const Tensor& m) {
    nn::AttentionOptions o;
    o.is_causal = true;
    o.key_padding_mask = m;
    return nn::scaled_dot_product_attention(a, b, c, o);
  };
  const Tensor eager = f(q, k, v, kpm);
  expect_allclose(jit(f)(q, k, v, kpm), eager, {.rtol = 1e-5, .atol = 1e-5}, "jit");
  const auto loss = [&](const Tensor& a) { return sum(square(f(a, k, v, kpm))); };
  expect_allclose(jit(grad(loss))(q), grad(loss)(q), {.rtol = 1e-4, .atol = 1e-4}, "jit grad");
  // vmap over the leading axis against the per-example calls.
  const Tensor batched = vmap(f)(q, k, v, kpm);
  std::vector<Tensor> rows;
  for (int64_t i = 0; i < 3; ++i)
    rows.push_back(f(index(q, i), index(k, i), index(v, i), index(kpm, i)));
  expect_allclose(batched, stack(rows), {.rtol = 1e-5, .atol = 1e-5}, "vmap");
}

// Under jit the scaling, masks and softmax run as one fused loop nest between the two matmuls:
// the scores are written once (by the first matmul) and the weights once.
TEST(Attention, JitFusesTheMaskedSoftmaxBetweenTheMatmuls) {
  const Tensor q = random::normal(random::key(12), {1, 2, 64, 16});
  const Tensor kpm = random::bernoulli(random::key(13), 0.2, {1, 1, 64});
  const auto f = [](const Tensor& a, const Tensor& m) {
    nn::AttentionOptions o;
    o.is_causal = true;
    o.key_padding_mask = m;
    return nn::scaled_dot_product_attention(a, a, a, o);
  };
  const ir::CompiledInfo info =
      jit(f, JitOptions{.name = "attention", .backend = ir::Backend::llvm}).compiled(q, kpm);
  EXPECT_EQ(info.kernel_calls.size(), 2u) << info;  // the two matmuls
  const int64_t scores_bytes = 2 * 64 * 64 * 4;
  int64_t full_size_groups = 0;
  for (const auto& g : info.groups) full_size_groups += g.bytes_written >= scores_bytes;
  EXPECT_EQ(full_size_groups, 1) << info;
}

TEST(Attention, DropoutNeedsAKeyAndRescalesTheKeptWeights) {
  const Tensor q = random::normal(random::key(9), {2, 16, 8});
  const Tensor k = random::normal(random::key(10), {2, 32, 8});
  nn::AttentionOptions o;
  o.dropout = 0.25;
  expect_error([&] { (void)nn::attention_weights(q, k, o); }, "nn.attention",
               {"dropout needs a random key"});
  o.dropout_key = random::key(11);
  const Tensor plain = nn::attention_weights(q, k);
  const Tensor dropped = nn::attention_weights(q, k, o);
  const Tensor kept = dropped != 0.0;
  // Kept weights are the plain ones / 0.75; about a quarter are dropped.
  expect_allclose(where(kept, dropped, plain / 0.75), plain / 0.75, {.rtol = 1e-5, .atol = 1e-5},
                  "rescaled");
  const double dropped_share = 1.0 - mean(astype(kept, float32)).item<float>();
  EXPECT_NEAR(dropped_share, 0.25, 0.03);
  expect_allclose(nn::attention_weights(q, k, o), dropped, {.rtol = 0, .atol = 0},
                  "same key, same draw");
}

TEST(Attention, ErrorsNameTheShapes) {
  const Tensor q = zeros({2, 4, 8}), k = zeros({2, 6, 8}), v = zeros({2, 6, 3});
  const auto sdpa = [&](const Tensor& a, const Tensor& b, const Tensor& c,
                        const nn::AttentionOptions& o = {}) {
    (void)nn::scaled_dot_product_attention(a, b, c, o);
  };
  expect_error([&] { sdpa(zeros({8}), k, v); }, "nn.attention",
               {"query has too few dimensions", "[..., L, E]"});
  expect_error(
      [&] {
        sdpa(q, zeros({2, 6, 7}), v);
      },
      "nn.attention", {"key does not match the query", "f32[2,6,7]"});
  expect_error(
      [&] {
        sdpa(q, k, zeros({2, 5, 3}));
      },
      "nn.attention", {"value does not match the key", "f32[2,5,3]"});
  expect_error([&] { (void)nn::attention_weights(q, astype(k, float64)); }, "nn.attention",
               {"key does not match the query", "f64[2,6,8]"});
  expect_error([&] { sdpa(q, k, astype(v, float64)); }, "nn.attention",
               {"value does not match the key", "f64[2,6,3]"});
  expect_error([&] { sdpa(astype(q, int32), k, v); }, "nn.attention",
               {"query must be floating point"});
  nn::AttentionOptions o;
  o.attn_mask = zeros({5, 6});
  expect_error([&] { sdpa(q, k, v, o); }, "nn.attention",
               {"attn_mask does not broadcast to the scores", "f32[5,6]", "[2, 4, 6]"});
  o.attn_mask = zeros({4, 6}, int32);
  expect_error([&] { sdpa(q, k, v, o); }, "nn.attention",
               {"attn_mask must be bool or floating point"});
  o.attn_mask.reset();
  o.key_padding_mask = zeros({2, 5}, bool_);
  expect_error([&] { sdpa(q, k, v, o); }, "nn.attention",
               {"key_padding_mask does not broadcast to the scores"});
  o.key_padding_mask.reset();
  o.dropout = 1.0;
  expect_error([&] { sdpa(q, k, v, o); }, "nn.attention", {"dropout out of range"});
}

// ---- MultiheadAttention --------------------------------------------------------------------

struct MhaCase {
  std::string name;
  int64_t embed_dim, heads;
  nn::MultiheadAttention::Options options;
};

// A layer with the reference's weights (PyTorch's parameter names are Kiln's tree names).
nn::MultiheadAttention load_mha(const MhaCase& c, DType dtype) {
  nn::MultiheadAttention::Options o = c.options;
  o.dtype = dtype;
  nn::MultiheadAttention m(c.embed_dim, c.heads, random::key(0), o);
  auto [leaves, def] = tree_flatten(m);
  const std::vector<std::string> names = tree_names(def);
  for (std::size_t i = 0; i < leaves.size(); ++i)
    if (leaves[i].defined()) leaves[i] = stored(c.name + "/param/" + names[i], dtype);
  return tree_unflatten<nn::MultiheadAttention>(def, leaves);
}

const std::vector<MhaCase> kMhaCases{
    {"mha_self", 8, 2, {}},
    {"mha_masks", 8, 4, {}},
    {"mha_float_mask", 6, 2, {}},
    {"mha_kvdim", 6, 3, {.kdim = 4, .vdim = 7, .batch_first = true}},
    {"mha_nobias", 4, 1, {.bias = false, .batch_first = true}},
};

TEST(MultiheadAttention, MatchesPyTorchWithItsWeights) {
  const io::TensorFile& file = refs();
  for (const DType dtype : {float64, float32}) {
    for (const MhaCase& c : kMhaCases) {
      SCOPED_TRACE(c.name + " " + std::string(dtype_name(dtype)));
      const nn::MultiheadAttention m = load_mha(c, dtype);
      nn::MultiheadAttention::CallOptions call;
      if (file.find(c.name + "/key_padding_mask"))
        call.key_padding_mask = stored(c.name + "/key_padding_mask", dtype);
      if (file.find(c.name + "/attn_mask")) call.attn_mask = stored(c.name + "/attn_mask", dtype);
      const Tensor q = stored(c.name + "/query", dtype), k = stored(c.name + "/key", dtype);
      const Tensor v = stored(c.name + "/value", dtype);
      const auto r = m(q, k, v, call);
      const double tol = tol_of(dtype);
      expect_allclose(r.output, stored(c.name + "/out"), {.rtol = tol, .atol = tol}, "output");
      ASSERT_TRUE(r.weights.has_value());
      expect_allclose(*r.weights, stored(c.name + "/weights"), {.rtol = tol, .atol = tol},
                      "weights");
      call.average_attn_weights = false;
      expect_allclose(*m(q, k, v, call).weights, stored(c.name + "/head_weights"),
                      {.rtol = tol, .atol = tol}, "head weights");
      call.need_weights = false;
      EXPECT_FALSE(m(q, k, v, call).weights.has_value());
    }
  }
}

TEST(MultiheadAttention, ParameterNamesAndInitialisationFollowPyTorch) {
  const nn::MultiheadAttention m(8, 2, random::key(1));
  std::vector<std::string> names;
  for (const auto& [name, t] : nn::named_parameters(m)) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"in_proj_weight", "in_proj_bias", "out_proj.weight",
                                             "out_proj.bias"}));
  EXPECT_EQ(m.in_proj_weight->shape(), Shape({24, 8}));
  // xavier_uniform over [3E, E]: bound sqrt(6 / (E + 3E)); zero biases.
  EXPECT_LE(max(abs(*m.in_proj_weight)).item<float>(), std::sqrt(6.0 / 32.0));
  EXPECT_TRUE(all(*m.in_proj_bias == 0.0).item<bool>());
  EXPECT_TRUE(all(*m.out_proj.bias == 0.0).item<bool>());
  const nn::MultiheadAttention sep(6, 3, random::key(2), {.kdim = 4, .vdim = 7});
  names.clear();
  for (const auto& [name, t] : nn::named_parameters(sep)) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"q_proj_weight", "k_proj_weight", "v_proj_weight",
                                             "in_proj_bias", "out_proj.weight", "out_proj.bias"}));
}

TEST(MultiheadAttention, UnbatchedCausalAndJit) {
  const nn::MultiheadAttention m(8, 2, random::key(3), {.dtype = float64});
  const Tensor x = random::normal(random::key(4), {5, 1, 8}, float64);
  // Unbatched [L, E] is the batch of one.
  const auto one = m(squeeze(x, {1}), squeeze(x, {1}), squeeze(x, {1}));
  const auto batched = m(x, x, x);
  expect_allclose(one.output, squeeze(batched.output, {1}), {.rtol = 1e-12, .atol = 1e-12},
                  "unbatched output");
  expect_allclose(*one.weights, squeeze(*batched.weights, {0}), {.rtol = 1e-12, .atol = 1e-12},
                  "unbatched weights");
  // is_causal is the bool mask that forbids the keys after each query.
  const Tensor future = expand_dims(arange(5), 1) < expand_dims(arange(5), 0);
  const auto causal = m(x, x, x, {.is_causal = true});
  expect_allclose(causal.output, m(x, x, x, {.attn_mask = future}).output,
                  {.rtol = 1e-12, .atol = 1e-12}, "causal");
  const Tensor w = *causal.weights;  // [1, L, S]: nothing above the diagonal
  EXPECT_TRUE(all(where(expand_dims(future, 0), w, zeros_like(w)) == 0.0).item<bool>());
  // jit of the layer (a tree argument) and of its parameter gradient.
  const auto f = [](const nn::MultiheadAttention& layer, const Tensor& in) {
    return layer(in, in, in, {.is_causal = true}).output;
  };
  expect_allclose(jit(f)(m, x), causal.output, {.rtol = 1e-12, .atol = 1e-12}, "jit");
  const auto loss = [&](const nn::MultiheadAttention& layer) { return sum(square(f(layer, x))); };
  expect_tree_allclose(jit(grad(loss))(m), grad(loss)(m), {.rtol = 1e-10, .atol = 1e-10});
}

TEST(MultiheadAttention, ParameterGradientsMatchFiniteDifferences) {
  const nn::MultiheadAttention m(4, 2, random::key(5), {.kdim = 3, .dtype = float64});
  const Tensor q = random::normal(random::key(6), {3, 2, 4}, float64);
  const Tensor k = random::normal(random::key(7), {4, 2, 3}, float64);
  const Tensor v = random::normal(random::key(8), {4, 2, 4}, float64);
  const Tensor kpm = tensor(std::vector<double>{0, 0, 1, 0, 0, 0, 0, 1}, {2, 4}) > 0.5;
  const auto loss = [&](const nn::MultiheadAttention& layer) {
    return sum(sin(layer(q, k, v, {.key_padding_mask = kpm}).output));
  };
  expect_grad_matches_fd(loss, m, {.rtol = 1e-7, .atol = 1e-7});
}

TEST(MultiheadAttention, DropoutInTrainingOnly) {
  const nn::MultiheadAttention m(8, 2, random::key(9), {.dropout = 0.5});
  const Tensor x = random::normal(random::key(10), {4, 2, 8});
  nn::Context eval = nn::Context::eval();
  expect_allclose(m(x, x, x, eval).output, m(x, x, x).output, {.rtol = 0, .atol = 0}, "eval");
  nn::Context train = nn::Context::train(random::key(11));
  const auto r = m(x, x, x, train);
  EXPECT_GT(max(abs(r.output - m(x, x, x).output)).item<float>(), 1e-3);
}

TEST(MultiheadAttention, ErrorsNameTheShapes) {
  expect_error([] { (void)nn::MultiheadAttention(6, 4, random::key(0)); }, "nn.MultiheadAttention",
               {"embed_dim not divisible by num_heads"});
  expect_error([] { (void)nn::MultiheadAttention(0, 1, random::key(0)); }, "nn.MultiheadAttention",
               {"non-positive size"});
  const nn::MultiheadAttention m(8, 2, random::key(1));
  const Tensor x = zeros({4, 2, 8});
  expect_error(
      [&] {
        (void)m(zeros({4, 2, 6}), x, x);
      },
      "nn.MultiheadAttention", {"query does not match the layer", "f32[4,2,6]"});
  expect_error(
      [&] {
        (void)m(x, zeros({4, 8}), x);
      },
      "nn.MultiheadAttention", {"key does not match the layer"});
  expect_error(
      [&] {
        (void)m(x, zeros({5, 3, 8}), zeros({5, 3, 8}));
      },
      "nn.MultiheadAttention", {"query, key and value do not match"});
  expect_error(
      [&] {
        (void)m(x, x, x, {.key_padding_mask = zeros({2, 5}, bool_)});
      },
      "nn.MultiheadAttention", {"key_padding_mask does not match the keys", "[2, 4]"});
  expect_error(
      [&] {
        (void)m(x, x, x, {.attn_mask = zeros({3, 4, 4}, bool_)});
      },
      "nn.MultiheadAttention", {"attn_mask does not match", "[4, 4, 4]"});
}

}  // namespace
}  // namespace kiln
