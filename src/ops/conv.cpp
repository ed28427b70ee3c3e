// Convolution over 1, 2 or 3 spatial axes (NCW, NCHW, NCDHW) and pooling over NCHW images:
// the `conv`, `conv_input_grad`, `conv_weight_grad`, `max_pool2d` and `avg_pool2d` primitives
// and the public convolutions (conv1d/2d/3d, conv_transpose1d/2d/3d, with bias, unbatched
// inputs and padding rules composed from other operations; the public poolings are in
// src/ops/pool.cpp).
//
// conv and its two gradients run through oneDNN in float32 (src/ops/conv_dnnl.cpp: 1.5-2x
// faster than im2col here), except a single-channel input's, which is memory-bound and runs
// as direct loops (src/ops/conv_direct.cpp); otherwise they lower to im2col + gemm per group
// (float32 on the GEMM backend matmul uses, float64 on OpenBLAS); small images are batched into one
// wide gemm so that gemm sees enough columns. f16/bf16 compute in float32. im2col and its transpose
// run in parallel over image planes: OpenBLAS is the OpenMP build, so they share gemm's thread
// pool. Every geometry is held as 3d (ops::ConvGeom), a lower rank with unit leading axes.
#include <cblas.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <type_traits>
#include <vector>

#include "detail/checked.h"
#include "detail/copy.h"
#include "detail/dtype_dispatch.h"
#include "detail/parallel.h"
#include "kiln/ops.h"
#include "ops/conv_direct.h"
#include "ops/conv_dnnl.h"
#include "ops/gemm.h"
#include "ops/pool_blocked.h"
#include "ops/pool_direct.h"
#include "ops/primitives.h"
#include "ops/rules.h"

namespace kiln {
namespace {

constexpr std::string_view kFloatDesc = "a floating dtype (f16, bf16, f32, f64)";

using ops::ConvGeom;
using ops::ConvPass;
using ops::Spatial;

// An attribute of one value per spatial axis (stride, padding, ...), validated.
std::vector<int64_t> spatial_attr(std::string_view op, const Attrs& attrs, std::string_view name,
                                  int64_t min_value, int rank) {
  static constexpr std::string_view kAxes[] = {"(width)", "(height, width)",
                                               "(depth, height, width)"};
  const std::vector<int64_t>& v = attrs.get_ints(name);
  if (v.size() != static_cast<std::size_t>(rank))
    fail(op, "attribute '", name, "' has the wrong length: got ", attr_to_string(v), ", expected ",
         rank, rank == 1 ? " value " : " values ", kAxes[rank - 1]);
  for (const int64_t e : v) {
    if (e < min_value)
      fail(op, min_value > 0 ? "non-positive " : "negative ", name, ": got ", attr_to_string(v),
           ", expected values >= ", min_value);
    if (e > INT_MAX)
      fail(op, "attribute '", name, "' too large: got ", attr_to_string(v),
           ", expected values below 2^31");
  }
  return v;
}
std::pair<int64_t, int64_t> pair_attr(std::string_view op, const Attrs& attrs,
                                      std::string_view name, int64_t min_value) {
  const std::vector<int64_t> v = spatial_attr(op, attrs, name, min_value, 2);
  return {v[0], v[1]};
}
// v as the last entries of a Spatial whose leading entries are `neutral`.
Spatial padded_spatial(std::span<const int64_t> v, int64_t neutral) {
  Spatial s{neutral, neutral, neutral};
  std::copy(v.begin(), v.end(), s.end() - static_cast<std::ptrdiff_t>(v.size()));
  return s;
}
std::span<const int64_t> spatial_tail(const Spatial& s, int rank) {
  return std::span<const int64_t>(s).last(static_cast<std::size_t>(rank));
}

// The spatial rank of a conv primitive: the length of its stride, named per rank in errors
// ("conv3d_input_grad").
struct ConvKind {
  int rank;
  std::string op;
};
ConvKind conv_kind(std::string_view suffix, const Attrs& attrs) {
  const std::size_t r = attrs.get_ints("stride").size();
  if (r < 1 || r > 3)
    fail(std::string("conv").append(suffix), "attribute 'stride' has the wrong length: got ",
         attr_to_string(attrs.get_ints("stride")), ", expected 1, 2 or 3 values (one per axis)");
  return {static_cast<int>(r), "conv" + std::to_string(r) + "d" + std::string(suffix)};
}

const char* layout(int rank, bool weight) {
  static constexpr const char* kData[] = {"[N, C, W]", "[N, C, H, W]", "[N, C, D, H, W]"};
  static constexpr const char* kWeight[] = {"[O, C/groups, KW]", "[O, C/groups, KH, KW]",
                                            "[O, C/groups, KD, KH, KW]"};
  return (weight ? kWeight : kData)[rank - 1];
}
void expect_rank(std::string_view op, std::string_view what, const TensorType& t, int rank,
                 bool weight = false) {
  if (t.shape.rank() != rank + 2)
    fail(op, what, " must have rank ", rank + 2, ": got ", t, ", expected ", layout(rank, weight));
}
void expect_image(std::string_view op, std::string_view what, const TensorType& t) {
  expect_rank(op, what, t, 2);
  ops::expect_dtype(op, t, DTypeSet::floating(), kFloatDesc);
}

std::string spatial_string(std::span<const int64_t> v, const char* sep) {
  std::string s;
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + std::to_string(v[i]);
  return s;
}

// The geometry of x [N, C, *in] convolved with w [O, C/groups, *k]; `kind` names the
// primitive in errors (the gradient primitives share the forward's checks).
ConvGeom conv_geom(const ConvKind& kind, std::span<const TensorType> in, const Attrs& attrs) {
  const std::string& op = kind.op;
  const int r = kind.rank;
  const TensorType& x = in[0];
  const TensorType& w = in[1];
  expect_rank(op, "input", x, r);
  ops::expect_dtype(op, x, DTypeSet::floating(), kFloatDesc);
  expect_rank(op, "weight", w, r, true);
  ops::expect_dtype(op, w, DTypeSet::floating(), kFloatDesc);
  if (x.dtype != w.dtype)
    fail(op, "input and weight differ in dtype: got ", x, " and ", w,
         ", expected one dtype (the public ", kind.op.substr(0, 6), " promotes first)");
  const std::vector<int64_t> stride = spatial_attr(op, attrs, "stride", 1, r),
                             pad = spatial_attr(op, attrs, "padding", 0, r),
                             dil = spatial_attr(op, attrs, "dilation", 1, r);
  const int64_t G = attrs.get_int("groups");
  if (G < 1) fail(op, "non-positive groups: got groups=", G, ", expected groups >= 1");
  const std::span<const int64_t> xs = x.shape.dims(), ws = w.shape.dims();
  ConvGeom g{r,
             xs[0],
             xs[1],
             ws[0],
             G,
             padded_spatial(xs.subspan(2), 1),
             padded_spatial(ws.subspan(2), 1),
             padded_spatial(stride, 1),
             padded_spatial(pad, 0),
             padded_spatial(dil, 1),
             {1, 1, 1}};
  if (g.C % G != 0)
    fail(op, "input channels not divisible by groups: got input ", x, " with groups=", G,
         ", expected C (", g.C, ") to be a multiple of groups");
  if (g.O % G != 0)
    fail(op, "output channels not divisible by groups: got weight ", w, " with groups=", G,
         ", expected O (", g.O, ") to be a multiple of groups");
  if (ws[1] != g.C / G)
    fail(op, "weight channels do not match the input: got input ", x, " and weight ", w,
         " with groups=", G, ", expected w.shape[1] == C/groups (", ws[1], " vs ", g.C / G, ")");
  if (g.taps() == 0) fail(op, "empty kernel: got weight ", w, ", expected kernel sizes >= 1");
  // The dilated kernel's extent: checked, as a weight can be a broadcast view of 2^60 taps.
  Spatial extent{}, padded{};
  bool fits = true;
  for (std::size_t i = 0; i < 3; ++i) {
    extent[i] = detail::checked_add(op, detail::checked_mul(op, g.dil[i], g.k[i] - 1), 1);
    padded[i] = g.in[i] + 2 * g.pad[i];
    fits = fits && extent[i] <= padded[i];
    g.out[i] = fits ? (padded[i] - extent[i]) / g.stride[i] + 1 : 0;
  }
  if (!fits)
    fail(op, "kernel larger than the padded input: got input ", x, " and weight ", w, " (padding [",
         spatial_string(pad, ", "), "], dilation [", spatial_string(dil, ", "),
         "]), expected an effective kernel of ", spatial_string(spatial_tail(extent, r), "x"),
         " to fit the padded input ", spatial_string(spatial_tail(padded, r), "x"));
  return g;
}

// [n, c, *s] for the geometry's rank.
Shape image_shape(const ConvGeom& g, int64_t n, int64_t c, const Spatial& s) {
  std::vector<int64_t> d{n, c};
  const std::span<const int64_t> t = spatial_tail(s, g.rank);
  d.insert(d.end(), t.begin(), t.end());
  return Shape(d);
}

// float C = A·B + beta·C (beta 0 or 1) on oneDNN when the GEMM rule picks it (src/ops/gemm.cpp),
// as matmul does; false when it does not, or oneDNN declines the layout. A product that adds
// to C (the weight gradient's sum over images) goes through the thread's buffer, m·n floats
// against the m·n·k of the product.
bool dnnl_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
               const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (ops::sgemm_backend() != GemmBackend::onednn || (beta != 0.0f && beta != 1.0f)) return false;
  const bool direct = beta == 0.0f && ldc == n;
  thread_local std::vector<float> sum;
  if (!direct) sum.resize(static_cast<std::size_t>(m * n));
  float* out = direct ? c : sum.data();
  if (!ops::dnnl_sgemm(
          {1, m, n, k, a, ops::blas_strides(ta, lda), b, ops::blas_strides(tb, ldb), out}))
    return false;
  if (direct) return true;
  for (int64_t r = 0; r < m; ++r)
    for (int64_t j = 0; j < n; ++j)
      c[r * ldc + j] = beta == 0.0f ? out[r * n + j] : c[r * ldc + j] + out[r * n + j];
  return true;
}

// Row-major C = A·B + beta·C with either operand transposed, for float or double.
template <typename T>
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda, const T* b,
          int64_t ldb, T beta, T* c, int64_t ldc) {
  const auto i = [](int64_t v) { return static_cast<blasint>(v); };
  const CBLAS_TRANSPOSE at = ta ? CblasTrans : CblasNoTrans, bt = tb ? CblasTrans : CblasNoTrans;
  detail::set_library_threads();
  if constexpr (std::is_same_v<T, float>) {
    if (!dnnl_gemm(ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc))
      cblas_sgemm(CblasRowMajor, at, bt, i(m), i(n), i(k), 1.0f, a, i(lda), b, i(ldb), beta, c,
                  i(ldc));
  } else
    cblas_dgemm(CblasRowMajor, at, bt, i(m), i(n), i(k), 1.0, a, i(lda), b, i(ldb), beta, c,
                i(ldc));
}

// One kernel tap (kd, kh, kw) of the im2col matrix: output rows (od, oh) of OW entries each.
struct Tap {
  const ConvGeom& g;
  int64_t kd, kh, iw0;  // iw0: the input column of output column 0 (ow's is iw0 + ow * sw)
  int64_t lo, hi;       // the output columns [lo, hi) whose input column lies inside [0, W)

  Tap(const ConvGeom& geom, int64_t t) : g(geom) {
    const int64_t kw = t % g.k[2];
    kh = t / g.k[2] % g.k[1];
    kd = t / (g.k[2] * g.k[1]);
    iw0 = kw * g.dil[2] - g.pad[2];
    const int64_t W = g.in[2], OW = g.out[2], sw = g.stride[2];
    lo = std::min(iw0 >= 0 ? 0 : (-iw0 + sw - 1) / sw, OW);
    hi = std::clamp(iw0 >= W ? 0 : (W - 1 - iw0) / sw + 1, lo, OW);
  }
  // f(output row, offset of the input row in the plane or nullopt in the padding).
  template <typename F>
  void each_row(F&& f) const {
    for (int64_t od = 0; od < g.out[0]; ++od) {
      const int64_t id = od * g.stride[0] - g.pad[0] + kd * g.dil[0];
      for (int64_t oh = 0; oh < g.out[1]; ++oh) {
        const int64_t ih = oh * g.stride[1] - g.pad[1] + kh * g.dil[1];
        const bool inside = id >= 0 && id < g.in[0] && ih >= 0 && ih < g.in[1];
        f(od * g.out[1] + oh,
          inside ? std::optional<int64_t>((id * g.in[1] + ih) * g.in[2]) : std::nullopt);
      }
    }
  }
};

// Fills one im2col row: dst[output position] = the plane's input under tap t there, or 0 where
// the tap falls into the padding.
template <typename T>
void im2col_row(const ConvGeom& g, const T* plane, int64_t t, T* dst) {
  const Tap tap(g, t);
  const int64_t OW = g.out[2], sw = g.stride[2];
  tap.each_row([&](int64_t row, std::optional<int64_t> in_row) {
    T* d = dst + row * OW;
    if (!in_row) {
      std::fill(d, d + OW, T{0});
      return;
    }
    const T* s = plane + *in_row + tap.iw0;
    std::fill(d, d + tap.lo, T{0});
    if (sw == 1) {
      if (tap.hi > tap.lo)
        std::memcpy(d + tap.lo, s + tap.lo, static_cast<std::size_t>(tap.hi - tap.lo) * sizeof(T));
    } else {
      for (int64_t ow = tap.lo; ow < tap.hi; ++ow) d[ow] = s[ow * sw];
    }
    std::fill(d + tap.hi, d + OW, T{0});
  });
}

// The transpose of im2col_row: adds each entry of src back onto the input it came from.
template <typename T>
void col2im_row_add(const ConvGeom& g, T* plane, int64_t t, const T* src) {
  const Tap tap(g, t);
  const int64_t OW = g.out[2], sw = g.stride[2];
  tap.each_row([&](int64_t row, std::optional<int64_t> in_row) {
    if (!in_row) return;
    T* d = plane + *in_row + tap.iw0;
    const T* s = src + row * OW;
    for (int64_t ow = tap.lo; ow < tap.hi; ++ow) d[ow * sw] += s[ow];
  });
}

constexpr int64_t kColumnBudgetBytes = int64_t{64} << 20;  // im2col buffer per chunk
constexpr int64_t kTargetColumns = 4096;                   // gemm width worth batching to

// The im2col view of a batch: images [n0, n0 + cnt) side by side, so that one gemm of width
// cnt * L serves them all (small images alone give gemm too few columns to be fast).
template <typename T>
struct Columns {
  const ConvGeom& g;
  int64_t Cg, Og, taps, K, L, nb, width = 0;
  std::vector<T> col;  // [K, nb * L]: row (c, tap), image i in columns [i*L, (i+1)*L)
  std::vector<T> tmp;  // [Og, nb * L]: one group's outputs (or output gradients) side by side

  explicit Columns(const ConvGeom& geom)
      : g(geom), Cg(g.C / g.G), Og(g.O / g.G), taps(g.taps()), K(Cg * taps), L(g.out_size()) {
    // One image's K x L columns can exceed any size though the weight and output fit; the
    // Error ([shape]) is re-raised by bind under the primitive's name.
    Shape{K, L}.check("shape");
    nb = std::max<int64_t>(1, kTargetColumns / L);
    nb = std::min(
        {nb, g.N, std::max<int64_t>(1, kColumnBudgetBytes / (K * L * int64_t{sizeof(T)}))});
    col.resize(static_cast<std::size_t>(K * nb * L));
    tmp.resize(static_cast<std::size_t>(Og * nb * L));
  }
  // f(n0, count, gi) for each chunk of images and each group, with `width` set for the chunk.
  template <typename F>
  void each_chunk(F&& f) {
    for (int64_t n0 = 0; n0 < g.N; n0 += nb) {
      const int64_t count = std::min(nb, g.N - n0);
      width = count * L;
      for (int64_t gi = 0; gi < g.G; ++gi) f(n0, count, gi);
    }
  }

  // Planes (image i, channel c of group gi) in parallel: each writes its own rows.
  template <typename F>
  void each_plane(int64_t count, F&& f) const {
    detail::parallel_for(
        count * Cg,
        [&](int64_t b, int64_t e) {
          for (int64_t p = b; p < e; ++p) f(p / Cg, p % Cg);
        },
        L * taps);
  }
  T* row(int64_t c, int64_t t, int64_t i) { return col.data() + (c * taps + t) * width + i * L; }
  void fill(const T* x, int64_t n0, int64_t count, int64_t gi) {
    const int64_t S = g.in_size();
    each_plane(count, [&](int64_t i, int64_t c) {
      const T* plane = x + (n0 + i) * g.C * S + (gi * Cg + c) * S;
      for (int64_t t = 0; t < taps; ++t) im2col_row(g, plane, t, row(c, t, i));
    });
  }
  void add_back(T* dx, int64_t n0, int64_t count, int64_t gi) {
    const int64_t S = g.in_size();
    each_plane(count, [&](int64_t i, int64_t c) {
      T* plane = dx + (n0 + i) * g.C * S + (gi * Cg + c) * S;
      for (int64_t t = 0; t < taps; ++t) col2im_row_add(g, plane, t, row(c, t, i));
    });
  }
  // Group gi's rows of an [N, O, *out] tensor for the current images, as [Og, width] with
  // leading dimension ld: in place for one image, gathered into tmp for several.
  std::pair<const T*, int64_t> gather(const T* y, int64_t n0, int64_t count, int64_t gi) {
    const T* first = y + n0 * g.O * L + gi * Og * L;
    if (count == 1) return {first, L};
    for (int64_t i = 0; i < count; ++i)
      for (int64_t o = 0; o < Og; ++o)
        std::memcpy(tmp.data() + o * width + i * L, first + i * g.O * L + o * L,
                    static_cast<std::size_t>(L) * sizeof(T));
    return {tmp.data(), width};
  }
  void scatter(T* y, int64_t n0, int64_t count, int64_t gi) const {
    for (int64_t i = 0; i < count; ++i)
      for (int64_t o = 0; o < Og; ++o)
        std::memcpy(y + (n0 + i) * g.O * L + (gi * Og + o) * L, tmp.data() + o * width + i * L,
                    static_cast<std::size_t>(L) * sizeof(T));
  }
};

void check_blas_size(std::string_view op, const ConvGeom& g) {
  const int64_t K = g.C / g.G * g.taps(), L = g.out_size();
  if (std::max({g.O / g.G, K, L, g.in_size()}) > INT_MAX / 2)
    fail(op, "problem too large for BLAS: got input ", image_shape(g, g.N, g.C, g.in),
         " and weight ", image_shape(g, g.O, g.C / g.G, g.k),
         ", expected matrix dimensions below 2^30");
}

bool is_pointwise(const ConvGeom& g) {
  return g.taps() == 1 && g.stride == Spatial{1, 1, 1} && g.pad == Spatial{0, 0, 0};
}
// f(n, gi) for each image and group: pointwise kernels need no im2col, one gemm per pair.
template <typename F>
void each_image_group(const ConvGeom& g, F&& f) {
  for (int64_t n = 0; n < g.N; ++n)
    for (int64_t gi = 0; gi < g.G; ++gi) f(n, gi);
}

// y = conv(x, w): per group, W_g [Og, K] · columns [K, width].
template <typename T>
Tensor conv_impl(const Tensor& x_in, const Tensor& w_in, const ConvGeom& g, std::string_view op) {
  Tensor out = empty(image_shape(g, g.N, g.O, g.out), dtype_v<T>);
  if (out.numel() == 0) return out;
  check_blas_size(op, g);
  const Tensor x = x_in.contiguous(), w = w_in.contiguous();
  const T* px = x.data<const T>();
  const T* pw = w.data<const T>();
  T* po = out.data<T>();
  const int64_t Cg = g.C / g.G, Og = g.O / g.G, K = Cg * g.taps(), L = g.out_size();
  if (K == 0) {  // no input channels: every output is an empty sum
    std::fill(po, po + out.numel(), T{0});
    return out;
  }
  if constexpr (std::is_same_v<T, float>) {
    if (ops::direct_conv_applies(g)) {
      ops::direct_conv_forward(g, px, pw, po);
      return out;
    }
    if (ops::dnnl_conv(ConvPass::forward, g, x, w, po)) return out;
  }
  if (is_pointwise(g)) {  // the image is the column matrix already
    each_image_group(g, [&](int64_t n, int64_t gi) {
      gemm<T>(false, false, Og, L, K, pw + gi * Og * K, K, px + (n * g.C + gi * Cg) * L, L, T{0},
              po + (n * g.O + gi * Og) * L, L);
    });
    return out;
  }
  Columns<T> cols(g);
  cols.each_chunk([&](int64_t n0, int64_t cnt, int64_t gi) {
    cols.fill(px, n0, cnt, gi);
    const bool direct = cnt == 1;
    T* dst = direct ? po + n0 * g.O * L + gi * Og * L : cols.tmp.data();
    gemm<T>(false, false, Og, cols.width, K, pw + gi * Og * K, K, cols.col.data(), cols.width, T{0},
            dst, direct ? L : cols.width);
    if (!direct) cols.scatter(po, n0, cnt, gi);
  });
  return out;
}

// dx = conv_input_grad(dy, w): per group, columns [K, width] = W_g^T · dY_g, then each
// column entry is added back onto the pixel im2col took it from.
template <typename T>
Tensor conv_input_grad_impl(const Tensor& ct_in, const Tensor& w_in, const ConvGeom& g,
                            std::string_view op) {
  Tensor dx = empty(image_shape(g, g.N, g.C, g.in), dtype_v<T>);
  if (dx.numel() == 0) return dx;
  if (ct_in.numel() == 0) return zeros(dx.shape(), dx.dtype());
  check_blas_size(op, g);
  const Tensor ct = ct_in.contiguous(), w = w_in.contiguous();
  const T* pc = ct.data<const T>();
  const T* pw = w.data<const T>();
  T* px = dx.data<T>();
  const int64_t Cg = g.C / g.G, Og = g.O / g.G, K = Cg * g.taps(), L = g.out_size();
  if constexpr (std::is_same_v<T, float>) {
    if (ops::direct_conv_applies(g)) {
      ops::direct_conv_input_grad(g, pc, pw, px);
      return dx;
    }
    if (ops::dnnl_conv(ConvPass::backward_data, g, ct, w, px)) return dx;
  }
  if (is_pointwise(g)) {
    each_image_group(g, [&](int64_t n, int64_t gi) {
      gemm<T>(true, false, K, L, Og, pw + gi * Og * K, K, pc + (n * g.O + gi * Og) * L, L, T{0},
              px + (n * g.C + gi * Cg) * L, L);
    });
    return dx;
  }
  std::fill(px, px + dx.numel(), T{0});  // col2im adds into it
  Columns<T> cols(g);
  cols.each_chunk([&](int64_t n0, int64_t cnt, int64_t gi) {
    const auto [dy, ld] = cols.gather(pc, n0, cnt, gi);
    gemm<T>(true, false, K, cols.width, Og, pw + gi * Og * K, K, dy, ld, T{0}, cols.col.data(),
            cols.width);
    cols.add_back(px, n0, cnt, gi);
  });
  return dx;
}

// dw = conv_weight_grad(dy, x): per group, dW_g [Og, K] += dY_g [Og, width] · columns^T.
template <typename T>
Tensor conv_weight_grad_impl(const Tensor& ct_in, const Tensor& x_in, const ConvGeom& g,
                             std::string_view op) {
  const int64_t Cg = g.C / g.G, Og = g.O / g.G, K = Cg * g.taps(), L = g.out_size();
  Tensor dw = empty(image_shape(g, g.O, Cg, g.k), dtype_v<T>);
  if (dw.numel() == 0) return dw;
  if (ct_in.numel() == 0) return zeros(dw.shape(), dw.dtype());
  check_blas_size(op, g);
  const Tensor ct = ct_in.contiguous(), x = x_in.contiguous();
  const T* pc = ct.data<const T>();
  const T* px = x.data<const T>();
  T* pw = dw.data<T>();
  if constexpr (std::is_same_v<T, float>) {
    if (ops::direct_conv_applies(g)) {
      ops::direct_conv_weight_grad(g, pc, px, pw);
      return dw;
    }
    if (ops::dnnl_conv(ConvPass::backward_weights, g, ct, x, pw)) return dw;
  }
  std::fill(pw, pw + dw.numel(), T{0});  // the gemms below accumulate over images
  if (is_pointwise(g)) {
    each_image_group(g, [&](int64_t n, int64_t gi) {
      gemm<T>(false, true, Og, K, L, pc + (n * g.O + gi * Og) * L, L, px + (n * g.C + gi * Cg) * L,
              L, T{1}, pw + gi * Og * K, K);
    });
    return dw;
  }
  Columns<T> cols(g);
  cols.each_chunk([&](int64_t n0, int64_t cnt, int64_t gi) {
    cols.fill(px, n0, cnt, gi);
    const auto [dy, ld] = cols.gather(pc, n0, cnt, gi);
    gemm<T>(false, true, Og, K, cols.width, dy, ld, cols.col.data(), cols.width, T{1},
            pw + gi * Og * K, K);
  });
  return dw;
}

// Runs impl<T> for f32/f64; f16 and bf16 compute in f32 and round once at the end.
template <typename F>
Tensor in_float(std::span<const Tensor> in, F&& impl) {
  return detail::visit_floating(in[0].dtype(), [&]<typename T>() {
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      return impl.template operator()<T>(in[0], in[1]);
    } else {
      Tensor a = empty(in[0].shape(), float32), b = empty(in[1].shape(), float32);
      detail::copy_cast(in[0], a);
      detail::copy_cast(in[1], b);
      const Tensor r32 = impl.template operator()<float>(a, b);
      Tensor out = empty(r32.shape(), dtype_v<T>);
      detail::copy_cast(r32, out);
      return out;
    }
  });
}

Primitive primitive_of(std::string name, int arity, TypeRule rule) {
  Primitive p;
  p.name = std::move(name);
  p.arity = arity;
  p.type_rule = std::move(rule);
  return p;
}

// ---- derivative rules, written with primitives so they differentiate again ---------------

// The convolution attributes of any of the three conv primitives.
Attrs conv_attrs(const Attrs& a) {
  return {{"stride", a.get_ints("stride")},
          {"padding", a.get_ints("padding")},
          {"dilation", a.get_ints("dilation")},
          {"groups", a.get_int("groups")}};
}
Attrs with(const Attrs& a, const char* name, std::vector<int64_t> value) {
  Attrs out = conv_attrs(a);
  out.set(name, std::move(value));
  return out;
}
std::vector<int64_t> spatial_dims(const Shape& s) { return {s.begin() + 2, s.end()}; }

// The gradients of y = conv(x, w) as primitives of their own (im2col + gemm, no transposed
// copies of the operands). conv is bilinear, so
//   <dy, conv(x, w)> = <conv_input_grad(dy, w), x> = <conv_weight_grad(dy, x), w>,
// and each of the three primitives' derivatives is one of the other two.
Tensor input_grad(const Tensor& dy, const Tensor& w, const Attrs& a, const Shape& x,
                  Loc loc = Loc::current()) {
  return bind1(prim::conv_input_grad(), {dy, w}, with(a, "input_size", spatial_dims(x)), loc);
}
Tensor weight_grad(const Tensor& dy, const Tensor& x, const Attrs& a, const Shape& w) {
  return bind1(prim::conv_weight_grad(), {dy, x}, with(a, "kernel_size", spatial_dims(w)));
}
Tensor conv_of(const Tensor& x, const Tensor& w, const Attrs& a) {
  return bind1(prim::conv(), {x, w}, conv_attrs(a));
}

// A bilinear primitive's JVP: f(dt0, in1) + f(in0, dt1).
template <class F>
ops::Ts bilinear_jvp(const RuleArgs& r, std::span<const Tangent> t, F f) {
  Tangent out;
  if (t[0]) out = f(*t[0], r.inputs[1]);
  if (t[1]) {
    const Tensor d = f(r.inputs[0], *t[1]);
    out = out ? Tangent(*out + d) : Tangent(d);
  }
  return {out};
}

// Batching: a batch of images with a shared kernel folds the batch into N; a batch of
// kernels (per-example weights, as in per-example gradients) runs once per example.
std::vector<Batched> batch_images(const BatchArgs& b) {
  const Tensor x = ops::batch_first(b.inputs[0], b.dims[0], b.size);
  std::vector<int64_t> folded{x.shape()[0] * x.shape()[1]};
  folded.insert(folded.end(), x.shape().begin() + 2, x.shape().end());
  std::vector<Tensor> ins{reshape(x, Shape(folded))};
  for (std::size_t i = 1; i < b.inputs.size(); ++i) ins.push_back(b.inputs[i]);
  const Tensor y = bind1(b.primitive, ins, b.attrs);
  std::vector<int64_t> unfolded{x.shape()[0], x.shape()[1]};
  unfolded.insert(unfolded.end(), y.shape().begin() + 1, y.shape().end());
  return {{reshape(y, Shape(unfolded)), 0}};
}

using ConvImpl = Tensor (*)(const Tensor&, const Tensor&, const ConvGeom&, std::string_view);
using GeomOf = ConvGeom (*)(const ConvKind&, std::span<const TensorType>, const Attrs&);

std::vector<TensorType> types(std::span<const Tensor> in) { return {in[0].type(), in[1].type()}; }

// One of the three conv primitives: `geom` checks its operands, `result` is the shape of the
// geometry it produces. `folds`: a batch of the first operand alone folds into N (conv,
// conv_input_grad); the weight gradient sums over N, so a batched dy or x there runs once per
// example.
struct ConvSpec {
  std::string_view name;  // and the suffix of the per-rank names in errors
  GeomOf geom;
  Shape (*result)(const ConvGeom&);
  ConvImpl f32, f64;
  bool folds;
  ConvPass pass;
};

// oneDNN's convolutions compute in channel blocks: the images a pass reads and writes may come
// and go in them (the weight gradient's output is the weight), where oneDNN runs the pass.
Primitive::ChannelBlocked conv_channel_blocked(const ConvSpec& s) {
  const std::string suffix(s.name.substr(4));
  const bool weights = s.pass == ConvPass::backward_weights;
  Primitive::ChannelBlocked r;
  r.inputs = weights ? std::vector<int>{0, 1} : std::vector<int>{0};
  r.output = !weights;
  r.computes_blocked = true;
  r.applies = [s, suffix](std::span<const TensorType> in, const Attrs& a, int64_t block) {
    const ConvKind kind = conv_kind(suffix, a);
    if (kind.rank != 2 || in[0].dtype != float32 || in[1].dtype != float32) return false;
    const ConvGeom g = s.geom(kind, in, a);
    return g.G == 1 && g.C % block == 0 && g.O % block == 0 && !ops::direct_conv_applies(g) &&
           ops::dnnl_conv_takes(s.pass, g);
  };
  r.write = [s, suffix](std::span<const Tensor> in, const Primitive::ChannelBlocked::Call& call,
                        const Tensor& out, const Attrs& a) {
    const ConvKind kind = conv_kind(suffix, a);
    const ConvGeom g = s.geom(kind, types(in), a);
    check_blas_size(kind.op, g);  // the kernels' limit, so that both raise alike
    ops::ConvBlocks blocks;
    for (const int i : call.inputs) (i == 0 ? blocks.a : blocks.b) = call.block;
    if (call.output) blocks.out = call.block;
    if (!ops::dnnl_conv(s.pass, g, in[0].contiguous(), in[1].contiguous(), out.data<float>(),
                        blocks))
      fail(kind.op, "oneDNN refused the channel-blocked operands it took at compile time: got ",
           in[0].type(), " and ", in[1].type(), " in blocks of ", call.block,
           ", expected the pass to run");
  };
  return r;
}
const Primitive& define_conv(const ConvSpec& s, Primitive p, Loc loc = Loc::current()) {
  const std::string suffix(s.name.substr(4));
  p.name = std::string(s.name);
  p.arity = 2;
  p.type_rule = [s, suffix](std::span<const TensorType> in, const Attrs& a) {
    return std::vector<TensorType>{{in[0].dtype, s.result(s.geom(conv_kind(suffix, a), in, a))}};
  };
  // The three primitives do the forward's multiply-adds: one per output, input channel of its
  // group and kernel tap.
  p.flops = [s, suffix](std::span<const TensorType> in, std::span<const TensorType>,
                        const Attrs& a) {
    const ConvGeom g = s.geom(conv_kind(suffix, a), in, a);
    return 2.0 * static_cast<double>(g.N) * static_cast<double>(g.O) *
           static_cast<double>(g.C / std::max<int64_t>(g.G, 1)) *
           static_cast<double>(g.out_size()) * static_cast<double>(g.taps());
  };
  p.batch = [folds = s.folds](const BatchArgs& b) {
    return folds && !b.dims[1] ? batch_images(b) : ops::batch_by_loop(b);
  };
  p.channel_blocked = conv_channel_blocked(s);
  Kernel kernel = [s, suffix](std::span<const Tensor> in, const Attrs& attrs) {
    const ConvKind kind = conv_kind(suffix, attrs);
    const ConvGeom g = s.geom(kind, types(in), attrs);
    return std::vector<Tensor>{in_float(in, [&]<typename T>(const Tensor& a, const Tensor& b) {
      return (std::is_same_v<T, float> ? s.f32 : s.f64)(a, b, g, kind.op);
    })};
  };
  return detail::register_builtin(
      std::move(p), {{ops::cpu({DTypeSet::floating(), DTypeSet::floating()}), std::move(kernel)}},
      loc);
}

// The forward geometry behind a gradient primitive, checked against the given dy.
ConvGeom grad_geom(const ConvKind& kind, const TensorType& dy, const TensorType& x,
                   const TensorType& w, const Attrs& a) {
  const ConvGeom g = conv_geom(kind, std::vector<TensorType>{x, w}, a);
  const Shape expected = image_shape(g, g.N, g.O, g.out);
  if (dy.shape != expected || dy.dtype != x.dtype)
    fail(kind.op, "output gradient does not match the convolution: got ", dy, ", expected ",
         TensorType{x.dtype, expected}, " for input ", x, " and weight ", w);
  return g;
}
void expect_operand_rank(const ConvKind& kind, std::string_view what, const TensorType& t) {
  if (t.shape.rank() != kind.rank + 2)
    fail(kind.op, what, " must have rank ", kind.rank + 2, ": got ", t, ", expected rank ",
         kind.rank + 2);
}
Shape with_spatial(int64_t n, int64_t c, const std::vector<int64_t>& s) {
  std::vector<int64_t> d{n, c};
  d.insert(d.end(), s.begin(), s.end());
  return Shape(d);
}
// conv_input_grad(dy [N, O, *out], w) -> dx [N, C, *in]; attribute input_size = in.
ConvGeom input_grad_geom(const ConvKind& kind, std::span<const TensorType> in, const Attrs& a) {
  expect_operand_rank(kind, "output gradient", in[0]);
  expect_operand_rank(kind, "weight", in[1]);
  const std::vector<int64_t> size = spatial_attr(kind.op, a, "input_size", 0, kind.rank);
  const int64_t c = detail::checked_mul(kind.op, in[1].shape[1], a.get_int("groups"));
  const TensorType x{in[0].dtype, with_spatial(in[0].shape[0], c, size)};
  return grad_geom(kind, in[0], x, in[1], a);
}
// conv_weight_grad(dy [N, O, *out], x) -> dw [O, C/groups, *k]; attribute kernel_size = k.
ConvGeom weight_grad_geom(const ConvKind& kind, std::span<const TensorType> in, const Attrs& a) {
  expect_operand_rank(kind, "output gradient", in[0]);
  expect_operand_rank(kind, "input", in[1]);
  const std::vector<int64_t> size = spatial_attr(kind.op, a, "kernel_size", 1, kind.rank);
  const int64_t groups = std::max<int64_t>(1, a.get_int("groups"));
  const TensorType w{in[1].dtype, with_spatial(in[0].shape[1], in[1].shape[1] / groups, size)};
  return grad_geom(kind, in[0], in[1], w, a);
}

}  // namespace

// conv(x [N, C, *in], w [O, C/groups, *k]) -> [N, O, *out] over 1, 2 or 3 spatial axes.
const Primitive& prim::conv() {
  static const Primitive& p = [] {
    Primitive p;
    p.jvp = [](const RuleArgs& r, std::span<const Tangent> t) {
      return bilinear_jvp(r, t,
                          [&](const Tensor& x, const Tensor& w) { return conv_of(x, w, r.attrs); });
    };
    p.vjp = [](const RuleArgs& r, std::span<const Tangent> ct) -> ops::Ts {
      return {input_grad(*ct[0], r.inputs[1], r.attrs, r.inputs[0].shape()),
              weight_grad(*ct[0], r.inputs[0], r.attrs, r.inputs[1].shape())};
    };
    return define_conv(
        {"conv", conv_geom, [](const ConvGeom& g) { return image_shape(g, g.N, g.O, g.out); },
         &conv_impl<float>, &conv_impl<double>, true, ConvPass::forward},
        std::move(p));
  }();
  return p;
}

const Primitive& prim::conv_input_grad() {
  static const Primitive& p = [] {
    Primitive p;
    p.jvp = [](const RuleArgs& r, std::span<const Tangent> t) {
      const Shape& x = r.outputs[0].shape();
      return bilinear_jvp(
          r, t, [&](const Tensor& dy, const Tensor& w) { return input_grad(dy, w, r.attrs, x); });
    };
    p.vjp = [](const RuleArgs& r, std::span<const Tangent> ct) -> ops::Ts {
      const Tensor &dy = r.inputs[0], &w = r.inputs[1];
      return {conv_of(*ct[0], w, r.attrs), weight_grad(dy, *ct[0], r.attrs, w.shape())};
    };
    return define_conv({"conv_input_grad", input_grad_geom,
                        [](const ConvGeom& g) { return image_shape(g, g.N, g.C, g.in); },
                        &conv_input_grad_impl<float>, &conv_input_grad_impl<double>, true,
                        ConvPass::backward_data},
                       std::move(p));
  }();
  return p;
}

const Primitive& prim::conv_weight_grad() {
  static const Primitive& p = [] {
    Primitive p;
    p.jvp = [](const RuleArgs& r, std::span<const Tangent> t) {
      const Shape& w = r.outputs[0].shape();
      return bilinear_jvp(
          r, t, [&](const Tensor& dy, const Tensor& x) { return weight_grad(dy, x, r.attrs, w); });
    };
    p.vjp = [](const RuleArgs& r, std::span<const Tangent> ct) -> ops::Ts {
      const Tensor &dy = r.inputs[0], &x = r.inputs[1];
      return {conv_of(x, *ct[0], r.attrs), input_grad(dy, *ct[0], r.attrs, x.shape())};
    };
    return define_conv({"conv_weight_grad", weight_grad_geom,
                        [](const ConvGeom& g) { return image_shape(g, g.O, g.C / g.G, g.k); },
                        &conv_weight_grad_impl<float>, &conv_weight_grad_impl<double>, false,
                        ConvPass::backward_weights},
                       std::move(p));
  }();
  return p;
}

namespace {

// ---- pooling ------------------------------------------------------------------------

struct PoolGeom {
  int64_t N, C, H, W, KH, KW, sh, sw, ph, pw, OH, OW;
};

PoolGeom pool_geom(std::string_view op, const TensorType& x, const Attrs& attrs) {
  expect_image(op, "input", x);
  const auto [kh, kw] = pair_attr(op, attrs, "kernel", 1);
  const auto [sh, sw] = pair_attr(op, attrs, "stride", 1);
  const auto [ph, pw] = pair_attr(op, attrs, "padding", 0);
  if (2 * ph > kh || 2 * pw > kw)
    fail(op, "padding larger than half the kernel: got padding [", ph, ", ", pw, "] for kernel [",
         kh, ", ", kw, "], expected padding <= kernel / 2");
  PoolGeom g{x.shape[0], x.shape[1], x.shape[2], x.shape[3], kh, kw, sh, sw, ph, pw, 0, 0};
  const int64_t hp = g.H + 2 * ph, wp = g.W + 2 * pw;
  if (kh > hp || kw > wp)
    fail(op, "kernel larger than the padded input: got input ", x, " with kernel [", kh, ", ", kw,
         "] and padding [", ph, ", ", pw, "], expected the kernel to fit the padded input ", hp,
         "x", wp);
  g.OH = (hp - kh) / sh + 1;
  g.OW = (wp - kw) / sw + 1;
  return g;
}

// Whether v replaces the running maximum m: larger, or NaN (NaN propagates). Evaluated
// without short-circuit so that loops compile to selects: with random data the branches
// mispredicted on every other window (8 ms for a 64x32x28x28 pooling, 1.5 ms without).
template <typename C>
inline bool takes_over(C v, C m) {
  return static_cast<bool>(static_cast<int>(v > m) | static_cast<int>(v != v));
}

// The common 2x2 pooling with stride 2 and no padding, which gets straight-line loops.
bool is_2x2_tiling(const PoolGeom& g) {
  return g.KH == 2 && g.KW == 2 && g.sh == 2 && g.sw == 2 && g.ph == 0 && g.pw == 0;
}

// Visits the windows of output row oh a window offset at a time, in the order each window
// lists its elements (input rows, then columns): visit(base, lo, hi) for each in-image row
// h and column offset kw, where outputs ow in [lo, hi) read the input at base + ow·sw of
// the plane (the others' column lies in the padding). The caller's loop over ow then runs
// with unit stride in the outputs (and in the input where sw is 1), so it vectorises, and
// each output still meets its window's elements in a window loop's order: the same
// results, ties and NaN included.
template <typename F>
void for_window_offsets(const PoolGeom& g, int64_t oh, F&& visit) {
  const int64_t h0 = oh * g.sh - g.ph;
  for (int64_t h = std::max<int64_t>(h0, 0); h < std::min(h0 + g.KH, g.H); ++h)
    for (int64_t kw = 0; kw < g.KW; ++kw) {
      const int64_t first = kw - g.pw;  // output 0's input column
      const int64_t lo = first >= 0 ? 0 : (-first + g.sw - 1) / g.sw;
      const int64_t hi = g.W - 1 - first < 0 ? 0 : std::min(g.OW, (g.W - 1 - first) / g.sw + 1);
      if (lo < hi) visit(h * g.W + first, lo, hi);
    }
}

template <bool IsMax, typename T>
void pool_impl(const Tensor& x_in, const Tensor& out, const PoolGeom& g) {
  using C = detail::compute_t<T>;
  using Acc = std::conditional_t<IsMax, C, double>;
  const Tensor x = x_in.contiguous();
  const T* px = x.data<const T>();
  T* po = out.data<T>();
  const int64_t HW = g.H * g.W, L = g.OH * g.OW;
  const double inv = 1.0 / static_cast<double>(g.KH * g.KW);
  detail::parallel_for(
      g.N * g.C,
      [&](int64_t b, int64_t e) {
        if constexpr (IsMax && std::is_same_v<T, float>)
          if (is_2x2_tiling(g)) return ops::max_pool_2x2({g.H, g.W}, px, po, b, e);
        std::vector<Acc> acc(static_cast<std::size_t>(g.OW));  // one output row's accumulators
        for (int64_t p = b; p < e; ++p) {
          const T* plane = px + p * HW;
          T* dst = po + p * L;
          if (IsMax && is_2x2_tiling(g)) {
            for (int64_t oh = 0; oh < g.OH; ++oh) {
              const T* r0 = plane + 2 * oh * g.W;
              const T* r1 = r0 + g.W;
              T* d = dst + oh * g.OW;
              for (int64_t ow = 0; ow < g.OW; ++ow) {
                C m = static_cast<C>(r0[2 * ow]);
                for (const C v : {static_cast<C>(r0[2 * ow + 1]), static_cast<C>(r1[2 * ow]),
                                  static_cast<C>(r1[2 * ow + 1])})
                  m = takes_over(v, m) ? v : m;
                d[ow] = static_cast<T>(m);
              }
            }
            continue;
          }
          for (int64_t oh = 0; oh < g.OH; ++oh) {
            std::fill(acc.begin(), acc.end(),
                      IsMax ? -std::numeric_limits<Acc>::infinity() : Acc{0});
            for_window_offsets(g, oh, [&](int64_t base, int64_t lo, int64_t hi) {
              for (int64_t ow = lo; ow < hi; ++ow) {
                const C v = static_cast<C>(plane[base + ow * g.sw]);
                if constexpr (IsMax) {
                  acc[ow] = takes_over(v, acc[ow]) ? v : acc[ow];  // NaN propagates
                } else {
                  acc[ow] += static_cast<double>(v);
                }
              }
            });
            for (int64_t ow = 0; ow < g.OW; ++ow)
              if constexpr (IsMax)
                dst[oh * g.OW + ow] = static_cast<T>(acc[ow]);
              else
                dst[oh * g.OW + ow] = static_cast<T>(static_cast<C>(acc[ow] * inv));
          }
        }
      },
      L * g.KH * g.KW);
}

// Each pooling window offset (kh, kw) as a strided slice of the padded input: [N, C, OH, OW].
struct Windows {
  Tensor padded;
  std::vector<int64_t> k, s, p;
  Shape out;
  Tensor at(int64_t kh, int64_t kw) const {
    return slice(padded, {Slice{}, Slice{}, Slice{kh, kh + (out[2] - 1) * s[0] + 1, s[0]},
                          Slice{kw, kw + (out[3] - 1) * s[1] + 1, s[1]}});
  }
  // The transpose of `at`: g placed back on the input grid, padding cropped.
  Tensor back(const Tensor& g, int64_t kh, int64_t kw, const Shape& x) const {
    const Tensor full = ops::unslice(g, padded.shape(), {0, 0, kh, kw}, {1, 1, s[0], s[1]});
    return slice(full,
                 {Slice{}, Slice{}, Slice{p[0], p[0] + x[2], 1}, Slice{p[1], p[1] + x[3], 1}});
  }
};
Windows windows(const Tensor& x, const Attrs& a, const Shape& out, double pad_value) {
  Windows w{Tensor(), a.get_ints("kernel"), a.get_ints("stride"), a.get_ints("padding"), out};
  w.padded = pad(x, {{0, 0}, {0, 0}, {w.p[0], w.p[0]}, {w.p[1], w.p[1]}}, pad_value);
  return w;
}

// max_pool2d: the derivative flows to the element max_pool2d_grad's kernel picks, so that
// forward and reverse mode agree (jacfwd == jacrev): the first maximum among the window's
// input elements (padding is never picked, even when every input is -inf), and in a window
// holding NaN its last NaN (as PyTorch). One mask per window offset, in window order.
std::vector<Tensor> max_masks(const Tensor& x, const Tensor& y, const Attrs& attrs) {
  const Windows xw = windows(x, attrs, y.shape(), -INFINITY);
  const int64_t n = xw.k[0] * xw.k[1];
  // Which offsets of each window fall on the input rather than on the padding.
  const bool padded = xw.p[0] > 0 || xw.p[1] > 0;
  const std::optional<Windows> inside =
      padded ? std::optional<Windows>(windows(ones_like(x), attrs, y.shape(), 0.0)) : std::nullopt;
  auto at = [&](int64_t i) { return xw.at(i / xw.k[1], i % xw.k[1]); };
  auto valid = [&](const Tensor& hit, int64_t i) {
    return inside ? hit && inside->at(i / xw.k[1], i % xw.k[1]) > 0.0 : hit;
  };
  std::vector<Tensor> masks(static_cast<std::size_t>(n));
  Tensor taken = zeros(y.shape(), bool_);
  for (int64_t i = 0; i < n; ++i) {  // equal to the maximum: the first (no NaN in the window)
    const Tensor m = valid(at(i) == y, i) && !taken;
    masks[static_cast<std::size_t>(i)] = m;
    taken = taken || m;
  }
  Tensor nan_taken = zeros(y.shape(), bool_);
  for (int64_t i = n - 1; i >= 0; --i) {  // NaN: the last (padding is -inf, never NaN)
    const Tensor m = isnan(at(i)) && !nan_taken;
    masks[static_cast<std::size_t>(i)] = masks[static_cast<std::size_t>(i)] || m;
    nan_taken = nan_taken || m;
  }
  return masks;
}

// t (shaped like x) at the element of each window of x that max_masks picks; y =
// max_pool2d(x). The JVP of max_pool2d and the transpose of max_pool2d_grad.
Tensor at_chosen_max(const Tensor& x, const Tensor& y, const Tensor& t, const Attrs& attrs) {
  const Windows tw = windows(t, attrs, y.shape(), 0.0);
  const std::vector<Tensor> masks = max_masks(x, y, attrs);
  Tensor out = zeros_like(y);
  std::size_t i = 0;
  for (int64_t kh = 0; kh < tw.k[0]; ++kh)
    for (int64_t kw = 0; kw < tw.k[1]; ++kw)
      out = out + where(masks[i++], tw.at(kh, kw), scalar_like(out, 0.0));
  return out;
}

Tensor max_pool_grad(const Tensor& x, const Tensor& dy, const Attrs& attrs) {
  return bind1(prim::max_pool2d_grad(), {x, dy}, attrs);
}

template <bool IsMax>
Primitive with_pool_rules(Primitive p) {
  if constexpr (IsMax) {
    p.jvp = [](const RuleArgs& r, std::span<const Tangent> t) -> ops::Ts {
      return {at_chosen_max(r.inputs[0], r.outputs[0], *t[0], r.attrs)};
    };
  } else {
    p.jvp = ops::linear_jvp;
  }
  p.vjp = [](const RuleArgs& r, std::span<const Tangent> ct) -> ops::Ts {
    const Tensor& x = r.inputs[0];
    if constexpr (IsMax) return {max_pool_grad(x, *ct[0], r.attrs)};
    const Windows w = windows(x, r.attrs, r.outputs[0].shape(), 0.0);
    const Tensor share = *ct[0] / static_cast<double>(w.k[0] * w.k[1]);
    Tensor g = zeros_like(x);
    for (int64_t kh = 0; kh < w.k[0]; ++kh)
      for (int64_t kw = 0; kw < w.k[1]; ++kw) g = g + w.back(share, kh, kw, x.shape());
    return {g};
  };
  return p;
}

enum class PoolPass { forward, gradient };

// The 2x2 max pooling with stride 2 and its gradient in float32 (ops/pool_blocked.h): x, the
// gradient's dy and the output may each come and go in channel blocks.
Primitive::ChannelBlocked pool_channel_blocked(std::string op, PoolPass pass) {
  const bool grad = pass == PoolPass::gradient;
  Primitive::ChannelBlocked r;
  r.inputs = grad ? std::vector<int>{0, 1} : std::vector<int>{0};
  r.output = true;
  r.applies = [op](std::span<const TensorType> in, const Attrs& a, int64_t block) {
    for (const TensorType& t : in)
      if (t.dtype != float32) return false;
    const PoolGeom g = pool_geom(op, in[0], a);
    return is_2x2_tiling(g) && block % 4 == 0 && g.C % block == 0;
  };
  r.write = [op, grad](std::span<const Tensor> in, const Primitive::ChannelBlocked::Call& call,
                       const Tensor& out, const Attrs& a) {
    using ops::Layout;
    const PoolGeom g = pool_geom(op, in[0].type(), a);
    const ops::Images2x2 images{g.N, g.C, call.block, {g.H, g.W}};
    auto layout_of = [&](int i) {
      const bool blocked =
          std::find(call.inputs.begin(), call.inputs.end(), i) != call.inputs.end();
      return blocked ? Layout::blocked : Layout::plain;
    };
    const ops::PoolLayouts layouts{.x = layout_of(0),
                                   .dy = layout_of(grad ? 1 : 0),
                                   .out = call.output ? Layout::blocked : Layout::plain};
    const Tensor x = in[0].contiguous();
    if (grad) {
      ops::max_pool_2x2_images_grad(images, layouts, x.data<const float>(),
                                    in[1].contiguous().data<const float>(), out.data<float>());
    } else {
      ops::max_pool_2x2_images(images, layouts, x.data<const float>(), out.data<float>());
    }
  };
  return r;
}

template <bool IsMax>
const Primitive& define_pool(std::string name, Loc loc) {
  TypeRule rule = [name](std::span<const TensorType> in, const Attrs& attrs) {
    const PoolGeom g = pool_geom(name, in[0], attrs);
    return std::vector<TensorType>{{in[0].dtype, Shape{g.N, g.C, g.OH, g.OW}}};
  };
  Kernel kernel = [name](std::span<const Tensor> in, const Attrs& attrs) {
    const PoolGeom g = pool_geom(name, in[0].type(), attrs);
    Tensor out = empty(Shape{g.N, g.C, g.OH, g.OW}, in[0].dtype());
    detail::visit_floating(in[0].dtype(),
                           [&]<typename T>() { pool_impl<IsMax, T>(in[0], out, g); });
    return std::vector<Tensor>{out};
  };
  Primitive p = with_pool_rules<IsMax>(primitive_of(name, 1, std::move(rule)));
  p.batch = batch_images;
  if constexpr (IsMax) p.channel_blocked = pool_channel_blocked(name, PoolPass::forward);
  return detail::register_builtin(std::move(p),
                                  {{ops::cpu({DTypeSet::floating()}), std::move(kernel)}}, loc);
}

// max_pool2d_grad over planes [b, e) (all but float32 over the 2x2 tiling, which has vector
// kernels): each output row's windows a window offset at a time (for_window_offsets), keeping
// per output its running maximum (the forward's comparison) and the base of the window offset
// that holds it, stored as base + pw >= 0 in Code, as wide as the compute type where the
// plane's indices fit, so that the loop over the outputs vectorises (also for float64's 2x2
// tiling: 2-2.5x faster than a loop per window). dy is then added at each output's choice in
// output order.
template <typename Code, typename T>
void max_pool_grad_rows(const PoolGeom& g, const T* px, const T* pd, T* po, int64_t b, int64_t e) {
  using C = detail::compute_t<T>;
  const int64_t HW = g.H * g.W, L = g.OH * g.OW;
  const int64_t sw = g.sw, pw = g.pw;  // locals: the stores to code[] cannot alias them
  std::vector<C> acc(static_cast<std::size_t>(g.OW));
  std::vector<Code> code(static_cast<std::size_t>(g.OW));
  for (int64_t p = b; p < e; ++p) {
    const T* plane = px + p * HW;
    const T* grad = pd + p * L;
    T* dst = po + p * HW;
    std::fill(dst, dst + HW, T{0});
    for (int64_t oh = 0; oh < g.OH; ++oh) {
      std::fill(acc.begin(), acc.end(), -std::numeric_limits<C>::infinity());
      std::fill(code.begin(), code.end(), Code{-1});
      for_window_offsets(g, oh, [&](int64_t base, int64_t lo, int64_t hi) {
        const auto c = static_cast<Code>(base + pw);
        for (int64_t ow = lo; ow < hi; ++ow) {
          const C v = static_cast<C>(plane[base + ow * sw]), a = acc[ow];
          const Code k = code[ow];
          const bool take = (k < 0) | takes_over(v, a);  // the first, or the forward's rule
          acc[ow] = take ? v : a;
          code[ow] = take ? c : k;
        }
      });
      for (int64_t ow = 0; ow < g.OW; ++ow)
        if (code[ow] >= 0) {
          const int64_t i = static_cast<int64_t>(code[ow]) - pw + ow * sw;
          dst[i] = static_cast<T>(static_cast<C>(dst[i]) + static_cast<C>(grad[oh * g.OW + ow]));
        }
    }
  }
}

// dx = max_pool2d_grad(x, dy): each dy entry added to the first maximum of its window in x
// (the forward's comparison, so a NaN window routes to its NaN). One pass over x, where the
// rule built from masks above takes a dozen full-size temporaries.
template <typename T>
void max_pool_grad_impl(const Tensor& x_in, const Tensor& dy_in, const Tensor& dx,
                        const PoolGeom& g) {
  using C = detail::compute_t<T>;
  const Tensor x = x_in.contiguous(), dy = dy_in.contiguous();
  const T* px = x.data<const T>();
  const T* pd = dy.data<const T>();
  T* po = dx.data<T>();
  const int64_t HW = g.H * g.W;
  detail::parallel_for(
      g.N * g.C,
      [&](int64_t b, int64_t e) {
        if constexpr (std::is_same_v<T, float>)
          if (is_2x2_tiling(g)) return ops::max_pool_2x2_grad({g.H, g.W}, px, pd, po, b, e);
        return sizeof(C) == sizeof(int32_t) && HW + g.KW <= std::numeric_limits<int32_t>::max()
                   ? max_pool_grad_rows<int32_t>(g, px, pd, po, b, e)
                   : max_pool_grad_rows<int64_t>(g, px, pd, po, b, e);
      },
      g.OH * g.OW * g.KH * g.KW);
}

// max_pool2d_grad(x [N, C, H, W], dy [N, C, OH, OW]) -> dx [N, C, H, W]; the attributes of
// the max_pool2d it differentiates. Linear in dy; piecewise constant in x.
}  // namespace

const Primitive& prim::max_pool2d_grad() {
  static const Primitive& p = [loc = Loc::current()]() -> const Primitive& {
    constexpr std::string_view op = "max_pool2d_grad";
    Primitive p =
        primitive_of(std::string(op), 2, [op](std::span<const TensorType> in, const Attrs& a) {
          const PoolGeom g = pool_geom(op, in[0], a);
          const TensorType expected{in[0].dtype, Shape{g.N, g.C, g.OH, g.OW}};
          if (in[1] != expected)
            fail(op, "output gradient does not match the pooling: got ", in[1], ", expected ",
                 expected, " for input ", in[0]);
          return std::vector<TensorType>{in[0]};
        });
    p.jvp = [](const RuleArgs& r, std::span<const Tangent> t) -> ops::Ts {
      if (!t[1]) return {zeros_like(r.outputs[0])};
      return {max_pool_grad(r.inputs[0], *t[1], r.attrs)};
    };
    p.vjp = [](const RuleArgs& r, std::span<const Tangent> ct) -> ops::Ts {
      const Tensor& x = r.inputs[0];
      const Tensor y = bind1(prim::max_pool2d(), {x}, r.attrs);
      return {std::nullopt, at_chosen_max(x, y, *ct[0], r.attrs)};
    };
    p.batch = [](const BatchArgs& b) {
      std::vector<Tensor> ins;
      Shape x;
      for (std::size_t i = 0; i < 2; ++i) {
        const Tensor t = ops::batch_first(b.inputs[i], b.dims[i], b.size);
        const Shape& s = t.shape();
        if (i == 0) x = s;
        ins.push_back(reshape(t, Shape{s[0] * s[1], s[2], s[3], s[4]}));
      }
      const Tensor dx = bind1(b.primitive, ins, b.attrs);
      return std::vector<Batched>{{reshape(dx, x), 0}};
    };
    p.channel_blocked = pool_channel_blocked(std::string(op), PoolPass::gradient);
    Kernel kernel = [op](std::span<const Tensor> in, const Attrs& attrs) {
      const PoolGeom g = pool_geom(op, in[0].type(), attrs);
      Tensor dx = empty(in[0].shape(), in[0].dtype());
      detail::visit_floating(in[0].dtype(),
                             [&]<typename T>() { max_pool_grad_impl<T>(in[0], in[1], dx, g); });
      return std::vector<Tensor>{dx};
    };
    return detail::register_builtin(
        std::move(p), {{ops::cpu({DTypeSet::floating(), DTypeSet::floating()}), std::move(kernel)}},
        loc);
  }();
  return p;
}

const Primitive& prim::max_pool2d() {
  static const Primitive& p = define_pool<true>("max_pool2d", Loc::current());
  return p;
}
const Primitive& prim::avg_pool2d() {
  static const Primitive& p = define_pool<false>("avg_pool2d", Loc::current());
  return p;
}

namespace {

// The options of a public convolution of any rank, one value per spatial axis.
struct ConvArgs {
  std::vector<int64_t> stride, padding, dilation, output_padding;
  int64_t groups;
  std::optional<PaddingRule> rule;
  std::optional<Tensor> bias;
};
std::vector<int64_t> ints(std::pair<int64_t, int64_t> p) { return {p.first, p.second}; }
std::vector<int64_t> ints(int64_t v) { return {v}; }
std::vector<int64_t> ints(const std::array<int64_t, 3>& v) { return {v.begin(), v.end()}; }
template <int N>
std::vector<int64_t> ints(const ConvPadding<N>& p) {
  return ints(p.sizes);
}

std::string conv_name(std::string_view stem, int rank) {
  return std::string(stem) + std::to_string(rank) + "d";
}

// A public convolution's operands: x (given a unit batch axis when unbatched), w and the bias,
// promoted to one floating dtype.
struct ConvOperands {
  Tensor x, w;
  std::optional<Tensor> bias;
  bool unbatched;
};
ConvOperands conv_operands(const std::string& op, int rank, const Tensor& x, const Tensor& w,
                           const std::optional<Tensor>& bias, Loc loc) {
  if (!x.defined() || !w.defined() || (bias && !bias->defined()))
    fail(op, "undefined operand: got a default-constructed Tensor, expected tensors");
  static constexpr const char* kUnbatched[] = {"[C, W]", "[C, H, W]", "[C, D, H, W]"};
  const bool unbatched = x.rank() == rank + 1;
  if (!unbatched && x.rank() != rank + 2)
    fail(op, "input must have rank ", rank + 2, " (or ", rank + 1, ", unbatched): got ", x.type(),
         ", expected ", layout(rank, false), " or ", kUnbatched[rank - 1]);
  DType dt = promote_types(x.dtype(), w.dtype());
  if (bias) dt = promote_types(dt, bias->dtype());
  dt = to_floating(dt);
  const Tensor xb = unbatched ? expand_dims(x, 0, loc) : x;
  ConvOperands out{ops::cast_if_needed(xb, dt, loc), ops::cast_if_needed(w, dt, loc), std::nullopt,
                   unbatched};
  if (bias) out.bias = ops::cast_if_needed(*bias, dt, loc);
  return out;
}

// y [N, O, *out] plus the bias [O] on each channel, without the batch axis for an unbatched
// input.
Tensor conv_result(const std::string& op, const ConvOperands& o, const Tensor& y, Loc loc) {
  Tensor out = y;
  if (o.bias) {
    const int64_t O = y.shape()[1];
    if (o.bias->rank() != 1 || o.bias->shape()[0] != O)
      fail(op, "bias does not match the output channels: got bias ", o.bias->type(),
           " for an output ", y.type(), ", expected [", O, "]");
    std::vector<int64_t> dims(static_cast<std::size_t>(y.rank()), 1);
    dims[1] = O;
    out = add(y, reshape(*o.bias, Shape(dims), loc), loc);
  }
  return o.unbatched ? squeeze(out, {0}, loc) : out;
}

// padding = "same" as explicit padding: dilation * (k - 1) per axis, half on each side, and
// where that is odd the extra one padded after into x beforehand (as PyTorch does).
void pad_same(const std::string& op, int rank, Tensor& x, const Tensor& w, const ConvArgs& a,
              std::vector<int64_t>& padding, Loc loc) {
  for (const int64_t s : a.stride)
    if (s != 1) fail(op, "padding='same' needs stride 1: got a stride of ", s, ", expected 1");
  padding.assign(static_cast<std::size_t>(rank), 0);
  // A weight or dilation the convolution rejects: let it name the error.
  if (w.rank() != rank + 2 || a.dilation.size() != static_cast<std::size_t>(rank)) return;
  std::vector<std::pair<int64_t, int64_t>> widths(static_cast<std::size_t>(x.rank()), {0, 0});
  bool odd = false;
  for (int i = 0; i < rank; ++i) {
    const int64_t k = w.shape()[i + 2], d = a.dilation[static_cast<std::size_t>(i)];
    if (k < 1 || d < 1) return;
    const int64_t total = detail::checked_mul(op, d, k - 1);
    padding[static_cast<std::size_t>(i)] = total / 2;
    widths[static_cast<std::size_t>(i + 2)].second = total % 2;
    odd = odd || total % 2 != 0;
  }
  if (odd) x = pad(x, widths, 0.0, loc);
}

Tensor conv_nd(int rank, const Tensor& x_in, const Tensor& w_in, const ConvArgs& a, Loc loc) {
  const detail::CallSite site(loc);
  const std::string op = conv_name("conv", rank);
  const ConvOperands o = conv_operands(op, rank, x_in, w_in, a.bias, loc);
  Tensor x = o.x;
  std::vector<int64_t> padding = a.padding;
  if (a.rule == PaddingRule::valid) padding.assign(static_cast<std::size_t>(rank), 0);
  if (a.rule == PaddingRule::same) pad_same(op, rank, x, o.w, a, padding, loc);
  const Attrs attrs{
      {"stride", a.stride}, {"padding", padding}, {"dilation", a.dilation}, {"groups", a.groups}};
  return conv_result(op, o, bind1(prim::conv(), {x, o.w}, attrs, loc), loc);
}

// The transposed convolution of x [N, C, *in] with w [C, O/groups, *k] (PyTorch's layout): the
// gradient of conv with respect to its input, at an input of size
//   out = (in - 1) * stride - 2 * padding + dilation * (k - 1) + output_padding + 1.
// That is conv_input_grad itself when output_padding < stride (conv's floor division then maps
// out back to in); otherwise (output_padding < dilation) the unpadded transpose, cropped by
// padding and extended by zeros.
Tensor conv_transpose_nd(int rank, const Tensor& x_in, const Tensor& w_in, const ConvArgs& a,
                         Loc loc) {
  const detail::CallSite site(loc);
  const std::string op = conv_name("conv_transpose", rank);
  const ConvOperands o = conv_operands(op, rank, x_in, w_in, a.bias, loc);
  const Tensor& x = o.x;
  const Tensor& w = o.w;
  if (w.shape().rank() != rank + 2)
    fail(op, "weight must have rank ", rank + 2, ": got ", w.type(), ", expected ",
         std::array{"[C, O/groups, KW]", "[C, O/groups, KH, KW]",
                    "[C, O/groups, KD, KH, KW]"}[static_cast<std::size_t>(rank - 1)]);
  const Attrs given{{"stride", a.stride},
                    {"padding", a.padding},
                    {"dilation", a.dilation},
                    {"output_padding", a.output_padding}};
  const std::vector<int64_t> stride = spatial_attr(op, given, "stride", 1, rank),
                             padding = spatial_attr(op, given, "padding", 0, rank),
                             dil = spatial_attr(op, given, "dilation", 1, rank),
                             out_padding = spatial_attr(op, given, "output_padding", 0, rank);
  if (a.groups < 1)
    fail(op, "non-positive groups: got groups=", a.groups, ", expected groups >= 1");
  const int64_t C = x.shape()[1];
  if (w.shape()[0] != C)
    fail(op, "weight does not match the input channels: got input ", x.type(), " and weight ",
         w.type(), ", expected w.shape[0] == C (", w.shape()[0], " vs ", C, ")");
  if (C % a.groups != 0)
    fail(op, "input channels not divisible by groups: got input ", x.type(),
         " with groups=", a.groups, ", expected C (", C, ") to be a multiple of groups");
  std::vector<int64_t> out(static_cast<std::size_t>(rank)), full(out.size());
  bool direct = true;
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (out_padding[i] >= std::max(stride[i], dil[i]))
      fail(op, "output_padding not smaller than stride or dilation: got output_padding [",
           spatial_string(out_padding, ", "), "] with stride [", spatial_string(stride, ", "),
           "] and dilation [", spatial_string(dil, ", "),
           "], expected output_padding < max(stride, dilation) on each axis");
    const int64_t in = x.shape()[static_cast<int64_t>(i) + 2],
                  k = w.shape()[static_cast<int64_t>(i) + 2];
    // The unpadded transpose's size.
    full[i] = detail::checked_add(op, detail::checked_mul(op, in - 1, stride[i]),
                                  detail::checked_mul(op, dil[i], k - 1) + 1);
    out[i] = full[i] - 2 * padding[i] + out_padding[i];
    if (out[i] < 1)
      fail(op, "output size not positive: got input ", x.type(), " and weight ", w.type(),
           " with padding [", spatial_string(padding, ", "), "], giving an output of size ", out[i],
           " on spatial axis ", i, ", expected sizes >= 1");
    direct = direct && out_padding[i] < stride[i];
  }
  Attrs attrs{{"stride", stride},
              {"padding", padding},
              {"dilation", dil},
              {"groups", a.groups},
              {"input_size", out}};
  if (direct) return conv_result(op, o, bind1(prim::conv_input_grad(), {x, w}, attrs, loc), loc);
  attrs.set("padding", std::vector<int64_t>(out.size(), 0));
  attrs.set("input_size", full);
  const Tensor y = bind1(prim::conv_input_grad(), {x, w}, attrs, loc);
  std::vector<Slice> crop{Slice{}, Slice{}};
  std::vector<std::pair<int64_t, int64_t>> zeros_after{{0, 0}, {0, 0}};
  for (std::size_t i = 0; i < out.size(); ++i) {
    crop.push_back(Slice{padding[i], std::min(full[i], padding[i] + out[i]), 1});
    zeros_after.emplace_back(0, std::max<int64_t>(0, padding[i] + out[i] - full[i]));
  }
  return conv_result(op, o, pad(slice(y, crop, loc), zeros_after, 0.0, loc), loc);
}

}  // namespace

Tensor conv1d(const Tensor& x, const Tensor& w, const Conv1dOptions& o, Loc loc) {
  return conv_nd(
      1, x, w,
      {ints(o.stride), ints(o.padding), ints(o.dilation), {}, o.groups, o.padding.rule, o.bias},
      loc);
}
Tensor conv2d(const Tensor& x, const Tensor& w, const Conv2dOptions& o, Loc loc) {
  return conv_nd(
      2, x, w,
      {ints(o.stride), ints(o.padding), ints(o.dilation), {}, o.groups, o.padding.rule, o.bias},
      loc);
}
Tensor conv3d(const Tensor& x, const Tensor& w, const Conv3dOptions& o, Loc loc) {
  return conv_nd(
      3, x, w,
      {ints(o.stride), ints(o.padding), ints(o.dilation), {}, o.groups, o.padding.rule, o.bias},
      loc);
}
Tensor conv_transpose1d(const Tensor& x, const Tensor& w, const ConvTranspose1dOptions& o,
                        Loc loc) {
  return conv_transpose_nd(1, x, w,
                           {ints(o.stride), ints(o.padding), ints(o.dilation),
                            ints(o.output_padding), o.groups, std::nullopt, o.bias},
                           loc);
}
Tensor conv_transpose2d(const Tensor& x, const Tensor& w, const ConvTranspose2dOptions& o,
                        Loc loc) {
  return conv_transpose_nd(2, x, w,
                           {ints(o.stride), ints(o.padding), ints(o.dilation),
                            ints(o.output_padding), o.groups, std::nullopt, o.bias},
                           loc);
}
Tensor conv_transpose3d(const Tensor& x, const Tensor& w, const ConvTranspose3dOptions& o,
                        Loc loc) {
  return conv_transpose_nd(3, x, w,
                           {ints(o.stride), ints(o.padding), ints(o.dilation),
                            ints(o.output_padding), o.groups, std::nullopt, o.bias},
                           loc);
}

}  // namespace kiln
