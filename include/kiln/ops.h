// Tensor operations. Each is a primitive (or a composition of primitives), so it runs eagerly
// now and records into IR under a trace. Binary operations broadcast (numpy rules) and promote
// dtypes (docs/DESIGN.md); C++ arithmetic scalars are weakly typed: `x * 2.0` keeps x's dtype.
#pragma once

#include <array>
#include <concepts>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/tensor.h"

namespace kiln {

using Axes = std::vector<int64_t>;

// ---- elementwise, unary -------------------------------------------------------
Tensor neg(const Tensor& x, Loc loc = Loc::current());
Tensor abs(const Tensor& x, Loc loc = Loc::current());
Tensor sign(const Tensor& x, Loc loc = Loc::current());
Tensor exp(const Tensor& x, Loc loc = Loc::current());
Tensor log(const Tensor& x, Loc loc = Loc::current());
Tensor log1p(const Tensor& x, Loc loc = Loc::current());
Tensor expm1(const Tensor& x, Loc loc = Loc::current());
Tensor sqrt(const Tensor& x, Loc loc = Loc::current());
Tensor rsqrt(const Tensor& x, Loc loc = Loc::current());
Tensor sin(const Tensor& x, Loc loc = Loc::current());
Tensor cos(const Tensor& x, Loc loc = Loc::current());
Tensor tan(const Tensor& x, Loc loc = Loc::current());
Tensor tanh(const Tensor& x, Loc loc = Loc::current());
Tensor sigmoid(const Tensor& x, Loc loc = Loc::current());
Tensor erf(const Tensor& x, Loc loc = Loc::current());
Tensor floor(const Tensor& x, Loc loc = Loc::current());
Tensor ceil(const Tensor& x, Loc loc = Loc::current());
Tensor round(const Tensor& x, Loc loc = Loc::current());  // half to even, like numpy
Tensor square(const Tensor& x, Loc loc = Loc::current());
Tensor logical_not(const Tensor& x, Loc loc = Loc::current());
Tensor isnan(const Tensor& x, Loc loc = Loc::current());
Tensor astype(const Tensor& x, DType dtype, Loc loc = Loc::current());

// ---- complex numbers (complex64, complex128) ---------------------------------------
// re + i im; the parts broadcast and promote to float32 or float64 (complex64 or complex128).
Tensor complex(const Tensor& re, const Tensor& im, Loc loc = Loc::current());
// The parts of a complex tensor; of a real one, numpy's answers: x itself and zeros.
Tensor real(const Tensor& x, Loc loc = Loc::current());
Tensor imag(const Tensor& x, Loc loc = Loc::current());
Tensor conj(const Tensor& x, Loc loc = Loc::current());  // x itself for a real x
// The argument in (-pi, pi]: atan2(imag, real); 0 or pi for real inputs.
Tensor angle(const Tensor& x, Loc loc = Loc::current());

// ---- elementwise, binary (broadcasting, promoting) ------------------------------
Tensor add(const Tensor& a, const Tensor& b, Loc loc = Loc::current());
Tensor sub(const Tensor& a, const Tensor& b, Loc loc = Loc::current());
Tensor mul(const Tensor& a, const Tensor& b, Loc loc = Loc::current());
// Floats: true division. Integers: truncating division; a zero divisor raises Error.
Tensor div(const Tensor& a, const Tensor& b, Loc loc = Loc::current());
Tensor pow(const Tensor& a, const Tensor& b, Loc loc = Loc::current());
Tensor maximum(const Tensor& a, const Tensor& b, Loc loc = Loc::current());
Tensor minimum(const Tensor& a, const Tensor& b, Loc loc = Loc::current());
Tensor clip(const Tensor& x, const Tensor& lo, const Tensor& hi, Loc loc = Loc::current());
Tensor clip(const Tensor& x, double lo, double hi, Loc loc = Loc::current());
Tensor equal(const Tensor& a, const Tensor& b, Loc loc = Loc::current());
Tensor not_equal(const Tensor& a, const Tensor& b, Loc loc = Loc::current());
Tensor less(const Tensor& a, const Tensor& b, Loc loc = Loc::current());
Tensor less_equal(const Tensor& a, const Tensor& b, Loc loc = Loc::current());
Tensor greater(const Tensor& a, const Tensor& b, Loc loc = Loc::current());
Tensor greater_equal(const Tensor& a, const Tensor& b, Loc loc = Loc::current());
Tensor logical_and(const Tensor& a, const Tensor& b, Loc loc = Loc::current());
Tensor logical_or(const Tensor& a, const Tensor& b, Loc loc = Loc::current());
Tensor logical_xor(const Tensor& a, const Tensor& b, Loc loc = Loc::current());
// Elementwise choice; cond must be bool. x and y broadcast and promote.
Tensor where(const Tensor& cond, const Tensor& x, const Tensor& y, Loc loc = Loc::current());

// A weakly typed C++ scalar as a 0-d tensor of the dtype it takes next to `like`.
Tensor scalar_like(const Tensor& like, double value, bool is_floating = true);
template <typename S>
Tensor weak(const Tensor& like, S s) {
  return scalar_like(like, static_cast<double>(s), std::is_floating_point_v<S>);
}

// ---- reductions (axes empty = all axes) -------------------------------------------
Tensor sum(const Tensor& x, const Axes& axes = {}, bool keepdims = false, Loc loc = Loc::current());
Tensor mean(const Tensor& x, const Axes& axes = {}, bool keepdims = false,
            Loc loc = Loc::current());
Tensor prod(const Tensor& x, const Axes& axes = {}, bool keepdims = false,
            Loc loc = Loc::current());
Tensor max(const Tensor& x, const Axes& axes = {}, bool keepdims = false, Loc loc = Loc::current());
Tensor min(const Tensor& x, const Axes& axes = {}, bool keepdims = false, Loc loc = Loc::current());
Tensor logsumexp(const Tensor& x, const Axes& axes = {}, bool keepdims = false,
                 Loc loc = Loc::current());
// Variance with `ddof` delta degrees of freedom (0: population variance, like numpy).
Tensor var(const Tensor& x, const Axes& axes = {}, bool keepdims = false, int64_t ddof = 0,
           Loc loc = Loc::current());
// numpy's NaN-ignoring reductions: NaN elements are left out (a sum of none is 0, a product
// 1; a mean, variance, max or min of none is NaN). Their derivative is 0 at the NaN elements.
// Integers and bools have no NaN: these are then sum, prod, ... themselves.
Tensor nansum(const Tensor& x, const Axes& axes = {}, bool keepdims = false,
              Loc loc = Loc::current());
Tensor nanprod(const Tensor& x, const Axes& axes = {}, bool keepdims = false,
               Loc loc = Loc::current());
Tensor nanmean(const Tensor& x, const Axes& axes = {}, bool keepdims = false,
               Loc loc = Loc::current());
Tensor nanmax(const Tensor& x, const Axes& axes = {}, bool keepdims = false,
              Loc loc = Loc::current());
Tensor nanmin(const Tensor& x, const Axes& axes = {}, bool keepdims = false,
              Loc loc = Loc::current());
Tensor nanvar(const Tensor& x, const Axes& axes = {}, bool keepdims = false, int64_t ddof = 0,
              Loc loc = Loc::current());
Tensor nanstd(const Tensor& x, const Axes& axes = {}, bool keepdims = false, int64_t ddof = 0,
              Loc loc = Loc::current());
Tensor any(const Tensor& x, const Axes& axes = {}, bool keepdims = false, Loc loc = Loc::current());
Tensor all(const Tensor& x, const Axes& axes = {}, bool keepdims = false, Loc loc = Loc::current());
// Index (int64) of the first maximum/minimum along one axis; nullopt flattens first.
Tensor argmax(const Tensor& x, std::optional<int64_t> axis = std::nullopt, bool keepdims = false,
              Loc loc = Loc::current());
Tensor argmin(const Tensor& x, std::optional<int64_t> axis = std::nullopt, bool keepdims = false,
              Loc loc = Loc::current());

Tensor softmax(const Tensor& x, int64_t axis = -1, Loc loc = Loc::current());
Tensor log_softmax(const Tensor& x, int64_t axis = -1, Loc loc = Loc::current());

// ---- linear algebra ----------------------------------------------------------------
// numpy matmul semantics: 1-d operands are promoted and the added axis removed; batch axes
// broadcast. float32 runs through oneDNN or OpenBLAS (runtime_info(), include/kiln/runtime.h),
// float64 and complex through OpenBLAS.
Tensor matmul(const Tensor& a, const Tensor& b, Loc loc = Loc::current());

// ---- shapes and views (views share storage; see docs/DESIGN.md) --------------------
// One dimension may be -1 (inferred). A view when x is contiguous, else a copy.
Tensor reshape(const Tensor& x, const Shape& shape, Loc loc = Loc::current());
Tensor flatten(const Tensor& x, Loc loc = Loc::current());  // to 1-d
// Reverses the axes (no permutation given) or permutes them.
Tensor transpose(const Tensor& x, Loc loc = Loc::current());
Tensor transpose(const Tensor& x, const Axes& perm, Loc loc = Loc::current());
Tensor permute(const Tensor& x, const Axes& perm, Loc loc = Loc::current());
Tensor swapaxes(const Tensor& x, int64_t a, int64_t b, Loc loc = Loc::current());
Tensor moveaxis(const Tensor& x, int64_t from, int64_t to, Loc loc = Loc::current());
Tensor broadcast_to(const Tensor& x, const Shape& shape, Loc loc = Loc::current());
Tensor expand_dims(const Tensor& x, int64_t axis, Loc loc = Loc::current());
// Removes the given size-1 axes, or all of them.
Tensor squeeze(const Tensor& x, const Axes& axes = {}, Loc loc = Loc::current());

// A slice of one axis: [start, stop) with step; negative start/stop count from the end,
// omitted ones mean the whole axis (as in Python, step may be negative).
struct Slice {
  std::optional<int64_t> start, stop;
  int64_t step = 1;
};
// Slices the leading axes, one Slice each; the rest are kept whole. A view.
Tensor slice(const Tensor& x, const std::vector<Slice>& slices, Loc loc = Loc::current());
// x[index] along axis 0 (negative counts from the end); a view with one axis fewer.
Tensor index(const Tensor& x, int64_t i, Loc loc = Loc::current());

Tensor concatenate(const std::vector<Tensor>& xs, int64_t axis = 0, Loc loc = Loc::current());
Tensor stack(const std::vector<Tensor>& xs, int64_t axis = 0, Loc loc = Loc::current());
// Splits into `sections` equal parts, or at the given indices.
std::vector<Tensor> split(const Tensor& x, int64_t sections, int64_t axis = 0,
                          Loc loc = Loc::current());
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& indices, int64_t axis,
                          Loc loc = Loc::current());
Tensor flip(const Tensor& x, const Axes& axes = {}, Loc loc = Loc::current());
// Constant padding, (before, after) per axis.
Tensor pad(const Tensor& x, const std::vector<std::pair<int64_t, int64_t>>& widths,
           double value = 0.0, Loc loc = Loc::current());

// ---- gather and scatter ----------------------------------------------------------
// Selects along `axis` with integer indices of any shape (numpy.take; out of range raises).
Tensor take(const Tensor& x, const Tensor& indices, int64_t axis = 0, Loc loc = Loc::current());
Tensor take_along_axis(const Tensor& x, const Tensor& indices, int64_t axis,
                       Loc loc = Loc::current());
// Returns a copy of x with updates added at indices along axis (the transpose of take).
Tensor scatter_add(const Tensor& x, const Tensor& indices, const Tensor& updates, int64_t axis = 0,
                   Loc loc = Loc::current());
Tensor one_hot(const Tensor& labels, int64_t num_classes, DType dtype = float32,
               Loc loc = Loc::current());

// ---- convolution and pooling (NCHW) ---------------------------------------------
// PyTorch's string paddings of a convolution: `valid` pads nothing; `same` keeps each spatial
// size (stride 1 only) by padding dilation * (k - 1) per axis, half before and the rest after.
enum class PaddingRule { valid, same };
// One size per spatial axis of an N-d convolution: int64_t, a pair or an array of 3.
template <int N>
using ConvSizes = std::conditional_t<
    N == 1, int64_t,
    std::conditional_t<N == 2, std::pair<int64_t, int64_t>, std::array<int64_t, 3>>>;
// A convolution's padding: one size per spatial axis (added on both sides), or a rule.
template <int N>
struct ConvPadding {
  using Sizes = ConvSizes<N>;
  Sizes sizes{};
  std::optional<PaddingRule> rule;  // when set, it decides and sizes are not used
  ConvPadding() = default;
  ConvPadding(Sizes s) : sizes(s) {}
  ConvPadding(PaddingRule r) : rule(r) {}
  // {1, 2} for a pair, {1, 2, 3} for an array.
  template <std::integral... I>
  requires(N > 1 && sizeof...(I) == N) ConvPadding(I... s) : sizes{static_cast<int64_t>(s)...} {}
  // Sizes count only without a rule.
  friend bool operator==(const ConvPadding& a, const ConvPadding& b) {
    return a.rule == b.rule && (a.rule || a.sizes == b.sizes);
  }
};
// Every convolution takes an optional bias [O], added to each output channel. Inputs may also
// be unbatched, without the N axis ([C, H, W] for conv2d); so is the result then.
struct Conv2dOptions {
  std::pair<int64_t, int64_t> stride{1, 1};
  ConvPadding<2> padding{};
  std::pair<int64_t, int64_t> dilation{1, 1};
  int64_t groups = 1;
  std::optional<Tensor> bias;
};
// x: [N, C, H, W], w: [O, C/groups, KH, KW].
Tensor conv2d(const Tensor& x, const Tensor& w, const Conv2dOptions& options = {},
              Loc loc = Loc::current());
// PyTorch's pooling options. ceil_mode rounds the output size up, but the last window must
// start inside the input or the left padding. dilation is max pooling's only;
// count_include_pad and divisor_override average pooling's.
struct Pool2dOptions {
  std::pair<int64_t, int64_t> kernel{2, 2};
  std::optional<std::pair<int64_t, int64_t>> stride;  // defaults to the kernel size
  std::pair<int64_t, int64_t> padding{0, 0};
  std::pair<int64_t, int64_t> dilation{1, 1};
  bool ceil_mode = false;
  bool count_include_pad = true;
  std::optional<int64_t> divisor_override;
};
Tensor max_pool2d(const Tensor& x, const Pool2dOptions& options = {}, Loc loc = Loc::current());
Tensor avg_pool2d(const Tensor& x, const Pool2dOptions& options = {}, Loc loc = Loc::current());
// A max pooling's values and, per element, the flat index of the chosen input element within
// its [*spatial] plane (int64; PyTorch's return_indices).
struct MaxPoolResult {
  Tensor values;
  Tensor indices;
};
MaxPoolResult max_pool2d_with_indices(const Tensor& x, const Pool2dOptions& options = {},
                                      Loc loc = Loc::current());
// 1-d (x [N, C, W]) and 3-d (x [N, C, D, H, W]) pooling with the options of Pool2dOptions
// (divisor_override: 3-d only, as PyTorch).
struct Pool1dOptions {
  int64_t kernel = 2;
  std::optional<int64_t> stride;
  int64_t padding = 0;
  int64_t dilation = 1;
  bool ceil_mode = false;
  bool count_include_pad = true;
};
struct Pool3dOptions {
  std::array<int64_t, 3> kernel{2, 2, 2};
  std::optional<std::array<int64_t, 3>> stride;
  std::array<int64_t, 3> padding{0, 0, 0};
  std::array<int64_t, 3> dilation{1, 1, 1};
  bool ceil_mode = false;
  bool count_include_pad = true;
  std::optional<int64_t> divisor_override;
};
Tensor max_pool1d(const Tensor& x, const Pool1dOptions& options = {}, Loc loc = Loc::current());
Tensor avg_pool1d(const Tensor& x, const Pool1dOptions& options = {}, Loc loc = Loc::current());
MaxPoolResult max_pool1d_with_indices(const Tensor& x, const Pool1dOptions& options = {},
                                      Loc loc = Loc::current());
Tensor max_pool3d(const Tensor& x, const Pool3dOptions& options = {}, Loc loc = Loc::current());
Tensor avg_pool3d(const Tensor& x, const Pool3dOptions& options = {}, Loc loc = Loc::current());
MaxPoolResult max_pool3d_with_indices(const Tensor& x, const Pool3dOptions& options = {},
                                      Loc loc = Loc::current());
// Maxima over windows [floor(i * in / out), ceil((i + 1) * in / out)) per axis (PyTorch's
// adaptive_max_poolNd).
Tensor adaptive_max_pool1d(const Tensor& x, int64_t output_size, Loc loc = Loc::current());
Tensor adaptive_max_pool2d(const Tensor& x, std::pair<int64_t, int64_t> output_size,
                           Loc loc = Loc::current());
Tensor adaptive_max_pool3d(const Tensor& x, std::array<int64_t, 3> output_size,
                           Loc loc = Loc::current());
MaxPoolResult adaptive_max_pool1d_with_indices(const Tensor& x, int64_t output_size,
                                               Loc loc = Loc::current());
MaxPoolResult adaptive_max_pool2d_with_indices(const Tensor& x,
                                               std::pair<int64_t, int64_t> output_size,
                                               Loc loc = Loc::current());
MaxPoolResult adaptive_max_pool3d_with_indices(const Tensor& x, std::array<int64_t, 3> output_size,
                                               Loc loc = Loc::current());

// ---- convolutions and resampling: 1d/3d, transposed, adaptive, interpolate -------------
// As conv2d over NCW (x [N, C, W], w [O, C/groups, KW]) and NCDHW (x [N, C, D, H, W],
// w [O, C/groups, KD, KH, KW]).
struct Conv1dOptions {
  int64_t stride = 1;
  ConvPadding<1> padding{};
  int64_t dilation = 1;
  int64_t groups = 1;
  std::optional<Tensor> bias;
};
Tensor conv1d(const Tensor& x, const Tensor& w, const Conv1dOptions& options = {},
              Loc loc = Loc::current());
struct Conv3dOptions {
  std::array<int64_t, 3> stride{1, 1, 1};
  ConvPadding<3> padding{};
  std::array<int64_t, 3> dilation{1, 1, 1};
  int64_t groups = 1;
  std::optional<Tensor> bias;
};
Tensor conv3d(const Tensor& x, const Tensor& w, const Conv3dOptions& options = {},
              Loc loc = Loc::current());
// Transposed convolutions (PyTorch's conv_transposeNd): x [N, C, *in], w [C, O/groups, *k],
// bias [O] and unbatched x [C, *in] as the convolutions,
// out = (in - 1) * stride - 2 * padding + dilation * (k - 1) + output_padding + 1 per axis,
// with output_padding < max(stride, dilation). The gradient of convNd with respect to its
// input.
struct ConvTranspose1dOptions {
  int64_t stride = 1;
  int64_t padding = 0;
  int64_t output_padding = 0;
  int64_t dilation = 1;
  int64_t groups = 1;
  std::optional<Tensor> bias;
};
Tensor conv_transpose1d(const Tensor& x, const Tensor& w,
                        const ConvTranspose1dOptions& options = {}, Loc loc = Loc::current());
struct ConvTranspose2dOptions {
  std::pair<int64_t, int64_t> stride{1, 1};
  std::pair<int64_t, int64_t> padding{0, 0};
  std::pair<int64_t, int64_t> output_padding{0, 0};
  std::pair<int64_t, int64_t> dilation{1, 1};
  int64_t groups = 1;
  std::optional<Tensor> bias;
};
Tensor conv_transpose2d(const Tensor& x, const Tensor& w,
                        const ConvTranspose2dOptions& options = {}, Loc loc = Loc::current());
struct ConvTranspose3dOptions {
  std::array<int64_t, 3> stride{1, 1, 1};
  std::array<int64_t, 3> padding{0, 0, 0};
  std::array<int64_t, 3> output_padding{0, 0, 0};
  std::array<int64_t, 3> dilation{1, 1, 1};
  int64_t groups = 1;
  std::optional<Tensor> bias;
};
Tensor conv_transpose3d(const Tensor& x, const Tensor& w,
                        const ConvTranspose3dOptions& options = {}, Loc loc = Loc::current());
// Averages over windows [floor(i * H / OH), ceil((i + 1) * H / OH)) per axis (PyTorch's
// adaptive_avg_pool2d), x: [N, C, H, W] -> [N, C, OH, OW].
Tensor adaptive_avg_pool2d(const Tensor& x, std::pair<int64_t, int64_t> output_size,
                           Loc loc = Loc::current());
Tensor adaptive_avg_pool1d(const Tensor& x, int64_t output_size, Loc loc = Loc::current());
Tensor adaptive_avg_pool3d(const Tensor& x, std::array<int64_t, 3> output_size,
                           Loc loc = Loc::current());
// PyTorch's F.unfold (im2col): x [N, C, H, W] -> [N, C * KH * KW, L], column l holding
// window l's elements (zero where in the padding), channel-major then row-major in the window;
// windows row-major, L of them. Any padding >= 0.
struct UnfoldOptions {
  std::pair<int64_t, int64_t> kernel{1, 1};
  std::pair<int64_t, int64_t> dilation{1, 1};
  std::pair<int64_t, int64_t> padding{0, 0};
  std::pair<int64_t, int64_t> stride{1, 1};
};
Tensor unfold(const Tensor& x, const UnfoldOptions& options, Loc loc = Loc::current());
// PyTorch's F.fold, unfold's transpose: x [N, C * KH * KW, L] summed back into
// [N, C, output_size], the padding dropped.
Tensor fold(const Tensor& x, std::pair<int64_t, int64_t> output_size, const UnfoldOptions& options,
            Loc loc = Loc::current());
// [N, C * r * r, H, W] -> [N, C, H * r, W * r] and back (PyTorch's pixel_shuffle and
// pixel_unshuffle; r = upscale_factor or downscale_factor).
Tensor pixel_shuffle(const Tensor& x, int64_t upscale_factor, Loc loc = Loc::current());
Tensor pixel_unshuffle(const Tensor& x, int64_t downscale_factor, Loc loc = Loc::current());
// area is adaptive_avg_pool1d/2d/3d to the output size; bicubic is PyTorch's (A = -0.75).
// linear needs x [N, C, W], bilinear and bicubic [N, C, H, W], trilinear [N, C, D, H, W];
// nearest, nearest_exact and area take any of the three.
enum class InterpolateMode { nearest, nearest_exact, linear, bilinear, bicubic, trilinear, area };
// One value per spatial axis: one for every axis, (H, W) or (D, H, W).
template <typename T>
struct SpatialValues {
  std::vector<T> values;
  SpatialValues(T all) : values{all} {}  // NOLINT: implicit
  template <typename A, typename B>      // numbers of T's kind, as std::pair{NAN, 1.0}
  requires(std::is_integral_v<A> == std::is_integral_v<T> &&
           std::is_integral_v<B> == std::is_integral_v<T>)
      SpatialValues(std::pair<A, B> hw)  // NOLINT: implicit
      : values{static_cast<T>(hw.first), static_cast<T>(hw.second)} {}
  SpatialValues(std::array<T, 3> dhw) : values(dhw.begin(), dhw.end()) {}  // NOLINT: implicit
  explicit SpatialValues(std::vector<T> v) : values(std::move(v)) {}
};
// Exactly one of size and scale_factor; with scale_factor the output is floor(in * scale) and
// the source index uses 1 / scale, as PyTorch 1.13's F.interpolate.
struct InterpolateOptions {
  std::optional<SpatialValues<int64_t>> size;
  std::optional<SpatialValues<double>> scale_factor;
  InterpolateMode mode = InterpolateMode::nearest;
  bool align_corners = false;  // linear, bilinear, bicubic and trilinear only
};
// Resamples x [N, C, W], [N, C, H, W] or [N, C, D, H, W] (PyTorch's F.interpolate).
Tensor interpolate(const Tensor& x, const InterpolateOptions& options, Loc loc = Loc::current());
// PyTorch 1.13's F.grid_sample: samples x [N, C, H, W] at grid [N, Ho, Wo, 2] (x, y in
// [-1, 1]) into [N, C, Ho, Wo], or x [N, C, D, H, W] at grid [N, Do, Ho, Wo, 3] (x, y, z)
// into [N, C, Do, Ho, Wo]; bicubic is 4-d only. Differentiable w.r.t. x and grid.
enum class GridSampleMode { bilinear, nearest, bicubic };
enum class GridSamplePadding { zeros, border, reflection };
struct GridSampleOptions {
  GridSampleMode mode = GridSampleMode::bilinear;
  GridSamplePadding padding_mode = GridSamplePadding::zeros;
  bool align_corners = false;
};
Tensor grid_sample(const Tensor& x, const Tensor& grid, const GridSampleOptions& options = {},
                   Loc loc = Loc::current());
// PyTorch 1.13's F.affine_grid: theta [N, 2, 3] and size [N, C, H, W] give the grid
// [N, H, W, 2] of theta applied to the output's normalised coordinates; theta [N, 3, 4] and
// size [N, C, D, H, W] give [N, D, H, W, 3].
Tensor affine_grid(const Tensor& theta, const Shape& size, bool align_corners = false,
                   Loc loc = Loc::current());

// The identity, with a zero derivative: gradients do not flow through it.
Tensor stop_gradient(const Tensor& x, Loc loc = Loc::current());

// ---- sorting, scans and selection ----------------------------------------------------
// A stable sort along one axis in numpy's order: NaN last, -0 and +0 equal (kept in input
// order). Descending reverses the order (NaN first) and still keeps ties in input order.
struct SortResult {
  Tensor values;
  Tensor indices;  // int64: where each value came from along the axis
};
SortResult sort_with_indices(const Tensor& x, int64_t axis = -1, bool descending = false,
                             Loc loc = Loc::current());
Tensor sort(const Tensor& x, int64_t axis = -1, bool descending = false, Loc loc = Loc::current());
Tensor argsort(const Tensor& x, int64_t axis = -1, bool descending = false,
               Loc loc = Loc::current());
// The k largest along the last axis, largest first (NaN counts as largest; ties: lower index
// first).
SortResult top_k(const Tensor& x, int64_t k, Loc loc = Loc::current());
// Cumulative scans along an axis; nullopt flattens first (numpy's axis=None). Sums and
// products of bool count in int64; integers keep their dtype and wrap.
Tensor cumsum(const Tensor& x, std::optional<int64_t> axis = std::nullopt,
              Loc loc = Loc::current());
Tensor cumprod(const Tensor& x, std::optional<int64_t> axis = std::nullopt,
               Loc loc = Loc::current());
Tensor cummax(const Tensor& x, std::optional<int64_t> axis = std::nullopt,
              Loc loc = Loc::current());
Tensor cummin(const Tensor& x, std::optional<int64_t> axis = std::nullopt,
              Loc loc = Loc::current());
Tensor cumlogsumexp(const Tensor& x, std::optional<int64_t> axis = std::nullopt,
                    Loc loc = Loc::current());
// numpy's (and PyTorch's) name for cumlogsumexp.
inline Tensor logcumsumexp(const Tensor& x, std::optional<int64_t> axis = std::nullopt,
                           Loc loc = Loc::current()) {
  return cumlogsumexp(x, axis, loc);
}
// numpy.unique of the flattened x: its distinct values, ascending in numpy's sort order (all
// NaNs count as one value, last; -0 and +0 as one). Without `size` the number of values is
// read from the data, so x must be concrete (not traced); with `size` (needed under jit and
// vmap) there are exactly `size` values: the `size` smallest distinct ones, padded with
// `fill_value` (default: the smallest element), as JAX's jnp.unique(size=, fill_value=).
Tensor unique(const Tensor& x, std::optional<int64_t> size = std::nullopt,
              std::optional<double> fill_value = std::nullopt, Loc loc = Loc::current());
struct UniqueResult {
  Tensor values;   // as unique()
  Tensor inverse;  // int64 [x.numel()]: where each element of the flattened x is in values
                   // (>= size for one cut off by `size`)
  Tensor counts;   // int64, values' length: how often each value occurs (0 for the padding)
};
UniqueResult unique_all(const Tensor& x, std::optional<int64_t> size = std::nullopt,
                        std::optional<double> fill_value = std::nullopt, Loc loc = Loc::current());
// For each value, the index into the 1-d ascending `sorted` where it would be inserted:
// before equal elements (left) or after them (right), as numpy.searchsorted (NaN sorts last).
enum class Side { left, right };
Tensor searchsorted(const Tensor& sorted, const Tensor& values, Side side = Side::left,
                    Loc loc = Loc::current());
// numpy's default (linear) quantile, q in [0, 1]; NaN where the axis holds a NaN.
Tensor quantile(const Tensor& x, double q, std::optional<int64_t> axis = std::nullopt,
                bool keepdims = false, Loc loc = Loc::current());
Tensor median(const Tensor& x, std::optional<int64_t> axis = std::nullopt, bool keepdims = false,
              Loc loc = Loc::current());
// Standard deviation: sqrt(var(x, axes, keepdims, ddof)).
Tensor std(const Tensor& x, const Axes& axes = {}, bool keepdims = false, int64_t ddof = 0,
           Loc loc = Loc::current());

// ---- operators ---------------------------------------------------------------------
template <typename T>
concept Scalar = std::is_arithmetic_v<T> && !std::is_same_v<T, bool>;

// An operand of an operator, with the place it was written. Operators cannot take a defaulted
// std::source_location, but the default argument of this converting constructor is evaluated
// where the conversion happens: in the user's expression. So `a + b` errors name that line.
struct Operand {
  const Tensor& tensor;
  Loc loc;
  Operand(const Tensor& t, Loc l = Loc::current()) : tensor(t), loc(l) {}  // NOLINT: implicit
};

inline Tensor operator+(const Tensor& a, Operand b) { return add(a, b.tensor, b.loc); }
inline Tensor operator-(const Tensor& a, Operand b) { return sub(a, b.tensor, b.loc); }
inline Tensor operator*(const Tensor& a, Operand b) { return mul(a, b.tensor, b.loc); }
inline Tensor operator/(const Tensor& a, Operand b) { return div(a, b.tensor, b.loc); }
inline Tensor operator-(Operand a) { return neg(a.tensor, a.loc); }
inline Tensor operator<(const Tensor& a, Operand b) { return less(a, b.tensor, b.loc); }
inline Tensor operator<=(const Tensor& a, Operand b) { return less_equal(a, b.tensor, b.loc); }
inline Tensor operator>(const Tensor& a, Operand b) { return greater(a, b.tensor, b.loc); }
inline Tensor operator>=(const Tensor& a, Operand b) { return greater_equal(a, b.tensor, b.loc); }
inline Tensor operator==(const Tensor& a, Operand b) { return equal(a, b.tensor, b.loc); }
inline Tensor operator!=(const Tensor& a, Operand b) { return not_equal(a, b.tensor, b.loc); }
inline Tensor operator&&(const Tensor& a, Operand b) { return logical_and(a, b.tensor, b.loc); }
inline Tensor operator||(const Tensor& a, Operand b) { return logical_or(a, b.tensor, b.loc); }
inline Tensor operator!(const Tensor& a) {
  return logical_not(a, Loc{});
}  // exact: bool has one too

#define KILN_SCALAR_OPERATOR(op, fn)               \
  template <Scalar S>                              \
  Tensor operator op(Operand a, S s) {             \
    const detail::CallSite site(a.loc);            \
    return fn(a.tensor, weak(a.tensor, s), a.loc); \
  }                                                \
  template <Scalar S>                              \
  Tensor operator op(S s, Operand a) {             \
    const detail::CallSite site(a.loc);            \
    return fn(weak(a.tensor, s), a.tensor, a.loc); \
  }
KILN_SCALAR_OPERATOR(+, add)
KILN_SCALAR_OPERATOR(-, sub)
KILN_SCALAR_OPERATOR(*, mul)
KILN_SCALAR_OPERATOR(/, div)
KILN_SCALAR_OPERATOR(<, less)
KILN_SCALAR_OPERATOR(<=, less_equal)
KILN_SCALAR_OPERATOR(>, greater)
KILN_SCALAR_OPERATOR(>=, greater_equal)
KILN_SCALAR_OPERATOR(==, equal)
KILN_SCALAR_OPERATOR(!=, not_equal)
#undef KILN_SCALAR_OPERATOR

// Compound assignment rebinds the handle to a new tensor, as `x += y` does for a JAX array:
// tensors are immutable, so views and traced uses of the old value are unaffected.
struct AssignTarget {
  Tensor& tensor;
  Loc loc;
  AssignTarget(Tensor& t, Loc l = Loc::current()) : tensor(t), loc(l) {}  // NOLINT: implicit
};
#define KILN_COMPOUND_ASSIGNMENT(op, fn)                        \
  inline Tensor& operator op(AssignTarget a, const Tensor& b) { \
    a.tensor = fn(a.tensor, b, a.loc);                          \
    return a.tensor;                                            \
  }                                                             \
  template <Scalar S>                                           \
  Tensor& operator op(AssignTarget a, S s) {                    \
    const detail::CallSite site(a.loc);                         \
    a.tensor = fn(a.tensor, weak(a.tensor, s), a.loc);          \
    return a.tensor;                                            \
  }
KILN_COMPOUND_ASSIGNMENT(+=, add)
KILN_COMPOUND_ASSIGNMENT(-=, sub)
KILN_COMPOUND_ASSIGNMENT(*=, mul)
KILN_COMPOUND_ASSIGNMENT(/=, div)
#undef KILN_COMPOUND_ASSIGNMENT

template <Scalar S>
Tensor pow(const Tensor& a, S s, Loc loc = Loc::current()) {
  const detail::CallSite site(loc);
  return pow(a, weak(a, s), loc);
}
template <Scalar S>
Tensor maximum(const Tensor& a, S s, Loc loc = Loc::current()) {
  const detail::CallSite site(loc);
  return maximum(a, weak(a, s), loc);
}
template <Scalar S>
Tensor minimum(const Tensor& a, S s, Loc loc = Loc::current()) {
  const detail::CallSite site(loc);
  return minimum(a, weak(a, s), loc);
}

}  // namespace kiln
