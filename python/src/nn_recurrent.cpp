// kiln.nn's recurrent layers: the cells (RNNCell, LSTMCell, GRUCell), the sequence layers (RNN,
// LSTM, GRU) with PyTorch's constructor arguments, and LSTMState (docs/PYTHON.md, docs/NN.md).
#include <cstdint>
#include <optional>
#include <string>

#include "bindings.h"
#include "kiln/nn.h"
#include "nn_layers.h"

namespace kiln::python {
namespace {

template <class Cell>
void cell_properties(py::class_<Cell>& cls) {
  tensor_property(cls, "weight_ih", &Cell::weight_ih, "[G H, input_size]");
  tensor_property(cls, "weight_hh", &Cell::weight_hh, "[G H, hidden_size]");
  tensor_property(cls, "bias_ih", &Cell::bias_ih, "[G H] or None");
  tensor_property(cls, "bias_hh", &Cell::bias_hh, "[G H] or None");
}

// input_size and hidden_size of a cell with `gates` gates.
template <class Cell>
std::string cell_sizes(const Cell& c, int64_t gates) {
  return std::to_string(c.weight_ih.shape()[1]) + ", " +
         std::to_string(c.weight_ih.shape()[0] / gates);
}

// PyTorch's repr of a sequence layer: sizes, then the settings.
template <class Layer>
std::string layer_text(const char* name, const Layer& l, int64_t gates, const std::string& extra) {
  if (l.cells.empty()) return std::string(name) + "()";
  const auto& c = l.cells[0];
  return std::string(name) + "(" + cell_sizes(c, gates) +
         ", num_layers=" + std::to_string(l.num_layers) + extra +
         ", bias=" + bool_text(c.bias_ih.has_value()) +
         ", batch_first=" + bool_text(l.batch_first) + ", dropout=" + number_text(l.dropout) +
         ", bidirectional=" + bool_text(l.bidirectional) + ")";
}

// The settings every sequence layer has, as fields.
template <class Layer>
void layer_fields(py::class_<Layer>& cls) {
  cls.def_readwrite("cells", &Layer::cells)
      .def_readwrite("num_layers", &Layer::num_layers)
      .def_readwrite("batch_first", &Layer::batch_first)
      .def_readwrite("bidirectional", &Layer::bidirectional)
      .def_readwrite("dropout", &Layer::dropout);
}

// An LSTM state: an LSTMState or PyTorch's tuple (h, c); None: zeros.
std::optional<nn::LSTMState> to_lstm_state(py::handle value) {
  if (value.is_none()) return std::nullopt;
  if (py::isinstance<py::tuple>(value)) {
    const auto t = value.cast<py::tuple>();
    if (t.size() != 2) fail("nn.LSTM", "state is a tuple of ", t.size(), " items, expected (h, c)");
    return nn::LSTMState{to_tensor(t[0]), to_tensor(t[1])};
  }
  return value.cast<nn::LSTMState>();
}

// A sequence layer's call: evaluation without ctx, dropout between layers with a training one.
template <class Layer, class State>
py::tuple sequence_call(const Layer& l, py::handle x, const std::optional<State>& state,
                        nn::Context* ctx) {
  auto [y, last] =
      ctx != nullptr ? l(to_tensor(x), *ctx, state, Loc{}) : l(to_tensor(x), state, Loc{});
  return py::make_tuple(y, last);
}

void bind_state(py::module_& nn) {
  auto state = layer_class<nn::LSTMState>(nn, "LSTMState", "An LSTM's hidden and cell state.");
  state.def(py::init([](py::handle h, py::handle c) {
              return nn::LSTMState{to_tensor(h), to_tensor(c)};
            }),
            py::arg("h"), py::arg("c"));
  tensor_property(state, "h", &nn::LSTMState::h, "hidden state");
  tensor_property(state, "c", &nn::LSTMState::c, "cell state");
  state.def("__iter__", [](const nn::LSTMState& s) { return py::iter(py::make_tuple(s.h, s.c)); });
  state.def("__repr__", [](const nn::LSTMState& s) {
    return "LSTMState(h=" + s.h.type().to_string() + ", c=" + s.c.type().to_string() + ")";
  });
}

void bind_cells(py::module_& nn) {
  auto rnn_cell = layer_class<nn::RNNCell>(
      nn, "RNNCell",
      "PyTorch's RNNCell: h' = act(W_ih x + b_ih + W_hh h + b_hh); call: x, h=None.");
  rnn_cell.def(py::init([](int64_t in, int64_t hidden, py::handle key, bool bias,
                           std::string nonlinearity, py::handle dtype) {
                 return nn::RNNCell(in, hidden, to_tensor(key), bias, std::move(nonlinearity),
                                    dtype_or_f32(dtype));
               }),
               py::arg("input_size"), py::arg("hidden_size"), py::arg("key"),
               py::arg("bias") = true, py::arg("nonlinearity") = "tanh",
               py::arg("dtype") = py::none());
  cell_properties(rnn_cell);
  rnn_cell.def_readwrite("nonlinearity", &nn::RNNCell::nonlinearity);
  rnn_cell.def(
      "__call__",
      [](const nn::RNNCell& l, py::handle x, py::handle h) {
        return l(to_tensor(x), optional_tensor(h), Loc{});
      },
      py::arg("x"), py::arg("h") = py::none());
  rnn_cell.def("__repr__", [](const nn::RNNCell& l) {
    return "RNNCell(" + cell_sizes(l, 1) + ", bias=" + bool_text(l.bias_ih.has_value()) +
           ", nonlinearity=" + l.nonlinearity + ")";
  });

  auto lstm_cell = layer_class<nn::LSTMCell>(
      nn, "LSTMCell", "PyTorch's LSTMCell (gates i, f, g, o); call: x, state=None -> LSTMState.");
  lstm_cell.def(
      py::init([](int64_t in, int64_t hidden, py::handle key, bool bias, py::handle dtype) {
        return nn::LSTMCell(in, hidden, to_tensor(key), bias, dtype_or_f32(dtype));
      }),
      py::arg("input_size"), py::arg("hidden_size"), py::arg("key"), py::arg("bias") = true,
      py::arg("dtype") = py::none());
  cell_properties(lstm_cell);
  tensor_property(lstm_cell, "weight_hr", &nn::LSTMCell::weight_hr,
                  "[proj_size, hidden_size] (an LSTM's projection) or None");
  lstm_cell.def(
      "__call__",
      [](const nn::LSTMCell& l, py::handle x, py::handle s) {
        return l(to_tensor(x), to_lstm_state(s), Loc{});
      },
      py::arg("x"), py::arg("state") = py::none());
  lstm_cell.def("__repr__", [](const nn::LSTMCell& l) {
    return "LSTMCell(" + cell_sizes(l, 4) + ", bias=" + bool_text(l.bias_ih.has_value()) + ")";
  });

  auto gru_cell = layer_class<nn::GRUCell>(
      nn, "GRUCell", "PyTorch's GRUCell (gates r, z, n); call: x, h=None -> h'.");
  gru_cell.def(
      py::init([](int64_t in, int64_t hidden, py::handle key, bool bias, py::handle dtype) {
        return nn::GRUCell(in, hidden, to_tensor(key), bias, dtype_or_f32(dtype));
      }),
      py::arg("input_size"), py::arg("hidden_size"), py::arg("key"), py::arg("bias") = true,
      py::arg("dtype") = py::none());
  cell_properties(gru_cell);
  gru_cell.def(
      "__call__",
      [](const nn::GRUCell& l, py::handle x, py::handle h) {
        return l(to_tensor(x), optional_tensor(h), Loc{});
      },
      py::arg("x"), py::arg("h") = py::none());
  gru_cell.def("__repr__", [](const nn::GRUCell& l) {
    return "GRUCell(" + cell_sizes(l, 3) + ", bias=" + bool_text(l.bias_ih.has_value()) + ")";
  });
}

struct SequenceArgs {
  int64_t num_layers;
  bool bias, batch_first;
  double dropout;
  bool bidirectional;
  py::handle dtype;
};

nn::RecurrentOptions recurrent_options(const SequenceArgs& a) {
  nn::RecurrentOptions o;
  o.num_layers = a.num_layers;
  o.bias = a.bias;
  o.batch_first = a.batch_first;
  o.dropout = a.dropout;
  o.bidirectional = a.bidirectional;
  o.dtype = dtype_or_f32(a.dtype);
  return o;
}

void bind_sequence_layers(py::module_& nn) {
  auto rnn = layer_class<nn::RNN>(
      nn, "RNN",
      "Multi-layer Elman RNN over [T, N, I] ([N, T, I] with batch_first); call: x, h=None, *, "
      "ctx=None -> (output, final h). PyTorch's weight_ih_l{k}{_reverse} is "
      "cells[D k (+ 1)].weight_ih.");
  rnn.def(py::init([](int64_t in, int64_t hidden, py::handle key, int64_t num_layers,
                      std::string nonlinearity, bool bias, bool batch_first, double dropout,
                      bool bidirectional, py::handle dtype) {
            nn::RecurrentOptions o =
                recurrent_options({num_layers, bias, batch_first, dropout, bidirectional, dtype});
            o.nonlinearity = std::move(nonlinearity);
            return nn::RNN(in, hidden, to_tensor(key), o);
          }),
          py::arg("input_size"), py::arg("hidden_size"), py::arg("key"), py::arg("num_layers") = 1,
          py::arg("nonlinearity") = "tanh", py::arg("bias") = true, py::arg("batch_first") = false,
          py::arg("dropout") = 0.0, py::arg("bidirectional") = false,
          py::arg("dtype") = py::none());
  layer_fields(rnn);
  rnn.def(
      "__call__",
      [](const nn::RNN& l, py::handle x, py::handle h, nn::Context* ctx) {
        return sequence_call(l, x, optional_tensor(h), ctx);
      },
      py::arg("x"), py::arg("h") = py::none(), py::kw_only(), py::arg("ctx") = py::none());
  rnn.def("__repr__", [](const nn::RNN& l) {
    const std::string act = l.cells.empty() ? "tanh" : l.cells[0].nonlinearity;
    return layer_text("RNN", l, 1, ", nonlinearity=" + act);
  });

  auto lstm = layer_class<nn::LSTM>(
      nn, "LSTM",
      "Multi-layer LSTM over [T, N, I] ([N, T, I] with batch_first); call: x, state=None (an "
      "LSTMState or (h, c)), *, ctx=None -> (output, LSTMState). PyTorch's "
      "weight_ih_l{k}{_reverse} is cells[D k (+ 1)].weight_ih.");
  lstm.def(py::init([](int64_t in, int64_t hidden, py::handle key, int64_t num_layers, bool bias,
                       bool batch_first, double dropout, bool bidirectional, int64_t proj_size,
                       py::handle dtype) {
             nn::RecurrentOptions o =
                 recurrent_options({num_layers, bias, batch_first, dropout, bidirectional, dtype});
             o.proj_size = proj_size;
             return nn::LSTM(in, hidden, to_tensor(key), o);
           }),
           py::arg("input_size"), py::arg("hidden_size"), py::arg("key"), py::arg("num_layers") = 1,
           py::arg("bias") = true, py::arg("batch_first") = false, py::arg("dropout") = 0.0,
           py::arg("bidirectional") = false, py::arg("proj_size") = 0,
           py::arg("dtype") = py::none());
  layer_fields(lstm);
  lstm.def(
      "__call__",
      [](const nn::LSTM& l, py::handle x, py::handle state, nn::Context* ctx) {
        return sequence_call(l, x, to_lstm_state(state), ctx);
      },
      py::arg("x"), py::arg("state") = py::none(), py::kw_only(), py::arg("ctx") = py::none());
  lstm.def("__repr__", [](const nn::LSTM& l) {
    const bool proj = !l.cells.empty() && l.cells[0].weight_hr;
    return layer_text(
        "LSTM", l, 4,
        proj ? ", proj_size=" + std::to_string(l.cells[0].weight_hr->shape()[0]) : std::string());
  });

  auto gru = layer_class<nn::GRU>(
      nn, "GRU",
      "Multi-layer GRU; call: x, h=None, *, ctx=None -> (output, final h). See LSTM for layouts.");
  gru.def(py::init([](int64_t in, int64_t hidden, py::handle key, int64_t num_layers, bool bias,
                      bool batch_first, double dropout, bool bidirectional, py::handle dtype) {
            return nn::GRU(
                in, hidden, to_tensor(key),
                recurrent_options({num_layers, bias, batch_first, dropout, bidirectional, dtype}));
          }),
          py::arg("input_size"), py::arg("hidden_size"), py::arg("key"), py::arg("num_layers") = 1,
          py::arg("bias") = true, py::arg("batch_first") = false, py::arg("dropout") = 0.0,
          py::arg("bidirectional") = false, py::arg("dtype") = py::none());
  layer_fields(gru);
  gru.def(
      "__call__",
      [](const nn::GRU& l, py::handle x, py::handle h, nn::Context* ctx) {
        return sequence_call(l, x, optional_tensor(h), ctx);
      },
      py::arg("x"), py::arg("h") = py::none(), py::kw_only(), py::arg("ctx") = py::none());
  gru.def("__repr__", [](const nn::GRU& l) { return layer_text("GRU", l, 3, ""); });
}

}  // namespace

void bind_nn_recurrent(py::module_& nn) {
  bind_state(nn);
  bind_cells(nn);
  bind_sequence_layers(nn);
}

}  // namespace kiln::python
