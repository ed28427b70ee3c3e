// kiln.nn's convolution layers: Conv1d/2d/3d and ConvTranspose1d/2d/3d (kiln::nn::ConvNd and
// ConvTransposeNd) with PyTorch's constructor arguments, attributes and padding modes.
#include <string>

#include "nn_layers.h"

namespace kiln::python {
namespace {

template <int N>
py::tuple sizes_tuple(const ConvSizes<N>& s) {
  if constexpr (N == 1)
    return py::make_tuple(s);
  else if constexpr (N == 2)
    return py::make_tuple(s.first, s.second);
  else
    return py::make_tuple(s[0], s[1], s[2]);
}

template <int N>
py::object padding_object(const ConvPadding<N>& p) {
  if (p.rule) return py::str(*p.rule == PaddingRule::same ? "same" : "valid");
  return sizes_tuple<N>(p.sizes);
}

nn::PaddingMode to_padding_mode(const std::string& op, const std::string& mode) {
  if (mode == "zeros") return nn::PaddingMode::zeros;
  if (mode == "reflect") return nn::PaddingMode::reflect;
  if (mode == "replicate") return nn::PaddingMode::replicate;
  if (mode == "circular") return nn::PaddingMode::circular;
  fail(op, "unknown padding_mode: got '", mode,
       "', expected 'zeros', 'reflect', 'replicate' or 'circular'");
}
const char* padding_mode_name(nn::PaddingMode m) {
  static constexpr const char* kNames[] = {"zeros", "reflect", "replicate", "circular"};
  return kNames[static_cast<int>(m)];
}

// An int-or-tuple attribute of layer L as a property: a tuple, set from an int or N ints.
template <int N, class L>
void sizes_property(py::class_<L>& cls, const char* name, ConvSizes<N> L::*member,
                    const std::string& op) {
  cls.def_property(
      name, [member](const L& l) { return sizes_tuple<N>(l.*member); },
      [member, name, op](L& l, py::handle v) {
        l.*member = to_conv_sizes<N>(v, op.c_str(), name);
      });
}

template <int N>
void bind_conv_layer(py::module_& nn, const char* doc) {
  using L = nn::ConvNd<N>;
  const std::string name = "Conv" + std::to_string(N) + "d", op = "nn." + name;
  auto cls = layer_class<L>(nn, name.c_str(), doc);
  cls.def(py::init([op](int64_t in, int64_t out, py::handle kernel, py::handle key,
                        py::handle stride, py::handle padding, py::handle dilation, int64_t groups,
                        bool bias, const std::string& padding_mode, py::handle dtype) {
            const char* o = op.c_str();
            typename L::Options options;
            options.stride = to_conv_sizes<N>(stride, o, "stride");
            options.padding = to_conv_padding<N>(padding, o);
            options.dilation = to_conv_sizes<N>(dilation, o, "dilation");
            options.groups = groups;
            options.bias = bias;
            options.padding_mode = to_padding_mode(op, padding_mode);
            options.dtype = dtype_or_f32(dtype);
            return L(in, out, to_conv_sizes<N>(kernel, o, "kernel_size"), to_tensor(key), options);
          }),
          py::arg("in_channels"), py::arg("out_channels"), py::arg("kernel_size"), py::arg("key"),
          py::arg("stride") = 1, py::arg("padding") = 0, py::arg("dilation") = 1,
          py::arg("groups") = 1, py::arg("bias") = true, py::arg("padding_mode") = "zeros",
          py::arg("dtype") = py::none());
  tensor_property(cls, "weight", &L::weight, "[out, in / groups, *kernel]");
  tensor_property(cls, "bias", &L::bias, "[out], or None");
  sizes_property<N>(cls, "stride", &L::stride, op);
  sizes_property<N>(cls, "dilation", &L::dilation, op);
  cls.def_property(
      "padding", [](const L& l) { return padding_object<N>(l.padding); },
      [op](L& l, py::handle v) { l.padding = to_conv_padding<N>(v, op.c_str()); });
  cls.def_readwrite("groups", &L::groups);
  cls.def_property(
      "padding_mode", [](const L& l) { return std::string(padding_mode_name(l.padding_mode)); },
      [op](L& l, const std::string& m) { l.padding_mode = to_padding_mode(op, m); });
  cls.def(
      "__call__", [](const L& l, py::handle x) { return l(to_tensor(x), Loc{}); }, py::arg("x"));
  cls.def("__repr__", [name](const L& l) {
    std::string s = name + "(weight=" + l.weight.type().to_string() +
                    ", bias=" + type_text(l.bias) +
                    ", stride=" + repr_of(sizes_tuple<N>(l.stride)) +
                    ", padding=" + repr_of(padding_object<N>(l.padding)) +
                    ", dilation=" + repr_of(sizes_tuple<N>(l.dilation)) +
                    ", groups=" + std::to_string(l.groups);
    if (l.padding_mode != nn::PaddingMode::zeros)
      s += ", padding_mode='" + std::string(padding_mode_name(l.padding_mode)) + "'";
    return s + ")";
  });
}

template <int N>
void bind_conv_transpose_layer(py::module_& nn, const char* doc) {
  using L = nn::ConvTransposeNd<N>;
  const std::string name = "ConvTranspose" + std::to_string(N) + "d", op = "nn." + name;
  auto cls = layer_class<L>(nn, name.c_str(), doc);
  cls.def(
      py::init([op](int64_t in, int64_t out, py::handle kernel, py::handle key, py::handle stride,
                    py::handle padding, py::handle output_padding, int64_t groups, bool bias,
                    py::handle dilation, const std::string& padding_mode, py::handle dtype) {
        const char* o = op.c_str();
        if (padding_mode != "zeros")
          fail(op, "only padding_mode 'zeros' is supported: got '", padding_mode,
               "', expected 'zeros' (as PyTorch's transposed convolutions)");
        typename L::Options options;
        options.stride = to_conv_sizes<N>(stride, o, "stride");
        options.padding = to_conv_sizes<N>(padding, o, "padding");
        options.output_padding = to_conv_sizes<N>(output_padding, o, "output_padding");
        options.dilation = to_conv_sizes<N>(dilation, o, "dilation");
        options.groups = groups;
        options.bias = bias;
        options.dtype = dtype_or_f32(dtype);
        return L(in, out, to_conv_sizes<N>(kernel, o, "kernel_size"), to_tensor(key), options);
      }),
      py::arg("in_channels"), py::arg("out_channels"), py::arg("kernel_size"), py::arg("key"),
      py::arg("stride") = 1, py::arg("padding") = 0, py::arg("output_padding") = 0,
      py::arg("groups") = 1, py::arg("bias") = true, py::arg("dilation") = 1,
      py::arg("padding_mode") = "zeros", py::arg("dtype") = py::none());
  tensor_property(cls, "weight", &L::weight, "[in, out / groups, *kernel]");
  tensor_property(cls, "bias", &L::bias, "[out], or None");
  sizes_property<N>(cls, "stride", &L::stride, op);
  sizes_property<N>(cls, "padding", &L::padding, op);
  sizes_property<N>(cls, "output_padding", &L::output_padding, op);
  sizes_property<N>(cls, "dilation", &L::dilation, op);
  cls.def_readwrite("groups", &L::groups);
  cls.def_property_readonly("padding_mode", [](const L&) { return std::string("zeros"); });
  cls.def(
      "__call__", [](const L& l, py::handle x) { return l(to_tensor(x), Loc{}); }, py::arg("x"));
  cls.def("__repr__", [name](const L& l) {
    return name + "(weight=" + l.weight.type().to_string() + ", bias=" + type_text(l.bias) +
           ", stride=" + repr_of(sizes_tuple<N>(l.stride)) +
           ", padding=" + repr_of(sizes_tuple<N>(l.padding)) +
           ", output_padding=" + repr_of(sizes_tuple<N>(l.output_padding)) +
           ", dilation=" + repr_of(sizes_tuple<N>(l.dilation)) +
           ", groups=" + std::to_string(l.groups) + ")";
  });
}

}  // namespace

void bind_nn_conv(py::module_& nn) {
  bind_conv_layer<1>(nn, "1-D convolution over [N, C, W] or [C, W], weight [out, in / groups, k].");
  bind_conv_layer<2>(
      nn, "2-D convolution over [N, C, H, W] or [C, H, W], weight [out, in / groups, kh, kw].");
  bind_conv_layer<3>(nn,
                     "3-D convolution over [N, C, D, H, W] or [C, D, H, W], weight "
                     "[out, in / groups, kd, kh, kw].");
  bind_conv_transpose_layer<1>(
      nn, "1-D transposed convolution over [N, C, W] or [C, W], weight [in, out / groups, k].");
  bind_conv_transpose_layer<2>(nn,
                               "2-D transposed convolution over [N, C, H, W] or [C, H, W], "
                               "weight [in, out / groups, kh, kw].");
  bind_conv_transpose_layer<3>(nn,
                               "3-D transposed convolution over [N, C, D, H, W] or "
                               "[C, D, H, W], weight [in, out / groups, kd, kh, kw].");
}

}  // namespace kiln::python
