// Resampling: adaptive_avg_pool2d, interpolate (1 to 3 spatial axes), grid_sample,
// affine_grid and pixel_shuffle/pixel_unshuffle (a reshape and a transpose). The first three
// are linear in the input and separable, so they compose from existing primitives (take,
// take_along_axis, multiply-add, matmul, avg_pool2d) with index and weight tables computed by
// PyTorch 1.13's formulas; their derivatives (a gather's is a scatter-add), batching and
// compilation are those of the parts.
#include <algorithm>
#include <array>
#include <cmath>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>
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

Tensor as_floating(const Tensor& x, Loc loc) {
  return ops::cast_if_needed(x, to_floating(x.dtype()), loc);
}

// The [out, in] matrix averaging input j into output i for j in
// [floor(i * in / out), ceil((i + 1) * in / out)), float64. Allocated as a tensor, so that a
// size no memory holds is an Error naming `op`.
Tensor averaging(std::string_view op, int64_t in, int64_t out) {
  Tensor m = detail::allocate(op, TensorType{float64, Shape{out, in}});
  double* a = m.data<double>();
  std::fill(a, a + m.numel(), 0.0);
  for (int64_t i = 0; i < out; ++i) {
    const int64_t start = i * in / out, end = ((i + 1) * in + out - 1) / out;
    for (int64_t j = start; j < end; ++j) a[i * in + j] = 1.0 / static_cast<double>(end - start);
  }
  return m;
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

// PyTorch's cubic convolution weights (A = -0.75) of the taps at distance t + 1, t, 1 - t and
// 2 - t from the source, for a number or a tensor t (grid_sample's, differentiable).
template <typename T>
std::array<T, 4> cubic_coefficients(const T& t) {
  // Constants in T's precision for numbers (as PyTorch's kernels), weak scalars for tensors.
  using C = std::conditional_t<std::is_arithmetic_v<T>, T, double>;
  const C a = -0.75, one = 1, two = 2;
  auto near = [&](const T& x) -> T { return ((a + 2) * x - (a + 3)) * x * x + one; };  // |x| <= 1
  auto far = [&](const T& x) -> T {  // 1 < |x| < 2
    return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a;
  };
  return {far(t + one), near(t), near(one - t), far(two - t)};
}

// PyTorch's bicubic taps at source x - 1 .. x + 2, clamped to the input; the source index is
// not clamped at 0 (unlike bilinear).
template <typename A>
Taps cubic_weights(const Axis& a, bool align_corners) {
  Taps w(4);
  const A ratio = source_step<A>(a, align_corners);
  for (int64_t j = 0; j < a.out; ++j) {
    const A src = align_corners
                      ? ratio * static_cast<A>(j)
                      : ratio * (static_cast<A>(j) + static_cast<A>(0.5)) - static_cast<A>(0.5);
    const A fl = std::floor(src);
    const auto i = static_cast<int64_t>(fl);
    const std::array<A, 4> weights = cubic_coefficients(src - fl);
    for (int64_t k = 0; k < 4; ++k)
      w.add(static_cast<std::size_t>(k), std::clamp<int64_t>(i - 1 + k, 0, a.in - 1),
            static_cast<double>(weights[k]));
  }
  return w;
}

// A weight per position along `axis` of a tensor of rank `rank`, in dtype dt.
Tensor along(const std::vector<double>& v, int axis, int rank, DType dt) {
  std::vector<int64_t> dims(static_cast<std::size_t>(rank - axis), 1);
  dims[0] = static_cast<int64_t>(v.size());
  return astype(tensor(v, Shape(std::move(dims))), dt);
}

Tensor taps_axis(const Tensor& x, int axis, const Taps& w) {
  Tensor y;
  for (std::size_t t = 0; t < w.index.size(); ++t) {
    const auto n = static_cast<int64_t>(w.index[t].size());
    const Tensor term = take(x, tensor(w.index[t], Shape{n}), axis) *
                        along(w.weight[t], axis, static_cast<int>(x.rank()), x.dtype());
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

// The layout of an input with `spatial` spatial axes.
const char* layout(int spatial) {
  static constexpr const char* names[] = {"[N, C, W]", "[N, C, H, W]", "[N, C, D, H, W]"};
  return names[spatial - 1];
}

// x [N, C, *spatial] with a spatial rank among `ranks` and no empty spatial axis.
void expect_spatial(std::string_view op, const Tensor& x, std::initializer_list<int> ranks) {
  if (!x.defined())
    fail(op, "undefined input: got a default-constructed Tensor, expected a tensor");
  const int spatial = static_cast<int>(x.rank()) - 2;
  if (std::find(ranks.begin(), ranks.end(), spatial) == ranks.end()) {
    std::string rank, expected;
    for (const int r : ranks) {
      const char* sep = rank.empty() ? "" : r == *(ranks.end() - 1) ? " or " : ", ";
      rank += sep + std::to_string(r + 2);
      expected += std::string(expected.empty() ? "" : " or ") + layout(r);
    }
    fail(op, "input must have rank ", rank, ": got ", x.type(), ", expected ", expected);
  }
  for (int i = 2; i < x.rank(); ++i)
    if (x.shape()[i] == 0)
      fail(op, "empty image: got input ", x.type(), ", expected spatial sizes >= 1");
}

// What a mode of interpolate accepts: its name, the spatial rank it needs (nullopt: any) and
// whether it takes align_corners.
struct ModeRule {
  const char* name;
  std::optional<int> spatial;
  bool corners;
};

ModeRule mode_rule(InterpolateMode m) {
  switch (m) {
    case InterpolateMode::nearest:
      return {"nearest", std::nullopt, false};
    case InterpolateMode::nearest_exact:
      return {"nearest-exact", std::nullopt, false};
    case InterpolateMode::linear:
      return {"linear", 1, true};
    case InterpolateMode::bilinear:
      return {"bilinear", 2, true};
    case InterpolateMode::bicubic:
      return {"bicubic", 2, true};
    case InterpolateMode::trilinear:
      return {"trilinear", 3, true};
    case InterpolateMode::area:
      return {"area", std::nullopt, false};
  }
  fail("interpolate", "unknown mode: got ", static_cast<int>(m), ", expected an InterpolateMode");
}

template <typename T>
std::string listed(const std::vector<T>& v) {
  std::ostringstream s;
  s << '[';
  for (std::size_t i = 0; i < v.size(); ++i) s << (i ? ", " : "") << v[i];
  s << ']';
  return s.str();
}

// The value for spatial axis i of `spatial`: one for all, or one per axis.
template <typename T>
T per_axis(std::string_view op, const char* what, const SpatialValues<T>& v, int i, int spatial) {
  if (v.values.size() == 1) return v.values[0];
  if (v.values.size() != static_cast<std::size_t>(spatial))
    fail(op, what, " has ", v.values.size(), " values: got ", listed(v.values), ", expected 1 or ",
         spatial, " (one per spatial axis)");
  return v.values[static_cast<std::size_t>(i)];
}

// Each spatial axis's input and output sizes and scale factor.
std::vector<Axis> output_axes(std::string_view op, const Tensor& x, const InterpolateOptions& o) {
  const int spatial = static_cast<int>(x.rank()) - 2;
  std::vector<Axis> axes;
  for (int i = 0; i < spatial; ++i) {
    const int64_t in = x.shape()[i + 2];
    if (o.size) {
      const int64_t out = per_axis(op, "size", *o.size, i, spatial);
      if (out < 1)
        fail(op, "non-positive output size: got size ", listed(o.size->values),
             ", expected sizes >= 1");
      axes.push_back({in, out, std::nullopt});
      continue;
    }
    const double s = per_axis(op, "scale_factor", *o.scale_factor, i, spatial);
    const double out = std::floor(static_cast<double>(in) * s);
    if (!std::isfinite(s) || s <= 0 || !(out >= 1) || out > 1e15)
      fail(op, "bad scale_factor: got ", listed(o.scale_factor->values), " for input ", x.type(),
           ", expected finite positive factors giving sizes >= 1");
    axes.push_back({in, static_cast<int64_t>(out), s});
  }
  return axes;
}

}  // namespace

Tensor adaptive_avg_pool2d(const Tensor& x_in, std::pair<int64_t, int64_t> size, Loc loc) {
  constexpr std::string_view op = "adaptive_avg_pool2d";
  const detail::CallSite site(loc);
  expect_spatial(op, x_in, {2});
  const auto [oh, ow] = size;
  if (oh < 1 || ow < 1)
    fail(op, "non-positive output size: got [", oh, ", ", ow, "], expected sizes >= 1");
  const Tensor x = as_floating(x_in, loc);
  const int64_t h = x.shape()[2], w = x.shape()[3];
  // Equal windows tile the image: an average pooling, exact and without the matrices.
  if (h % oh == 0 && w % ow == 0) return avg_pool2d(x, {.kernel = {h / oh, w / ow}}, loc);
  const Tensor rows = astype(averaging(op, h, oh), x.dtype(), loc);
  const Tensor cols = astype(averaging(op, w, ow), x.dtype(), loc);
  return matmul(matmul(rows, x, loc), transpose(cols, loc), loc);
}

Tensor interpolate(const Tensor& x_in, const InterpolateOptions& o, Loc loc) {
  constexpr std::string_view op = "interpolate";
  const detail::CallSite site(loc);
  expect_spatial(op, x_in, {1, 2, 3});
  const ModeRule rule = mode_rule(o.mode);
  const int spatial = static_cast<int>(x_in.rank()) - 2;
  if (rule.spatial && *rule.spatial != spatial)
    fail(op, rule.name, " needs a ", *rule.spatial + 2, "-d input: got ", x_in.type(),
         ", expected ", layout(*rule.spatial));
  if (o.size.has_value() == o.scale_factor.has_value())
    fail(op, "give exactly one of size and scale_factor: got ", o.size ? "both" : "neither",
         ", expected one");
  if (o.align_corners && !rule.corners)
    fail(op,
         "align_corners with a mode other than linear, bilinear, bicubic or trilinear: got "
         "align_corners=true with ",
         rule.name, ", expected it only with those (as PyTorch)");
  const std::vector<Axis> axes = output_axes(op, x_in, o);
  if (o.mode == InterpolateMode::nearest || o.mode == InterpolateMode::nearest_exact) {
    Tensor y = x_in;
    for (int i = spatial - 1; i >= 0; --i) {
      const std::optional<std::vector<int64_t>> idx = o.mode == InterpolateMode::nearest
                                                          ? nearest_index(axes[i])
                                                          : nearest_exact_index(axes[i]);
      if (idx) y = take(y, tensor(*idx, Shape{axes[i].out}), i + 2, loc);
    }
    return y;
  }
  if (o.mode == InterpolateMode::area) {
    if (spatial == 1) return adaptive_avg_pool1d(x_in, axes[0].out, loc);
    if (spatial == 2) return adaptive_avg_pool2d(x_in, {axes[0].out, axes[1].out}, loc);
    return adaptive_avg_pool3d(x_in, {axes[0].out, axes[1].out, axes[2].out}, loc);
  }
  Tensor y = as_floating(x_in, loc);
  const bool cubic = o.mode == InterpolateMode::bicubic;
  // The innermost axis first: PyTorch's order of the sums.
  for (int i = spatial - 1; i >= 0; --i) {
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

namespace {

// One tap of grid_sample along one axis: the input position it reads (int64 [N, P], 0 where
// outside), whether that is inside the input, and its weight (none for nearest).
struct Tap {
  Tensor index;
  Tensor inside;
  std::optional<Tensor> weight;
};

// PyTorch's unnormalize: grid values in [-1, 1] to positions along an axis of `size`.
Tensor unnormalize(const Tensor& g, int64_t size, bool align_corners) {
  const auto s = static_cast<double>(size);
  return align_corners ? (g + 1.0) * ((s - 1) / 2) : (g + 1.0) * (s / 2) - 0.5;
}

// PyTorch's clip_coordinates: into [0, size - 1], the derivative zero on and beyond the ends.
Tensor clip_coordinates(const Tensor& c, int64_t size) {
  const auto hi = static_cast<double>(size - 1);
  return where(logical_and(c > 0.0, c < hi), c, stop_gradient(clip(c, 0.0, hi)));
}

// PyTorch's reflect_coordinates: mirrors at the border pixels' centres (align_corners) or
// edges, |c - low| folded into [0, twice_span) and flipped back above the span.
Tensor reflect_coordinates(const Tensor& c, int64_t size, bool align_corners) {
  const double low = align_corners ? 0.0 : -0.5;
  const double twice_span = 2.0 * static_cast<double>(align_corners ? size - 1 : size);
  if (twice_span <= 0) return zeros_like(c);
  const Tensor a = abs(c - low);
  const Tensor extra = a - stop_gradient(floor(a / twice_span)) * twice_span;
  return minimum(extra, twice_span - extra) + low;
}

// PyTorch's compute_coordinates: the padding mode applied to a position.
Tensor pad_coordinates(const Tensor& c, int64_t size, const GridSampleOptions& o) {
  switch (o.padding_mode) {
    case GridSamplePadding::zeros:
      return c;
    case GridSamplePadding::border:
      return clip_coordinates(c, size);
    case GridSamplePadding::reflection:
      return clip_coordinates(reflect_coordinates(c, size, o.align_corners), size);
  }
  fail("grid_sample", "unknown padding_mode: got ", static_cast<int>(o.padding_mode),
       ", expected a GridSamplePadding");
}

// The tap at integral `position` (floating, no derivative); NaN and positions outside the
// input read index 0 and are masked out.
Tap tap_at(const Tensor& position, int64_t size, std::optional<Tensor> weight) {
  const Tensor inside = logical_and(position >= 0.0, position <= static_cast<double>(size - 1));
  return {astype(where(inside, position, zeros_like(position)), int64), inside, std::move(weight)};
}

// The taps of one axis of `size` for grid values g [N, P]: bilinear reads floor(c) and
// floor(c) + 1 of the padded position c, nearest the nearest (half to even) position, bicubic
// floor(u) - 1 .. floor(u) + 2 of the unpadded position u, each tap padded.
std::vector<Tap> axis_taps(const Tensor& g, int64_t size, const GridSampleOptions& o) {
  const Tensor u = unnormalize(g, size, o.align_corners);
  if (o.mode == GridSampleMode::bicubic) {
    const Tensor base = floor(stop_gradient(u));
    const std::array<Tensor, 4> w = cubic_coefficients(u - base);
    std::vector<Tap> taps;
    for (std::size_t k = 0; k < 4; ++k)
      taps.push_back(
          tap_at(pad_coordinates(base + (static_cast<double>(k) - 1.0), size, o), size, w[k]));
    return taps;
  }
  const Tensor c = pad_coordinates(u, size, o);
  if (o.mode == GridSampleMode::nearest) return {tap_at(round(stop_gradient(c)), size, {})};
  const Tensor base = floor(stop_gradient(c)), t = c - base;
  return {tap_at(base, size, 1.0 - t), tap_at(base + 1.0, size, t)};
}

void expect_grid(std::string_view op, const Tensor& x, const Tensor& grid) {
  const int spatial = static_cast<int>(x.rank()) - 2;
  if (!grid.defined())
    fail(op, "undefined grid: got a default-constructed Tensor, expected a tensor");
  std::ostringstream expected;
  expected << '[' << x.shape()[0];
  for (int i = 0; i < spatial; ++i) expected << ", *";
  expected << ", " << spatial << ']';
  if (grid.rank() != x.rank() || grid.shape()[0] != x.shape()[0] ||
      grid.shape()[spatial + 1] != spatial)
    fail(op, "grid does not fit the input: got grid ", grid.type(), " for input ", x.type(),
         ", expected ", expected.str());
  if (!is_floating(x.dtype()) || grid.dtype() != x.dtype())
    fail(op, "bad dtypes: got input ", x.type(), " and grid ", grid.type(),
         ", expected one floating dtype");
}

}  // namespace

Tensor grid_sample(const Tensor& x, const Tensor& grid, const GridSampleOptions& o, Loc loc) {
  constexpr std::string_view op = "grid_sample";
  const detail::CallSite site(loc);
  expect_spatial(op, x, {2, 3});
  const int spatial = static_cast<int>(x.rank()) - 2;
  if (o.mode == GridSampleMode::bicubic && spatial == 3)
    fail(op, "bicubic needs a 4-d input: got ", x.type(), ", expected [N, C, H, W]");
  expect_grid(op, x, grid);
  const int64_t n = x.shape()[0], channels = x.shape()[1];
  std::vector<int64_t> out{n, channels};
  int64_t points = 1, plane = 1;
  for (int i = 0; i < spatial; ++i) {
    out.push_back(grid.shape()[i + 1]);
    points = detail::checked_mul(op, points, grid.shape()[i + 1]);
    plane = detail::checked_mul(op, plane, x.shape()[i + 2]);
  }
  const Tensor g = reshape(grid, Shape{n, points, spatial}, loc);
  // Every combination of the axes' taps (D, H, W; the last fastest): its flat index into the
  // plane, whether it is inside, and per axis the taps' weights.
  std::vector<Tap> corners;
  std::vector<std::vector<Tap>> axes;
  for (int i = 0; i < spatial; ++i) {
    // Grid component 0 is x (the last axis), 1 is y, 2 is z.
    const Tensor gi =
        reshape(take(g, tensor(std::vector<int64_t>{spatial - 1 - i}, Shape{1}), 2, loc),
                Shape{n, points}, loc);
    axes.push_back(axis_taps(gi, x.shape()[i + 2], o));
    if (i == 0) {
      corners = axes[0];
      continue;
    }
    std::vector<Tap> next;
    for (const Tap& c : corners)
      for (const Tap& t : axes.back())
        next.push_back({c.index * x.shape()[i + 2] + t.index, logical_and(c.inside, t.inside), {}});
    corners = std::move(next);
  }
  // Taps outside the input read a zero appended to each plane: cheaper than masking the
  // gathered values (taps times larger than the input).
  std::vector<Tensor> index;
  for (const Tap& c : corners)
    index.push_back(where(c.inside, c.index, full_like(c.index, static_cast<double>(plane)), loc));
  const Tensor planes =
      pad(reshape(x, Shape{n, channels, plane}, loc), {{0, 0}, {0, 0}, {0, 1}}, 0.0, loc);
  std::vector<int64_t> tap_dims{n, channels};
  for (const std::vector<Tap>& a : axes) tap_dims.push_back(static_cast<int64_t>(a.size()));
  tap_dims.push_back(points);
  const auto taps = static_cast<int64_t>(corners.size());
  Tensor v =
      reshape(take_along_axis(
                  planes, reshape(stack(index, 1, loc), Shape{n, 1, taps * points}, loc), 2, loc),
              Shape(tap_dims), loc);
  // Contract the taps axis by axis, the last axis first (PyTorch's order of the sums).
  for (int i = spatial - 1; i >= 0; --i) {
    const std::vector<Tap>& a = axes[static_cast<std::size_t>(i)];
    if (!a[0].weight) continue;  // nearest: one tap
    std::vector<Tensor> w;
    for (const Tap& t : a) w.push_back(*t.weight);
    std::vector<int64_t> w_dims(static_cast<std::size_t>(i + 4), 1);
    w_dims[0] = n;
    w_dims[static_cast<std::size_t>(i + 2)] = static_cast<int64_t>(a.size());
    w_dims.back() = points;
    v = sum(v * reshape(stack(w, 1, loc), Shape(w_dims), loc), {i + 2}, false, loc);
  }
  return reshape(v, Shape(out), loc);
}

namespace {

// PyTorch's linspace_from_neg_one: `steps` positions spanning [-1, 1] (align_corners) or
// shrunk by (steps - 1) / steps onto the pixel centres; {0} for one step.
std::vector<double> neg_one_to_one(int64_t steps, bool align_corners) {
  std::vector<double> v(static_cast<std::size_t>(steps), 0.0);
  for (int64_t i = 0; steps > 1 && i < steps; ++i) {
    const double p = -1.0 + 2.0 * static_cast<double>(i) / static_cast<double>(steps - 1);
    v[static_cast<std::size_t>(i)] =
        align_corners ? p : p * static_cast<double>(steps - 1) / static_cast<double>(steps);
  }
  return v;
}

}  // namespace

Tensor affine_grid(const Tensor& theta, const Shape& size, bool align_corners, Loc loc) {
  constexpr std::string_view op = "affine_grid";
  const detail::CallSite site(loc);
  if (size.rank() != 4 && size.rank() != 5)
    fail(op, "size must have 4 or 5 entries: got ", size,
         ", expected [N, C, H, W] or [N, C, D, H, W]");
  const int spatial = static_cast<int>(size.rank()) - 2;
  if (!theta.defined())
    fail(op, "undefined theta: got a default-constructed Tensor, expected a tensor");
  if (theta.rank() != 3 || theta.shape()[0] != size[0] || theta.shape()[1] != spatial ||
      theta.shape()[2] != spatial + 1 || !is_floating(theta.dtype()))
    fail(op, "theta does not fit size ", size, ": got ", theta.type(), ", expected a floating [",
         size[0], ", ", spatial, ", ", spatial + 1, "]");
  // The base grid [*spatial, spatial + 1]: (x, y, (z,) 1) at every output position.
  std::vector<std::vector<double>> along_axis;
  int64_t points = 1;
  for (int i = 0; i < spatial; ++i) {
    along_axis.push_back(neg_one_to_one(size[i + 2], align_corners));
    points = detail::checked_mul(op, points, size[i + 2]);
  }
  std::vector<double> base;
  base.reserve(static_cast<std::size_t>(detail::checked_mul(op, points, int64_t{spatial + 1})));
  for (int64_t p = 0; p < points; ++p) {
    std::vector<double> position(static_cast<std::size_t>(spatial));
    int64_t rest = p;
    for (int i = spatial - 1; i >= 0; --i) {
      const auto u = static_cast<std::size_t>(i);
      position[u] = along_axis[u][static_cast<std::size_t>(rest % size[i + 2])];
      rest /= size[i + 2];
    }
    base.insert(base.end(), position.rbegin(), position.rend());
    base.push_back(1.0);
  }
  const Tensor b = astype(tensor(base, Shape{points, spatial + 1}), theta.dtype(), loc);
  std::vector<int64_t> out{size[0]};
  for (int i = 0; i < spatial; ++i) out.push_back(size[i + 2]);
  out.push_back(spatial);
  return reshape(matmul(b, transpose(theta, {0, 2, 1}, loc), loc), Shape(out), loc);
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
