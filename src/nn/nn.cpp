// kiln::nn: layers, activations, losses, initialisers and model summaries.
#include "kiln/nn.h"

#include <cmath>
#include <iomanip>
#include <map>
#include <numbers>
#include <set>
#include <sstream>

#include "kiln/error.h"
#include "kiln/primitive.h"
#include "kiln/transforms.h"
#include "nn/checks.h"
#include "ops/primitives.h"

namespace kiln::nn {

// ---- activations ----------------------------------------------------------------------

// where, not maximum: the derivative at 0 is 0 (PyTorch's convention), where maximum splits it.
// The test is x <= 0, so that NaN (for which every comparison is false) takes the x branch:
// relu(NaN) = NaN with derivative 1, as PyTorch.
Tensor relu(const Tensor& x, Loc loc) { return where(x <= 0.0, scalar_like(x, 0.0), x, loc); }

// Traced (under grad, jit, vmap, ...), a checkpoint: reverse mode keeps only the input and
// recomputes the formula in the backward pass, where differentiating it as written kept its
// intermediates (the tanh form's forward loop wrote seven tensors of the input's size, each
// read back by the backward one). Compiled, both passes then fuse into one loop each. On
// concrete tensors, the formula (nothing to differentiate, and no function to stage).
Tensor gelu(const Tensor& x, bool tanh_approximation, Loc loc) {
  const kiln::detail::CallSite site(loc);
  const double c = std::sqrt(2.0 / std::numbers::pi);
  const auto tanh_form = [c, loc](const Tensor& v) {
    return 0.5 * v * (1.0 + tanh(c * (v + 0.044715 * v * v * v), loc));
  };
  const auto erf_form = [loc](const Tensor& v) {
    return 0.5 * v * (1.0 + erf(v * (1.0 / std::numbers::sqrt2), loc));
  };
  if (!x.is_traced()) return tanh_approximation ? tanh_form(x) : erf_form(x);
  return tanh_approximation ? checkpoint(tanh_form)(x) : checkpoint(erf_form)(x);
}

Tensor silu(const Tensor& x, Loc loc) { return x * sigmoid(x, loc); }

// Two exact formulas, each where it cannot overflow: x + log1p(e^-x) for x > 0, log1p(e^x)
// otherwise. Each gets an input that is 0 where the other is chosen, so the unchosen one
// never puts inf or NaN into the derivatives. (max(x, 0) + log1p(e^-|x|) has the right
// values, but AD through its two kinks at 0 gives a second derivative of 0 there, not 1/4.)
Tensor softplus(const Tensor& x, Loc loc) {
  const kiln::detail::CallSite site(loc);
  const Tensor xf = astype(x, to_floating(x.dtype()), loc);
  const Tensor positive = xf > 0.0;
  const Tensor zero = scalar_like(xf, 0.0);
  const Tensor xp = where(positive, xf, zero, loc), xn = where(positive, zero, xf, loc);
  return where(positive, xp + log1p(exp(-xp, loc), loc), log1p(exp(xn, loc), loc), loc);
}

Tensor log_sigmoid(const Tensor& x, Loc loc) {
  const kiln::detail::CallSite site(loc);
  return -softplus(-astype(x, to_floating(x.dtype()), loc), loc);
}

}  // namespace kiln::nn

// ---- losses ---------------------------------------------------------------------------

namespace kiln {
// check_labels{classes, ignore_index?, op?}(labels) -> labels, unchanged: raises unless every
// label is in [0, classes) or is the ignore_index. A primitive rather than a check in
// cross_entropy, so that traced labels (under jit, grad or vmap) are checked too, when the
// traced function runs: gather_along alone would read -1 as the last class. `op` names the
// loss in the error (default nn.cross_entropy).
const Primitive& prim::check_labels() {
  static const Primitive& p = detail::register_builtin(
      {.name = "check_labels",
       .arity = 1,
       .type_rule = [](std::span<const TensorType> in,
                       const Attrs&) { return std::vector<TensorType>{in[0]}; },
       .differentiable = false,
       .batch = [](const BatchArgs& b) -> std::vector<Batched> {  // elementwise: any batch axis
         return {{bind1(b.primitive, {b.inputs[0]}, b.attrs), b.dims[0]}};
       }},
      {{KernelSignature{.device = Device::cpu, .inputs = {DTypeSet::integral()}, .variadic = false},
        [](std::span<const Tensor> in, const Attrs& a) {
          const int64_t classes = a.get_int("classes");
          const bool has_ignore = a.has("ignore_index");
          const int64_t ignore = has_ignore ? a.get_int("ignore_index") : 0;
          const std::string op = a.has("op") ? a.get<std::string>("op") : "nn.cross_entropy";
          const std::vector<int64_t> labels = in[0].to_vector<int64_t>();
          for (std::size_t i = 0; i < labels.size(); ++i) {
            const int64_t v = labels[i];
            if ((v < 0 || v >= classes) && !(has_ignore && v == ignore))
              fail(op, "label out of range: got ", v, " at flat position ", i, " of labels ",
                   in[0].type(), ", expected labels in [0, ", classes, ")",
                   has_ignore ? " or the ignore_index " + std::to_string(ignore) : std::string());
          }
          return std::vector<Tensor>{in[0]};
        }}});
  return p;
}
}  // namespace kiln

namespace kiln::nn {

Tensor accuracy(const Tensor& logits, const Tensor& labels, std::optional<int64_t> ignore_index,
                Loc loc) {
  const kiln::detail::CallSite site(loc);
  return located(loc, [&]() -> Tensor {
    constexpr std::string_view op = "nn.accuracy";
    expect_labels(op, "logits", logits, labels);
    const Tensor target = astype(labels, int64, loc);
    const Tensor hit = astype(equal(argmax(logits, -1, false, loc), target, loc), float32, loc);
    std::optional<Tensor> kept;
    if (ignore_index)
      kept = not_equal(target, tensor(std::vector<int64_t>{*ignore_index}, Shape{}), loc);
    return reduce_kept(hit, kept, Reduction::mean, op, loc);
  });
}

// ---- initialisers -----------------------------------------------------------------------

namespace init {

Fans fans(const Shape& shape) {
  if (shape.rank() < 2)
    fail("nn.init", "cannot compute fans of a tensor with fewer than 2 dimensions: got shape ",
         shape, ", expected [out, in, ...]");
  double receptive = 1.0;
  for (int i = 2; i < shape.rank(); ++i) receptive *= static_cast<double>(shape[i]);
  return {static_cast<double>(shape[1]) * receptive, static_cast<double>(shape[0]) * receptive};
}

namespace {
double kaiming_std(const Shape& shape, double slope) {
  return std::sqrt(2.0 / (1.0 + slope * slope)) / std::sqrt(fans(shape).in);
}
double xavier_std(const Shape& shape, double gain) {
  const Fans f = fans(shape);
  return gain * std::sqrt(2.0 / (f.in + f.out));
}
Tensor symmetric_uniform(const Tensor& key, const Shape& shape, double bound, DType dtype) {
  return random::uniform(key, shape, dtype, -bound, bound);
}
}  // namespace

// A uniform on [-b, b] has standard deviation b / sqrt(3).
Tensor kaiming_uniform(const Tensor& key, const Shape& shape, double slope, DType dtype) {
  return symmetric_uniform(key, shape, std::sqrt(3.0) * kaiming_std(shape, slope), dtype);
}
Tensor kaiming_normal(const Tensor& key, const Shape& shape, double slope, DType dtype) {
  return random::normal(key, shape, dtype) * kaiming_std(shape, slope);
}
Tensor xavier_uniform(const Tensor& key, const Shape& shape, double gain, DType dtype) {
  return symmetric_uniform(key, shape, std::sqrt(3.0) * xavier_std(shape, gain), dtype);
}
Tensor xavier_normal(const Tensor& key, const Shape& shape, double gain, DType dtype) {
  return random::normal(key, shape, dtype) * xavier_std(shape, gain);
}
Tensor lecun_uniform(const Tensor& key, const Shape& shape, double fan_in, DType dtype) {
  return symmetric_uniform(key, shape, 1.0 / std::sqrt(fan_in), dtype);
}

}  // namespace init

// ---- context ----------------------------------------------------------------------------

Tensor Context::next_key(std::string_view who) {
  if (!key_ || !key_->defined())
    fail(who,
         "training needs a random key: got a Context without one, expected "
         "nn::Context::train(key)");
  const auto [next, use] = random::split(*key_);
  key_ = next;
  return use;
}

// ---- summaries --------------------------------------------------------------------------

namespace detail {
namespace {
thread_local SummaryRecorder* active_recorder = nullptr;
}
SummaryRecorder::SummaryRecorder() {
  if (active_recorder != nullptr)
    fail("nn.summary",
         "summaries do not nest: got a summary call inside another, expected one at a time");
  active_recorder = this;
}
SummaryRecorder::~SummaryRecorder() { active_recorder = nullptr; }

bool summary_recording() { return active_recorder != nullptr; }

void summary_note(std::string_view type, const Tensor& output,
                  std::initializer_list<const Tensor*> params) {
  if (active_recorder == nullptr) return;
  SummaryRow row{std::string(type), output.shape(), {}};
  for (const Tensor* p : params)
    if (p != nullptr && p->defined()) row.params.push_back(p->impl());
  active_recorder->rows.push_back(std::move(row));
}

std::string format_summary(const std::vector<SummaryRow>& rows,
                           const std::vector<std::pair<std::string, Tensor>>& named,
                           const Shape& input, const Shape& output) {
  std::map<const TensorImpl*, const std::pair<std::string, Tensor>*> by_impl;
  for (const auto& p : named) by_impl[p.second.impl()] = &p;
  auto shape_text = [](const Shape& s) {
    std::ostringstream os;
    os << s;
    return os.str();
  };
  struct Line {
    std::string name, type, shape, params;
  };
  std::vector<Line> lines{{"layer", "type", "output shape", "params"}};
  lines.push_back({"(input)", "", shape_text(input), ""});
  int64_t counted = 0;  // each parameter once, even when its layer runs twice
  std::set<const TensorImpl*> seen;
  for (const SummaryRow& r : rows) {
    std::string name;
    int64_t n = 0;
    for (const TensorImpl* impl : r.params) {
      const auto it = by_impl.find(impl);
      if (it == by_impl.end()) continue;
      n += it->second->second.numel();
      if (seen.insert(impl).second) counted += it->second->second.numel();
      if (name.empty()) {  // "features.0.weight" -> "features.0"
        name = it->second->first;
        const auto dot = name.rfind('.');
        name = dot == std::string::npos ? std::string("(root)") : name.substr(0, dot);
      }
    }
    lines.push_back({name.empty() ? "-" : name, r.type, shape_text(r.output), std::to_string(n)});
  }
  int64_t total = 0;
  for (const auto& p : named) total += p.second.numel();
  std::size_t w[3] = {0, 0, 0};
  for (const Line& l : lines) {
    w[0] = std::max(w[0], l.name.size());
    w[1] = std::max(w[1], l.type.size());
    w[2] = std::max(w[2], l.shape.size());
  }
  std::ostringstream os;
  for (const Line& l : lines)
    os << std::left << std::setw(static_cast<int>(w[0] + 2)) << l.name
       << std::setw(static_cast<int>(w[1] + 2)) << l.type << std::setw(static_cast<int>(w[2] + 2))
       << l.shape << std::right << l.params << "\n";
  os << "output " << shape_text(output) << "; " << total << " parameters in " << named.size()
     << (named.size() == 1 ? " tensor" : " tensors");
  if (counted != total) os << " (" << total - counted << " used outside the built-in layers)";
  os << "\n";
  return os.str();
}

}  // namespace detail

// ---- layers -----------------------------------------------------------------------------

Linear::Linear(int64_t in, int64_t out, const Tensor& key, bool with_bias, DType dtype) {
  if (in < 1 || out < 1)
    fail("nn.Linear", "non-positive size: got in=", in, ", out=", out, ", expected sizes >= 1");
  const auto [kw, kb] = random::split(key);
  weight = init::lecun_uniform(kw, {out, in}, static_cast<double>(in), dtype);
  if (with_bias) bias = init::lecun_uniform(kb, {out}, static_cast<double>(in), dtype);
}

Tensor Linear::operator()(const Tensor& x, Loc loc) const {
  const kiln::detail::CallSite site(loc);
  return located(loc, [&]() -> Tensor {
    constexpr std::string_view op = "nn.Linear";
    expect_input(op, x, 1, "[..., in]");
    const int64_t in = weight.shape()[1];
    if (x.shape()[x.rank() - 1] != in)
      fail(op, "input features do not match the weight: got input ", x.type(), " and weight ",
           weight.type(), ", expected input [..., ", in, "]");
    Tensor y = matmul(x, transpose(weight, loc), loc);
    if (bias) y = y + *bias;
    detail::summary_note("Linear", y, {&weight, bias ? &*bias : nullptr});
    return y;
  });
}

Tensor MaxPool2d::operator()(const Tensor& x, Loc loc) const {
  const kiln::detail::CallSite site(loc);
  Tensor y = max_pool2d(x, {kernel, stride, padding}, loc);
  detail::summary_note("MaxPool2d", y, {});
  return y;
}

Tensor AvgPool2d::operator()(const Tensor& x, Loc loc) const {
  const kiln::detail::CallSite site(loc);
  Tensor y = avg_pool2d(x, {kernel, stride, padding}, loc);
  detail::summary_note("AvgPool2d", y, {});
  return y;
}

Tensor Flatten::operator()(const Tensor& x, Loc loc) const {
  const kiln::detail::CallSite site(loc);
  return located(loc, [&]() -> Tensor {
    expect_input("nn.Flatten", x, static_cast<int>(start_dim) + 1,
                 "more than start_dim dimensions");
    if (start_dim < 0) fail("nn.Flatten", "negative start_dim: got ", start_dim, ", expected >= 0");
    std::vector<int64_t> dims(x.shape().begin(), x.shape().begin() + start_dim);
    int64_t rest = 1;
    for (int i = static_cast<int>(start_dim); i < x.rank(); ++i) rest *= x.shape()[i];
    dims.push_back(rest);
    Tensor y = reshape(x, Shape(dims), loc);
    detail::summary_note("Flatten", y, {});
    return y;
  });
}

namespace {
struct ActivationKind {
  std::string_view name;
  Tensor (*apply)(const Tensor&, Loc);
};
// Activation's kinds, each with its function's default parameters.
constexpr ActivationKind kActivationKinds[] = {
    {"relu", [](const Tensor& x, Loc loc) { return relu(x, loc); }},
    {"gelu", [](const Tensor& x, Loc loc) { return gelu(x, false, loc); }},
    {"gelu_tanh", [](const Tensor& x, Loc loc) { return gelu(x, true, loc); }},
    {"silu", [](const Tensor& x, Loc loc) { return silu(x, loc); }},
    {"tanh", [](const Tensor& x, Loc loc) { return tanh(x, loc); }},
    {"sigmoid", [](const Tensor& x, Loc loc) { return sigmoid(x, loc); }},
    {"mish", [](const Tensor& x, Loc loc) { return mish(x, loc); }},
    {"relu6", [](const Tensor& x, Loc loc) { return relu6(x, loc); }},
    {"hardtanh", [](const Tensor& x, Loc loc) { return hardtanh(x, -1.0, 1.0, loc); }},
    {"hardswish", [](const Tensor& x, Loc loc) { return hardswish(x, loc); }},
    {"hardsigmoid", [](const Tensor& x, Loc loc) { return hardsigmoid(x, loc); }},
    {"selu", [](const Tensor& x, Loc loc) { return selu(x, loc); }},
    {"celu", [](const Tensor& x, Loc loc) { return celu(x, 1.0, loc); }},
};
}  // namespace

Tensor Activation::operator()(const Tensor& x, Loc loc) const {
  const kiln::detail::CallSite site(loc);
  return located(loc, [&]() -> Tensor {
    for (const ActivationKind& k : kActivationKinds) {
      if (k.name != kind) continue;
      Tensor y = k.apply(x, loc);
      detail::summary_note(kind, y, {});
      return y;
    }
    std::string known;
    for (const ActivationKind& k : kActivationKinds)
      known += (known.empty() ? "" : ", ") + std::string(k.name);
    fail("nn.Activation", "unknown activation: got '", kind, "', expected one of ", known);
  });
}

Tensor Dropout::operator()(const Tensor& x, Context& ctx, Loc loc) const {
  const kiln::detail::CallSite site(loc);
  return located(loc, [&]() -> Tensor {
    constexpr std::string_view op = "nn.Dropout";
    if (!(rate >= 0.0 && rate < 1.0))
      fail(op, "rate out of range: got ", rate, ", expected [0, 1)");
    if (!ctx.training() || rate == 0.0) return (*this)(x, loc);
    expect_floating(op, "input", x);
    Tensor y = dropout(x, rate, ctx.next_key(op), loc);
    detail::summary_note("Dropout", y, {});
    return y;
  });
}

Tensor Dropout::operator()(const Tensor& x, Loc) const {
  detail::summary_note("Dropout", x, {});
  return x;
}

Embedding::Embedding(int64_t num, int64_t dim, const Tensor& key, DType dtype)
    : weight(random::normal(key, {num, dim}, dtype)) {}

Tensor Embedding::operator()(const Tensor& indices, Loc loc) const {
  const kiln::detail::CallSite site(loc);
  return located(loc, [&]() -> Tensor {
    if (!indices.defined() || !is_integral(indices.dtype()))
      fail("nn.Embedding", "indices must be integers: got ",
           indices.defined() ? indices.type() : TensorType{}, ", expected an integer tensor");
    Tensor y = take(weight, indices, 0, loc);
    detail::summary_note("Embedding", y, {&weight});
    return y;
  });
}

}  // namespace kiln::nn
