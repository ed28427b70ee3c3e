// Convolution and pooling over NCHW images: the `conv2d`, `max_pool2d` and `avg_pool2d`
// primitives and their public ops.
//
// conv2d and its two gradients (conv2d_input_grad, conv2d_weight_grad) run through oneDNN
// in float32 (src/ops/conv_dnnl.cpp: 1.5-2x faster than im2col here); otherwise they lower
// to im2col + OpenBLAS gemm per group; small images are batched into one wide gemm so that gemm
// sees enough columns. f16/bf16 compute in float32. im2col and its transpose run in parallel over
// image planes: OpenBLAS is the OpenMP build, so they share gemm's thread pool.
#include <cblas.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <type_traits>

#include "detail/checked.h"
#include "detail/copy.h"
#include "detail/dtype_dispatch.h"
#include "detail/parallel.h"
#include "kiln/ops.h"
#include "ops/conv_dnnl.h"
#include "ops/primitives.h"
#include "ops/rules.h"

namespace kiln {
namespace {

constexpr std::string_view kFloatDesc = "a floating dtype (f16, bf16, f32, f64)";

// A 2-element attribute (stride, padding, ...), validated.
std::pair<int64_t, int64_t> pair_attr(std::string_view op, const Attrs& attrs,
                                      std::string_view name, int64_t min_value) {
  const std::vector<int64_t>& v = attrs.get_ints(name);
  if (v.size() != 2)
    fail(op, "attribute '", name, "' has the wrong length: got ", attr_to_string(v),
         ", expected 2 values (height, width)");
  if (v[0] < min_value || v[1] < min_value)
    fail(op, min_value > 0 ? "non-positive " : "negative ", name, ": got ", attr_to_string(v),
         ", expected values >= ", min_value);
  if (v[0] > INT_MAX || v[1] > INT_MAX)
    fail(op, "attribute '", name, "' too large: got ", attr_to_string(v),
         ", expected values below 2^31");
  return {v[0], v[1]};
}

void expect_image(std::string_view op, std::string_view what, const TensorType& t) {
  if (t.shape.rank() != 4)
    fail(op, what, " must have rank 4: got ", t, ", expected ",
         what == "weight" ? "[O, C/groups, KH, KW]" : "[N, C, H, W]");
  ops::expect_dtype(op, t, DTypeSet::floating(), kFloatDesc);
}

using ops::ConvGeom;
using ops::ConvPass;

// The geometry of x [N, C, H, W] convolved with w [O, C/groups, KH, KW]; `op` names the
// primitive in errors (the gradient primitives share the forward's checks).
ConvGeom conv_geom(std::string_view op, std::span<const TensorType> in, const Attrs& attrs) {
  const TensorType& x = in[0];
  const TensorType& w = in[1];
  expect_image(op, "input", x);
  expect_image(op, "weight", w);
  if (x.dtype != w.dtype)
    fail(op, "input and weight differ in dtype: got ", x, " and ", w,
         ", expected one dtype (the public conv2d promotes first)");
  const auto [sh, sw] = pair_attr(op, attrs, "stride", 1);
  const auto [ph, pw] = pair_attr(op, attrs, "padding", 0);
  const auto [dh, dw] = pair_attr(op, attrs, "dilation", 1);
  const int64_t G = attrs.get_int("groups");
  if (G < 1) fail(op, "non-positive groups: got groups=", G, ", expected groups >= 1");
  ConvGeom g{x.shape[0], x.shape[1], x.shape[2], x.shape[3], w.shape[0], w.shape[2], w.shape[3], sh,
             sw,         ph,         pw,         dh,         dw,         G,          0,          0};
  if (g.C % G != 0)
    fail(op, "input channels not divisible by groups: got input ", x, " with groups=", G,
         ", expected C (", g.C, ") to be a multiple of groups");
  if (g.O % G != 0)
    fail(op, "output channels not divisible by groups: got weight ", w, " with groups=", G,
         ", expected O (", g.O, ") to be a multiple of groups");
  if (w.shape[1] != g.C / G)
    fail(op, "weight channels do not match the input: got input ", x, " and weight ", w,
         " with groups=", G, ", expected w.shape[1] == C/groups (", w.shape[1], " vs ", g.C / G,
         ")");
  if (g.KH < 1 || g.KW < 1)
    fail(op, "empty kernel: got weight ", w, ", expected KH >= 1 and KW >= 1");
  // The dilated kernel's extent: checked, as a weight can be a broadcast view of 2^60 taps.
  const int64_t ekh = detail::checked_add(op, detail::checked_mul(op, dh, g.KH - 1), 1);
  const int64_t ekw = detail::checked_add(op, detail::checked_mul(op, dw, g.KW - 1), 1);
  const int64_t hp = g.H + 2 * ph, wp = g.W + 2 * pw;
  if (ekh > hp || ekw > wp)
    fail(op, "kernel larger than the padded input: got input ", x, " and weight ", w, " (padding [",
         ph, ", ", pw, "], dilation [", dh, ", ", dw, "]), expected an effective kernel of ", ekh,
         "x", ekw, " to fit the padded input ", hp, "x", wp);
  g.OH = (hp - ekh) / sh + 1;
  g.OW = (wp - ekw) / sw + 1;
  return g;
}

std::vector<TensorType> conv_rule(std::span<const TensorType> in, const Attrs& attrs) {
  const ConvGeom g = conv_geom("conv2d", in, attrs);
  return {{in[0].dtype, Shape{g.N, g.O, g.OH, g.OW}}};
}

// Row-major C = A·B + beta·C with either operand transposed, for float or double.
template <typename T>
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda, const T* b,
          int64_t ldb, T beta, T* c, int64_t ldc) {
  const auto i = [](int64_t v) { return static_cast<blasint>(v); };
  const CBLAS_TRANSPOSE at = ta ? CblasTrans : CblasNoTrans, bt = tb ? CblasTrans : CblasNoTrans;
  detail::set_library_threads();
  if constexpr (std::is_same_v<T, float>)
    cblas_sgemm(CblasRowMajor, at, bt, i(m), i(n), i(k), 1.0f, a, i(lda), b, i(ldb), beta, c,
                i(ldc));
  else
    cblas_dgemm(CblasRowMajor, at, bt, i(m), i(n), i(k), 1.0, a, i(lda), b, i(ldb), beta, c,
                i(ldc));
}

// Output columns [lo, hi) of kernel tap kw whose input column lies inside [0, W).
std::pair<int64_t, int64_t> tap_columns(const ConvGeom& g, int64_t iw0) {
  int64_t lo = iw0 >= 0 ? 0 : (-iw0 + g.sw - 1) / g.sw;
  int64_t hi = iw0 >= g.W ? 0 : (g.W - 1 - iw0) / g.sw + 1;
  lo = std::min(lo, g.OW);
  hi = std::clamp(hi, lo, g.OW);
  return {lo, hi};
}

// Fills one im2col row: dst[oh*OW + ow] = plane[ih, iw] for kernel tap (kh, kw), or 0 where
// the tap falls into the padding.
template <typename T>
void im2col_row(const ConvGeom& g, const T* plane, int64_t kh, int64_t kw, T* dst) {
  const int64_t iw0 = kw * g.dw - g.pw;  // input column of output column ow: iw0 + ow * sw
  const auto [lo, hi] = tap_columns(g, iw0);
  for (int64_t oh = 0; oh < g.OH; ++oh) {
    T* d = dst + oh * g.OW;
    const int64_t ih = oh * g.sh - g.ph + kh * g.dh;
    if (ih < 0 || ih >= g.H) {
      std::fill(d, d + g.OW, T{0});
      continue;
    }
    const T* s = plane + ih * g.W;
    std::fill(d, d + lo, T{0});
    if (g.sw == 1) {
      if (hi > lo) std::memcpy(d + lo, s + iw0 + lo, static_cast<std::size_t>(hi - lo) * sizeof(T));
    } else {
      for (int64_t ow = lo; ow < hi; ++ow) d[ow] = s[iw0 + ow * g.sw];
    }
    std::fill(d + hi, d + g.OW, T{0});
  }
}

// The transpose of im2col_row: adds src[oh*OW + ow] back onto the input pixel it came from.
template <typename T>
void col2im_row_add(const ConvGeom& g, T* plane, int64_t kh, int64_t kw, const T* src) {
  const int64_t iw0 = kw * g.dw - g.pw;
  const auto [lo, hi] = tap_columns(g, iw0);
  for (int64_t oh = 0; oh < g.OH; ++oh) {
    const int64_t ih = oh * g.sh - g.ph + kh * g.dh;
    if (ih < 0 || ih >= g.H) continue;
    T* d = plane + ih * g.W + iw0;
    const T* s = src + oh * g.OW;
    if (g.sw == 1) {
      for (int64_t ow = lo; ow < hi; ++ow) d[ow] += s[ow];
    } else {
      for (int64_t ow = lo; ow < hi; ++ow) d[ow * g.sw] += s[ow];
    }
  }
}

constexpr int64_t kColumnBudgetBytes = int64_t{64} << 20;  // im2col buffer per chunk
constexpr int64_t kTargetColumns = 4096;                   // gemm width worth batching to

// The im2col view of a batch: images [n0, n0 + cnt) side by side, so that one gemm of width
// cnt * L serves them all (small images alone give gemm too few columns to be fast).
template <typename T>
struct Columns {
  const ConvGeom& g;
  int64_t Cg, Og, K, L, nb, width = 0;
  std::vector<T> col;  // [K, nb * L]: row (c, kh, kw), image i in columns [i*L, (i+1)*L)
  std::vector<T> tmp;  // [Og, nb * L]: one group's outputs (or output gradients) side by side

  explicit Columns(const ConvGeom& geom)
      : g(geom), Cg(g.C / g.G), Og(g.O / g.G), K(Cg * g.KH * g.KW), L(g.OH * g.OW) {
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
        L * g.KH * g.KW);
  }
  T* row(int64_t c, int64_t kh, int64_t kw, int64_t i) {
    return col.data() + ((c * g.KH + kh) * g.KW + kw) * width + i * L;
  }
  void fill(const T* x, int64_t n0, int64_t count, int64_t gi) {
    const int64_t HW = g.H * g.W;
    each_plane(count, [&](int64_t i, int64_t c) {
      const T* plane = x + (n0 + i) * g.C * HW + (gi * Cg + c) * HW;
      for (int64_t kh = 0; kh < g.KH; ++kh)
        for (int64_t kw = 0; kw < g.KW; ++kw) im2col_row(g, plane, kh, kw, row(c, kh, kw, i));
    });
  }
  void add_back(T* dx, int64_t n0, int64_t count, int64_t gi) {
    const int64_t HW = g.H * g.W;
    each_plane(count, [&](int64_t i, int64_t c) {
      T* plane = dx + (n0 + i) * g.C * HW + (gi * Cg + c) * HW;
      for (int64_t kh = 0; kh < g.KH; ++kh)
        for (int64_t kw = 0; kw < g.KW; ++kw) col2im_row_add(g, plane, kh, kw, row(c, kh, kw, i));
    });
  }
  // Group gi's rows of an [N, O, OH, OW] tensor for the current images, as [Og, width] with
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
  const int64_t K = g.C / g.G * g.KH * g.KW, L = g.OH * g.OW;
  if (std::max({g.O / g.G, K, L, g.H * g.W}) > INT_MAX / 2)
    fail(op, "problem too large for BLAS: got input [", g.N, ", ", g.C, ", ", g.H, ", ", g.W,
         "] and weight [", g.O, ", ", g.C / g.G, ", ", g.KH, ", ", g.KW,
         "], expected matrix dimensions below 2^30");
}

bool is_pointwise(const ConvGeom& g) {
  return g.KH == 1 && g.KW == 1 && g.sh == 1 && g.sw == 1 && g.ph == 0 && g.pw == 0;
}
// f(n, gi) for each image and group: pointwise kernels need no im2col, one gemm per pair.
template <typename F>
void each_image_group(const ConvGeom& g, F&& f) {
  for (int64_t n = 0; n < g.N; ++n)
    for (int64_t gi = 0; gi < g.G; ++gi) f(n, gi);
}

// y = conv(x, w): per group, W_g [Og, K] · columns [K, width].
template <typename T>
Tensor conv_impl(const Tensor& x_in, const Tensor& w_in, const ConvGeom& g) {
  Tensor out = empty(Shape{g.N, g.O, g.OH, g.OW}, dtype_v<T>);
  if (out.numel() == 0) return out;
  check_blas_size("conv2d", g);
  const Tensor x = x_in.contiguous(), w = w_in.contiguous();
  const T* px = x.data<const T>();
  const T* pw = w.data<const T>();
  T* po = out.data<T>();
  const int64_t Cg = g.C / g.G, Og = g.O / g.G, K = Cg * g.KH * g.KW, L = g.OH * g.OW;
  if (K == 0) {  // no input channels: every output is an empty sum
    std::fill(po, po + out.numel(), T{0});
    return out;
  }
  if constexpr (std::is_same_v<T, float>)
    if (ops::dnnl_conv(ConvPass::forward, g, px, pw, po)) return out;
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

// dx = conv2d_input_grad(dy, w): per group, columns [K, width] = W_g^T · dY_g, then each
// column entry is added back onto the pixel im2col took it from.
template <typename T>
Tensor conv_input_grad_impl(const Tensor& ct_in, const Tensor& w_in, const ConvGeom& g) {
  Tensor dx = empty(Shape{g.N, g.C, g.H, g.W}, dtype_v<T>);
  if (dx.numel() == 0) return dx;
  if (ct_in.numel() == 0) return zeros(dx.shape(), dx.dtype());
  check_blas_size("conv2d_input_grad", g);
  const Tensor ct = ct_in.contiguous(), w = w_in.contiguous();
  const T* pc = ct.data<const T>();
  const T* pw = w.data<const T>();
  T* px = dx.data<T>();
  const int64_t Cg = g.C / g.G, Og = g.O / g.G, K = Cg * g.KH * g.KW, L = g.OH * g.OW;
  if constexpr (std::is_same_v<T, float>)
    if (ops::dnnl_conv(ConvPass::backward_data, g, pc, pw, px)) return dx;
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

// dw = conv2d_weight_grad(dy, x): per group, dW_g [Og, K] += dY_g [Og, width] · columns^T.
template <typename T>
Tensor conv_weight_grad_impl(const Tensor& ct_in, const Tensor& x_in, const ConvGeom& g) {
  const int64_t Cg = g.C / g.G, Og = g.O / g.G, K = Cg * g.KH * g.KW, L = g.OH * g.OW;
  Tensor dw = empty(Shape{g.O, Cg, g.KH, g.KW}, dtype_v<T>);
  if (dw.numel() == 0) return dw;
  if (ct_in.numel() == 0) return zeros(dw.shape(), dw.dtype());
  check_blas_size("conv2d_weight_grad", g);
  const Tensor ct = ct_in.contiguous(), x = x_in.contiguous();
  const T* pc = ct.data<const T>();
  const T* px = x.data<const T>();
  T* pw = dw.data<T>();
  if constexpr (std::is_same_v<T, float>)
    if (ops::dnnl_conv(ConvPass::backward_weights, g, pc, px, pw)) return dw;
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

// The gradients of y = conv2d(x, w) as primitives of their own (im2col + gemm, no
// transposed copies of the operands). conv2d is bilinear, so
//   <dy, conv2d(x, w)> = <conv2d_input_grad(dy, w), x> = <conv2d_weight_grad(dy, x), w>,
// and each of the three primitives' derivatives is one of the other two.
Tensor input_grad(const Tensor& dy, const Tensor& w, const Attrs& a, const Shape& x) {
  return bind1(prim::conv2d_input_grad(), {dy, w}, with(a, "input_size", {x[2], x[3]}));
}
Tensor weight_grad(const Tensor& dy, const Tensor& x, const Attrs& a, const Shape& w) {
  return bind1(prim::conv2d_weight_grad(), {dy, x}, with(a, "kernel_size", {w[2], w[3]}));
}
Tensor conv(const Tensor& x, const Tensor& w, const Attrs& a) {
  return bind1(prim::conv2d(), {x, w}, conv_attrs(a));
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

Kernel conv_kernel(std::function<ConvGeom(std::span<const Tensor>, const Attrs&)> geom,
                   Tensor (*f32)(const Tensor&, const Tensor&, const ConvGeom&),
                   Tensor (*f64)(const Tensor&, const Tensor&, const ConvGeom&)) {
  return [geom, f32, f64](std::span<const Tensor> in, const Attrs& attrs) {
    const ConvGeom g = geom(in, attrs);
    return std::vector<Tensor>{in_float(in, [&]<typename T>(const Tensor& a, const Tensor& b) {
      return std::is_same_v<T, float> ? f32(a, b, g) : f64(a, b, g);
    })};
  };
}

// `folds`: a batch of the first operand alone folds into N (conv2d, conv2d_input_grad); the
// weight gradient sums over N, so a batched dy or x there runs once per example.
const Primitive& define_conv(Primitive p, Kernel kernel, bool folds = true,
                             Loc loc = Loc::current()) {
  p.batch = [folds](const BatchArgs& b) {
    return folds && !b.dims[1] ? batch_images(b) : ops::batch_by_loop(b);
  };
  return detail::register_builtin(
      std::move(p), {{ops::cpu({DTypeSet::floating(), DTypeSet::floating()}), std::move(kernel)}},
      loc);
}

}  // namespace

// conv2d(x [N, C, H, W], w [O, C/groups, KH, KW]) -> [N, O, OH, OW].
const Primitive& prim::conv2d() {
  static const Primitive& p = define_conv(
      [] {
        Primitive p = primitive_of("conv2d", 2, conv_rule);
        p.jvp = [](const RuleArgs& r, std::span<const Tangent> t) {
          return bilinear_jvp(
              r, t, [&](const Tensor& x, const Tensor& w) { return conv(x, w, r.attrs); });
        };
        p.vjp = [](const RuleArgs& r, std::span<const Tangent> ct) -> ops::Ts {
          return {input_grad(*ct[0], r.inputs[1], r.attrs, r.inputs[0].shape()),
                  weight_grad(*ct[0], r.inputs[0], r.attrs, r.inputs[1].shape())};
        };
        return p;
      }(),
      conv_kernel(
          [](std::span<const Tensor> in, const Attrs& a) {
            return conv_geom("conv2d", std::vector<TensorType>{in[0].type(), in[1].type()}, a);
          },
          &conv_impl<float>, &conv_impl<double>));
  return p;
}

namespace {

// The forward geometry behind a gradient primitive, checked against the given dy.
ConvGeom grad_geom(std::string_view op, const TensorType& dy, const TensorType& x,
                   const TensorType& w, const Attrs& a) {
  const ConvGeom g = conv_geom(op, std::vector<TensorType>{x, w}, a);
  const Shape expected{g.N, g.O, g.OH, g.OW};
  if (dy.shape != expected || dy.dtype != x.dtype)
    fail(op, "output gradient does not match the convolution: got ", dy, ", expected ",
         TensorType{x.dtype, expected}, " for input ", x, " and weight ", w);
  return g;
}
void expect_rank4(std::string_view op, std::string_view what, const TensorType& t) {
  if (t.shape.rank() != 4) fail(op, what, " must have rank 4: got ", t, ", expected rank 4");
}
// conv2d_input_grad(dy [N, O, OH, OW], w) -> dx [N, C, H, W]; attribute input_size = [H, W].
ConvGeom input_grad_geom(std::span<const TensorType> in, const Attrs& a) {
  constexpr std::string_view op = "conv2d_input_grad";
  expect_rank4(op, "output gradient", in[0]);
  expect_rank4(op, "weight", in[1]);
  const auto [h, w] = pair_attr(op, a, "input_size", 0);
  const int64_t c = detail::checked_mul(op, in[1].shape[1], a.get_int("groups"));
  const TensorType x{in[0].dtype, Shape{in[0].shape[0], c, h, w}};
  return grad_geom(op, in[0], x, in[1], a);
}
// conv2d_weight_grad(dy [N, O, OH, OW], x) -> dw [O, C/groups, KH, KW]; kernel_size = [KH, KW].
ConvGeom weight_grad_geom(std::span<const TensorType> in, const Attrs& a) {
  constexpr std::string_view op = "conv2d_weight_grad";
  expect_rank4(op, "output gradient", in[0]);
  expect_rank4(op, "input", in[1]);
  const auto [kh, kw] = pair_attr(op, a, "kernel_size", 1);
  const int64_t groups = std::max<int64_t>(1, a.get_int("groups"));
  const TensorType w{in[1].dtype, Shape{in[0].shape[1], in[1].shape[1] / groups, kh, kw}};
  return grad_geom(op, in[0], in[1], w, a);
}
std::vector<TensorType> types(std::span<const Tensor> in) { return {in[0].type(), in[1].type()}; }

}  // namespace

const Primitive& prim::conv2d_input_grad() {
  static const Primitive& p = define_conv(
      [] {
        Primitive p = primitive_of(
            "conv2d_input_grad", 2, [](std::span<const TensorType> in, const Attrs& a) {
              const ConvGeom g = input_grad_geom(in, a);
              return std::vector<TensorType>{{in[0].dtype, Shape{g.N, g.C, g.H, g.W}}};
            });
        p.jvp = [](const RuleArgs& r, std::span<const Tangent> t) {
          const Shape& x = r.outputs[0].shape();
          return bilinear_jvp(r, t, [&](const Tensor& dy, const Tensor& w) {
            return input_grad(dy, w, r.attrs, x);
          });
        };
        p.vjp = [](const RuleArgs& r, std::span<const Tangent> ct) -> ops::Ts {
          const Tensor &dy = r.inputs[0], &w = r.inputs[1];
          return {conv(*ct[0], w, r.attrs), weight_grad(dy, *ct[0], r.attrs, w.shape())};
        };
        return p;
      }(),
      conv_kernel(
          [](std::span<const Tensor> in, const Attrs& a) { return input_grad_geom(types(in), a); },
          &conv_input_grad_impl<float>, &conv_input_grad_impl<double>));
  return p;
}

const Primitive& prim::conv2d_weight_grad() {
  static const Primitive& p = define_conv(
      [] {
        Primitive p = primitive_of(
            "conv2d_weight_grad", 2, [](std::span<const TensorType> in, const Attrs& a) {
              const ConvGeom g = weight_grad_geom(in, a);
              return std::vector<TensorType>{{in[0].dtype, Shape{g.O, g.C / g.G, g.KH, g.KW}}};
            });
        p.jvp = [](const RuleArgs& r, std::span<const Tangent> t) {
          const Shape& w = r.outputs[0].shape();
          return bilinear_jvp(r, t, [&](const Tensor& dy, const Tensor& x) {
            return weight_grad(dy, x, r.attrs, w);
          });
        };
        p.vjp = [](const RuleArgs& r, std::span<const Tangent> ct) -> ops::Ts {
          const Tensor &dy = r.inputs[0], &x = r.inputs[1];
          return {conv(x, *ct[0], r.attrs), input_grad(dy, *ct[0], r.attrs, x.shape())};
        };
        return p;
      }(),
      conv_kernel(
          [](std::span<const Tensor> in, const Attrs& a) { return weight_grad_geom(types(in), a); },
          &conv_weight_grad_impl<float>, &conv_weight_grad_impl<double>),
      false);
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
            const int64_t h0 = oh * g.sh - g.ph;
            const int64_t hlo = std::max<int64_t>(h0, 0), hhi = std::min(h0 + g.KH, g.H);
            for (int64_t ow = 0; ow < g.OW; ++ow) {
              const int64_t w0 = ow * g.sw - g.pw;
              const int64_t wlo = std::max<int64_t>(w0, 0), whi = std::min(w0 + g.KW, g.W);
              Acc acc = IsMax ? -std::numeric_limits<Acc>::infinity() : Acc{0};
              for (int64_t h = hlo; h < hhi; ++h)
                for (int64_t w = wlo; w < whi; ++w) {
                  const C v = static_cast<C>(plane[h * g.W + w]);
                  if constexpr (IsMax) {
                    acc = takes_over(v, acc) ? v : acc;  // NaN propagates, like numpy/PyTorch
                  } else {
                    acc += static_cast<double>(v);
                  }
                }
              if constexpr (IsMax)
                dst[oh * g.OW + ow] = static_cast<T>(acc);
              else
                dst[oh * g.OW + ow] = static_cast<T>(static_cast<C>(acc * inv));
            }
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
  return detail::register_builtin(std::move(p),
                                  {{ops::cpu({DTypeSet::floating()}), std::move(kernel)}}, loc);
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
  const int64_t HW = g.H * g.W, L = g.OH * g.OW;
  // Non-overlapping 2x2 windows: each input has at most one window, so writes never add.
  const bool tiles_2x2 = is_2x2_tiling(g);
  detail::parallel_for(
      g.N * g.C,
      [&](int64_t b, int64_t e) {
        for (int64_t p = b; p < e; ++p) {
          const T* plane = px + p * HW;
          const T* grad = pd + p * L;
          T* dst = po + p * HW;
          // The windows write every input they cover; an odd last row or column they miss.
          if (!tiles_2x2 || g.H % 2 != 0 || g.W % 2 != 0) std::fill(dst, dst + HW, T{0});
          if (tiles_2x2) {  // each input in at most one window: write all four, no sums
            for (int64_t oh = 0; oh < g.OH; ++oh) {
              const T* r0 = plane + 2 * oh * g.W;
              const T* r1 = r0 + g.W;
              T* d0 = dst + 2 * oh * g.W;
              T* d1 = d0 + g.W;
              for (int64_t ow = 0; ow < g.OW; ++ow) {
                const C v[4] = {static_cast<C>(r0[2 * ow]), static_cast<C>(r0[2 * ow + 1]),
                                static_cast<C>(r1[2 * ow]), static_cast<C>(r1[2 * ow + 1])};
                int k = 0;
                C m = v[0];
                // Arithmetic and max rather than branches (random data mispredicts half of
                // them); a NaN (rare, so its branch predicts well) takes the forward's rule:
                // the last NaN of the window wins.
                for (int j = 1; j < 4; ++j) {
                  const int take = static_cast<int>(v[j] > m);
                  k += take * (j - k);
                  m = std::max(m, v[j]);
                }
                if ((v[0] != v[0]) | (v[1] != v[1]) | (v[2] != v[2]) | (v[3] != v[3]))
                  for (int j = 0; j < 4; ++j)
                    if (v[j] != v[j]) k = j;
                const T gv = grad[oh * g.OW + ow];
                d0[2 * ow] = k == 0 ? gv : T{0};
                d0[2 * ow + 1] = k == 1 ? gv : T{0};
                d1[2 * ow] = k == 2 ? gv : T{0};
                d1[2 * ow + 1] = k == 3 ? gv : T{0};
              }
            }
            continue;
          }
          for (int64_t oh = 0; oh < g.OH; ++oh) {
            const int64_t h0 = oh * g.sh - g.ph;
            const int64_t hlo = std::max<int64_t>(h0, 0), hhi = std::min(h0 + g.KH, g.H);
            for (int64_t ow = 0; ow < g.OW; ++ow) {
              const int64_t w0 = ow * g.sw - g.pw;
              const int64_t wlo = std::max<int64_t>(w0, 0), whi = std::min(w0 + g.KW, g.W);
              C acc = -std::numeric_limits<C>::infinity();
              int64_t best = -1;
              for (int64_t h = hlo; h < hhi; ++h)
                for (int64_t w = wlo; w < whi; ++w) {
                  const C v = static_cast<C>(plane[h * g.W + w]);
                  if (best < 0 || takes_over(v, acc)) {
                    acc = v;
                    best = h * g.W + w;
                  }
                }
              if (best >= 0)
                dst[best] = static_cast<T>(static_cast<C>(dst[best]) +
                                           static_cast<C>(grad[oh * g.OW + ow]));
            }
          }
        }
      },
      L * g.KH * g.KW);
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

std::vector<int64_t> ints(std::pair<int64_t, int64_t> p) { return {p.first, p.second}; }

Tensor to_float(const Tensor& x, Loc loc) {
  const detail::CallSite site(loc);
  return ops::cast_if_needed(x, to_floating(x.dtype()), loc);
}

Tensor pool(const Primitive& p, const Tensor& x, const Pool2dOptions& o, Loc loc) {
  const detail::CallSite site(loc);
  if (!x.defined())
    fail(p.name, "undefined input: got a default-constructed Tensor, expected a tensor");
  const Attrs attrs{{"kernel", ints(o.kernel)},
                    {"stride", ints(o.stride.value_or(o.kernel))},
                    {"padding", ints(o.padding)}};
  return bind1(p, {to_float(x, loc)}, attrs, loc);
}

}  // namespace

Tensor conv2d(const Tensor& x, const Tensor& w, const Conv2dOptions& o, Loc loc) {
  const detail::CallSite site(loc);
  if (!x.defined() || !w.defined())
    fail("conv2d", "undefined operand: got a default-constructed Tensor, expected tensors");
  DType dt = promote_types(x.dtype(), w.dtype());
  dt = to_floating(dt);
  const Attrs attrs{{"stride", ints(o.stride)},
                    {"padding", ints(o.padding)},
                    {"dilation", ints(o.dilation)},
                    {"groups", o.groups}};
  return bind1(prim::conv2d(), {ops::cast_if_needed(x, dt, loc), ops::cast_if_needed(w, dt, loc)},
               attrs, loc);
}

Tensor max_pool2d(const Tensor& x, const Pool2dOptions& o, Loc loc) {
  const detail::CallSite site(loc);
  return pool(prim::max_pool2d(), x, o, loc);
}
Tensor avg_pool2d(const Tensor& x, const Pool2dOptions& o, Loc loc) {
  const detail::CallSite site(loc);
  return pool(prim::avg_pool2d(), x, o, loc);
}

}  // namespace kiln
