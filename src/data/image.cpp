// Image transforms. A chain runs step by step on raw HWC buffers: intermediate results live in
// per-thread scratch space, and only the final result is allocated as a tensor.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <new>

#include "data/node.h"

namespace kiln::data {
namespace detail {

// Image ops take sides and channel counts up to this (above libpng's default limit of 1e6
// pixels a side), so sizes and offsets computed from them cannot overflow.
constexpr int64_t kMaxImageSide = int64_t{1} << 20;
constexpr std::size_t kMaxSteps = 64;

// Geometry of an image between steps: [h, w, c] (or [c, h, w] once chw), uint8 or float32.
struct ImageType {
  DType dtype = uint8;
  int64_t h = 0, w = 0, c = 1;
  bool chw = false;
  bool rank2 = false;  // an [H, W] input keeps its rank while it has one channel
  int64_t numel() const { return h * w * c; }
};

struct ImageStep {
  virtual ~ImageStep() = default;
  virtual std::string describe() const = 0;
  // Raises Error for inputs the step cannot take.
  virtual ImageType out_type(const ImageType& in) const = 0;
  virtual void run(const void* in, const ImageType& ti, void* out, const ImageType& to,
                   int64_t epoch, int64_t index) const = 0;
  // True when, for this sample, the step would copy its input unchanged (it is then skipped).
  virtual bool identity(int64_t epoch, int64_t index) const {
    (void)epoch;
    (void)index;
    return false;
  }
};

namespace {

void need_hwc(const ImageType& t, const char* op) {
  if (t.chw) fail(op, "image already in CHW layout: got a step after to_chw, expected to_chw last");
}

// o = x * a[k] + b[k] per channel k. __restrict: uint8 input could otherwise alias the output,
// which stops the compiler from vectorising.
template <typename T>
void affine(const T* __restrict x, float* __restrict o, int64_t n, int64_t c,
            const float* __restrict a, const float* __restrict b) {
  if (c == 1) {
    const float a0 = a[0], b0 = b[0];
    for (int64_t i = 0; i < n; ++i) o[i] = static_cast<float>(x[i]) * a0 + b0;
    return;
  }
  for (int64_t i = 0; i < n; ++i)
    for (int64_t k = 0; k < c; ++k) o[i * c + k] = static_cast<float>(x[i * c + k]) * a[k] + b[k];
}

class Normalize : public ImageStep {
 public:
  Normalize(std::vector<float> mean, std::vector<float> stdev, std::optional<float> scale)
      : mean_(std::move(mean)), std_(std::move(stdev)), scale_(scale) {}
  std::string describe() const override { return "normalize"; }
  ImageType out_type(const ImageType& in) const override {
    need_hwc(in, "data.image.normalize");
    const auto c = static_cast<std::size_t>(in.c);
    if ((mean_.size() != 1 && mean_.size() != c) || (std_.size() != 1 && std_.size() != c))
      fail("data.image.normalize", "channel count mismatch: got ", mean_.size(), " means and ",
           std_.size(), " stds for an image with ", in.c, " channels, expected 1 or ", in.c,
           " of each");
    ImageType out = in;
    out.dtype = float32;
    return out;
  }
  void run(const void* in, const ImageType& ti, void* out, const ImageType&, int64_t,
           int64_t) const override {
    const float scale = scale_ ? *scale_ : (ti.dtype == uint8 ? 1.0f / 255.0f : 1.0f);
    const int64_t c = ti.c, n = ti.h * ti.w;
    float a[16], b[16];
    std::vector<float> av, bv;
    float *pa = a, *pb = b;
    if (c > 16) {
      av.resize(static_cast<std::size_t>(c));
      bv.resize(static_cast<std::size_t>(c));
      pa = av.data();
      pb = bv.data();
    }
    for (int64_t k = 0; k < c; ++k) {
      const float m = mean_[mean_.size() == 1 ? 0 : static_cast<std::size_t>(k)];
      const float s = std_[std_.size() == 1 ? 0 : static_cast<std::size_t>(k)];
      pa[k] = scale / s;
      pb[k] = -m / s;
    }
    auto* o = static_cast<float*>(out);
    if (ti.dtype == uint8) {
      affine(static_cast<const uint8_t*>(in), o, n, c, pa, pb);
    } else {
      affine(static_cast<const float*>(in), o, n, c, pa, pb);
    }
  }

 private:
  std::vector<float> mean_, std_;
  std::optional<float> scale_;
};

// Copies the window at (y0, x0) of the image zero-padded by `pad` on each side.
void crop_window(const void* in, const ImageType& ti, void* out, const ImageType& to, int64_t y0,
                 int64_t x0, int64_t pad) {
  const std::size_t px = static_cast<std::size_t>(ti.c) * dtype_size(ti.dtype);
  const auto* src = static_cast<const uint8_t*>(in);
  auto* dst = static_cast<uint8_t*>(out);
  const std::size_t out_row = static_cast<std::size_t>(to.w) * px;
  for (int64_t y = 0; y < to.h; ++y) {
    uint8_t* d = dst + static_cast<std::size_t>(y) * out_row;
    const int64_t sy = y0 + y - pad;
    if (sy < 0 || sy >= ti.h) {
      std::memset(d, 0, out_row);
      continue;
    }
    // Output columns [xa, xb) read source columns [xa + x0 - pad, ...).
    const int64_t xa = std::clamp<int64_t>(pad - x0, 0, to.w);
    const int64_t xb = std::clamp<int64_t>(ti.w + pad - x0, xa, to.w);
    if (xa > 0) std::memset(d, 0, static_cast<std::size_t>(xa) * px);
    if (xb > xa)
      std::memcpy(d + static_cast<std::size_t>(xa) * px,
                  src + (static_cast<std::size_t>(sy * ti.w + xa + x0 - pad)) * px,
                  static_cast<std::size_t>(xb - xa) * px);
    if (xb < to.w)
      std::memset(d + static_cast<std::size_t>(xb) * px, 0,
                  static_cast<std::size_t>(to.w - xb) * px);
  }
}

class RandomCrop : public ImageStep {
 public:
  RandomCrop(int64_t h, int64_t w, int64_t pad, uint64_t seed)
      : h_(h), w_(w), pad_(pad), seed_(seed) {}
  std::string describe() const override {
    return kiln::detail::cat("random_crop(", h_, "x", w_, ", pad ", pad_, ")");
  }
  ImageType out_type(const ImageType& in) const override {
    need_hwc(in, "data.image.random_crop");
    if (in.h + 2 * pad_ < h_ || in.w + 2 * pad_ < w_)  // all at most 2^20: no overflow
      fail("data.image.random_crop", "image too small: got ", in.h, "x", in.w, " padded by ", pad_,
           ", expected at least ", h_, "x", w_);
    ImageType out = in;
    out.h = h_;
    out.w = w_;
    return out;
  }
  void run(const void* in, const ImageType& ti, void* out, const ImageType& to, int64_t epoch,
           int64_t index) const override {
    Rng rng(sample_key(seed_, epoch, index));
    const int64_t y0 = rng.uniform_int(0, ti.h + 2 * pad_ - h_ + 1);
    const int64_t x0 = rng.uniform_int(0, ti.w + 2 * pad_ - w_ + 1);
    crop_window(in, ti, out, to, y0, x0, pad_);
  }

 private:
  int64_t h_, w_, pad_;
  uint64_t seed_;
};

class CenterCrop : public ImageStep {
 public:
  CenterCrop(int64_t h, int64_t w) : h_(h), w_(w) {}
  std::string describe() const override {
    return kiln::detail::cat("center_crop(", h_, "x", w_, ")");
  }
  ImageType out_type(const ImageType& in) const override {
    need_hwc(in, "data.image.center_crop");
    if (in.h < h_ || in.w < w_)
      fail("data.image.center_crop", "image too small: got ", in.h, "x", in.w,
           ", expected at least ", h_, "x", w_);
    ImageType out = in;
    out.h = h_;
    out.w = w_;
    return out;
  }
  void run(const void* in, const ImageType& ti, void* out, const ImageType& to, int64_t,
           int64_t) const override {
    crop_window(in, ti, out, to, (ti.h - h_) / 2, (ti.w - w_) / 2, 0);
  }

 private:
  int64_t h_, w_;
};

class RandomFlip : public ImageStep {
 public:
  RandomFlip(double p, uint64_t seed) : p_(p), seed_(seed) {}
  std::string describe() const override {
    return kiln::detail::cat("random_horizontal_flip(", p_, ")");
  }
  ImageType out_type(const ImageType& in) const override {
    need_hwc(in, "data.image.random_horizontal_flip");
    return in;
  }
  bool identity(int64_t epoch, int64_t index) const override {
    Rng rng(sample_key(seed_, epoch, index));
    return !rng.bernoulli(p_);
  }
  void run(const void* in, const ImageType& ti, void* out, const ImageType&, int64_t epoch,
           int64_t index) const override {
    Rng rng(sample_key(seed_, epoch, index));
    const std::size_t bytes = static_cast<std::size_t>(ti.numel()) * dtype_size(ti.dtype);
    if (!rng.bernoulli(p_)) {
      std::memcpy(out, in, bytes);
      return;
    }
    if (ti.dtype == float32 && ti.c == 1) {
      flip<float, 1>(in, out, ti);
    } else if (ti.dtype == uint8 && ti.c == 1) {
      flip<uint8_t, 1>(in, out, ti);
    } else if (ti.dtype == uint8 && ti.c == 3) {
      flip<uint8_t, 3>(in, out, ti);
    } else if (ti.dtype == float32 && ti.c == 3) {
      flip<float, 3>(in, out, ti);
    } else {
      flip_any(in, out, ti);
    }
  }

 private:
  template <typename T, int C>
  static void flip(const void* in, void* out, const ImageType& t) {
    const auto* s = static_cast<const T*>(in);
    auto* d = static_cast<T*>(out);
    for (int64_t y = 0; y < t.h; ++y) {
      const T* sr = s + y * t.w * C;
      T* dr = d + y * t.w * C;
      for (int64_t x = 0; x < t.w; ++x)
        for (int k = 0; k < C; ++k) dr[x * C + k] = sr[(t.w - 1 - x) * C + k];
    }
  }
  static void flip_any(const void* in, void* out, const ImageType& t) {
    const std::size_t px = static_cast<std::size_t>(t.c) * dtype_size(t.dtype);
    const auto* s = static_cast<const uint8_t*>(in);
    auto* d = static_cast<uint8_t*>(out);
    for (int64_t y = 0; y < t.h; ++y)
      for (int64_t x = 0; x < t.w; ++x)
        std::memcpy(d + static_cast<std::size_t>(y * t.w + x) * px,
                    s + static_cast<std::size_t>(y * t.w + (t.w - 1 - x)) * px, px);
  }
  double p_;
  uint64_t seed_;
};

class Resize : public ImageStep {
 public:
  Resize(int64_t h, int64_t w, image::Interpolation mode) : h_(h), w_(w), mode_(mode) {}
  std::string describe() const override {
    return kiln::detail::cat("resize(", h_, "x", w_,
                             mode_ == image::Interpolation::nearest ? ", nearest)" : ", bilinear)");
  }
  ImageType out_type(const ImageType& in) const override {
    need_hwc(in, "data.image.resize");
    if (in.h < 1 || in.w < 1)
      fail("data.image.resize", "empty image: got ", in.h, "x", in.w, ", expected at least 1x1");
    ImageType out = in;
    out.h = h_;
    out.w = w_;
    return out;
  }
  void run(const void* in, const ImageType& ti, void* out, const ImageType& to, int64_t,
           int64_t) const override {
    if (ti.dtype == uint8) {
      go(static_cast<const uint8_t*>(in), ti, static_cast<uint8_t*>(out), to);
    } else {
      go(static_cast<const float*>(in), ti, static_cast<float*>(out), to);
    }
  }

 private:
  // Half-pixel centres (align_corners=false), edges clamped: OpenCV's and PyTorch's convention.
  template <typename T>
  void go(const T* s, const ImageType& ti, T* d, const ImageType& to) const {
    const double sy = static_cast<double>(ti.h) / static_cast<double>(to.h);
    const double sx = static_cast<double>(ti.w) / static_cast<double>(to.w);
    const int64_t c = ti.c;
    for (int64_t y = 0; y < to.h; ++y) {
      for (int64_t x = 0; x < to.w; ++x) {
        T* px = d + (y * to.w + x) * c;
        if (mode_ == image::Interpolation::nearest) {
          const int64_t iy = std::min<int64_t>(static_cast<int64_t>(std::floor(y * sy)), ti.h - 1);
          const int64_t ix = std::min<int64_t>(static_cast<int64_t>(std::floor(x * sx)), ti.w - 1);
          for (int64_t k = 0; k < c; ++k) px[k] = s[(iy * ti.w + ix) * c + k];
          continue;
        }
        const double fy = std::max(0.0, (static_cast<double>(y) + 0.5) * sy - 0.5);
        const double fx = std::max(0.0, (static_cast<double>(x) + 0.5) * sx - 0.5);
        const int64_t y0 = std::min<int64_t>(static_cast<int64_t>(fy), ti.h - 1);
        const int64_t x0 = std::min<int64_t>(static_cast<int64_t>(fx), ti.w - 1);
        const int64_t y1 = std::min<int64_t>(y0 + 1, ti.h - 1);
        const int64_t x1 = std::min<int64_t>(x0 + 1, ti.w - 1);
        const double wy = fy - static_cast<double>(y0), wx = fx - static_cast<double>(x0);
        for (int64_t k = 0; k < c; ++k) {
          const double v00 = s[(y0 * ti.w + x0) * c + k], v01 = s[(y0 * ti.w + x1) * c + k];
          const double v10 = s[(y1 * ti.w + x0) * c + k], v11 = s[(y1 * ti.w + x1) * c + k];
          const double v =
              (v00 * (1 - wx) + v01 * wx) * (1 - wy) + (v10 * (1 - wx) + v11 * wx) * wy;
          if constexpr (std::is_same_v<T, uint8_t>) {
            px[k] = static_cast<uint8_t>(std::clamp(std::lround(v), 0L, 255L));
          } else {
            px[k] = static_cast<T>(v);
          }
        }
      }
    }
  }
  int64_t h_, w_;
  image::Interpolation mode_;
};

class ToChw : public ImageStep {
 public:
  std::string describe() const override { return "to_chw"; }
  ImageType out_type(const ImageType& in) const override {
    need_hwc(in, "data.image.to_chw");
    ImageType out = in;
    out.chw = true;
    return out;
  }
  void run(const void* in, const ImageType& ti, void* out, const ImageType&, int64_t,
           int64_t) const override {
    const std::size_t es = dtype_size(ti.dtype);
    const int64_t n = ti.h * ti.w, c = ti.c;
    const auto* s = static_cast<const uint8_t*>(in);
    auto* d = static_cast<uint8_t*>(out);
    if (c == 1) {
      std::memcpy(d, s, static_cast<std::size_t>(n) * es);
      return;
    }
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = 0; k < c; ++k)
        std::memcpy(d + static_cast<std::size_t>(k * n + i) * es,
                    s + static_cast<std::size_t>(i * c + k) * es, es);
  }
};

Shape shape_of(const ImageType& t) {
  if (t.chw) return Shape{t.c, t.h, t.w};
  if (t.rank2 && t.c == 1) return Shape{t.h, t.w};
  return Shape{t.h, t.w, t.c};
}

Tensor run_steps(const std::vector<std::shared_ptr<const ImageStep>>& steps, const Tensor& src,
                 const ImageType* types, int64_t epoch, int64_t index, const Tensor* dest);

Tensor run_chain(const std::vector<std::shared_ptr<const ImageStep>>& steps, const Tensor& image,
                 int64_t epoch, int64_t index, const Tensor* dest = nullptr) {
  if (image.rank() != 2 && image.rank() != 3)
    fail("data.image", "not an image: got shape ", image.shape(), ", expected [H, W] or [H, W, C]");
  if (image.dtype() != uint8 && image.dtype() != float32)
    fail("data.image", "unsupported element type: got ", dtype_name(image.dtype()),
         ", expected u8 or f32");
  const Tensor src = image.is_contiguous() ? image : image.contiguous();
  if (steps.size() > kMaxSteps)
    fail("data.image", "chain too long: got ", steps.size(), " steps, expected at most ",
         kMaxSteps);
  ImageType types[kMaxSteps + 1];
  types[0] = {src.dtype(), src.shape()[0], src.shape()[1], src.rank() == 3 ? src.shape()[2] : 1,
              false,       src.rank() == 2};
  // With sides and channels of at most 2^20, which the steps' arguments are too, every size in
  // bytes is below 2^62 and every offset fits.
  if (types[0].h > kMaxImageSide || types[0].w > kMaxImageSide || types[0].c > kMaxImageSide)
    fail("data.image", "image too large: got shape ", src.shape(), ", expected at most ",
         kMaxImageSide, " pixels a side and ", kMaxImageSide, " channels");
  for (std::size_t k = 0; k < steps.size(); ++k) types[k + 1] = steps[k]->out_type(types[k]);
  if (steps.empty()) return src;
  try {
    return run_steps(steps, src, types, epoch, index, dest);
  } catch (const std::bad_alloc&) {
    const ImageType& t = types[steps.size()];
    fail("data.image", "out of memory: got an image of shape ", src.shape(), " to make into ",
         shape_of(t), " ", dtype_name(t.dtype), ", expected results that fit in memory");
  }
}

// run_chain's work once the types are known and checked.
Tensor run_steps(const std::vector<std::shared_ptr<const ImageStep>>& steps, const Tensor& src,
                 const ImageType* types, int64_t epoch, int64_t index, const Tensor* dest) {
  const ImageType& final_type = types[steps.size()];
  const Shape out_shape = shape_of(final_type);
  Tensor out;
  if (dest && dest->dtype() == final_type.dtype && dest->shape() == out_shape &&
      dest->is_contiguous()) {
    out = *dest;
  } else {
    out = empty(out_shape, final_type.dtype);
  }
  // Steps that leave this sample unchanged are skipped; the last one that runs writes `out`.
  std::size_t active[kMaxSteps];
  std::size_t n_active = 0;
  for (std::size_t k = 0; k < steps.size(); ++k)
    if (!steps[k]->identity(epoch, index)) active[n_active++] = k;
  if (n_active == 0) {
    std::memcpy(out.raw_data(), src.raw_data(),
                static_cast<std::size_t>(final_type.numel()) * dtype_size(final_type.dtype));
    return out;
  }
  // Two per-thread buffers alternate as the intermediate results.
  thread_local std::vector<uint8_t> scratch[2];
  const void* cur = src.raw_data();
  const ImageType* cur_type = &types[0];
  for (std::size_t a = 0; a < n_active; ++a) {
    const std::size_t k = active[a];
    void* dst = out.raw_data();
    if (a + 1 < n_active) {
      auto& buf = scratch[a % 2];
      buf.resize(static_cast<std::size_t>(types[k + 1].numel()) * dtype_size(types[k + 1].dtype));
      dst = buf.data();
    }
    steps[k]->run(cur, *cur_type, dst, types[k + 1], epoch, index);
    cur = dst;
    cur_type = &types[k + 1];
  }
  return out;
}

void check_side_args(const char* op, int64_t height, int64_t width) {
  if (height < 1 || width < 1 || height > kMaxImageSide || width > kMaxImageSide)
    fail(op, "bad size: got ", height, "x", width, ", expected 1 to ", kMaxImageSide,
         " pixels a side");
}

}  // namespace

Sample apply_image(const ImageTransform& t, Sample s, int64_t epoch, int64_t index,
                   const Tensor* dest) {
  Tensor& field = s.at(t.field());
  field = run_chain(t.steps(), field, epoch, index, dest);
  return s;
}

}  // namespace detail

// ---- ImageTransform
// ------------------------------------------------------------------------------

ImageTransform::ImageTransform(std::vector<std::shared_ptr<const detail::ImageStep>> steps,
                               std::string field)
    : steps_(std::move(steps)), field_(std::move(field)) {}

ImageTransform ImageTransform::then(const ImageTransform& next) const {
  if (next.field_ != field_)
    fail("data.image", "chained transforms on different fields: got '", next.field_, "' after '",
         field_, "', expected the same field");
  auto steps = steps_;
  steps.insert(steps.end(), next.steps_.begin(), next.steps_.end());
  return ImageTransform(std::move(steps), field_);
}

ImageTransform ImageTransform::on(std::string field) const {
  return ImageTransform(steps_, std::move(field));
}

std::string ImageTransform::describe() const {
  std::string s;
  for (const auto& st : steps_) s += (s.empty() ? "" : " -> ") + st->describe();
  return field_ + ": " + s;
}

Tensor ImageTransform::operator()(const Tensor& image, int64_t epoch, int64_t index) const {
  return detail::run_chain(steps_, image, epoch, index);
}

namespace image {

ImageTransform normalize(std::vector<float> mean, std::vector<float> std,
                         std::optional<float> scale) {
  if (mean.empty() || std.empty())
    fail("data.image.normalize", "no statistics: got ", mean.size(), " means and ", std.size(),
         " stds, expected at least one of each");
  for (float s : std)
    if (!(s > 0) || !std::isfinite(s))
      fail("data.image.normalize", "bad standard deviation: got ", s, ", expected > 0");
  return ImageTransform(
      {std::make_shared<detail::Normalize>(std::move(mean), std::move(std), scale)});
}

ImageTransform random_crop(int64_t height, int64_t width, int64_t padding, uint64_t seed) {
  detail::check_side_args("data.image.random_crop", height, width);
  if (padding < 0 || padding > detail::kMaxImageSide)
    fail("data.image.random_crop", "bad padding: got ", padding, ", expected 0 to ",
         detail::kMaxImageSide);
  return ImageTransform({std::make_shared<detail::RandomCrop>(height, width, padding, seed)});
}

ImageTransform random_horizontal_flip(double p, uint64_t seed) {
  if (!(p >= 0 && p <= 1))
    fail("data.image.random_horizontal_flip", "bad probability: got ", p, ", expected 0 <= p <= 1");
  return ImageTransform({std::make_shared<detail::RandomFlip>(p, seed)});
}

ImageTransform resize(int64_t height, int64_t width, Interpolation interpolation) {
  detail::check_side_args("data.image.resize", height, width);
  return ImageTransform({std::make_shared<detail::Resize>(height, width, interpolation)});
}

ImageTransform center_crop(int64_t height, int64_t width) {
  detail::check_side_args("data.image.center_crop", height, width);
  return ImageTransform({std::make_shared<detail::CenterCrop>(height, width)});
}

ImageTransform to_chw() { return ImageTransform({std::make_shared<detail::ToChw>()}); }

}  // namespace image
}  // namespace kiln::data
