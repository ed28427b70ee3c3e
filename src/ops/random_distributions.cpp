// Sampling from distributions (kiln/random.h): the samplers that need their own kernels
// (truncated normal, gamma, weighted choice without replacement) as primitives on Threefry
// keys, and the ones composed from them and the uniform draws (categorical, beta, dirichlet,
// choice). Like src/ops/random.cpp, each output element depends only on the key and its
// index. Rejection samplers (gamma) draw element j's numbers from a subkey of (key, j), so
// the number of draws one element takes moves no other element.
//
// The primitives take keys [..., 2] and, where they have parameters, parameters whose leading
// axes are the key's batch axes: the batching rule moves both batch axes to the front.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <numeric>

#include "detail/dtype_dispatch.h"
#include "detail/parallel.h"
#include "kiln/ops.h"
#include "kiln/random.h"
#include "ops/primitives.h"
#include "ops/rules.h"
#include "ops/threefry.h"

namespace kiln {
namespace {

using namespace rng;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// The draws of one element of a rejection sampler: the stream of a subkey of (key, j).
class ElementStream {
 public:
  ElementStream(Pair key, int64_t j)
      : key_(threefry(key,
                      {static_cast<uint32_t>(j),
                       kElementDomain ^ static_cast<uint32_t>(static_cast<uint64_t>(j) >> 32)})) {}
  double uniform() { return open_unit_at(key_, next_++); }
  double normal() {  // Box-Muller, one of the pair
    const double r = std::sqrt(-2.0 * std::log(uniform()));
    return r * std::cos(2.0 * std::numbers::pi * uniform());
  }

 private:
  Pair key_;
  int64_t next_ = 0;
};

// Both inputs' batch axes in front (an unbatched one broadcast): the key's leading axes then
// carry the batch, and the parameters' leading axes follow them.
std::vector<Batched> batch_keys_and_parameters(const BatchArgs& b) {
  std::vector<Tensor> ins;
  for (std::size_t i = 0; i < b.inputs.size(); ++i)
    ins.push_back(ops::batch_first(b.inputs[i], b.dims[i], b.size));
  std::vector<Batched> out;
  for (Tensor& t : bind(b.primitive, ins, b.attrs)) out.push_back({std::move(t), 0});
  return out;
}

// Parameters [key batch..., rest...]: the key's batch axes lead.
void expect_parameters_follow_key(std::string_view op, const TensorType& key,
                                  const TensorType& params) {
  const Shape kb = batch_of(key.shape);
  const bool leads =
      params.shape.rank() >= kb.rank() && std::equal(kb.begin(), kb.end(), params.shape.begin());
  if (!leads)
    fail(op, "parameters do not follow the key's batch axes: got key ", key, " and parameters ",
         params, ", expected parameters whose leading axes are ", kb);
}

// Calls f(key, i, out_index) for element i of the `per` elements of each key, in parallel.
template <typename F>
void for_each_element(const Tensor& keys, int64_t per, int64_t cost, F f) {
  for_each_key(keys, per, [&](Pair key, int64_t base) {
    detail::parallel_for(
        per,
        [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i) f(key, i, base + i);
        },
        cost);
  });
}

// ---- truncated normal --------------------------------------------------------------------

double ndtr(double x) { return 0.5 * std::erfc(-x / std::numbers::sqrt2); }

// The inverse of ndtr on (0, 1): Acklam's rational approximation (relative error 1.2e-9)
// refined by one Halley step on ndtr, which gives full double precision.
double ndtri(double p) {
  constexpr double a[] = {-3.969683028665376e+01, 2.209460984245205e+02,  -2.759285104469687e+02,
                          1.383577518672690e+02,  -3.066479806614716e+01, 2.506628277459239e+00};
  constexpr double b[] = {-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02,
                          6.680131188771972e+01, -1.328068155288572e+01};
  constexpr double c[] = {-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00,
                          -2.549732539343734e+00, 4.374664141464968e+00,  2.938163982698783e+00};
  constexpr double d[] = {7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00,
                          3.754408661907416e+00};
  const auto tail = [&](double q) {
    return (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
           ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1.0);
  };
  constexpr double low = 0.02425;
  double x;
  if (p < low) {
    x = tail(std::sqrt(-2.0 * std::log(p)));
  } else if (p > 1.0 - low) {
    x = -tail(std::sqrt(-2.0 * std::log1p(-p)));
  } else {
    const double q = p - 0.5, r = q * q;
    x = (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q /
        (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1.0);
  }
  const double e = ndtr(x) - p;
  const double u = e * std::sqrt(2.0 * std::numbers::pi) * std::exp(0.5 * x * x);
  return x - u / (1.0 + 0.5 * x * u);
}

// N(0, 1) truncated to [lo, hi], sampled at uniforms u in (0, 1); the CDF at the bounds is
// computed once per draw of many samples.
class TruncatedNormal {
 public:
  TruncatedNormal(double lo, double hi)
      // Mirror so that most of the interval lies below zero, where ndtr is small and keeps its
      // relative precision.
      : mirror_(lo + hi > 0),
        a_(mirror_ ? -hi : lo),
        b_(mirror_ ? -lo : hi),
        pa_(ndtr(a_)),
        pb_(ndtr(b_)) {}

  double at(double u) const {
    double x;
    if (pb_ - pa_ > 1e-12 * pb_) {
      x = ndtri(pa_ + u * (pb_ - pa_));
    } else {
      // The interval is beyond double's ndtr (below ~-37) or too narrow for its differences:
      // there the density is exp(-b x) to first order about b, an exponential truncated to
      // the width (a uniform when the tilt over the width is negligible).
      const double rate = -b_, width = b_ - a_;
      const double e = std::abs(rate * width) < 1e-8
                           ? u * width
                           : -std::log1p(u * std::expm1(-rate * width)) / rate;
      x = b_ - e;
    }
    x = std::clamp(x, a_, b_);
    return mirror_ ? -x : x;
  }

 private:
  bool mirror_;
  double a_, b_, pa_, pb_;
};

Shape attr_shape(const Attrs& a) { return Shape(a.get_ints("shape")); }

// ---- gamma -------------------------------------------------------------------------------

// log(1 + y) - y, by its series where the difference cancels.
double log1p_minus(double y) {
  if (std::abs(y) < 1e-3) return y * y * (-0.5 + y * (1.0 / 3 + y * (-0.25 + y * (0.2 - y / 6))));
  return std::log1p(y) - y;
}

// A Gamma(alpha, 1) sample as value * exp(log_scale): Marsaglia & Tsang (2000) for alpha >= 1
// (acceptance >= 95% for every alpha, so the loop ends), and for alpha < 1 the boost
// Gamma(alpha) = Gamma(alpha + 1) * U^(1/alpha), kept as a log so that tiny alphas underflow
// only when the caller asks for the value.
struct GammaDraw {
  double value, log_scale;
};

GammaDraw draw_gamma(double alpha, ElementStream& s) {
  if (!(alpha > 0)) return {kNaN, 0.0};
  if (std::isinf(alpha)) return {kInf, 0.0};
  double log_scale = 0.0;
  if (alpha < 1) {
    log_scale = std::log(s.uniform()) / alpha;
    alpha += 1.0;
  }
  const double d = alpha - 1.0 / 3.0, c = 1.0 / std::sqrt(9.0 * d);
  for (;;) {
    const double x = s.normal(), t = c * x;
    if (t <= -1.0) continue;
    // v = (1 + t)^3 as v - 1, so that d (1 - v + log v) keeps its precision for huge d.
    const double vm1 = t * (3.0 + t * (3.0 + t));
    const double u = s.uniform(), x2 = x * x;
    // Marsaglia and Tsang's squeeze accepts most draws without the logarithms.
    if (u < 1.0 - 0.0331 * x2 * x2 || std::log(u) < 0.5 * x2 + d * log1p_minus(vm1))
      return {d + d * vm1, log_scale};
  }
}

// ---- weighted choice without replacement -------------------------------------------------

// One Poisson(lam) draw, lam >= 0 finite. Below 10: Knuth's multiplication of uniforms until
// the product falls below exp(-lam) (about lam + 1 uniforms). From 10: Hoermann's transformed
// rejection with squeeze, PTRS ("The transformed rejection method for generating Poisson
// random variables", 1993), numpy's algorithm, with the same constants.
double draw_poisson(double lam, ElementStream& s) {
  if (lam < 10) {
    const double limit = std::exp(-lam);
    double k = 0, product = s.uniform();
    while (product > limit) {
      k += 1;
      product *= s.uniform();
    }
    return k;
  }
  const double slam = std::sqrt(lam), loglam = std::log(lam);
  const double b = 0.931 + 2.53 * slam, a = -0.059 + 0.02483 * b;
  const double invalpha = 1.1239 + 1.1328 / (b - 3.4), vr = 0.9277 - 3.6224 / (b - 2);
  for (;;) {
    const double u = s.uniform() - 0.5, v = s.uniform();
    const double us = 0.5 - std::abs(u);
    const double k = std::floor((2 * a / us + b) * u + lam + 0.43);
    if (us >= 0.07 && v <= vr) return k;
    if (k < 0 || (us < 0.013 && v > us)) continue;
    int sign = 0;  // lgamma_r: lgamma writes a global, a race between threads
    if (std::log(v) + std::log(invalpha) - std::log(a / (us * us) + b) <=
        -lam + k * loglam - ::lgamma_r(k + 1, &sign))
      return k;
  }
}

// The largest count of the integer dtype d kept exactly as a double (int64: just below 2^63).
double largest_count(DType d) { return d == int32 ? 2147483647.0 : 9.2e18; }
// The largest lam whose draws fit d with room to spare (40 standard deviations).
double max_poisson_lam(DType d) {
  const double top = largest_count(d);
  return top - 40 * std::sqrt(top);
}

// Indices of the k largest log-weights plus Gumbel noise (ties to the lower index): k draws
// without replacement with probabilities proportional to exp(logits).
void gumbel_top_k(Pair key, const double* logits, int64_t n, int64_t k, int64_t* out) {
  std::vector<double> score(static_cast<std::size_t>(n));
  int64_t possible = 0;
  for (int64_t j = 0; j < n; ++j) {
    if (std::isnan(logits[j]) || logits[j] == kInf)
      fail("choice", "invalid weight: got log-weight ", logits[j], " at index ", j,
           ", expected finite non-negative weights");
    score[j] = logits[j] - std::log(-std::log(open_unit_at(key, j)));
    possible += logits[j] > -kInf;
  }
  if (possible < k)
    fail("choice", "too few non-zero weights: got ", possible, " of ", n, " for ", k,
         " draws without replacement, expected at least ", k);
  std::vector<int64_t> idx(static_cast<std::size_t>(n));
  std::iota(idx.begin(), idx.end(), int64_t{0});
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int64_t x, int64_t y) {
    return score[x] > score[y] || (score[x] == score[y] && x < y);
  });
  std::copy(idx.begin(), idx.begin() + k, out);
}

}  // namespace

const Primitive& prim::random_truncated_normal() {
  static const Primitive& p = detail::register_builtin(
      {.name = "random_truncated_normal",
       .arity = 1,
       .type_rule =
           [](ops::Types in, const Attrs& a) {
             expect_key("random_truncated_normal", in[0]);
             const DType dt = a.get_dtype("dtype");
             if (!is_floating(dt))
               fail("random_truncated_normal", "non-float dtype: got ", dt,
                    ", expected a floating dtype");
             const double lo = a.get_double("lower"), hi = a.get_double("upper");
             if (!(lo < hi))
               fail("random_truncated_normal", "empty interval: got [", lo, ", ", hi,
                    "], expected lower < upper");
             return std::vector<TensorType>{{dt, concat(batch_of(in[0].shape), attr_shape(a))}};
           },
       .differentiable = false,
       .batch = ops::batch_leading([](const Attrs& a, const Tensor&) { return a; })},
      {{ops::cpu({uint32}), [](ops::Ins in, const Attrs& a) {
          const DType dt = a.get_dtype("dtype");
          const double lo = a.get_double("lower"), hi = a.get_double("upper");
          const int64_t per = attr_shape(a).numel();
          Tensor out = empty(concat(batch_of(in[0].shape()), attr_shape(a)), dt);
          const TruncatedNormal dist(lo, hi);
          detail::visit_floating(dt, [&]<typename T>() {
            T* po = out.data<T>();
            for_each_element(in[0], per, 64, [&](Pair key, int64_t i, int64_t at) {
              const double x = dist.at(open_unit_at(key, i));
              if constexpr (std::is_same_v<T, double>) {
                po[at] = x;
              } else {  // clamped again after rounding to float
                po[at] = T(std::clamp(static_cast<float>(x), static_cast<float>(lo),
                                      static_cast<float>(hi)));
              }
            });
          });
          return std::vector<Tensor>{out};
        }}});
  return p;
}

// Poisson(lam) counts of the shape and integer dtype of the attributes, per key of a batch.
const Primitive& prim::random_poisson() {
  static const Primitive& p = detail::register_builtin(
      {.name = "random_poisson",
       .arity = 1,
       .type_rule =
           [](ops::Types in, const Attrs& a) {
             expect_key("random_poisson", in[0]);
             const DType dt = a.get_dtype("dtype");
             if (dt != int32 && dt != int64)
               fail("random_poisson", "unsupported dtype: got ", dt, ", expected int32 or int64");
             const double lam = a.get_double("lam");
             if (!(lam >= 0 && lam <= max_poisson_lam(dt)))
               fail("random_poisson", "rate out of range: got lam=", lam,
                    ", expected 0 <= lam <= ", max_poisson_lam(dt), " for ", dt);
             return std::vector<TensorType>{{dt, concat(batch_of(in[0].shape), attr_shape(a))}};
           },
       .differentiable = false,
       .batch = ops::batch_leading([](const Attrs& a, const Tensor&) { return a; })},
      {{ops::cpu({uint32}), [](ops::Ins in, const Attrs& a) {
          const DType dt = a.get_dtype("dtype");
          const double lam = a.get_double("lam");
          const int64_t per = attr_shape(a).numel();
          Tensor out = empty(concat(batch_of(in[0].shape()), attr_shape(a)), dt);
          detail::visit_dtype(dt, [&]<typename T>() {
            if constexpr (std::is_same_v<T, int32_t> || std::is_same_v<T, int64_t>) {
              T* po = out.data<T>();
              for_each_element(in[0], per, 64, [&](Pair key, int64_t i, int64_t at) {
                ElementStream s(key, i);
                const double k = draw_poisson(lam, s);
                po[at] = static_cast<T>(std::min(k, largest_count(dt)));
              });
            }
          });
          return std::vector<Tensor>{out};
        }}});
  return p;
}

// Gamma(alpha, 1), or its log (attribute "log"), one draw per element of alpha
// [key batch..., sample...].
const Primitive& prim::random_gamma() {
  static const Primitive& p = detail::register_builtin(
      {.name = "random_gamma",
       .arity = 2,
       .type_rule =
           [](ops::Types in, const Attrs&) {
             expect_key("random_gamma", in[0]);
             ops::expect_dtype("random_gamma", in[1], DTypeSet::floating(), "a floating alpha");
             expect_parameters_follow_key("random_gamma", in[0], in[1]);
             return std::vector<TensorType>{in[1]};
           },
       .differentiable = false,
       .batch = batch_keys_and_parameters},
      {{ops::cpu({uint32, DTypeSet::floating()}), [](ops::Ins in, const Attrs& a) {
          const bool log_space = a.get_bool("log");
          const Tensor alpha = in[1].contiguous();
          Tensor out = empty(alpha.type());
          const int64_t keys = in[0].numel() / 2;
          const int64_t per = keys == 0 ? 0 : alpha.numel() / keys;
          detail::visit_floating(alpha.dtype(), [&]<typename T>() {
            const T* pa = alpha.data<const T>();
            T* po = out.data<T>();
            for_each_element(in[0], per, 256, [&](Pair key, int64_t i, int64_t at) {
              ElementStream s(key, i);
              const GammaDraw g = draw_gamma(static_cast<double>(pa[at]), s);
              po[at] = static_cast<T>(log_space ? std::log(g.value) + g.log_scale
                                                : g.value * std::exp(g.log_scale));
            });
          });
          return std::vector<Tensor>{out};
        }}});
  return p;
}

// k = attribute "num_samples" indices without replacement per row of log-weights
// [key batch..., n]: Gumbel top-k.
const Primitive& prim::random_gumbel_top_k() {
  static const Primitive& p = detail::register_builtin(
      {.name = "random_gumbel_top_k",
       .arity = 2,
       .type_rule =
           [](ops::Types in, const Attrs& a) {
             expect_key("random_gumbel_top_k", in[0]);
             ops::expect_dtype("random_gumbel_top_k", in[1], DTypeSet::floating(),
                               "floating log-weights");
             expect_parameters_follow_key("random_gumbel_top_k", in[0], in[1]);
             if (in[1].shape.rank() != in[0].shape.rank())
               fail("random_gumbel_top_k", "log-weights are not one row per key: got key ", in[0],
                    " and log-weights ", in[1], ", expected log-weights of shape ",
                    batch_of(in[0].shape), " + [n]");
             const int64_t n = in[1].shape[in[1].shape.rank() - 1], k = a.get_int("num_samples");
             if (k < 0 || k > n)
               fail("random_gumbel_top_k", "invalid count: got num_samples=", k, " of n=", n,
                    ", expected 0 <= num_samples <= n");
             return std::vector<TensorType>{{int64, concat(batch_of(in[0].shape), Shape{k})}};
           },
       .differentiable = false,
       .batch = batch_keys_and_parameters},
      {{ops::cpu({uint32, DTypeSet::floating()}), [](ops::Ins in, const Attrs& a) {
          const int64_t k = a.get_int("num_samples");
          const Tensor logits = astype(in[1], float64).contiguous();
          const int64_t n = logits.shape()[logits.rank() - 1];
          Tensor out = empty(concat(batch_of(in[0].shape()), Shape{k}), int64);
          const double* pl = logits.data<const double>();
          int64_t* po = out.data<int64_t>();
          int64_t row = 0;
          for_each_key(in[0], k, [&](Pair key, int64_t base) {
            gumbel_top_k(key, pl + n * row++, n, k, po + base);
          });
          return std::vector<Tensor>{out};
        }}});
  return p;
}

namespace random {
namespace {

DType work_dtype(DType d) { return d == float64 ? float64 : float32; }

int64_t normalize_axis(std::string_view op, int64_t axis, int64_t rank) {
  if (axis < -rank || axis >= rank)
    fail(op, "axis out of range: got axis=", axis, " for rank ", rank, ", expected -", rank,
         " <= axis < ", rank);
  return axis < 0 ? axis + rank : axis;
}

void expect_floating(std::string_view op, const char* what, const Tensor& t) {
  if (!is_floating(t.dtype()))
    fail(op, "non-float ", what, ": got ", t.type(), ", expected a floating dtype");
}

// Parameters broadcast to [key batch..., shape...].
Tensor per_key(const Tensor& key, const Tensor& params, const Shape& shape, Loc loc) {
  return broadcast_to(params, concat(batch_of(key.shape()), shape), loc);
}

Tensor gamma_primitive(std::string_view op, const Tensor& key, const Tensor& alpha,
                       const Shape& shape, bool log_space, Loc loc) {
  expect_floating(op, "alpha", alpha);
  return bind1(prim::random_gamma(), {key, per_key(key, alpha, shape, loc)}, {{"log", log_space}},
               loc);
}

// alpha [..., K] checked, and K.
int64_t categories(const Tensor& alpha) {
  expect_floating("dirichlet", "alpha", alpha);
  if (alpha.rank() < 1)
    fail("dirichlet", "0-d alpha: got ", alpha.type(), ", expected alpha of shape [..., K]");
  return alpha.shape()[alpha.rank() - 1];
}

// Uniforms on [0, 1) in float32 (float64 for float64): those of 16-bit dtypes would have too
// few values for the tails of the distributions drawn from them.
Tensor work_uniform(std::string_view op, const Tensor& key, const Shape& shape, DType dtype,
                    Loc loc) {
  if (!is_floating(dtype)) fail(op, "non-float dtype: got ", dtype, ", expected a floating dtype");
  return uniform(key, shape, work_dtype(dtype), 0.0, 1.0, loc);
}

}  // namespace

// From uniforms kept off 0, so the noise is finite.
Tensor gumbel(const Tensor& key, const Shape& shape, DType dtype, Loc loc) {
  const detail::CallSite site(loc);
  const Tensor u = work_uniform("gumbel", key, shape, dtype, loc);
  const Tensor tiny = scalar_like(u, u.dtype() == float64 ? std::numeric_limits<double>::min()
                                                          : std::numeric_limits<float>::min());
  return astype(neg(log(neg(log(maximum(u, tiny, loc), loc), loc), loc), loc), dtype, loc);
}
// -log(1 - U): finite, as U < 1.
Tensor exponential(const Tensor& key, const Shape& shape, DType dtype, Loc loc) {
  const detail::CallSite site(loc);
  const Tensor u = work_uniform("exponential", key, shape, dtype, loc);
  return astype(neg(log1p(neg(u, loc), loc), loc), dtype, loc);
}
// An exponential with a random sign: -sign(v) log(1 - |v|), v = 2U - 1 uniform on [-1, 1).
// v = -1 (at U = 0) is moved to the next value up, so that |v| < 1 and the sample is finite.
Tensor laplace(const Tensor& key, const Shape& shape, DType dtype, Loc loc) {
  const detail::CallSite site(loc);
  const Tensor u = work_uniform("laplace", key, shape, dtype, loc);
  const double eps = u.dtype() == float64 ? std::numeric_limits<double>::epsilon()
                                          : std::numeric_limits<float>::epsilon();
  const Tensor v = maximum(u * 2.0 - 1.0, scalar_like(u, -1.0 + eps), loc);
  return astype(neg(sign(v, loc) * log1p(neg(abs(v, loc), loc), loc), loc), dtype, loc);
}
Tensor poisson(const Tensor& key, double lam, const Shape& shape, DType dtype, Loc loc) {
  const detail::CallSite site(loc);
  return bind1(prim::random_poisson(), {key},
               {{"shape", shape.dims()}, {"dtype", dtype}, {"lam", lam}}, loc);
}

Tensor categorical(const Tensor& key, const Tensor& logits, int64_t axis, const Shape& shape,
                   Loc loc) {
  const detail::CallSite site(loc);
  expect_floating("categorical", "logits", logits);
  const Tensor last = moveaxis(logits, normalize_axis("categorical", axis, logits.rank()), -1, loc);
  const int64_t n = last.shape()[last.rank() - 1];
  if (n == 0)
    fail("categorical", "no categories: got logits ", logits.type(), " with axis ", axis,
         " of size 0, expected at least one category");
  const Shape full = concat(shape, Shape{n});
  const DType work = work_dtype(logits.dtype());
  const Tensor scores =
      add(astype(broadcast_to(last, full, loc), work, loc), gumbel(key, full, work, loc), loc);
  return argmax(scores, -1, false, loc);
}

Tensor categorical(const Tensor& key, const Tensor& logits, int64_t axis, Loc loc) {
  const detail::CallSite site(loc);
  std::vector<int64_t> batch = logits.shape().dims();
  batch.erase(batch.begin() + normalize_axis("categorical", axis, logits.rank()));
  return categorical(key, logits, axis, Shape(batch), loc);
}

Tensor truncated_normal(const Tensor& key, double lower, double upper, const Shape& shape,
                        DType dtype, Loc loc) {
  const detail::CallSite site(loc);
  return bind1(prim::random_truncated_normal(), {key},
               {{"shape", shape.dims()}, {"dtype", dtype}, {"lower", lower}, {"upper", upper}},
               loc);
}

Tensor gamma(const Tensor& key, const Tensor& alpha, const Shape& shape, Loc loc) {
  const detail::CallSite site(loc);
  return gamma_primitive("gamma", key, alpha, shape, false, loc);
}

Tensor gamma(const Tensor& key, const Tensor& alpha, Loc loc) {
  return gamma(key, alpha, alpha.shape(), loc);
}

Tensor loggamma(const Tensor& key, const Tensor& alpha, const Shape& shape, Loc loc) {
  const detail::CallSite site(loc);
  return gamma_primitive("loggamma", key, alpha, shape, true, loc);
}

Tensor loggamma(const Tensor& key, const Tensor& alpha, Loc loc) {
  return loggamma(key, alpha, alpha.shape(), loc);
}

Tensor beta(const Tensor& key, const Tensor& a, const Tensor& b, const Shape& shape, Loc loc) {
  const detail::CallSite site(loc);
  expect_floating("beta", "a", a);
  expect_floating("beta", "b", b);
  const auto [pa, pb] = ops::promote_broadcast("beta", a, b, loc);
  const auto [ka, kb] = split(key, loc);
  const Tensor la = gamma_primitive("beta", ka, pa, shape, true, loc);
  const Tensor lb = gamma_primitive("beta", kb, pb, shape, true, loc);
  // Ga / (Ga + Gb) from the logs: no 0/0 when both underflow.
  return sigmoid(sub(la, lb, loc), loc);
}

Tensor beta(const Tensor& key, const Tensor& a, const Tensor& b, Loc loc) {
  const detail::CallSite site(loc);
  expect_floating("beta", "a", a);
  expect_floating("beta", "b", b);
  return beta(key, a, b, ops::promote_broadcast("beta", a, b, loc).first.shape(), loc);
}

Tensor dirichlet(const Tensor& key, const Tensor& alpha, const Shape& shape, Loc loc) {
  const detail::CallSite site(loc);
  const int64_t k = categories(alpha);
  return softmax(gamma_primitive("dirichlet", key, alpha, concat(shape, Shape{k}), true, loc), -1,
                 loc);
}

Tensor dirichlet(const Tensor& key, const Tensor& alpha, Loc loc) {
  const detail::CallSite site(loc);
  categories(alpha);
  std::vector<int64_t> batch = alpha.shape().dims();
  batch.pop_back();
  return dirichlet(key, alpha, Shape(batch), loc);
}

Tensor choice(const Tensor& key, int64_t n, const Shape& shape, bool replace,
              std::optional<Tensor> p, Loc loc) {
  const detail::CallSite site(loc);
  const int64_t k = shape.numel();
  if (n < 0 || (n == 0 && k > 0))
    fail("choice", "nothing to choose from: got n=", n, " for ", k,
         " draws, expected n > 0 (or no draws)");
  if (!replace && k > n)
    fail("choice", "too many draws without replacement: got ", k, " draws (shape ", shape,
         ") from n=", n, ", expected at most ", n);
  const Shape out = concat(batch_of(key.shape()), shape);
  if (p) {
    expect_floating("choice", "p", *p);
    if (p->rank() != 1 || p->shape()[0] != n)
      fail("choice", "weights do not match: got p ", p->type(), " for n=", n,
           ", expected p of shape [", n, "]");
    const Tensor logits = log(*p, loc);
    if (replace) return categorical(key, logits, -1, shape, loc);
    const Tensor rows = broadcast_to(logits, concat(batch_of(key.shape()), Shape{n}), loc);
    return reshape(bind1(prim::random_gumbel_top_k(), {key, rows}, {{"num_samples", k}}, loc), out,
                   loc);
  }
  if (replace) return randint(key, shape, 0, n, int64, loc);
  const Tensor perm = permutation(key, n, loc);
  return reshape(take(perm, arange(k, int64, loc), perm.rank() - 1, loc), out, loc);
}

Tensor choice(const Tensor& key, const Tensor& a, const Shape& shape, bool replace,
              std::optional<Tensor> p, Loc loc) {
  const detail::CallSite site(loc);
  if (a.rank() < 1)
    fail("choice", "0-d population: got ", a.type(), ", expected at least one axis");
  return take(a, choice(key, a.shape()[0], shape, replace, p, loc), 0, loc);
}

}  // namespace random
}  // namespace kiln
