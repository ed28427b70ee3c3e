// nn::LSTMCell, nn::GRUCell, nn::LSTM and nn::GRU.
//
// Values and input gradients against PyTorch 1.13 with the same weights
// (tests/reference/recurrent_ref.py stores them under PyTorch's names), parameter gradients
// against float64 finite differences, jit against eager, a layer against its cells stepped by
// hand, and the errors.
#include <gtest/gtest.h>
#include <kiln/kiln.h>

#include <string>
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

const io::TensorFile& refs() {
  static const io::TensorFile file = testing::reference("recurrent");
  return file;
}
Tensor stored(const std::string& name, DType dtype = float64) {
  return nn_checks::ref_in(refs(), name, dtype);
}

// PyTorch's weight_ih_l{k}{_reverse} is cells[D k (+ 1)].weight_ih here.
template <class Cell>
void load_cells(std::vector<Cell>& cells, const std::string& name, bool bidirectional,
                DType dtype) {
  const std::size_t dirs = bidirectional ? 2 : 1;
  for (std::size_t i = 0; i < cells.size(); ++i) {
    const std::string suffix =
        "_l" + std::to_string(i / dirs) + (i % dirs == 1 ? std::string("_reverse") : "");
    const std::string p = name + "/param/";
    cells[i].weight_ih = stored(p + "weight_ih" + suffix, dtype);
    cells[i].weight_hh = stored(p + "weight_hh" + suffix, dtype);
    if (cells[i].bias_ih) {
      cells[i].bias_ih = stored(p + "bias_ih" + suffix, dtype);
      cells[i].bias_hh = stored(p + "bias_hh" + suffix, dtype);
    }
  }
}

struct RnnCase {
  std::string name;
  int64_t input, hidden;
  nn::RecurrentOptions options;
  bool with_state = true;
};

const std::vector<RnnCase> kLstmCases{
    {"lstm_1", 3, 4, {}},
    {"lstm_2bi", 3, 4, {.num_layers = 2, .bidirectional = true}},
    {"lstm_bf", 3, 2, {.bias = false, .batch_first = true}, false},
};
const std::vector<RnnCase> kGruCases{
    {"gru_1", 3, 4, {}},
    {"gru_2bi", 3, 4, {.num_layers = 2, .bidirectional = true}},
    {"gru_bf", 3, 2, {.batch_first = true}, false},
};

template <class Layer>
Layer load_layer(const RnnCase& c, DType dtype) {
  nn::RecurrentOptions o = c.options;
  o.dtype = dtype;
  Layer m(c.input, c.hidden, random::key(0), o);
  load_cells(m.cells, c.name, o.bidirectional, dtype);
  return m;
}

TEST(Recurrent, LstmMatchesPyTorchWithItsWeights) {
  for (const DType dtype : {float64, float32}) {
    for (const RnnCase& c : kLstmCases) {
      SCOPED_TRACE(c.name + " " + std::string(dtype_name(dtype)));
      const nn::LSTM m = load_layer<nn::LSTM>(c, dtype);
      std::optional<nn::LSTMState> s0;
      if (c.with_state)
        s0 = nn::LSTMState{stored(c.name + "/h0", dtype), stored(c.name + "/c0", dtype)};
      const Tensor x = stored(c.name + "/x", dtype);
      const auto [y, s] = m(x, s0);
      const double tol = tol_of(dtype);
      expect_allclose(y, stored(c.name + "/y"), {.rtol = tol, .atol = tol}, "y");
      expect_allclose(s.h, stored(c.name + "/h"), {.rtol = tol, .atol = tol}, "h");
      expect_allclose(s.c, stored(c.name + "/c"), {.rtol = tol, .atol = tol}, "c");
      const Tensor cot = stored(c.name + "/cot", dtype);
      const Tensor gx = grad([&](const Tensor& in) { return sum(m(in, s0).first * cot); })(x);
      expect_allclose(gx, stored(c.name + "/grad_x"), {.rtol = 10 * tol, .atol = 10 * tol},
                      "grad x");
    }
  }
}

TEST(Recurrent, GruMatchesPyTorchWithItsWeights) {
  for (const DType dtype : {float64, float32}) {
    for (const RnnCase& c : kGruCases) {
      SCOPED_TRACE(c.name + " " + std::string(dtype_name(dtype)));
      const nn::GRU m = load_layer<nn::GRU>(c, dtype);
      std::optional<Tensor> h0;
      if (c.with_state) h0 = stored(c.name + "/h0", dtype);
      const Tensor x = stored(c.name + "/x", dtype);
      const auto [y, h] = m(x, h0);
      const double tol = tol_of(dtype);
      expect_allclose(y, stored(c.name + "/y"), {.rtol = tol, .atol = tol}, "y");
      expect_allclose(h, stored(c.name + "/h"), {.rtol = tol, .atol = tol}, "h");
      const Tensor cot = stored(c.name + "/cot", dtype);
      const Tensor gx = grad([&](const Tensor& in) { return sum(m(in, h0).first * cot); })(x);
      expect_allclose(gx, stored(c.name + "/grad_x"), {.rtol = 10 * tol, .atol = 10 * tol},
                      "grad x");
    }
  }
}

TEST(Recurrent, CellsMatchPyTorchWithTheirWeights) {
  for (const DType dtype : {float64, float32}) {
    SCOPED_TRACE(dtype_name(dtype));
    const double tol = tol_of(dtype);
    nn::LSTMCell lstm(3, 4, random::key(0), true, dtype);
    lstm.weight_ih = stored("lstm_cell/param/weight_ih", dtype);
    lstm.weight_hh = stored("lstm_cell/param/weight_hh", dtype);
    lstm.bias_ih = stored("lstm_cell/param/bias_ih", dtype);
    lstm.bias_hh = stored("lstm_cell/param/bias_hh", dtype);
    const nn::LSTMState s =
        lstm(stored("lstm_cell/x", dtype),
             nn::LSTMState{stored("lstm_cell/h0", dtype), stored("lstm_cell/c0", dtype)});
    expect_allclose(s.h, stored("lstm_cell/h"), {.rtol = tol, .atol = tol}, "lstm h");
    expect_allclose(s.c, stored("lstm_cell/c"), {.rtol = tol, .atol = tol}, "lstm c");
    nn::GRUCell gru(3, 4, random::key(1), true, dtype);
    gru.weight_ih = stored("gru_cell/param/weight_ih", dtype);
    gru.weight_hh = stored("gru_cell/param/weight_hh", dtype);
    gru.bias_ih = stored("gru_cell/param/bias_ih", dtype);
    gru.bias_hh = stored("gru_cell/param/bias_hh", dtype);
    expect_allclose(gru(stored("gru_cell/x", dtype), stored("gru_cell/h0", dtype)),
                    stored("gru_cell/h"), {.rtol = tol, .atol = tol}, "gru h");
  }
}

// The sequence layer is its cells stepped in a C++ loop: forward over time, then backward over
// time for the second direction, each direction from its own initial state.
TEST(Recurrent, BidirectionalLayerIsItsCellsSteppedByHand) {
  const nn::LSTM m(2, 3, random::key(2), {.bidirectional = true, .dtype = float64});
  const Tensor x = random::normal(random::key(3), {4, 2, 2}, float64);
  const nn::LSTMState s0{random::normal(random::key(4), {2, 2, 3}, float64),
                         random::normal(random::key(5), {2, 2, 3}, float64)};
  const auto [y, s] = m(x, s0);
  std::vector<Tensor> fwd(4), bwd(4);
  nn::LSTMState f{index(s0.h, 0), index(s0.c, 0)}, b{index(s0.h, 1), index(s0.c, 1)};
  for (int64_t t = 0; t < 4; ++t) {
    f = m.cells[0](index(x, t), f);
    fwd[static_cast<std::size_t>(t)] = f.h;
    b = m.cells[1](index(x, 3 - t), b);
    bwd[static_cast<std::size_t>(3 - t)] = b.h;
  }
  expect_allclose(y, concatenate({stack(fwd), stack(bwd)}, -1), {.rtol = 1e-12, .atol = 1e-12},
                  "outputs");
  expect_allclose(s.h, stack({f.h, b.h}), {.rtol = 1e-12, .atol = 1e-12}, "final h");
  expect_allclose(s.c, stack({f.c, b.c}), {.rtol = 1e-12, .atol = 1e-12}, "final c");
}

TEST(Recurrent, UnbatchedInputIsTheBatchOfOne) {
  const nn::GRU m(3, 2, random::key(6), {.num_layers = 2, .dtype = float64});
  const Tensor x = random::normal(random::key(7), {5, 3}, float64);
  const Tensor h0 = random::normal(random::key(8), {2, 2}, float64);
  const auto [y, h] = m(x, h0);
  const auto [yb, hb] = m(expand_dims(x, 1), expand_dims(h0, 1));
  EXPECT_EQ(y.shape(), Shape({5, 2}));
  expect_allclose(y, squeeze(yb, {1}), {.rtol = 1e-12, .atol = 1e-12}, "y");
  expect_allclose(h, squeeze(hb, {1}), {.rtol = 1e-12, .atol = 1e-12}, "h");
  const nn::GRUCell& cell = m.cells[0];
  expect_allclose(cell(index(x, 0)), squeeze(cell(slice(x, {Slice{0, 1}})), {0}),
                  {.rtol = 1e-12, .atol = 1e-12}, "cell");
}

TEST(Recurrent, ParameterGradientsMatchFiniteDifferences) {
  const nn::LSTM lstm(2, 2, random::key(9), {.num_layers = 2, .dtype = float64});
  const nn::GRU gru(2, 2, random::key(10), {.bidirectional = true, .dtype = float64});
  const Tensor x = random::normal(random::key(11), {3, 2, 2}, float64);
  const auto lstm_loss = [&](const nn::LSTM& m) {
    const auto [y, s] = m(x);
    return sum(sin(y)) + sum(s.c);
  };
  const auto gru_loss = [&](const nn::GRU& m) {
    const auto [y, h] = m(x);
    return sum(sin(y)) + sum(square(h));
  };
  expect_grad_matches_fd(lstm_loss, lstm, {.rtol = 1e-7, .atol = 1e-7});
  expect_grad_matches_fd(gru_loss, gru, {.rtol = 1e-7, .atol = 1e-7});
}

// vmap of the unbatched layer over the examples is the batched layer (batch_first).
TEST(Recurrent, VmapOverExamplesIsTheBatchedLayer) {
  const nn::LSTM m(3, 2, random::key(15),
                   {.num_layers = 2, .batch_first = true, .bidirectional = true, .dtype = float64});
  const Tensor x = random::normal(random::key(16), {4, 5, 3}, float64);
  const auto [y, s] = m(x);
  const auto one = [&](const Tensor& xi) { return m(xi); };  // [T, I]
  const auto [vy, vs] = vmap(one)(x);
  expect_allclose(vy, y, {.rtol = 1e-12, .atol = 1e-12}, "outputs");
  // The per-example final states [L D, H] stack on a leading batch axis.
  expect_allclose(vs.h, swapaxes(s.h, 0, 1), {.rtol = 1e-12, .atol = 1e-12}, "h");
  expect_allclose(vs.c, swapaxes(s.c, 0, 1), {.rtol = 1e-12, .atol = 1e-12}, "c");
}

TEST(Recurrent, JitMatchesEager) {
  const nn::LSTM lstm(3, 4, random::key(12), {.num_layers = 2, .bidirectional = true});
  const nn::GRU gru(3, 4, random::key(13), {.batch_first = true});
  const Tensor x = random::normal(random::key(14), {6, 2, 3});
  const auto run_lstm = [](const nn::LSTM& m, const Tensor& in) { return m(in); };
  const auto [y, s] = lstm(x);
  const auto [jy, js] = jit(run_lstm)(lstm, x);
  expect_allclose(jy, y, {.rtol = 1e-5, .atol = 1e-5}, "lstm y");
  expect_allclose(js.h, s.h, {.rtol = 1e-5, .atol = 1e-5}, "lstm h");
  expect_allclose(js.c, s.c, {.rtol = 1e-5, .atol = 1e-5}, "lstm c");
  const auto loss = [&](const nn::GRU& m) { return sum(square(m(x).first)); };
  expect_tree_allclose(jit(grad(loss))(gru), grad(loss)(gru), {.rtol = 1e-4, .atol = 1e-4});
}

TEST(Recurrent, ErrorsNameTheShapes) {
  expect_error([] { (void)nn::LSTM(0, 4, random::key(0)); }, "nn.LSTM", {"non-positive size"});
  expect_error([] { (void)nn::GRU(3, 4, random::key(0), {.num_layers = 0}); }, "nn.GRU",
               {"non-positive num_layers"});
  expect_error([] { (void)nn::GRUCell(3, 0, random::key(0)); }, "nn.GRUCell",
               {"non-positive size"});
  const nn::LSTM lstm(3, 4, random::key(1), {.num_layers = 2});
  expect_error(
      [&] {
        (void)lstm(zeros({5, 2, 2}));
      },
      "nn.LSTM", {"input does not match the layer", "f32[5,2,2]", "input_size 3"});
  expect_error([&] { (void)lstm(zeros({5})); }, "nn.LSTM", {"input has too few dimensions"});
  expect_error(
      [&] {
        (void)lstm(zeros({5, 2, 3}, int32));
      },
      "nn.LSTM", {"input must be floating point"});
  expect_error(
      [&] {
        (void)lstm(zeros({5, 2, 3}), nn::LSTMState{zeros({1, 2, 4}), zeros({2, 2, 4})});
      },
      "nn.LSTM", {"state does not match", "f32[1,2,4]", "[2, 2, 4]"});
  const nn::GRUCell cell(3, 4, random::key(2));
  expect_error(
      [&] {
        (void)cell(zeros({2, 5}));
      },
      "nn.GRUCell", {"input does not match the cell", "f32[2,5]"});
  expect_error(
      [&] {
        (void)cell(zeros({2, 3}), zeros({3, 4}));
      },
      "nn.GRUCell", {"state does not match", "f32[3,4]", "[2, 4]"});
}

}  // namespace
}  // namespace kiln
