// kiln::nn attention: scaled dot-product attention and nn.MultiheadAttention's layer. Composed
// of matmul and elementwise/reduction primitives, so grad, vmap and jit need nothing new, and
// the jit fuses the masking and softmax between the two matmuls into one pass.
#include <cmath>

#include "kiln/error.h"
#include "kiln/nn.h"
#include "nn/input_checks.h"

namespace kiln::nn {

namespace {

using detail::expect_floating_input;

// A mask is bool (kept as is) or floating (cast to `dtype`); anything else is an Error.
// Broadcasting it to the scores' shape must not grow it.
Tensor checked_mask(std::string_view op, std::string_view what, const Tensor& mask,
                    const Shape& scores, DType dtype) {
  if (!mask.defined())
    fail(op, "undefined ", what, ": got a default-constructed Tensor, expected a bool or ",
         "floating tensor");
  if (mask.dtype() != bool_ && !is_floating(mask.dtype()))
    fail(op, what, " must be bool or floating point: got ", mask.type(),
         ", expected bool or f16, bf16, f32, f64");
  bool ok = mask.rank() <= scores.rank();
  for (int i = 1; ok && i <= mask.rank(); ++i) {
    const int64_t m = mask.shape()[mask.rank() - i], t = scores[scores.rank() - i];
    ok = m == t || m == 1;
  }
  if (!ok)
    fail(op, what, " does not broadcast to the scores: got ", mask.type(), " for scores ", scores,
         ", expected a shape that broadcasts to ", scores);
  return mask.dtype() == bool_ ? mask : astype(mask, dtype);
}

// The scores' shape [..., L, S]: q's and k's batch axes broadcast.
Shape scores_shape(const Tensor& q, const Tensor& k) {
  const auto batch = [](const Tensor& t) {
    return Shape(std::vector<int64_t>(t.shape().begin(), t.shape().end() - 2));
  };
  const Shape both = broadcast_shapes("nn.attention", batch(q), batch(k));
  std::vector<int64_t> dims(both.begin(), both.end());
  dims.push_back(q.shape()[q.rank() - 2]);
  dims.push_back(k.shape()[k.rank() - 2]);
  return Shape(dims);
}

// What the masks do to the scores: a bool `keep` (false: weight 0) and an additive `bias`,
// each broadcasting to the scores.
struct Masking {
  std::optional<Tensor> keep, bias;
};

Masking masking(std::string_view op, const AttentionOptions& o, const Shape& shape, DType dtype,
                Loc loc) {
  Masking m;
  const auto apply = [&](const Tensor& mask, bool true_keeps) {
    if (mask.dtype() == bool_) {
      const Tensor keep = true_keeps ? mask : logical_not(mask, loc);
      m.keep = m.keep ? logical_and(*m.keep, keep, loc) : keep;
    } else {
      m.bias = m.bias ? *m.bias + mask : mask;
    }
  };
  const int64_t l = shape[shape.rank() - 2], n = shape[shape.rank() - 1];
  if (o.is_causal)
    apply(expand_dims(arange(l, int64, loc), 1, loc) >= expand_dims(arange(n, int64, loc), 0, loc),
          true);
  if (o.attn_mask) apply(checked_mask(op, "attn_mask", *o.attn_mask, shape, dtype), true);
  if (o.key_padding_mask) {
    const Tensor& kpm = *o.key_padding_mask;
    if (kpm.defined() && kpm.rank() < 1)
      fail(op, "key_padding_mask has too few dimensions: got ", kpm.type(), ", expected [..., ", n,
           "]");
    apply(checked_mask(op, "key_padding_mask", kpm.defined() ? expand_dims(kpm, -2, loc) : kpm,
                       shape, dtype),
          false);
  }
  return m;
}

// softmax over the last axis where -inf scores weigh 0 and a row of -inf scores gives 0s
// (not 0/0). The masked scores are -inf before exp, so their exp and its derivative are exact
// zeros whatever the raw score was (a where after exp would let an overflowing exp put
// inf * 0 = NaN into the gradient).
Tensor safe_softmax(const Tensor& s, Loc loc) {
  const Tensor m = stop_gradient(max(s, {-1}, true, loc), loc);
  const Tensor zero = scalar_like(m, 0.0);
  const Tensor e = exp(s - where(m == -INFINITY, zero, m, loc), loc);
  const Tensor d = sum(e, {-1}, true, loc);
  return e / where(d == 0.0, scalar_like(d, 1.0), d, loc);
}

}  // namespace

Tensor attention_weights(const Tensor& q, const Tensor& k, const AttentionOptions& o, Loc loc) {
  const kiln::detail::CallSite site(loc);
  constexpr std::string_view op = "nn.attention";
  expect_floating_input(op, "query", q, 2, "[..., L, E]");
  expect_floating_input(op, "key", k, 2, "[..., S, E]");
  const int64_t e = q.shape()[q.rank() - 1];
  if (k.dtype() != q.dtype() || k.shape()[k.rank() - 1] != e)
    fail(op, "key does not match the query: got query ", q.type(), " and key ", k.type(),
         ", expected key [..., S, ", e, "] of the same dtype");
  if (!(o.dropout >= 0.0 && o.dropout < 1.0))
    fail(op, "dropout out of range: got ", o.dropout, ", expected [0, 1)");
  if (o.dropout > 0.0 && !o.dropout_key)
    fail(op, "dropout needs a random key: got dropout ", o.dropout,
         " without dropout_key, expected both");
  const double scale = o.scale.value_or(1.0 / std::sqrt(static_cast<double>(e)));
  // The masks first, so that under jit the scaling, masking and softmax are consecutive
  // equations after the matmul and fuse into one loop nest.
  const Masking m = masking(op, o, scores_shape(q, k), q.dtype(), loc);
  Tensor s = matmul(q, swapaxes(k, -1, -2, loc), loc) * scale;
  if (m.bias) s = s + *m.bias;
  if (m.keep) s = where(*m.keep, s, scalar_like(s, -INFINITY), loc);
  Tensor w = safe_softmax(s, loc);
  if (o.dropout > 0.0) {
    const Tensor kept = random::bernoulli(*o.dropout_key, 1.0 - o.dropout, w.shape(), loc);
    w = where(kept, w * (1.0 / (1.0 - o.dropout)), scalar_like(w, 0.0), loc);
  }
  return w;
}

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const AttentionOptions& o, Loc loc) {
  const kiln::detail::CallSite site(loc);
  constexpr std::string_view op = "nn.attention";
  expect_floating_input(op, "value", v, 2, "[..., S, Ev]");
  if (k.defined() && k.rank() >= 2 &&
      (v.dtype() != k.dtype() || v.shape()[v.rank() - 2] != k.shape()[k.rank() - 2]))
    fail(op, "value does not match the key: got key ", k.type(), " and value ", v.type(),
         ", expected value [..., ", k.shape()[k.rank() - 2], ", Ev] of the same dtype");
  return matmul(attention_weights(q, k, o, loc), v, loc);
}

// ---- MultiheadAttention -------------------------------------------------------------------

MultiheadAttention::MultiheadAttention(int64_t embed_dim, int64_t heads, const Tensor& key,
                                       const Options& o)
    : num_heads(heads), batch_first(o.batch_first), dropout(o.dropout) {
  constexpr std::string_view op = "nn.MultiheadAttention";
  const int64_t kdim = o.kdim.value_or(embed_dim), vdim = o.vdim.value_or(embed_dim);
  if (embed_dim < 1 || heads < 1 || kdim < 1 || vdim < 1)
    fail(op, "non-positive size: got embed_dim=", embed_dim, ", num_heads=", heads, ", kdim=", kdim,
         ", vdim=", vdim, ", expected sizes >= 1");
  if (embed_dim % heads != 0)
    fail(op, "embed_dim not divisible by num_heads: got embed_dim=", embed_dim,
         ", num_heads=", heads, ", expected a multiple of num_heads");
  if (!(o.dropout >= 0.0 && o.dropout < 1.0))
    fail(op, "dropout out of range: got ", o.dropout, ", expected [0, 1)");
  // PyTorch's _reset_parameters: xavier_uniform projections, zero biases; out_proj keeps
  // Linear's weight initialisation.
  const auto [k_in, rest] = random::split(key);
  const auto [k_out, k_sep] = random::split(rest);
  if (kdim == embed_dim && vdim == embed_dim) {
    in_proj_weight = init::xavier_uniform(k_in, {3 * embed_dim, embed_dim}, 1.0, o.dtype);
  } else {
    const auto [kq, kkv] = random::split(k_sep);
    const auto [kk, kv] = random::split(kkv);
    q_proj_weight = init::xavier_uniform(kq, {embed_dim, embed_dim}, 1.0, o.dtype);
    k_proj_weight = init::xavier_uniform(kk, {embed_dim, kdim}, 1.0, o.dtype);
    v_proj_weight = init::xavier_uniform(kv, {embed_dim, vdim}, 1.0, o.dtype);
  }
  out_proj = Linear(embed_dim, embed_dim, k_out, o.bias, o.dtype);
  if (o.bias) {
    in_proj_bias = zeros({3 * embed_dim}, o.dtype);
    out_proj.bias = zeros({embed_dim}, o.dtype);
  }
}

MultiheadAttention::Result MultiheadAttention::operator()(const Tensor& query, const Tensor& key,
                                                          const Tensor& value,
                                                          const CallOptions& options,
                                                          Loc loc) const {
  return forward(query, key, value, options, nullptr, loc);
}

MultiheadAttention::Result MultiheadAttention::operator()(const Tensor& query, const Tensor& key,
                                                          const Tensor& value, Context& ctx,
                                                          const CallOptions& options,
                                                          Loc loc) const {
  return forward(query, key, value, options, &ctx, loc);
}

MultiheadAttention::Result MultiheadAttention::forward(const Tensor& query, const Tensor& key,
                                                       const Tensor& value, const CallOptions& o,
                                                       Context* ctx, Loc loc) const {
  const kiln::detail::CallSite site(loc);
  constexpr std::string_view op = "nn.MultiheadAttention";
  const Tensor& wq = in_proj_weight ? *in_proj_weight : *q_proj_weight;
  const int64_t e = wq.shape()[1], h = num_heads, d = e / h;
  const int64_t kdim = in_proj_weight ? e : k_proj_weight->shape()[1];
  const int64_t vdim = in_proj_weight ? e : v_proj_weight->shape()[1];
  const std::string_view layout = batch_first ? "[N, L, E] or [L, E]" : "[L, N, E] or [L, E]";
  expect_floating_input(op, "query", query, 2, layout);
  expect_floating_input(op, "key", key, 2, layout);
  expect_floating_input(op, "value", value, 2, layout);
  const bool batched = query.rank() == 3;
  const int rank = batched ? 3 : 2;
  const auto expect_features = [&](std::string_view what, const Tensor& t, int64_t features) {
    if (t.rank() != rank || t.shape()[rank - 1] != features || t.dtype() != wq.dtype())
      fail(op, what, " does not match the layer: got ", t.type(), " for query ", query.type(),
           " and weights ", wq.type(), ", expected ", rank, " dimensions, ", features,
           " features and the weights' dtype");
  };
  expect_features("query", query, e);
  expect_features("key", key, kdim);
  expect_features("value", value, vdim);
  // Batch first from here on: [N, L, E].
  const auto to_nle = [&](const Tensor& t) {
    if (!batched) return expand_dims(t, 0, loc);
    return batch_first ? t : swapaxes(t, 0, 1, loc);
  };
  const Tensor q = to_nle(query), k = to_nle(key), v = to_nle(value);
  const int64_t n = q.shape()[0], l = q.shape()[1], s = k.shape()[1];
  if (k.shape()[0] != n || v.shape()[0] != n || v.shape()[1] != s)
    fail(op, "query, key and value do not match: got query ", query.type(), ", key ", key.type(),
         " and value ", value.type(), ", expected one batch size and as many values as keys");

  const auto project = [&](const Tensor& x, int which, const std::optional<Tensor>& w) {
    const Tensor weight =
        in_proj_weight ? slice(*in_proj_weight, {Slice{which * e, (which + 1) * e}}, loc) : *w;
    Tensor y = matmul(x, transpose(weight, loc), loc);
    if (in_proj_bias) y = y + slice(*in_proj_bias, {Slice{which * e, (which + 1) * e}}, loc);
    // [N, T, E] -> [N, H, T, D]
    return swapaxes(reshape(y, {n, x.shape()[1], h, d}, loc), 1, 2, loc);
  };
  const Tensor qh = project(q, 0, q_proj_weight), kh = project(k, 1, k_proj_weight),
               vh = project(v, 2, v_proj_weight);

  AttentionOptions a{.is_causal = o.is_causal};
  if (o.key_padding_mask) {
    const Tensor& kpm = *o.key_padding_mask;
    const Shape want = batched ? Shape{n, s} : Shape{s};
    if (!kpm.defined() || kpm.shape() != want)
      fail(op, "key_padding_mask does not match the keys: got ",
           kpm.defined() ? kpm.type() : TensorType{}, ", expected shape ", want);
    a.key_padding_mask = reshape(kpm, {n, 1, s}, loc);
  }
  if (o.attn_mask) {
    const Tensor& m = *o.attn_mask;
    const bool ok = m.defined() && (m.shape() == Shape{l, s} || m.shape() == Shape{n * h, l, s});
    if (!ok)
      fail(op, "attn_mask does not match: got ", m.defined() ? m.type() : TensorType{},
           ", expected shape ", Shape{l, s}, " or ", Shape{n * h, l, s});
    // PyTorch's MultiheadAttention masks where a bool mask is true.
    const Tensor allowed = m.dtype() == bool_ ? logical_not(m, loc) : m;
    a.attn_mask = m.rank() == 3 ? reshape(allowed, {n, h, l, s}, loc) : allowed;
  }
  if (ctx != nullptr && ctx->training() && dropout > 0.0) {
    a.dropout = dropout;
    a.dropout_key = ctx->next_key(op);
  }
  const Tensor w = attention_weights(qh, kh, a, loc);  // [N, H, L, S]
  const Tensor heads = matmul(w, vh, loc);             // [N, H, L, D]
  Tensor out = out_proj(reshape(swapaxes(heads, 1, 2, loc), {n, l, e}, loc), loc);
  out = !batched ? squeeze(out, {0}, loc) : batch_first ? out : swapaxes(out, 0, 1, loc);
  Result r{out, std::nullopt};
  if (o.need_weights) {
    Tensor weights = o.average_attn_weights ? mean(w, {1}, false, loc) : w;
    r.weights = batched ? weights : squeeze(weights, {0}, loc);
  }
  detail::summary_note(
      "MultiheadAttention", out,
      {in_proj_weight ? &*in_proj_weight : nullptr, q_proj_weight ? &*q_proj_weight : nullptr,
       k_proj_weight ? &*k_proj_weight : nullptr, v_proj_weight ? &*v_proj_weight : nullptr,
       in_proj_bias ? &*in_proj_bias : nullptr});
  return r;
}

}  // namespace kiln::nn
