// Comparison rules and edge values for compiled-vs-interpreted tests (compare.h).
#include "compare.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <sstream>

namespace kiln::testing {

std::string rule_name(Rule r) {
  switch (r) {
    case Rule::exact:
      return "exact";
    case Rule::ulps:
      return "ulps";
    case Rule::reduction:
      return "reduction";
    case Rule::program:
      return "program";
  }
  return "?";
}

namespace {

// A position on the ordered line of a float format's values: consecutive values differ by
// one, -0 is -1 and +0 is 0 (so they are one ulp apart, and distances across zero add up).
int64_t ordinal(double x, DType dtype) {
  int64_t mag = 0;
  bool negative = std::signbit(x);
  if (dtype == float64) {
    const auto u = std::bit_cast<uint64_t>(x);
    mag = static_cast<int64_t>(u & 0x7fffffffffffffffull);
  } else if (dtype == float32) {
    const auto u = std::bit_cast<uint32_t>(static_cast<float>(x));
    mag = static_cast<int64_t>(u & 0x7fffffffu);
  } else if (dtype == float16) {
    mag = static_cast<int64_t>(Half(static_cast<float>(x)).bits & 0x7fffu);
  } else {
    mag = static_cast<int64_t>(BFloat16(static_cast<float>(x)).bits & 0x7fffu);
  }
  return negative ? -mag - 1 : mag;
}

double epsilon(DType d) {
  switch (d) {
    case float16:
      return 0x1p-10;
    case bfloat16:
      return 0x1p-7;
    case float32:
      return std::numeric_limits<float>::epsilon();
    default:
      return std::numeric_limits<double>::epsilon();
  }
}
double denorm_min(DType d) {
  switch (d) {
    case float16:
      return 0x1p-24;
    case bfloat16:
      return 0x1p-133;
    case float32:
      return std::numeric_limits<float>::denorm_min();
    default:
      return std::numeric_limits<double>::denorm_min();
  }
}
double max_finite(DType d) {
  switch (d) {
    case float16:
      return 65504.0;
    case bfloat16:
      return 0x1.fep127;
    case float32:
      return std::numeric_limits<float>::max();
    default:
      return std::numeric_limits<double>::max();
  }
}

std::string show(double v) {
  std::ostringstream os;
  os.precision(17);
  os << v;
  if (v == 0 && std::signbit(v)) return "-0";
  return os.str();
}

}  // namespace

int64_t ulp_distance(double a, double b, DType dtype) {
  if (std::isnan(a) || std::isnan(b))
    return std::isnan(a) && std::isnan(b) ? 0 : std::numeric_limits<int64_t>::max();
  const int64_t d = ordinal(a, dtype) - ordinal(b, dtype);
  return d < 0 ? -d : d;
}

bool same_value(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return std::bit_cast<uint64_t>(a) == std::bit_cast<uint64_t>(b);
}

std::vector<double> values_of(const Tensor& t) {
  if (t.numel() == 0) return {};
  // float16/bfloat16/float32 to double is exact, so no value changes on the way.
  return astype(t, float64).to_vector<double>();
}

std::optional<std::string> compare(const Tensor& got, const Tensor& want, const Tolerance& tol) {
  if (got.type() != want.type()) {
    std::ostringstream os;
    os << "type " << got.type() << ", expected " << want.type();
    return os.str();
  }
  const std::vector<double> g = values_of(got), w = values_of(want);
  const DType dt = want.dtype();
  const bool floating = is_floating(dt);
  std::vector<double> mag;
  if (tol.rule == Rule::reduction && floating) {
    if (!tol.magnitude) return "the reduction rule needs the terms' magnitudes";
    mag = values_of(*tol.magnitude);
    if (mag.size() != w.size()) return "the magnitudes have another shape than the result";
  }
  double scale = 1.0;  // the program rule's max(1, max |want|)
  for (double v : w)
    if (std::isfinite(v)) scale = std::max(scale, std::abs(v));

  for (std::size_t k = 0; k < w.size(); ++k) {
    bool ok = false;
    std::string bound;
    if (!floating || tol.rule == Rule::exact) {
      ok = same_value(g[k], w[k]);
      bound = "equal bits";
    } else if (std::isnan(w[k]) || std::isinf(w[k])) {
      ok = same_value(g[k], w[k]);
      bound = "the same non-finite value";
    } else if (tol.rule == Rule::ulps) {
      const int64_t d = ulp_distance(g[k], w[k], dt);
      ok = d <= kTranscendentalUlps;
      bound = std::to_string(d) + " ulps apart, at most " + std::to_string(kTranscendentalUlps);
    } else if (tol.rule == Rule::reduction) {
      const double n = static_cast<double>(tol.terms);
      // Terms whose magnitudes overflow the dtype may overflow in one order and not another.
      if (!(mag[k] <= max_finite(dt))) continue;
      const double b = n * epsilon(dt) * mag[k] + n * denorm_min(dt);
      ok = std::abs(g[k] - w[k]) <= b;
      bound = "|difference| <= " + show(b) + " (" + std::to_string(tol.terms) +
              " terms of total magnitude " + show(mag[k]) + ")";
    } else {
      const double b =
          kProgramUlps * epsilon(tol.precision.value_or(dt)) * (std::abs(w[k]) + scale);
      ok = std::abs(g[k] - w[k]) <= b;
      bound = "|difference| <= " + show(b);
    }
    if (!ok) {
      std::ostringstream os;
      os << "element " << k << " of " << want.type() << ": got " << show(g[k]) << ", expected "
         << show(w[k]) << " (rule " << rule_name(tol.rule) << ": " << bound << ")";
      return os.str();
    }
  }
  return std::nullopt;
}

// ---- edge values ------------------------------------------------------------------------

std::vector<double> edge_values(DType dtype, bool tame) {
  if (dtype == bool_) return {0.0, 1.0};
  if (is_integral(dtype)) {
    double lo = 0, hi = 0;
    switch (dtype) {
      case uint8:
        hi = 255;
        break;
      case uint32:
        hi = 4294967295.0;
        break;
      case int32:
        lo = std::numeric_limits<int32_t>::min();
        hi = std::numeric_limits<int32_t>::max();
        break;
      default:
        lo = static_cast<double>(std::numeric_limits<int64_t>::min());
        // 2^63 - 1 is no double; the largest double below it stands in for "max".
        hi = std::nextafter(0x1p63, 0.0);
        break;
    }
    std::vector<double> v{0.0, 1.0, 2.0, hi, hi - 1};
    if (lo < 0) v.insert(v.end(), {-1.0, lo, lo + 1});
    if (tame) v = {0.0, 1.0, 2.0, 3.0};  // no wrap-around in long sums or products
    return v;
  }
  const double inf = std::numeric_limits<double>::infinity();
  const double tiny = denorm_min(dtype);
  const double normal_min = dtype == float16    ? 0x1p-14
                            : dtype == bfloat16 ? 0x1p-126
                            : dtype == float32
                                ? static_cast<double>(std::numeric_limits<float>::min())
                                : std::numeric_limits<double>::min();
  std::vector<double> v{0.0,         -0.0,       inf, -inf, std::nan(""), tiny,
                        -tiny * 3.0, normal_min, 1.0, -1.0, 0.5,          -2.5};
  if (!tame) {
    v.push_back(max_finite(dtype));
    v.push_back(-max_finite(dtype));
  }
  return v;
}

Tensor edge_tensor(const TensorType& type, int64_t offset, bool tame) {
  const std::vector<double> e = edge_values(type.dtype, tame);
  const int64_t n = type.shape.numel();
  std::vector<double> v(static_cast<std::size_t>(n));
  const auto m = static_cast<int64_t>(e.size());
  // A stride coprime with the count of edge values, so that two inputs with different
  // offsets pair every value with several others.
  for (int64_t i = 0; i < n; ++i)
    v[static_cast<std::size_t>(i)] = e[static_cast<std::size_t>((offset + i * (1 + offset)) % m)];
  if (type.dtype == int64) {
    // int64 extremes are not all doubles: build them from int64 directly.
    std::vector<int64_t> iv(v.size());
    for (std::size_t i = 0; i < v.size(); ++i)
      iv[i] = v[i] <= -0x1p63                       ? std::numeric_limits<int64_t>::min()
              : v[i] >= std::nextafter(0x1p63, 0.0) ? std::numeric_limits<int64_t>::max()
                                                    : static_cast<int64_t>(v[i]);
    return tensor(iv, type.shape);
  }
  return astype(tensor(v, type.shape), type.dtype);
}

Tensor cast_draw(const Tensor& x, DType dtype) {
  if (x.dtype() == dtype) return x;
  if (is_floating(dtype) || !is_floating(x.dtype())) return astype(x, dtype);
  if (dtype == bool_) return x > 0.0;
  const Tensor r = round(x * 4.0);
  return astype(is_unsigned(dtype) ? abs(r) : r, dtype);
}

Tensor strided_view(const Tensor& x) {
  if (x.numel() < 2) return x;
  // Interleave x with a copy of itself along a new last axis and take every other element:
  // a view with stride 2 over a buffer twice x's size.
  const Tensor both = stack({x, x}, x.rank());
  std::vector<Slice> s(static_cast<std::size_t>(both.rank()));
  s.back() = Slice{0, 1, 1};
  return squeeze(slice(both, s), {x.rank()});
}

Tensor transposed_view(const Tensor& x) {
  if (x.numel() < 2 || x.rank() < 2) return flip(flip(x).contiguous());  // negative strides
  Axes perm(static_cast<std::size_t>(x.rank()));
  std::iota(perm.rbegin(), perm.rend(), 0);  // reversed axes: its own inverse
  return transpose(transpose(x, perm).contiguous(), perm);
}

}  // namespace kiln::testing
