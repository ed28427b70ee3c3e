// Fourier transforms through FFTW: the primitives fft{inverse, ndim} (complex to complex over
// the trailing ndim axes), rfft (real to the n/2 + 1 non-negative frequencies of the last axis)
// and irfft{n} (back), all unnormalised, and the numpy.fft API on them (include/kiln/fft.h),
// which moves the transformed axes last, crops or pads, and scales.
//
// Derivatives follow JAX's convention (a cotangent pairs with a tangent as Re(sum(ct * t))):
// every transform is linear, so its JVP is the transform of the tangent; the DFT matrix is
// symmetric, so fft's VJP is fft in the same direction; rfft's and irfft's VJPs are derived
// next to their rules. Each is built from these primitives, so they differentiate again.
#include "kiln/fft.h"

#include <fftw3.h>

#include <climits>
#include <cmath>
#include <complex>
#include <cstring>
#include <map>
#include <mutex>
#include <numeric>
#include <tuple>

#include "detail/dtype_dispatch.h"
#include "detail/parallel.h"
#include "kiln/indexing.h"
#include "kiln/ops.h"
#include "ops/primitives.h"
#include "ops/rules.h"

namespace kiln {
namespace {

using ops::Ins;
using ops::Ts;
using ops::Types;

// ---- FFTW plans -------------------------------------------------------------------------------

enum class Kind { forward, backward, r2c, c2r };

// Plans for transforms of one kind and shape, made once and executed on any arrays: planned
// with FFTW_ESTIMATE (which leaves the arrays alone) and FFTW_UNALIGNED, under a lock (the
// planner is not thread-safe; the new-array execute functions are).
constexpr unsigned kPlanFlags = FFTW_ESTIMATE | FFTW_UNALIGNED;

template <typename R>
struct Fftw;
template <>
struct Fftw<double> {
  using Plan = fftw_plan;
  using C = fftw_complex;
  static Plan dft(int rank, const int* n, C* in, C* out, int sign) {
    return fftw_plan_dft(rank, n, in, out, sign, kPlanFlags);
  }
  static Plan r2c(int n, double* in, C* out) {
    return fftw_plan_dft_r2c_1d(n, in, out, kPlanFlags);
  }
  static Plan c2r(int n, C* in, double* out) {
    return fftw_plan_dft_c2r_1d(n, in, out, kPlanFlags);
  }
  static void destroy(Plan p) { fftw_destroy_plan(p); }
  static void run(Plan p, C* in, C* out) { fftw_execute_dft(p, in, out); }
  static void run(Plan p, double* in, C* out) { fftw_execute_dft_r2c(p, in, out); }
  static void run(Plan p, C* in, double* out) { fftw_execute_dft_c2r(p, in, out); }
};
template <>
struct Fftw<float> {
  using Plan = fftwf_plan;
  using C = fftwf_complex;
  static Plan dft(int rank, const int* n, C* in, C* out, int sign) {
    return fftwf_plan_dft(rank, n, in, out, sign, kPlanFlags);
  }
  static Plan r2c(int n, float* in, C* out) {
    return fftwf_plan_dft_r2c_1d(n, in, out, kPlanFlags);
  }
  static Plan c2r(int n, C* in, float* out) {
    return fftwf_plan_dft_c2r_1d(n, in, out, kPlanFlags);
  }
  static void destroy(Plan p) { fftwf_destroy_plan(p); }
  static void run(Plan p, C* in, C* out) { fftwf_execute_dft(p, in, out); }
  static void run(Plan p, float* in, C* out) { fftwf_execute_dft_r2c(p, in, out); }
  static void run(Plan p, C* in, float* out) { fftwf_execute_dft_c2r(p, in, out); }
};

std::mutex& planner_mutex() {
  static std::mutex m;
  return m;
}

// The plans made so far, destroyed at exit (so that leak checkers see FFTW's memory returned).
template <typename R>
struct PlanCache {
  std::map<std::pair<Kind, std::vector<int>>, typename Fftw<R>::Plan> plans;
  PlanCache() = default;
  PlanCache(const PlanCache&) = delete;
  PlanCache& operator=(const PlanCache&) = delete;
  ~PlanCache() {
    for (const auto& entry : plans)
      if (entry.second) Fftw<R>::destroy(entry.second);
  }
};

// The cached plan for `kind` over `dims`, made from the given arrays on first use.
template <typename R, typename In, typename Out>
typename Fftw<R>::Plan plan_for(Kind kind, const std::vector<int>& dims, In* in, Out* out) {
  using Plan = typename Fftw<R>::Plan;
  static PlanCache<R> cache;
  const std::lock_guard<std::mutex> lock(planner_mutex());
  auto [it, fresh] = cache.plans.try_emplace({kind, dims}, nullptr);
  if (fresh) {
    Plan p = nullptr;
    if constexpr (std::is_same_v<In, Out>)
      p = Fftw<R>::dft(static_cast<int>(dims.size()), dims.data(), in, out,
                       kind == Kind::forward ? FFTW_FORWARD : FFTW_BACKWARD);
    else if constexpr (std::is_same_v<In, R>)
      p = Fftw<R>::r2c(dims[0], in, out);
    else
      p = Fftw<R>::c2r(dims[0], in, out);
    if (!p) {
      cache.plans.erase(it);
      std::string sizes;
      for (int d : dims) sizes += (sizes.empty() ? "" : "x") + std::to_string(d);
      fail("fft", "FFTW made no plan: got a transform of size ", sizes,
           ", expected one FFTW plans");
    }
    it->second = p;
  }
  return it->second;
}

// Runs one transform per row of a contiguous input: rows of `in_len` input elements become
// rows of `out_len` output elements, spread over Kiln's threads.
template <typename R, typename In, typename Out>
void transform_rows(Kind kind, const std::vector<int>& dims, const Tensor& x, const Tensor& out,
                    int64_t in_len, int64_t out_len) {
  const int64_t rows = in_len == 0 ? 0 : x.numel() / in_len;
  if (rows == 0 || out_len == 0) return;
  const In* px = static_cast<const In*>(x.raw_data());
  Out* po = static_cast<Out*>(out.raw_data());
  auto plan = plan_for<R>(kind, dims, const_cast<In*>(px), po);
  const double n = static_cast<double>(std::max(in_len, out_len));
  detail::parallel_for(
      rows,
      [&](int64_t b, int64_t e) {
        // c2r overwrites its input: it runs on a copy of each row.
        constexpr bool c2r = std::is_same_v<Out, R>;
        std::vector<std::complex<R>> scratch(c2r ? static_cast<std::size_t>(in_len) : 0);
        for (int64_t r = b; r < e; ++r) {
          In* src = const_cast<In*>(px + r * in_len);
          if constexpr (c2r) {
            std::memcpy(scratch.data(), src, scratch.size() * sizeof(std::complex<R>));
            src = reinterpret_cast<In*>(scratch.data());
          }
          Fftw<R>::run(plan, src, po + r * out_len);
        }
      },
      static_cast<int64_t>(n * std::log2(n + 1.0)) + 1);
}

// The trailing `count` dimensions of s as FFTW's int sizes.
std::vector<int> trailing_dims(const Shape& s, int count) {
  std::vector<int> dims;
  for (int d = s.rank() - count; d < s.rank(); ++d) dims.push_back(static_cast<int>(s[d]));
  return dims;
}

// ---- type rules -------------------------------------------------------------------------------

void expect_points(std::string_view op, const TensorType& t, int64_t n) {
  if (n < 1 || n > INT_MAX)
    fail(op, "invalid number of points: got ", n, " for ", t, ", expected 1 to 2^31 - 1");
}

std::vector<TensorType> fft_rule(Types in, const Attrs& a) {
  ops::expect_dtype("fft", in[0], DTypeSet::complex(), "a complex dtype");
  const int64_t k = a.get_int("ndim");
  if (k < 1 || k > in[0].shape.rank())
    fail("fft", "ndim out of range: got ndim = ", k, " for ", in[0], ", expected 1 to the rank");
  for (int d = in[0].shape.rank() - static_cast<int>(k); d < in[0].shape.rank(); ++d)
    expect_points("fft", in[0], in[0].shape[d]);
  return {in[0]};
}

std::vector<TensorType> rfft_rule(Types in, const Attrs&) {
  ops::expect_dtype("rfft", in[0], ops::kSingleOrDouble, "float32 or float64");
  if (in[0].shape.rank() < 1)
    fail("rfft", "no axis to transform: got ", in[0], ", expected rank >= 1");
  const int64_t n = in[0].shape[in[0].shape.rank() - 1];
  expect_points("rfft", in[0], n);
  std::vector<int64_t> dims = in[0].shape.dims();
  dims.back() = n / 2 + 1;
  return {{to_complex(in[0].dtype), Shape(dims)}};
}

std::vector<TensorType> irfft_rule(Types in, const Attrs& a) {
  ops::expect_dtype("irfft", in[0], DTypeSet::complex(), "a complex dtype");
  const int64_t n = a.get_int("n");
  if (in[0].shape.rank() < 1)
    fail("irfft", "no axis to transform: got ", in[0], ", expected rank >= 1");
  expect_points("irfft", in[0], n);
  std::vector<int64_t> dims = in[0].shape.dims();
  if (dims.back() != n / 2 + 1)
    fail("irfft", "the last axis does not hold n/2 + 1 frequencies: got ", in[0], " for n = ", n,
         ", expected ", n / 2 + 1, " (the public irfft crops or pads)");
  dims.back() = n;
  return {{real_part_dtype(in[0].dtype), Shape(dims)}};
}

// ---- derivative helpers -----------------------------------------------------------------------

Tensor c2c_last(const Tensor& x, bool inverse, int64_t ndim) {
  return bind1(prim::fft(), {x}, {{"inverse", inverse}, {"ndim", ndim}});
}

// x with its last axis zero-padded or cropped to n.
Tensor resize_last(const Tensor& x, int64_t n) {
  const int64_t m = x.dim(-1);
  if (m == n) return x;
  if (m < n) {
    std::vector<std::pair<int64_t, int64_t>> widths(static_cast<std::size_t>(x.rank()), {0, 0});
    widths.back() = {0, n - m};
    return pad(x, widths);
  }
  std::vector<Slice> slices(static_cast<std::size_t>(x.rank()));
  slices.back() = Slice{0, n, 1};
  return slice(x, slices);
}

// rfft's transpose: x_ct[j] = Re(sum_k<=n/2 ct[k] e^(-2 pi i jk/n)), the real part of a
// forward transform of ct zero-padded to n points.
Tensor rfft_transpose(const Tensor& ct, int64_t n) {
  return real(c2c_last(resize_last(ct, n), false, 1));
}

// irfft's transpose: irfft reads frequency 0 (and n/2 for even n) once and every other one
// twice (itself and its conjugate mirror), so X_ct[k] = w_k C[k] with C the backward transform
// of ct, w_k = 1 at those frequencies and 2 elsewhere.
Tensor irfft_transpose(const Tensor& ct, int64_t n) {
  const int64_t m = n / 2 + 1;
  const Tensor c = resize_last(c2c_last(astype(ct, to_complex(ct.dtype())), true, 1), m);
  std::vector<double> w(static_cast<std::size_t>(m), 2.0);
  w.front() = 1.0;
  if (n % 2 == 0) w.back() = 1.0;
  return c * astype(tensor(w), ct.dtype());
}

const BatchRule kBatchTrailing =
    ops::batch_leading([](const Attrs& a, const Tensor&) { return a; });

template <typename Body>
std::vector<KernelRegistration> kernel_for(DTypeSet inputs, Body body) {
  return {{ops::cpu({inputs}),
           [body](Ins in, const Attrs& a) { return std::vector<Tensor>{body(in[0], a)}; }}};
}

}  // namespace

const Primitive& prim::fft() {
  static const Primitive& p = detail::register_builtin(
      {.name = "fft",
       .arity = 1,
       .type_rule = fft_rule,
       .jvp = ops::linear_jvp,
       .vjp = [](const RuleArgs& r, std::span<const Tangent> ct) -> Ts {
         return {bind1(prim::fft(), {*ct[0]}, r.attrs)};
       },
       .batch = kBatchTrailing},
      kernel_for(DTypeSet::complex(), [](const Tensor& in, const Attrs& a) {
        const Tensor x = in.contiguous();
        const int k = static_cast<int>(a.get_int("ndim"));
        const Kind kind = a.get_bool("inverse") ? Kind::backward : Kind::forward;
        Tensor out = empty(x.type());
        const std::vector<int> dims = trailing_dims(x.shape(), k);
        const int64_t len = std::accumulate(dims.begin(), dims.end(), int64_t{1},
                                            [](int64_t acc, int d) { return acc * d; });
        detail::visit_complex(x.dtype(), [&]<typename C>() {
          using R = typename C::value_type;
          using FC = typename Fftw<R>::C;
          transform_rows<R, FC, FC>(kind, dims, x, out, len, len);
        });
        return out;
      }));
  return p;
}

const Primitive& prim::rfft() {
  static const Primitive& p = detail::register_builtin(
      {.name = "rfft",
       .arity = 1,
       .type_rule = rfft_rule,
       .jvp = ops::linear_jvp,
       .vjp = [](const RuleArgs& r, std::span<const Tangent> ct) -> Ts {
         return {rfft_transpose(*ct[0], r.inputs[0].dim(-1))};
       },
       .batch = kBatchTrailing},
      kernel_for(ops::kSingleOrDouble, [](const Tensor& in, const Attrs& a) {
        const Tensor x = in.contiguous();
        Tensor out = empty(rfft_rule(std::vector<TensorType>{x.type()}, a)[0]);
        const int64_t n = x.dim(-1);
        detail::visit_complex(out.dtype(), [&]<typename C>() {
          using R = typename C::value_type;
          transform_rows<R, R, typename Fftw<R>::C>(Kind::r2c, {static_cast<int>(n)}, x, out, n,
                                                    n / 2 + 1);
        });
        return out;
      }));
  return p;
}

const Primitive& prim::irfft() {
  static const Primitive& p = detail::register_builtin(
      {.name = "irfft",
       .arity = 1,
       .type_rule = irfft_rule,
       .jvp = ops::linear_jvp,
       .vjp = [](const RuleArgs& r, std::span<const Tangent> ct) -> Ts {
         return {irfft_transpose(*ct[0], r.attrs.get_int("n"))};
       },
       .batch = kBatchTrailing},
      kernel_for(DTypeSet::complex(), [](const Tensor& in, const Attrs& a) {
        const Tensor x = in.contiguous();
        Tensor out = empty(irfft_rule(std::vector<TensorType>{x.type()}, a)[0]);
        const int64_t n = a.get_int("n");
        detail::visit_complex(x.dtype(), [&]<typename C>() {
          using R = typename C::value_type;
          transform_rows<R, typename Fftw<R>::C, R>(Kind::c2r, {static_cast<int>(n)}, x, out,
                                                    n / 2 + 1, n);
        });
        return out;
      }));
  return p;
}

// ---- public ops -------------------------------------------------------------------------------

namespace fft {
namespace {

// The factor a transform over n points is scaled by.
double scale(Norm norm, bool inverse, double n) {
  switch (norm) {
    case Norm::ortho:
      return 1.0 / std::sqrt(n);
    case Norm::forward:
      return inverse ? 1.0 : 1.0 / n;
    case Norm::backward:
      break;
  }
  return inverse ? 1.0 / n : 1.0;
}
Tensor scaled(const Tensor& x, Norm norm, bool inverse, double points) {
  const double f = scale(norm, inverse, points);
  return f == 1.0 ? x : x * f;
}
Norm swapped(Norm norm) {
  return norm == Norm::backward ? Norm::forward : norm == Norm::forward ? Norm::backward : norm;
}

Tensor as_complex(std::string_view op, const Tensor& x) {
  if (!x.defined()) fail(op, "undefined operand: got a default-constructed Tensor");
  if (is_complex(x.dtype())) return x;
  return astype(x, to_complex(x.dtype()));
}
Tensor as_real(std::string_view op, const Tensor& x) {
  if (!x.defined()) fail(op, "undefined operand: got a default-constructed Tensor");
  if (is_complex(x.dtype()))
    fail(op, "complex input: got ", x.type(), ", expected real values (use fft for complex ones)");
  return ops::cast_if_needed(x, ops::single_or_double(x.dtype()), Loc{});
}

// The transformed axes, normalised, and their point counts (numpy's _cook_nd_args).
struct AxesPlan {
  std::vector<int> axes;
  std::vector<int64_t> points;
};
AxesPlan plan_axes(std::string_view op, const Tensor& x, const Sizes& s, const AxesArg& axes) {
  AxesPlan p;
  if (x.rank() == 0) fail(op, "no axis to transform: got ", x.type(), ", expected rank >= 1");
  std::vector<int64_t> ax;
  if (axes) {
    ax = *axes;
  } else {
    const int64_t count = s ? static_cast<int64_t>(s->size()) : x.rank();
    if (count > x.rank())
      fail(op, "more sizes than axes: got s of length ", count, " for ", x.type(),
           ", expected at most ", x.rank());
    for (int64_t d = x.rank() - count; d < x.rank(); ++d) ax.push_back(d);
  }
  if (s && s->size() != ax.size())
    fail(op, "s and axes differ in length: got ", s->size(), " and ", ax.size(),
         ", expected one size per axis");
  if (ax.empty()) fail(op, "no axes to transform: got ", x.type(), ", expected at least one axis");
  for (std::size_t i = 0; i < ax.size(); ++i) {
    const int a = normalize_axis(op, ax[i], x.rank());
    if (std::find(p.axes.begin(), p.axes.end(), a) != p.axes.end())
      fail(op, "repeated axis: got axis ", ax[i], " twice, expected distinct axes");
    p.axes.push_back(a);
    p.points.push_back(s ? (*s)[i] : x.dim(a));
    expect_points(op, x.type(), p.points.back());
  }
  return p;
}

// x with axis `axis` zero-padded or cropped to n.
Tensor resize(const Tensor& x, int axis, int64_t n) {
  return moveaxis(resize_last(moveaxis(x, axis, -1), n), -1, axis);
}
// x cropped or padded to the plan's points along the plan's first `count` axes.
Tensor sized(Tensor x, const AxesPlan& p, std::size_t count) {
  for (std::size_t i = 0; i < count; ++i) x = resize(x, p.axes[i], p.points[i]);
  return x;
}
// The points of a transform over all of the plan's axes (a double: the product can pass int64).
double total_points(const AxesPlan& p) {
  double n = 1;
  for (int64_t k : p.points) n *= static_cast<double>(k);
  return n;
}

// The complex transform over the given axes (already sized), in one primitive call.
Tensor c2c(const Tensor& x, const std::vector<int>& axes, bool inverse) {
  std::vector<int64_t> perm;
  for (int d = 0; d < x.rank(); ++d)
    if (std::find(axes.begin(), axes.end(), d) == axes.end()) perm.push_back(d);
  perm.insert(perm.end(), axes.begin(), axes.end());
  std::vector<int64_t> back(perm.size());
  for (std::size_t i = 0; i < perm.size(); ++i)
    back[static_cast<std::size_t>(perm[i])] = static_cast<int64_t>(i);
  const Tensor y = c2c_last(transpose(x, perm), inverse, static_cast<int64_t>(axes.size()));
  return transpose(y, back);
}

Tensor complex_nd(std::string_view op, const Tensor& x, const Sizes& s, const AxesArg& axes,
                  Norm norm, bool inverse, Loc loc) {
  const detail::CallSite site(loc);
  const Tensor y = as_complex(op, x);
  const AxesPlan p = plan_axes(op, y, s, axes);
  return scaled(c2c(sized(y, p, p.axes.size()), p.axes, inverse), norm, inverse, total_points(p));
}

Tensor real_nd(std::string_view op, const Tensor& x, const Sizes& s, const AxesArg& axes, Norm norm,
               Loc loc) {
  const detail::CallSite site(loc);
  const Tensor real_x = as_real(op, x);
  const AxesPlan p = plan_axes(op, real_x, s, axes);
  Tensor y = sized(real_x, p, p.axes.size());
  const int last = p.axes.back();
  y = moveaxis(bind1(prim::rfft(), {moveaxis(y, last, -1)}), -1, last);
  if (p.axes.size() > 1) y = c2c(y, {p.axes.begin(), p.axes.end() - 1}, false);
  return scaled(y, norm, false, total_points(p));
}

Tensor inverse_real_nd(std::string_view op, const Tensor& x, Sizes s, const AxesArg& axes,
                       Norm norm, Loc loc) {
  const detail::CallSite site(loc);
  Tensor y = as_complex(op, x);
  AxesPlan p = plan_axes(op, y, s, axes);
  const int last = p.axes.back();
  if (!s) p.points.back() = 2 * (y.dim(last) - 1);  // numpy's default output length
  expect_points(op, y.type(), p.points.back());
  y = sized(y, p, p.axes.size() - 1);
  const int64_t n = p.points.back();
  if (p.axes.size() > 1) y = c2c(y, {p.axes.begin(), p.axes.end() - 1}, true);
  y = resize(y, last, n / 2 + 1);
  y = moveaxis(bind1(prim::irfft(), {moveaxis(y, last, -1)}, {{"n", n}}), -1, last);
  return scaled(y, norm, true, total_points(p));
}

Sizes one(std::optional<int64_t> n) { return n ? Sizes(std::vector<int64_t>{*n}) : std::nullopt; }

}  // namespace

Tensor fft(const Tensor& x, std::optional<int64_t> n, int64_t axis, Norm norm, Loc loc) {
  return complex_nd("fft", x, one(n), std::vector<int64_t>{axis}, norm, false, loc);
}
Tensor ifft(const Tensor& x, std::optional<int64_t> n, int64_t axis, Norm norm, Loc loc) {
  return complex_nd("ifft", x, one(n), std::vector<int64_t>{axis}, norm, true, loc);
}
Tensor rfft(const Tensor& x, std::optional<int64_t> n, int64_t axis, Norm norm, Loc loc) {
  return real_nd("rfft", x, one(n), std::vector<int64_t>{axis}, norm, loc);
}
Tensor irfft(const Tensor& x, std::optional<int64_t> n, int64_t axis, Norm norm, Loc loc) {
  return inverse_real_nd("irfft", x, one(n), std::vector<int64_t>{axis}, norm, loc);
}
Tensor hfft(const Tensor& x, std::optional<int64_t> n, int64_t axis, Norm norm, Loc loc) {
  const detail::CallSite site(loc);
  return inverse_real_nd("hfft", conj(as_complex("hfft", x)), one(n), std::vector<int64_t>{axis},
                         swapped(norm), loc);
}
Tensor ihfft(const Tensor& x, std::optional<int64_t> n, int64_t axis, Norm norm, Loc loc) {
  const detail::CallSite site(loc);
  return conj(real_nd("ihfft", x, one(n), std::vector<int64_t>{axis}, swapped(norm), loc));
}

Tensor fftn(const Tensor& x, Sizes s, AxesArg axes, Norm norm, Loc loc) {
  return complex_nd("fftn", x, s, axes, norm, false, loc);
}
Tensor ifftn(const Tensor& x, Sizes s, AxesArg axes, Norm norm, Loc loc) {
  return complex_nd("ifftn", x, s, axes, norm, true, loc);
}
Tensor rfftn(const Tensor& x, Sizes s, AxesArg axes, Norm norm, Loc loc) {
  return real_nd("rfftn", x, s, axes, norm, loc);
}
Tensor irfftn(const Tensor& x, Sizes s, AxesArg axes, Norm norm, Loc loc) {
  return inverse_real_nd("irfftn", x, s, axes, norm, loc);
}
Tensor fft2(const Tensor& x, Sizes s, std::vector<int64_t> axes, Norm norm, Loc loc) {
  return complex_nd("fft2", x, s, axes, norm, false, loc);
}
Tensor ifft2(const Tensor& x, Sizes s, std::vector<int64_t> axes, Norm norm, Loc loc) {
  return complex_nd("ifft2", x, s, axes, norm, true, loc);
}
Tensor rfft2(const Tensor& x, Sizes s, std::vector<int64_t> axes, Norm norm, Loc loc) {
  return real_nd("rfft2", x, s, axes, norm, loc);
}
Tensor irfft2(const Tensor& x, Sizes s, std::vector<int64_t> axes, Norm norm, Loc loc) {
  return inverse_real_nd("irfft2", x, s, axes, norm, loc);
}

Tensor fftfreq(int64_t n, double d, DType dtype, Loc loc) {
  const detail::CallSite site(loc);
  if (n < 1) fail("fftfreq", "invalid number of points: got ", n, ", expected n >= 1");
  std::vector<double> f(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    f[static_cast<std::size_t>(i)] =
        static_cast<double>(i <= (n - 1) / 2 ? i : i - n) / (d * static_cast<double>(n));
  return astype(tensor(f), dtype, loc);
}
Tensor rfftfreq(int64_t n, double d, DType dtype, Loc loc) {
  const detail::CallSite site(loc);
  if (n < 1) fail("rfftfreq", "invalid number of points: got ", n, ", expected n >= 1");
  std::vector<double> f(static_cast<std::size_t>(n / 2 + 1));
  for (std::size_t i = 0; i < f.size(); ++i)
    f[i] = static_cast<double>(i) / (d * static_cast<double>(n));
  return astype(tensor(f), dtype, loc);
}

namespace {
Tensor shift(std::string_view op, const Tensor& x, const AxesArg& axes, bool inverse, Loc loc) {
  const detail::CallSite site(loc);
  std::vector<int64_t> ax;
  if (axes) {
    ax = *axes;
  } else {
    for (int64_t d = 0; d < x.rank(); ++d) ax.push_back(d);
  }
  Tensor y = x;
  for (int64_t a : ax) {
    const int axis = normalize_axis(op, a, x.rank());
    const int64_t half = x.dim(axis) / 2;
    y = roll(y, inverse ? -half : half, axis, loc);
  }
  return y;
}
}  // namespace

Tensor fftshift(const Tensor& x, AxesArg axes, Loc loc) {
  return shift("fftshift", x, axes, false, loc);
}
Tensor ifftshift(const Tensor& x, AxesArg axes, Loc loc) {
  return shift("ifftshift", x, axes, true, loc);
}

}  // namespace fft
}  // namespace kiln
