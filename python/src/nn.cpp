// kiln.nn: the layers of kiln::nn as Python classes that are pytrees (each bound struct is
// registered with register_native_tree, so transformations flatten it as C++ does), their
// functional forms, losses and initialisers (docs/PYTHON.md, "nn, optim, data and io").
#include "kiln/nn.h"

#include <cstdint>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "bindings.h"
#include "nn_layers.h"
#include "pytree.h"

namespace kiln::python {
namespace {

using Pair = std::pair<int64_t, int64_t>;

// An int or a pair of ints (PyTorch's convention for kernel sizes, strides, paddings).
Pair to_pair(py::handle value) {
  if (py::isinstance<py::int_>(value)) {
    const auto v = value.cast<int64_t>();
    return {v, v};
  }
  return value.cast<Pair>();
}

// An int or a sequence of ints (PyTorch's normalized_shape).
Shape to_shape(py::handle value) {
  if (py::isinstance<py::int_>(value)) return Shape{value.cast<int64_t>()};
  return Shape(value.cast<std::vector<int64_t>>());
}

std::string pair_text(Pair p) {
  return "(" + std::to_string(p.first) + ", " + std::to_string(p.second) + ")";
}

nn::Reduction to_reduction(const std::string& name) {
  if (name == "none") return nn::Reduction::none;
  if (name == "sum") return nn::Reduction::sum;
  if (name == "mean") return nn::Reduction::mean;
  if (name == "batchmean") return nn::Reduction::batchmean;
  fail("nn", "unknown reduction: got \"", name,
       "\", expected \"none\", \"sum\", \"mean\" or \"batchmean\"");
}

void bind_activations(py::module_& nn) {
  nn.def(
      "relu", [](py::handle x) { return nn::relu(to_tensor(x), Loc{}); }, py::arg("x"),
      "max(x, 0).");
  nn.def(
      "gelu",
      [](py::handle x, bool approximate) { return nn::gelu(to_tensor(x), approximate, Loc{}); },
      py::arg("x"), py::arg("approximate") = false,
      "Exact GELU x * Phi(x); approximate=True uses the tanh formula (PyTorch "
      "approximate='tanh').");
  nn.def(
      "silu", [](py::handle x) { return nn::silu(to_tensor(x), Loc{}); }, py::arg("x"),
      "x * sigmoid(x).");
  nn.def(
      "softplus",
      [](py::handle x, std::optional<double> beta, double threshold) {
        return beta ? nn::softplus(to_tensor(x), *beta, threshold, Loc{})
                    : nn::softplus(to_tensor(x), Loc{});
      },
      py::arg("x"), py::arg("beta") = py::none(), py::arg("threshold") = 20.0,
      "log(1 + e^x), exact for every x. With beta: PyTorch's softplus(x, beta, threshold).");
  nn.def(
      "log_sigmoid", [](py::handle x) { return nn::log_sigmoid(to_tensor(x), Loc{}); },
      py::arg("x"), "log(sigmoid(x)) = -softplus(-x), without overflow.");
  nn.def(
      "softmax", [](py::handle x, int64_t axis) { return softmax(to_tensor(x), axis, Loc{}); },
      py::arg("x"), py::arg("axis") = -1, "exp(x) / sum(exp(x)) along `axis`.");
  nn.def(
      "log_softmax",
      [](py::handle x, int64_t axis) { return log_softmax(to_tensor(x), axis, Loc{}); },
      py::arg("x"), py::arg("axis") = -1, "x - logsumexp(x) along `axis`.");
  nn.def(
      "elu", [](py::handle x, double alpha) { return nn::elu(to_tensor(x), alpha, Loc{}); },
      py::arg("x"), py::arg("alpha") = 1.0, "x for x > 0, alpha (e^x - 1) otherwise.");
  nn.def(
      "leaky_relu",
      [](py::handle x, double slope) { return nn::leaky_relu(to_tensor(x), slope, Loc{}); },
      py::arg("x"), py::arg("negative_slope") = 0.01, "x for x > 0, negative_slope x otherwise.");
  using Unary = Tensor (*)(const Tensor&, Loc);
  const auto def_unary = [&](const char* name, Unary f, const char* doc) {
    nn.def(
        name, [f](py::handle x) { return f(to_tensor(x), Loc{}); }, py::arg("x"), doc);
  };
  def_unary("mish", &nn::mish, "x * tanh(softplus(x)).");
  def_unary("relu6", &nn::relu6, "min(max(x, 0), 6).");
  def_unary("hardswish", &nn::hardswish, "x * relu6(x + 3) / 6.");
  def_unary("hardsigmoid", &nn::hardsigmoid, "relu6(x + 3) / 6.");
  def_unary("selu", &nn::selu, "scale * elu(x, alpha) with the self-normalising constants.");
  nn.def(
      "hardtanh",
      [](py::handle x, double lo, double hi) { return nn::hardtanh(to_tensor(x), lo, hi, Loc{}); },
      py::arg("x"), py::arg("min_val") = -1.0, py::arg("max_val") = 1.0,
      "x clamped to [min_val, max_val].");
  nn.def(
      "celu", [](py::handle x, double alpha) { return nn::celu(to_tensor(x), alpha, Loc{}); },
      py::arg("x"), py::arg("alpha") = 1.0, "x for x > 0, alpha (e^(x / alpha) - 1) otherwise.");
  nn.def(
      "glu", [](py::handle x, int64_t axis) { return nn::glu(to_tensor(x), axis, Loc{}); },
      py::arg("x"), py::arg("axis") = -1, "a * sigmoid(b) for the halves a, b of x along axis.");
  nn.def(
      "prelu",
      [](py::handle x, py::handle w) { return nn::prelu(to_tensor(x), to_tensor(w), Loc{}); },
      py::arg("x"), py::arg("weight"),
      "x for x > 0, weight * x otherwise; weight has one element or one per channel (axis 1).");
  nn.def(
      "softmin", [](py::handle x, int64_t axis) { return nn::softmin(to_tensor(x), axis, Loc{}); },
      py::arg("x"), py::arg("axis") = -1, "softmax(-x) along axis.");
  nn.def(
      "normalize",
      [](py::handle x, double p, int64_t axis, double eps) {
        return nn::normalize(to_tensor(x), p, axis, eps, Loc{});
      },
      py::arg("x"), py::arg("p") = 2.0, py::arg("axis") = 1, py::arg("eps") = 1e-12,
      "x / max(||x||_p, eps) along axis (PyTorch's F.normalize; default axis 1).");
  nn.def(
      "dropout",
      [](py::handle x, double rate, py::handle key) {
        return nn::dropout(to_tensor(x), rate, to_tensor(key), Loc{});
      },
      py::arg("x"), py::arg("rate"), py::arg("key"),
      "Zeroes each element with probability rate (drawn from key), scales the rest by "
      "1 / (1 - rate).");
  nn.def(
      "layer_norm",
      [](py::handle x, py::handle shape, py::handle w, py::handle b, double eps) {
        return nn::layer_norm(to_tensor(x), to_shape(shape), optional_tensor(w), optional_tensor(b),
                              eps, Loc{});
      },
      py::arg("x"), py::arg("normalized_shape"), py::arg("weight") = py::none(),
      py::arg("bias") = py::none(), py::arg("eps") = 1e-5,
      "x normalised over its trailing normalized_shape axes, then * weight + bias.");
  nn.def(
      "batch_norm",
      [](py::handle x, std::optional<nn::BatchNormState> state, py::handle w, py::handle b,
         bool training, double momentum, double eps) {
        nn::BatchNormResult r = nn::batch_norm(to_tensor(x), state, optional_tensor(w),
                                               optional_tensor(b), training, momentum, eps, Loc{});
        return py::make_tuple(r.y, r.state ? py::cast(*r.state) : py::none());
      },
      py::arg("x"), py::arg("state"), py::arg("weight") = py::none(), py::arg("bias") = py::none(),
      py::arg("training") = false, py::arg("momentum") = 0.1, py::arg("eps") = 1e-5,
      "(y, state): x [N, C, ...] normalised per channel. Training: batch statistics, and the "
      "running BatchNormState (or None) moved by momentum; evaluation: the running statistics.");
  nn.def(
      "instance_norm",
      [](py::handle x, py::handle w, py::handle b, double eps) {
        return nn::instance_norm(to_tensor(x), optional_tensor(w), optional_tensor(b), eps, Loc{});
      },
      py::arg("x"), py::arg("weight") = py::none(), py::arg("bias") = py::none(),
      py::arg("eps") = 1e-5, "x [N, C, ...] normalised per sample and channel over the positions.");
  nn.def(
      "group_norm",
      [](py::handle x, int64_t groups, py::handle w, py::handle b, double eps) {
        return nn::group_norm(to_tensor(x), groups, optional_tensor(w), optional_tensor(b), eps,
                              Loc{});
      },
      py::arg("x"), py::arg("num_groups"), py::arg("weight") = py::none(),
      py::arg("bias") = py::none(), py::arg("eps") = 1e-5,
      "x [N, C, ...] normalised over groups of C / num_groups channels, as PyTorch's group_norm.");
  nn.def(
      "rms_norm",
      [](py::handle x, py::handle w, double eps) {
        return nn::rms_norm(to_tensor(x), optional_tensor(w), eps, Loc{});
      },
      py::arg("x"), py::arg("weight") = py::none(), py::arg("eps") = 1e-6,
      "x / sqrt(mean(x^2 over the last axis) + eps) * weight.");
}

void bind_losses(py::module_& nn) {
  nn.def(
      "cross_entropy",
      [](py::handle logits, py::handle labels, double smoothing, std::optional<int64_t> ignore,
         const std::string& reduction, py::handle weight) {
        return nn::cross_entropy(to_tensor(logits), to_tensor(labels), smoothing, ignore,
                                 to_reduction(reduction), optional_tensor(weight), Loc{});
      },
      py::arg("logits"), py::arg("labels"), py::arg("label_smoothing") = 0.0,
      py::arg("ignore_index") = -100, py::arg("reduction") = "mean", py::arg("weight") = py::none(),
      "Cross-entropy of logits [..., C] (classes last) and integer labels [...] or probabilities "
      "[..., C]; labels equal to ignore_index (None: none) are not counted; weight [C] per class.");
  using PairLoss = Tensor (*)(const Tensor&, const Tensor&, nn::Reduction, Loc);
  const auto def_pair_loss = [&](const char* name, PairLoss f, const char* doc) {
    nn.def(
        name,
        [f](py::handle p, py::handle t, const std::string& reduction) {
          return f(to_tensor(p), to_tensor(t), to_reduction(reduction), Loc{});
        },
        py::arg("prediction"), py::arg("target"), py::arg("reduction") = "mean", doc);
  };
  def_pair_loss("mse", &nn::mse, "Squared error, reduced.");
  def_pair_loss("l1_loss", &nn::l1_loss, "Absolute error, reduced.");
  nn.def(
      "smooth_l1_loss",
      [](py::handle p, py::handle t, double beta, const std::string& reduction) {
        return nn::smooth_l1_loss(to_tensor(p), to_tensor(t), beta, to_reduction(reduction), Loc{});
      },
      py::arg("prediction"), py::arg("target"), py::arg("beta") = 1.0,
      py::arg("reduction") = "mean",
      "d^2 / (2 beta) where |d| < beta, else |d| - beta / 2 (PyTorch's smooth_l1_loss).");
  nn.def(
      "binary_cross_entropy_with_logits",
      [](py::handle x, py::handle t, const std::string& reduction, py::handle pos_weight,
         py::handle weight) {
        return nn::binary_cross_entropy_with_logits(
            to_tensor(x), to_tensor(t), to_reduction(reduction), optional_tensor(pos_weight),
            optional_tensor(weight), Loc{});
      },
      py::arg("logits"), py::arg("targets"), py::arg("reduction") = "mean",
      py::arg("pos_weight") = py::none(), py::arg("weight") = py::none(),
      "pos_weight t softplus(-x) + (1 - t) softplus(x), stable for large |logits|, reduced.");
  nn.def(
      "binary_cross_entropy",
      [](py::handle p, py::handle t, const std::string& reduction, py::handle weight) {
        return nn::binary_cross_entropy(to_tensor(p), to_tensor(t), to_reduction(reduction),
                                        optional_tensor(weight), Loc{});
      },
      py::arg("probabilities"), py::arg("targets"), py::arg("reduction") = "mean",
      py::arg("weight") = py::none(),
      "-(t log p + (1 - t) log(1 - p)), each log clamped at -100 as PyTorch, reduced.");
  nn.def(
      "accuracy",
      [](py::handle logits, py::handle labels, std::optional<int64_t> ignore) {
        return nn::accuracy(to_tensor(logits), to_tensor(labels), ignore, Loc{});
      },
      py::arg("logits"), py::arg("labels"), py::arg("ignore_index") = -100,
      "Fraction of rows whose largest logit is at the label.");
  nn.def(
      "huber_loss",
      [](py::handle p, py::handle t, double delta, const std::string& reduction) {
        return nn::huber_loss(to_tensor(p), to_tensor(t), delta, to_reduction(reduction), Loc{});
      },
      py::arg("prediction"), py::arg("target"), py::arg("delta") = 1.0,
      py::arg("reduction") = "mean",
      "d^2 / 2 where |d| < delta, else delta (|d| - delta / 2); reduction 'none', 'sum' or "
      "'mean'.");
  nn.def(
      "kl_div",
      [](py::handle input, py::handle target, const std::string& reduction, bool log_target) {
        return nn::kl_div(to_tensor(input), to_tensor(target), to_reduction(reduction), log_target,
                          Loc{});
      },
      py::arg("input"), py::arg("target"), py::arg("reduction") = "mean",
      py::arg("log_target") = false,
      "KL(target || exp(input)) for log-probabilities `input`, as torch.nn.functional.kl_div.");
  nn.def(
      "nll_loss",
      [](py::handle log_probs, py::handle labels, std::optional<int64_t> ignore,
         const std::string& reduction, py::handle weight) {
        return nn::nll_loss(to_tensor(log_probs), to_tensor(labels), ignore,
                            to_reduction(reduction), optional_tensor(weight), Loc{});
      },
      py::arg("log_probs"), py::arg("labels"), py::arg("ignore_index") = -100,
      py::arg("reduction") = "mean", py::arg("weight") = py::none(),
      "-log_probs[..., label] (classes last), reduced; ignore_index positions are not counted.");
}

nn::AttentionOptions attention_options(py::handle attn_mask, bool is_causal,
                                       py::handle key_padding_mask, std::optional<double> scale,
                                       double dropout, py::handle dropout_key) {
  nn::AttentionOptions o;
  o.attn_mask = optional_tensor(attn_mask);
  o.is_causal = is_causal;
  o.key_padding_mask = optional_tensor(key_padding_mask);
  o.scale = scale;
  o.dropout = dropout;
  o.dropout_key = optional_tensor(dropout_key);
  return o;
}

void bind_attention_functions(py::module_& nn) {
  nn.def(
      "attention_weights",
      [](py::handle q, py::handle k, py::handle attn_mask, bool is_causal,
         py::handle key_padding_mask, std::optional<double> scale, double dropout,
         py::handle dropout_key) {
        return nn::attention_weights(
            to_tensor(q), to_tensor(k),
            attention_options(attn_mask, is_causal, key_padding_mask, scale, dropout, dropout_key),
            Loc{});
      },
      py::arg("q"), py::arg("k"), py::kw_only(), py::arg("attn_mask") = py::none(),
      py::arg("is_causal") = false, py::arg("key_padding_mask") = py::none(),
      py::arg("scale") = py::none(), py::arg("dropout") = 0.0, py::arg("dropout_key") = py::none(),
      "softmax(q k^T * scale + masks) over the keys: [..., L, S]. A bool attn_mask is true where "
      "attending is allowed; a bool key_padding_mask is true at padding.");
  nn.def(
      "scaled_dot_product_attention",
      [](py::handle q, py::handle k, py::handle v, py::handle attn_mask, bool is_causal,
         py::handle key_padding_mask, std::optional<double> scale, double dropout,
         py::handle dropout_key) {
        return nn::scaled_dot_product_attention(
            to_tensor(q), to_tensor(k), to_tensor(v),
            attention_options(attn_mask, is_causal, key_padding_mask, scale, dropout, dropout_key),
            Loc{});
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::kw_only(), py::arg("attn_mask") = py::none(),
      py::arg("is_causal") = false, py::arg("key_padding_mask") = py::none(),
      py::arg("scale") = py::none(), py::arg("dropout") = 0.0, py::arg("dropout_key") = py::none(),
      "attention_weights(q, k) v, as PyTorch 2's F.scaled_dot_product_attention.");
}

// Megatron's layers inside shard_map (C++'s kiln/nn.h, "tensor parallelism").
void bind_parallel_layers(py::module_& nn) {
  nn.def(
      "row_parallel_linear",
      [](const nn::Linear& block, py::handle x, const std::string& axis) {
        return nn::row_parallel_linear(block, to_tensor(x), axis, Loc{});
      },
      py::arg("block"), py::arg("x"), py::arg("axis"),
      "Inside shard_map: a row-parallel Linear. `block` holds this process's columns of the "
      "weight [out, in / M] and the whole bias, x this process's block of the input features "
      "(a column-parallel layer's output); the psum over `axis` of x W_block^T, plus the bias "
      "once. A column-parallel Linear is an ordinary Linear on a block of the weight's rows.");
  nn.def(
      "parallel_embedding",
      [](const nn::Embedding& block, py::handle ids, const std::string& axis) {
        return nn::parallel_embedding(block, to_tensor(ids), axis, Loc{});
      },
      py::arg("block"), py::arg("ids"), py::arg("axis"),
      "Inside shard_map: a vocabulary-parallel embedding. `block` holds rows [p V/M, (p+1) V/M) "
      "of the table at position p of `axis`; ids are global token ids, the same on every "
      "process of the axis. Each process looks up the ids it holds, and a psum adds them up.");
  nn.def(
      "parallel_cross_entropy",
      [](py::handle logits, py::handle labels, const std::string& axis) {
        return nn::parallel_cross_entropy(to_tensor(logits), to_tensor(labels), axis, Loc{});
      },
      py::arg("logits"), py::arg("labels"), py::arg("axis"),
      "Inside shard_map: vocabulary-parallel cross-entropy of logits [N, C / M] (this "
      "process's block of the classes) and global labels [N], without gathering the logits.");
}

void bind_init(py::module_& nn) {
  py::module_ init = nn.def_submodule("init", "Initialisers with PyTorch's fan conventions.");
  using Init = Tensor (*)(const Tensor&, const Shape&, double, DType);
  const auto def_init = [&](const char* name, Init f, const char* arg, double default_value,
                            const char* doc) {
    init.def(
        name,
        [f](py::handle key, const std::vector<int64_t>& shape, double a, py::handle dtype) {
          return f(to_tensor(key), Shape(shape), a, dtype_or_f32(dtype));
        },
        py::arg("key"), py::arg("shape"), py::arg(arg) = default_value,
        py::arg("dtype") = py::none(), doc);
  };
  def_init("kaiming_uniform", &nn::init::kaiming_uniform, "negative_slope", 0.0,
           "Kaiming (He) uniform for relu, or leaky relu with negative_slope.");
  def_init("kaiming_normal", &nn::init::kaiming_normal, "negative_slope", 0.0,
           "Kaiming (He) normal for relu, or leaky relu with negative_slope.");
  def_init("xavier_uniform", &nn::init::xavier_uniform, "gain", 1.0, "Xavier (Glorot) uniform.");
  def_init("xavier_normal", &nn::init::xavier_normal, "gain", 1.0, "Xavier (Glorot) normal.");
  def_init("lecun_uniform", &nn::init::lecun_uniform, "fan_in", 1.0,
           "uniform(-1/sqrt(fan_in), 1/sqrt(fan_in)): PyTorch's default for Linear and Conv2d.");
}

void bind_context(py::module_& nn) {
  py::class_<nn::Context> ctx(
      nn, "Context",
      "Training mode and the key that Dropout draws from: Context.train(key) or Context.eval(). "
      "Each random layer splits the key, so pass the same Context through one forward pass.");
  ctx.def_static(
      "train", [](py::handle key) { return nn::Context::train(to_tensor(key)); }, py::arg("key"),
      "A training context whose random layers draw from `key`.");
  ctx.def_static("eval", &nn::Context::eval, "An evaluation context (Dropout is the identity).");
  ctx.def_property_readonly("training", &nn::Context::training);
  ctx.def(
      "next_key", [](nn::Context& c) { return c.next_key("nn.Context.next_key"); },
      "A fresh key for one random layer (the context's key is split).");
  ctx.def("__repr__", [](const nn::Context& c) {
    return std::string(c.training() ? "Context.train(...)" : "Context.eval()");
  });
}

void bind_simple_layers(py::module_& nn) {
  auto linear = layer_class<nn::Linear>(nn, "Linear",
                                        "y = x W^T + b with weight [out, in], PyTorch's layout.");
  linear.def(py::init([](int64_t in, int64_t out, py::handle key, bool bias, py::handle dtype) {
               return nn::Linear(in, out, to_tensor(key), bias, dtype_or_f32(dtype));
             }),
             py::arg("in_features"), py::arg("out_features"), py::arg("key"),
             py::arg("bias") = true, py::arg("dtype") = py::none());
  tensor_property(linear, "weight", &nn::Linear::weight, "[out_features, in_features]");
  tensor_property(linear, "bias", &nn::Linear::bias, "[out_features], or None");
  linear.def(
      "__call__", [](const nn::Linear& l, py::handle x) { return l(to_tensor(x), Loc{}); },
      py::arg("x"));
  linear.def("__repr__", [](const nn::Linear& l) {
    return "Linear(weight=" + l.weight.type().to_string() + ", bias=" + type_text(l.bias) + ")";
  });

  const auto bind_pool = [&](auto tag, const char* name, const char* doc) {
    using P = typename decltype(tag)::type;
    auto pool = layer_class<P>(nn, name, doc);
    pool.def(py::init([](py::handle kernel, py::handle stride, py::handle padding) {
               P p;
               p.kernel = to_pair(kernel);
               p.stride = stride.is_none() ? p.kernel : to_pair(stride);
               p.padding = to_pair(padding);
               return p;
             }),
             py::arg("kernel_size") = 2, py::arg("stride") = py::none(), py::arg("padding") = 0);
    pool.def_readwrite("kernel_size", &P::kernel)
        .def_readwrite("stride", &P::stride)
        .def_readwrite("padding", &P::padding);
    pool.def(
        "__call__", [](const P& l, py::handle x) { return l(to_tensor(x), Loc{}); }, py::arg("x"));
    pool.def("__repr__", [name = std::string(name)](const P& l) {
      return name + "(kernel_size=" + pair_text(l.kernel) + ", stride=" + pair_text(l.stride) +
             ", padding=" + pair_text(l.padding) + ")";
    });
  };
  bind_pool(std::type_identity<nn::MaxPool2d>{}, "MaxPool2d",
            "Max over kernel windows of [N, C, H, W]; stride defaults to the kernel size.");
  bind_pool(std::type_identity<nn::AvgPool2d>{}, "AvgPool2d",
            "Mean over kernel windows of [N, C, H, W] (padding counts in the divisor).");

  auto flatten = layer_class<nn::Flatten>(nn, "Flatten",
                                          "Keeps the axes before start_dim, flattens the rest.");
  flatten.def(py::init([](int64_t start_dim) { return nn::Flatten{start_dim}; }),
              py::arg("start_dim") = 1);
  flatten.def_readwrite("start_dim", &nn::Flatten::start_dim);
  flatten.def(
      "__call__", [](const nn::Flatten& l, py::handle x) { return l(to_tensor(x), Loc{}); },
      py::arg("x"));
  flatten.def("__repr__", [](const nn::Flatten& l) {
    return "Flatten(start_dim=" + std::to_string(l.start_dim) + ")";
  });

  auto act = layer_class<nn::Activation>(
      nn, "Activation",
      "An activation as a layer: kind is relu, gelu, gelu_tanh, silu, tanh, sigmoid, mish, "
      "relu6, hardtanh, hardswish, hardsigmoid, selu or celu.");
  act.def(py::init([](std::string kind) { return nn::Activation{std::move(kind)}; }),
          py::arg("kind") = "relu");
  act.def_readwrite("kind", &nn::Activation::kind);
  act.def(
      "__call__", [](const nn::Activation& l, py::handle x) { return l(to_tensor(x), Loc{}); },
      py::arg("x"));
  act.def("__repr__", [](const nn::Activation& l) { return "Activation(\"" + l.kind + "\")"; });
  nn.def("ReLU", &nn::ReLU, "Activation(\"relu\").");
  nn.def("GELU", &nn::GELU, py::arg("approximate") = false,
         "Activation(\"gelu\"), or \"gelu_tanh\" with approximate=True.");
  nn.def("SiLU", &nn::SiLU, "Activation(\"silu\").");
  nn.def("Tanh", &nn::Tanh, "Activation(\"tanh\").");
  nn.def("Mish", &nn::Mish, "Activation(\"mish\").");
  nn.def("ReLU6", &nn::ReLU6, "Activation(\"relu6\").");
  nn.def("Hardswish", &nn::Hardswish, "Activation(\"hardswish\").");
  nn.def("Hardsigmoid", &nn::Hardsigmoid, "Activation(\"hardsigmoid\").");
  nn.def("SELU", &nn::SELU, "Activation(\"selu\").");

  auto dropout = layer_class<nn::Dropout>(
      nn, "Dropout",
      "Zeroes elements with probability rate in training (key from the Context) and scales the "
      "rest by 1 / (1 - rate); the identity without a training Context.");
  dropout.def(py::init([](double rate) { return nn::Dropout{rate}; }), py::arg("rate") = 0.5);
  dropout.def_readwrite("rate", &nn::Dropout::rate);
  dropout.def(
      "__call__",
      [](const nn::Dropout& l, py::handle x, nn::Context* ctx) {
        return ctx ? l(to_tensor(x), *ctx, Loc{}) : l(to_tensor(x), Loc{});
      },
      py::arg("x"), py::arg("ctx") = py::none());
  dropout.def("__repr__",
              [](const nn::Dropout& l) { return "Dropout(rate=" + number_text(l.rate) + ")"; });

  auto embedding =
      layer_class<nn::Embedding>(nn, "Embedding", "Rows of weight [num, dim] by integer index.");
  embedding.def(py::init([](int64_t num, int64_t dim, py::handle key, py::handle dtype) {
                  return nn::Embedding(num, dim, to_tensor(key), dtype_or_f32(dtype));
                }),
                py::arg("num_embeddings"), py::arg("embedding_dim"), py::arg("key"),
                py::arg("dtype") = py::none());
  tensor_property(embedding, "weight", &nn::Embedding::weight, "[num_embeddings, embedding_dim]");
  embedding.def(
      "__call__", [](const nn::Embedding& l, py::handle i) { return l(to_tensor(i), Loc{}); },
      py::arg("indices"));
  embedding.def("__repr__", [](const nn::Embedding& l) {
    return "Embedding(weight=" + l.weight.type().to_string() + ")";
  });

  const auto bind_parametric = [&](auto tag, const char* name, const char* field,
                                   double default_value, const char* doc) {
    using A = typename decltype(tag)::type;
    auto cls = layer_class<A>(nn, name, doc);
    cls.def(py::init([](double v) { return A{v}; }), py::arg(field) = default_value);
    cls.def(
        "__call__", [](const A& l, py::handle x) { return l(to_tensor(x), Loc{}); }, py::arg("x"));
    return cls;
  };
  bind_parametric(std::type_identity<nn::ELU>{}, "ELU", "alpha", 1.0, "nn.elu as a layer.")
      .def_readwrite("alpha", &nn::ELU::alpha)
      .def("__repr__", [](const nn::ELU& l) { return "ELU(alpha=" + number_text(l.alpha) + ")"; });
  bind_parametric(std::type_identity<nn::LeakyReLU>{}, "LeakyReLU", "negative_slope", 0.01,
                  "nn.leaky_relu as a layer.")
      .def_readwrite("negative_slope", &nn::LeakyReLU::negative_slope)
      .def("__repr__", [](const nn::LeakyReLU& l) {
        return "LeakyReLU(negative_slope=" + number_text(l.negative_slope) + ")";
      });
  bind_parametric(std::type_identity<nn::CELU>{}, "CELU", "alpha", 1.0, "nn.celu as a layer.")
      .def_readwrite("alpha", &nn::CELU::alpha)
      .def("__repr__",
           [](const nn::CELU& l) { return "CELU(alpha=" + number_text(l.alpha) + ")"; });
  auto glu = layer_class<nn::GLU>(nn, "GLU", "nn.glu as a layer.");
  glu.def(py::init([](int64_t axis) { return nn::GLU{axis}; }), py::arg("axis") = -1);
  glu.def_readwrite("axis", &nn::GLU::axis);
  glu.def(
      "__call__", [](const nn::GLU& l, py::handle x) { return l(to_tensor(x), Loc{}); },
      py::arg("x"));
  glu.def("__repr__", [](const nn::GLU& l) { return "GLU(axis=" + std::to_string(l.axis) + ")"; });
  auto prelu = layer_class<nn::PReLU>(
      nn, "PReLU", "nn.prelu with a learned weight [num_parameters], initialised to init.");
  prelu.def(py::init([](int64_t n, double init, py::handle dtype) {
              return nn::PReLU(n, init, dtype_or_f32(dtype));
            }),
            py::arg("num_parameters") = 1, py::arg("init") = 0.25, py::arg("dtype") = py::none());
  tensor_property(prelu, "weight", &nn::PReLU::weight, "[num_parameters]");
  prelu.def(
      "__call__", [](const nn::PReLU& l, py::handle x) { return l(to_tensor(x), Loc{}); },
      py::arg("x"));
  prelu.def("__repr__",
            [](const nn::PReLU& l) { return "PReLU(weight=" + l.weight.type().to_string() + ")"; });
  // A layer whose two static parameters are doubles: constructor, fields, call and repr.
  struct Field {
    const char* name;
    double value;  // the default
  };
  const auto bind_two_parameters = [&]<class A>(std::type_identity<A>, const char* name,
                                                const char* doc, Field a, double A::*a_member,
                                                Field b, double A::*b_member) {
    auto cls = layer_class<A>(nn, name, doc);
    cls.def(py::init([a_member, b_member](double av, double bv) {
              A layer;
              layer.*a_member = av;
              layer.*b_member = bv;
              return layer;
            }),
            py::arg(a.name) = a.value, py::arg(b.name) = b.value);
    cls.def_readwrite(a.name, a_member).def_readwrite(b.name, b_member);
    cls.def(
        "__call__", [](const A& l, py::handle x) { return l(to_tensor(x), Loc{}); }, py::arg("x"));
    cls.def("__repr__", [name = std::string(name), a, a_member, b, b_member](const A& l) {
      return name + "(" + a.name + "=" + number_text(l.*a_member) + ", " + b.name + "=" +
             number_text(l.*b_member) + ")";
    });
  };
  bind_two_parameters(std::type_identity<nn::Softplus>{}, "Softplus",
                      "PyTorch's Softplus(beta, threshold).", {"beta", 1.0}, &nn::Softplus::beta,
                      {"threshold", 20.0}, &nn::Softplus::threshold);
  bind_two_parameters(std::type_identity<nn::Hardtanh>{}, "Hardtanh", "nn.hardtanh as a layer.",
                      {"min_val", -1.0}, &nn::Hardtanh::min_val, {"max_val", 1.0},
                      &nn::Hardtanh::max_val);
}

void bind_norms(py::module_& nn) {
  auto ln = layer_class<nn::LayerNorm>(
      nn, "LayerNorm",
      "Normalises over the trailing normalized_shape axes, then scales and shifts.");
  ln.def(py::init([](py::handle shape, double eps, py::handle dtype, bool affine) {
           return nn::LayerNorm(to_shape(shape), eps, dtype_or_f32(dtype), affine);
         }),
         py::arg("normalized_shape"), py::arg("eps") = 1e-5, py::arg("dtype") = py::none(),
         py::arg("elementwise_affine") = true);
  tensor_property(ln, "weight", &nn::LayerNorm::weight,
                  "normalized_shape, initialised to 1, or None");
  tensor_property(ln, "bias", &nn::LayerNorm::bias, "normalized_shape, initialised to 0, or None");
  ln.def_readwrite("eps", &nn::LayerNorm::eps)
      .def_readwrite("normalized_shape", &nn::LayerNorm::normalized_shape);
  ln.def(
      "__call__", [](const nn::LayerNorm& l, py::handle x) { return l(to_tensor(x), Loc{}); },
      py::arg("x"));
  ln.def("__repr__", [](const nn::LayerNorm& l) {
    return "LayerNorm(normalized_shape=" + Shape(l.normalized_shape).to_string() +
           ", eps=" + number_text(l.eps) + ", elementwise_affine=" + (l.weight ? "True" : "False") +
           ")";
  });

  auto bn_state = layer_class<nn::BatchNormState>(
      nn, "BatchNormState", "BatchNorm's running statistics (state, not parameters).");
  bn_state.def(py::init([](py::handle mean, py::handle var) {
                 return nn::BatchNormState{to_tensor(mean), to_tensor(var)};
               }),
               py::arg("mean"), py::arg("var"));
  tensor_property(bn_state, "mean", &nn::BatchNormState::mean, "running mean [C]");
  tensor_property(bn_state, "var", &nn::BatchNormState::var, "running (unbiased) variance [C]");
  bn_state.def("__repr__", [](const nn::BatchNormState& s) {
    return "BatchNormState(mean=" + s.mean.type().to_string() +
           ", var=" + s.var.type().to_string() + ")";
  });

  auto bn = layer_class<nn::BatchNorm>(
      nn, "BatchNorm",
      "Batch normalisation over every axis but 1. The running statistics are a separate "
      "BatchNormState: y, state = bn(x, state, training).");
  bn.def(py::init([](int64_t channels, double momentum, double eps, py::handle dtype, bool affine) {
           return nn::BatchNorm(channels, momentum, eps, dtype_or_f32(dtype), affine);
         }),
         py::arg("num_features"), py::arg("momentum") = 0.1, py::arg("eps") = 1e-5,
         py::arg("dtype") = py::none(), py::arg("affine") = true);
  tensor_property(bn, "weight", &nn::BatchNorm::weight, "[C], initialised to 1, or None");
  tensor_property(bn, "bias", &nn::BatchNorm::bias, "[C], initialised to 0, or None");
  bn.def_readwrite("num_features", &nn::BatchNorm::channels);
  bn.def_readwrite("momentum", &nn::BatchNorm::momentum).def_readwrite("eps", &nn::BatchNorm::eps);
  bn.def("initial_state", &nn::BatchNorm::initial_state, "Running mean 0 and variance 1.");
  bn.def(
      "__call__",
      [](const nn::BatchNorm& l, py::handle x, const nn::BatchNormState& state, bool training) {
        auto [y, next] = l(to_tensor(x), state, training, Loc{});
        return py::make_tuple(y, next);
      },
      py::arg("x"), py::arg("state"), py::arg("training"),
      "(y, new state). Training: batch statistics, the running ones move by momentum. "
      "Evaluation: the running statistics, returned unchanged.");
  bn.def("__repr__", [](const nn::BatchNorm& l) {
    return "BatchNorm(num_features=" + std::to_string(l.channels) +
           ", affine=" + (l.weight ? "True" : "False") + ", momentum=" + number_text(l.momentum) +
           ", eps=" + number_text(l.eps) + ")";
  });

  auto gn = layer_class<nn::GroupNorm>(nn, "GroupNorm", "nn.group_norm as a layer.");
  gn.def(py::init([](int64_t groups, int64_t channels, double eps, bool affine, py::handle dtype) {
           return nn::GroupNorm(groups, channels, eps, affine, dtype_or_f32(dtype));
         }),
         py::arg("num_groups"), py::arg("num_channels"), py::arg("eps") = 1e-5,
         py::arg("affine") = true, py::arg("dtype") = py::none());
  tensor_property(gn, "weight", &nn::GroupNorm::weight, "[C] or None");
  tensor_property(gn, "bias", &nn::GroupNorm::bias, "[C] or None");
  gn.def_readwrite("num_groups", &nn::GroupNorm::num_groups)
      .def_readwrite("num_channels", &nn::GroupNorm::channels)
      .def_readwrite("eps", &nn::GroupNorm::eps);
  gn.def(
      "__call__", [](const nn::GroupNorm& l, py::handle x) { return l(to_tensor(x), Loc{}); },
      py::arg("x"));
  gn.def("__repr__", [](const nn::GroupNorm& l) {
    return "GroupNorm(num_groups=" + std::to_string(l.num_groups) +
           ", num_channels=" + std::to_string(l.channels) + ", eps=" + number_text(l.eps) +
           ", affine=" + (l.weight ? "True" : "False") + ")";
  });

  auto rms = layer_class<nn::RMSNorm>(nn, "RMSNorm", "nn.rms_norm as a layer.");
  rms.def(py::init([](int64_t dim, double eps, bool affine, py::handle dtype) {
            return nn::RMSNorm(dim, eps, affine, dtype_or_f32(dtype));
          }),
          py::arg("dim"), py::arg("eps") = 1e-6, py::arg("affine") = true,
          py::arg("dtype") = py::none());
  tensor_property(rms, "weight", &nn::RMSNorm::weight, "[dim] or None");
  rms.def_readwrite("dim", &nn::RMSNorm::dim).def_readwrite("eps", &nn::RMSNorm::eps);
  rms.def(
      "__call__", [](const nn::RMSNorm& l, py::handle x) { return l(to_tensor(x), Loc{}); },
      py::arg("x"));
  rms.def("__repr__", [](const nn::RMSNorm& l) {
    return "RMSNorm(dim=" + std::to_string(l.dim) + ", eps=" + number_text(l.eps) + ")";
  });
}

void bind_attention(py::module_& nn) {
  auto mha = layer_class<nn::MultiheadAttention>(
      nn, "MultiheadAttention",
      "torch.nn.MultiheadAttention with its parameter names and layouts. Call: (output, weights "
      "or None).");
  mha.def(py::init([](int64_t embed_dim, int64_t num_heads, py::handle key, bool bias,
                      std::optional<int64_t> kdim, std::optional<int64_t> vdim, bool batch_first,
                      double dropout, py::handle dtype) {
            nn::MultiheadAttentionOptions o;
            o.bias = bias;
            o.kdim = kdim;
            o.vdim = vdim;
            o.batch_first = batch_first;
            o.dropout = dropout;
            o.dtype = dtype_or_f32(dtype);
            return nn::MultiheadAttention(embed_dim, num_heads, to_tensor(key), o);
          }),
          py::arg("embed_dim"), py::arg("num_heads"), py::arg("key"), py::arg("bias") = true,
          py::arg("kdim") = py::none(), py::arg("vdim") = py::none(),
          py::arg("batch_first") = false, py::arg("dropout") = 0.0, py::arg("dtype") = py::none());
  tensor_property(mha, "in_proj_weight", &nn::MultiheadAttention::in_proj_weight, "[3E, E]");
  tensor_property(mha, "q_proj_weight", &nn::MultiheadAttention::q_proj_weight, "[E, E]");
  tensor_property(mha, "k_proj_weight", &nn::MultiheadAttention::k_proj_weight, "[E, kdim]");
  tensor_property(mha, "v_proj_weight", &nn::MultiheadAttention::v_proj_weight, "[E, vdim]");
  tensor_property(mha, "in_proj_bias", &nn::MultiheadAttention::in_proj_bias, "[3E]");
  mha.def_readwrite("out_proj", &nn::MultiheadAttention::out_proj)
      .def_readwrite("num_heads", &nn::MultiheadAttention::num_heads)
      .def_readwrite("batch_first", &nn::MultiheadAttention::batch_first)
      .def_readwrite("dropout", &nn::MultiheadAttention::dropout);
  mha.def(
      "__call__",
      [](const nn::MultiheadAttention& l, py::handle query, py::handle key, py::handle value,
         py::handle key_padding_mask, bool need_weights, py::handle attn_mask,
         bool average_attn_weights, bool is_causal, nn::Context* ctx) {
        nn::MultiheadAttentionCall c;
        c.key_padding_mask = optional_tensor(key_padding_mask);
        c.need_weights = need_weights;
        c.attn_mask = optional_tensor(attn_mask);
        c.average_attn_weights = average_attn_weights;
        c.is_causal = is_causal;
        const Tensor q = to_tensor(query), k = to_tensor(key), v = to_tensor(value);
        nn::MultiheadAttentionResult r = ctx ? l(q, k, v, *ctx, c, Loc{}) : l(q, k, v, c, Loc{});
        return py::make_tuple(r.output, tensor_or_none(r.weights));
      },
      py::arg("query"), py::arg("key"), py::arg("value"), py::kw_only(),
      py::arg("key_padding_mask") = py::none(), py::arg("need_weights") = true,
      py::arg("attn_mask") = py::none(), py::arg("average_attn_weights") = true,
      py::arg("is_causal") = false, py::arg("ctx") = py::none(),
      "(output, weights): a bool attn_mask is true where attending is NOT allowed, as PyTorch's "
      "MultiheadAttention; ctx (a training Context) enables dropout.");
  mha.def("__repr__", [](const nn::MultiheadAttention& l) {
    return "MultiheadAttention(embed_dim=" + std::to_string(l.out_proj.weight.shape()[0]) +
           ", num_heads=" + std::to_string(l.num_heads) +
           ", batch_first=" + (l.batch_first ? "True" : "False") + ")";
  });
}

// Appends the names of def's leaves under `prefix`: as kiln::tree_names, and a bound C++ tree's
// node (whose one child, its own TreeDef, is named "") adds no step either.
void collect_names(const TreeDef& def, const std::string& prefix, std::vector<std::string>& out) {
  switch (def.kind) {
    case TreeDef::Kind::leaf:
      out.push_back(prefix);
      return;
    case TreeDef::Kind::static_leaf:
      return;
    default:
      break;
  }
  const bool named = def.kind == TreeDef::Kind::map || def.kind == TreeDef::Kind::structure;
  for (std::size_t i = 0; i < def.children.size(); ++i) {
    // std::optional adds no step, as in tree_names.
    std::string step = named                                 ? def.names[i]
                       : def.kind == TreeDef::Kind::optional ? std::string()
                                                             : std::to_string(i);
    if (!step.empty() && step[0] == '\x01') step.erase(0, 1);  // a non-str dict key's index
    collect_names(def.children[i],
                  step.empty()     ? prefix
                  : prefix.empty() ? step
                                   : prefix + "." + step,
                  out);
  }
}

}  // namespace

std::vector<std::string> leaf_names(const TreeDef& def) {
  std::vector<std::string> out;
  collect_names(def, "", out);
  return out;
}

void bind_nn(py::module_& m) {
  py::module_ nn = m.def_submodule("_nn", "Kiln's neural-network layers, functions and losses.");
  nn.attr("__name__") = "kiln.nn";  // where its classes say they live
  bind_activations(nn);
  bind_losses(nn);
  bind_attention_functions(nn);
  bind_parallel_layers(nn);
  bind_init(nn);
  bind_context(nn);
  bind_simple_layers(nn);
  bind_nn_conv(nn);
  bind_norms(nn);
  bind_attention(nn);
  bind_nn_recurrent(nn);
  bind_nn_transformer(nn);
  nn.def(
      "_leaf_names",
      [](py::handle tree) {
        std::vector<py::object> leaves;
        return leaf_names(pytree::flatten(tree, leaves));
      },
      py::arg("tree"),
      "The names of the leaves of a pytree, in kiln.tree.flatten's order: kiln::tree_names "
      "(\"layers.0.weight\"), which checkpoints and optimiser messages use (internal).");
}

}  // namespace kiln::python
