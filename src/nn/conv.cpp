// kiln::nn's convolution layers: Conv1d/2d/3d and ConvTranspose1d/2d/3d, the functional
// convolutions of ops.h with PyTorch's parameters, initialisation and padding modes.
#include <string>

#include "detail/checked.h"
#include "kiln/indexing.h"
#include "kiln/nn.h"
#include "kiln/primitive.h"
#include "nn/checks.h"

namespace kiln::nn {

namespace {

std::vector<int64_t> values(int64_t v) { return {v}; }
std::vector<int64_t> values(std::pair<int64_t, int64_t> v) { return {v.first, v.second}; }
std::vector<int64_t> values(const std::array<int64_t, 3>& v) { return {v.begin(), v.end()}; }

std::string layer_name(std::string_view stem, int rank) {
  return std::string(stem) + std::to_string(rank) + "d";
}

// The weight [a, b, *kernel] of a layer with `in` and `out` channels, checked as PyTorch does.
Shape weight_shape(const std::string& op, int64_t in, int64_t out, int64_t groups,
                   const std::vector<int64_t>& kernel, int64_t a, int64_t b) {
  bool positive = in >= 1 && out >= 1 && groups >= 1;
  for (const int64_t k : kernel) positive = positive && k >= 1;
  if (!positive)
    fail(op, "non-positive size: got in=", in, ", out=", out, ", kernel=", attr_to_string(kernel),
         ", groups=", groups, ", expected values >= 1");
  if (in % groups != 0 || out % groups != 0)
    fail(op, "channels not divisible by groups: got in=", in, ", out=", out, ", groups=", groups,
         ", expected both to be multiples of groups");
  std::vector<int64_t> dims{a, b / groups};
  dims.insert(dims.end(), kernel.begin(), kernel.end());
  return Shape(dims);
}

// PyTorch's default: weight and bias U(±1/√fan_in), fan_in from the weight's shape.
struct Parameters {
  Tensor weight;
  std::optional<Tensor> bias;
};
Parameters init_parameters(const Shape& shape, int64_t out, bool with_bias, const Tensor& key,
                           DType dtype) {
  const auto [kw, kb] = random::split(key);
  const double fan_in = init::fans(shape).in;
  Parameters p{init::lecun_uniform(kw, shape, fan_in, dtype), std::nullopt};
  if (with_bias) p.bias = init::lecun_uniform(kb, {out}, fan_in, dtype);
  return p;
}

// The input of an N-d layer: [N, C, *spatial] or unbatched [C, *spatial].
void expect_conv_input(const std::string& op, const Tensor& x, int rank) {
  static constexpr const char* kLayouts[] = {"[N, C, W] or [C, W]", "[N, C, H, W] or [C, H, W]",
                                             "[N, C, D, H, W] or [C, D, H, W]"};
  if (!x.defined())
    fail(op, "undefined input: got a default-constructed Tensor, expected a tensor");
  if (x.rank() != rank + 1 && x.rank() != rank + 2)
    fail(op, "input must have rank ", rank + 2, " (or ", rank + 1, ", unbatched): got ", x.type(),
         ", expected ", kLayouts[rank - 1]);
}

PadMode pad_mode(PaddingMode m) {
  switch (m) {
    case PaddingMode::reflect:
      return PadMode::reflect;
    case PaddingMode::replicate:
      return PadMode::edge;
    case PaddingMode::circular:
      return PadMode::wrap;
    case PaddingMode::zeros:
      break;
  }
  return PadMode::constant;
}

// x padded on its last `rank` axes by `padding` in `mode`, as PyTorch pads before a
// convolution with padding_mode other than zeros ("same": dilation * (k - 1) per axis, the
// odd one after).
template <int N>
Tensor pad_spatial(const Tensor& x, const Tensor& weight, const ConvPadding<N>& padding,
                   const ConvSizes<N>& dilation, PaddingMode mode, Loc loc) {
  std::vector<std::pair<int64_t, int64_t>> widths(static_cast<std::size_t>(x.rank() - N), {0, 0});
  const std::vector<int64_t> sizes = values(padding.sizes), dil = values(dilation);
  for (std::size_t i = 0; i < static_cast<std::size_t>(N); ++i) {
    if (!padding.rule) {
      widths.emplace_back(sizes[i], sizes[i]);
    } else if (*padding.rule == PaddingRule::valid) {
      widths.emplace_back(0, 0);
    } else {
      const int64_t total = kiln::detail::checked_mul(
          "nn.Conv", dil[i], weight.shape()[static_cast<int64_t>(i) + 2] - 1);
      widths.emplace_back(total / 2, total - total / 2);
    }
  }
  return pad(x, widths, pad_mode(mode), 0.0, loc);
}

Tensor conv(const Tensor& x, const Tensor& w, const ConvNd<1>& l, const ConvPadding<1>& p,
            Loc loc) {
  return conv1d(x, w, {l.stride, p, l.dilation, l.groups, l.bias}, loc);
}
Tensor conv(const Tensor& x, const Tensor& w, const ConvNd<2>& l, const ConvPadding<2>& p,
            Loc loc) {
  return conv2d(x, w, {l.stride, p, l.dilation, l.groups, l.bias}, loc);
}
Tensor conv(const Tensor& x, const Tensor& w, const ConvNd<3>& l, const ConvPadding<3>& p,
            Loc loc) {
  return conv3d(x, w, {l.stride, p, l.dilation, l.groups, l.bias}, loc);
}
Tensor conv_transpose(const Tensor& x, const ConvTransposeNd<1>& l, Loc loc) {
  return conv_transpose1d(
      x, l.weight, {l.stride, l.padding, l.output_padding, l.dilation, l.groups, l.bias}, loc);
}
Tensor conv_transpose(const Tensor& x, const ConvTransposeNd<2>& l, Loc loc) {
  return conv_transpose2d(
      x, l.weight, {l.stride, l.padding, l.output_padding, l.dilation, l.groups, l.bias}, loc);
}
Tensor conv_transpose(const Tensor& x, const ConvTransposeNd<3>& l, Loc loc) {
  return conv_transpose3d(
      x, l.weight, {l.stride, l.padding, l.output_padding, l.dilation, l.groups, l.bias}, loc);
}

// A layer's call: the input checked, then its convolution `f`, noted for model summaries.
template <class F>
Tensor call_layer(const std::string& name, int rank, const Tensor& x, const Tensor& weight,
                  const std::optional<Tensor>& bias, Loc loc, F&& f) {
  const kiln::detail::CallSite site(loc);
  return located(loc, [&]() -> Tensor {
    expect_conv_input("nn." + name, x, rank);
    const Tensor y = f();
    detail::summary_note(name, y, {&weight, bias ? &*bias : nullptr});
    return y;
  });
}

}  // namespace

template <int N>
ConvNd<N>::ConvNd(int64_t in, int64_t out, ConvSizes<N> kernel, const Tensor& key, const Options& o)
    : stride(o.stride),
      padding(o.padding),
      dilation(o.dilation),
      groups(o.groups),
      padding_mode(o.padding_mode) {
  const std::string op = layer_name("nn.Conv", N);
  const Shape shape = weight_shape(op, in, out, o.groups, values(kernel), out, in);
  if (o.padding.rule == PaddingRule::same)
    for (const int64_t s : values(o.stride))
      if (s != 1)
        fail(op, "padding='same' needs stride 1: got stride ", attr_to_string(values(o.stride)),
             ", expected 1 on every axis");
  Parameters p = init_parameters(shape, out, o.bias, key, o.dtype);
  weight = std::move(p.weight);
  bias = std::move(p.bias);
}

template <int N>
Tensor ConvNd<N>::operator()(const Tensor& x, Loc loc) const {
  return call_layer(layer_name("Conv", N), N, x, weight, bias, loc, [&] {
    if (padding_mode == PaddingMode::zeros) return conv(x, weight, *this, padding, loc);
    return conv(pad_spatial<N>(x, weight, padding, dilation, padding_mode, loc), weight, *this,
                ConvPadding<N>{}, loc);
  });
}

template <int N>
ConvTransposeNd<N>::ConvTransposeNd(int64_t in, int64_t out, ConvSizes<N> kernel, const Tensor& key,
                                    const Options& o)
    : stride(o.stride),
      padding(o.padding),
      output_padding(o.output_padding),
      dilation(o.dilation),
      groups(o.groups) {
  const Shape shape =
      weight_shape(layer_name("nn.ConvTranspose", N), in, out, o.groups, values(kernel), in, out);
  Parameters p = init_parameters(shape, out, o.bias, key, o.dtype);
  weight = std::move(p.weight);
  bias = std::move(p.bias);
}

template <int N>
Tensor ConvTransposeNd<N>::operator()(const Tensor& x, Loc loc) const {
  return call_layer(layer_name("ConvTranspose", N), N, x, weight, bias, loc,
                    [&] { return conv_transpose(x, *this, loc); });
}

template struct ConvNd<1>;
template struct ConvNd<2>;
template struct ConvNd<3>;
template struct ConvTransposeNd<1>;
template struct ConvTransposeNd<2>;
template struct ConvTransposeNd<3>;

}  // namespace kiln::nn
