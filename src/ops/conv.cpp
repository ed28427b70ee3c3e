// Convolution and pooling over NCHW images: the `conv2d`, `max_pool2d` and `avg_pool2d`
// primitives and their public ops.
//
// conv2d lowers to im2col + OpenBLAS gemm per group; small images are batched into one wide
// gemm so that gemm sees enough columns. f16/bf16 compute in float32.
//
// im2col and the scatter run on the calling thread, on purpose: OpenBLAS (pthreads build)
// keeps its worker threads spinning after each threaded gemm, and an OpenMP region between
// two gemms fights them for the cores. Measured on the 2-core dev box (16x64x56x56, 3x3,
// 64 out): parallel im2col 391 ms (230 ms with OMP_WAIT_POLICY=passive), serial 114 ms,
// against 109 ms for the bare gemm. Revisit if Kiln links an OpenMP build of OpenBLAS.
#include <cblas.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "detail/copy.h"
#include "detail/dtype_dispatch.h"
#include "detail/parallel.h"
#include "kiln/ops.h"
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

struct ConvGeom {
  int64_t N, C, H, W, O, KH, KW, sh, sw, ph, pw, dh, dw, G, OH, OW;
};

ConvGeom conv_geom(std::span<const TensorType> in, const Attrs& attrs) {
  constexpr std::string_view op = "conv2d";
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
  ConvGeom g{x.shape[0], x.shape[1], x.shape[2], x.shape[3], w.shape[0], w.shape[2], w.shape[3],
             sh, sw, ph, pw, dh, dw, G, 0, 0};
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
  const int64_t ekh = dh * (g.KH - 1) + 1, ekw = dw * (g.KW - 1) + 1;
  const int64_t hp = g.H + 2 * ph, wp = g.W + 2 * pw;
  if (ekh > hp || ekw > wp)
    fail(op, "kernel larger than the padded input: got input ", x, " and weight ", w,
         " (padding [", ph, ", ", pw, "], dilation [", dh, ", ", dw,
         "]), expected an effective kernel of ", ekh, "x", ekw, " to fit the padded input ", hp,
         "x", wp);
  g.OH = (hp - ekh) / sh + 1;
  g.OW = (wp - ekw) / sw + 1;
  return g;
}

std::vector<TensorType> conv_rule(std::span<const TensorType> in, const Attrs& attrs) {
  const ConvGeom g = conv_geom(in, attrs);
  return {{in[0].dtype, Shape{g.N, g.O, g.OH, g.OW}}};
}

template <typename T>
void gemm_nn(int64_t m, int64_t n, int64_t k, const T* a, int64_t lda, const T* b, int64_t ldb,
             T* c, int64_t ldc) {
  const auto i = [](int64_t v) { return static_cast<blasint>(v); };
  if constexpr (std::is_same_v<T, float>)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, i(m), i(n), i(k), 1.0f, a, i(lda), b,
                i(ldb), 0.0f, c, i(ldc));
  else
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, i(m), i(n), i(k), 1.0, a, i(lda), b,
                i(ldb), 0.0, c, i(ldc));
}

// Fills one im2col row: dst[oh*OW + ow] = plane[ih, iw] for kernel tap (kh, kw), or 0 where
// the tap falls into the padding.
template <typename T>
void im2col_row(const ConvGeom& g, const T* plane, int64_t kh, int64_t kw, T* dst) {
  const int64_t iw0 = kw * g.dw - g.pw;
  // Output columns whose input column lies inside [0, W).
  int64_t lo = iw0 >= 0 ? 0 : (-iw0 + g.sw - 1) / g.sw;
  int64_t hi = iw0 >= g.W ? 0 : (g.W - 1 - iw0) / g.sw + 1;
  lo = std::min(lo, g.OW);
  hi = std::clamp(hi, lo, g.OW);
  for (int64_t oh = 0; oh < g.OH; ++oh) {
    T* d = dst + oh * g.OW;
    const int64_t ih = oh * g.sh - g.ph + kh * g.dh;
    if (ih < 0 || ih >= g.H) {
      std::fill(d, d + g.OW, T{0});
      continue;
    }
    const T* s = plane + ih * g.W;  // input column of output column ow: iw0 + ow * sw
    std::fill(d, d + lo, T{0});
    if (g.sw == 1) {
      if (hi > lo) std::memcpy(d + lo, s + iw0 + lo, static_cast<std::size_t>(hi - lo) * sizeof(T));
    } else {
      for (int64_t ow = lo; ow < hi; ++ow) d[ow] = s[iw0 + ow * g.sw];
    }
    std::fill(d + hi, d + g.OW, T{0});
  }
}

constexpr int64_t kColumnBudgetBytes = int64_t{64} << 20;  // im2col buffer per chunk
constexpr int64_t kTargetColumns = 4096;                     // gemm width worth batching to

template <typename T>
Tensor conv_impl(const Tensor& x_in, const Tensor& w_in, const ConvGeom& g) {
  Tensor out = empty(Shape{g.N, g.O, g.OH, g.OW}, dtype_v<T>);
  if (out.numel() == 0) return out;
  const Tensor x = x_in.contiguous(), w = w_in.contiguous();
  const T* px = x.data<const T>();
  const T* pw = w.data<const T>();
  T* po = out.data<T>();
  const int64_t Cg = g.C / g.G, Og = g.O / g.G, K = Cg * g.KH * g.KW, L = g.OH * g.OW;
  const int64_t HW = g.H * g.W;
  if (std::max({Og, K, L, HW}) > INT_MAX / 2)
    fail("conv2d", "problem too large for BLAS: got ", x.type(), " and ", w.type(),
         ", expected matrix dimensions below 2^30");
  if (K == 0) {  // no input channels: every output is an empty sum
    std::fill(po, po + out.numel(), T{0});
    return out;
  }

  // 1x1 kernels with unit stride and no padding need no im2col: the image is the matrix.
  if (g.KH == 1 && g.KW == 1 && g.sh == 1 && g.sw == 1 && g.ph == 0 && g.pw == 0) {
    for (int64_t n = 0; n < g.N; ++n)
      for (int64_t gi = 0; gi < g.G; ++gi)
        gemm_nn<T>(Og, L, K, pw + gi * Og * K, K, px + n * g.C * HW + gi * Cg * HW, HW,
                   po + n * g.O * L + gi * Og * L, L);
    return out;
  }

  int64_t nb = std::max<int64_t>(1, kTargetColumns / L);
  nb = std::min({nb, g.N, std::max<int64_t>(1, kColumnBudgetBytes / (K * L * static_cast<int64_t>(sizeof(T))))});
  const int64_t cols = nb * L;
  std::vector<T> col(static_cast<std::size_t>(K * cols));
  std::vector<T> tmp(nb > 1 ? static_cast<std::size_t>(Og * cols) : 0);
  for (int64_t n0 = 0; n0 < g.N; n0 += nb) {
    const int64_t cnt = std::min(nb, g.N - n0);
    const int64_t width = cnt * L;
    for (int64_t gi = 0; gi < g.G; ++gi) {
      // Row (c, kh, kw) of the column matrix, image i: columns [i*L, (i+1)*L).
      for (int64_t i = 0; i < cnt; ++i)
        for (int64_t c = 0; c < Cg; ++c) {
          const T* plane = px + (n0 + i) * g.C * HW + (gi * Cg + c) * HW;
          for (int64_t kh = 0; kh < g.KH; ++kh)
            for (int64_t kw = 0; kw < g.KW; ++kw) {
              const int64_t r = (c * g.KH + kh) * g.KW + kw;
              im2col_row(g, plane, kh, kw, col.data() + r * width + i * L);
            }
        }
      const T* wg = pw + gi * Og * K;
      if (cnt == 1) {
        gemm_nn<T>(Og, L, K, wg, K, col.data(), width, po + n0 * g.O * L + gi * Og * L, L);
        continue;
      }
      gemm_nn<T>(Og, width, K, wg, K, col.data(), width, tmp.data(), width);
      for (int64_t i = 0; i < cnt; ++i)
        for (int64_t o = 0; o < Og; ++o)
          std::memcpy(po + (n0 + i) * g.O * L + (gi * Og + o) * L, tmp.data() + o * width + i * L,
                      static_cast<std::size_t>(L) * sizeof(T));
    }
  }
  return out;
}

Primitive make_primitive(std::string name, int arity, TypeRule rule) {
  Primitive p;
  p.name = std::move(name);
  p.arity = arity;
  p.type_rule = std::move(rule);
  return p;
}

// ---- derivative rules, written with primitives so they differentiate again ---------------

using Ts = std::vector<Tangent>;
std::pair<int64_t, int64_t> pair_of(const Attrs& a, const char* name) {
  const auto& v = a.get_ints(name);
  return {v[0], v[1]};
}
Conv2dOptions conv_options(const Attrs& a) {
  return {pair_of(a, "stride"), pair_of(a, "padding"), pair_of(a, "dilation"), a.get_int("groups")};
}

// Gradient with respect to the input: the transposed convolution. ct is spread back to the
// input grid (zeros between strides), padded so that a stride-1 convolution with the
// flipped, channel-swapped kernel lands each contribution where it came from.
Tensor conv_input_grad(const Tensor& ct, const Tensor& w, const Shape& x, const Attrs& a) {
  const auto [sh, sw] = pair_of(a, "stride");
  const auto [ph, pw] = pair_of(a, "padding");
  const auto [dh, dw] = pair_of(a, "dilation");
  const int64_t g = a.get_int("groups");
  const int64_t O = w.shape()[0], Cg = w.shape()[1], KH = w.shape()[2], KW = w.shape()[3];
  const int64_t OH = ct.shape()[2], OW = ct.shape()[3];
  // Spread: (OH-1)*sh+1 rows with ct at multiples of the stride.
  Tensor spread = ops::unslice(ct, Shape{ct.shape()[0], O, (OH - 1) * sh + 1, (OW - 1) * sw + 1},
                               {0, 0, 0, 0}, {1, 1, sh, sw});
  // Full padding of the dilated kernel, less the forward padding; the far side also gets the
  // rows the forward convolution never reached (they have zero gradient).
  const int64_t eh = dh * (KH - 1), ew = dw * (KW - 1);
  const int64_t lo_h = eh - ph, lo_w = ew - pw;
  const int64_t hi_h = x[2] + eh - lo_h - spread.shape()[2], hi_w = x[3] + ew - lo_w - spread.shape()[3];
  auto crop_or_pad = [](Tensor t, int axis, int64_t lo, int64_t hi) {
    if (lo < 0 || hi < 0) {
      std::vector<Slice> sl(static_cast<std::size_t>(axis) + 1);
      sl.back() = Slice{std::max<int64_t>(0, -lo), t.shape()[axis] - std::max<int64_t>(0, -hi), 1};
      t = slice(t, sl);
    }
    std::vector<std::pair<int64_t, int64_t>> wd(4, {0, 0});
    wd[static_cast<std::size_t>(axis)] = {std::max<int64_t>(0, lo), std::max<int64_t>(0, hi)};
    return pad(t, wd);
  };
  spread = crop_or_pad(crop_or_pad(spread, 2, lo_h, hi_h), 3, lo_w, hi_w);
  // Kernel [O, Cg, KH, KW] -> [C, O/g, KH, KW], flipped in space.
  const int64_t Og = O / g;
  Tensor wt = reshape(w, {g, Og, Cg, KH, KW});
  wt = reshape(transpose(wt, {0, 2, 1, 3, 4}), {g * Cg, Og, KH, KW});
  wt = flip(wt, {2, 3});
  return conv2d(spread, wt, {.stride = {1, 1}, .padding = {0, 0}, .dilation = {dh, dw}, .groups = g});
}

// Gradient with respect to the kernel: correlate the input with ct, batch and channel axes
// swapped, so the forward stride becomes the dilation and the dilation the stride.
Tensor conv_weight_grad(const Tensor& ct, const Tensor& x, const Shape& w, const Attrs& a) {
  const auto [sh, sw] = pair_of(a, "stride");
  const int64_t g = a.get_int("groups");
  const int64_t O = w[0], Cg = w[1], KH = w[2], KW = w[3], Og = O / g;
  const Tensor xt = transpose(x, {1, 0, 2, 3});   // [C, N, H, W]
  const Tensor ctt = transpose(ct, {1, 0, 2, 3});  // [O, N, OH, OW]
  const auto [dh, dw] = pair_of(a, "dilation");
  Tensor full = conv2d(xt, ctt, {.stride = {dh, dw}, .padding = pair_of(a, "padding"), .dilation = {sh, sw}});
  full = slice(full, {Slice{}, Slice{}, Slice{0, KH, 1}, Slice{0, KW, 1}});  // [C, O, KH, KW]
  if (g == 1) return transpose(full, {1, 0, 2, 3});
  // Only the pairs within a group are kernel entries: take the diagonal blocks.
  std::vector<Tensor> blocks;
  for (int64_t gi = 0; gi < g; ++gi)
    blocks.push_back(slice(full, {Slice{gi * Cg, (gi + 1) * Cg, 1}, Slice{gi * Og, (gi + 1) * Og, 1}}));
  return transpose(concatenate(blocks, 1), {1, 0, 2, 3});
}

Primitive with_conv_rules(Primitive p) {
  p.jvp = [](const RuleArgs& r, std::span<const Tangent> t) -> Ts {
    const Conv2dOptions o = conv_options(r.attrs);
    Tangent out;
    if (t[0]) out = conv2d(*t[0], r.inputs[1], o);
    if (t[1]) {
      const Tensor d = conv2d(r.inputs[0], *t[1], o);
      out = out ? Tangent(*out + d) : Tangent(d);
    }
    return {out};
  };
  p.vjp = [](const RuleArgs& r, std::span<const Tangent> ct) -> Ts {
    return {conv_input_grad(*ct[0], r.inputs[1], r.inputs[0].shape(), r.attrs),
            conv_weight_grad(*ct[0], r.inputs[0], r.inputs[1].shape(), r.attrs)};
  };
  return p;
}

// Batching: a batch of images with a shared kernel folds the batch into N; a batch of
// kernels (per-example weights, as in per-example gradients) runs once per example.
std::vector<Batched> batch_images(const std::string& prim, const BatchArgs& b) {
  const Tensor x = ops::batch_first(b.inputs[0], b.dims[0], b.size);
  std::vector<int64_t> folded{x.shape()[0] * x.shape()[1]};
  folded.insert(folded.end(), x.shape().begin() + 2, x.shape().end());
  std::vector<Tensor> ins{reshape(x, Shape(folded))};
  for (std::size_t i = 1; i < b.inputs.size(); ++i) ins.push_back(b.inputs[i]);
  const Tensor y = bind1(primitive(prim), ins, b.attrs);
  std::vector<int64_t> unfolded{x.shape()[0], x.shape()[1]};
  unfolded.insert(unfolded.end(), y.shape().begin() + 1, y.shape().end());
  return {{reshape(y, Shape(unfolded)), 0}};
}

const Primitive& conv2d_p = register_primitive(
    [] {
      Primitive p = with_conv_rules(make_primitive("conv2d", 2, conv_rule));
      p.batch = [](const BatchArgs& b) {
        return b.dims[1] ? ops::batch_by_loop(primitive("conv2d"), b) : batch_images("conv2d", b);
      };
      return p;
    }(),
    {{ops::cpu({DTypeSet::floating(), DTypeSet::floating()}),
      [](std::span<const Tensor> in, const Attrs& attrs) {
        const ConvGeom g = conv_geom(std::vector<TensorType>{in[0].type(), in[1].type()}, attrs);
        return std::vector<Tensor>{detail::visit_floating(in[0].dtype(), [&]<typename T>() {
          if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
            return conv_impl<T>(in[0], in[1], g);
          } else {
            Tensor x32 = empty(in[0].shape(), float32), w32 = empty(in[1].shape(), float32);
            detail::copy_cast(in[0], x32);
            detail::copy_cast(in[1], w32);
            Tensor o32 = conv_impl<float>(x32, w32, g);
            Tensor out = empty(o32.shape(), dtype_v<T>);
            detail::copy_cast(o32, out);
            return out;
          }
        })};
      }}});

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
    fail(op, "padding larger than half the kernel: got padding [", ph, ", ", pw,
         "] for kernel [", kh, ", ", kw, "], expected padding <= kernel / 2");
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
                    if (v > acc || v != v) acc = v;  // NaN propagates, like numpy/PyTorch
                  } else {
                    acc += static_cast<double>(v);
                  }
                }
              if constexpr (IsMax) dst[oh * g.OW + ow] = static_cast<T>(acc);
              else dst[oh * g.OW + ow] = static_cast<T>(static_cast<C>(acc * inv));
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
    return slice(full, {Slice{}, Slice{}, Slice{p[0], p[0] + x[2], 1}, Slice{p[1], p[1] + x[3], 1}});
  }
};
Windows windows(const Tensor& x, const Attrs& a, const Shape& out, double pad_value) {
  Windows w{Tensor(), a.get_ints("kernel"), a.get_ints("stride"), a.get_ints("padding"), out};
  w.padded = pad(x, {{0, 0}, {0, 0}, {w.p[0], w.p[0]}, {w.p[1], w.p[1]}}, pad_value);
  return w;
}

// max_pool2d: the derivative flows to the first maximum of each window (as in PyTorch).
std::vector<Tensor> max_masks(const RuleArgs& r, const Windows& w) {
  std::vector<Tensor> masks;
  Tensor taken = zeros(r.outputs[0].shape(), bool_);
  for (int64_t kh = 0; kh < w.k[0]; ++kh)
    for (int64_t kw = 0; kw < w.k[1]; ++kw) {
      const Tensor m = (w.at(kh, kw) == r.outputs[0]) && !taken;
      masks.push_back(m);
      taken = taken || m;
    }
  return masks;
}

template <bool IsMax>
Primitive with_pool_rules(Primitive p) {
  p.jvp = [](const RuleArgs& r, std::span<const Tangent> t) -> Ts {
    if constexpr (!IsMax) {
      return {bind1(primitive("avg_pool2d"), {*t[0]}, r.attrs)};
    } else {
      const Windows x = windows(r.inputs[0], r.attrs, r.outputs[0].shape(), -INFINITY);
      const Windows tw = windows(*t[0], r.attrs, r.outputs[0].shape(), 0.0);
      const std::vector<Tensor> masks = max_masks(r, x);
      Tensor out = zeros_like(r.outputs[0]);
      std::size_t i = 0;
      for (int64_t kh = 0; kh < x.k[0]; ++kh)
        for (int64_t kw = 0; kw < x.k[1]; ++kw)
          out = out + where(masks[i++], tw.at(kh, kw), scalar_like(out, 0.0));
      return {out};
    }
  };
  p.vjp = [](const RuleArgs& r, std::span<const Tangent> ct) -> Ts {
    const Tensor& x = r.inputs[0];
    const Windows w = windows(x, r.attrs, r.outputs[0].shape(), IsMax ? -INFINITY : 0.0);
    std::vector<Tensor> masks;
    if constexpr (IsMax) masks = max_masks(r, w);
    const Tensor share = IsMax ? *ct[0] : *ct[0] / static_cast<double>(w.k[0] * w.k[1]);
    Tensor g = zeros_like(x);
    std::size_t i = 0;
    for (int64_t kh = 0; kh < w.k[0]; ++kh)
      for (int64_t kw = 0; kw < w.k[1]; ++kw) {
        const Tensor part = IsMax ? where(masks[i++], share, scalar_like(share, 0.0)) : share;
        g = g + w.back(part, kh, kw, x.shape());
      }
    return {g};
  };
  return p;
}

template <bool IsMax>
const Primitive& define_pool(std::string name) {
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
  Primitive p = with_pool_rules<IsMax>(make_primitive(name, 1, std::move(rule)));
  p.batch = [name](const BatchArgs& b) { return batch_images(name, b); };
  return register_primitive(std::move(p),
                            {{ops::cpu({DTypeSet::floating()}), std::move(kernel)}});
}

const Primitive& max_pool2d_p = define_pool<true>("max_pool2d");
const Primitive& avg_pool2d_p = define_pool<false>("avg_pool2d");

std::vector<int64_t> ints(std::pair<int64_t, int64_t> p) { return {p.first, p.second}; }

Tensor to_float(const Tensor& x, Loc loc) {
  return ops::cast_if_needed(x, to_floating(x.dtype()), loc);
}

Tensor pool(const Primitive& p, const Tensor& x, const Pool2dOptions& o, Loc loc) {
  if (!x.defined())
    fail(p.name, "undefined input: got a default-constructed Tensor, expected a tensor");
  const Attrs attrs{{"kernel", ints(o.kernel)},
                    {"stride", ints(o.stride.value_or(o.kernel))},
                    {"padding", ints(o.padding)}};
  return bind1(p, {to_float(x, loc)}, attrs, loc);
}

}  // namespace

Tensor conv2d(const Tensor& x, const Tensor& w, const Conv2dOptions& o, Loc loc) {
  if (!x.defined() || !w.defined())
    fail("conv2d", "undefined operand: got a default-constructed Tensor, expected tensors");
  DType dt = promote_types(x.dtype(), w.dtype());
  dt = to_floating(dt);
  const Attrs attrs{{"stride", ints(o.stride)},
                    {"padding", ints(o.padding)},
                    {"dilation", ints(o.dilation)},
                    {"groups", o.groups}};
  return bind1(conv2d_p, {ops::cast_if_needed(x, dt, loc), ops::cast_if_needed(w, dt, loc)}, attrs,
               loc);
}

Tensor max_pool2d(const Tensor& x, const Pool2dOptions& o, Loc loc) {
  return pool(max_pool2d_p, x, o, loc);
}
Tensor avg_pool2d(const Tensor& x, const Pool2dOptions& o, Loc loc) {
  return pool(avg_pool2d_p, x, o, loc);
}

}  // namespace kiln
