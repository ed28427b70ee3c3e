// GPT-2's architecture as Kiln trees: token and learned position embeddings, pre-LayerNorm
// blocks of causal self-attention and a GELU (tanh form) MLP of 4x the width, a final
// LayerNorm, and the LM head tied to the token embedding. Parameters are named as in
// nanoGPT's PyTorch state_dict ("transformer.h.0.attn.c_attn.weight", ...), Linear weights
// [out, in] as nn.Linear holds them, so bench/gpt_torch.py loads them by name. Initialisation
// is GPT-2's: N(0, 0.02) for every weight matrix and embedding, zero biases, LayerNorms at 1
// and 0, and the residual projections (attn.c_proj, mlp.c_proj) at 0.02 / sqrt(2 * layers).
// Generation runs with a key/value cache, each chunk one compiled loop (generate). Training
// can keep the blocks' weights elsewhere (ZeRO-3's pieces) and fetch each block's just in time
// (BlockWeights).
#pragma once

#include <kiln/kiln.h>
#include <kiln/nn.h>

#include <cmath>
#include <functional>
#include <optional>
#include <vector>

namespace gpt {

using namespace kiln;

struct Config {
  int64_t layers = 4, heads = 4, d_model = 256, block_size = 128, vocab = 256;
};

struct Attention {
  nn::Linear c_attn, c_proj;  // [3C, C]: q, k and v stacked; [C, C]
  int64_t heads = 1;
};
KILN_TREE(Attention, c_attn, c_proj, heads);

struct Mlp {
  nn::Linear c_fc, c_proj;  // [4C, C], [C, 4C]
};
KILN_TREE(Mlp, c_fc, c_proj);

struct Block {
  nn::LayerNorm ln_1;
  Attention attn;
  nn::LayerNorm ln_2;
  Mlp mlp;
};
KILN_TREE(Block, ln_1, attn, ln_2, mlp);

struct Transformer {
  nn::Embedding wte, wpe;  // [vocab, C], [block_size, C]
  std::vector<Block> h;
  nn::LayerNorm ln_f;
};
KILN_TREE(Transformer, wte, wpe, h, ln_f);

struct Model {
  Transformer transformer;
};
KILN_TREE(Model, transformer);

// A Linear of GPT-2's initialisation: weight N(0, std), bias 0.
inline nn::Linear linear(int64_t in, int64_t out, const Tensor& key, double std) {
  nn::Linear l;
  l.weight = random::normal(key, {out, in}) * std;
  l.bias = zeros({out});
  return l;
}

inline Model init(const Config& c, const Tensor& key) {
  const double std = 0.02, residual = 0.02 / std::sqrt(2.0 * static_cast<double>(c.layers));
  const Tensor keys = random::split(key, 2 + 4 * c.layers);
  Model m;
  Transformer& t = m.transformer;
  t.wte.weight = random::normal(index(keys, 0), {c.vocab, c.d_model}) * std;
  t.wpe.weight = random::normal(index(keys, 1), {c.block_size, c.d_model}) * std;
  for (int64_t l = 0; l < c.layers; ++l) {
    auto k = [&](int64_t i) { return index(keys, 2 + 4 * l + i); };
    Block b;
    b.ln_1 = nn::LayerNorm({c.d_model});
    b.attn = {linear(c.d_model, 3 * c.d_model, k(0), std),
              linear(c.d_model, c.d_model, k(1), residual), c.heads};
    b.ln_2 = nn::LayerNorm({c.d_model});
    b.mlp = {linear(c.d_model, 4 * c.d_model, k(2), std),
             linear(4 * c.d_model, c.d_model, k(3), residual)};
    t.h.push_back(b);
  }
  t.ln_f = nn::LayerNorm({c.d_model});
  return m;
}

// Dropout while training, at GPT-2's three places: the embeddings' sum, the attention weights
// and each residual branch's output, at `rate`, drawn from `key`.
struct Dropout {
  double rate = 0;
  Tensor key;
};

// Causal self-attention over x [B, T, C]: heads of C / heads features each; with dropout on
// the attention weights and the output.
inline Tensor attention(const Attention& a, const Tensor& x,
                        const std::optional<Dropout>& drop = std::nullopt) {
  const int64_t B = x.shape()[0], T = x.shape()[1], C = x.shape()[2], H = a.heads;
  const std::vector<Tensor> qkv = split(a.c_attn(x), 3, 2);
  auto heads = [&](const Tensor& v) { return swapaxes(reshape(v, {B, T, H, C / H}), 1, 2); };
  const Tensor keys = drop ? random::split(drop->key, 2) : Tensor();
  nn::AttentionOptions options{.is_causal = true};
  if (drop) options.dropout = drop->rate, options.dropout_key = index(keys, 0);
  const Tensor y =
      nn::scaled_dot_product_attention(heads(qkv[0]), heads(qkv[1]), heads(qkv[2]), options);
  const Tensor out = a.c_proj(reshape(swapaxes(y, 1, 2), {B, T, C}));
  return drop ? nn::dropout(out, drop->rate, index(keys, 1)) : out;
}

// Block `layer`'s weights made from what the model holds for it (ZeRO-3: this process's pieces,
// gathered). Each block then runs under checkpoint, so its weights exist only while it
// computes: in the forward pass, and fetched again for the backward pass.
using BlockWeights = std::function<Block(int64_t layer, const Block& held)>;

// The logits [B, T, vocab] of tokens [B, T] (int64, T at most the block size).
inline Tensor logits(const Model& m, const Tensor& tokens,
                     const std::optional<Dropout>& drop = std::nullopt,
                     const BlockWeights& weights = {}) {
  const Transformer& t = m.transformer;
  const int64_t T = tokens.shape()[1], L = static_cast<int64_t>(t.h.size());
  // Keys: the embeddings', then two per block (attention, MLP).
  const Tensor keys = drop ? random::split(drop->key, 1 + 2 * L) : Tensor();
  auto with_key = [&](int64_t i) {
    return drop ? std::optional<Dropout>(Dropout{drop->rate, index(keys, i)}) : std::nullopt;
  };
  Tensor x = t.wte(tokens) + t.wpe(arange(T));
  if (drop) x = nn::dropout(x, drop->rate, index(keys, 0));
  for (int64_t l = 0; l < L; ++l) {
    auto block = [&](const Block& b, Tensor x) {
      x = x + attention(b.attn, b.ln_1(x), with_key(1 + 2 * l));
      const Tensor h = b.mlp.c_proj(nn::gelu(b.mlp.c_fc(b.ln_2(x)), /*tanh_approximation=*/true));
      return x + (drop ? nn::dropout(h, drop->rate, index(keys, 2 + 2 * l)) : h);
    };
    const Block& held = t.h[static_cast<std::size_t>(l)];
    x = weights ? checkpoint([&](const Block& h, const Tensor& in) {
      return block(weights(l, h), in);
    })(held, x)
                : block(held, x);
  }
  return matmul(t.ln_f(x), transpose(t.wte.weight));
}

// ---- generation with a key/value cache ----------------------------------------------------

// Each layer's keys and values of the positions seen so far, [B, heads, block_size, C / heads],
// in a fixed-size buffer: a generation is one compiled loop, with no new shapes per token.
struct KvCache {
  std::vector<Tensor> k, v;
};
KILN_TREE(KvCache, k, v);

inline KvCache empty_cache(const Model& m, int64_t B) {
  const Transformer& t = m.transformer;
  const int64_t S = t.wpe.weight.shape()[0], C = t.wpe.weight.shape()[1];
  KvCache c;
  for (const Block& b : t.h) {
    const int64_t H = b.attn.heads;
    c.k.push_back(zeros({B, H, S, C / H}));
    c.v.push_back(zeros({B, H, S, C / H}));
  }
  return c;
}

// The logits [B, vocab] after one more token per sequence, `token` [B] (int64) at position
// `pos` (an int64 scalar, traced or not): its keys and values are written into the cache at
// `pos`, and it attends to positions 0..pos. The same arithmetic as logits() at that position.
inline std::pair<Tensor, KvCache> decode_step(const Model& m, const KvCache& cache,
                                              const Tensor& token, const Tensor& pos) {
  const Transformer& t = m.transformer;
  const int64_t B = token.shape()[0], S = t.wpe.weight.shape()[0], C = t.wpe.weight.shape()[1];
  const Tensor zero = tensor(int64_t{0});
  Tensor x = t.wte(reshape(token, {B, 1})) + t.wpe(reshape(pos, {1}));    // [B, 1, C]
  const Tensor seen = reshape(less_equal(arange(S), pos), {1, 1, 1, S});  // keys 0..pos
  KvCache out = cache;
  for (std::size_t l = 0; l < t.h.size(); ++l) {
    const Block& b = t.h[l];
    const int64_t H = b.attn.heads;
    const std::vector<Tensor> qkv = split(b.attn.c_attn(b.ln_1(x)), 3, 2);
    auto heads = [&](const Tensor& v) { return swapaxes(reshape(v, {B, 1, H, C / H}), 1, 2); };
    out.k[l] = dynamic_update_slice(out.k[l], heads(qkv[1]), {zero, zero, pos, zero});
    out.v[l] = dynamic_update_slice(out.v[l], heads(qkv[2]), {zero, zero, pos, zero});
    const Tensor y =
        nn::scaled_dot_product_attention(heads(qkv[0]), out.k[l], out.v[l], {.attn_mask = seen});
    x = x + b.attn.c_proj(reshape(swapaxes(y, 1, 2), {B, 1, C}));
    x = x + b.mlp.c_proj(nn::gelu(b.mlp.c_fc(b.ln_2(x)), /*tanh_approximation=*/true));
  }
  return {reshape(matmul(t.ln_f(x), transpose(t.wte.weight)), {B, -1}), out};
}

// How the next token is picked from the logits.
struct Sampling {
  double temperature = 0.8;  // 0: the most likely token (greedy)
  int64_t top_k = 0;         // > 0: only among the top_k most likely
};

// One token per row of logits [B, vocab] (int64 [B]), drawn with `key` as `s` says.
inline Tensor pick(const Tensor& logits, const Sampling& s, const Tensor& key) {
  if (s.temperature == 0) return argmax(logits, -1);
  Tensor z = logits / s.temperature;
  if (s.top_k > 0 && s.top_k < z.shape()[1]) {
    const Tensor kth = slice(top_k(z, s.top_k).values, {Slice(), Slice(s.top_k - 1, s.top_k)});
    z = where(less(z, kth), full_like(z, -INFINITY), z);
  }
  return random::categorical(key, z, -1);
}

// The prompt [B, P] (int64) followed by n generated tokens, [B, P + n], P + n at most the block
// size: the prompt runs through decode_step a token at a time, filling the cache, then each
// new token is picked from the logits of the one before. One fori_loop, so jit(generate)
// compiles once per prompt length and n.
inline Tensor generate(const Model& m, const Tensor& prompt, int64_t n, const Sampling& s,
                       const Tensor& key) {
  const int64_t B = prompt.shape()[0], P = prompt.shape()[1], total = P + n;
  const int64_t block = m.transformer.wpe.weight.shape()[0];
  if (P < 1 || n < 0 || total > block)
    fail("gpt.generate", "prompt and tokens do not fit the block: got a prompt of ", P,
         " tokens and ", n, " more, expected at least 1 and at most ", block, " in all");
  const Tensor keys = random::split(key, std::max<int64_t>(total, 1));
  const Tensor tokens = concatenate({prompt, zeros({B, n}, int64)}, 1);
  const Tensor zero = tensor(int64_t{0});
  const auto step = [&](const Tensor& i, const std::pair<Tensor, KvCache>& c) {
    const auto& [toks, cache] = c;
    const Tensor token = reshape(dynamic_slice(toks, {zero, i}, {B, 1}), {B});
    auto [logits, next_cache] = decode_step(m, cache, token, i);
    const Tensor k = reshape(dynamic_slice(keys, {i, zero}, {1, 2}), {2});
    const Tensor picked = reshape(pick(logits, s, k), {B, 1});
    // Within the prompt the next token is the prompt's own.
    const Tensor next_at = i + 1;
    const Tensor given = dynamic_slice(toks, {zero, next_at}, {B, 1});
    const Tensor next = where(less(next_at, tensor(P)), given, picked);
    return std::pair{dynamic_update_slice(toks, next, {zero, next_at}), next_cache};
  };
  return fori_loop(int64_t{0}, total - 1, step, std::pair{tokens, empty_cache(m, B)}).first;
}

// Mean cross-entropy of the next-token predictions: targets [B, T] are the tokens shifted by one.
// Taken in float32 at least, whatever the model computes in (a bfloat16 log-softmax loses the
// loss's small differences).
inline Tensor loss(const Model& m, const Tensor& tokens, const Tensor& targets,
                   const std::optional<Dropout>& drop = std::nullopt,
                   const BlockWeights& weights = {}) {
  Tensor z = logits(m, tokens, drop, weights);
  if (z.dtype() == bfloat16 || z.dtype() == float16) z = astype(z, float32);
  const int64_t V = z.shape()[2];
  return nn::cross_entropy(reshape(z, {-1, V}), reshape(targets, {-1}));
}

// Model FLOPs of one training step of B sequences of T tokens (2 per multiply-add, the backward
// pass twice the forward): 6 per parameter of the matrices and the LM head per token, plus the
// attention products, 12 * layers * T * C per token (PaLM's appendix B count, causal masking
// not subtracted).
inline double train_flops(const Config& c, int64_t B, int64_t T) {
  const double L = static_cast<double>(c.layers), C = static_cast<double>(c.d_model),
               V = static_cast<double>(c.vocab), tokens = static_cast<double>(B * T);
  return 6.0 * tokens * (12.0 * L * C * C + V * C) + 12.0 * L * tokens * static_cast<double>(T) * C;
}

}  // namespace gpt
