// nn::RNN, LSTM's proj_size and dropout, and the transformer layers (TransformerEncoderLayer,
// TransformerDecoderLayer and their stacks).
//
// Each layer against an independent reference written here from the equations with plain
// operations (time steps looped by hand, attention per head, layer norm from its formula),
// parameter gradients against float64 central finite differences, dropout's determinism and
// keep rate, and the errors. PyTorch comparisons: python/tests/test_nn_recurrent.py and
// test_nn_transformer.py.
#include <gtest/gtest.h>
#include <kiln/kiln.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "nn_checks.h"
#include "testing.h"

namespace kiln {
namespace {

using nn_checks::expect_close;
using testing::expect_error;

Tensor normal(uint64_t seed, const Shape& shape) {
  return random::normal(random::key(seed), shape, float64);
}

// x W^T + b, written out.
Tensor affine(const Tensor& x, const Tensor& w, const std::optional<Tensor>& b) {
  const Tensor y = matmul(x, transpose(w));
  return b ? y + *b : y;
}

// ---- recurrent references -----------------------------------------------------------------

struct HandState {
  Tensor h, c;  // c unused by the RNN
};

// The stack stepped by hand over x [T, N, I]: every layer and direction a loop over time,
// layer inputs the concatenated directions. Returns the outputs and the final states in
// PyTorch's order.
std::pair<Tensor, std::vector<HandState>> hand_stack(
    const Tensor& x, int64_t layers, int64_t dirs, const std::vector<HandState>& init,
    const std::function<HandState(std::size_t, const Tensor&, const HandState&)>& step) {
  Tensor in = x;
  std::vector<HandState> finals;
  const int64_t steps = x.shape()[0];
  for (int64_t l = 0; l < layers; ++l) {
    std::vector<Tensor> per_dir;
    for (int64_t d = 0; d < dirs; ++d) {
      const auto i = static_cast<std::size_t>(l * dirs + d);
      HandState s = init[i];
      std::vector<Tensor> ys(static_cast<std::size_t>(steps));
      for (int64_t k = 0; k < steps; ++k) {
        const int64_t t = d == 0 ? k : steps - 1 - k;
        s = step(i, index(in, t), s);
        ys[static_cast<std::size_t>(t)] = s.h;
      }
      per_dir.push_back(stack(ys, 0));
      finals.push_back(s);
    }
    in = concatenate(per_dir, -1);
  }
  return {in, finals};
}

HandState rnn_step(const nn::RNNCell& c, const Tensor& x, const HandState& s) {
  const Tensor pre = affine(x, c.weight_ih, c.bias_ih) + affine(s.h, c.weight_hh, c.bias_hh);
  return {c.nonlinearity == "relu" ? maximum(pre, scalar_like(pre, 0.0)) : tanh(pre), {}};
}

HandState lstm_step(const nn::LSTMCell& c, const Tensor& x, const HandState& s) {
  const Tensor g = affine(x, c.weight_ih, c.bias_ih) + affine(s.h, c.weight_hh, c.bias_hh);
  const int64_t hidden = c.weight_ih.shape()[0] / 4;
  const auto gate = [&](int64_t k) {
    return slice(g, {Slice{}, Slice{k * hidden, (k + 1) * hidden}});
  };
  const auto sig = [](const Tensor& t) { return 1.0 / (1.0 + exp(-t)); };
  const Tensor cell = sig(gate(1)) * s.c + sig(gate(0)) * tanh(gate(2));
  const Tensor h = sig(gate(3)) * tanh(cell);
  return {matmul(h, transpose(*c.weight_hr)), cell};
}

TEST(SequenceLayers, RnnIsItsCellEquationSteppedByHand) {
  for (const std::string act : {"tanh", "relu"}) {
    const nn::RNN rnn(
        3, 4, random::key(1),
        {.num_layers = 2, .bidirectional = true, .nonlinearity = act, .dtype = float64});
    const Tensor x = normal(2, {5, 2, 3}), h0 = normal(3, {4, 2, 4});
    std::vector<HandState> init;
    for (int64_t i = 0; i < 4; ++i) init.push_back({index(h0, i), {}});
    const auto [want_y, finals] =
        hand_stack(x, 2, 2, init, [&](std::size_t i, const Tensor& xt, const HandState& s) {
          return rnn_step(rnn.cells[i], xt, s);
        });
    const auto [y, h] = rnn(x, h0);
    expect_close(y, want_y, 1e-12, act + " outputs");
    std::vector<Tensor> hs;
    for (const HandState& s : finals) hs.push_back(s.h);
    expect_close(h, stack(hs, 0), 1e-12, act + " final h");
  }
}

TEST(SequenceLayers, RnnBatchFirstAndUnbatchedAreTheTimeMajorLayer) {
  nn::RNN rnn(3, 4, random::key(4), {.num_layers = 2, .bias = false, .dtype = float64});
  const Tensor x = normal(5, {6, 2, 3});
  const auto [y, h] = rnn(x);
  nn::RNN first = rnn;
  first.batch_first = true;
  const auto [yb, hb] = first(swapaxes(x, 0, 1));
  expect_close(swapaxes(yb, 0, 1), y, 1e-12, "batch_first");
  expect_close(hb, h, 1e-12, "batch_first h");
  const auto second = [](const Tensor& t) { return index(swapaxes(t, 0, 1), 1); };
  const auto [yu, hu] = rnn(second(x));
  expect_close(yu, second(y), 1e-12, "unbatched");
  expect_close(hu, second(h), 1e-12, "unbatched h");
}

TEST(SequenceLayers, LstmProjectionIsTheCellEquationSteppedByHand) {
  const nn::LSTM lstm(3, 5, random::key(6),
                      {.num_layers = 2, .bidirectional = true, .proj_size = 2, .dtype = float64});
  ASSERT_TRUE(lstm.cells[2].weight_hr.has_value());
  EXPECT_EQ(lstm.cells[2].weight_ih.shape(), (Shape{20, 4}));  // D P inputs after layer 0
  EXPECT_EQ(lstm.cells[0].weight_hh.shape(), (Shape{20, 2}));
  EXPECT_EQ(lstm.cells[0].weight_hr->shape(), (Shape{2, 5}));
  const Tensor x = normal(7, {4, 3, 3}), h0 = normal(8, {4, 3, 2}), c0 = normal(9, {4, 3, 5});
  std::vector<HandState> init;
  for (int64_t i = 0; i < 4; ++i) init.push_back({index(h0, i), index(c0, i)});
  const auto [want_y, finals] =
      hand_stack(x, 2, 2, init, [&](std::size_t i, const Tensor& xt, const HandState& s) {
        return lstm_step(lstm.cells[i], xt, s);
      });
  const auto [y, s] = lstm(x, nn::LSTMState{h0, c0});
  expect_close(y, want_y, 1e-12, "outputs");
  std::vector<Tensor> hs, cs;
  for (const HandState& f : finals) {
    hs.push_back(f.h);
    cs.push_back(f.c);
  }
  expect_close(s.h, stack(hs, 0), 1e-12, "h");
  expect_close(s.c, stack(cs, 0), 1e-12, "c");
}

TEST(SequenceLayers, ParameterGradientsMatchFiniteDifferences) {
  const nn::RNN rnn(2, 3, random::key(10),
                    {.num_layers = 2, .bidirectional = true, .dtype = float64});
  const nn::LSTM lstm(2, 3, random::key(11), {.num_layers = 2, .proj_size = 2, .dtype = float64});
  const Tensor x = normal(12, {3, 2, 2});
  const auto rnn_loss = [&](const nn::RNN& m) {
    const auto [y, h] = m(x);
    return sum(sin(y)) + sum(square(h));
  };
  const auto lstm_loss = [&](const nn::LSTM& m) {
    const auto [y, s] = m(x);
    return sum(sin(y)) + sum(s.c) + sum(square(s.h));
  };
  nn_checks::expect_tree_close(
      grad(rnn_loss)(rnn),
      nn_checks::finite_differences<nn::RNN>(
          [&](const nn::RNN& m) { return rnn_loss(m).item<double>(); }, rnn),
      1e-7);
  nn_checks::expect_tree_close(
      grad(lstm_loss)(lstm),
      nn_checks::finite_differences<nn::LSTM>(
          [&](const nn::LSTM& m) { return lstm_loss(m).item<double>(); }, lstm),
      1e-7);
}

TEST(SequenceLayers, DropoutBetweenLayersOnlyInTraining) {
  const nn::GRU gru(4, 6, random::key(13), {.num_layers = 3, .dropout = 0.4});
  const Tensor x = random::normal(random::key(14), {5, 2, 4});
  const Tensor y = gru(x).first;
  nn::Context eval = nn::Context::eval();
  expect_close(gru(x, eval).first, y, 0, "eval");
  nn::Context a = nn::Context::train(random::key(15)), b = nn::Context::train(random::key(15));
  const Tensor ya = gru(x, a).first;
  expect_close(gru(x, b).first, ya, 0, "same key");
  EXPECT_FALSE(allclose(ya, y).item<bool>());
  // One layer: nothing between layers, training is evaluation.
  const nn::GRU one(4, 6, random::key(13), {.dropout = 0.4});
  nn::Context c = nn::Context::train(random::key(16));
  expect_close(one(x, c).first, one(x).first, 0, "one layer");
}

TEST(SequenceLayers, DropoutKeepsAtTheRate) {
  // The second layer is the identity on its input (relu, identity weights, no recurrence), so
  // its output is the dropout mask on the first layer's ones.
  const double rate = 0.25;
  nn::RNN rnn(1, 500, random::key(17),
              {.num_layers = 2, .bias = false, .dropout = rate, .nonlinearity = "relu"});
  rnn.cells[0].weight_ih = ones({500, 1});
  rnn.cells[0].weight_hh = zeros({500, 500});
  rnn.cells[1].weight_ih = eye(500);
  rnn.cells[1].weight_hh = zeros({500, 500});
  nn::Context ctx = nn::Context::train(random::key(18));
  const std::vector<float> y = rnn(ones({40, 1, 1}), ctx).first.to_vector<float>();
  int64_t dropped = 0;
  for (float v : y) {
    if (v == 0.0f) {
      ++dropped;
    } else {
      EXPECT_NEAR(v, 1.0 / (1.0 - rate), 1e-6);
    }
  }
  // 20,000 draws: a standard deviation of 0.003.
  EXPECT_NEAR(static_cast<double>(dropped) / static_cast<double>(y.size()), rate, 0.015);
}

TEST(SequenceLayers, RecurrentErrors) {
  expect_error([] { nn::RNN(3, 4, random::key(0), {.nonlinearity = "sigmoid"}); }, "nn.RNN",
               {"unknown nonlinearity", "got \"sigmoid\"", "expected \"tanh\" or \"relu\""});
  expect_error([] { nn::RNNCell(3, 4, random::key(0), true, "gelu"); }, "nn.RNNCell",
               {"unknown nonlinearity"});
  expect_error([] { nn::LSTM(3, 4, random::key(0), {.proj_size = 4}); }, "nn.LSTM",
               {"proj_size out of range", "got 4 for hidden_size 4", "[1, hidden_size)"});
  expect_error([] { nn::GRU(3, 4, random::key(0), {.proj_size = 2}); }, "nn.GRU",
               {"proj_size out of range", "only LSTM projects"});
  expect_error([] { nn::LSTM(3, 4, random::key(0), {.nonlinearity = "relu"}); }, "nn.LSTM",
               {"nonlinearity is an RNN's setting"});
  expect_error([] { nn::RNN(3, 4, random::key(0), {.dropout = 1.0}); }, "nn.RNN",
               {"dropout out of range", "expected [0, 1)"});
  const nn::LSTM lstm(3, 4, random::key(0), {.proj_size = 2});
  expect_error(
      [&] {
        lstm(zeros({5, 1, 3}), nn::LSTMState{zeros({1, 1, 4}), zeros({1, 1, 4})});
      },
      "nn.LSTM", {"state does not match", "got f32[1,1,4]", "expected shape [1, 1, 2]"});
  nn::RNN rnn(3, 4, random::key(0));
  rnn.cells[0].nonlinearity = "softsign";
  expect_error([&] { rnn(zeros({5, 1, 3})); }, "nn.RNN", {"unknown nonlinearity"});
}

// ---- transformer references ------------------------------------------------------------

Tensor hand_layer_norm(const nn::LayerNorm& n, const Tensor& x) {
  const Tensor mu = mean(x, {-1}, true);
  const Tensor var = mean(square(x - mu), {-1}, true);
  return (x - mu) / sqrt(var + n.eps) * *n.weight + *n.bias;
}

// Multi-head attention over batch-first [N, L, E] inputs, one head at a time; `allowed` [L, S]
// (true: may attend) and the padding [N, S] (true: ignored).
Tensor hand_attention(const nn::MultiheadAttention& m, const Tensor& q, const Tensor& kv,
                      const std::optional<Tensor>& allowed, const std::optional<Tensor>& padding) {
  const int64_t e = q.shape()[2], h = m.num_heads, d = e / h;
  const Tensor& w = *m.in_proj_weight;
  const Tensor& b = *m.in_proj_bias;
  const auto part = [&](const Tensor& t, int64_t k) {
    return slice(t, {Slice{k * e, (k + 1) * e}});
  };
  const Tensor qp = affine(q, part(w, 0), part(b, 0)), kp = affine(kv, part(w, 1), part(b, 1)),
               vp = affine(kv, part(w, 2), part(b, 2));
  std::vector<Tensor> heads;
  for (int64_t j = 0; j < h; ++j) {
    const auto head = [&](const Tensor& t) {
      return slice(t, {Slice{}, Slice{}, Slice{j * d, (j + 1) * d}});
    };
    Tensor s = matmul(head(qp), swapaxes(head(kp), 1, 2)) / std::sqrt(static_cast<double>(d));
    const Tensor minus_inf = full_like(s, -INFINITY);
    if (allowed) s = where(*allowed, s, minus_inf);
    if (padding) s = where(expand_dims(*padding, 1), minus_inf, s);
    const Tensor ex = exp(s - max(s, {-1}, true));
    heads.push_back(matmul(ex / sum(ex, {-1}, true), head(vp)));
  }
  return affine(concatenate(heads, -1), m.out_proj.weight, m.out_proj.bias);
}

Tensor hand_feed_forward(const Tensor& x, const nn::Linear& l1, const nn::Linear& l2, bool gelu) {
  const Tensor a = affine(x, l1.weight, l1.bias);
  const Tensor act =
      gelu ? 0.5 * a * (1.0 + erf(a / std::sqrt(2.0))) : maximum(a, scalar_like(a, 0.0));
  return affine(act, l2.weight, l2.bias);
}

Tensor causal_allowed(int64_t n) {
  return expand_dims(arange(n, int64), 1) >= expand_dims(arange(n, int64), 0);
}

// Parameters that are zero or one at initialisation moved, so each one matters.
template <class M>
M perturbed(const M& model, uint64_t seed) {
  auto [leaves, def] = tree_flatten(model);
  for (std::size_t i = 0; i < leaves.size(); ++i)
    if (leaves[i].defined()) leaves[i] = leaves[i] + 0.1 * normal(seed + i, leaves[i].shape());
  return tree_unflatten<M>(def, leaves);
}

nn::TransformerLayerOptions layer_options(bool norm_first, bool gelu) {
  return {.dim_feedforward = 6,
          .dropout = 0.0,
          .activation = gelu ? "gelu" : "relu",
          .batch_first = true,
          .norm_first = norm_first,
          .dtype = float64};
}

TEST(TransformerLayers, EncoderLayerIsItsEquations) {
  for (const bool norm_first : {false, true})
    for (const bool gelu : {false, true}) {
      const auto layer = perturbed(
          nn::TransformerEncoderLayer(4, 2, random::key(20), layer_options(norm_first, gelu)), 100);
      const Tensor x = normal(21, {2, 5, 4});
      const Tensor pad = tensor(std::vector<bool>{false, false, false, false, false,  //
                                                  false, false, false, true, true},
                                {2, 5});
      const auto sa = [&](const Tensor& t) {
        return hand_attention(layer.self_attn, t, t, causal_allowed(5), pad);
      };
      const auto ff = [&](const Tensor& t) {
        return hand_feed_forward(t, layer.linear1, layer.linear2, gelu);
      };
      Tensor want;
      if (norm_first) {
        want = x + sa(hand_layer_norm(layer.norm1, x));
        want = want + ff(hand_layer_norm(layer.norm2, want));
      } else {
        want = hand_layer_norm(layer.norm1, x + sa(x));
        want = hand_layer_norm(layer.norm2, want + ff(want));
      }
      const std::string what =
          std::string(norm_first ? "norm_first" : "post-norm") + (gelu ? " gelu" : " relu");
      expect_close(layer(x, {.src_key_padding_mask = pad, .is_causal = true}), want, 1e-12, what);
      // A bool src_mask is true where attending is NOT allowed.
      expect_close(
          layer(x, {.src_mask = logical_not(causal_allowed(5)), .src_key_padding_mask = pad}), want,
          1e-12, what + " src_mask");
    }
}

TEST(TransformerLayers, DecoderLayerIsItsEquations) {
  for (const bool norm_first : {false, true}) {
    const auto layer = perturbed(
        nn::TransformerDecoderLayer(4, 2, random::key(22), layer_options(norm_first, false)), 200);
    const Tensor tgt = normal(23, {2, 3, 4}), memory = normal(24, {2, 6, 4});
    const Tensor mpad = tensor(std::vector<bool>{false, false, false, false, true, true,  //
                                                 false, false, false, false, false, false},
                               {2, 6});
    const auto sa = [&](const Tensor& t) {
      return hand_attention(layer.self_attn, t, t, causal_allowed(3), std::nullopt);
    };
    const auto ca = [&](const Tensor& t) {
      return hand_attention(layer.multihead_attn, t, memory, std::nullopt, mpad);
    };
    const auto ff = [&](const Tensor& t) {
      return hand_feed_forward(t, layer.linear1, layer.linear2, false);
    };
    Tensor want;
    if (norm_first) {
      want = tgt + sa(hand_layer_norm(layer.norm1, tgt));
      want = want + ca(hand_layer_norm(layer.norm2, want));
      want = want + ff(hand_layer_norm(layer.norm3, want));
    } else {
      want = hand_layer_norm(layer.norm1, tgt + sa(tgt));
      want = hand_layer_norm(layer.norm2, want + ca(want));
      want = hand_layer_norm(layer.norm3, want + ff(want));
    }
    expect_close(layer(tgt, memory, {.memory_key_padding_mask = mpad, .tgt_is_causal = true}), want,
                 1e-12, norm_first ? "norm_first" : "post-norm");
  }
}

TEST(TransformerLayers, StacksAreTheirLayersInTurn) {
  const auto enc_layer =
      nn::TransformerEncoderLayer(4, 2, random::key(25), layer_options(false, false));
  const nn::LayerNorm norm(Shape{4}, 1e-5, float64);
  auto encoder = perturbed(nn::TransformerEncoder(enc_layer, 3, norm), 300);
  EXPECT_EQ(encoder.layers.size(), 3u);
  const Tensor x = normal(26, {2, 5, 4});
  Tensor want = x;
  for (const auto& l : encoder.layers) want = l(want, {.is_causal = true});
  expect_close(encoder(x, {.is_causal = true}), hand_layer_norm(*encoder.norm, want), 1e-12,
               "encoder");
  auto decoder = perturbed(
      nn::TransformerDecoder(
          nn::TransformerDecoderLayer(4, 2, random::key(27), layer_options(true, true)), 2),
      400);
  EXPECT_FALSE(decoder.norm.has_value());
  const Tensor tgt = normal(28, {2, 3, 4});
  Tensor dwant = tgt;
  for (const auto& l : decoder.layers) dwant = l(dwant, x);
  expect_close(decoder(tgt, x), dwant, 1e-12, "decoder");
  const std::vector<std::string> names = tree_names(tree_flatten(encoder).second);
  EXPECT_EQ(names.front(), "layers.0.self_attn.in_proj_weight");
  EXPECT_EQ(names.back(), "norm.bias");
}

TEST(TransformerLayers, ParameterGradientsMatchFiniteDifferences) {
  const auto layer = perturbed(
      nn::TransformerEncoderLayer(4, 2, random::key(29), layer_options(false, true)), 500);
  const Tensor x = normal(30, {2, 3, 4});
  const auto loss = [&](const nn::TransformerEncoderLayer& m) {
    return sum(sin(m(x, {.is_causal = true})));
  };
  nn_checks::expect_tree_close(
      grad(loss)(layer),
      nn_checks::finite_differences<nn::TransformerEncoderLayer>(
          [&](const nn::TransformerEncoderLayer& m) { return loss(m).item<double>(); }, layer),
      1e-7);
}

TEST(TransformerLayers, DropoutOnlyInTrainingAndDeterministic) {
  const nn::TransformerEncoderLayer layer(8, 2, random::key(31), {.dim_feedforward = 16});
  EXPECT_EQ(layer.dropout, 0.1);
  const Tensor x = random::normal(random::key(32), {5, 2, 8});
  const Tensor y = layer(x);
  nn::Context eval = nn::Context::eval();
  expect_close(layer(x, eval), y, 0, "eval");
  nn::Context a = nn::Context::train(random::key(33)), b = nn::Context::train(random::key(33));
  const Tensor ya = layer(x, a);
  expect_close(layer(x, b), ya, 0, "same key");
  EXPECT_FALSE(allclose(ya, y).item<bool>());
}

TEST(TransformerLayers, Errors) {
  expect_error([] { nn::TransformerEncoderLayer(10, 3, random::key(0)); },
               "nn.TransformerEncoderLayer", {"d_model not divisible by nhead"});
  expect_error([] { nn::TransformerDecoderLayer(8, 2, random::key(0), {.activation = "tanh"}); },
               "nn.TransformerDecoderLayer",
               {"unknown activation", "expected \"relu\" or \"gelu\""});
  expect_error([] { nn::TransformerEncoderLayer(8, 2, random::key(0), {.dropout = -0.1}); },
               "nn.TransformerEncoderLayer", {"dropout out of range"});
  const nn::TransformerEncoderLayer layer(8, 2, random::key(0), {.dim_feedforward = 4});
  expect_error(
      [&] {
        layer(zeros({3, 2, 6}));
      },
      "nn.TransformerEncoderLayer", {"src does not match the layer", "got f32[3,2,6]"});
  expect_error(
      [&] {
        layer(zeros({3, 2, 8}, int32));
      },
      "nn.TransformerEncoderLayer", {"src must be floating point"});
  expect_error([&] { nn::TransformerEncoder(layer, 0); }, "nn.TransformerEncoder",
               {"non-positive num_layers"});
  expect_error(
      [] {
        nn::TransformerEncoder{}(zeros({3, 2, 8}));
      },
      "nn.TransformerEncoder", {"no layers"});
  const nn::TransformerDecoderLayer dec(8, 2, random::key(0), {.dim_feedforward = 4});
  expect_error(
      [&] {
        dec(zeros({3, 2, 8}), zeros({4, 8}));
      },
      "nn.TransformerDecoderLayer", {"memory does not match tgt"});
}

}  // namespace
}  // namespace kiln
