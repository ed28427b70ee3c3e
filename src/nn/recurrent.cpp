// kiln::nn recurrent layers: RNN, LSTM and GRU cells with PyTorch's gate layouts, and multi-layer,
// optionally bidirectional sequence layers built on kiln::scan (one scan per layer and
// direction, so a traced model has one loop per scan, not one copy of the cell per step).
#include <cmath>
#include <type_traits>

#include "kiln/control_flow.h"
#include "kiln/error.h"
#include "kiln/nn.h"
#include "nn/input_checks.h"

namespace kiln::nn {

namespace {

using detail::expect_floating_input;

struct CellShape {
  int64_t input, hidden;
  int64_t proj = 0;  // an LSTM's projection of h (0: none)
};

// weight_ih [G H, I], weight_hh [G H, H] (H -> P with a projection), biases [G H] and
// weight_hr [P, H], all uniform(-1/sqrt(H), 1/sqrt(H)) as PyTorch's.
template <class Cell>
Cell make_cell(std::string_view op, int64_t gates, const CellShape& size, const Tensor& key,
               bool bias, DType dtype) {
  if (size.input < 1 || size.hidden < 1)
    fail(op, "non-positive size: got input_size=", size.input, ", hidden_size=", size.hidden,
         ", expected sizes >= 1");
  const Tensor keys = random::split(key, size.proj > 0 ? 5 : 4);
  const auto h = static_cast<double>(size.hidden);
  const auto draw = [&](int64_t i, const Shape& shape) {
    return init::lecun_uniform(index(keys, i), shape, h, dtype);
  };
  Cell c;
  c.weight_ih = draw(0, {gates * size.hidden, size.input});
  c.weight_hh = draw(1, {gates * size.hidden, size.proj > 0 ? size.proj : size.hidden});
  if (bias) {
    c.bias_ih = draw(2, {gates * size.hidden});
    c.bias_hh = draw(3, {gates * size.hidden});
  }
  if constexpr (requires { c.weight_hr; })
    if (size.proj > 0) c.weight_hr = draw(4, {size.proj, size.hidden});
  return c;
}

void expect_nonlinearity(std::string_view op, const std::string& nonlinearity) {
  if (nonlinearity != "tanh" && nonlinearity != "relu")
    fail(op, "unknown nonlinearity: got \"", nonlinearity, "\", expected \"tanh\" or \"relu\"");
}
// The settings a cell carries beyond its weights: an RNN cell's nonlinearity.
void expect_settings(std::string_view op, const RNNCell& cell) {
  expect_nonlinearity(op, cell.nonlinearity);
}
template <class Cell>
void expect_settings(std::string_view, const Cell&) {}

// x W^T + b over the last axis.
Tensor affine(const Tensor& x, const Tensor& w, const std::optional<Tensor>& b, Loc loc) {
  const Tensor y = matmul(x, transpose(w, loc), loc);
  return b ? y + *b : y;
}

// One step from the input's share of the gates, x W_ih^T + b_ih (computed for every step at
// once by the sequence layers).
LSTMState step(const LSTMCell& cell, const Tensor& xg, const LSTMState& s, Loc loc) {
  const std::vector<Tensor> g = split(xg + affine(s.h, cell.weight_hh, cell.bias_hh, loc), 4, -1);
  const Tensor c = sigmoid(g[1], loc) * s.c + sigmoid(g[0], loc) * tanh(g[2], loc);
  const Tensor h = sigmoid(g[3], loc) * tanh(c, loc);
  return {cell.weight_hr ? affine(h, *cell.weight_hr, std::nullopt, loc) : h, c};
}
Tensor step(const GRUCell& cell, const Tensor& xg, const Tensor& h, Loc loc) {
  const std::vector<Tensor> gx = split(xg, 3, -1, loc);
  const std::vector<Tensor> gh = split(affine(h, cell.weight_hh, cell.bias_hh, loc), 3, -1, loc);
  const Tensor r = sigmoid(gx[0] + gh[0], loc), z = sigmoid(gx[1] + gh[1], loc);
  const Tensor n = tanh(gx[2] + r * gh[2], loc);
  return n + z * (h - n);  // (1 - z) n + z h
}
Tensor step(const RNNCell& cell, const Tensor& xg, const Tensor& h, Loc loc) {
  const Tensor pre = xg + affine(h, cell.weight_hh, cell.bias_hh, loc);
  return cell.nonlinearity == "relu" ? relu(pre, loc) : tanh(pre, loc);
}

Tensor hidden_of(const LSTMState& s) { return s.h; }
Tensor hidden_of(const Tensor& h) { return h; }

template <class F>
LSTMState map_state(const LSTMState& s, F f) {
  return {f(s.h), f(s.c)};
}
template <class F>
Tensor map_state(const Tensor& h, F f) {
  return f(h);
}
LSTMState stack_states(const std::vector<LSTMState>& states, Loc loc) {
  std::vector<Tensor> h, c;
  for (const LSTMState& s : states) {
    h.push_back(s.h);
    c.push_back(s.c);
  }
  return {stack(h, 0, loc), stack(c, 0, loc)};
}
Tensor stack_states(const std::vector<Tensor>& states, Loc loc) { return stack(states, 0, loc); }

// The zero state of a cell for the batch axes `batch`: h [batch..., hidden] (an LSTM's
// [batch..., P] with a projection) and an LSTM's c [batch..., H], of the weights' dtype.
Tensor zeros_with(std::vector<int64_t> batch, int64_t features, DType dtype) {
  batch.push_back(features);
  return zeros(Shape(batch), dtype);
}
LSTMState zero_state(const LSTMCell& cell, const std::vector<int64_t>& batch) {
  const DType dtype = cell.weight_hh.dtype();
  return {zeros_with(batch, cell.weight_hh.shape()[1], dtype),
          zeros_with(batch, cell.weight_hh.shape()[0] / 4, dtype)};
}
template <class Cell>
Tensor zero_state(const Cell& cell, const std::vector<int64_t>& batch) {
  return zeros_with(batch, cell.weight_hh.shape()[1], cell.weight_hh.dtype());
}

// Every tensor of a state has the shape and dtype of the zero state's.
void expect_like(std::string_view op, const Tensor& got, const Tensor& want) {
  if (!got.defined() || got.shape() != want.shape() || got.dtype() != want.dtype())
    fail(op, "state does not match: got ", got.defined() ? got.type() : TensorType{},
         ", expected shape ", want.shape(), " and dtype ", want.dtype());
}
void expect_state(std::string_view op, const LSTMState& got, const LSTMState& want) {
  expect_like(op, got.h, want.h);
  expect_like(op, got.c, want.c);
}
void expect_state(std::string_view op, const Tensor& got, const Tensor& want) {
  expect_like(op, got, want);
}

// The input of a cell call: [N, I] or unbatched [I] of the weights' dtype.
template <class Cell>
void expect_cell_input(std::string_view op, const Cell& cell, const Tensor& x) {
  expect_floating_input(op, "input", x, 1, "[N, input_size] or [input_size]");
  const int64_t in = cell.weight_ih.shape()[1];
  if (x.rank() > 2 || x.shape()[x.rank() - 1] != in || x.dtype() != cell.weight_ih.dtype())
    fail(op, "input does not match the cell: got ", x.type(), " for weight_ih ",
         cell.weight_ih.type(), ", expected [N, ", in, "] or [", in, "] of its dtype");
}

template <class Cell, class State>
State cell_call(std::string_view op, const Cell& cell, const Tensor& x,
                const std::optional<State>& state, Loc loc) {
  const kiln::detail::CallSite site(loc);
  expect_cell_input(op, cell, x);
  expect_settings(op, cell);
  const State zero =
      zero_state(cell, x.rank() == 2 ? std::vector<int64_t>{x.shape()[0]} : std::vector<int64_t>{});
  if (state) expect_state(op, *state, zero);
  return step(cell, affine(x, cell.weight_ih, cell.bias_ih, loc), state ? *state : zero, loc);
}

// One layer in one direction over x [T, N, I]: (outputs [T, N, H], final state).
template <class Cell, class State>
std::pair<Tensor, State> run_direction(const Cell& cell, const Tensor& x, const State& s0,
                                       bool reverse, Loc loc) {
  const Tensor xg = affine(x, cell.weight_ih, cell.bias_ih, loc);  // [T, N, G H]
  auto body = [&cell, loc](const State& s, const Tensor& g) {
    const State next = step(cell, g, s, loc);
    return std::pair<State, Tensor>{next, hidden_of(next)};
  };
  auto [last, ys] = scan(body, s0, xg, ScanOptions{.reverse = reverse});
  return {ys, last};
}

struct Stack {
  int64_t num_layers;
  bool batch_first, bidirectional;
  double dropout;
};

void expect_dropout(std::string_view op, double rate) {
  if (!(rate >= 0.0 && rate < 1.0))
    fail(op, "dropout out of range: got ", rate, ", expected [0, 1)");
}

// The input of the next layer: dropout on a layer's output (all but the last's) in training.
Tensor between_layers(std::string_view op, const Tensor& x, double rate, Context* ctx, Loc loc) {
  if (ctx == nullptr || !ctx->training() || rate == 0.0) return x;
  return dropout(x, rate, ctx->next_key(op), loc);
}

template <class Cell, class State>
std::pair<Tensor, State> run_layers(std::string_view op, const std::vector<Cell>& cells,
                                    const Stack& stack_of, const Tensor& input,
                                    const std::optional<State>& state, Context* ctx, Loc loc) {
  const kiln::detail::CallSite site(loc);
  const int64_t dirs = stack_of.bidirectional ? 2 : 1;
  const int64_t layers = stack_of.num_layers * dirs;
  if (stack_of.num_layers < 1 || static_cast<int64_t>(cells.size()) != layers)
    fail(op, "malformed layer: got ", cells.size(), " cells for num_layers=", stack_of.num_layers,
         (stack_of.bidirectional ? " bidirectional" : ""), ", expected ", layers);
  expect_dropout(op, stack_of.dropout);
  for (const Cell& cell : cells) expect_settings(op, cell);
  const Tensor& w = cells[0].weight_ih;
  const int64_t in = w.shape()[1];
  const std::string_view layout = stack_of.batch_first ? "[N, T, input_size] or [T, input_size]"
                                                       : "[T, N, input_size] or [T, input_size]";
  expect_floating_input(op, "input", input, 2, layout);
  if (input.rank() > 3 || input.shape()[input.rank() - 1] != in || input.dtype() != w.dtype())
    fail(op, "input does not match the layer: got ", input.type(), " for weight_ih ", w.type(),
         ", expected ", layout, " with input_size ", in, " and the weights' dtype");
  const bool batched = input.rank() == 3;
  // Time-major with a batch axis from here on: [T, N, I].
  Tensor x = !batched               ? expand_dims(input, 1, loc)
             : stack_of.batch_first ? swapaxes(input, 0, 1, loc)
                                    : input;
  const int64_t n = x.shape()[1];
  State s0 = zero_state(cells[0], {layers, n});
  if (state) {
    expect_state(op, *state, batched ? s0 : zero_state(cells[0], {layers}));
    s0 = batched ? *state
                 : map_state(*state, [&](const Tensor& t) { return expand_dims(t, 1, loc); });
  }
  std::vector<State> finals;
  for (int64_t l = 0; l < stack_of.num_layers; ++l) {
    if (l > 0) x = between_layers(op, x, stack_of.dropout, ctx, loc);
    std::vector<Tensor> outputs;
    for (int64_t d = 0; d < dirs; ++d) {
      const int64_t i = l * dirs + d;
      const State si = map_state(s0, [&](const Tensor& t) { return index(t, i, loc); });
      auto [ys, last] =
          run_direction(cells[static_cast<std::size_t>(i)], x, si, /*reverse=*/d == 1, loc);
      outputs.push_back(ys);
      finals.push_back(last);
    }
    x = dirs == 1 ? outputs[0] : concatenate(outputs, -1, loc);
  }
  State last = stack_states(finals, loc);
  if (!batched) {
    x = squeeze(x, {1}, loc);
    last = map_state(last, [&](const Tensor& t) { return squeeze(t, {1}, loc); });
  }
  return {stack_of.batch_first && batched ? swapaxes(x, 0, 1, loc) : x, last};
}

// The options' settings that belong to other layers must be their defaults.
template <class Cell>
void expect_options(std::string_view op, const RecurrentOptions& o, int64_t hidden) {
  if (o.num_layers < 1) fail(op, "non-positive num_layers: got ", o.num_layers, ", expected >= 1");
  expect_dropout(op, o.dropout);
  constexpr bool lstm = std::is_same_v<Cell, LSTMCell>, rnn = std::is_same_v<Cell, RNNCell>;
  if (o.proj_size != 0 && (!lstm || o.proj_size < 0 || o.proj_size >= hidden))
    fail(op, "proj_size out of range: got ", o.proj_size, " for hidden_size ", hidden,
         lstm ? ", expected 0 (none) or in [1, hidden_size)" : ", expected 0 (only LSTM projects)");
  if (rnn)
    expect_nonlinearity(op, o.nonlinearity);
  else if (o.nonlinearity != "tanh")
    fail(op, "nonlinearity is an RNN's setting: got \"", o.nonlinearity,
         "\", expected \"tanh\" (the default)");
}

template <class Cell>
std::vector<Cell> make_cells(std::string_view op, int64_t gates, const CellShape& size,
                             const Tensor& key, const RecurrentOptions& o) {
  expect_options<Cell>(op, o, size.hidden);
  const int64_t dirs = o.bidirectional ? 2 : 1;
  const int64_t out = o.proj_size > 0 ? o.proj_size : size.hidden;
  const Tensor keys = random::split(key, o.num_layers * dirs);
  std::vector<Cell> cells;
  for (int64_t l = 0; l < o.num_layers; ++l)
    for (int64_t d = 0; d < dirs; ++d) {
      const CellShape shape{l == 0 ? size.input : dirs * out, size.hidden, o.proj_size};
      cells.push_back(
          make_cell<Cell>(op, gates, shape, index(keys, l * dirs + d), o.bias, o.dtype));
      if constexpr (requires { cells.back().nonlinearity; })
        cells.back().nonlinearity = o.nonlinearity;
    }
  return cells;
}

// A sequence layer's call: `type` names it in messages ("nn.<type>") and summaries.
template <class Layer, class State>
std::pair<Tensor, State> sequence_call(const std::string& type, const Layer& layer, const Tensor& x,
                                       const std::optional<State>& state, Context* ctx, Loc loc) {
  using Cell = typename decltype(layer.cells)::value_type;
  const Stack stack_of{layer.num_layers, layer.batch_first, layer.bidirectional, layer.dropout};
  auto r = run_layers<Cell, State>("nn." + type, layer.cells, stack_of, x, state, ctx, loc);
  detail::summary_note(type, r.first, {});
  return r;
}

}  // namespace

LSTMCell::LSTMCell(int64_t input_size, int64_t hidden_size, const Tensor& key, bool bias,
                   DType dtype)
    : LSTMCell(make_cell<LSTMCell>("nn.LSTMCell", 4, {input_size, hidden_size}, key, bias, dtype)) {
}

LSTMState LSTMCell::operator()(const Tensor& x, const std::optional<LSTMState>& state,
                               Loc loc) const {
  return cell_call<LSTMCell, LSTMState>("nn.LSTMCell", *this, x, state, loc);
}

GRUCell::GRUCell(int64_t input_size, int64_t hidden_size, const Tensor& key, bool bias, DType dtype)
    : GRUCell(make_cell<GRUCell>("nn.GRUCell", 3, {input_size, hidden_size}, key, bias, dtype)) {}

Tensor GRUCell::operator()(const Tensor& x, const std::optional<Tensor>& h, Loc loc) const {
  return cell_call<GRUCell, Tensor>("nn.GRUCell", *this, x, h, loc);
}

RNNCell::RNNCell(int64_t input_size, int64_t hidden_size, const Tensor& key, bool bias,
                 std::string act, DType dtype)
    : RNNCell(make_cell<RNNCell>("nn.RNNCell", 1, {input_size, hidden_size}, key, bias, dtype)) {
  expect_nonlinearity("nn.RNNCell", act);
  nonlinearity = std::move(act);
}

Tensor RNNCell::operator()(const Tensor& x, const std::optional<Tensor>& h, Loc loc) const {
  return cell_call<RNNCell, Tensor>("nn.RNNCell", *this, x, h, loc);
}

LSTM::LSTM(int64_t input_size, int64_t hidden_size, const Tensor& key, const RecurrentOptions& o)
    : cells(make_cells<LSTMCell>("nn.LSTM", 4, {input_size, hidden_size}, key, o)),
      num_layers(o.num_layers),
      batch_first(o.batch_first),
      bidirectional(o.bidirectional),
      dropout(o.dropout) {}

std::pair<Tensor, LSTMState> LSTM::operator()(const Tensor& x,
                                              const std::optional<LSTMState>& state,
                                              Loc loc) const {
  return sequence_call("LSTM", *this, x, state, nullptr, loc);
}
std::pair<Tensor, LSTMState> LSTM::operator()(const Tensor& x, Context& ctx,
                                              const std::optional<LSTMState>& state,
                                              Loc loc) const {
  return sequence_call("LSTM", *this, x, state, &ctx, loc);
}

GRU::GRU(int64_t input_size, int64_t hidden_size, const Tensor& key, const RecurrentOptions& o)
    : cells(make_cells<GRUCell>("nn.GRU", 3, {input_size, hidden_size}, key, o)),
      num_layers(o.num_layers),
      batch_first(o.batch_first),
      bidirectional(o.bidirectional),
      dropout(o.dropout) {}

std::pair<Tensor, Tensor> GRU::operator()(const Tensor& x, const std::optional<Tensor>& h,
                                          Loc loc) const {
  return sequence_call("GRU", *this, x, h, nullptr, loc);
}
std::pair<Tensor, Tensor> GRU::operator()(const Tensor& x, Context& ctx,
                                          const std::optional<Tensor>& h, Loc loc) const {
  return sequence_call("GRU", *this, x, h, &ctx, loc);
}

RNN::RNN(int64_t input_size, int64_t hidden_size, const Tensor& key, const RecurrentOptions& o)
    : cells(make_cells<RNNCell>("nn.RNN", 1, {input_size, hidden_size}, key, o)),
      num_layers(o.num_layers),
      batch_first(o.batch_first),
      bidirectional(o.bidirectional),
      dropout(o.dropout) {}

std::pair<Tensor, Tensor> RNN::operator()(const Tensor& x, const std::optional<Tensor>& h,
                                          Loc loc) const {
  return sequence_call("RNN", *this, x, h, nullptr, loc);
}
std::pair<Tensor, Tensor> RNN::operator()(const Tensor& x, Context& ctx,
                                          const std::optional<Tensor>& h, Loc loc) const {
  return sequence_call("RNN", *this, x, h, &ctx, loc);
}

}  // namespace kiln::nn
