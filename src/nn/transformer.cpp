// kiln::nn transformer layers: torch.nn.TransformerEncoderLayer / TransformerDecoderLayer and
// their stacks, composed of MultiheadAttention, Linear, LayerNorm and Dropout (so grad, vmap
// and jit need nothing new, and PyTorch's state dicts copy over name by name).
#include <cmath>

#include "kiln/error.h"
#include "kiln/nn.h"
#include "nn/input_checks.h"

namespace kiln::nn {

namespace {

using detail::expect_floating_input;

constexpr std::string_view kEncoderLayer = "nn.TransformerEncoderLayer";
constexpr std::string_view kDecoderLayer = "nn.TransformerDecoderLayer";

void expect_options(std::string_view op, int64_t d_model, int64_t nhead,
                    const TransformerLayerOptions& o) {
  if (d_model < 1 || nhead < 1 || o.dim_feedforward < 1)
    fail(op, "non-positive size: got d_model=", d_model, ", nhead=", nhead,
         ", dim_feedforward=", o.dim_feedforward, ", expected sizes >= 1");
  if (d_model % nhead != 0)
    fail(op, "d_model not divisible by nhead: got d_model=", d_model, ", nhead=", nhead,
         ", expected a multiple of nhead");
  if (!(o.dropout >= 0.0 && o.dropout < 1.0))
    fail(op, "dropout out of range: got ", o.dropout, ", expected [0, 1)");
  if (o.activation != "relu" && o.activation != "gelu")
    fail(op, "unknown activation: got \"", o.activation, "\", expected \"relu\" or \"gelu\"");
  if (!(o.layer_norm_eps >= 0.0))
    fail(op, "negative layer_norm_eps: got ", o.layer_norm_eps, ", expected >= 0");
}

MultiheadAttention attention(int64_t d_model, int64_t nhead, const Tensor& key,
                             const TransformerLayerOptions& o) {
  return MultiheadAttention(
      d_model, nhead, key,
      MultiheadAttentionOptions{
          .batch_first = o.batch_first, .dropout = o.dropout, .dtype = o.dtype});
}

// The layer's input: [L, N, E] ([N, L, E] with batch_first) or unbatched [L, E] of the weights'
// dtype and d_model features.
void expect_sequence(std::string_view op, std::string_view what, const Tensor& x,
                     const Tensor& weight, bool batch_first) {
  const std::string_view layout =
      batch_first ? "[N, L, d_model] or [L, d_model]" : "[L, N, d_model] or [L, d_model]";
  expect_floating_input(op, what, x, 2, layout);
  const int64_t d = weight.shape()[1];
  if (x.rank() > 3 || x.shape()[x.rank() - 1] != d || x.dtype() != weight.dtype())
    fail(op, what, " does not match the layer: got ", x.type(), " for d_model ", d, " and dtype ",
         weight.dtype(), ", expected ", layout, " of that dtype");
}

// Dropout with a key from a training context; the identity otherwise.
Tensor drop(const Tensor& x, double rate, Context* ctx, Loc loc) {
  return ctx != nullptr ? Dropout{rate}(x, *ctx, loc) : x;
}

struct AttentionMasks {
  const std::optional<Tensor>& attn_mask;
  const std::optional<Tensor>& key_padding_mask;
  bool is_causal;
};

// The attention block: mha(q, kv, kv) without weights, then dropout.
Tensor attend(const MultiheadAttention& mha, const Tensor& q, const Tensor& kv,
              const AttentionMasks& masks, double rate, Context* ctx, Loc loc) {
  const MultiheadAttentionCall call{.key_padding_mask = masks.key_padding_mask,
                                    .need_weights = false,
                                    .attn_mask = masks.attn_mask,
                                    .is_causal = masks.is_causal};
  const Tensor out =
      (ctx != nullptr ? mha(q, kv, kv, *ctx, call, loc) : mha(q, kv, kv, call, loc)).output;
  return drop(out, rate, ctx, loc);
}

// The feed-forward block: linear2(dropout(act(linear1(x)))), then dropout.
Tensor feed_forward(const Linear& linear1, const Linear& linear2, const std::string& activation,
                    const Tensor& x, double rate, Context* ctx, Loc loc) {
  const Tensor hidden = drop(Activation{activation}(linear1(x, loc), loc), rate, ctx, loc);
  return drop(linear2(hidden, loc), rate, ctx, loc);
}

// x + block(norm(x)) with norm_first, else norm(x + block(x)).
template <class Block>
Tensor residual(const Tensor& x, const LayerNorm& norm, bool norm_first, Block block, Loc loc) {
  return norm_first ? x + block(norm(x, loc)) : norm(x + block(x), loc);
}

}  // namespace

// ---- TransformerEncoderLayer -------------------------------------------------------------

TransformerEncoderLayer::TransformerEncoderLayer(int64_t d_model, int64_t nhead, const Tensor& key,
                                                 const Options& o)
    : dropout(o.dropout), activation(o.activation), norm_first(o.norm_first) {
  expect_options(kEncoderLayer, d_model, nhead, o);
  const Tensor keys = random::split(key, 3);
  self_attn = attention(d_model, nhead, index(keys, 0), o);
  linear1 = Linear(d_model, o.dim_feedforward, index(keys, 1), true, o.dtype);
  linear2 = Linear(o.dim_feedforward, d_model, index(keys, 2), true, o.dtype);
  norm1 = LayerNorm(Shape{d_model}, o.layer_norm_eps, o.dtype);
  norm2 = norm1;
}

Tensor TransformerEncoderLayer::operator()(const Tensor& src, const CallOptions& options,
                                           Loc loc) const {
  return forward(src, options, nullptr, loc);
}
Tensor TransformerEncoderLayer::operator()(const Tensor& src, Context& ctx,
                                           const CallOptions& options, Loc loc) const {
  return forward(src, options, &ctx, loc);
}

Tensor TransformerEncoderLayer::forward(const Tensor& src, const CallOptions& o, Context* ctx,
                                        Loc loc) const {
  const kiln::detail::CallSite site(loc);
  expect_sequence(kEncoderLayer, "src", src, linear1.weight, self_attn.batch_first);
  const AttentionMasks masks{o.src_mask, o.src_key_padding_mask, o.is_causal};
  Tensor x = residual(
      src, norm1, norm_first,
      [&](const Tensor& t) { return attend(self_attn, t, t, masks, dropout, ctx, loc); }, loc);
  x = residual(
      x, norm2, norm_first,
      [&](const Tensor& t) {
        return feed_forward(linear1, linear2, activation, t, dropout, ctx, loc);
      },
      loc);
  detail::summary_note("TransformerEncoderLayer", x, {});
  return x;
}

// ---- TransformerDecoderLayer -------------------------------------------------------------

TransformerDecoderLayer::TransformerDecoderLayer(int64_t d_model, int64_t nhead, const Tensor& key,
                                                 const Options& o)
    : dropout(o.dropout), activation(o.activation), norm_first(o.norm_first) {
  expect_options(kDecoderLayer, d_model, nhead, o);
  const Tensor keys = random::split(key, 4);
  self_attn = attention(d_model, nhead, index(keys, 0), o);
  multihead_attn = attention(d_model, nhead, index(keys, 1), o);
  linear1 = Linear(d_model, o.dim_feedforward, index(keys, 2), true, o.dtype);
  linear2 = Linear(o.dim_feedforward, d_model, index(keys, 3), true, o.dtype);
  norm1 = LayerNorm(Shape{d_model}, o.layer_norm_eps, o.dtype);
  norm2 = norm1;
  norm3 = norm1;
}

Tensor TransformerDecoderLayer::operator()(const Tensor& tgt, const Tensor& memory,
                                           const CallOptions& options, Loc loc) const {
  return forward(tgt, memory, options, nullptr, loc);
}
Tensor TransformerDecoderLayer::operator()(const Tensor& tgt, const Tensor& memory, Context& ctx,
                                           const CallOptions& options, Loc loc) const {
  return forward(tgt, memory, options, &ctx, loc);
}

Tensor TransformerDecoderLayer::forward(const Tensor& tgt, const Tensor& memory,
                                        const CallOptions& o, Context* ctx, Loc loc) const {
  const kiln::detail::CallSite site(loc);
  expect_sequence(kDecoderLayer, "tgt", tgt, linear1.weight, self_attn.batch_first);
  expect_sequence(kDecoderLayer, "memory", memory, linear1.weight, self_attn.batch_first);
  if (memory.rank() != tgt.rank())
    fail(kDecoderLayer, "memory does not match tgt: got tgt ", tgt.type(), " and memory ",
         memory.type(), ", expected both batched or both unbatched");
  const AttentionMasks self{o.tgt_mask, o.tgt_key_padding_mask, o.tgt_is_causal};
  const AttentionMasks cross{o.memory_mask, o.memory_key_padding_mask, o.memory_is_causal};
  Tensor x = residual(
      tgt, norm1, norm_first,
      [&](const Tensor& t) { return attend(self_attn, t, t, self, dropout, ctx, loc); }, loc);
  x = residual(
      x, norm2, norm_first,
      [&](const Tensor& t) { return attend(multihead_attn, t, memory, cross, dropout, ctx, loc); },
      loc);
  x = residual(
      x, norm3, norm_first,
      [&](const Tensor& t) {
        return feed_forward(linear1, linear2, activation, t, dropout, ctx, loc);
      },
      loc);
  detail::summary_note("TransformerDecoderLayer", x, {});
  return x;
}

// ---- the stacks --------------------------------------------------------------------------

namespace {

// The layers in turn, then the final norm when there is one.
template <class Layer, class Apply>
Tensor run_stack(std::string_view op, const std::vector<Layer>& layers,
                 const std::optional<LayerNorm>& norm, const Tensor& input, Loc loc, Apply apply) {
  if (layers.empty()) fail(op, "no layers: got an empty stack, expected num_layers >= 1");
  Tensor x = input;
  for (const Layer& layer : layers) x = apply(layer, x);
  return norm ? (*norm)(x, loc) : x;
}

template <class Layer>
std::vector<Layer> copies(std::string_view op, const Layer& layer, int64_t num_layers) {
  if (num_layers < 1) fail(op, "non-positive num_layers: got ", num_layers, ", expected >= 1");
  return std::vector<Layer>(static_cast<std::size_t>(num_layers), layer);
}

}  // namespace

TransformerEncoder::TransformerEncoder(const TransformerEncoderLayer& layer, int64_t num_layers,
                                       std::optional<LayerNorm> final_norm)
    : layers(copies("nn.TransformerEncoder", layer, num_layers)), norm(std::move(final_norm)) {}

Tensor TransformerEncoder::operator()(const Tensor& src, const TransformerEncoderCall& options,
                                      Loc loc) const {
  return forward(src, options, nullptr, loc);
}
Tensor TransformerEncoder::operator()(const Tensor& src, Context& ctx,
                                      const TransformerEncoderCall& options, Loc loc) const {
  return forward(src, options, &ctx, loc);
}

Tensor TransformerEncoder::forward(const Tensor& src, const TransformerEncoderCall& o, Context* ctx,
                                   Loc loc) const {
  const kiln::detail::CallSite site(loc);
  return run_stack("nn.TransformerEncoder", layers, norm, src, loc,
                   [&](const TransformerEncoderLayer& layer, const Tensor& x) {
                     return ctx != nullptr ? layer(x, *ctx, o, loc) : layer(x, o, loc);
                   });
}

TransformerDecoder::TransformerDecoder(const TransformerDecoderLayer& layer, int64_t num_layers,
                                       std::optional<LayerNorm> final_norm)
    : layers(copies("nn.TransformerDecoder", layer, num_layers)), norm(std::move(final_norm)) {}

Tensor TransformerDecoder::operator()(const Tensor& tgt, const Tensor& memory,
                                      const TransformerDecoderCall& options, Loc loc) const {
  return forward(tgt, memory, options, nullptr, loc);
}
Tensor TransformerDecoder::operator()(const Tensor& tgt, const Tensor& memory, Context& ctx,
                                      const TransformerDecoderCall& options, Loc loc) const {
  return forward(tgt, memory, options, &ctx, loc);
}

Tensor TransformerDecoder::forward(const Tensor& tgt, const Tensor& memory,
                                   const TransformerDecoderCall& o, Context* ctx, Loc loc) const {
  const kiln::detail::CallSite site(loc);
  return run_stack("nn.TransformerDecoder", layers, norm, tgt, loc,
                   [&](const TransformerDecoderLayer& layer, const Tensor& x) {
                     return ctx != nullptr ? layer(x, memory, *ctx, o, loc)
                                           : layer(x, memory, o, loc);
                   });
}

}  // namespace kiln::nn
