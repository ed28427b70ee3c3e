// GPT-2's architecture as Kiln trees: token and learned position embeddings, pre-LayerNorm
// blocks of causal self-attention and a GELU (tanh form) MLP of 4x the width, a final
// LayerNorm, and the LM head tied to the token embedding. Parameters are named as in
// nanoGPT's PyTorch state_dict ("transformer.h.0.attn.c_attn.weight", ...), Linear weights
// [out, in] as nn.Linear holds them, so bench/gpt_torch.py loads them by name. Initialisation
// is GPT-2's: N(0, 0.02) for every weight matrix and embedding, zero biases, LayerNorms at 1
// and 0, and the residual projections (attn.c_proj, mlp.c_proj) at 0.02 / sqrt(2 * layers).
// Generation runs with a key/value cache, a compiled loop per span of positions (generate).
// Training can keep the blocks' weights elsewhere (ZeRO-3's pieces) and fetch each block's
// just in time (BlockWeights).
#pragma once

#include <kiln/distributed.h>
#include <kiln/kiln.h>
#include <kiln/nn.h>
#include <kiln/sharded_checkpoint.h>

#include <cmath>
#include <functional>
#include <optional>
#include <string>
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
    // Gathered weights are gathered again in the backward pass instead of kept; activations
    // are kept (FSDP's choice).
    x = weights
            ? checkpoint([&](const Block& h, const Tensor& in) { return block(weights(l, h), in); },
                         CheckpointPolicy{{"all_gather"}})(held, x)
            : block(held, x);
  }
  return matmul(t.ln_f(x), transpose(t.wte.weight));
}

// ---- generation with a key/value cache ----------------------------------------------------

// Each layer's keys and values of the positions seen so far, [B, heads, block_size, C / heads],
// in a fixed-size buffer: a generation is one compiled loop, with no new shapes per token, that
// writes each token's keys and values into the buffer in place.
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
// It reads the first `span` positions of the cache (pos < span), the whole block by default:
// the positions after pos would only add zeros, so a span changes no more than the order of
// the attention's sums.
inline std::pair<Tensor, KvCache> decode_step(const Model& m, const KvCache& cache,
                                              const Tensor& token, const Tensor& pos,
                                              std::optional<int64_t> span = std::nullopt) {
  const Transformer& t = m.transformer;
  const int64_t B = token.shape()[0], S = t.wpe.weight.shape()[0], C = t.wpe.weight.shape()[1];
  const int64_t A = span.value_or(S);
  if (A < 1 || A > S)
    fail("gpt.decode_step", "span out of range: got ", A, ", expected 1 to the block size ", S);
  const Tensor zero = tensor(int64_t{0});
  Tensor x = t.wte(reshape(token, {B, 1})) + t.wpe(reshape(pos, {1}));    // [B, 1, C]
  const Tensor seen = reshape(less_equal(arange(A), pos), {1, 1, 1, A});  // keys 0..pos
  auto read = [&](const Tensor& c) {
    return A == S ? c : slice(c, {Slice(), Slice(), Slice(0, A)});
  };
  KvCache out = cache;
  for (std::size_t l = 0; l < t.h.size(); ++l) {
    const Block& b = t.h[l];
    const int64_t H = b.attn.heads;
    const std::vector<Tensor> qkv = split(b.attn.c_attn(b.ln_1(x)), 3, 2);
    auto heads = [&](const Tensor& v) { return swapaxes(reshape(v, {B, 1, H, C / H}), 1, 2); };
    out.k[l] = dynamic_update_slice(out.k[l], heads(qkv[1]), {zero, zero, pos, zero});
    out.v[l] = dynamic_update_slice(out.v[l], heads(qkv[2]), {zero, zero, pos, zero});
    const Tensor y = nn::scaled_dot_product_attention(heads(qkv[0]), read(out.k[l]), read(out.v[l]),
                                                      {.attn_mask = seen});
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
// new token is picked from the logits of the one before. The positions run in spans, a
// fori_loop each, whose steps read the cache up to their span's end rather than the whole
// block: a cache grown by concatenation, as PyTorch users write it, reads what it holds, and
// so do these loops, within a span. The spans end at kFirstGenerationSpan, twice that, four
// times, ..., the last at P + n - 1: past the first span a step reads fewer than twice the
// positions it has seen (the first span's steps read the whole span), by a number
// of loops (each compiled once) that grows with the logarithm of P + n. jit(generate)
// compiles once per prompt length and n.
constexpr int64_t kFirstGenerationSpan = 64;
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
  const auto step = [&](const Tensor& i, const std::pair<Tensor, KvCache>& c, int64_t span) {
    const auto& [toks, cache] = c;
    const Tensor token = reshape(dynamic_slice(toks, {zero, i}, {B, 1}), {B});
    auto [logits, next_cache] = decode_step(m, cache, token, i, span);
    const Tensor k = reshape(dynamic_slice(keys, {i, zero}, {1, 2}), {2});
    const Tensor picked = reshape(pick(logits, s, k), {B, 1});
    // Within the prompt the next token is the prompt's own.
    const Tensor next_at = i + 1;
    const Tensor given = dynamic_slice(toks, {zero, next_at}, {B, 1});
    const Tensor next = where(less(next_at, tensor(P)), given, picked);
    return std::pair{dynamic_update_slice(toks, next, {zero, next_at}), next_cache};
  };
  std::pair carry{tokens, empty_cache(m, B)};
  for (int64_t from = 0, end = kFirstGenerationSpan; from < total - 1; from = end, end *= 2) {
    const int64_t to = std::min(end, total - 1);
    carry = fori_loop(
        from, to, [&](const Tensor& i, const auto& c) { return step(i, c, to); }, carry);
  }
  return carry.first;
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

// ---- tensor parallelism (Megatron-LM's layout), inside shard_map over `axis` ------------------
//
// Each of the M processes along the axis holds 1/M of the vocabulary (its rows of the token
// embedding, so also its block of the tied LM head's logits), 1/M of every block's heads (its
// rows of c_attn, the q, k and v of those heads, and its columns of attn.c_proj) and 1/M of the
// MLP's hidden units (rows of mlp.c_fc, columns of mlp.c_proj); LayerNorms, the position
// embedding and the row-parallel layers' biases are replicated. Two psums per block (after
// the attention's and the MLP's output projections), three for the loss.

// Dropout under tensor parallelism: the keep-masks the one-process run draws (logits' keys, in
// its order) for the whole batch; each process takes its rows and, of the attention weights',
// its heads (dropout_blocks), so that a mesh trains exactly as one process does. A replicated
// activation gets the same mask on every process of the model axis.
struct DropoutMasks {
  Tensor embedding;                                   // [B, T, C]
  std::vector<Tensor> attention, attention_out, mlp;  // per block: [B, H, T, T], [B, T, C] twice
};
KILN_TREE(DropoutMasks, embedding, attention, attention_out, mlp);

inline DropoutMasks dropout_masks(const Dropout& d, int64_t B, int64_t T, const Config& c) {
  const Tensor keys = random::split(d.key, 1 + 2 * c.layers);
  const double keep = 1.0 - d.rate;
  const Shape act{B, T, c.d_model};
  DropoutMasks m{random::bernoulli(index(keys, 0), keep, act), {}, {}, {}};
  for (int64_t l = 0; l < c.layers; ++l) {
    const Tensor attention_keys = random::split(index(keys, 1 + 2 * l), 2);
    m.attention.push_back(random::bernoulli(index(attention_keys, 0), keep, {B, c.heads, T, T}));
    m.attention_out.push_back(random::bernoulli(index(attention_keys, 1), keep, act));
    m.mlp.push_back(random::bernoulli(index(keys, 2 + 2 * l), keep, act));
  }
  return m;
}

// Where each mask is split over the mesh: the rows over `data`, the heads over `model`, in
// flatten order.
inline std::vector<distributed::Spec> dropout_specs(const Config& c, const std::string& data,
                                                    const std::string& model) {
  std::vector<distributed::Spec> out{distributed::spec(data)};
  for (int64_t l = 0; l < c.layers; ++l) out.push_back(distributed::spec(data, model));
  for (int64_t l = 0; l < 2 * c.layers; ++l) out.push_back(distributed::spec(data));
  return out;
}

// x with nn::dropout's arithmetic and a given keep-mask.
inline Tensor apply_dropout(const Tensor& x, const Tensor& keep, double rate) {
  return where(keep, x * (1.0 / (1.0 - rate)), scalar_like(x, 0.0));
}

// Causal self-attention on this process's heads: a.c_attn holds their q, k and v rows, in
// that order, and a.c_proj their columns; a.heads counts every process's heads. With dropout
// (`masks`: this process's blocks of them), block `layer`'s masks at `rate`.
inline Tensor parallel_attention(const Attention& a, const Tensor& x, const std::string& axis,
                                 double rate = 0.0, const DropoutMasks* masks = nullptr,
                                 int64_t layer = 0) {
  const int64_t B = x.shape()[0], T = x.shape()[1], C = x.shape()[2];
  const int64_t D = C / a.heads, local = a.c_attn.weight.shape()[0] / 3, H = local / D;
  const std::vector<Tensor> qkv = split(a.c_attn(x), 3, 2);
  auto heads = [&](const Tensor& v) { return swapaxes(reshape(v, {B, T, H, D}), 1, 2); };
  const auto l = static_cast<std::size_t>(layer);
  // The weights' dropout as scaled_dot_product_attention applies it, with the given mask.
  const Tensor y = masks ? matmul(apply_dropout(nn::attention_weights(heads(qkv[0]), heads(qkv[1]),
                                                                      {.is_causal = true}),
                                                masks->attention[l], rate),
                                  heads(qkv[2]))
                         : nn::scaled_dot_product_attention(heads(qkv[0]), heads(qkv[1]),
                                                            heads(qkv[2]), {.is_causal = true});
  const Tensor out =
      nn::row_parallel_linear(a.c_proj, reshape(swapaxes(y, 1, 2), {B, T, local}), axis);
  return masks ? apply_dropout(out, masks->attention_out[l], rate) : out;
}

// The mean next-token cross-entropy from this process's blocks of the model (see above); the
// same on every process of the axis, and the same value as loss() on the whole model (with
// dropout, `masks` this process's blocks of dropout_masks, as loss() with the key they were
// drawn from).
inline Tensor parallel_loss(const Model& m, const Tensor& tokens, const Tensor& targets,
                            const std::string& axis, double rate = 0.0,
                            const DropoutMasks* masks = nullptr) {
  const Transformer& t = m.transformer;
  const int64_t T = tokens.shape()[1];
  Tensor x = nn::parallel_embedding(t.wte, tokens, axis) + t.wpe(arange(T));
  if (masks) x = apply_dropout(x, masks->embedding, rate);
  for (std::size_t l = 0; l < t.h.size(); ++l) {
    const Block& b = t.h[l];
    x = x + parallel_attention(b.attn, b.ln_1(x), axis, rate, masks, static_cast<int64_t>(l));
    const Tensor h = nn::row_parallel_linear(
        b.mlp.c_proj, nn::gelu(b.mlp.c_fc(b.ln_2(x)), /*tanh_approximation=*/true), axis);
    x = x + (masks ? apply_dropout(h, masks->mlp[l], rate) : h);
  }
  Tensor z = matmul(t.ln_f(x), transpose(t.wte.weight));  // [B, T, vocab / M]
  if (z.dtype() == bfloat16 || z.dtype() == float16) z = astype(z, float32);
  return nn::parallel_cross_entropy(reshape(z, {-1, z.shape()[2]}), reshape(targets, {-1}), axis);
}

// Where each parameter is split in that layout, leaf by leaf in flatten order.
inline std::vector<distributed::Spec> parallel_specs(const Model& m, const std::string& axis) {
  using distributed::spec;
  std::vector<distributed::Spec> out;
  for (const std::string& name : tree_names(m)) {
    auto is = [&](const std::string& end) {
      return name.size() >= end.size() &&
             name.compare(name.size() - end.size(), end.size(), end) == 0;
    };
    if (is("wte.weight") || is("c_attn.weight") || is("c_fc.weight"))
      out.push_back(spec(axis, none));  // rows: vocabulary, heads, hidden units
    else if (is("c_attn.bias") || is("c_fc.bias"))
      out.push_back(spec(axis));
    else if (is("attn.c_proj.weight") || is("mlp.c_proj.weight"))
      out.push_back(spec(none, axis));  // columns: the row-parallel layers' inputs
    else
      out.push_back(spec());  // LayerNorms, position embedding, row-parallel biases
  }
  return out;
}

// c_attn's 3C rows reordered so that block p of M holds the q, k and v rows of process p's
// heads, in that order (the checkpoint's order is all q, all k, all v): the rows to take.
inline Tensor parallel_qkv_rows(int64_t C, int64_t M) {
  std::vector<int64_t> rows;
  for (int64_t p = 0; p < M; ++p)
    for (int64_t part = 0; part < 3; ++part)
      for (int64_t i = 0; i < C / M; ++i) rows.push_back(part * C + p * (C / M) + i);
  return tensor(rows);
}

// This process's blocks of a whole model (or of a tree shaped like it: the optimiser's slots).
inline Model parallel_blocks(const Model& full, const distributed::Mesh& mesh,
                             const std::string& axis) {
  const std::vector<distributed::Spec> specs = parallel_specs(full, axis);
  const std::vector<std::string> names = tree_names(full);
  auto [leaves, def] = tree_flatten(full);
  const int64_t C = full.transformer.wpe.weight.shape()[1], M = mesh.size(axis);
  for (std::size_t i = 0; i < leaves.size(); ++i) {
    if (names[i].find("c_attn") != std::string::npos)
      leaves[i] = take(leaves[i], parallel_qkv_rows(C, M), 0);
    leaves[i] = distributed::local_block(leaves[i], mesh, specs[i]);
  }
  return tree_unflatten<Model>(def, leaves);
}

// Inside shard_map, the inverse: the whole model from every process's blocks.
inline Model parallel_whole(const Model& blocks, const std::string& axis, int64_t M) {
  const std::vector<distributed::Spec> specs = parallel_specs(blocks, axis);
  const std::vector<std::string> names = tree_names(blocks);
  auto [leaves, def] = tree_flatten(blocks);
  const int64_t C = blocks.transformer.wpe.weight.shape()[1];
  std::vector<int64_t> back(static_cast<std::size_t>(3 * C));
  const std::vector<int64_t> rows = parallel_qkv_rows(C, M).to_vector<int64_t>();
  for (std::size_t j = 0; j < rows.size(); ++j)
    back[static_cast<std::size_t>(rows[j])] = int64_t(j);
  for (std::size_t i = 0; i < leaves.size(); ++i) {
    leaves[i] = distributed::assemble(leaves[i], specs[i]);
    if (names[i].find("c_attn") != std::string::npos) leaves[i] = take(leaves[i], tensor(back), 0);
  }
  return tree_unflatten<Model>(def, leaves);
}

// This process's pieces of a tree of blocks (the model, or an optimiser slot) for a sharded
// checkpoint, which holds the model in its own order: c_attn's block goes as three pieces,
// its q, k and v rows, each where it lies among the whole tensor's rows.
inline std::vector<distributed::Piece> parallel_pieces(const Model& blocks,
                                                       const distributed::Mesh& mesh,
                                                       const std::string& axis,
                                                       const std::string& prefix) {
  const int64_t C = blocks.transformer.wpe.weight.shape()[1], M = mesh.size(axis);
  const int64_t p = mesh.index(axis);
  std::vector<distributed::Piece> out;
  for (distributed::Piece& piece :
       distributed::block_pieces(blocks, parallel_specs(blocks, axis), mesh, prefix)) {
    if (piece.name.find("c_attn") == std::string::npos) {
      out.push_back(std::move(piece));
      continue;
    }
    for (int64_t part = 0; part < 3; ++part) {
      distributed::Piece rows = piece;
      rows.data = slice(piece.data, {Slice{part * (C / M), (part + 1) * (C / M)}});
      rows.start[0] = part * C + p * (C / M);
      out.push_back(std::move(rows));
    }
  }
  return out;
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
