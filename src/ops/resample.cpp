// Resampling NCHW images: adaptive_avg_pool2d, interpolate (nearest, bilinear) and
// pixel_shuffle/pixel_unshuffle (a reshape and a transpose). The first two are linear and
// separable, so they compose from existing primitives (take, multiply-add, matmul,
// avg_pool2d) with index and weight tables computed here by PyTorch 1.13's formulas; their
// derivatives (take's is a scatter-add), batching and compilation are those of the parts.
#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

#include "detail/checked.h"
#include "kiln/ops.h"
#include "ops/rules.h"

namespace kiln {
namespace {

void expect_nchw(std::string_view op, const Tensor& x) {
  if (!x.defined())
    fail(op, "undefined input: got a default-constructed Tensor, expected a tensor");
  if (x.shape().rank() != 4)
    fail(op, "input must have rank 4: got ", x.type(), ", expected [N, C, H, W]");
}

void expect_images(std::string_view op, const Tensor& x) {
  expect_nchw(op, x);
  if (x.shape()[2] == 0 || x.shape()[3] == 0)
    fail(op, "empty image: got input ", x.type(), ", expected H >= 1 and W >= 1");
}

Tensor as_floating(const Tensor& x, Loc loc) {
  return ops::cast_if_needed(x, to_floating(x.dtype()), loc);
}

// The [out, in] matrix averaging input j into output i for j in
// [floor(i * in / out), ceil((i + 1) * in / out)).
std::vector<double> averaging(std::string_view op, int64_t in, int64_t out) {
  std::vector<double> a(static_cast<std::size_t>(detail::checked_mul(op, in, out)), 0.0);
  for (int64_t i = 0; i < out; ++i) {
    const int64_t start = i * in / out, end = ((i + 1) * in + out - 1) / out;
    for (int64_t j = start; j < end; ++j)
      a[static_cast<std::size_t>(i * in + j)] = 1.0 / static_cast<double>(end - start);
  }
  return a;
}

// One axis of a resampling: sizes and, when the caller gave one, its scale factor.
struct Axis {
  int64_t in, out;
  std::optional<double> scale;
};

// PyTorch's compute_scales_value: 1 / scale when given, else in / out, in precision A.
template <typename A>
A inverse_scale(const Axis& a) {
  return a.scale && *a.scale > 0 ? static_cast<A>(1.0 / *a.scale)
                                 : static_cast<A>(a.in) / static_cast<A>(a.out);
}

// Nearest: source floor(dst * in / out) in float, as PyTorch 1.13 for every dtype (its
// index tables, the path of images with C > 1: without the shortcuts its C = 1 path takes when
// out == in or out == 2 * in despite a scale factor). Nullopt for the identity.
std::optional<std::vector<int64_t>> nearest_index(const Axis& a) {
  std::vector<int64_t> idx(static_cast<std::size_t>(a.out));
  const float s = inverse_scale<float>(a);
  bool identity = a.out == a.in;
  for (int64_t j = 0; j < a.out; ++j) {
    idx[static_cast<std::size_t>(j)] =
        std::min(static_cast<int64_t>(std::floor(static_cast<float>(j) * s)), a.in - 1);
    identity = identity && idx[static_cast<std::size_t>(j)] == j;
  }
  if (identity) return std::nullopt;
  return idx;
}

// One axis of a linear resampling: out[j] = sum over taps t of weight[t][j] * in[index[t][j]].
struct Taps {
  std::vector<std::vector<int64_t>> index;
  std::vector<std::vector<double>> weight;
  explicit Taps(std::size_t n) : index(n), weight(n) {}
  void add(std::size_t t, int64_t i, double w) {
    index[t].push_back(i);
    weight[t].push_back(w);
  }
};

// PyTorch's area_pixel_compute_scale: the source step per output step.
template <typename A>
A source_step(const Axis& a, bool align_corners) {
  if (!align_corners) return inverse_scale<A>(a);
  return a.out > 1 ? static_cast<A>(a.in - 1) / static_cast<A>(a.out - 1) : A{0};
}

// PyTorch's compute_source_index_and_lambda in the precision A of its kernel (float for
// float32 and narrower, double for float64).
template <typename A>
Taps lerp_weights(const Axis& a, bool align_corners) {
  Taps w(2);
  const A ratio = source_step<A>(a, align_corners);
  for (int64_t j = 0; j < a.out; ++j) {
    if (a.out == a.in) {  // a copy
      w.add(0, j, 1.0);
      w.add(1, j, 0.0);
      continue;
    }
    A src = align_corners ? ratio * static_cast<A>(j)
                          : ratio * (static_cast<A>(j) + static_cast<A>(0.5)) - static_cast<A>(0.5);
    if (src < A{0}) src = A{0};
    const int64_t i0 = static_cast<int64_t>(src);
    const A l1 = std::clamp(src - static_cast<A>(i0), A{0}, A{1});
    w.add(0, i0, static_cast<double>(A{1} - l1));
    w.add(1, i0 + (i0 < a.in - 1 ? 1 : 0), static_cast<double>(l1));
  }
  return w;
}

// PyTorch's bicubic taps (cubic convolution with A = -0.75) at source x - 1 .. x + 2, clamped
// to the input; the source index is not clamped at 0 (unlike bilinear).
template <typename A>
Taps cubic_weights(const Axis& a, bool align_corners) {
  Taps w(4);
  const A ratio = source_step<A>(a, align_corners), c = static_cast<A>(-0.75);
  auto near = [c](A x) { return ((c + 2) * x - (c + 3)) * x * x + 1; };       // |x| <= 1
  auto far = [c](A x) { return ((c * x - 5 * c) * x + 8 * c) * x - 4 * c; };  // 1 < |x| < 2
  for (int64_t j = 0; j < a.out; ++j) {
    const A src = align_corners
                      ? ratio * static_cast<A>(j)
                      : ratio * (static_cast<A>(j) + static_cast<A>(0.5)) - static_cast<A>(0.5);
    const A fl = std::floor(src);
    const auto i = static_cast<int64_t>(fl);
    const A t = src - fl;
    const A weights[4] = {far(t + 1), near(t), near(1 - t), far(2 - t)};
    for (int64_t k = 0; k < 4; ++k)
      w.add(static_cast<std::size_t>(k), std::clamp<int64_t>(i - 1 + k, 0, a.in - 1),
            static_cast<double>(weights[k]));
  }
  return w;
}

// A weight per position along `axis` (2 or 3) of an NCHW tensor, in dtype dt.
Tensor along(const std::vector<double>& v, int axis, DType dt) {
  const auto n = static_cast<int64_t>(v.size());
  return astype(tensor(v, axis == 2 ? Shape{n, 1} : Shape{n}), dt);
}

Tensor taps_axis(const Tensor& x, int axis, const Taps& w) {
  Tensor y;
  for (std::size_t t = 0; t < w.index.size(); ++t) {
    const auto n = static_cast<int64_t>(w.index[t].size());
    const Tensor term =
        take(x, tensor(w.index[t], Shape{n}), axis) * along(w.weight[t], axis, x.dtype());
    y = t == 0 ? term : y + term;
  }
  return y;
}

// PyTorch's nearest-exact: source min(floor((dst + 1/2) * in / out), in - 1) in float.
std::vector<int64_t> nearest_exact_index(const Axis& a) {
  std::vector<int64_t> idx;
  const float s = inverse_scale<float>(a);
  for (int64_t j = 0; j < a.out; ++j)
    idx.push_back(std::min(static_cast<int64_t>(std::floor(static_cast<float>(
                               (static_cast<double>(j) + 0.5) * static_cast<double>(s)))),
                           a.in - 1));
  return idx;
}

}  // namespace

Tensor adaptive_avg_pool2d(const Tensor& x_in, std::pair<int64_t, int64_t> size, Loc loc) {
  constexpr std::string_view op = "adaptive_avg_pool2d";
  const detail::CallSite site(loc);
  expect_images(op, x_in);
  const auto [oh, ow] = size;
  if (oh < 1 || ow < 1)
    fail(op, "non-positive output size: got [", oh, ", ", ow, "], expected sizes >= 1");
  const Tensor x = as_floating(x_in, loc);
  const int64_t h = x.shape()[2], w = x.shape()[3];
  // Equal windows tile the image: an average pooling, exact and without the matrices.
  if (h % oh == 0 && w % ow == 0) return avg_pool2d(x, {.kernel = {h / oh, w / ow}}, loc);
  const Tensor rows = astype(tensor(averaging(op, h, oh), Shape{oh, h}), x.dtype(), loc);
  const Tensor cols = astype(tensor(averaging(op, w, ow), Shape{ow, w}), x.dtype(), loc);
  return matmul(matmul(rows, x, loc), transpose(cols, loc), loc);
}

Tensor interpolate(const Tensor& x_in, const InterpolateOptions& o, Loc loc) {
  constexpr std::string_view op = "interpolate";
  const detail::CallSite site(loc);
  expect_images(op, x_in);
  if (o.size.has_value() == o.scale_factor.has_value())
    fail(op, "give exactly one of size and scale_factor: got ", o.size ? "both" : "neither",
         ", expected one");
  if (o.align_corners && o.mode != InterpolateMode::bilinear && o.mode != InterpolateMode::bicubic)
    fail(op,
         "align_corners with a mode other than bilinear or bicubic: got align_corners=true, "
         "expected it only with those (as PyTorch)");
  std::vector<Axis> axes;
  for (int i = 0; i < 2; ++i) {
    const int64_t in = x_in.shape()[i + 2];
    if (o.size) {
      const int64_t out = i == 0 ? o.size->first : o.size->second;
      if (out < 1)
        fail(op, "non-positive output size: got size [", o.size->first, ", ", o.size->second,
             "], expected sizes >= 1");
      axes.push_back({in, out, std::nullopt});
      continue;
    }
    const double s = i == 0 ? o.scale_factor->first : o.scale_factor->second;
    const double out = std::floor(static_cast<double>(in) * s);
    if (!std::isfinite(s) || s <= 0 || !(out >= 1) || out > 1e15)
      fail(op, "bad scale_factor: got [", o.scale_factor->first, ", ", o.scale_factor->second,
           "] for input ", x_in.type(), ", expected finite positive factors giving sizes >= 1");
    axes.push_back({in, static_cast<int64_t>(out), s});
  }
  if (o.mode == InterpolateMode::nearest || o.mode == InterpolateMode::nearest_exact) {
    Tensor y = x_in;
    for (int i = 1; i >= 0; --i) {
      const std::optional<std::vector<int64_t>> idx = o.mode == InterpolateMode::nearest
                                                          ? nearest_index(axes[i])
                                                          : nearest_exact_index(axes[i]);
      if (idx) y = take(y, tensor(*idx, Shape{axes[i].out}), i + 2, loc);
    }
    return y;
  }
  if (o.mode == InterpolateMode::area)
    return adaptive_avg_pool2d(x_in, {axes[0].out, axes[1].out}, loc);
  Tensor y = as_floating(x_in, loc);
  const bool cubic = o.mode == InterpolateMode::bicubic;
  // Width first, then height: PyTorch's order of the sums.
  for (int i = 1; i >= 0; --i) {
    if (axes[i].out == axes[i].in && !cubic) continue;
    const bool wide = y.dtype() == float64;
    const Taps w = cubic ? (wide ? cubic_weights<double>(axes[i], o.align_corners)
                                 : cubic_weights<float>(axes[i], o.align_corners))
                         : (wide ? lerp_weights<double>(axes[i], o.align_corners)
                                 : lerp_weights<float>(axes[i], o.align_corners));
    y = taps_axis(y, i + 2, w);
  }
  return y;
}

// A channel block of r * r as an r x r tile: [N, C, r, r, H, W] -> [N, C, H, r, W, r].
Tensor pixel_shuffle(const Tensor& x, int64_t r, Loc loc) {
  const detail::CallSite site(loc);
  constexpr std::string_view op = "pixel_shuffle";
  expect_nchw(op, x);
  if (r < 1) fail(op, "non-positive upscale_factor: got ", r, ", expected >= 1");
  const Shape& s = x.shape();
  const int64_t rr = detail::checked_mul(op, r, r);
  if (s[1] % rr != 0)
    fail(op, "channels not divisible by upscale_factor squared: got ", x.type(),
         " with upscale_factor ", r, ", expected C to be a multiple of ", rr);
  const int64_t c = s[1] / rr;
  const Tensor t =
      transpose(reshape(x, Shape{s[0], c, r, r, s[2], s[3]}, loc), {0, 1, 4, 2, 5, 3}, loc);
  return reshape(
      t, Shape{s[0], c, detail::checked_mul(op, s[2], r), detail::checked_mul(op, s[3], r)}, loc);
}

// An r x r tile as a channel block: [N, C, H, r, W, r] -> [N, C, r, r, H, W].
Tensor pixel_unshuffle(const Tensor& x, int64_t r, Loc loc) {
  const detail::CallSite site(loc);
  constexpr std::string_view op = "pixel_unshuffle";
  expect_nchw(op, x);
  if (r < 1) fail(op, "non-positive downscale_factor: got ", r, ", expected >= 1");
  const Shape& s = x.shape();
  if (s[2] % r != 0 || s[3] % r != 0)
    fail(op, "image not divisible by downscale_factor: got ", x.type(), " with downscale_factor ",
         r, ", expected H and W to be multiples of it");
  const Tensor t = transpose(reshape(x, Shape{s[0], s[1], s[2] / r, r, s[3] / r, r}, loc),
                             {0, 1, 3, 5, 2, 4}, loc);
  return reshape(t, Shape{s[0], detail::checked_mul(op, s[1], r * r), s[2] / r, s[3] / r}, loc);
}

}  // namespace kiln
