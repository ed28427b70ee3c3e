// The public poolings over 1, 2 or 3 spatial axes (NCW, NCHW, NCDHW), and unfold/fold (im2col
// and its transpose, on the same window tables). PyTorch's default 2-d
// options bind the max_pool2d/avg_pool2d primitives (src/ops/conv.cpp), as do 1-d poolings
// that are those on a [N, C, 1, W] image. Every other pooling (3-d, ceil_mode, dilation,
// indices, count_include_pad=false, divisor_override, adaptive max pooling) composes existing
// primitives: the windows' elements gathered by `take` through an index table computed here by
// PyTorch 1.13's window rules, a maximum chosen by `argmax` and read back by `take_along_axis`
// (so its gradient goes to that element alone, as PyTorch's), or a masked sum over a divisor.
// Their derivatives, batching and compilation are those of the parts.
#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

#include "core/allocator.h"
#include "detail/checked.h"
#include "kiln/ops.h"
#include "ops/primitives.h"
#include "ops/rules.h"

namespace kiln {
namespace {

// The windows along one spatial axis: `slots` input positions per output position (nullopt
// where a slot falls outside the input), and per window the sizes averaging divides by.
struct AxisWindows {
  int64_t in = 0, out = 0, slots = 0;
  std::vector<std::optional<int64_t>> pos;  // out * slots
  std::vector<int64_t> padded_count;        // within the padded input (count_include_pad)
  std::vector<int64_t> input_count;         // within the input
  // Per window, its first slot at or after position 0 (PyTorch's clamped start, which is
  // max pooling's index of a window wholly in the padding: it may lie past the input).
  std::vector<int64_t> first;
};

// A strided pooling's geometry per spatial axis.
struct PoolSpec {
  std::vector<int64_t> kernel, stride, padding, dilation;
  bool ceil_mode = false;
};

int64_t floor_div(int64_t a, int64_t b) { return a / b - (a % b != 0 && (a < 0) != (b < 0)); }

// A window table of `entries` elements must fit in memory, so that an absurd geometry (a huge
// output size, padding or kernel) is an Error rather than a failed allocation or a loop that
// does not end.
void expect_table_fits(std::string_view op, int64_t entries) {
  const auto limit = static_cast<int64_t>(
      std::min<std::size_t>(detail::physical_memory() / sizeof(int64_t), INT64_MAX));
  if (entries > limit)
    fail(op, "window table too large: got ", entries, " window slots, expected at most ", limit,
         " (the machine's memory)");
}

// PyTorch's pooling_output_shape: with ceil_mode the size rounds up, but the last window must
// start inside the input or the left padding.
AxisWindows strided_axis(std::string_view op, int64_t in, int64_t k, int64_t s, int64_t p,
                         int64_t d, bool ceil_mode) {
  const int64_t span = detail::checked_add(op, detail::checked_mul(op, d, k - 1), 1);
  const int64_t room = detail::checked_add(op, in, detail::checked_mul(op, 2, p)) - span;
  int64_t out = floor_div(ceil_mode ? detail::checked_add(op, room, s - 1) : room, s) + 1;
  if (ceil_mode && (out - 1) * s >= in + p) --out;
  if (out < 1)
    fail(op, "output size below 1: got input size ", in, " with kernel ", k, ", stride ", s,
         ", padding ", p, " and dilation ", d, ", expected an input of at least ", span - 2 * p);
  expect_table_fits(op, detail::checked_mul(op, out, k));
  AxisWindows w{in, out, k, {}, {}, {}, {}};
  w.pos.reserve(static_cast<std::size_t>(out * k));
  for (int64_t i = 0; i < out; ++i) {
    const int64_t start = i * s - p;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t q = detail::checked_add(op, start, j * d);
      w.pos.push_back(q >= 0 && q < in ? std::optional(q) : std::nullopt);
    }
    // Averaging's divisors (PyTorch's avg_pool kernels; averaging has no dilation).
    const int64_t end = std::min(detail::checked_add(op, start, k), in + p);
    w.padded_count.push_back(end - start);
    w.input_count.push_back(std::min(end, in) - std::max<int64_t>(start, 0));
    w.first.push_back(
        start < 0 ? detail::checked_add(op, start, detail::checked_mul(op, (-start - 1) / d + 1, d))
                  : start);
  }
  return w;
}

// Adaptive pooling: window i covers [floor(i * in / out), ceil((i + 1) * in / out)).
AxisWindows adaptive_axis(std::string_view op, int64_t in, int64_t out) {
  if (out < 1) fail(op, "non-positive output size: got ", out, ", expected sizes >= 1");
  expect_table_fits(op, out);
  (void)detail::checked_add(op, detail::checked_mul(op, out, in), out);  // bounds' arithmetic
  AxisWindows w{in, out, 0, {}, {}, {}, {}};
  auto bounds = [&](int64_t i) { return std::pair{i * in / out, ((i + 1) * in + out - 1) / out}; };
  for (int64_t i = 0; i < out; ++i) w.slots = std::max(w.slots, bounds(i).second - bounds(i).first);
  expect_table_fits(op, detail::checked_mul(op, out, w.slots));
  w.pos.reserve(static_cast<std::size_t>(out * w.slots));
  for (int64_t i = 0; i < out; ++i) {
    const auto [start, end] = bounds(i);
    for (int64_t j = 0; j < w.slots; ++j)
      w.pos.push_back(start + j < end ? std::optional(start + j) : std::nullopt);
    w.padded_count.push_back(end - start);
    w.input_count.push_back(end - start);
    w.first.push_back(start);
  }
  return w;
}

// The windows over all spatial axes, row-major in both the outputs and the slots (PyTorch's
// scan order, which decides among equal maxima): slot k of output l reads input element
// index[l * slots + k] of its plane when inside[...] holds (index 0 otherwise).
struct Windows {
  Shape out;  // the spatial output shape
  int64_t count = 1, slots = 1;
  std::vector<int64_t> index;
  std::vector<bool> inside;
  std::vector<double> padded_count, input_count;  // per output
  std::vector<int64_t> first;                     // per output: the axes' `first`, flat
};

Windows combine(std::string_view op, const std::vector<AxisWindows>& axes) {
  Windows t;
  for (const AxisWindows& a : axes) {
    t.out.dims().push_back(a.out);
    t.count = detail::checked_mul(op, t.count, a.out);
    t.slots = detail::checked_mul(op, t.slots, a.slots);
  }
  expect_table_fits(op, detail::checked_mul(op, t.count, t.slots));
  const auto n = static_cast<std::size_t>(t.count * t.slots);
  t.index.assign(n, 0);
  t.inside.assign(n, true);
  t.padded_count.assign(static_cast<std::size_t>(t.count), 1.0);
  t.input_count.assign(static_cast<std::size_t>(t.count), 1.0);
  t.first.assign(static_cast<std::size_t>(t.count), 0);
  // Axis by axis: the flat input index and output counts of the axes so far, outer first.
  int64_t outer_outs = 1, outer_slots = 1;
  for (const AxisWindows& a : axes) {
    const int64_t inner_outs = t.count / (outer_outs * a.out);
    const int64_t inner_slots = t.slots / (outer_slots * a.slots);
    for (std::size_t e = 0; e < n; ++e) {
      const auto l = static_cast<int64_t>(e) / t.slots, k = static_cast<int64_t>(e) % t.slots;
      const auto i = static_cast<std::size_t>((l / inner_outs) % a.out);
      const auto j = static_cast<std::size_t>((k / inner_slots) % a.slots);
      const std::optional<int64_t> q = a.pos[i * static_cast<std::size_t>(a.slots) + j];
      t.index[e] = t.index[e] * a.in + q.value_or(0);
      t.inside[e] = t.inside[e] && q.has_value();
    }
    for (std::size_t l = 0; l < t.padded_count.size(); ++l) {
      const auto i = static_cast<std::size_t>((static_cast<int64_t>(l) / inner_outs) % a.out);
      t.padded_count[l] *= static_cast<double>(a.padded_count[i]);
      t.input_count[l] *= static_cast<double>(a.input_count[i]);
      t.first[l] = t.first[l] * a.in + a.first[i];
    }
    outer_outs *= a.out;
    outer_slots *= a.slots;
  }
  return t;
}

// x defined and of rank `rank`, the layout naming its axes.
void expect_layout(std::string_view op, const Tensor& x, int rank, std::string_view layout) {
  if (!x.defined())
    fail(op, "undefined input: got a default-constructed Tensor, expected a tensor");
  if (x.rank() != rank)
    fail(op, "input must have rank ", rank, ": got ", x.type(), ", expected ", layout);
}

// x [N, C, *spatial] must have windows to read: no spatial axis may be empty (PyTorch's).
void expect_spatial(std::string_view op, const Tensor& x) {
  for (int i = 2; i < x.rank(); ++i)
    if (x.shape()[i] == 0)
      fail(op, "empty spatial axis: got input ", x.type(), ", expected spatial sizes >= 1");
}

// x [N, C, *spatial] with `rank` spatial axes, each non-empty, as floating point.
Tensor pool_input(std::string_view op, const Tensor& x, int rank, Loc loc) {
  static constexpr std::array layouts{"[N, C, W]", "[N, C, H, W]", "[N, C, D, H, W]"};
  expect_layout(op, x, rank + 2, layouts[static_cast<std::size_t>(rank - 1)]);
  expect_spatial(op, x);
  return ops::cast_if_needed(x, to_floating(x.dtype()), loc);
}

// The windows of `s` over the spatial sizes `in`.
std::vector<AxisWindows> strided_axes(std::string_view op, const std::vector<int64_t>& in,
                                      const PoolSpec& s) {
  std::vector<AxisWindows> axes;
  for (std::size_t i = 0; i < s.kernel.size(); ++i) {
    const int64_t k = s.kernel[i], st = s.stride[i], p = s.padding[i], d = s.dilation[i];
    if (k < 1 || st < 1 || d < 1)
      fail(op, "non-positive kernel, stride or dilation: got kernel ", k, ", stride ", st,
           " and dilation ", d, " on spatial axis ", i, ", expected values >= 1");
    if (p < 0)
      fail(op, "negative padding: got ", p, " on spatial axis ", i, ", expected padding >= 0");
    axes.push_back(strided_axis(op, in[i], k, st, p, d, s.ceil_mode));
  }
  return axes;
}

// The adaptive windows of x [N, C, *spatial] for the spatial output sizes `size`.
std::vector<AxisWindows> adaptive_axes(std::string_view op, const Tensor& x,
                                       const std::vector<int64_t>& size) {
  std::vector<AxisWindows> axes;
  for (std::size_t i = 0; i < size.size(); ++i)
    axes.push_back(adaptive_axis(op, x.shape()[static_cast<int>(i) + 2], size[i]));
  return axes;
}

// A pooling's windows over x: padding at most half the kernel, as PyTorch's.
std::vector<AxisWindows> pool_axes(std::string_view op, const Tensor& x, const PoolSpec& s) {
  for (std::size_t i = 0; i < s.kernel.size(); ++i)
    if (s.kernel[i] >= 1 && s.padding[i] > s.kernel[i] / 2)
      fail(op, "padding larger than half the kernel: got padding ", s.padding[i], " for kernel ",
           s.kernel[i], " on spatial axis ", i, ", expected padding <= kernel / 2");
  const std::vector<int64_t>& dims = x.shape().dims();
  return strided_axes(op, {dims.begin() + 2, dims.end()}, s);
}

// x [N, C, *spatial] as [N, C, plane].
Tensor planes(const Tensor& x, Loc loc) {
  const Shape& s = x.shape();
  int64_t plane = 1;
  for (int i = 2; i < s.rank(); ++i) plane *= s[i];
  return reshape(x, Shape{s[0], s[1], plane}, loc);
}

// The windows' elements, [N, C, count, slots] (element 0 of the plane where outside).
Tensor gather(const Tensor& x, const Windows& t, Loc loc) {
  const Tensor g = take(planes(x, loc), tensor(t.index, Shape{t.count * t.slots}, loc), 2, loc);
  return reshape(g, Shape{x.shape()[0], x.shape()[1], t.count, t.slots}, loc);
}

Shape pooled_shape(const Tensor& x, const Windows& t) {
  Shape out{x.shape()[0], x.shape()[1]};
  for (const int64_t d : t.out) out.dims().push_back(d);
  return out;
}

// The first maximum of each window in scan order, or its last NaN (PyTorch's rule); padding
// never. The value is read back from x at that index, so the gradient flows to it alone. A
// window wholly in the padding (possible with dilation) is -inf at PyTorch's index, `first`.
MaxPoolResult max_over(const Tensor& x, const Windows& t, Loc loc) {
  const Tensor v = gather(x, t, loc);
  const Tensor inside = tensor(t.inside, Shape{t.count, t.slots}, loc);
  const Tensor peak = max(where(inside, v, scalar_like(v, -INFINITY), loc), {3}, true, loc);
  // One argmax over keys: a NaN slot k scores slots + k (the last wins), a maximum
  // slots - k (the first wins), anything else 0.
  std::vector<int64_t> nan_key, max_key;
  for (int64_t k = 0; k < t.slots; ++k) {
    nan_key.push_back(t.slots + k);
    max_key.push_back(t.slots - k);
  }
  const Shape slots{t.slots};
  const Tensor none = zeros(Shape{}, int64);
  const Tensor key = where(inside && isnan(v, loc), tensor(nan_key, slots, loc),
                           where(inside && v == peak, tensor(max_key, slots, loc), none, loc), loc);
  const Tensor slot = argmax(key, 3, false, loc);
  const Tensor row_starts =
      arange(0.0, static_cast<double>(t.count * t.slots), static_cast<double>(t.slots), int64, loc);
  const Tensor chosen =
      take(tensor(t.index, Shape{t.count * t.slots}, loc), slot + row_starts, 0, loc);
  const Tensor filled = any(inside, {1}, false, loc);
  const Tensor values = take_along_axis(planes(x, loc), chosen, 2, loc);
  const Shape out = pooled_shape(x, t);
  return {reshape(where(filled, values, scalar_like(values, -INFINITY), loc), out, loc),
          reshape(where(filled, chosen, tensor(t.first, Shape{t.count}, loc), loc), out, loc)};
}

// Window sums over a divisor per window.
Tensor average_over(const Tensor& x, const Windows& t, const std::vector<double>& divisor,
                    Loc loc) {
  const Tensor v = gather(x, t, loc);
  const Tensor inside = tensor(t.inside, Shape{t.count, t.slots}, loc);
  const Tensor sums = sum(where(inside, v, scalar_like(v, 0.0), loc), {3}, false, loc);
  const Tensor d = astype(tensor(divisor, Shape{t.count}, loc), v.dtype(), loc);
  return reshape(sums / d, pooled_shape(x, t), loc);
}

// The options of a public pooling of any rank, one value per spatial axis.
struct PoolArgs {
  PoolSpec spec;
  bool count_include_pad = true;
  std::optional<int64_t> divisor_override;
};

std::string pool_name(std::string_view stem, std::size_t rank) {
  return std::string(stem) + std::to_string(rank) + "d";
}

MaxPoolResult max_pool_nd(const Tensor& x_in, const PoolSpec& s, Loc loc) {
  const std::string op = pool_name("max_pool", s.kernel.size());
  const Tensor x = pool_input(op, x_in, static_cast<int>(s.kernel.size()), loc);
  return max_over(x, combine(op, pool_axes(op, x, s)), loc);
}

Tensor avg_pool_nd(const Tensor& x_in, const PoolArgs& a, Loc loc) {
  const std::string op = pool_name("avg_pool", a.spec.kernel.size());
  const Tensor x = pool_input(op, x_in, static_cast<int>(a.spec.kernel.size()), loc);
  for (const int64_t d : a.spec.dilation)
    if (d != 1) fail(op, "dilation: got ", d, ", expected 1 (average pooling has none)");
  if (a.divisor_override && *a.divisor_override == 0)
    fail(op, "divisor_override of 0: got 0, expected a non-zero divisor");
  const Windows t = combine(op, pool_axes(op, x, a.spec));
  std::vector<double> divisor = a.count_include_pad ? t.padded_count : t.input_count;
  if (a.divisor_override) std::fill(divisor.begin(), divisor.end(), *a.divisor_override);
  return average_over(x, t, divisor, loc);
}

// Whether the max_pool2d/avg_pool2d primitives compute this pooling: PyTorch's defaults for
// the other options.
bool primitive_pools(const PoolArgs& a) {
  return !a.spec.ceil_mode && !a.divisor_override && a.count_include_pad &&
         std::all_of(a.spec.dilation.begin(), a.spec.dilation.end(),
                     [](int64_t d) { return d == 1; });
}

Tensor bind_pool(const Primitive& p, const Tensor& x, const PoolSpec& s, Loc loc) {
  if (!x.defined())
    fail(p.name, "undefined input: got a default-constructed Tensor, expected a tensor");
  const Attrs attrs{{"kernel", s.kernel}, {"stride", s.stride}, {"padding", s.padding}};
  return bind1(p, {ops::cast_if_needed(x, to_floating(x.dtype()), loc)}, attrs, loc);
}

PoolArgs args_of(const Pool1dOptions& o) {
  return {{{o.kernel}, {o.stride.value_or(o.kernel)}, {o.padding}, {o.dilation}, o.ceil_mode},
          o.count_include_pad,
          std::nullopt};
}
PoolArgs args_of(const Pool2dOptions& o) {
  const auto stride = o.stride.value_or(o.kernel);
  return {{{o.kernel.first, o.kernel.second},
           {stride.first, stride.second},
           {o.padding.first, o.padding.second},
           {o.dilation.first, o.dilation.second},
           o.ceil_mode},
          o.count_include_pad,
          o.divisor_override};
}
PoolArgs args_of(const Pool3dOptions& o) {
  auto v = [](const std::array<int64_t, 3>& a) { return std::vector<int64_t>(a.begin(), a.end()); };
  return {{v(o.kernel), v(o.stride.value_or(o.kernel)), v(o.padding), v(o.dilation), o.ceil_mode},
          o.count_include_pad,
          o.divisor_override};
}

// A 1-d pooling as the 2-d one of [N, C, 1, W] with a 1-wide kernel row.
PoolSpec as_2d(const PoolSpec& s) {
  return {{1, s.kernel[0]}, {1, s.stride[0]}, {0, s.padding[0]}, {1, s.dilation[0]}, s.ceil_mode};
}
Tensor unsqueeze_row(const Tensor& x, Loc loc) {
  const Shape& s = x.shape();
  return reshape(x, Shape{s[0], s[1], 1, s[2]}, loc);
}
Tensor squeeze_row(const Tensor& y, Loc loc) {
  const Shape& s = y.shape();
  return reshape(y, Shape{s[0], s[1], s[3]}, loc);
}

// A 1-d pooling by the 2-d primitive p on [N, C, 1, W]. The geometry is checked here first, so
// that its errors name the 1-d call and give its own sizes, not the 2-d ones.
Tensor pool1d_by_primitive(const Primitive& p, std::string_view op, const Tensor& x_in,
                           const PoolSpec& s, Loc loc) {
  const Tensor x = pool_input(op, x_in, 1, loc);
  (void)pool_axes(op, x, s);
  return squeeze_row(bind_pool(p, unsqueeze_row(x, loc), as_2d(s), loc), loc);
}

MaxPoolResult adaptive_max_nd(std::string_view stem, const Tensor& x_in,
                              const std::vector<int64_t>& size, Loc loc) {
  const std::string op = pool_name(stem, size.size());
  const Tensor x = pool_input(op, x_in, static_cast<int>(size.size()), loc);
  return max_over(x, combine(op, adaptive_axes(op, x, size)), loc);
}

PoolSpec unfold_spec(const UnfoldOptions& o) {
  return {{o.kernel.first, o.kernel.second},
          {o.stride.first, o.stride.second},
          {o.padding.first, o.padding.second},
          {o.dilation.first, o.dilation.second},
          false};
}

}  // namespace

Tensor max_pool2d(const Tensor& x, const Pool2dOptions& o, Loc loc) {
  const detail::CallSite site(loc);
  const PoolArgs a = args_of(o);
  if (primitive_pools(a)) return bind_pool(prim::max_pool2d(), x, a.spec, loc);
  return max_pool_nd(x, a.spec, loc).values;
}
Tensor avg_pool2d(const Tensor& x, const Pool2dOptions& o, Loc loc) {
  const detail::CallSite site(loc);
  const PoolArgs a = args_of(o);
  if (primitive_pools(a)) return bind_pool(prim::avg_pool2d(), x, a.spec, loc);
  return avg_pool_nd(x, a, loc);
}
MaxPoolResult max_pool2d_with_indices(const Tensor& x, const Pool2dOptions& o, Loc loc) {
  const detail::CallSite site(loc);
  return max_pool_nd(x, args_of(o).spec, loc);
}

Tensor max_pool1d(const Tensor& x_in, const Pool1dOptions& o, Loc loc) {
  const detail::CallSite site(loc);
  const PoolArgs a = args_of(o);
  if (!primitive_pools(a)) return max_pool_nd(x_in, a.spec, loc).values;
  return pool1d_by_primitive(prim::max_pool2d(), "max_pool1d", x_in, a.spec, loc);
}
Tensor avg_pool1d(const Tensor& x_in, const Pool1dOptions& o, Loc loc) {
  const detail::CallSite site(loc);
  const PoolArgs a = args_of(o);
  if (!primitive_pools(a)) return avg_pool_nd(x_in, a, loc);
  return pool1d_by_primitive(prim::avg_pool2d(), "avg_pool1d", x_in, a.spec, loc);
}
MaxPoolResult max_pool1d_with_indices(const Tensor& x, const Pool1dOptions& o, Loc loc) {
  const detail::CallSite site(loc);
  return max_pool_nd(x, args_of(o).spec, loc);
}

Tensor max_pool3d(const Tensor& x, const Pool3dOptions& o, Loc loc) {
  const detail::CallSite site(loc);
  return max_pool_nd(x, args_of(o).spec, loc).values;
}
Tensor avg_pool3d(const Tensor& x, const Pool3dOptions& o, Loc loc) {
  const detail::CallSite site(loc);
  return avg_pool_nd(x, args_of(o), loc);
}
MaxPoolResult max_pool3d_with_indices(const Tensor& x, const Pool3dOptions& o, Loc loc) {
  const detail::CallSite site(loc);
  return max_pool_nd(x, args_of(o).spec, loc);
}

MaxPoolResult adaptive_max_pool1d_with_indices(const Tensor& x, int64_t size, Loc loc) {
  const detail::CallSite site(loc);
  return adaptive_max_nd("adaptive_max_pool", x, {size}, loc);
}
MaxPoolResult adaptive_max_pool2d_with_indices(const Tensor& x, std::pair<int64_t, int64_t> size,
                                               Loc loc) {
  const detail::CallSite site(loc);
  return adaptive_max_nd("adaptive_max_pool", x, {size.first, size.second}, loc);
}
MaxPoolResult adaptive_max_pool3d_with_indices(const Tensor& x, std::array<int64_t, 3> size,
                                               Loc loc) {
  const detail::CallSite site(loc);
  return adaptive_max_nd("adaptive_max_pool", x, {size.begin(), size.end()}, loc);
}
Tensor adaptive_max_pool1d(const Tensor& x, int64_t size, Loc loc) {
  return adaptive_max_pool1d_with_indices(x, size, loc).values;
}
Tensor adaptive_max_pool2d(const Tensor& x, std::pair<int64_t, int64_t> size, Loc loc) {
  return adaptive_max_pool2d_with_indices(x, size, loc).values;
}
Tensor adaptive_max_pool3d(const Tensor& x, std::array<int64_t, 3> size, Loc loc) {
  return adaptive_max_pool3d_with_indices(x, size, loc).values;
}

Tensor adaptive_avg_pool1d(const Tensor& x_in, int64_t size, Loc loc) {
  const detail::CallSite site(loc);
  const Tensor x = pool_input("adaptive_avg_pool1d", x_in, 1, loc);
  return squeeze_row(adaptive_avg_pool2d(unsqueeze_row(x, loc), {1, size}, loc), loc);
}
Tensor adaptive_avg_pool3d(const Tensor& x_in, std::array<int64_t, 3> size, Loc loc) {
  const detail::CallSite site(loc);
  constexpr std::string_view op = "adaptive_avg_pool3d";
  const Tensor x = pool_input(op, x_in, 3, loc);
  const Windows t = combine(op, adaptive_axes(op, x, {size.begin(), size.end()}));
  return average_over(x, t, t.input_count, loc);
}

Tensor unfold(const Tensor& x_in, const UnfoldOptions& o, Loc loc) {
  const detail::CallSite site(loc);
  constexpr std::string_view op = "unfold";
  expect_layout(op, x_in, 4, "[N, C, H, W]");
  expect_spatial(op, x_in);
  const Shape& s = x_in.shape();
  const Windows t = combine(op, strided_axes(op, {s[2], s[3]}, unfold_spec(o)));
  const Tensor v = gather(x_in, t, loc);
  const Tensor inside = tensor(t.inside, Shape{t.count, t.slots}, loc);
  const Tensor cols = transpose(where(inside, v, zeros_like(v), loc), {0, 1, 3, 2}, loc);
  return reshape(cols, Shape{s[0], detail::checked_mul(op, s[1], t.slots), t.count}, loc);
}

Tensor fold(const Tensor& x, std::pair<int64_t, int64_t> size, const UnfoldOptions& o, Loc loc) {
  const detail::CallSite site(loc);
  constexpr std::string_view op = "fold";
  expect_layout(op, x, 3, "[N, C * KH * KW, L]");
  if (size.first < 1 || size.second < 1)
    fail(op, "non-positive output size: got [", size.first, ", ", size.second,
         "], expected sizes >= 1");
  const int64_t plane = detail::checked_mul(op, size.first, size.second);
  const Windows t = combine(op, strided_axes(op, {size.first, size.second}, unfold_spec(o)));
  const Shape& s = x.shape();
  if (s[1] % t.slots != 0 || s[2] != t.count)
    fail(op, "input does not match the windows: got ", x.type(), " for ", t.slots,
         "-element windows at ", t.count, " positions, expected [N, C * ", t.slots, ", ", t.count,
         "]");
  const int64_t n = s[0], c = s[1] / t.slots;
  const Tensor v = transpose(reshape(x, Shape{n, c, t.slots, t.count}, loc), {0, 1, 3, 2}, loc);
  const Tensor inside = tensor(t.inside, Shape{t.count, t.slots}, loc);
  const Tensor updates =
      reshape(where(inside, v, zeros_like(v), loc), Shape{n, c, t.count * t.slots}, loc);
  const Tensor index = tensor(t.index, Shape{t.count * t.slots}, loc);
  const Tensor sums = scatter_add(zeros(Shape{n, c, plane}, x.dtype()), index, updates, 2, loc);
  return reshape(sums, Shape{n, c, size.first, size.second}, loc);
}

}  // namespace kiln
