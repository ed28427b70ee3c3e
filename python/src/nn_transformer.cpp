// kiln.nn's transformer layers: TransformerEncoderLayer, TransformerDecoderLayer and their
// stacks, with PyTorch's constructor arguments, attribute names and call signatures
// (docs/PYTHON.md, docs/NN.md "Transformer layers").
#include <cstdint>
#include <optional>
#include <string>

#include "bindings.h"
#include "kiln/nn.h"
#include "nn_layers.h"

namespace kiln::python {
namespace {

nn::TransformerLayerOptions layer_options(int64_t dim_feedforward, double dropout,
                                          std::string activation, double layer_norm_eps,
                                          bool batch_first, bool norm_first, py::handle dtype) {
  return {.dim_feedforward = dim_feedforward,
          .dropout = dropout,
          .activation = std::move(activation),
          .layer_norm_eps = layer_norm_eps,
          .batch_first = batch_first,
          .norm_first = norm_first,
          .dtype = dtype_or_f32(dtype)};
}

// The constructor both layers share: PyTorch's arguments, then a key and a dtype.
template <class Layer>
void layer_init(py::class_<Layer>& cls) {
  cls.def(py::init([](int64_t d_model, int64_t nhead, py::handle key, int64_t dim_feedforward,
                      double dropout, std::string activation, double layer_norm_eps,
                      bool batch_first, bool norm_first, py::handle dtype) {
            return Layer(d_model, nhead, to_tensor(key),
                         layer_options(dim_feedforward, dropout, std::move(activation),
                                       layer_norm_eps, batch_first, norm_first, dtype));
          }),
          py::arg("d_model"), py::arg("nhead"), py::arg("key"), py::arg("dim_feedforward") = 2048,
          py::arg("dropout") = 0.1, py::arg("activation") = "relu",
          py::arg("layer_norm_eps") = 1e-5, py::arg("batch_first") = false,
          py::arg("norm_first") = false, py::arg("dtype") = py::none());
  cls.def_readwrite("self_attn", &Layer::self_attn)
      .def_readwrite("linear1", &Layer::linear1)
      .def_readwrite("linear2", &Layer::linear2)
      .def_readwrite("norm1", &Layer::norm1)
      .def_readwrite("norm2", &Layer::norm2)
      .def_readwrite("dropout", &Layer::dropout)
      .def_readwrite("activation", &Layer::activation)
      .def_readwrite("norm_first", &Layer::norm_first);
  cls.def_property_readonly("batch_first", [](const Layer& l) { return l.self_attn.batch_first; });
}

template <class Layer>
std::string layer_text(const char* name, const Layer& l) {
  const int64_t d = l.linear1.weight.shape()[1];
  return std::string(name) + "(d_model=" + std::to_string(d) +
         ", nhead=" + std::to_string(l.self_attn.num_heads) +
         ", dim_feedforward=" + std::to_string(l.linear1.weight.shape()[0]) +
         ", dropout=" + number_text(l.dropout) + ", activation=" + l.activation +
         ", batch_first=" + bool_text(l.self_attn.batch_first) +
         ", norm_first=" + bool_text(l.norm_first) + ")";
}

nn::TransformerEncoderCall encoder_call(py::handle mask, py::handle key_padding_mask,
                                        bool is_causal) {
  return {.src_mask = optional_tensor(mask),
          .src_key_padding_mask = optional_tensor(key_padding_mask),
          .is_causal = is_causal};
}

struct DecoderArgs {
  py::handle tgt_mask, memory_mask, tgt_key_padding_mask, memory_key_padding_mask;
  bool tgt_is_causal, memory_is_causal;
};
nn::TransformerDecoderCall decoder_call(const DecoderArgs& a) {
  return {.tgt_mask = optional_tensor(a.tgt_mask),
          .memory_mask = optional_tensor(a.memory_mask),
          .tgt_key_padding_mask = optional_tensor(a.tgt_key_padding_mask),
          .memory_key_padding_mask = optional_tensor(a.memory_key_padding_mask),
          .tgt_is_causal = a.tgt_is_causal,
          .memory_is_causal = a.memory_is_causal};
}

// The encoder's call; the stack names the mask `mask`, the layer `src_mask`, as PyTorch.
template <class Encoder>
void encoder_call_def(py::class_<Encoder>& cls, const char* mask_name) {
  cls.def(
      "__call__",
      [](const Encoder& l, py::handle src, py::handle mask, py::handle src_key_padding_mask,
         bool is_causal, nn::Context* ctx) {
        const nn::TransformerEncoderCall c = encoder_call(mask, src_key_padding_mask, is_causal);
        return ctx != nullptr ? l(to_tensor(src), *ctx, c, Loc{}) : l(to_tensor(src), c, Loc{});
      },
      py::arg("src"), py::arg(mask_name) = py::none(), py::arg("src_key_padding_mask") = py::none(),
      py::arg("is_causal") = false, py::kw_only(), py::arg("ctx") = py::none(),
      "A bool mask is true where attending is NOT allowed (key padding: true marks padding), a "
      "floating one is added; ctx (a training Context) enables dropout.");
}

template <class Decoder>
void decoder_call_def(py::class_<Decoder>& cls) {
  cls.def(
      "__call__",
      [](const Decoder& l, py::handle tgt, py::handle memory, py::handle tgt_mask,
         py::handle memory_mask, py::handle tgt_key_padding_mask,
         py::handle memory_key_padding_mask, bool tgt_is_causal, bool memory_is_causal,
         nn::Context* ctx) {
        const nn::TransformerDecoderCall c =
            decoder_call({tgt_mask, memory_mask, tgt_key_padding_mask, memory_key_padding_mask,
                          tgt_is_causal, memory_is_causal});
        const Tensor t = to_tensor(tgt), m = to_tensor(memory);
        return ctx != nullptr ? l(t, m, *ctx, c, Loc{}) : l(t, m, c, Loc{});
      },
      py::arg("tgt"), py::arg("memory"), py::arg("tgt_mask") = py::none(),
      py::arg("memory_mask") = py::none(), py::arg("tgt_key_padding_mask") = py::none(),
      py::arg("memory_key_padding_mask") = py::none(), py::arg("tgt_is_causal") = false,
      py::arg("memory_is_causal") = false, py::kw_only(), py::arg("ctx") = py::none(),
      "Masks as MultiheadAttention's (bool true: NOT allowed / padding; floating: added); ctx (a "
      "training Context) enables dropout.");
}

template <class Stack, class Layer>
void stack_fields(py::class_<Stack>& cls, const char* layer_name) {
  cls.def(py::init([](const Layer& layer, int64_t num_layers, std::optional<nn::LayerNorm> norm) {
            return Stack(layer, num_layers, std::move(norm));
          }),
          py::arg(layer_name), py::arg("num_layers"), py::arg("norm") = py::none());
  cls.def_readwrite("layers", &Stack::layers).def_readwrite("norm", &Stack::norm);
  cls.def_property_readonly("num_layers",
                            [](const Stack& s) { return static_cast<int64_t>(s.layers.size()); });
}

}  // namespace

void bind_nn_transformer(py::module_& nn) {
  auto enc = layer_class<nn::TransformerEncoderLayer>(
      nn, "TransformerEncoderLayer",
      "torch.nn.TransformerEncoderLayer with its parameter names (self_attn, linear1, linear2, "
      "norm1, norm2); call: src, src_mask=None, src_key_padding_mask=None, is_causal=False, *, "
      "ctx=None.");
  layer_init(enc);
  encoder_call_def(enc, "src_mask");
  enc.def("__repr__", [](const nn::TransformerEncoderLayer& l) {
    return layer_text("TransformerEncoderLayer", l);
  });

  auto dec = layer_class<nn::TransformerDecoderLayer>(
      nn, "TransformerDecoderLayer",
      "torch.nn.TransformerDecoderLayer with its parameter names (self_attn, multihead_attn, "
      "linear1, linear2, norm1..3); call: tgt, memory, tgt_mask=None, memory_mask=None, "
      "tgt_key_padding_mask=None, memory_key_padding_mask=None, tgt_is_causal=False, "
      "memory_is_causal=False, *, ctx=None.");
  layer_init(dec);
  dec.def_readwrite("multihead_attn", &nn::TransformerDecoderLayer::multihead_attn)
      .def_readwrite("norm3", &nn::TransformerDecoderLayer::norm3);
  decoder_call_def(dec);
  dec.def("__repr__", [](const nn::TransformerDecoderLayer& l) {
    return layer_text("TransformerDecoderLayer", l);
  });

  auto encoder = layer_class<nn::TransformerEncoder>(
      nn, "TransformerEncoder",
      "num_layers copies of encoder_layer, then the optional final norm (a LayerNorm); call: "
      "src, mask=None, src_key_padding_mask=None, is_causal=False, *, ctx=None.");
  stack_fields<nn::TransformerEncoder, nn::TransformerEncoderLayer>(encoder, "encoder_layer");
  encoder_call_def(encoder, "mask");
  encoder.def("__repr__", [](const nn::TransformerEncoder& s) {
    return "TransformerEncoder(num_layers=" + std::to_string(s.layers.size()) +
           ", norm=" + bool_text(s.norm.has_value()) + ")";
  });

  auto decoder = layer_class<nn::TransformerDecoder>(
      nn, "TransformerDecoder",
      "num_layers copies of decoder_layer, then the optional final norm (a LayerNorm); call as "
      "TransformerDecoderLayer's.");
  stack_fields<nn::TransformerDecoder, nn::TransformerDecoderLayer>(decoder, "decoder_layer");
  decoder_call_def(decoder);
  decoder.def("__repr__", [](const nn::TransformerDecoder& s) {
    return "TransformerDecoder(num_layers=" + std::to_string(s.layers.size()) +
           ", norm=" + bool_text(s.norm.has_value()) + ")";
  });
}

}  // namespace kiln::python
