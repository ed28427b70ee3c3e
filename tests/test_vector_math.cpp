// The vectorised transcendental functions (src/math/vector_math.h): accuracy against a
// higher-precision reference (long double std:: functions) on every instruction set this CPU
// supports, special values exactly as C's libm, and the eager kernels that use them.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <limits>
#include <random>
#include <sstream>
#include <vector>

#include "kiln/kiln.h"
#include "math/vector_math.h"
#include "testing.h"

namespace kiln {
namespace {

using math::Isa;
using math::MathFn;

// The accuracy DESIGN.md documents ("Kernels").
constexpr double kMaxUlp = 2.0;

std::vector<Isa> supported_isas() {
  std::vector<Isa> out;
  for (Isa isa : {Isa::scalar, Isa::sse4, Isa::avx2, Isa::avx512})
    if (isa <= math::detected_isa()) out.push_back(isa);
  return out;
}

long double reference(MathFn fn, long double x, long double y = 0) {
  switch (fn) {
    case MathFn::exp:
      return std::exp(x);
    case MathFn::log:
      return std::log(x);
    case MathFn::log1p:
      return std::log1p(x);
    case MathFn::expm1:
      return std::expm1(x);
    case MathFn::sin:
      return std::sin(x);
    case MathFn::cos:
      return std::cos(x);
    case MathFn::tan:
      return std::tan(x);
    case MathFn::tanh:
      return std::tanh(x);
    case MathFn::erf:
      return std::erf(x);
    case MathFn::pow:
      return std::pow(x, y);
  }
  return NAN;
}
// Both dtypes against the long double functions (x87: a 64-bit significand, 40 bits more than
// float32's and 11 more than float64's).
template <typename T>
long double ref(MathFn fn, T x, T y = 0) {
  return reference(fn, static_cast<long double>(x), static_cast<long double>(y));
}

// |got - want| in units of T's spacing at want (the spacing of the smallest denormals below the
// normal range). Infinite and NaN results must match exactly.
template <typename T>
double ulp_error(T got, long double want) {
  if (std::isnan(want)) return std::isnan(got) ? 0.0 : INFINITY;
  const T rounded = static_cast<T>(want);
  if (std::isinf(rounded) || std::isinf(got) || std::isnan(got)) {
    if (got == rounded) return 0.0;
    // Near the overflow threshold: measure against the largest finite value's spacing.
    if (!std::isnan(got) && std::fabs(want) < 2.0L * std::numeric_limits<T>::max()) {
      const long double spacing =
          std::ldexp(1.0L, std::numeric_limits<T>::max_exponent - std::numeric_limits<T>::digits);
      const long double g =
          std::isinf(got)
              ? std::copysign(static_cast<long double>(std::numeric_limits<T>::max()) + spacing,
                              static_cast<long double>(got))
              : static_cast<long double>(got);
      return static_cast<double>(std::fabs(g - want) / spacing);
    }
    return INFINITY;
  }
  const long double a = std::fabs(want);
  long double spacing = std::numeric_limits<T>::denorm_min();
  if (a >= std::numeric_limits<T>::min())
    spacing = std::ldexp(1.0L, std::ilogb(a) - std::numeric_limits<T>::digits + 1);
  return static_cast<double>(std::fabs(static_cast<long double>(got) - want) / spacing);
}

template <typename T>
using Bits = std::conditional_t<std::is_same_v<T, float>, uint32_t, uint64_t>;

// Random bit patterns: every finite value (denormals included) with equal weight per binade.
template <typename T>
T random_finite(std::mt19937_64& gen) {
  for (;;) {
    const T x = std::bit_cast<T>(static_cast<Bits<T>>(gen()));
    if (std::isfinite(x)) return x;
  }
}
// Random bits with |x| in [lo, hi] (lo > 0): log-uniform magnitudes, random sign if `sign`.
template <typename T>
T random_magnitude(std::mt19937_64& gen, T lo, T hi, bool sign) {
  const Bits<T> a = std::bit_cast<Bits<T>>(lo), b = std::bit_cast<Bits<T>>(hi);
  std::uniform_int_distribution<Bits<T>> d(a, b);
  const T x = std::bit_cast<T>(d(gen));
  return sign && (gen() & 1) ? -x : x;
}

// About a million arguments for fn: random bits over the finite range, uniform sweeps of the
// interesting interval, dense bits near 0, and the ranges near overflow and underflow.
template <typename T>
std::vector<T> arguments(MathFn fn) {
  using L = std::numeric_limits<T>;
  std::mt19937_64 gen(1234 + static_cast<int>(fn));
  std::vector<T> xs;
  constexpr int kPer = 1 << 18;
  const bool f32 = std::is_same_v<T, float>;
  auto uniform = [&](double lo, double hi) {
    for (int i = 0; i < kPer; ++i)
      xs.push_back(static_cast<T>(lo + (hi - lo) * (static_cast<double>(gen() >> 11) * 0x1p-53)));
  };
  for (int i = 0; i < kPer; ++i) xs.push_back(random_finite<T>(gen));
  for (int i = 0; i < kPer; ++i)
    xs.push_back(random_magnitude<T>(gen, L::denorm_min(), T{1}, fn != MathFn::log));
  const double big = std::log(static_cast<double>(L::max()));          // exp overflows above
  const double tiny = std::log(static_cast<double>(L::denorm_min()));  // and underflows below
  switch (fn) {
    case MathFn::exp:
    case MathFn::expm1:
      uniform(tiny - 2, big + 2);
      uniform(big - 1, big + 0.1);
      for (double edge : {big, tiny, std::log(static_cast<double>(L::min()))}) {
        T x = static_cast<T>(edge);  // the 2^16 values either side of each threshold
        for (int i = 0; i < 1 << 16; ++i) x = std::nextafter(x, -L::infinity());
        for (int i = 0; i < 1 << 17; ++i) xs.push_back(x = std::nextafter(x, L::infinity()));
      }
      break;
    case MathFn::log:
    case MathFn::log1p:
      uniform(fn == MathFn::log1p ? -1.0 : 0.0, 4.0);
      for (int i = 0; i < kPer; ++i) xs.push_back(random_magnitude<T>(gen, T{1}, L::max(), false));
      break;
    case MathFn::sin:
    case MathFn::cos:
    case MathFn::tan:
      uniform(-10, 10);
      uniform(f32 ? -1e4 : -1e6, f32 ? 1e4 : 1e6);
      break;
    case MathFn::tanh:
    case MathFn::erf:
      uniform(-10, 10);
      uniform(-1, 1);
      break;
    case MathFn::pow:
      break;
  }
  return xs;
}

// Pairs (x, y) for pow: positive x over the whole range with y keeping x^y near the finite
// range, x near 1 with large y, negative x with integer y, and random bits.
template <typename T>
void pow_arguments(std::vector<T>& xs, std::vector<T>& ys) {
  using L = std::numeric_limits<T>;
  std::mt19937_64 gen(99);
  constexpr int kPer = 1 << 18;
  auto unit = [&] { return static_cast<double>(gen() >> 11) * 0x1p-53; };
  const double top = std::log2(static_cast<double>(L::max()));
  for (int i = 0; i < kPer; ++i) {
    const T x = random_magnitude<T>(gen, L::denorm_min(), L::max(), false);
    const double lx = std::fabs(std::log2(static_cast<double>(x)));
    const double lim = std::min(top * 1.05 / std::max(lx, 1e-3), 1e6);
    xs.push_back(x);
    ys.push_back(static_cast<T>((2 * unit() - 1) * lim));
  }
  for (int i = 0; i < kPer; ++i) {
    xs.push_back(static_cast<T>(1 + (2 * unit() - 1) * 1e-3));
    ys.push_back(static_cast<T>((2 * unit() - 1) * 1e5));
  }
  for (int i = 0; i < kPer; ++i) {
    xs.push_back(static_cast<T>(-unit() * 20));
    ys.push_back(static_cast<T>(std::floor((2 * unit() - 1) * 40)));
  }
  for (int i = 0; i < kPer; ++i) {
    xs.push_back(random_finite<T>(gen));
    ys.push_back(random_finite<T>(gen));
  }
  // Results just below the overflow threshold: y log(x) within a few ulps of log(max).
  for (int i = 0; i < kPer / 4; ++i) {
    const T x = random_magnitude<T>(gen, T{1.5}, L::max(), false);
    T y =
        static_cast<T>(std::log(static_cast<double>(L::max())) / std::log(static_cast<double>(x)));
    for (int k = static_cast<int>(gen() % 16); k > 0; --k) y = std::nextafter(y, T{0});
    xs.push_back(x);
    ys.push_back(y);
  }
}

struct Worst {
  double ulp = 0;
  std::size_t at = 0;
};

template <typename T>
void check_accuracy(MathFn fn) {
  std::vector<T> xs, ys;
  if (fn == MathFn::pow)
    pow_arguments(xs, ys);
  else
    xs = arguments<T>(fn);
  std::vector<long double> want(xs.size());
  for (std::size_t i = 0; i < xs.size(); ++i)
    want[i] = fn == MathFn::pow ? ref<T>(fn, xs[i], ys[i]) : ref<T>(fn, xs[i]);
  const char* dtype = std::is_same_v<T, float> ? "f32" : "f64";
  for (Isa isa : supported_isas()) {
    std::vector<T> got(xs.size());
    if (fn == MathFn::pow)
      math::apply_pow(isa, xs.data(), ys.data(), got.data(), static_cast<int64_t>(xs.size()));
    else
      math::apply(isa, fn, xs.data(), got.data(), static_cast<int64_t>(xs.size()));
    Worst w;
    for (std::size_t i = 0; i < xs.size(); ++i) {
      const double e = ulp_error(got[i], want[i]);
      if (!(e <= w.ulp)) w = {e, i};
    }
    std::cout << math::fn_name(fn) << " " << dtype << " " << math::isa_name(isa) << ": max error "
              << w.ulp << " ulp over " << xs.size() << " points\n";
    std::ostringstream where;
    where << std::hexfloat << "x = " << xs[w.at];
    if (fn == MathFn::pow) where << ", y = " << ys[w.at];
    EXPECT_LE(w.ulp, kMaxUlp) << math::fn_name(fn) << " " << dtype << " on " << math::isa_name(isa)
                              << " at " << where.str() << ": got " << std::hexfloat << got[w.at]
                              << ", want " << static_cast<double>(want[w.at]);
  }
}

TEST(VectorMath, AccuracyFloat32) {
  for (MathFn fn : math::kMathFns) check_accuracy<float>(fn);
}
TEST(VectorMath, AccuracyFloat64) {
  for (MathFn fn : math::kMathFns) check_accuracy<double>(fn);
}

// Same bits, or both NaN.
template <typename T>
bool identical(T a, T b) {
  return (std::isnan(a) && std::isnan(b)) || std::bit_cast<Bits<T>>(a) == std::bit_cast<Bits<T>>(b);
}

// C's libm (Annex F) fixes these results; numpy gives the same: NaN in, NaN out; exp(-inf) = 0;
// log(0) = -inf; log(-1) = NaN; tanh(+-inf) = +-1; odd functions keep the sign of zero; and
// the tiniest denormals, where an odd function's result is its argument (SLEEF flushes log1p's
// and tan's to +0; vector_math patches them).
template <typename T>
void check_special_values() {
  using L = std::numeric_limits<T>;
  const std::vector<T> specials = {
      T{0},           -T{0},           L::infinity(),    -L::infinity(),
      L::quiet_NaN(), L::denorm_min(), -L::denorm_min(), L::min() / 3,
      -L::min() / 3,  L::min(),        -L::min(),        T{1},
      T{-1},          L::max(),        -L::max()};
  for (MathFn fn : math::kMathFns) {
    if (fn == MathFn::pow) continue;
    for (Isa isa : supported_isas()) {
      std::vector<T> got(specials.size());
      math::apply(isa, fn, specials.data(), got.data(), static_cast<int64_t>(specials.size()));
      for (std::size_t i = 0; i < specials.size(); ++i) {
        const T x = specials[i];
        // log of a denormal, and the trigonometric functions of +-1 and +-max, are ordinary
        // values: the accuracy tests cover them.
        const bool ordinary = std::isfinite(x) && x != 0 && std::fabs(x) >= L::min() &&
                              fn != MathFn::exp && fn != MathFn::tanh && fn != MathFn::erf;
        if (ordinary || (fn == MathFn::log && std::isfinite(x) && x > 0)) continue;
        const T want = static_cast<T>(reference(fn, static_cast<long double>(x)));
        const T libm = fn == MathFn::exp     ? std::exp(x)
                       : fn == MathFn::log   ? std::log(x)
                       : fn == MathFn::log1p ? std::log1p(x)
                       : fn == MathFn::expm1 ? std::expm1(x)
                       : fn == MathFn::sin   ? std::sin(x)
                       : fn == MathFn::cos   ? std::cos(x)
                       : fn == MathFn::tan   ? std::tan(x)
                       : fn == MathFn::tanh  ? std::tanh(x)
                                             : std::erf(x);
        if (std::isfinite(x) && x != 0 && std::isfinite(want) && want != 0 &&
            std::fabs(want) != 1) {
          EXPECT_LE(ulp_error(got[i], reference(fn, static_cast<long double>(x))), kMaxUlp)
              << math::fn_name(fn) << "(" << x << ") on " << math::isa_name(isa);
          EXPECT_EQ(std::signbit(got[i]), std::signbit(libm))
              << math::fn_name(fn) << "(" << x << ") on " << math::isa_name(isa);
          continue;
        }
        EXPECT_TRUE(identical(got[i], libm))
            << math::fn_name(fn) << "(" << std::hexfloat << x << ") on " << math::isa_name(isa)
            << ": got " << got[i] << ", libm " << libm;
      }
    }
  }
}

TEST(VectorMath, SpecialValuesFloat32) { check_special_values<float>(); }
TEST(VectorMath, SpecialValuesFloat64) { check_special_values<double>(); }

// pow's C99 special cases: pow(x, +-0) = 1 even for NaN x, pow(1, y) = 1 even for NaN y,
// pow(-1, +-inf) = 1, pow(+-0, negative odd integer) = +-inf, signs of odd integer powers, ...
// Exact wherever x or y is special or the result is 0, +-1, +-inf or NaN.
template <typename T>
void check_pow_special_values() {
  using L = std::numeric_limits<T>;
  const std::vector<T> v = {T{0},
                            -T{0},
                            T{1},
                            T{-1},
                            T{2},
                            T{-2},
                            T{0.5},
                            T{-0.5},
                            T{3},
                            T{-3},
                            L::infinity(),
                            -L::infinity(),
                            L::quiet_NaN(),
                            L::denorm_min(),
                            -L::denorm_min(),
                            L::max(),
                            -L::max(),
                            T{1.5},
                            T{-1.5}};
  std::vector<T> xs, ys;
  for (T x : v)
    for (T y : v) {
      xs.push_back(x);
      ys.push_back(y);
    }
  for (Isa isa : supported_isas()) {
    std::vector<T> got(xs.size());
    math::apply_pow(isa, xs.data(), ys.data(), got.data(), static_cast<int64_t>(xs.size()));
    for (std::size_t i = 0; i < xs.size(); ++i) {
      const T libm = std::pow(xs[i], ys[i]);
      auto special = [](T t) { return !std::isfinite(t) || t == 0 || std::fabs(t) == 1; };
      if (special(xs[i]) || special(ys[i]) || special(libm))
        EXPECT_TRUE(identical(got[i], libm))
            << "pow(" << xs[i] << ", " << ys[i] << ") on " << math::isa_name(isa) << ": got "
            << got[i] << ", libm " << libm;
      else
        EXPECT_LE(ulp_error(got[i], ref<T>(MathFn::pow, xs[i], ys[i])), kMaxUlp)
            << "pow(" << xs[i] << ", " << ys[i] << ") on " << math::isa_name(isa);
    }
  }
}

TEST(VectorMath, PowSpecialValuesFloat32) { check_pow_special_values<float>(); }
TEST(VectorMath, PowSpecialValuesFloat64) { check_pow_special_values<double>(); }

// Every element gets the same algorithm wherever it lies: the tail of an array goes through a
// padded register, so an array computed at once equals its elements computed one by one (and
// results never depend on how threads split the array).
TEST(VectorMath, TailsMatchLoopBodies) {
  std::vector<float> x(1000);
  std::mt19937_64 gen(7);
  for (float& v : x) v = static_cast<float>(static_cast<double>(gen() >> 11) * 0x1p-53 * 20 - 10);
  for (Isa isa : supported_isas())
    for (MathFn fn : math::kMathFns) {
      if (fn == MathFn::pow) continue;
      std::vector<float> whole(x.size()), one(x.size());
      math::apply(isa, fn, x.data(), whole.data(), static_cast<int64_t>(x.size()));
      for (std::size_t i = 0; i < x.size(); ++i) math::apply(isa, fn, &x[i], &one[i], 1);
      for (std::size_t i = 0; i < x.size(); ++i)
        ASSERT_TRUE(identical(whole[i], one[i])) << math::fn_name(fn) << " " << x[i];
    }
}

// Kiln's own exp and tanh over the whole float range: the vector variant gives the bits of the
// scalar one, which compiled loops' tails compute (AVX-512's variant scales by vscalefps, the
// scalar by products, rounding once either way). Every 4099th bit pattern, and every float
// where exp's result is a denormal or rounds to 0.
TEST(VectorMath, OwnFunctionsScalarVariantsMatchTheVectorOnesOverTheFloatRange) {
  std::vector<float> x;
  for (uint64_t b = 0; b < (uint64_t{1} << 32); b += 4099)
    x.push_back(std::bit_cast<float>(static_cast<uint32_t>(b)));
  for (float v = -106.0f; v <= -86.0f; v = std::nextafter(v, 0.0f)) x.push_back(v);
  for (Isa isa : supported_isas())
    for (MathFn fn : {MathFn::exp, MathFn::tanh}) {
      const auto scalar = reinterpret_cast<float (*)(float)>(
          dlsym(RTLD_DEFAULT, math::math_functions(fn, float32, isa).scalar.symbol.c_str()));
      ASSERT_NE(scalar, nullptr);
      std::vector<float> vec(x.size());
      math::apply(isa, fn, x.data(), vec.data(), static_cast<int64_t>(x.size()));
      int64_t wrong = 0;
      for (std::size_t i = 0; i < x.size(); ++i)
        if (!identical(vec[i], scalar(x[i])) && wrong++ < 5)
          ADD_FAILURE() << math::fn_name(fn) << " on " << math::isa_name(isa) << " at "
                        << std::hexfloat << x[i] << ": " << vec[i] << " against " << scalar(x[i]);
      EXPECT_EQ(wrong, 0) << math::fn_name(fn) << " on " << math::isa_name(isa);
    }
}

// The exception: SLEEF's sin, cos and tan pick their argument reduction per vector (the exact,
// slower one when any lane is large), so an element's result can move by one ulp with its
// neighbours (DESIGN.md: why compiled and eager results of these agree within 2 ulps, not
// bit for bit). The move is never more than one ulp.
template <typename T>
void check_neighbour_dependence() {
  std::vector<T> x(4096);
  std::mt19937_64 gen(5);
  for (T& v : x) v = static_cast<T>(static_cast<double>(gen() >> 11) * 0x1p-53 * 200 - 100);
  std::vector<T> mixed = x;
  for (std::size_t i = 1; i < mixed.size(); i += 8) mixed[i] = static_cast<T>(1e30);
  for (Isa isa : supported_isas())
    for (MathFn fn : {MathFn::sin, MathFn::cos, MathFn::tan}) {
      std::vector<T> alone(x.size()), among(x.size());
      math::apply(isa, fn, x.data(), alone.data(), static_cast<int64_t>(x.size()));
      math::apply(isa, fn, mixed.data(), among.data(), static_cast<int64_t>(x.size()));
      for (std::size_t i = 0; i < x.size(); ++i) {
        if (i % 8 == 1) continue;
        const auto a = static_cast<int64_t>(std::bit_cast<Bits<T>>(alone[i]));
        const auto b = static_cast<int64_t>(std::bit_cast<Bits<T>>(among[i]));
        ASSERT_LE(std::abs(a - b), 1)
            << math::fn_name(fn) << " on " << math::isa_name(isa) << " at " << x[i];
      }
    }
}
TEST(VectorMath, TrigonometryMovesAtMostOneUlpWithItsNeighbours) {
  check_neighbour_dependence<float>();
  check_neighbour_dependence<double>();
}

void* address_of(const std::string& symbol) {
  for (const math::SymbolAddress& s : math::symbols())
    if (s.name == symbol) return s.address;
  return nullptr;
}

// The symbols the code generator will call exist in the process, and the scalar variant named
// for loop tails gives the vector variant's bits (same algorithm, same FMA contractions).
template <typename T>
void check_symbols() {
  const DType dtype = std::is_same_v<T, float> ? float32 : float64;
  std::vector<T> x(4096);
  std::mt19937_64 gen(11);
  for (T& v : x) v = static_cast<T>(static_cast<double>(gen() >> 11) * 0x1p-53 * 20 - 10);
  for (Isa isa : supported_isas())
    for (MathFn fn : math::kMathFns) {
      const math::MathFunctions f = math::math_functions(fn, dtype, isa);
      EXPECT_EQ(f.scalar.lanes, 1);
      EXPECT_EQ(f.vector.lanes, isa == Isa::scalar ? 1
                                : isa == Isa::sse4 ? 16 / static_cast<int>(sizeof(T))
                                : isa == Isa::avx2 ? 32 / static_cast<int>(sizeof(T))
                                                   : 64 / static_cast<int>(sizeof(T)));
      EXPECT_NE(dlsym(RTLD_DEFAULT, f.vector.symbol.c_str()), nullptr) << f.vector.symbol;
      void* scalar = dlsym(RTLD_DEFAULT, f.scalar.symbol.c_str());
      ASSERT_NE(scalar, nullptr) << f.scalar.symbol;
      // The addresses the JIT defines for them (Python loads Kiln out of the symbol table).
      EXPECT_EQ(address_of(f.vector.symbol), dlsym(RTLD_DEFAULT, f.vector.symbol.c_str()));
      EXPECT_EQ(address_of(f.scalar.symbol), scalar);
      if (fn == MathFn::pow) continue;
      std::vector<T> vec(x.size());
      math::apply(isa, fn, x.data(), vec.data(), static_cast<int64_t>(x.size()));
      const auto sf = reinterpret_cast<T (*)(T)>(scalar);
      for (std::size_t i = 0; i < x.size(); ++i)
        ASSERT_TRUE(identical(sf(x[i]), vec[i]))
            << f.scalar.symbol << " vs " << f.vector.symbol << " at " << x[i];
    }
}
TEST(VectorMath, SymbolsResolveAndTailsAgree) {
  check_symbols<float>();
  check_symbols<double>();
}

TEST(VectorMath, IsaSelection) {
  EXPECT_EQ(math::isa_from_env(std::nullopt, Isa::avx2), Isa::avx2);
  EXPECT_EQ(math::isa_from_env("", Isa::avx2), Isa::avx2);
  EXPECT_EQ(math::isa_from_env("sse4", Isa::avx512), Isa::sse4);
  EXPECT_EQ(math::isa_from_env("scalar", Isa::avx2), Isa::scalar);
  // A ceiling, never more than the CPU has.
  EXPECT_EQ(math::isa_from_env("avx512", Isa::avx2), Isa::avx2);
  testing::expect_error([] { math::isa_from_env("avx1024", Isa::avx2); }, "vector_math",
                        {"got 'avx1024'", "expected scalar, sse4, avx2 or avx512"});
  EXPECT_LE(math::host_isa(), math::detected_isa());
  if (math::detected_isa() < Isa::avx512) {
    float x = 1, y;
    testing::expect_error([&] { math::apply(Isa::avx512, MathFn::exp, &x, &y, 1); }, "vector_math",
                          {"not supported by this CPU"});
  }
  testing::expect_error([] { math::math_functions(MathFn::exp, float16, Isa::scalar); },
                        "vector_math", {"got f16", "expected f32 or f64"});
}

// Eager sigmoid (exp of -|x| through the table, then 1/(1+e) or e/(1+e)) against float64.
TEST(VectorMath, EagerSigmoidFloat32) {
  std::vector<float> x;
  for (int i = 0; i <= 2'000'000; ++i) x.push_back(static_cast<float>(-100.0 + i * 1e-4));
  const std::vector<float> got =
      sigmoid(tensor(x, {static_cast<int64_t>(x.size())})).to_vector<float>();
  double worst = 0;
  std::size_t at = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double want = 1.0 / (1.0 + std::exp(-static_cast<double>(x[i])));
    const double e = ulp_error(got[i], want);
    if (e > worst) worst = e, at = i;
  }
  std::cout << "eager sigmoid f32: max error " << worst << " ulp\n";
  EXPECT_LE(worst, kMaxUlp) << "at x = " << x[at];
}

// Every eager op on the table against its reference: contiguous, strided (a transposed view),
// and float16 (computed in float32, rounded once).
TEST(VectorMath, EagerKernels) {
  struct Case {
    const char* name;
    Tensor (*op)(const Tensor&, Loc);
    MathFn fn;
    double lo, hi;
  };
  const std::vector<Case> cases = {
      {"exp", &exp, MathFn::exp, -20, 20},        {"log", &log, MathFn::log, 1e-3, 50},
      {"log1p", &log1p, MathFn::log1p, -0.9, 50}, {"expm1", &expm1, MathFn::expm1, -5, 5},
      {"sin", &sin, MathFn::sin, -50, 50},        {"cos", &cos, MathFn::cos, -50, 50},
      {"tan", &tan, MathFn::tan, -1.5, 1.5},      {"tanh", &tanh, MathFn::tanh, -10, 10},
      {"erf", &erf, MathFn::erf, -4, 4}};
  for (const Case& c : cases) {
    const std::vector<double> xd = testing::random_values(300 * 70, 5, c.lo, c.hi);
    const Tensor x64 = tensor(xd, {300, 70});
    const Tensor x32 = astype(x64, float32);
    const Tensor t32 = transpose(x32, {1, 0});  // strided: gathered in chunks
    const std::vector<float> xs = x32.to_vector<float>();
    const std::vector<float> y32 = c.op(x32, Loc::current()).to_vector<float>();
    const std::vector<float> yt = c.op(t32, Loc::current()).to_vector<float>();
    const std::vector<double> y64 = c.op(x64, Loc::current()).to_vector<double>();
    const Tensor h = astype(x32, float16);
    const std::vector<float> yh = astype(c.op(h, Loc::current()), float32).to_vector<float>();
    const std::vector<float> hx = astype(h, float32).to_vector<float>();
    for (std::size_t i = 0; i < xs.size(); ++i) {
      ASSERT_LE(ulp_error(y32[i], ref<float>(c.fn, xs[i])), kMaxUlp) << c.name << " " << xs[i];
      ASSERT_LE(ulp_error(y64[i], ref<double>(c.fn, xd[i])), kMaxUlp) << c.name << " " << xd[i];
      const std::size_t r = i / 70, k = i % 70;
      ASSERT_TRUE(identical(yt[k * 300 + r], y32[i])) << c.name << " strided";
      // float16 has 11 significant bits: the float32 result rounded once.
      const float want_h = static_cast<float>(Half(static_cast<float>(ref<float>(c.fn, hx[i]))));
      if (std::isinf(want_h))
        ASSERT_EQ(yh[i], want_h) << c.name << " f16 " << hx[i];
      else
        ASSERT_LE(std::fabs(yh[i] - want_h), std::fabs(want_h) * 0x1p-10f + 0x1p-24f)
            << c.name << " f16 " << hx[i];
    }
  }
}

// Below exp's underflow threshold (about -103.97) every float32 result is +0, as libm's, rounded
// from the scaling or, where that would underflow (docs/DESIGN.md), made without it. Every float
// from -180 to -103 on every instruction set.
TEST(VectorMath, ExpOfEveryFloatBelowTheUnderflowThresholdIsZero) {
  std::vector<float> x;
  for (float v = -180.0f; v <= -103.0f; v = std::nextafter(v, 0.0f)) x.push_back(v);
  x.push_back(-INFINITY);
  std::vector<float> got(x.size());
  for (Isa isa : supported_isas()) {
    math::apply(isa, MathFn::exp, x.data(), got.data(), static_cast<int64_t>(x.size()));
    int64_t wrong = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      const float want = std::exp(x[i]);
      if (want == 0.0f && !identical(got[i], 0.0f) && wrong++ < 5)
        ADD_FAILURE() << "exp(" << std::hexfloat << x[i] << ") on " << math::isa_name(isa)
                      << ": got " << got[i] << ", expected +0";
      if (want != 0.0f) {
        EXPECT_LE(ulp_error(got[i], reference(MathFn::exp, x[i])), kMaxUlp);
      }
    }
    EXPECT_EQ(wrong, 0) << math::isa_name(isa);
  }
}

// The eager kernels keep the special values too (through the tensors' own dtype paths).
TEST(VectorMath, EagerSpecialValues) {
  const float inf = INFINITY;
  const Tensor x = tensor({-0.0f, 0.0f, inf, -inf, NAN, -1.0f});
  auto bits = [](const Tensor& t) { return t.to_vector<float>(); };
  auto expect = [&](const Tensor& got, const std::vector<float>& want, const char* what) {
    const std::vector<float> g = bits(got);
    for (std::size_t i = 0; i < want.size(); ++i)
      EXPECT_TRUE(identical(g[i], want[i])) << what << "[" << i << "]: got " << g[i];
  };
  // numpy (float32): np.exp, np.log, ... of [-0., 0., inf, -inf, nan, -1.]
  expect(exp(x), {1, 1, inf, 0, NAN, std::exp(-1.0f)}, "exp");
  expect(log(x), {-inf, -inf, inf, NAN, NAN, NAN}, "log");
  expect(log1p(x), {-0.0f, 0, inf, NAN, NAN, -inf}, "log1p");
  expect(expm1(x), {-0.0f, 0, inf, -1, NAN, std::expm1(-1.0f)}, "expm1");
  expect(tanh(x), {-0.0f, 0, 1, -1, NAN, std::tanh(-1.0f)}, "tanh");
  expect(sin(slice(x, {Slice{0, 2}})), {-0.0f, 0}, "sin");
  expect(erf(x), {-0.0f, 0, 1, -1, NAN, std::erf(-1.0f)}, "erf");
  expect(sigmoid(x), {0.5f, 0.5f, 1, 0, NAN, 1 / (1 + std::exp(1.0f))}, "sigmoid");
  // pow(x, 0) = 1 even for NaN x, pow(1, y) = 1 even for NaN y, broadcast operands.
  expect(pow(x, 0.0f), {1, 1, 1, 1, 1, 1}, "pow(x, 0)");
  expect(pow(tensor(1.0f), x), {1, 1, 1, 1, 1, 1}, "pow(1, y)");
  expect(pow(x, 3.0f), {-0.0f, 0, inf, -inf, NAN, -1}, "pow(x, 3)");
}

}  // namespace
}  // namespace kiln
