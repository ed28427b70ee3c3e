// Elementwise math (include/kiln/math_ops.h, src/ops/math.cpp): values against numpy / scipy
// (tests/reference/math_ref.py, generated at build time) in float64, float32 and the integer
// dtypes, with edge values (+-0, +-inf, NaN, poles, out-of-range shift counts); half precision;
// errors; compiled vs eager; derivatives at the extremes; vmap vs a loop; empty and 0-d
// inputs. The registry walks (tests/primitive_samples.cpp) check every rule on random inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "kiln/kiln.h"
#include "testing.h"

using namespace kiln;

namespace {

using kiln::testing::expect_error;
using D = std::vector<double>;
using Unary = std::function<Tensor(const Tensor&)>;
using Binary = std::function<Tensor(const Tensor&, const Tensor&)>;

const io::TensorFile& ref() {
  static const io::TensorFile file = kiln::testing::reference("math");
  return file;
}
Tensor at(const std::string& name) { return kiln::testing::at(ref(), name); }

// Tolerances relative to the reference, in units of the dtype's epsilon, with an absolute
// floor for results near a zero of the function (where relative error means little).
struct Tol {
  double eps_f64 = 4;
  double eps_f32 = 4;
  double abs_f64 = 0;
  double abs_f32 = 0;
};

// NaN matches NaN, infinities and zeros match exactly (zeros with their sign), other values
// within the tolerance.
void expect_matches(const Tensor& got_t, const Tensor& want_t, double rel, double abs_floor,
                    const std::string& what) {
  ASSERT_EQ(got_t.shape(), want_t.shape()) << what;
  const D got = got_t.to_vector<double>(), want = want_t.to_vector<double>();
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double g = got[i], w = want[i];
    const std::string where = what + " [" + std::to_string(i) + "]";
    if (std::isnan(w)) {
      EXPECT_TRUE(std::isnan(g)) << where << ": got " << g << ", want NaN";
    } else if (std::isinf(w) || w == 0) {
      EXPECT_EQ(g, w) << where;
      if (w == 0) {
        EXPECT_EQ(std::signbit(g), std::signbit(w)) << where << " (sign of zero)";
      }
    } else {
      EXPECT_NEAR(g, w, rel * std::fabs(w) + abs_floor) << where;
    }
  }
}

void check_unary(const std::string& name, const Unary& f, Tol tol = {}) {
  SCOPED_TRACE(name);
  const double e64 = std::numeric_limits<double>::epsilon();
  const double e32 = std::numeric_limits<float>::epsilon();
  expect_matches(f(at(name + "/x_f64")), at(name + "/y_f64"), tol.eps_f64 * e64, tol.abs_f64,
                 name + " f64");
  const Tensor y32 = f(at(name + "/x_f32"));
  EXPECT_EQ(y32.dtype(), at(name + "/y_f32").dtype()) << name;
  expect_matches(y32, at(name + "/y_f32"), tol.eps_f32 * e32, tol.abs_f32, name + " f32");
}
void check_binary(const std::string& name, const Binary& f, Tol tol = {}) {
  SCOPED_TRACE(name);
  const double e64 = std::numeric_limits<double>::epsilon();
  const double e32 = std::numeric_limits<float>::epsilon();
  expect_matches(f(at(name + "/a_f64"), at(name + "/b_f64")), at(name + "/y_f64"),
                 tol.eps_f64 * e64, tol.abs_f64, name + " f64");
  expect_matches(f(at(name + "/a_f32"), at(name + "/b_f32")), at(name + "/y_f32"),
                 tol.eps_f32 * e32, tol.abs_f32, name + " f32");
}
void expect_same(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.type(), want.type()) << what;
  EXPECT_EQ(got.to_vector<int64_t>(), want.to_vector<int64_t>()) << what;
}

// ---- values vs numpy / scipy ----------------------------------------------------------------

TEST(MathValues, UnaryMatchNumpyAndScipy) {
  // libm's functions: within a few ulps of the correctly rounded result.
  check_unary("trunc", [](const Tensor& x) { return trunc(x); }, {0, 0});
  check_unary("log2", [](const Tensor& x) { return log2(x); });
  check_unary("log10", [](const Tensor& x) { return log10(x); });
  check_unary("exp2", [](const Tensor& x) { return exp2(x); });
  check_unary("sinh", [](const Tensor& x) { return sinh(x); });
  check_unary("cosh", [](const Tensor& x) { return cosh(x); });
  check_unary("asin", [](const Tensor& x) { return asin(x); });
  check_unary("acos", [](const Tensor& x) { return acos(x); });
  check_unary("atan", [](const Tensor& x) { return atan(x); });
  check_unary("asinh", [](const Tensor& x) { return asinh(x); });
  check_unary("acosh", [](const Tensor& x) { return acosh(x); });
  check_unary("atanh", [](const Tensor& x) { return atanh(x); });
  check_unary("erfc", [](const Tensor& x) { return erfc(x); });
  check_unary("softplus", [](const Tensor& x) { return softplus(x); });
  check_unary("log_sigmoid", [](const Tensor& x) { return log_sigmoid(x); });
  // Kiln's own special functions (double precision throughout): near their zeros (lgamma at
  // 1 and 2, digamma at 1.4616...) the floor covers the absolute error of the series.
  check_unary("erfinv", [](const Tensor& x) { return erfinv(x); }, {16, 4});
  check_unary("lgamma", [](const Tensor& x) { return lgamma(x); }, {16, 4, 1e-15, 0});
  check_unary("digamma", [](const Tensor& x) { return digamma(x); }, {64, 4, 1e-14, 0});
  check_unary("polygamma1", [](const Tensor& x) { return polygamma(1, x); }, {64, 4});
  check_unary("polygamma2", [](const Tensor& x) { return polygamma(2, x); }, {64, 4});
  check_unary("nan_to_num", [](const Tensor& x) { return nan_to_num(x); }, {0, 0});
}

TEST(MathValues, ClassificationMatchesNumpy) {
  for (const char* dt : {"f64", "f32"}) {
    expect_same(isinf(at(std::string("isinf/x_") + dt)), at(std::string("isinf/y_") + dt), dt);
    expect_same(isfinite(at(std::string("isfinite/x_") + dt)), at(std::string("isfinite/y_") + dt),
                dt);
  }
  // Integers are finite.
  const Tensor i = tensor({1, -2, 3});
  EXPECT_EQ(isinf(i).to_vector<bool>(), std::vector<bool>(3, false));
  EXPECT_EQ(isfinite(i).to_vector<bool>(), std::vector<bool>(3, true));
}

TEST(MathValues, BinaryMatchNumpy) {
  check_binary("remainder", [](const Tensor& a, const Tensor& b) { return remainder(a, b); });
  check_binary("fmod", [](const Tensor& a, const Tensor& b) { return fmod(a, b); }, {0, 0});
  check_binary("floor_divide", [](const Tensor& a, const Tensor& b) { return floor_divide(a, b); },
               {0, 0});
  check_binary("atan2", [](const Tensor& a, const Tensor& b) { return atan2(a, b); });
  check_binary("hypot", [](const Tensor& a, const Tensor& b) { return hypot(a, b); });
  check_binary("copysign", [](const Tensor& a, const Tensor& b) { return copysign(a, b); }, {0, 0});
  check_binary("logaddexp", [](const Tensor& a, const Tensor& b) { return logaddexp(a, b); });
}

TEST(MathValues, IntegerDivisionMatchesNumpy) {
  const std::map<std::string, Binary> ops = {
      {"remainder", [](const Tensor& a, const Tensor& b) { return remainder(a, b); }},
      {"fmod", [](const Tensor& a, const Tensor& b) { return fmod(a, b); }},
      {"floor_divide", [](const Tensor& a, const Tensor& b) { return floor_divide(a, b); }}};
  for (const auto& [name, f] : ops)
    for (const char* dt : {"i32", "i64", "u8"})
      for (const char* pre : {"", "small_"}) {
        const std::string n = name + "/" + pre;
        expect_same(f(at(n + "a_" + dt), at(n + "b_" + dt)), at(n + "y_" + dt), n + dt);
      }
}

TEST(MathValues, BitwiseMatchNumpy) {
  const std::map<std::string, Binary> ops = {
      {"bitwise_and", [](const Tensor& a, const Tensor& b) { return bitwise_and(a, b); }},
      {"bitwise_or", [](const Tensor& a, const Tensor& b) { return bitwise_or(a, b); }},
      {"bitwise_xor", [](const Tensor& a, const Tensor& b) { return bitwise_xor(a, b); }},
      {"left_shift", [](const Tensor& a, const Tensor& b) { return left_shift(a, b); }},
      {"right_shift", [](const Tensor& a, const Tensor& b) { return right_shift(a, b); }}};
  for (const auto& [name, f] : ops)
    for (const char* dt : {"i32", "i64", "u8"}) {
      const std::string n = name + "/";
      expect_same(f(at(n + "a_" + dt), at(n + "b_" + dt)), at(n + "y_" + dt), n + dt);
    }
  for (const char* dt : {"i32", "i64", "u8"})
    expect_same(bitwise_not(at(std::string("bitwise_not/x_") + dt)),
                at(std::string("bitwise_not/y_") + dt), dt);
  // bool: the logical operations.
  const Tensor a = at("bool/a"), b = at("bool/b");
  expect_same(bitwise_and(a, b), at("bitwise_and/y_bool"), "and bool");
  expect_same(bitwise_or(a, b), at("bitwise_or/y_bool"), "or bool");
  expect_same(bitwise_xor(a, b), at("bitwise_xor/y_bool"), "xor bool");
  expect_same(bitwise_not(a), at("bitwise_not/y_bool"), "not bool");
}

// ---- edge values and conventions --------------------------------------------------------------

TEST(MathEdges, AbsClearsTheSignOfZero) {
  for (DType d : {float16, bfloat16, float32, float64}) {
    const D got = abs(astype(tensor({-0.0, 0.0, -1.5}), d)).to_vector<double>();
    EXPECT_FALSE(std::signbit(got[0])) << dtype_name(d);
    EXPECT_FALSE(std::signbit(got[1])) << dtype_name(d);
    EXPECT_EQ(got[2], 1.5) << dtype_name(d);
  }
}

TEST(MathEdges, SignConventionsOfRemainders) {
  // Python: 7.5 % -2 == -0.5 and -7.5 % 2 == 0.5; C: fmod(-7.5, 2) == -1.5.
  EXPECT_EQ(remainder(tensor({7.5, -7.5}), tensor({-2.0, 2.0})).to_vector<double>(),
            (D{-0.5, 0.5}));
  EXPECT_EQ(fmod(tensor({7.5, -7.5}), tensor({-2.0, 2.0})).to_vector<double>(), (D{1.5, -1.5}));
  EXPECT_EQ(floor_divide(tensor({7.5, -7.5}), tensor({-2.0, 2.0})).to_vector<double>(),
            (D{-4.0, -4.0}));
  // Integers: the same conventions, and MIN / -1 wraps to MIN (remainder 0) instead of trapping.
  const int32_t lo = std::numeric_limits<int32_t>::min();
  EXPECT_EQ(floor_divide(tensor({-7, lo}), tensor({2, -1})).to_vector<int32_t>(),
            (std::vector<int32_t>{-4, lo}));
  EXPECT_EQ(remainder(tensor({-7, lo}), tensor({2, -1})).to_vector<int32_t>(),
            (std::vector<int32_t>{1, 0}));
  EXPECT_EQ(fmod(tensor({-7, lo}), tensor({2, -1})).to_vector<int32_t>(),
            (std::vector<int32_t>{-1, 0}));
}

TEST(MathEdges, NanToNumOptionsAndDtypes) {
  const double inf = std::numeric_limits<double>::infinity();
  const Tensor x = tensor(D{std::nan(""), inf, -inf, 2.0});
  EXPECT_EQ(nan_to_num(x, {.nan = -1.0, .posinf = 10.0, .neginf = -10.0}).to_vector<double>(),
            (D{-1.0, 10.0, -10.0, 2.0}));
  const D f16 = nan_to_num(astype(x, float16)).to_vector<double>();
  EXPECT_EQ(f16, (D{0.0, 65504.0, -65504.0, 2.0}));
  const Tensor i = tensor({1, 2});
  EXPECT_EQ(nan_to_num(i).to_vector<int32_t>(), (std::vector<int32_t>{1, 2}));
}

TEST(MathEdges, HalfPrecisionComputesInFloat32) {
  const Tensor x = tensor({-2.0, -0.5, 0.25, 1.0, 3.0});
  const std::vector<std::pair<std::string, Unary>> ops = {
      {"sinh", [](const Tensor& t) { return sinh(t); }},
      {"atan", [](const Tensor& t) { return atan(t); }},
      {"exp2", [](const Tensor& t) { return exp2(t); }},
      {"lgamma", [](const Tensor& t) { return lgamma(t); }},
      {"softplus", [](const Tensor& t) { return softplus(t); }}};
  for (const auto& [name, f] : ops)
    for (DType d : {float16, bfloat16}) {
      // The float32 result of the same (rounded) inputs, rounded once to d.
      const Tensor xd = astype(x, d);
      const Tensor got = f(xd);
      EXPECT_EQ(got.dtype(), d) << name;
      const Tensor want = astype(f(astype(xd, float32)), d);
      EXPECT_EQ(got.to_vector<double>(), want.to_vector<double>()) << name << " " << dtype_name(d);
    }
}

TEST(MathEdges, EmptyAndZeroDimensional) {
  const Tensor empty_x = zeros({0, 3}, float32);
  EXPECT_EQ(sinh(empty_x).shape(), (Shape{0, 3}));
  EXPECT_EQ(logaddexp(empty_x, empty_x).shape(), (Shape{0, 3}));
  EXPECT_EQ(bitwise_and(zeros({0}, int32), zeros({0}, int32)).shape(), (Shape{0}));
  const Tensor s = full(Shape{}, 0.5, float64);
  EXPECT_EQ(atanh(s).shape(), Shape{});
  EXPECT_DOUBLE_EQ(atanh(s).item<double>(), std::atanh(0.5));
  EXPECT_DOUBLE_EQ(hypot(s, full(Shape{}, 1.2, float64)).item<double>(), 1.3);
}

TEST(MathEdges, PromotionOfIntegerInputs) {
  // Float-only ops compute integers in float32; remainders and shifts stay integer.
  EXPECT_EQ(log2(tensor({1, 8})).dtype(), float32);
  EXPECT_EQ(atan2(tensor({1}), tensor({1})).dtype(), float32);
  EXPECT_EQ(remainder(tensor({7}), tensor({3})).dtype(), int32);
  EXPECT_EQ(trunc(tensor({7})).dtype(), int32);
  EXPECT_EQ(left_shift(tensor({true}), tensor({true})).to_vector<int32_t>(),
            (std::vector<int32_t>{2}));
}

// ---- errors -----------------------------------------------------------------------------------

TEST(MathErrors, BadInputsAreErrors) {
  for (const auto& [name, f] : std::vector<std::pair<std::string, Binary>>{
           {"remainder", [](const Tensor&a, const Tensor&b) { return remainder(a, b); }},
           {"fmod", [](const Tensor&a, const Tensor&b) { return fmod(a, b); }},
           {"floor_divide", [](const Tensor&a, const Tensor&b) { return floor_divide(a, b); }}})
    expect_error(
        [&] {
          f(tensor({1, 2}), tensor({1, 0}));
        },
        name, {"integer division by zero", "i32[2]"});
  // Compiled code calls the same kernel, which raises the same Error.
  auto compiled = jit([](const Tensor& a, const Tensor& b) { return floor_divide(a, b) + a; });
  expect_error(
      [&] {
        compiled(tensor({1, 2}), tensor({1, 0}));
      },
      "floor_divide", {"integer division by zero"});
  expect_error([] { bitwise_and(tensor({1.0}), tensor({1.0})); }, "bitwise_and",
               {"f64[1]", "an integer or bool dtype"});
  expect_error([] { bitwise_not(tensor({1.0f})); }, "bitwise_not", {"f32[1]"});
  expect_error([] { left_shift(tensor({1.0}), tensor({1.0})); }, "left_shift",
               {"f64[1]", "an integer dtype"});
  expect_error([] { polygamma(-1, tensor({1.0})); }, "polygamma", {"n = -1", "n >= 0"});
  expect_error([] { atan2(tensor({1.0, 2.0}), tensor({1.0, 2.0, 3.0})); }, "atan2", {"[2]", "[3]"});
}

// ---- transformations --------------------------------------------------------------------------

// Every op of the group in one function: the compiled version calls the same kernels.
Tensor everything(const Tensor& x, const Tensor& y) {
  const Tensor u = tanh(x) * 0.9;  // in (-1, 1)
  Tensor r = trunc(x) + log2(abs(x) + 1.0) + log10(abs(y) + 1.0) + exp2(u) + sinh(u) + cosh(u) +
             asin(u) + acos(u) + atan(x) + asinh(x) + acosh(abs(x) + 1.0) + atanh(u) + erfinv(u) +
             lgamma(abs(x) + 0.5) + digamma(abs(x) + 0.5) + polygamma(2, abs(y) + 1.0);
  r = r + remainder(x, y) + fmod(x, y) + floor_divide(x, y) + atan2(x, y) + hypot(x, y) +
      copysign(x, y) + logaddexp(x, y) + softplus(x) + log_sigmoid(y) + nan_to_num(log(x)) +
      astype(isinf(x / 0.0), float64) + astype(isfinite(x), float64);
  const Tensor i = astype(x * 10.0, int32), j = astype(abs(y) * 3.0, int32);
  const Tensor bits = bitwise_xor(bitwise_and(i, j), bitwise_or(i, bitwise_not(j))) +
                      left_shift(i, j) + right_shift(i, j);
  return r + astype(bits, float64);
}

TEST(MathTransforms, CompiledMatchesEager) {
  const Tensor x = tensor(kiln::testing::random_values(40, 1, -3.0, 3.0), Shape{5, 8});
  const Tensor y = tensor(kiln::testing::random_values(40, 2, 0.5, 2.0), Shape{5, 8});
  const Tensor eager = everything(x, y);
  const Tensor compiled = jit(everything)(x, y);
  EXPECT_EQ(compiled.to_vector<double>(), eager.to_vector<double>());
}

TEST(MathTransforms, SoftplusAndLogSigmoidDerivativesAtExtremes) {
  const D xs = {-1000.0, -40.0, -1.0, 0.0, 1.0, 40.0, 1000.0};
  const Tensor x = tensor(xs);
  const D dsp = grad([](const Tensor& t) { return sum(softplus(t)); })(x).to_vector<double>();
  const D dls = grad([](const Tensor& t) { return sum(log_sigmoid(t)); })(x).to_vector<double>();
  for (std::size_t k = 0; k < xs.size(); ++k) {
    const double s = 1.0 / (1.0 + std::exp(-xs[k]));  // sigmoid, 0 or 1 at the extremes
    EXPECT_NEAR(dsp[k], s, 1e-15) << xs[k];
    EXPECT_NEAR(dls[k], 1.0 - s, 1e-15) << xs[k];
  }
  // softplus''(0) = sigmoid'(0) = 1/4 (the kink-free form).
  auto d2 = grad([](const Tensor& t) {
    return sum(grad([](const Tensor& u) { return sum(softplus(u)); })(t));
  });
  EXPECT_DOUBLE_EQ(d2(tensor({0.0})).to_vector<double>()[0], 0.25);
}

TEST(MathTransforms, LogaddexpDerivativesWithInfinities) {
  auto g =
      grad([](const Tensor& a, const Tensor& b) { return sum(logaddexp(a, b)); }, argnums<0, 1>);
  const double inf = INFINITY;
  const auto [da, db] = g(tensor({-inf, inf, -inf, 1.0}), tensor({-inf, inf, 1.0, 1.0}));
  EXPECT_EQ(da.to_vector<double>(), (D{0.5, 0.5, 0.0, 0.5}));
  EXPECT_EQ(db.to_vector<double>(), (D{0.5, 0.5, 1.0, 0.5}));
}

TEST(MathTransforms, RoundingAndBitwiseOpsHaveZeroDerivative) {
  const Tensor x = tensor({-2.5, -0.5, 0.5, 2.5});
  const D g = grad([](const Tensor& t) {
                return sum(trunc(t) + floor_divide(t, full(Shape{}, 2.0, float64)) +
                           astype(isinf(t), float64));
              })(x)
                  .to_vector<double>();
  EXPECT_EQ(g, D(4, 0.0));
}

TEST(MathTransforms, VmapMatchesALoop) {
  const Tensor x = tensor(kiln::testing::random_values(24, 3, -3.0, 3.0), Shape{3, 8});
  const Tensor y = tensor(kiln::testing::random_values(24, 4, 0.5, 2.0), Shape{3, 8});
  const Tensor batched = vmap(everything)(x, y);
  for (int64_t k = 0; k < 3; ++k) {
    const Tensor one = everything(index(x, k), index(y, k));
    EXPECT_EQ(index(batched, k).to_vector<double>(), one.to_vector<double>()) << k;
  }
}

}  // namespace
