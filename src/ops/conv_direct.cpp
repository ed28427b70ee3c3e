#include "ops/conv_direct.h"

#include <algorithm>
#include <vector>

#include "detail/parallel.h"
#include "ops/simd.h"

namespace kiln::ops {
namespace {

using namespace simd;
#define KILN_INLINE KILN_SIMD_INLINE

// One image's channel with its zero padding written out, so that every tap of every output
// reads inside it.
struct Padded {
  int64_t D = 0, H = 0, W = 0;
  std::vector<float> data;

  explicit Padded(const ConvGeom& g)
      : D(g.in[0] + 2 * g.pad[0]),
        H(g.in[1] + 2 * g.pad[1]),
        W(g.in[2] + 2 * g.pad[2]),
        data(static_cast<std::size_t>(D * H * W)) {}
  void fill(const ConvGeom& g, const float* image) {
    std::fill(data.begin(), data.end(), 0.0f);
    for (int64_t d = 0; d < g.in[0]; ++d)
      for (int64_t h = 0; h < g.in[1]; ++h)
        std::copy_n(image + (d * g.in[1] + h) * g.in[2], g.in[2],
                    data.data() + ((d + g.pad[0]) * H + h + g.pad[1]) * W + g.pad[2]);
  }
  // Where output row (od, oh) reads under kernel row (kd, kh), at output column 0 and kw = 0.
  const float* row(const ConvGeom& g, int64_t od, int64_t oh, int64_t kd, int64_t kh) const {
    return data.data() +
           ((od * g.stride[0] + kd * g.dil[0]) * H + oh * g.stride[1] + kh * g.dil[1]) * W;
  }
};

// One vector of output row (od, oh) from column ow0 (`count` lanes stored), for output channels
// [o0, o0 + OB) of image n: summed over the taps in registers, OB channels at once (independent
// sums, one load per tap).
template <typename Vec, int OB>
KILN_INLINE void forward_vector(const ConvGeom& g, const Padded& x, const float* w, float* y,
                                int64_t n, int64_t o0, int64_t od, int64_t oh, int64_t ow0,
                                int64_t count) {
  const int64_t taps = g.taps();
  Vec acc[OB] = {};
  for (int64_t kd = 0; kd < g.k[0]; ++kd)
    for (int64_t kh = 0; kh < g.k[1]; ++kh) {
      const float* in = x.row(g, od, oh, kd, kh) + ow0;
      const int64_t t0 = (kd * g.k[1] + kh) * g.k[2];
      for (int64_t kw = 0; kw < g.k[2]; ++kw) {
        const Vec v = load<Vec>(in + kw * g.dil[2], count);
        for (int j = 0; j < OB; ++j) acc[j] += w[(o0 + j) * taps + t0 + kw] * v;
      }
    }
  const int64_t at = (od * g.out[1] + oh) * g.out[2] + ow0;
  for (int j = 0; j < OB; ++j) store(y + (n * g.O + o0 + j) * g.out_size() + at, acc[j], count);
}

// Output channels [o0, o0 + OB) of image n. A row's last vector, where its width is no multiple
// of the lanes, ends at the row's end and overlaps the one before it, whose outputs it
// computes again to the same bits; a row narrower than a vector is one partial vector.
template <typename Vec, int OB>
KILN_INLINE void forward_block(const ConvGeom& g, const Padded& x, const float* w, float* y,
                               int64_t n, int64_t o0) {
  constexpr int64_t L = kLanes<Vec>;
  const int64_t OW = g.out[2];
  for (int64_t od = 0; od < g.out[0]; ++od)
    for (int64_t oh = 0; oh < g.out[1]; ++oh) {
      if (OW < L) {
        forward_vector<Vec, OB>(g, x, w, y, n, o0, od, oh, 0, OW);
        continue;
      }
      int64_t ow0 = 0;
      for (; ow0 + L <= OW; ow0 += L) forward_vector<Vec, OB>(g, x, w, y, n, o0, od, oh, ow0, L);
      if (ow0 < OW) forward_vector<Vec, OB>(g, x, w, y, n, o0, od, oh, OW - L, L);
    }
}

// forward_block for 8 channels of a 2-d kernel of K x K taps, at least a vector wide: the
// taps unrolled, a kernel row's K input vectors loaded once for the 8 channels, whose weights
// come as vectors from `wb` (each broadcast once per block, so that a multiply-add reads its
// weight from memory); the sums in forward_vector's order (the same bits where the compiler
// fuses the products and sums into FMAs alike, as -O3 does). The generic loop
// (run-time taps, a broadcast per multiply-add) ran the demo's 3 x 3 first layer at about a
// fifth of the FMA peak.
template <typename Vec, int K>
KILN_INLINE void forward_block_fixed(const ConvGeom& g, const Padded& x, const Vec* wb, float* y,
                                     int64_t n, int64_t o0) {
  constexpr int64_t L = kLanes<Vec>;
  constexpr int OB = 8;
  // Locals, not g's and x's fields, which the stores through y could alias.
  const int64_t OH = g.out[1], OW = g.out[2], plane = g.out_size(), dil = g.dil[2],
                row_step = g.dil[1] * x.W, image_step = g.stride[1] * x.W;
  const float* image = x.data.data();
  float* out = y + (n * g.O + o0) * plane;
  auto vector = [&](int64_t oh, int64_t ow0) {
    Vec acc[OB] = {};
    const float* in = image + oh * image_step + ow0;
    for (int kh = 0; kh < K; ++kh, in += row_step) {
      Vec v[K];
      for (int kw = 0; kw < K; ++kw) v[kw] = load<Vec>(in + kw * dil);
      for (int j = 0; j < OB; ++j)
        for (int kw = 0; kw < K; ++kw) acc[j] += wb[(j * K + kh) * K + kw] * v[kw];
    }
    for (int j = 0; j < OB; ++j) store(out + j * plane + oh * OW + ow0, acc[j]);
  };
  for (int64_t oh = 0; oh < OH; ++oh) {
    int64_t ow0 = 0;
    for (; ow0 + L <= OW; ow0 += L) vector(oh, ow0);
    if (ow0 < OW) vector(oh, OW - L);
  }
}

// Units u in [b, e): image u / blocks, channel block u % blocks of 8 (the last one smaller).
template <typename Vec>
KILN_INLINE void forward_units(const ConvGeom& g, const float* x, const float* w, float* y,
                               int64_t b, int64_t e) {
  const int64_t blocks = (g.O + 7) / 8;
  // The kernel's side where forward_block_fixed takes it: 2-d, 3 x 3 or 5 x 5, a vector wide.
  const bool flat = g.k[0] == 1 && g.out[0] == 1 && g.out[2] >= kLanes<Vec>;
  const int64_t K = flat && g.k[1] == g.k[2] && (g.k[1] == 3 || g.k[1] == 5) ? g.k[1] : 0;
  constexpr int64_t kMostTaps = 5 * 5;
  Vec wb[8 * kMostTaps];
  Padded padded(g);
  int64_t filled = -1;
  for (int64_t u = b; u < e; ++u) {
    const int64_t n = u / blocks, o0 = u % blocks * 8;
    if (n != filled) padded.fill(g, x + n * g.in_size());
    filled = n;
    if (o0 + 8 > g.O) {
      for (int64_t o = o0; o < g.O; ++o) forward_block<Vec, 1>(g, padded, w, y, n, o);
    } else if (K == 0) {
      forward_block<Vec, 8>(g, padded, w, y, n, o0);
    } else {
      for (int64_t i = 0; i < 8 * K * K; ++i) wb[i] = Vec{} + w[o0 * K * K + i];
      if (K == 3) {
        forward_block_fixed<Vec, 3>(g, padded, wb, y, n, o0);
      } else {
        forward_block_fixed<Vec, 5>(g, padded, wb, y, n, o0);
      }
    }
  }
}

// One image's input under each tap, laid out like the output (tap t's plane holds, at output
// position p, the input that p's window reads under t), for a strip of the output's rows at a
// time, each plane padded with zeros to whole vectors: the weight gradient is then one dot
// product per channel and tap over flat planes, with no row tails. A strip holds at most
// kStripFloats floats of planes, so that they stay in the L2 cache (and a large 3-d volume
// needs no plane per tap of all its positions).
constexpr int64_t kStripFloats = int64_t{1} << 16;
struct TapPlanes {
  int64_t rows = 0;    // output rows (of g.out[2] positions) per strip
  int64_t count = 0;   // positions in the strip filled last
  int64_t stride = 0;  // floats per plane: a strip's positions rounded up to vectors
  std::vector<float> data;

  TapPlanes(const ConvGeom& g, int64_t lanes)
      : rows(std::clamp<int64_t>(kStripFloats / (g.taps() * std::max<int64_t>(g.out[2], 1)), 1,
                                 std::max<int64_t>(g.out[0] * g.out[1], 1))),
        stride((rows * g.out[2] + lanes - 1) / lanes * lanes),
        data(static_cast<std::size_t>(g.taps() * stride), 0.0f) {}
  // Output rows [r0, r1), a vector at a time (the last one overlapping the one before): a call
  // to memcpy per row of each plane took about as long as the dot products.
  template <typename Vec>
  KILN_INLINE void fill(const ConvGeom& g, const Padded& x, int64_t r0, int64_t r1) {
    constexpr int64_t L = kLanes<Vec>;
    const int64_t OW = g.out[2];
    count = (r1 - r0) * OW;
    for (int64_t kd = 0; kd < g.k[0]; ++kd)
      for (int64_t kh = 0; kh < g.k[1]; ++kh)
        for (int64_t kw = 0; kw < g.k[2]; ++kw) {
          float* plane = data.data() + ((kd * g.k[1] + kh) * g.k[2] + kw) * stride;
          for (int64_t r = r0; r < r1; ++r) {
            const float* from = x.row(g, r / g.out[1], r % g.out[1], kd, kh) + kw * g.dil[2];
            float* to = plane + (r - r0) * OW;
            if (OW < L) {
              std::copy_n(from, OW, to);
              continue;
            }
            for (int64_t i = 0; i + L <= OW; i += L) store(to + i, load<Vec>(from + i));
            if (OW % L != 0) store(to + OW - L, load<Vec>(from + OW - L));
          }
          std::fill(plane + count, plane + stride, 0.0f);  // a shorter last strip's rest
        }
  }
  const float* plane(int64_t t) const { return data.data() + t * stride; }
};

// Adds the products of one vector of positions from p (`count` of them) to acc; `grad` is the
// strip's first position of channel 0, the channels `channel` floats apart.
template <typename Vec, int OB, int TB>
KILN_INLINE void weight_grad_step(const float* grad, int64_t channel, const TapPlanes& x,
                                  int64_t o0, int64_t t0, int64_t p, int64_t count,
                                  Vec (&acc)[OB][TB]) {
  Vec in[TB], dy[OB];
  for (int t = 0; t < TB; ++t) in[t] = load<Vec>(x.plane(t0 + t) + p);
  for (int j = 0; j < OB; ++j) dy[j] = load<Vec>(grad + (o0 + j) * channel + p, count);
  for (int j = 0; j < OB; ++j)
    for (int t = 0; t < TB; ++t) acc[j][t] += dy[j] * in[t];
}

// Output channels [o0, o0 + OB) and taps [t0, t0 + TB) of one image: OB·TB dot products of the
// channels' gradient planes with the taps' input planes, each summed in a vector of float lanes
// (OB + TB loads per OB·TB products), then added lane by lane into `lanes` (double, per
// channel from o0, tap and lane), where the images' sums meet.
template <typename Vec, int OB, int TB>
KILN_INLINE void weight_grad_tile(const ConvGeom& g, const float* grad, const TapPlanes& x,
                                  int64_t o0, int64_t t0, double* lanes) {
  constexpr int64_t L = kLanes<Vec>;
  const int64_t P = x.count, taps = g.taps(), channel = g.out_size();
  Vec acc[OB][TB] = {};
  int64_t p = 0;
  for (; p + L <= P; p += L) weight_grad_step<Vec, OB, TB>(grad, channel, x, o0, t0, p, L, acc);
  // The planes' zeros fill the last vector's rest.
  if (p < P) weight_grad_step<Vec, OB, TB>(grad, channel, x, o0, t0, p, P - p, acc);
  for (int j = 0; j < OB; ++j)
    for (int t = 0; t < TB; ++t) {
      double* sum = lanes + (j * taps + t0 + t) * L;
      for (int64_t l = 0; l < L; ++l) sum[l] += acc[j][t][l];
    }
}

// Output channels [o0, o0 + OB) of one image, over every tap, three at a time.
template <typename Vec, int OB>
KILN_INLINE void weight_grad_channels(const ConvGeom& g, const float* grad, const TapPlanes& x,
                                      int64_t o0, double* lanes) {
  const int64_t taps = g.taps();
  int64_t t = 0;
  for (; t + 3 <= taps; t += 3) weight_grad_tile<Vec, OB, 3>(g, grad, x, o0, t, lanes);
  for (; t < taps; ++t) weight_grad_tile<Vec, OB, 1>(g, grad, x, o0, t, lanes);
}

// The channels of units [b, e) (kWeightGradUnit each, the last one fewer): per image and strip of
// rows, the input under every tap is laid out once, then each block of OB channels (fewer at the
// end) takes its dot products with it. The sums run in the same order whatever the units' split.
constexpr int64_t kWeightGradUnit = 8;
template <typename Vec>
KILN_INLINE void weight_grad_units(const ConvGeom& g, const float* dy, const float* x, float* dw,
                                   int64_t b, int64_t e) {
  constexpr int64_t L = kLanes<Vec>;
  constexpr int OB = L == 16 ? 8 : 4;  // 8 x 3 accumulators: most of AVX-512's 32 registers
  const int64_t taps = g.taps(), o_begin = b * kWeightGradUnit,
                o_end = std::min(g.O, e * kWeightGradUnit);
  Padded padded(g);
  TapPlanes planes(g, L);
  std::vector<double> lanes(static_cast<std::size_t>((o_end - o_begin) * taps * L), 0.0);
  auto at = [&](int64_t c) { return lanes.data() + (c - o_begin) * taps * L; };
  const int64_t rows = g.out[0] * g.out[1];
  for (int64_t n = 0; n < g.N; ++n) {
    padded.fill(g, x + n * g.in_size());
    for (int64_t r0 = 0; r0 < rows; r0 += planes.rows) {
      planes.fill<Vec>(g, padded, r0, std::min(rows, r0 + planes.rows));
      const float* grad = dy + n * g.O * g.out_size() + r0 * g.out[2];
      int64_t o = o_begin;
      for (; o + OB <= o_end; o += OB) weight_grad_channels<Vec, OB>(g, grad, planes, o, at(o));
      for (; o < o_end; ++o) weight_grad_channels<Vec, 1>(g, grad, planes, o, at(o));
    }
  }
  for (int64_t i = 0; i < (o_end - o_begin) * taps; ++i) {
    double sum = 0.0;
    for (int64_t l = 0; l < L; ++l) sum += lanes[static_cast<std::size_t>(i * L + l)];
    dw[o_begin * taps + i] = static_cast<float>(sum);
  }
}

// Images n in [b, e): dx[n] = Σ_o Σ_t w[o, t] · (dy[n, o] moved back under tap t), one output
// row and tap at a time; taps outermost, so that consecutive updates write different rows of dx.
template <typename Vec>
KILN_INLINE void input_grad_images(const ConvGeom& g, const float* dy, const float* w, float* dx,
                                   int64_t b, int64_t e) {
  const int64_t OW = g.out[2], taps = g.taps();
  for (int64_t n = b; n < e; ++n) {
    float* image = dx + n * g.in_size();
    std::fill(image, image + g.in_size(), 0.0f);
    for (int64_t o = 0; o < g.O; ++o)
      for (int64_t kd = 0; kd < g.k[0]; ++kd)
        for (int64_t kh = 0; kh < g.k[1]; ++kh)
          for (int64_t kw = 0; kw < g.k[2]; ++kw) {
            const float wt = w[o * taps + (kd * g.k[1] + kh) * g.k[2] + kw];
            const int64_t shift = kw * g.dil[2] - g.pad[2];
            const int64_t lo = std::max<int64_t>(0, -shift), hi = std::min(OW, g.in[2] - shift);
            for (int64_t od = 0; od < g.out[0]; ++od) {
              const int64_t id = od * g.stride[0] + kd * g.dil[0] - g.pad[0];
              if (id < 0 || id >= g.in[0]) continue;
              for (int64_t oh = 0; oh < g.out[1]; ++oh) {
                const int64_t ih = oh * g.stride[1] + kh * g.dil[1] - g.pad[1];
                if (ih < 0 || ih >= g.in[1]) continue;
                float* __restrict dst = image + (id * g.in[1] + ih) * g.in[2];
                const float* __restrict src =
                    dy + (n * g.O + o) * g.out_size() + (od * g.out[1] + oh) * OW;
                for (int64_t ow = lo; ow < hi; ++ow) dst[ow + shift] += wt * src[ow];
              }
            }
          }
  }
}

#define KILN_DIRECT_VARIANTS(suffix, Vec, attributes)                                           \
  attributes void forward_##suffix(const ConvGeom& g, const float* x, const float* w, float* y, \
                                   int64_t b, int64_t e) {                                      \
    forward_units<Vec>(g, x, w, y, b, e);                                                       \
  }                                                                                             \
  attributes void input_grad_##suffix(const ConvGeom& g, const float* dy, const float* w,       \
                                      float* dx, int64_t b, int64_t e) {                        \
    input_grad_images<Vec>(g, dy, w, dx, b, e);                                                 \
  }                                                                                             \
  attributes void weight_grad_##suffix(const ConvGeom& g, const float* dy, const float* x,      \
                                       float* dw, int64_t b, int64_t e) {                       \
    weight_grad_units<Vec>(g, dy, x, dw, b, e);                                                 \
  }
KILN_DIRECT_VARIANTS(baseline, F4, )
KILN_DIRECT_VARIANTS(avx2, F8, __attribute__((target("avx2,fma"))))
KILN_DIRECT_VARIANTS(avx512, F16, __attribute__((target("avx512f,fma"))))
#undef KILN_DIRECT_VARIANTS
#undef KILN_INLINE

using Variant = void (*)(const ConvGeom&, const float*, const float*, float*, int64_t, int64_t);

// Runs variant f over units [0, count) in parallel, `cost` per unit.
void run(Variant f, const ConvGeom& g, const float* a, const float* b, float* out, int64_t count,
         int64_t cost) {
  detail::parallel_for(
      count, [&](int64_t lo, int64_t hi) { f(g, a, b, out, lo, hi); }, cost);
}

}  // namespace

bool direct_conv_applies(const ConvGeom& g) { return g.C == 1 && g.G == 1 && g.stride[2] == 1; }

void direct_conv_forward(const ConvGeom& g, const float* x, const float* w, float* y,
                         math::Isa isa) {
  const int64_t blocks = (g.O + 7) / 8;
  run(pick<Variant>(isa, forward_baseline, forward_avx2, forward_avx512), g, x, w, y, g.N * blocks,
      std::min<int64_t>(g.O, 8) * g.out_size() * g.taps());
}

void direct_conv_input_grad(const ConvGeom& g, const float* dy, const float* w, float* dx,
                            math::Isa isa) {
  run(pick<Variant>(isa, input_grad_baseline, input_grad_avx2, input_grad_avx512), g, dy, w, dx,
      g.N, g.O * g.out_size() * g.taps());
}

void direct_conv_weight_grad(const ConvGeom& g, const float* dy, const float* x, float* dw,
                             math::Isa isa) {
  run(pick<Variant>(isa, weight_grad_baseline, weight_grad_avx2, weight_grad_avx512), g, dy, x, dw,
      (g.O + kWeightGradUnit - 1) / kWeightGradUnit,
      std::min(g.O, kWeightGradUnit) * g.N * g.out_size() * g.taps());
}

}  // namespace kiln::ops
