// The direct loops compiled per instruction set, on every set the CPU has: single-channel
// convolutions (src/ops/conv_direct.h) against float64 sums written out here, over widths that
// are and are not multiples of the vector lanes, padding, dilation, strides and ranks 1 to 3,
// with the same bits on any thread count; and 2x2 max pooling (src/ops/pool_direct.h) against a
// window-by-window loop, ties and NaN included; and the row-by-matrix dot products
// (src/ops/row_dots.h) against float64 sums.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kiln/kiln.h"
#include "math/vector_math.h"
#include "ops/conv_direct.h"
#include "ops/pool_direct.h"
#include "ops/row_dots.h"

namespace {

using kiln::math::Isa;
using kiln::ops::ConvGeom;
using kiln::ops::Spatial;

struct Case {
  std::string name;
  int64_t N, O;
  Spatial in, k, stride, pad, dil;
};

ConvGeom geometry(const Case& c) {
  ConvGeom g{.rank = 3, .N = c.N, .C = 1, .O = c.O, .G = 1};
  g.in = c.in, g.k = c.k, g.stride = c.stride, g.pad = c.pad, g.dil = c.dil;
  for (int a = 0; a < 3; ++a)
    g.out[a] = (c.in[a] + 2 * c.pad[a] - c.dil[a] * (c.k[a] - 1) - 1) / c.stride[a] + 1;
  return g;
}

std::vector<float> random_values(int64_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d;
  std::vector<float> v(static_cast<std::size_t>(n));
  for (float& x : v) x = d(rng);
  return v;
}

// f(n, o, output index, input index, tap index) for every product the convolution makes.
template <typename F>
void each_product(const ConvGeom& g, F&& f) {
  for (int64_t n = 0; n < g.N; ++n)
    for (int64_t o = 0; o < g.O; ++o)
      for (int64_t od = 0; od < g.out[0]; ++od)
        for (int64_t oh = 0; oh < g.out[1]; ++oh)
          for (int64_t ow = 0; ow < g.out[2]; ++ow)
            for (int64_t kd = 0; kd < g.k[0]; ++kd)
              for (int64_t kh = 0; kh < g.k[1]; ++kh)
                for (int64_t kw = 0; kw < g.k[2]; ++kw) {
                  const int64_t i[3] = {od * g.stride[0] + kd * g.dil[0] - g.pad[0],
                                        oh * g.stride[1] + kh * g.dil[1] - g.pad[1],
                                        ow * g.stride[2] + kw * g.dil[2] - g.pad[2]};
                  bool inside = true;
                  for (int a = 0; a < 3; ++a) inside = inside && i[a] >= 0 && i[a] < g.in[a];
                  if (!inside) continue;
                  f(n, o,
                    ((n * g.O + o) * g.out[0] + od) * g.out[1] * g.out[2] + oh * g.out[2] + ow,
                    n * g.in_size() + (i[0] * g.in[1] + i[1]) * g.in[2] + i[2],
                    (kd * g.k[1] + kh) * g.k[2] + kw);
                }
}

// |got - want| within float32 rounding of a sum whose terms' magnitudes add up to `scale`.
void expect_close(const std::vector<float>& got, const std::vector<double>& want,
                  const std::vector<double>& scale, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i)
    ASSERT_LE(std::abs(got[i] - want[i]), 1e-5 * scale[i] + 1e-30)
        << what << " at " << i << ": got " << got[i] << ", want " << want[i];
}

std::vector<Isa> isas() {
  std::vector<Isa> out;
  for (Isa isa : {Isa::sse4, Isa::avx2, Isa::avx512})
    if (isa <= kiln::math::detected_isa()) out.push_back(isa);
  return out;
}

const std::vector<Case> kCases = {
    {"3x3 pad 1 on 28x28 (the demo)",
     3,
     10,
     {1, 28, 28},
     {1, 3, 3},
     {1, 1, 1},
     {0, 1, 1},
     {1, 1, 1}},
    {"5x5 pad 2 on 28x28", 2, 9, {1, 28, 28}, {1, 5, 5}, {1, 1, 1}, {0, 2, 2}, {1, 1, 1}},
    {"width 17, no padding", 2, 8, {1, 6, 19}, {1, 3, 3}, {1, 1, 1}, {0, 0, 0}, {1, 1, 1}},
    {"width 16 exactly", 1, 3, {1, 4, 18}, {1, 3, 3}, {1, 1, 1}, {0, 0, 0}, {1, 1, 1}},
    {"width 33", 1, 11, {1, 5, 33}, {1, 3, 3}, {1, 1, 1}, {0, 1, 1}, {1, 1, 1}},
    {"width 1", 2, 4, {1, 7, 1}, {1, 3, 1}, {1, 1, 1}, {0, 1, 0}, {1, 1, 1}},
    {"width 7 (below a vector)", 2, 5, {1, 7, 7}, {1, 3, 3}, {1, 1, 1}, {0, 1, 1}, {1, 1, 1}},
    {"stride 2 and dilation 2 in height",
     2,
     8,
     {1, 21, 24},
     {1, 3, 3},
     {1, 2, 1},
     {0, 2, 1},
     {1, 2, 2}},
    {"padding wider than the kernel", 1, 8, {1, 5, 20}, {1, 2, 2}, {1, 1, 1}, {0, 3, 4}, {1, 1, 1}},
    {"1d, 4097 wide", 2, 3, {1, 1, 4097}, {1, 1, 5}, {1, 1, 1}, {0, 0, 2}, {1, 1, 1}},
    {"3d", 2, 9, {5, 6, 20}, {3, 3, 3}, {2, 1, 1}, {1, 1, 1}, {1, 1, 2}},
    // Planes too large for one strip of rows: two, the second shorter.
    {"strips of rows", 1, 5, {1, 40, 300}, {1, 3, 3}, {1, 1, 1}, {0, 1, 1}, {1, 1, 1}},
    // More channels than one thread's share of the weight gradient, and a partial block of them.
    {"37 channels", 2, 37, {1, 9, 13}, {1, 3, 3}, {1, 1, 1}, {0, 1, 1}, {1, 1, 1}},
};

TEST(DirectConv, EveryPassMatchesFloat64SumsOnEveryInstructionSet) {
  for (const Case& c : kCases) {
    const ConvGeom g = geometry(c);
    ASSERT_TRUE(kiln::ops::direct_conv_applies(g)) << c.name;
    const int64_t xs = g.N * g.in_size(), ys = g.N * g.O * g.out_size(), ws = g.O * g.taps();
    const std::vector<float> x = random_values(xs, 1), w = random_values(ws, 2),
                             dy = random_values(ys, 3);
    std::vector<double> y_want(ys), y_scale(ys), dx_want(xs), dx_scale(xs), dw_want(ws),
        dw_scale(ws);
    each_product(g, [&](int64_t n, int64_t o, int64_t yi, int64_t xi, int64_t t) {
      (void)n;
      const double wt = w[o * g.taps() + t];
      y_want[yi] += wt * x[xi];
      y_scale[yi] += std::abs(wt * x[xi]);
      dx_want[xi] += wt * dy[yi];
      dx_scale[xi] += std::abs(wt * dy[yi]);
      dw_want[o * g.taps() + t] += double(dy[yi]) * x[xi];
      dw_scale[o * g.taps() + t] += std::abs(double(dy[yi]) * x[xi]);
    });
    for (Isa isa : isas()) {
      const std::string what = c.name + " on " + std::string(kiln::math::isa_name(isa));
      std::vector<float> y(ys, NAN), dx(xs, NAN), dw(ws, NAN);
      kiln::ops::direct_conv_forward(g, x.data(), w.data(), y.data(), isa);
      expect_close(y, y_want, y_scale, what + ", forward");
      kiln::ops::direct_conv_input_grad(g, dy.data(), w.data(), dx.data(), isa);
      expect_close(dx, dx_want, dx_scale, what + ", input gradient");
      kiln::ops::direct_conv_weight_grad(g, dy.data(), x.data(), dw.data(), isa);
      expect_close(dw, dw_want, dw_scale, what + ", weight gradient");
    }
  }
}

TEST(DirectConv, TheSameBitsOnAnyThreadCount) {
  const Case& c = kCases.back();
  const ConvGeom g = geometry(c);
  const std::vector<float> x = random_values(g.N * g.in_size(), 4),
                           w = random_values(g.O * g.taps(), 5),
                           dy = random_values(g.N * g.O * g.out_size(), 6);
  const int before = kiln::num_threads();
  std::vector<std::vector<float>> runs;
  for (int threads : {1, 2, 3}) {
    kiln::set_num_threads(threads);
    std::vector<float> out(x.size() + w.size() + dy.size());
    kiln::ops::direct_conv_forward(g, x.data(), w.data(), out.data());
    kiln::ops::direct_conv_input_grad(g, dy.data(), w.data(), out.data() + dy.size());
    kiln::ops::direct_conv_weight_grad(g, dy.data(), x.data(), out.data() + dy.size() + x.size());
    runs.push_back(out);
  }
  kiln::set_num_threads(before);
  EXPECT_EQ(runs[0], runs[1]);
  EXPECT_EQ(runs[0], runs[2]);
}

TEST(DirectConv, TakesSingleChannelInputsWithUnitStrideAlongTheRow) {
  ConvGeom g = geometry(kCases[0]);
  EXPECT_TRUE(kiln::ops::direct_conv_applies(g));
  g.stride[2] = 2;
  EXPECT_FALSE(kiln::ops::direct_conv_applies(g));
  g = geometry(kCases[0]);
  g.C = 2;
  EXPECT_FALSE(kiln::ops::direct_conv_applies(g));
}

}  // namespace

namespace {

// Window (oh, ow) of a plane: which element the forward picks (0, 1: the top row's two, 2, 3:
// the bottom row's): the first maximum by `>`, then the last NaN.
int chosen(const float* plane, int64_t W, int64_t oh, int64_t ow) {
  const float* r0 = plane + 2 * oh * W + 2 * ow;
  const float v[4] = {r0[0], r0[1], r0[W], r0[W + 1]};
  int k = 0;
  for (int j = 1; j < 4; ++j)
    if (v[j] > v[k]) k = j;
  for (int j = 0; j < 4; ++j)
    if (std::isnan(v[j])) k = j;
  return k;
}

// Values from a few levels, so that windows tie often, with NaNs sprinkled in.
std::vector<float> pooling_input(int64_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> level(0, 5), nan(0, 40);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (float& x : v) x = nan(rng) == 0 ? NAN : static_cast<float>(level(rng)) - 2.0f;
  return v;
}

// Floats that end where an inaccessible page begins, so that a kernel reading or writing past
// the last one faults in any build, not only under AddressSanitizer.
class Guarded {
 public:
  explicit Guarded(const std::vector<float>& values)
      : n_(values.size()), page_(static_cast<std::size_t>(sysconf(_SC_PAGESIZE))) {
    bytes_ = (n_ * sizeof(float) + page_ - 1) / page_ * page_ + page_;
    void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::runtime_error("mmap failed");
    base_ = static_cast<char*>(p);
    if (mprotect(base_ + bytes_ - page_, page_, PROT_NONE) != 0)
      throw std::runtime_error("mprotect failed");
    std::copy(values.begin(), values.end(), data());
  }
  Guarded(const Guarded&) = delete;
  Guarded& operator=(const Guarded&) = delete;
  ~Guarded() { munmap(base_, bytes_); }
  float* data() {
    return reinterpret_cast<float*>(base_ + bytes_ - page_) - static_cast<std::ptrdiff_t>(n_);
  }
  std::vector<float> values() { return {data(), data() + n_}; }

 private:
  std::size_t n_, page_, bytes_;
  char* base_;
};

TEST(DirectPool, MaxPool2x2AndItsGradientPickEachWindowsFirstMaximumOrLastNaN) {
  for (int64_t H : {2, 3, 6}) {
    for (int64_t W = 2; W <= 70; ++W) {  // 1 to 35 windows a row: every vector width and tail
      const kiln::ops::Planes2x2 g{H, W};
      const int64_t planes = 3, HW = H * W, OH = g.OH(), OW = g.OW();
      const std::vector<float> x = pooling_input(planes * HW, static_cast<unsigned>(W));
      const std::vector<float> dy = random_values(planes * OH * OW, 7);
      Guarded gx(x), gdy(dy);
      std::vector<float> y_want(planes * OH * OW), dx_want(planes * HW, 0.0f);
      for (int64_t p = 0; p < planes; ++p)
        for (int64_t oh = 0; oh < OH; ++oh)
          for (int64_t ow = 0; ow < OW; ++ow) {
            const int k = chosen(x.data() + p * HW, W, oh, ow);
            const int64_t at = p * HW + (2 * oh + k / 2) * W + 2 * ow + k % 2;
            y_want[p * OH * OW + oh * OW + ow] = x[at];
            dx_want[at] = dy[p * OH * OW + oh * OW + ow];
          }
      for (Isa isa : isas()) {
        const std::string what = "H " + std::to_string(H) + ", W " + std::to_string(W) + " on " +
                                 std::string(kiln::math::isa_name(isa));
        // As threads split the planes: each range on its own, the later one first, so that a
        // range writing past its end would leave its values there; every buffer ends at a
        // page that faults when touched.
        for (int64_t split = 0; split <= planes; ++split) {
          const std::string at = what + ", planes split at " + std::to_string(split);
          Guarded gy(std::vector<float>(y_want.size(), 7.0f));
          Guarded gdx(std::vector<float>(dx_want.size(), 7.0f));
          kiln::ops::max_pool_2x2(g, gx.data(), gy.data(), split, planes, isa);
          kiln::ops::max_pool_2x2(g, gx.data(), gy.data(), 0, split, isa);
          kiln::ops::max_pool_2x2_grad(g, gx.data(), gdy.data(), gdx.data(), split, planes, isa);
          kiln::ops::max_pool_2x2_grad(g, gx.data(), gdy.data(), gdx.data(), 0, split, isa);
          const std::vector<float> y = gy.values(), dx = gdx.values();
          for (std::size_t i = 0; i < y.size(); ++i)
            ASSERT_TRUE(y[i] == y_want[i] || (std::isnan(y[i]) && std::isnan(y_want[i])))
                << at << ", output " << i << ": got " << y[i] << ", want " << y_want[i];
          ASSERT_EQ(dx, dx_want) << at;
        }
        // One plane alone writes nothing outside it.
        std::vector<float> y(y_want.size(), 7.0f), dx(dx_want.size(), 7.0f);
        kiln::ops::max_pool_2x2(g, x.data(), y.data(), 1, 2, isa);
        kiln::ops::max_pool_2x2_grad(g, x.data(), dy.data(), dx.data(), 1, 2, isa);
        for (int64_t i = 0; i < planes * OH * OW; ++i) {
          if (i / (OH * OW) != 1) {
            ASSERT_EQ(y[i], 7.0f) << what << ", output " << i;
          }
        }
        for (int64_t i = 0; i < planes * HW; ++i) {
          if (i / HW != 1) {
            ASSERT_EQ(dx[i], 7.0f) << what << ", gradient " << i;
          }
        }
      }
    }
  }
}

TEST(RowDots, EveryInstructionSetMatchesFloat64SumsOverAnySplitOfTheRows) {
  // Rows shorter than, as long as and longer than a vector of each set, spaced wider than they
  // are long (the gap holds NaN: a load past a row's end would show), in counts that are and
  // are not multiples of the four rows taken at a time.
  for (const int64_t k : {1, 3, 4, 7, 8, 16, 17, 64, 257, 4097})
    for (const int64_t n : {1, 4, 9}) {
      const int64_t ldw = k + 5;
      std::vector<float> w = random_values(n * ldw, 7);
      for (int64_t j = 0; j < n; ++j)
        for (int64_t i = k; i < ldw; ++i) w[j * ldw + i] = NAN;
      const std::vector<float> x = random_values(k, 8);
      std::vector<double> want(n), scale(n);
      for (int64_t j = 0; j < n; ++j)
        for (int64_t i = 0; i < k; ++i) {
          want[j] += double(w[j * ldw + i]) * x[i];
          scale[j] += std::abs(double(w[j * ldw + i]) * x[i]);
        }
      for (Isa isa : isas()) {
        const std::string what = "k " + std::to_string(k) + ", " + std::to_string(n) + " rows on " +
                                 std::string(kiln::math::isa_name(isa));
        std::vector<float> y(n, NAN);
        kiln::ops::row_dots(w.data(), ldw, x.data(), y.data(), k, 0, n, isa);
        expect_close(y, want, scale, what);
        for (int64_t split = 1; split < n; ++split) {
          std::vector<float> parts(n, NAN);
          kiln::ops::row_dots(w.data(), ldw, x.data(), parts.data(), k, split, n, isa);
          kiln::ops::row_dots(w.data(), ldw, x.data(), parts.data(), k, 0, split, isa);
          ASSERT_EQ(parts, y) << what << ", split at " << split;
        }
        std::vector<float> one(n, 7.0f);
        kiln::ops::row_dots(w.data(), ldw, x.data(), one.data(), k, n - 1, n, isa);
        for (int64_t j = 0; j + 1 < n; ++j) ASSERT_EQ(one[j], 7.0f) << what << ", row " << j;
        ASSERT_EQ(one[n - 1], y[n - 1]) << what;
      }
    }
}

}  // namespace
