// Neural-network layers, activations, losses and initialisers (namespace kiln::nn).
//
// A layer is a plain struct of parameters registered with KILN_TREE and a call operator, so
// a model is a tree: grad of a loss over a model returns a model-shaped tree of gradients,
// jit and vmap take models as arguments, and parameter names come from the tree paths
// ("features.0.weight"). Static settings (stride, rate, ...) are static leaves of the tree,
// so they survive tree_unflatten and jit specialises on them. See docs/NN.md.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/ops.h"
#include "kiln/random.h"
#include "kiln/tensor.h"
#include "kiln/tree.h"

namespace kiln {
// A convolution layer's padding is part of its tree, as static leaves.
KILN_TREE(ConvPadding<1>, sizes, rule);
KILN_TREE(ConvPadding<2>, sizes, rule);
KILN_TREE(ConvPadding<3>, sizes, rule);
}  // namespace kiln

namespace kiln::nn {

// ---- activations ----------------------------------------------------------------------

// max(x, 0); NaN stays NaN (with derivative 1, as PyTorch), the derivative at 0 is 0.
Tensor relu(const Tensor& x, Loc loc = Loc::current());
// Exact GELU, x * Phi(x); `tanh_approximation` uses the tanh formula (PyTorch approximate='tanh').
Tensor gelu(const Tensor& x, bool tanh_approximation = false, Loc loc = Loc::current());
Tensor silu(const Tensor& x, Loc loc = Loc::current());  // x * sigmoid(x)
// log(1 + e^x) and log(sigmoid(x)) = -softplus(-x): exact to rounding for every x (no
// overflow, no cancellation), with derivatives of every order right everywhere, 0 included.
Tensor softplus(const Tensor& x, Loc loc = Loc::current());
Tensor log_sigmoid(const Tensor& x, Loc loc = Loc::current());
using kiln::log_softmax;
using kiln::softmax;

// ---- losses ----------------------------------------------------------------------------

// How a loss reduces its per-element values: none (the values), their sum, their mean, or
// (kl_div only) the sum divided by the batch size, input.shape[0].
enum class Reduction { none, sum, mean, batchmean };

// logits [..., C] and either integer labels [...] in [0, C) or probabilities [..., C] (a
// floating target of the logits' shape: PyTorch's soft targets). With label smoothing e the
// target is (1 - e) on the label (or times the probabilities) plus e / C on every class, as in
// PyTorch. `weight` [C] scales each class's term; with labels the mean then divides by the
// sum of the labels' weights (PyTorch's rule), with probabilities by the number of positions.
// Positions whose label is `ignore_index` (PyTorch's default -100; nullopt: none) are 0 with
// Reduction::none, add nothing and are not counted in the mean; any other label outside
// [0, C) is an Error, also when the labels are traced (then when the traced function runs).
// See docs/NN.md.
Tensor cross_entropy(const Tensor& logits, const Tensor& labels, double label_smoothing = 0.0,
                     std::optional<int64_t> ignore_index = -100,
                     Reduction reduction = Reduction::mean,
                     const std::optional<Tensor>& weight = std::nullopt, Loc loc = Loc::current());
Tensor mse(const Tensor& prediction, const Tensor& target, Reduction reduction = Reduction::mean,
           Loc loc = Loc::current());
// |prediction - target| per element.
Tensor l1_loss(const Tensor& prediction, const Tensor& target,
               Reduction reduction = Reduction::mean, Loc loc = Loc::current());
// Per element with d = prediction - target: d^2 / (2 beta) where |d| < beta, else
// |d| - beta / 2 (beta = 0: |d|). beta >= 0.
Tensor smooth_l1_loss(const Tensor& prediction, const Tensor& target, double beta = 1.0,
                      Reduction reduction = Reduction::mean, Loc loc = Loc::current());
// targets in [0, 1], same shape as the logits: pos_weight t softplus(-x) + (1 - t) softplus(x),
// with no overflow or cancellation for large |logits| and the right curvature at 0. pos_weight
// (the positive class's weight, per class) and weight (per element) broadcast to the logits.
Tensor binary_cross_entropy_with_logits(const Tensor& logits, const Tensor& targets,
                                        Reduction reduction = Reduction::mean,
                                        const std::optional<Tensor>& pos_weight = std::nullopt,
                                        const std::optional<Tensor>& weight = std::nullopt,
                                        Loc loc = Loc::current());
// probabilities p and targets t in [0, 1] of one shape: -(t log p + (1 - t) log(1 - p)) with
// each log clamped at -100, as PyTorch (so p = 0 or 1 gives 100, not inf); weight broadcasts.
Tensor binary_cross_entropy(const Tensor& probabilities, const Tensor& targets,
                            Reduction reduction = Reduction::mean,
                            const std::optional<Tensor>& weight = std::nullopt,
                            Loc loc = Loc::current());
// Fraction of rows whose largest logit is at the label; positions whose label is
// `ignore_index` are not counted, as in cross_entropy.
Tensor accuracy(const Tensor& logits, const Tensor& labels,
                std::optional<int64_t> ignore_index = -100, Loc loc = Loc::current());

// ---- initialisers (PyTorch's conventions: weight [out, in, ...], fans from the shape) ----

namespace init {
struct Fans {
  double in, out;
};
Fans fans(const Shape& shape);  // fan_in = shape[1] * receptive field, fan_out = shape[0] * ...
// gain for relu (sqrt 2); `negative_slope` for leaky relu: sqrt(2 / (1 + slope^2)).
Tensor kaiming_uniform(const Tensor& key, const Shape& shape, double negative_slope = 0.0,
                       DType dtype = float32);
Tensor kaiming_normal(const Tensor& key, const Shape& shape, double negative_slope = 0.0,
                      DType dtype = float32);
Tensor xavier_uniform(const Tensor& key, const Shape& shape, double gain = 1.0,
                      DType dtype = float32);
Tensor xavier_normal(const Tensor& key, const Shape& shape, double gain = 1.0,
                     DType dtype = float32);
// uniform(-1/sqrt(fan_in), 1/sqrt(fan_in)): PyTorch's default for Linear and Conv2d
// weights and biases (kaiming_uniform with a = sqrt(5) reduces to it).
Tensor lecun_uniform(const Tensor& key, const Shape& shape, double fan_in, DType dtype = float32);
}  // namespace init

// ---- call context: training mode and the key that Dropout draws from ---------------------

class Context {
 public:
  static Context eval() { return Context(false, std::nullopt); }
  static Context train(Tensor key) { return Context(true, std::move(key)); }
  bool training() const { return training_; }
  // A fresh key for one random layer (the context's key is split each time).
  Tensor next_key(std::string_view who);

 private:
  Context(bool training, std::optional<Tensor> key) : training_(training), key_(std::move(key)) {}
  bool training_;
  std::optional<Tensor> key_;
};

namespace detail {
// `v` on each of an N-d convolution's spatial axes.
template <int N>
constexpr ConvSizes<N> conv_sizes(int64_t v) {
  if constexpr (N == 1)
    return v;
  else if constexpr (N == 2)
    return {v, v};
  else
    return {v, v, v};
}
// model summaries: a layer reports its type, output and parameters while one is recorded.
bool summary_recording();
void summary_note(std::string_view type, const Tensor& output,
                  std::initializer_list<const Tensor*> params);
template <class L>
concept context_layer = requires(const L& l, const Tensor& x, Context& c) {
  { l(x, c) } -> std::convertible_to<Tensor>;
};
}  // namespace detail

// ---- layers -----------------------------------------------------------------------------

// y = x W^T + b, weight [out, in] (PyTorch's layout, so checkpoints interoperate).
struct Linear {
  Tensor weight;
  std::optional<Tensor> bias;
  Linear() = default;
  Linear(int64_t in, int64_t out, const Tensor& key, bool with_bias = true, DType dtype = float32);
  Tensor operator()(const Tensor& x, Loc loc = Loc::current()) const;
};
KILN_TREE(Linear, weight, bias);

// PyTorch's padding_mode of the convolution layers: what the padding holds (zeros, the mirror
// image without the edge, the edge repeated, or the other side's values).
enum class PaddingMode { zeros, reflect, replicate, circular };

// The convolution layers, PyTorch's nn.Conv1d/2d/3d: weight [out, in / groups, *kernel],
// optional bias [out], input [N, in, *spatial] or unbatched [in, *spatial]. Both initialised
// U(±1/√fan_in), PyTorch's default.
template <int N>
struct ConvNd {
  Tensor weight;
  std::optional<Tensor> bias;
  ConvSizes<N> stride = detail::conv_sizes<N>(1);
  ConvPadding<N> padding;
  ConvSizes<N> dilation = detail::conv_sizes<N>(1);
  int64_t groups = 1;
  PaddingMode padding_mode = PaddingMode::zeros;
  struct Options {
    ConvSizes<N> stride = detail::conv_sizes<N>(1);
    ConvPadding<N> padding;  // PaddingRule::same needs stride 1
    ConvSizes<N> dilation = detail::conv_sizes<N>(1);
    int64_t groups = 1;
    bool bias = true;
    PaddingMode padding_mode = PaddingMode::zeros;
    DType dtype = float32;
  };
  ConvNd() = default;
  ConvNd(int64_t in, int64_t out, ConvSizes<N> kernel, const Tensor& key, const Options& options);
  ConvNd(int64_t in, int64_t out, ConvSizes<N> kernel, const Tensor& key)
      : ConvNd(in, out, kernel, key, Options{}) {}
  Tensor operator()(const Tensor& x, Loc loc = Loc::current()) const;
};
using Conv1d = ConvNd<1>;
using Conv2d = ConvNd<2>;
using Conv3d = ConvNd<3>;
KILN_TREE(Conv1d, weight, bias, stride, padding, dilation, groups, padding_mode);
KILN_TREE(Conv2d, weight, bias, stride, padding, dilation, groups, padding_mode);
KILN_TREE(Conv3d, weight, bias, stride, padding, dilation, groups, padding_mode);

// The transposed convolution layers, PyTorch's nn.ConvTranspose1d/2d/3d: weight
// [in, out / groups, *kernel], optional bias [out], input [N, in, *spatial] or unbatched;
// output size as conv_transposeNd's. Initialised as PyTorch: U(±1/√fan_in) with fan_in from
// the weight's shape, (out / groups)·prod(kernel).
template <int N>
struct ConvTransposeNd {
  Tensor weight;
  std::optional<Tensor> bias;
  ConvSizes<N> stride = detail::conv_sizes<N>(1);
  ConvSizes<N> padding{}, output_padding{};
  ConvSizes<N> dilation = detail::conv_sizes<N>(1);
  int64_t groups = 1;
  struct Options {
    ConvSizes<N> stride = detail::conv_sizes<N>(1);
    ConvSizes<N> padding{}, output_padding{};
    ConvSizes<N> dilation = detail::conv_sizes<N>(1);
    int64_t groups = 1;
    bool bias = true;
    DType dtype = float32;
  };
  ConvTransposeNd() = default;
  ConvTransposeNd(int64_t in, int64_t out, ConvSizes<N> kernel, const Tensor& key,
                  const Options& options);
  ConvTransposeNd(int64_t in, int64_t out, ConvSizes<N> kernel, const Tensor& key)
      : ConvTransposeNd(in, out, kernel, key, Options{}) {}
  Tensor operator()(const Tensor& x, Loc loc = Loc::current()) const;
};
using ConvTranspose1d = ConvTransposeNd<1>;
using ConvTranspose2d = ConvTransposeNd<2>;
using ConvTranspose3d = ConvTransposeNd<3>;
KILN_TREE(ConvTranspose1d, weight, bias, stride, padding, output_padding, dilation, groups);
KILN_TREE(ConvTranspose2d, weight, bias, stride, padding, output_padding, dilation, groups);
KILN_TREE(ConvTranspose3d, weight, bias, stride, padding, output_padding, dilation, groups);

struct MaxPool2d {
  std::pair<int64_t, int64_t> kernel{2, 2}, stride{2, 2}, padding{0, 0};
  Tensor operator()(const Tensor& x, Loc loc = Loc::current()) const;
};
KILN_TREE(MaxPool2d, kernel, stride, padding);

struct AvgPool2d {
  std::pair<int64_t, int64_t> kernel{2, 2}, stride{2, 2}, padding{0, 0};
  Tensor operator()(const Tensor& x, Loc loc = Loc::current()) const;
};
KILN_TREE(AvgPool2d, kernel, stride, padding);

// Keeps axes before start_dim and flattens the rest: [N, C, H, W] -> [N, C*H*W].
struct Flatten {
  int64_t start_dim = 1;
  Tensor operator()(const Tensor& x, Loc loc = Loc::current()) const;
};
KILN_TREE(Flatten, start_dim);

// Activations as layers, for Sequential. `kind` is a static leaf naming the function.
struct Activation {
  // relu, gelu, gelu_tanh, silu, tanh, sigmoid, mish, relu6, hardtanh, hardswish,
  // hardsigmoid, selu, celu (each with its default parameters)
  std::string kind = "relu";
  Tensor operator()(const Tensor& x, Loc loc = Loc::current()) const;
};
KILN_TREE(Activation, kind);
inline Activation ReLU() { return {"relu"}; }
inline Activation GELU(bool tanh_approximation = false) {
  return {tanh_approximation ? "gelu_tanh" : "gelu"};
}
inline Activation SiLU() { return {"silu"}; }
inline Activation Tanh() { return {"tanh"}; }
inline Activation Mish() { return {"mish"}; }
inline Activation ReLU6() { return {"relu6"}; }
inline Activation Hardswish() { return {"hardswish"}; }
inline Activation Hardsigmoid() { return {"hardsigmoid"}; }
inline Activation SELU() { return {"selu"}; }

// Zeroes each element with probability `rate` in training and scales the rest by
// 1 / (1 - rate); the identity in evaluation. The key comes from the Context.
struct Dropout {
  double rate = 0.5;
  Tensor operator()(const Tensor& x, Context& ctx, Loc loc = Loc::current()) const;
  Tensor operator()(const Tensor& x, Loc loc = Loc::current()) const;  // evaluation
};
KILN_TREE(Dropout, rate);

struct Embedding {
  Tensor weight;  // [num, dim], initialised N(0, 1) as in PyTorch
  Embedding() = default;
  Embedding(int64_t num, int64_t dim, const Tensor& key, DType dtype = float32);
  Tensor operator()(const Tensor& indices, Loc loc = Loc::current()) const;
};
KILN_TREE(Embedding, weight);

// Normalises over the trailing normalized_shape axes (biased variance, eps inside the square
// root), then scales and shifts. Without elementwise_affine the weight (1) and bias (0) are
// absent: no parameters, no names.
struct LayerNorm {
  std::optional<Tensor> weight, bias;  // normalized_shape
  std::vector<int64_t> normalized_shape;
  double eps = 1e-5;
  LayerNorm() = default;
  explicit LayerNorm(const Shape& normalized_shape, double eps = 1e-5, DType dtype = float32,
                     bool elementwise_affine = true);
  Tensor operator()(const Tensor& x, Loc loc = Loc::current()) const;
};
KILN_TREE(LayerNorm, weight, bias, normalized_shape, eps);

// Running statistics are state, not parameters: they go in and come out, so grad never
// sees them and the optimiser never decays them. Normalises over every axis but 1.
struct BatchNormState {
  Tensor mean, var;
};
KILN_TREE(BatchNormState, mean, var);
// Without `affine` the weight (1) and bias (0) are absent: no parameters, no names.
struct BatchNorm {
  std::optional<Tensor> weight, bias;  // [C]
  int64_t channels = 0;
  double momentum = 0.1, eps = 1e-5;
  DType dtype = float32;  // of the parameters and of initial_state()
  BatchNorm() = default;
  explicit BatchNorm(int64_t channels, double momentum = 0.1, double eps = 1e-5,
                     DType dtype = float32, bool affine = true);
  BatchNormState initial_state() const;  // mean 0, var 1
  // Training: batch statistics; the running ones move by `momentum` (unbiased variance, as
  // PyTorch). Evaluation: the running statistics, returned unchanged.
  std::pair<Tensor, BatchNormState> operator()(const Tensor& x, const BatchNormState& state,
                                               bool training, Loc loc = Loc::current()) const;
};
KILN_TREE(BatchNorm, weight, bias, channels, momentum, eps, dtype);

// The normalisations as functions (docs/NN.md, "Normalisation functions"). weight and bias are
// optional (nullopt: none).
// layer_norm: over the trailing axes, which must be normalized_shape; weight and bias
// normalized_shape.
Tensor layer_norm(const Tensor& x, const Shape& normalized_shape,
                  const std::optional<Tensor>& weight = std::nullopt,
                  const std::optional<Tensor>& bias = std::nullopt, double eps = 1e-5,
                  Loc loc = Loc::current());
// batch_norm: x [N, C, ...], weight and bias [C]. The running statistics are explicit state, as
// BatchNorm's: training normalises with the batch's and returns `running` moved by momentum
// (nullopt in, nullopt out); evaluation normalises with `running`, which it needs, and returns it.
struct BatchNormResult {
  Tensor y;
  std::optional<BatchNormState> state;
};
BatchNormResult batch_norm(const Tensor& x, const std::optional<BatchNormState>& running,
                           const std::optional<Tensor>& weight, const std::optional<Tensor>& bias,
                           bool training, double momentum = 0.1, double eps = 1e-5,
                           Loc loc = Loc::current());
// instance_norm: x [N, C, ...] (rank >= 3) normalised per sample and channel over the positions
// (group_norm with one channel per group); weight and bias [C]. No running statistics.
Tensor instance_norm(const Tensor& x, const std::optional<Tensor>& weight = std::nullopt,
                     const std::optional<Tensor>& bias = std::nullopt, double eps = 1e-5,
                     Loc loc = Loc::current());

// Layers applied in order. Any type with `Tensor operator()(const Tensor&) const` (or one
// taking a Context& as well) that is a tree can be a layer, user-defined ones included.
// Parameter names are the layer index then the layer's own: "0.weight", "3.bias".
template <class... Layers>
struct Sequential {
  std::tuple<Layers...> layers;
  Sequential() = default;
  explicit Sequential(Layers... ls) requires(sizeof...(Layers) > 0) : layers(std::move(ls)...) {}

  Tensor operator()(const Tensor& x) const {
    return std::apply([&](const auto&... l) { return chain(x, nullptr, l...); }, layers);
  }
  Tensor operator()(const Tensor& x, Context& ctx) const {
    return std::apply([&](const auto&... l) { return chain(x, &ctx, l...); }, layers);
  }
  template <std::size_t I>
  const auto& get() const {
    return std::get<I>(layers);
  }

 private:
  static Tensor chain(const Tensor& x, Context*) { return x; }
  template <class L, class... Rest>
  static Tensor chain(const Tensor& x, Context* ctx, const L& l, const Rest&... rest) {
    Tensor y;
    if constexpr (detail::context_layer<L>) {
      if (ctx != nullptr)
        y = l(x, *ctx);
      else
        y = l(x);
    } else {
      y = l(x);
    }
    return chain(y, ctx, rest...);
  }
};
template <class... Layers>
Sequential(Layers...) -> Sequential<Layers...>;

// ---- parameters and summaries -----------------------------------------------------------

// Every Tensor leaf with its name, in tree order.
template <Tree T>
std::vector<std::pair<std::string, Tensor>> named_parameters(const T& model) {
  auto [leaves, def] = tree_flatten(model);
  const std::vector<std::string> names = tree_names(def);
  std::vector<std::pair<std::string, Tensor>> out;
  for (std::size_t i = 0; i < leaves.size(); ++i)
    if (leaves[i].defined()) out.emplace_back(names[i], leaves[i]);
  return out;
}
template <Tree T>
int64_t parameter_count(const T& model) {
  int64_t n = 0;
  for (const auto& [name, t] : named_parameters(model)) n += t.numel();
  return n;
}

namespace detail {
struct SummaryRow {
  std::string type;
  Shape output;
  std::vector<const TensorImpl*> params;
};
struct SummaryRecorder {
  std::vector<SummaryRow> rows;
  SummaryRecorder();
  ~SummaryRecorder();
  SummaryRecorder(const SummaryRecorder&) = delete;
  SummaryRecorder& operator=(const SummaryRecorder&) = delete;
};
std::string format_summary(const std::vector<SummaryRow>& rows,
                           const std::vector<std::pair<std::string, Tensor>>& named,
                           const Shape& input, const Shape& output);
}  // namespace detail

// A table of the layers in call order (name from the parameter paths, type, output shape,
// parameter count) and the totals, from one evaluation-mode call on `example`.
template <Tree M>
std::string summary(const M& model, const Tensor& example) {
  detail::SummaryRecorder recorder;
  const Tensor y = model(example);
  return detail::format_summary(recorder.rows, named_parameters(model), example.shape(), y.shape());
}

// ---- more activations, normalisations and losses (docs/NN.md, "nn layers and
// functions"; src/nn/activations.cpp, norms.cpp, losses.cpp) ---------------------------------

// PyTorch's activations with their parameters. elu: x for x > 0, alpha (e^x - 1) otherwise
// (through expm1). leaky_relu: x for x > 0, negative_slope x otherwise. Both take the
// negative branch's derivative at 0, as PyTorch. Floating-point inputs.
Tensor elu(const Tensor& x, double alpha = 1.0, Loc loc = Loc::current());
Tensor leaky_relu(const Tensor& x, double negative_slope = 0.01, Loc loc = Loc::current());
// PyTorch's softplus(x, beta, threshold): log(1 + e^(beta x)) / beta, and x itself where
// beta x > threshold. beta > 0. softplus(x) above is the exact one (no threshold).
Tensor softplus(const Tensor& x, double beta, double threshold = 20.0, Loc loc = Loc::current());

// PyTorch's remaining activations (docs/NN.md, "Activations"). hardtanh clamps to
// [min_val, max_val] (relu6: [0, 6]) with derivative 0 at and beyond the ends; hardswish is
// x relu6(x + 3) / 6 and hardsigmoid relu6(x + 3) / 6, with PyTorch's derivatives at +-3; selu
// is scale elu(x, alpha) with the self-normalising constants; celu(x, alpha) is
// alpha elu(x / alpha) (alpha != 0); mish is x tanh(softplus(x)). Floating-point inputs.
Tensor mish(const Tensor& x, Loc loc = Loc::current());
Tensor hardtanh(const Tensor& x, double min_val = -1.0, double max_val = 1.0,
                Loc loc = Loc::current());
Tensor relu6(const Tensor& x, Loc loc = Loc::current());
Tensor hardswish(const Tensor& x, Loc loc = Loc::current());
Tensor hardsigmoid(const Tensor& x, Loc loc = Loc::current());
Tensor selu(const Tensor& x, Loc loc = Loc::current());
Tensor celu(const Tensor& x, double alpha = 1.0, Loc loc = Loc::current());
// a * sigmoid(b) for the two halves a, b of x along `axis` (its size must be even).
Tensor glu(const Tensor& x, int64_t axis = -1, Loc loc = Loc::current());
// x for x > 0, weight x otherwise; weight has one element or one per channel (axis 1 of x,
// or axis 0 of a 1-d x, which PyTorch 1.13's prelu takes as a single channel).
Tensor prelu(const Tensor& x, const Tensor& weight, Loc loc = Loc::current());
// softmax(-x) along `axis`.
Tensor softmin(const Tensor& x, int64_t axis = -1, Loc loc = Loc::current());
// x / max(||x||_p, eps) along `axis` (PyTorch's F.normalize, whose default axis is 1); p > 0,
// or infinity for the largest magnitude.
Tensor normalize(const Tensor& x, double p = 2.0, int64_t axis = 1, double eps = 1e-12,
                 Loc loc = Loc::current());
// Dropout as a function: zeroes each element with probability `rate` (in [0, 1)) drawn from
// `key`, and scales the rest by 1 / (1 - rate). The Dropout layer calls it in training.
Tensor dropout(const Tensor& x, double rate, const Tensor& key, Loc loc = Loc::current());

// Layers of the activations above (GELU and SiLU: Activation, above). Parameters are static
// leaves: nn::ELU{}, nn::LeakyReLU{0.2}, nn::Softplus{.beta = 2}.
struct ELU {
  double alpha = 1.0;
  Tensor operator()(const Tensor& x, Loc loc = Loc::current()) const;
};
KILN_TREE(ELU, alpha);
struct LeakyReLU {
  double negative_slope = 0.01;
  Tensor operator()(const Tensor& x, Loc loc = Loc::current()) const;
};
KILN_TREE(LeakyReLU, negative_slope);
struct Softplus {
  double beta = 1.0, threshold = 20.0;
  Tensor operator()(const Tensor& x, Loc loc = Loc::current()) const;
};
KILN_TREE(Softplus, beta, threshold);
struct Hardtanh {
  double min_val = -1.0, max_val = 1.0;
  Tensor operator()(const Tensor& x, Loc loc = Loc::current()) const;
};
KILN_TREE(Hardtanh, min_val, max_val);
struct CELU {
  double alpha = 1.0;
  Tensor operator()(const Tensor& x, Loc loc = Loc::current()) const;
};
KILN_TREE(CELU, alpha);
struct GLU {
  int64_t axis = -1;
  Tensor operator()(const Tensor& x, Loc loc = Loc::current()) const;
};
KILN_TREE(GLU, axis);
// A learned slope for x <= 0: weight [num_parameters], initialised to `init` (PyTorch's 0.25).
struct PReLU {
  Tensor weight;
  PReLU() = default;
  explicit PReLU(int64_t num_parameters, double init = 0.25, DType dtype = float32);
  Tensor operator()(const Tensor& x, Loc loc = Loc::current()) const;
};
KILN_TREE(PReLU, weight);

// x [N, C, ...] normalised over each group of C / num_groups channels and every position
// (biased variance, eps inside the square root), then weight[c] * . + bias[c] when given, as
// PyTorch's group_norm.
Tensor group_norm(const Tensor& x, int64_t num_groups, const std::optional<Tensor>& weight,
                  const std::optional<Tensor>& bias, double eps = 1e-5, Loc loc = Loc::current());
// x / sqrt(mean(x^2 over the last axis) + eps) * weight (when given, shape [x's last dim]).
Tensor rms_norm(const Tensor& x, const std::optional<Tensor>& weight, double eps = 1e-6,
                Loc loc = Loc::current());

// Without `affine` the weight (1) and bias (0) are absent: no parameters, no names.
struct GroupNorm {
  std::optional<Tensor> weight, bias;  // [channels]
  int64_t num_groups = 1, channels = 0;
  double eps = 1e-5;
  GroupNorm() = default;
  GroupNorm(int64_t num_groups, int64_t channels, double eps = 1e-5, bool affine = true,
            DType dtype = float32);
  Tensor operator()(const Tensor& x, Loc loc = Loc::current()) const;
};
KILN_TREE(GroupNorm, weight, bias, num_groups, channels, eps);
struct RMSNorm {
  std::optional<Tensor> weight;  // [dim], initialised to 1
  int64_t dim = 0;
  double eps = 1e-6;
  RMSNorm() = default;
  explicit RMSNorm(int64_t dim, double eps = 1e-6, bool affine = true, DType dtype = float32);
  Tensor operator()(const Tensor& x, Loc loc = Loc::current()) const;
};
KILN_TREE(RMSNorm, weight, dim, eps);

// Per element with d = prediction - target: d^2 / 2 where |d| < delta, else
// delta (|d| - delta / 2). delta > 0; equal shapes.
Tensor huber_loss(const Tensor& prediction, const Tensor& target, double delta = 1.0,
                  Reduction reduction = Reduction::mean, Loc loc = Loc::current());
// KL(target || exp(input)) with `input` log-probabilities: per element
// target (log target - input), 0 where target = 0 (xlogy); with log_target the target is
// given as log-probabilities too. Reduction::mean is PyTorch's default (the mean over every
// element); batchmean is the true KL divergence averaged over the batch.
Tensor kl_div(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::mean,
              bool log_target = false, Loc loc = Loc::current());
// -log_probs[..., label] for log-probabilities [..., C] (classes last, as cross_entropy;
// PyTorch's are on axis 1) and integer labels [...]. Positions labelled ignore_index are 0
// (none), add nothing (sum) and are not counted (mean); other labels outside [0, C) raise.
// `weight` [C] scales each class's term, and the mean divides by the labels' weights' sum.
Tensor nll_loss(const Tensor& log_probs, const Tensor& labels,
                std::optional<int64_t> ignore_index = -100, Reduction reduction = Reduction::mean,
                const std::optional<Tensor>& weight = std::nullopt, Loc loc = Loc::current());
// ---- attention and recurrent layers (docs/NN.md "Attention and recurrent layers") ----------

// Masks and settings of scaled_dot_product_attention. Scores are q k^T * scale, [..., L, S].
struct AttentionOptions {
  // bool: true where a query may attend to a key (PyTorch's scaled_dot_product_attention);
  // floating: added to the scores. Broadcasts to the scores' shape [..., L, S].
  std::optional<Tensor> attn_mask;
  bool is_causal = false;  // query i attends to keys j <= i (top-left aligned, as PyTorch)
  // [..., S], aligned with the scores' batch axes (so [N, 1, S] for scores [N, H, L, S]):
  // bool true marks padding, which no query attends to (nn.MultiheadAttention's convention);
  // floating is added to the scores.
  std::optional<Tensor> key_padding_mask;
  std::optional<double> scale;  // default 1 / sqrt(E)
  // Dropout on the attention weights, rate in [0, 1), drawn from dropout_key.
  double dropout = 0.0;
  std::optional<Tensor> dropout_key;
};

// softmax(q k^T * scale + masks) over the keys: q [..., L, E], k [..., S, E] -> [..., L, S]
// (batch axes broadcast). A row whose keys are all masked out has weights 0, so its output is
// 0 and its gradients are 0: defined, never NaN (PyTorch 1.13-2.4's math path gives NaN;
// 2.5's gives 0 too).
Tensor attention_weights(const Tensor& q, const Tensor& k, const AttentionOptions& options = {},
                         Loc loc = Loc::current());
// attention_weights(q, k) v: v [..., S, Ev] -> [..., L, Ev]. PyTorch 2's
// F.scaled_dot_product_attention (math path), with key_padding_mask as well.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const AttentionOptions& options = {}, Loc loc = Loc::current());

// MultiheadAttention's settings, call options and result (MultiheadAttention::Options, ...; at
// namespace scope because a nested struct with member initialisers cannot be a default
// argument inside its enclosing class).
struct MultiheadAttentionOptions {
  bool bias = true;
  std::optional<int64_t> kdim, vdim;  // default embed_dim
  bool batch_first = false;
  double dropout = 0.0;
  DType dtype = float32;
};
struct MultiheadAttentionCall {
  // bool [N, S] (true: padding, ignored) or floating (added); [S] for unbatched inputs.
  std::optional<Tensor> key_padding_mask;
  bool need_weights = true;
  // [L, S] or [N * num_heads, L, S]: bool true where attending is NOT allowed (PyTorch's
  // convention here, the opposite of scaled_dot_product_attention's), or floating (added).
  std::optional<Tensor> attn_mask;
  bool average_attn_weights = true;
  bool is_causal = false;  // applies the causal mask itself (with or without attn_mask)
};
struct MultiheadAttentionResult {
  Tensor output;                  // like the query, embed_dim features
  std::optional<Tensor> weights;  // [N, L, S] averaged over heads, else [N, H, L, S]
};

// torch.nn.MultiheadAttention, with its parameter names and layouts, so state dicts copy over:
// in_proj_weight [3E, E] when kdim = vdim = E, else q/k/v_proj_weight [E, E], [E, kdim],
// [E, vdim]; in_proj_bias [3E]; out_proj (Linear E -> E). Inputs [L, N, E] ([N, L, E] with
// batch_first) or unbatched [L, E]; keys [S, N, kdim], values [S, N, vdim].
struct MultiheadAttention {
  std::optional<Tensor> in_proj_weight, q_proj_weight, k_proj_weight, v_proj_weight;
  std::optional<Tensor> in_proj_bias;
  Linear out_proj;
  int64_t num_heads = 1;
  bool batch_first = false;
  double dropout = 0.0;  // on the attention weights, in training

  using Options = MultiheadAttentionOptions;
  using CallOptions = MultiheadAttentionCall;
  using Result = MultiheadAttentionResult;

  MultiheadAttention() = default;
  MultiheadAttention(int64_t embed_dim, int64_t num_heads, const Tensor& key,
                     const Options& options);
  MultiheadAttention(int64_t embed_dim, int64_t num_heads, const Tensor& key)
      : MultiheadAttention(embed_dim, num_heads, key, Options{}) {}
  Result operator()(const Tensor& query, const Tensor& key, const Tensor& value,
                    const CallOptions& options = {}, Loc loc = Loc::current()) const;
  // Training: dropout on the attention weights, with a key from the context.
  Result operator()(const Tensor& query, const Tensor& key, const Tensor& value, Context& ctx,
                    const CallOptions& options = {}, Loc loc = Loc::current()) const;

 private:
  Result forward(const Tensor& query, const Tensor& key, const Tensor& value,
                 const CallOptions& options, Context* ctx, Loc loc) const;
};
KILN_TREE(MultiheadAttention, in_proj_weight, q_proj_weight, k_proj_weight, v_proj_weight,
          in_proj_bias, out_proj, num_heads, batch_first, dropout);

// Recurrent cells with PyTorch's gate layouts and equations, so weights copy over:
// weight_ih [G H, I], weight_hh [G H, H], bias_ih, bias_hh [G H], all initialised
// uniform(-1/sqrt(H), 1/sqrt(H)). Inputs [N, I] (or unbatched [I]), states [N, H] ([H]).
struct LSTMState {
  Tensor h, c;
};
KILN_TREE(LSTMState, h, c);

// Gates i, f, g, o (G = 4): c' = sigmoid(f) c + sigmoid(i) tanh(g), h' = sigmoid(o) tanh(c').
// With a projection (an LSTM's proj_size P; never made by this constructor) weight_hr [P, H]
// maps h' to h' W_hr^T, so h has P features and weight_hh is [4 H, P].
struct LSTMCell {
  Tensor weight_ih, weight_hh;
  std::optional<Tensor> bias_ih, bias_hh;
  std::optional<Tensor> weight_hr;
  LSTMCell() = default;
  LSTMCell(int64_t input_size, int64_t hidden_size, const Tensor& key, bool bias = true,
           DType dtype = float32);
  // No state: zeros.
  LSTMState operator()(const Tensor& x, const std::optional<LSTMState>& state = std::nullopt,
                       Loc loc = Loc::current()) const;
};
KILN_TREE(LSTMCell, weight_ih, weight_hh, bias_ih, bias_hh, weight_hr);

// Gates r, z, n (G = 3): r = sigmoid(W_ir x + b_ir + W_hr h + b_hr), z likewise,
// n = tanh(W_in x + b_in + r (W_hn h + b_hn)), h' = (1 - z) n + z h.
struct GRUCell {
  Tensor weight_ih, weight_hh;
  std::optional<Tensor> bias_ih, bias_hh;
  GRUCell() = default;
  GRUCell(int64_t input_size, int64_t hidden_size, const Tensor& key, bool bias = true,
          DType dtype = float32);
  Tensor operator()(const Tensor& x, const std::optional<Tensor>& h = std::nullopt,
                    Loc loc = Loc::current()) const;
};
KILN_TREE(GRUCell, weight_ih, weight_hh, bias_ih, bias_hh);

// Gate G = 1: h' = act(W_ih x + b_ih + W_hh h + b_hh), act "tanh" or "relu".
struct RNNCell {
  Tensor weight_ih, weight_hh;
  std::optional<Tensor> bias_ih, bias_hh;
  std::string nonlinearity = "tanh";
  RNNCell() = default;
  RNNCell(int64_t input_size, int64_t hidden_size, const Tensor& key, bool bias = true,
          std::string nonlinearity = "tanh", DType dtype = float32);
  Tensor operator()(const Tensor& x, const std::optional<Tensor>& h = std::nullopt,
                    Loc loc = Loc::current()) const;
};
KILN_TREE(RNNCell, weight_ih, weight_hh, bias_ih, bias_hh, nonlinearity);

struct RecurrentOptions {
  int64_t num_layers = 1;
  bool bias = true;
  bool batch_first = false;
  bool bidirectional = false;
  // Dropout on every layer's output but the last's, in training (a Context's key); [0, 1).
  double dropout = 0.0;
  int64_t proj_size = 0;              // LSTM only: h projected to proj_size features (0: none)
  std::string nonlinearity = "tanh";  // RNN only: "tanh" or "relu"
  DType dtype = float32;
};

// Multi-layer RNN / LSTM / GRU over a sequence, one kiln::scan per layer and direction (the
// input projection of every step is one matmul before the scan). Input [T, N, I] ([N, T, I]
// with batch_first) or unbatched [T, I]; output [T, N, D H] (D = 2 when bidirectional: forward
// then backward features; D P with an LSTM's proj_size P); states [num_layers * D, N, H] in
// PyTorch's order (layer 0 forward, layer 0 backward, layer 1 forward, ...). PyTorch's
// weight_ih_l{k}{_reverse} is cells[D k (+ 1)].weight_ih here, and so on. The calls with a
// Context apply `dropout` between layers when it is a training one.
struct LSTM {
  std::vector<LSTMCell> cells;  // layer-major, forward then backward
  int64_t num_layers = 1;
  bool batch_first = false, bidirectional = false;
  double dropout = 0.0;
  LSTM() = default;
  LSTM(int64_t input_size, int64_t hidden_size, const Tensor& key, const RecurrentOptions& options);
  LSTM(int64_t input_size, int64_t hidden_size, const Tensor& key)
      : LSTM(input_size, hidden_size, key, RecurrentOptions{}) {}
  // (output, final state); no initial state: zeros. h is [.., P] with a projection.
  std::pair<Tensor, LSTMState> operator()(const Tensor& x,
                                          const std::optional<LSTMState>& state = std::nullopt,
                                          Loc loc = Loc::current()) const;
  std::pair<Tensor, LSTMState> operator()(const Tensor& x, Context& ctx,
                                          const std::optional<LSTMState>& state = std::nullopt,
                                          Loc loc = Loc::current()) const;
};
KILN_TREE(LSTM, cells, num_layers, batch_first, bidirectional, dropout);

struct GRU {
  std::vector<GRUCell> cells;  // layer-major, forward then backward
  int64_t num_layers = 1;
  bool batch_first = false, bidirectional = false;
  double dropout = 0.0;
  GRU() = default;
  GRU(int64_t input_size, int64_t hidden_size, const Tensor& key, const RecurrentOptions& options);
  GRU(int64_t input_size, int64_t hidden_size, const Tensor& key)
      : GRU(input_size, hidden_size, key, RecurrentOptions{}) {}
  // (output, final h); no initial state: zeros.
  std::pair<Tensor, Tensor> operator()(const Tensor& x,
                                       const std::optional<Tensor>& h = std::nullopt,
                                       Loc loc = Loc::current()) const;
  std::pair<Tensor, Tensor> operator()(const Tensor& x, Context& ctx,
                                       const std::optional<Tensor>& h = std::nullopt,
                                       Loc loc = Loc::current()) const;
};
KILN_TREE(GRU, cells, num_layers, batch_first, bidirectional, dropout);

// Elman RNN; the nonlinearity is each cell's.
struct RNN {
  std::vector<RNNCell> cells;  // layer-major, forward then backward
  int64_t num_layers = 1;
  bool batch_first = false, bidirectional = false;
  double dropout = 0.0;
  RNN() = default;
  RNN(int64_t input_size, int64_t hidden_size, const Tensor& key, const RecurrentOptions& options);
  RNN(int64_t input_size, int64_t hidden_size, const Tensor& key)
      : RNN(input_size, hidden_size, key, RecurrentOptions{}) {}
  // (output, final h); no initial state: zeros.
  std::pair<Tensor, Tensor> operator()(const Tensor& x,
                                       const std::optional<Tensor>& h = std::nullopt,
                                       Loc loc = Loc::current()) const;
  std::pair<Tensor, Tensor> operator()(const Tensor& x, Context& ctx,
                                       const std::optional<Tensor>& h = std::nullopt,
                                       Loc loc = Loc::current()) const;
};
KILN_TREE(RNN, cells, num_layers, batch_first, bidirectional, dropout);

// ---- transformer layers (docs/NN.md "Transformer layers"; src/nn/transformer.cpp) ----------

// torch.nn.TransformerEncoderLayer / TransformerDecoderLayer's settings, with their defaults.
struct TransformerLayerOptions {
  int64_t dim_feedforward = 2048;
  double dropout = 0.1;
  std::string activation = "relu";  // "relu" or "gelu"
  double layer_norm_eps = 1e-5;
  bool batch_first = false;
  bool norm_first = false;
  DType dtype = float32;
};
// The masks of an encoder call, as MultiheadAttention's: src_mask [L, L] or [N H, L, L] (bool
// true: not allowed, or floating: added), src_key_padding_mask [N, L] (bool true: padding).
// is_causal applies the causal mask itself.
struct TransformerEncoderCall {
  std::optional<Tensor> src_mask, src_key_padding_mask;
  bool is_causal = false;
};
struct TransformerDecoderCall {
  std::optional<Tensor> tgt_mask, memory_mask;
  std::optional<Tensor> tgt_key_padding_mask, memory_key_padding_mask;
  bool tgt_is_causal = false, memory_is_causal = false;
};

// torch.nn.TransformerEncoderLayer with its parameter names (self_attn.in_proj_weight,
// linear1.weight, norm2.bias, ...), so state dicts copy over. Post-norm:
// x = norm1(x + sa(x)), x = norm2(x + ff(x)); norm_first: x = x + sa(norm1(x)),
// x = x + ff(norm2(x)); ff(x) = linear2(dropout(act(linear1(x)))). Dropout (training only)
// on the attention weights, after the activation and on each residual branch.
struct TransformerEncoderLayer {
  MultiheadAttention self_attn;
  Linear linear1, linear2;
  LayerNorm norm1, norm2;
  double dropout = 0.1;
  std::string activation = "relu";
  bool norm_first = false;
  using Options = TransformerLayerOptions;
  using CallOptions = TransformerEncoderCall;
  TransformerEncoderLayer() = default;
  TransformerEncoderLayer(int64_t d_model, int64_t nhead, const Tensor& key,
                          const Options& options);
  TransformerEncoderLayer(int64_t d_model, int64_t nhead, const Tensor& key)
      : TransformerEncoderLayer(d_model, nhead, key, Options{}) {}
  Tensor operator()(const Tensor& src, const CallOptions& options = {},
                    Loc loc = Loc::current()) const;
  Tensor operator()(const Tensor& src, Context& ctx, const CallOptions& options = {},
                    Loc loc = Loc::current()) const;

 private:
  Tensor forward(const Tensor& src, const CallOptions& options, Context* ctx, Loc loc) const;
};
KILN_TREE(TransformerEncoderLayer, self_attn, linear1, linear2, norm1, norm2, dropout, activation,
          norm_first);

// torch.nn.TransformerDecoderLayer: self-attention over tgt, attention to memory
// (multihead_attn), then the feed-forward block, each with its residual and norm1..3 as the
// encoder layer's.
struct TransformerDecoderLayer {
  MultiheadAttention self_attn, multihead_attn;
  Linear linear1, linear2;
  LayerNorm norm1, norm2, norm3;
  double dropout = 0.1;
  std::string activation = "relu";
  bool norm_first = false;
  using Options = TransformerLayerOptions;
  using CallOptions = TransformerDecoderCall;
  TransformerDecoderLayer() = default;
  TransformerDecoderLayer(int64_t d_model, int64_t nhead, const Tensor& key,
                          const Options& options);
  TransformerDecoderLayer(int64_t d_model, int64_t nhead, const Tensor& key)
      : TransformerDecoderLayer(d_model, nhead, key, Options{}) {}
  Tensor operator()(const Tensor& tgt, const Tensor& memory, const CallOptions& options = {},
                    Loc loc = Loc::current()) const;
  Tensor operator()(const Tensor& tgt, const Tensor& memory, Context& ctx,
                    const CallOptions& options = {}, Loc loc = Loc::current()) const;

 private:
  Tensor forward(const Tensor& tgt, const Tensor& memory, const CallOptions& options, Context* ctx,
                 Loc loc) const;
};
KILN_TREE(TransformerDecoderLayer, self_attn, multihead_attn, linear1, linear2, norm1, norm2, norm3,
          dropout, activation, norm_first);

// num_layers copies of one layer (as PyTorch's, which deep-copies it: equal initial weights)
// applied in turn, then the optional final norm. Names layers.0.self_attn..., norm.weight.
struct TransformerEncoder {
  std::vector<TransformerEncoderLayer> layers;
  std::optional<LayerNorm> norm;
  TransformerEncoder() = default;
  TransformerEncoder(const TransformerEncoderLayer& layer, int64_t num_layers,
                     std::optional<LayerNorm> norm = std::nullopt);
  Tensor operator()(const Tensor& src, const TransformerEncoderCall& options = {},
                    Loc loc = Loc::current()) const;
  Tensor operator()(const Tensor& src, Context& ctx, const TransformerEncoderCall& options = {},
                    Loc loc = Loc::current()) const;

 private:
  Tensor forward(const Tensor& src, const TransformerEncoderCall& options, Context* ctx,
                 Loc loc) const;
};
KILN_TREE(TransformerEncoder, layers, norm);

struct TransformerDecoder {
  std::vector<TransformerDecoderLayer> layers;
  std::optional<LayerNorm> norm;
  TransformerDecoder() = default;
  TransformerDecoder(const TransformerDecoderLayer& layer, int64_t num_layers,
                     std::optional<LayerNorm> norm = std::nullopt);
  Tensor operator()(const Tensor& tgt, const Tensor& memory,
                    const TransformerDecoderCall& options = {}, Loc loc = Loc::current()) const;
  Tensor operator()(const Tensor& tgt, const Tensor& memory, Context& ctx,
                    const TransformerDecoderCall& options = {}, Loc loc = Loc::current()) const;

 private:
  Tensor forward(const Tensor& tgt, const Tensor& memory, const TransformerDecoderCall& options,
                 Context* ctx, Loc loc) const;
};
KILN_TREE(TransformerDecoder, layers, norm);

// ---- tensor parallelism (Megatron-LM's layout), inside shard_map ---------------------------
//
// Each process of a mesh axis holds a block of a layer; differentiate the whole shard_map with
// grad (docs/DISTRIBUTED.md, "Tensor parallelism"). A column-parallel Linear is an ordinary
// Linear on a block of the weight's rows (of the output features) and of the bias: no
// communication, its output is this process's block of the features.

// A row-parallel Linear: `block` holds this process's columns of the weight, [out, in / M],
// and the whole bias; x is this process's block of the input features, [..., in / M] (a
// column-parallel layer's output). The psum over `axis` of x W_blockᵀ, plus the bias once.
Tensor row_parallel_linear(const Linear& block, const Tensor& x, const std::string& axis,
                           Loc loc = Loc::current());
// A vocabulary-parallel embedding: `block` holds rows [p·V/M, (p+1)·V/M) of the table for the
// process at position p of `axis`; ids are global token ids, the same on every process of the
// axis. Each process looks up the ids it holds, and a psum over `axis` adds the rows up.
Tensor parallel_embedding(const Embedding& block, const Tensor& ids, const std::string& axis,
                          Loc loc = Loc::current());
// Vocabulary-parallel cross-entropy: logits [N, C / M], this process's block of the classes
// (its block of a parallel embedding's table gives them), and labels [N], global class ids
// the same on every process of `axis`. The mean over the N rows of -log softmax at the label,
// computed without gathering the logits: the max, the sum of exponentials and the label's
// logit each combined over `axis` (pmax, psum, psum).
Tensor parallel_cross_entropy(const Tensor& logits, const Tensor& labels, const std::string& axis,
                              Loc loc = Loc::current());

}  // namespace kiln::nn

namespace kiln {
template <class... Layers>
struct TreeTraits<nn::Sequential<Layers...>> {
  using Tuple = std::tuple<Layers...>;
  static TreeDef flatten(const nn::Sequential<Layers...>& s, std::vector<Tensor>& leaves) {
    return TreeTraits<Tuple>::flatten(s.layers, leaves);
  }
  static nn::Sequential<Layers...> unflatten(const TreeDef& def, detail::TreeCursor& in,
                                             const detail::TreePathLink* at) {
    nn::Sequential<Layers...> s;
    s.layers = TreeTraits<Tuple>::unflatten(def, in, at);
    return s;
  }
};
}  // namespace kiln
