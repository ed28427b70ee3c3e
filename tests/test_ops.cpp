// Eager operations: elementwise unary and binary ops, comparisons and logic, where, clip,
// astype, reductions, softmax, shape ops and the errors users see. Expected values are
// hand-computed or produced by numpy 1.24 (the generating expression is given next to each
// table); none come from the code under test.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "kiln/kiln.h"
#include "testing.h"

using namespace kiln;

namespace {

using kiln::testing::expect_allclose;

using kiln::testing::expect_error;

using D = std::vector<double>;
using I64 = std::vector<int64_t>;
using B = std::vector<bool>;

const DType kFloats[] = {float16, bfloat16, float32, float64};
const DType kNumeric[] = {uint8, uint32, int32, int64, float16, bfloat16, float32, float64};
const DType kAll[] = {bool_, uint8, uint32, int32, int64, float16, bfloat16, float32, float64};

// Relative tolerance that a few roundings in `d` can explain.
double rtol(DType d) {
  switch (d) {
    case float64:
      return 1e-12;
    case float32:
      return 3e-6;
    case float16:
      return 2e-3;
    case bfloat16:
      return 1.6e-2;
    default:
      return 0;
  }
}
// Values that a few roundings in t's dtype explain; NaN where the reference has NaN.
void expect_rounded(const Tensor& t, const D& want, const std::string& what,
                    std::source_location at = std::source_location::current()) {
  const DType d = t.dtype();
  expect_allclose(t, want, {.rtol = rtol(d), .atol = rtol(d) * 1e-2, .equal_nan = true}, what, at);
}

// Exact comparison through double (every value used here is exact in every dtype).
void expect_values(const Tensor& t, const D& want, const std::string& what = "") {
  EXPECT_EQ(t.to_vector<double>(), want) << what << " dtype " << t.dtype();
}

Tensor f64(const D& v) { return tensor(v); }
Tensor as(DType d, const D& v, const Shape& s) { return astype(tensor(v, s), d); }
Tensor as(DType d, const D& v) { return astype(tensor(v), d); }

// ---- unary ---------------------------------------------------------------------------

using UnaryFn = Tensor (*)(const Tensor&);
struct UnaryCase {
  const char* name;
  bool positive;  // uses the positive inputs
  D want;
};
UnaryFn unary_fn(const std::string& n) {
  if (n == "neg") return [](const Tensor& x) { return neg(x); };
  if (n == "abs") return [](const Tensor& x) { return abs(x); };
  if (n == "sign") return [](const Tensor& x) { return sign(x); };
  if (n == "exp") return [](const Tensor& x) { return exp(x); };
  if (n == "expm1") return [](const Tensor& x) { return expm1(x); };
  if (n == "sin") return [](const Tensor& x) { return sin(x); };
  if (n == "cos") return [](const Tensor& x) { return cos(x); };
  if (n == "tan") return [](const Tensor& x) { return tan(x); };
  if (n == "tanh") return [](const Tensor& x) { return tanh(x); };
  if (n == "sigmoid") return [](const Tensor& x) { return sigmoid(x); };
  if (n == "erf") return [](const Tensor& x) { return erf(x); };
  if (n == "floor") return [](const Tensor& x) { return floor(x); };
  if (n == "ceil") return [](const Tensor& x) { return ceil(x); };
  if (n == "square") return [](const Tensor& x) { return square(x); };
  if (n == "log") return [](const Tensor& x) { return log(x); };
  if (n == "log1p") return [](const Tensor& x) { return log1p(x); };
  if (n == "sqrt") return [](const Tensor& x) { return sqrt(x); };
  if (n == "rsqrt") return [](const Tensor& x) { return rsqrt(x); };
  return nullptr;
}

// Inputs are exact in every float dtype (bf16 has 8 significant bits).
const D kUnaryX = {-2.5, -1.0, -0.375, 0.0, 0.4375, 1.0, 2.75, 6.0};
const D kUnaryP = {0.015625, 0.3125, 1.0, 2.5, 10.0, 96.0};
// numpy: f(np.array(kUnaryX)) or f(np.array(kUnaryP)) in float64, with sigmoid = 1/(1+exp(-x)),
// rsqrt = 1/sqrt(x) and erf = math.erf elementwise.
const UnaryCase kUnary[] = {
    {"neg", false, {2.5, 1.0, 0.375, -0.0, -0.4375, -1.0, -2.75, -6.0}},
    {"abs", false, {2.5, 1.0, 0.375, 0.0, 0.4375, 1.0, 2.75, 6.0}},
    {"sign", false, {-1.0, -1.0, -1.0, 0.0, 1.0, 1.0, 1.0, 1.0}},
    {"exp",
     false,
     {0.0820849986238988, 0.3678794411714424, 0.6872892787909721, 1.0, 1.5488302986341331,
      2.718281828459045, 15.642631884188173, 403.4287934927351}},
    {"expm1",
     false,
     {-0.9179150013761012, -0.6321205588285577, -0.3127107212090278, 0.0, 0.5488302986341331,
      1.7182818284590453, 14.642631884188171, 402.4287934927351}},
    {"sin",
     false,
     {-0.5984721441039564, -0.8414709848078965, -0.36627252908604757, 0.0, 0.42367625720393803,
      0.8414709848078965, 0.3816609920523317, -0.2794154981989259}},
    {"cos",
     false,
     {-0.8011436155469338, 0.5403023058681397, 0.9305076219123142, 1.0, 0.9058136834259363,
      0.5403023058681397, -0.9243023786324635, 0.9601702866503661}},
    {"tan",
     false,
     {0.7470222972386602, -1.557407724654902, -0.39362657592563277, 0.0, 0.4677300254523918,
      1.557407724654902, -0.4129178944849325, -0.29100619138474915}},
    {"tanh",
     false,
     {-0.9866142981514303, -0.7615941559557649, -0.35835739835078595, 0.0, 0.41157005567402244,
      0.7615941559557649, 0.9918597245682078, 0.9999877116507956}},
    {"sigmoid",
     false,
     {0.07585818002124355, 0.2689414213699951, 0.40733340004593016, 0.5, 0.6076631698328917,
      0.7310585786300049, 0.9399133498259924, 0.9975273768433653}},
    {"erf",
     false,
     {-0.999593047982555, -0.8427007929497149, -0.4041169094348223, 0.0, 0.463898135749933,
      0.8427007929497149, 0.9998993780778803, 1.0}},
    {"floor", false, {-3.0, -1.0, -1.0, 0.0, 0.0, 1.0, 2.0, 6.0}},
    {"ceil", false, {-2.0, -1.0, -0.0, 0.0, 1.0, 1.0, 3.0, 6.0}},
    {"square", false, {6.25, 1.0, 0.140625, 0.0, 0.19140625, 1.0, 7.5625, 36.0}},
    {"log",
     true,
     {-4.1588830833596715, -1.1631508098056809, 0.0, 0.916290731874155, 2.3025850929940455,
      4.564348191467836}},
    {"log1p",
     true,
     {0.015504186535965254, 0.27193371548364176, 0.6931471805599453, 1.252762968495368,
      2.3978952727983707, 4.574710978503383}},
    {"sqrt",
     true,
     {0.125, 0.5590169943749475, 1.0, 1.5811388300841898, 3.1622776601683795, 9.797958971132712}},
    {"rsqrt",
     true,
     {8.0, 1.7888543819998317, 1.0, 0.6324555320336759, 0.31622776601683794, 0.10206207261596577}},
};

// Large contiguous operands are one row after coalescing; the row is cut into pieces for the
// threads, and select runs as bit blends. Both checked against plain loops, with sizes that
// do not divide evenly and NaN/inf/-0 kept bit for bit by where.
TEST(Elementwise, LargeContiguousOperandsMatchALoop) {
  const int64_t n = (1 << 20) + 37;
  const Tensor x = random::normal(random::key(1), {n});
  const Tensor y = random::normal(random::key(2), {n});
  const std::vector<float> xv = x.to_vector<float>(), yv = y.to_vector<float>();
  const std::vector<float> sum_v = (x + y).to_vector<float>();
  const std::vector<float> relu_v = where(x > 0.0, x, scalar_like(x, 0.0)).to_vector<float>();
  const std::vector<float> sel_v = where(x > y, x, y).to_vector<float>();
  for (int64_t i = 0; i < n; ++i) {
    const auto k = static_cast<std::size_t>(i);
    ASSERT_EQ(sum_v[k], xv[k] + yv[k]) << i;
    ASSERT_EQ(relu_v[k], xv[k] > 0 ? xv[k] : 0.0f) << i;
    ASSERT_EQ(sel_v[k], xv[k] > yv[k] ? xv[k] : yv[k]) << i;
  }
  const Tensor special = tensor({NAN, INFINITY, -0.0f, 1.5f});
  const Tensor picked =
      where(tensor({true, true, true, false}), special, tensor({0.f, 0.f, 0.f, 2.f}));
  const std::vector<float> p = picked.to_vector<float>();
  EXPECT_TRUE(std::isnan(p[0]));
  EXPECT_EQ(p[1], INFINITY);
  EXPECT_TRUE(std::signbit(p[2]));
  EXPECT_EQ(p[3], 2.f);
  const std::vector<double> d =
      where(tensor({false, true}), tensor({1.0, 2.0}), tensor({3.0, 4.0})).to_vector<double>();
  EXPECT_EQ(d, (std::vector<double>{3.0, 2.0}));
}

TEST(Unary, EveryOpEveryFloatDtype) {
  for (const UnaryCase& c : kUnary) {
    const UnaryFn fn = unary_fn(c.name);
    ASSERT_NE(fn, nullptr) << c.name;
    for (DType d : kFloats) {
      const Tensor x = as(d, c.positive ? kUnaryP : kUnaryX);
      const Tensor y = fn(x);
      EXPECT_EQ(y.dtype(), d) << c.name;
      EXPECT_EQ(y.shape(), x.shape()) << c.name;
      expect_rounded(y, c.want, std::string(c.name) + " " + std::string(dtype_name(d)));
    }
  }
}

TEST(Unary, NonContiguousAndBroadcastInputs) {
  // 2x4 matrix of kUnaryX, transposed: elements in order x[0], x[4], x[1], x[5], ...
  const Tensor m = transpose(reshape(f64(kUnaryX), Shape{2, 4}));
  for (const UnaryCase& c : kUnary) {
    if (c.positive) continue;
    const Tensor y = unary_fn(c.name)(m);
    EXPECT_EQ(y.shape(), (Shape{4, 2}));
    const D& w = c.want;
    expect_rounded(y, {w[0], w[4], w[1], w[5], w[2], w[6], w[3], w[7]}, std::string(c.name) + " T");
  }
  // Stepped and reversed slice: kUnaryX[::-3] = x[7], x[4], x[1].
  const Tensor s = slice(f64(kUnaryX), {Slice{std::nullopt, std::nullopt, -3}});
  for (const UnaryCase& c : kUnary) {
    if (c.positive) continue;
    expect_rounded(unary_fn(c.name)(s), {c.want[7], c.want[4], c.want[1]},
                   std::string(c.name) + " ::-3");
  }
  // Broadcast view (stride 0).
  const Tensor b = broadcast_to(f64({2.75}), Shape{2, 3});
  expect_rounded(exp(b), D(6, 15.642631884188173), "exp broadcast");  // numpy: np.exp(2.75)
}

TEST(Unary, IntegerAndBoolInputs) {
  // Float functions compute integers in f32 (numpy computes them in f64; values agree here).
  const Tensor i = tensor({0, 1, 2});
  const Tensor e = exp(i);
  EXPECT_EQ(e.dtype(), float32);
  expect_rounded(e, {1.0, 2.718281828459045, 7.38905609893065},
                 "exp i32");  // numpy: np.exp([0,1,2])
  EXPECT_EQ(sqrt(tensor(std::vector<uint8_t>{4, 9}, Shape{2})).dtype(), float32);
  expect_values(sqrt(tensor(std::vector<uint8_t>{4, 9}, Shape{2})), {2, 3});
  expect_values(sin(tensor({false, true})), {0.0, static_cast<double>(std::sin(1.0f))});

  // neg / abs / sign keep integer dtypes.
  for (DType d : {int32, int64}) {
    const Tensor x = as(d, {-3, 0, 5});
    EXPECT_EQ(neg(x).dtype(), d);
    expect_values(neg(x), {3, 0, -5});
    expect_values(-x, {3, 0, -5});
    expect_values(abs(x), {3, 0, 5});
    expect_values(sign(x), {-1, 0, 1});
    expect_values(square(x), {9, 0, 25});
    EXPECT_EQ(square(x).dtype(), d);
  }
  for (DType d : {uint8, uint32}) {
    const Tensor x = as(d, {0, 7});
    expect_values(abs(x), {0, 7});
    expect_values(sign(x), {0, 1});
    EXPECT_EQ(neg(x).dtype(), d);
  }
  // Unsigned negation wraps (numpy: -np.array([1, 7], np.uint8) -> [255, 249]).
  expect_values(neg(tensor(std::vector<uint8_t>{1, 7}, Shape{2})), {255, 249});
  expect_values(neg(tensor(std::vector<unsigned>{1}, Shape{1})), {4294967295.0});
  // The most negative int32 negates to itself, abs too (two's complement wrap, like numpy).
  const int32_t lo = std::numeric_limits<int32_t>::min();
  EXPECT_EQ(neg(tensor({lo})).to_vector<int32_t>()[0], lo);
  EXPECT_EQ(abs(tensor({lo})).to_vector<int32_t>()[0], lo);
  // Rounding is the identity on integers and keeps the dtype.
  for (DType d : {uint8, uint32, int32, int64}) {
    const Tensor x = as(d, {0, 3, 200});
    for (const Tensor& y : {floor(x), ceil(x), round(x)}) {
      EXPECT_EQ(y.dtype(), d);
      expect_values(y, {0, 3, 200});
    }
  }
  // bool: abs and sign are the identity; neg computes in int32.
  const Tensor bools = tensor({true, false});
  EXPECT_EQ(abs(bools).dtype(), bool_);
  EXPECT_EQ(neg(bools).dtype(), int32);
  expect_values(neg(bools), {-1, 0});
}

TEST(Unary, RoundHalfToEven) {
  // numpy: np.round([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 0.49999997, 3.7, -3.7])
  //        -> [-2, -2, -0, 0, 2, 2, 0, 4, -4]
  for (DType d : {float32, float64}) {
    const Tensor r = round(as(d, {-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 0.49999997, 3.7, -3.7}));
    EXPECT_EQ(r.dtype(), d);
    expect_values(r, {-2, -2, -0.0, 0, 2, 2, 0, 4, -4});
    EXPECT_TRUE(std::signbit(r.to_vector<double>()[2]));
  }
  for (DType d : {float16, bfloat16})
    expect_values(round(as(d, {-2.5, 0.5, 1.5, 2.5})), {-2, 0, 2, 2});
}

TEST(Unary, SpecialValues) {
  const D in = {NAN, INFINITY, -INFINITY, -1.0, 0.0, -0.0};
  for (DType d : kFloats) {
    const Tensor x = as(d, in);
    // numpy: np.exp([nan, inf, -inf, -1, 0, -0]) -> [nan, inf, 0, 0.36787944, 1, 1]
    expect_rounded(exp(x), {NAN, INFINITY, 0.0, 0.36787944117144233, 1.0, 1.0}, "exp special");
    // numpy: np.log(...) -> [nan, inf, nan, nan, -inf, -inf]; np.sqrt -> [nan, inf, nan, nan, 0,
    // -0]
    expect_rounded(log(x), {NAN, INFINITY, NAN, NAN, -INFINITY, -INFINITY}, "log special");
    expect_rounded(sqrt(x), {NAN, INFINITY, NAN, NAN, 0.0, 0.0}, "sqrt special");
    // numpy: np.tanh -> [nan, 1, -1, -0.76159416, 0, -0]; sigmoid(+-inf) = 1, 0
    expect_rounded(tanh(x), {NAN, 1.0, -1.0, -0.7615941559557649, 0.0, 0.0}, "tanh special");
    expect_rounded(sigmoid(x), {NAN, 1.0, 0.0, 0.2689414213699951, 0.5, 0.5}, "sigmoid special");
    expect_rounded(abs(x), {NAN, INFINITY, INFINITY, 1.0, 0.0, 0.0}, "abs special");
    expect_rounded(sign(x), {NAN, 1.0, -1.0, -1.0, 0.0, 0.0}, "sign special");
    expect_rounded(floor(x), {NAN, INFINITY, -INFINITY, -1.0, 0.0, 0.0}, "floor special");
    // isnan on every float dtype.
    const Tensor n = isnan(x);
    EXPECT_EQ(n.dtype(), bool_);
    EXPECT_EQ(n.to_vector<bool>(), (B{true, false, false, false, false, false}));
  }
  // Stable sigmoid at large |x| (no overflow to nan): numpy 1/(1+exp(-x)) at +-80, +-1000.
  expect_allclose(sigmoid(tensor({80.0f, -80.0f, 1000.0f, -1000.0f})),
                  {1.0, 1.8048513878454153e-35, 1.0, 0.0}, {.rtol = 1e-5, .atol = 0}, "sigmoid");
  // isnan of integers and bools is all false, with the input's shape.
  for (DType d : {bool_, uint8, uint32, int32, int64}) {
    const Tensor n = isnan(as(d, {0, 1, 2}, Shape{3, 1}));
    EXPECT_EQ(n.dtype(), bool_);
    EXPECT_EQ(n.shape(), (Shape{3, 1}));
    EXPECT_EQ(n.to_vector<bool>(), (B{false, false, false}));
  }
}

TEST(Unary, LogicalNot) {
  EXPECT_EQ(logical_not(tensor({true, false})).to_vector<bool>(), (B{false, true}));
  EXPECT_EQ((!tensor({true, false})).to_vector<bool>(), (B{false, true}));
  for (DType d : kNumeric) {
    const Tensor r = logical_not(as(d, {0, 2, 0.5}));
    EXPECT_EQ(r.dtype(), bool_);
    // 0.5 is non-zero in floats; integers truncate it to 0 when the input is created.
    EXPECT_EQ(r.to_vector<bool>(), (B{true, false, !is_floating(d)})) << d;
  }
  EXPECT_EQ(logical_not(tensor({NAN})).to_vector<bool>(), (B{false}));  // NaN is truthy
}

TEST(Unary, ZeroDimAndEmpty) {
  const Tensor s = exp(tensor(0.0f));
  EXPECT_EQ(s.rank(), 0);
  EXPECT_EQ(s.item<float>(), 1.0f);
  const Tensor e = sin(zeros(Shape{0, 4}));
  EXPECT_EQ(e.shape(), (Shape{0, 4}));
  EXPECT_EQ(neg(zeros(Shape{3, 0}, int32)).shape(), (Shape{3, 0}));
}

// ---- astype ----------------------------------------------------------------------------

TEST(Astype, Conversions) {
  // Floats to integers truncate toward zero (numpy: np.array([-2.7, 2.7]).astype(np.int32)).
  expect_values(astype(tensor({-2.7, 2.7, 0.0}), int32), {-2, 2, 0});
  expect_values(astype(tensor({-2.7f, 2.7f}), int64), {-2, 2});
  // Integer narrowing wraps like numpy: np.array([300, -1]).astype(np.uint8) -> [44, 255].
  expect_values(astype(tensor({300, -1}), uint8), {44, 255});
  // np.array([-1], np.int32).astype(np.uint32) -> [4294967295]
  expect_values(astype(tensor({-1}), uint32), {4294967295.0});
  // np.array([4294967295], np.uint32).astype(np.int32) -> [-1]
  expect_values(astype(tensor(std::vector<unsigned>{4294967295u}, Shape{1}), int32), {-1});
  // Anything to bool: non-zero is true.
  EXPECT_EQ(astype(tensor({0.0f, -0.0f, 0.1f, NAN}), bool_).to_vector<bool>(),
            (B{false, false, true, true}));
  EXPECT_EQ(astype(tensor({0, 5, -1}), bool_).to_vector<bool>(), (B{false, true, true}));
  // bool to numbers: 0 and 1.
  for (DType d : kNumeric) {
    const Tensor t = astype(tensor({true, false}), d);
    EXPECT_EQ(t.dtype(), d);
    expect_values(t, {1, 0});
  }
  // Large integers to float32 round to nearest: 16777217 -> 16777216.
  expect_values(astype(tensor({int64_t{16777217}}), float32), {16777216.0});
  // float64 to float32 rounds: numpy np.float32(0.1) == 0.10000000149011612.
  expect_values(astype(tensor({0.1}), float32), {0.10000000149011612});
  // Every pair of dtypes on small non-negative integers round-trips.
  for (DType from : kAll)
    for (DType to : kAll) {
      const D v = from == bool_ || to == bool_ ? D{0, 1, 1} : D{0, 1, 7};
      const Tensor t = astype(as(from, v), to);
      EXPECT_EQ(t.dtype(), to);
      expect_values(t, v, std::string(dtype_name(from)) + "->" + std::string(dtype_name(to)));
    }
  // astype to the same dtype returns the tensor itself; a non-contiguous input converts right.
  const Tensor x = tensor({1.5f, 2.5f});
  EXPECT_TRUE(astype(x, float32).shares_storage_with(x));
  expect_values(astype(transpose(tensor({1, 2, 3, 4}, Shape{2, 2})), float64), {1, 3, 2, 4});
}

// ---- binary ----------------------------------------------------------------------------

using BinaryFn = Tensor (*)(const Tensor&, const Tensor&);
BinaryFn binary_fn(const std::string& n) {
  if (n == "add") return [](const Tensor& a, const Tensor& b) { return add(a, b); };
  if (n == "sub") return [](const Tensor& a, const Tensor& b) { return sub(a, b); };
  if (n == "mul") return [](const Tensor& a, const Tensor& b) { return mul(a, b); };
  if (n == "div") return [](const Tensor& a, const Tensor& b) { return div(a, b); };
  if (n == "pow") return [](const Tensor& a, const Tensor& b) { return pow(a, b); };
  if (n == "maximum") return [](const Tensor& a, const Tensor& b) { return maximum(a, b); };
  if (n == "minimum") return [](const Tensor& a, const Tensor& b) { return minimum(a, b); };
  return nullptr;
}
struct BinaryCase {
  const char* name;
  D want;    // f(A, B): [2, 3] with [3]
  D want_t;  // f(A.T, B[:, None]): transposed [3, 2] with a broadcast column [3, 1]
};
const D kA = {-2.5, 0, 1.5, 3, -0.375, 6};  // shape [2, 3]
const D kB = {2, -0.5, 4};                  // shape [3]
// numpy (float64, np.errstate(all="ignore")): f(A, B) and f(A.T, B[:, None]).
const BinaryCase kBinary[] = {
    {"add", {-0.5, -0.5, 5.5, 5.0, -0.875, 10.0}, {-0.5, 5.0, -0.5, -0.875, 5.5, 10.0}},
    {"sub", {-4.5, 0.5, -2.5, 1.0, 0.125, 2.0}, {-4.5, 1.0, 0.5, 0.125, -2.5, 2.0}},
    {"mul", {-5.0, -0.0, 6.0, 6.0, 0.1875, 24.0}, {-5.0, 6.0, -0.0, 0.1875, 6.0, 24.0}},
    {"div", {-1.25, -0.0, 0.375, 1.5, 0.75, 1.5}, {-1.25, 1.5, -0.0, 0.75, 0.375, 1.5}},
    {"pow", {6.25, INFINITY, 5.0625, 9.0, NAN, 1296.0}, {6.25, 9.0, INFINITY, NAN, 5.0625, 1296.0}},
    {"maximum", {2.0, 0.0, 4.0, 3.0, -0.375, 6.0}, {2.0, 3.0, 0.0, -0.375, 4.0, 6.0}},
    {"minimum", {-2.5, -0.5, 1.5, 2.0, -0.5, 4.0}, {-2.5, 2.0, -0.5, -0.5, 1.5, 4.0}},
};

TEST(Binary, FloatOpsBroadcastEveryFloatDtype) {
  for (const BinaryCase& c : kBinary) {
    const BinaryFn fn = binary_fn(c.name);
    ASSERT_NE(fn, nullptr) << c.name;
    for (DType d : kFloats) {
      const Tensor a = as(d, kA, Shape{2, 3}), b = as(d, kB);
      const Tensor y = fn(a, b);
      EXPECT_EQ(y.dtype(), d) << c.name;
      EXPECT_EQ(y.shape(), (Shape{2, 3})) << c.name;
      expect_rounded(y, c.want, std::string(c.name) + " " + std::string(dtype_name(d)));
      const Tensor yt = fn(transpose(a), reshape(b, Shape{3, 1}));
      EXPECT_EQ(yt.shape(), (Shape{3, 2})) << c.name;
      expect_rounded(yt, c.want_t, std::string(c.name) + " T " + std::string(dtype_name(d)));
      // Broadcasting is symmetric: the [3] operand on the left gives f(B, A).
      EXPECT_EQ(fn(b, a).shape(), (Shape{2, 3}));
    }
  }
}

TEST(Binary, EveryNumericDtype) {
  const D a = {3, 4, 9, 8, 5, 6}, b = {2, 1, 3, 1, 2, 3};
  for (DType d : kNumeric) {
    const Tensor x = as(d, a, Shape{2, 3}), y = as(d, b, Shape{2, 3});
    const std::string n(dtype_name(d));
    for (const Tensor& r :
         {add(x, y), sub(x, y), mul(x, y), div(x, y), pow(x, y), maximum(x, y), minimum(x, y)})
      EXPECT_EQ(r.dtype(), d) << n;
    expect_values(add(x, y), {5, 5, 12, 9, 7, 9}, "add " + n);
    expect_values(x + y, {5, 5, 12, 9, 7, 9}, "+ " + n);
    expect_values(sub(x, y), {1, 3, 6, 7, 3, 3}, "sub " + n);
    expect_values(x - y, {1, 3, 6, 7, 3, 3}, "- " + n);
    expect_values(mul(x, y), {6, 4, 27, 8, 10, 18}, "mul " + n);
    expect_values(x * y, {6, 4, 27, 8, 10, 18}, "* " + n);
    if (is_floating(d)) {
      expect_values(div(x, y), {1.5, 4, 3, 8, 2.5, 2}, "div " + n);
    } else {
      expect_values(div(x, y), {1, 4, 3, 8, 2, 2}, "div " + n);  // truncating
    }
    expect_values(x / y, div(x, y).to_vector<double>(), "/ " + n);
    // 729 needs 10 significant bits: bf16 rounds it to 728 (ties-even on 1011011001b);
    // u8 wraps it to 729 - 512 = 217.
    const double p729 = d == bfloat16 ? 728.0 : d == uint8 ? 217.0 : 729.0;
    expect_values(pow(x, y), {9, 4, p729, 8, 25, 216}, "pow " + n);
    expect_values(maximum(x, y), a, "maximum " + n);
    expect_values(minimum(x, y), b, "minimum " + n);
    // Non-contiguous operands of this dtype: [[3, 8], [4, 5], [9, 6]] + [1, 2].
    expect_values(add(transpose(x), as(d, {1, 2})), {4, 10, 5, 7, 10, 8}, "add T " + n);
  }
}

TEST(Binary, BoolArithmeticComputesInInt32) {
  const Tensor a = tensor({true, true, false, false}), b = tensor({true, false, true, false});
  EXPECT_EQ(add(a, b).dtype(), int32);
  expect_values(add(a, b), {2, 1, 1, 0});
  expect_values(sub(a, b), {0, 1, -1, 0});
  expect_values(mul(a, b), {1, 0, 0, 0});
  expect_values(maximum(a, b), {1, 1, 1, 0});
  expect_values(minimum(a, b), {1, 0, 0, 0});
}

TEST(Binary, IntegerEdgeCases) {
  // Overflow wraps: int32 max + 1 -> min; u8 200 + 100 -> 44; u8 16 * 16 -> 0; i64 too.
  const int32_t mx = std::numeric_limits<int32_t>::max(), mn = std::numeric_limits<int32_t>::min();
  EXPECT_EQ(add(tensor({mx}), tensor({1})).to_vector<int32_t>()[0], mn);
  EXPECT_EQ(mul(tensor({mx}), tensor({2})).to_vector<int32_t>()[0], -2);
  const int64_t mx64 = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(add(tensor({mx64}), tensor({int64_t{1}})).to_vector<int64_t>()[0],
            std::numeric_limits<int64_t>::min());
  const Tensor u = tensor(std::vector<uint8_t>{200, 16, 3}, Shape{3});
  expect_values(add(u, tensor(std::vector<uint8_t>{100, 0, 0}, Shape{3})), {44, 16, 3});
  expect_values(mul(u, tensor(std::vector<uint8_t>{1, 16, 2}, Shape{3})), {200, 0, 6});
  expect_values(
      sub(tensor(std::vector<uint8_t>{1}, Shape{1}), tensor(std::vector<uint8_t>{2}, Shape{1})),
      {255});
  // Division truncates toward zero (C semantics, documented; numpy's // floors instead).
  expect_values(div(tensor({-7, 7, -7, 7}), tensor({2, 2, -2, -2})), {-3, 3, 3, -3});
  expect_values(div(tensor({int64_t{-9}}), tensor({int64_t{4}})), {-2});
  // INT_MIN / -1 wraps instead of trapping.
  EXPECT_EQ(div(tensor({mn}), tensor({-1})).to_vector<int32_t>()[0], mn);
  // Integer powers: by squaring, wrapping; x^0 = 1 (also 0^0).
  expect_values(pow(tensor({2, -3, 0, 5}), tensor({10, 3, 0, 0})), {1024, -27, 1, 1});
  expect_values(
      pow(tensor(std::vector<uint8_t>{2}, Shape{1}), tensor(std::vector<uint8_t>{9}, Shape{1})),
      {0});
  expect_values(pow(tensor({2}), tensor({31})), {static_cast<double>(mn)});
}

TEST(Binary, WeakScalarsAndOperators) {
  const Tensor x = tensor({1.0f, 2.0f, 4.0f});
  expect_values(x + 1, {2, 3, 5});
  expect_values(1 + x, {2, 3, 5});
  expect_values(x - 1.5, {-0.5, 0.5, 2.5});
  expect_values(10 - x, {9, 8, 6});
  expect_values(x * 3, {3, 6, 12});
  expect_values(x / 2, {0.5, 1, 2});
  expect_values(8 / x, {8, 4, 2});
  expect_values(pow(x, 2), {1, 4, 16});
  expect_values(pow(x, 0.5), {1, 1.4142135381698608, 2});  // numpy: np.float32(np.sqrt(2))
  expect_values(maximum(x, 2.5), {2.5, 2.5, 4});
  expect_values(minimum(x, 2), {1, 2, 2});
  expect_values(-x, {-1, -2, -4});
  EXPECT_EQ((x * 2).dtype(), float32);
}

TEST(Binary, NaNPropagation) {
  // numpy: np.maximum([nan, 1, 2, nan], [0, nan, 1, nan]) -> [nan, nan, 2, nan]; minimum alike.
  for (DType d : kFloats) {
    const Tensor a = as(d, {NAN, 1, 2, NAN}), b = as(d, {0, NAN, 1, NAN});
    expect_rounded(maximum(a, b), {NAN, NAN, 2, NAN}, "maximum nan");
    expect_rounded(minimum(a, b), {NAN, NAN, 1, NAN}, "minimum nan");
    expect_rounded(add(a, b), {NAN, NAN, 3, NAN}, "add nan");
    expect_rounded(maximum(a, 1.5), {NAN, 1.5, 2, NAN}, "maximum scalar nan");
  }
  // 0/0 and x/0 in floats: nan and +-inf (numpy: np.divide([0, 1, -1], 0)).
  expect_rounded(div(tensor({0.0f, 1.0f, -1.0f}), tensor({0.0f})), {NAN, INFINITY, -INFINITY},
                 "div0");
}

TEST(Binary, ZeroDimAndEmpty) {
  const Tensor s = add(tensor(2.0f), tensor({1.0f, 2.0f, 3.0f}));
  EXPECT_EQ(s.shape(), (Shape{3}));
  expect_values(s, {3, 4, 5});
  const Tensor ss = mul(tensor(2), tensor(21));
  EXPECT_EQ(ss.rank(), 0);
  EXPECT_EQ(ss.item<int32_t>(), 42);
  const Tensor e = add(zeros(Shape{0, 3}), ones(Shape{3}));
  EXPECT_EQ(e.shape(), (Shape{0, 3}));
  EXPECT_EQ(add(zeros(Shape{0, 1}), ones(Shape{1, 4})).shape(), (Shape{0, 4}));
  // Integer division by an empty divisor has no zero in it.
  EXPECT_EQ(div(zeros(Shape{0}, int32), zeros(Shape{0}, int32)).numel(), 0);
}

// ---- comparisons and logic ---------------------------------------------------------

TEST(Compare, EveryDtype) {
  const D a = {3, 4, 9, 8, 5, 6}, b = {3, 1, 9, 9, 2, 6};
  for (DType d : kNumeric) {
    const Tensor x = as(d, a), y = as(d, b);
    const std::string n(dtype_name(d));
    EXPECT_EQ(equal(x, y).dtype(), bool_);
    EXPECT_EQ(equal(x, y).to_vector<bool>(), (B{1, 0, 1, 0, 0, 1})) << n;
    EXPECT_EQ(not_equal(x, y).to_vector<bool>(), (B{0, 1, 0, 1, 1, 0})) << n;
    EXPECT_EQ(less(x, y).to_vector<bool>(), (B{0, 0, 0, 1, 0, 0})) << n;
    EXPECT_EQ(less_equal(x, y).to_vector<bool>(), (B{1, 0, 1, 1, 0, 1})) << n;
    EXPECT_EQ(greater(x, y).to_vector<bool>(), (B{0, 1, 0, 0, 1, 0})) << n;
    EXPECT_EQ(greater_equal(x, y).to_vector<bool>(), (B{1, 1, 1, 0, 1, 1})) << n;
    EXPECT_EQ((x == y).to_vector<bool>(), (B{1, 0, 1, 0, 0, 1})) << n;
    EXPECT_EQ((x != y).to_vector<bool>(), (B{0, 1, 0, 1, 1, 0})) << n;
    EXPECT_EQ((x < y).to_vector<bool>(), (B{0, 0, 0, 1, 0, 0})) << n;
    EXPECT_EQ((x <= y).to_vector<bool>(), (B{1, 0, 1, 1, 0, 1})) << n;
    EXPECT_EQ((x > y).to_vector<bool>(), (B{0, 1, 0, 0, 1, 0})) << n;
    EXPECT_EQ((x >= y).to_vector<bool>(), (B{1, 1, 1, 0, 1, 1})) << n;
    EXPECT_EQ((x > 5).to_vector<bool>(), (B{0, 0, 1, 1, 0, 1})) << n;
    EXPECT_EQ((5 < x).to_vector<bool>(), (B{0, 0, 1, 1, 0, 1})) << n;
  }
  const Tensor p = tensor({true, true, false, false}), q = tensor({true, false, true, false});
  EXPECT_EQ(equal(p, q).to_vector<bool>(), (B{1, 0, 0, 1}));
  EXPECT_EQ(less(p, q).to_vector<bool>(), (B{0, 0, 1, 0}));
  EXPECT_EQ(greater(p, q).to_vector<bool>(), (B{0, 1, 0, 0}));
  EXPECT_EQ(greater_equal(p, q).to_vector<bool>(), (B{1, 1, 0, 1}));
  // NaN compares unequal to everything, itself included.
  const Tensor n = tensor({NAN, 1.0f});
  EXPECT_EQ(equal(n, n).to_vector<bool>(), (B{0, 1}));
  EXPECT_EQ(not_equal(n, n).to_vector<bool>(), (B{1, 0}));
  EXPECT_EQ(less(n, tensor({INFINITY})).to_vector<bool>(), (B{0, 1}));
  // Mixed dtypes promote before comparing; shapes broadcast; strided inputs work.
  EXPECT_EQ(less(tensor({1, 2, 3}), tensor({1.5, 1.5, 3.5})).to_vector<bool>(), (B{1, 0, 1}));
  const Tensor m = tensor({1, 2, 3, 4}, Shape{2, 2});
  const Tensor c = greater(transpose(m), tensor({2, 1}));
  EXPECT_EQ(c.shape(), (Shape{2, 2}));
  EXPECT_EQ(c.to_vector<bool>(), (B{0, 1, 0, 1}));  // [[1, 3], [2, 4]] > [2, 1]
}

TEST(Logical, AndOrXor) {
  const Tensor p = tensor({true, true, false, false}), q = tensor({true, false, true, false});
  EXPECT_EQ(logical_and(p, q).to_vector<bool>(), (B{1, 0, 0, 0}));
  EXPECT_EQ(logical_or(p, q).to_vector<bool>(), (B{1, 1, 1, 0}));
  EXPECT_EQ(logical_xor(p, q).to_vector<bool>(), (B{0, 1, 1, 0}));
  EXPECT_EQ((p && q).to_vector<bool>(), (B{1, 0, 0, 0}));
  EXPECT_EQ((p || q).to_vector<bool>(), (B{1, 1, 1, 0}));
  // Numeric inputs count as "non-zero"; the result is bool.
  for (DType d : kNumeric) {
    const Tensor x = as(d, {0, 2, 1, 0}), y = as(d, {0, 0, 3, 7});
    EXPECT_EQ(logical_and(x, y).dtype(), bool_);
    EXPECT_EQ(logical_and(x, y).to_vector<bool>(), (B{0, 0, 1, 0})) << d;
    EXPECT_EQ(logical_or(x, y).to_vector<bool>(), (B{0, 1, 1, 1})) << d;
    EXPECT_EQ(logical_xor(x, y).to_vector<bool>(), (B{0, 1, 0, 1})) << d;
  }
  // Broadcasting: [2, 1] with [3].
  const Tensor r = logical_or(tensor({true, false}, Shape{2, 1}), tensor({false, true, false}));
  EXPECT_EQ(r.shape(), (Shape{2, 3}));
  EXPECT_EQ(r.to_vector<bool>(), (B{1, 1, 1, 0, 1, 0}));
}

TEST(Where, BroadcastsAndPromotes) {
  // numpy: np.where([[True], [False]], np.array([1, 2, 3], np.int32), np.float32(0.5))
  //        -> float32 [[1, 2, 3], [0.5, 0.5, 0.5]]
  const Tensor r = where(tensor({true, false}, Shape{2, 1}), tensor({1, 2, 3}), tensor(0.5f));
  EXPECT_EQ(r.dtype(), float32);
  EXPECT_EQ(r.shape(), (Shape{2, 3}));
  expect_values(r, {1, 2, 3, 0.5, 0.5, 0.5});
  // A numeric condition counts non-zero as true.
  expect_values(where(tensor({0, 3, -1}), tensor({1, 1, 1}), tensor({2, 2, 2})), {2, 1, 1});
  // Every dtype for the values, non-contiguous operands.
  for (DType d : kAll) {
    const Tensor x = transpose(as(d, {1, 0, 1, 1}, Shape{2, 2}));  // [[1, 1], [0, 1]]
    const Tensor y = as(d, {0, 0});
    const Tensor w = where(tensor({true, false, true, true}, Shape{2, 2}), x, y);
    EXPECT_EQ(w.dtype(), d);
    expect_values(w, {1, 0, 0, 1}, std::string(dtype_name(d)));
  }
  // NaNs pass through the chosen side only.
  expect_rounded(where(tensor({true, false}), tensor({NAN, NAN}), tensor({1.0f, 2.0f})), {NAN, 2},
                 "where nan");
  // 0-d everything.
  EXPECT_EQ(where(tensor(true), tensor(1), tensor(2)).item<int32_t>(), 1);
}

TEST(Clip, ScalarAndTensorBounds) {
  // numpy: np.clip(np.float32([-2, 0.5, 3, nan]), 0, 1) -> [0, 0.5, 1, nan]
  for (DType d : kFloats) {
    const Tensor c = clip(as(d, {-2, 0.5, 3, NAN}), 0.0, 1.0);
    EXPECT_EQ(c.dtype(), d);
    expect_rounded(c, {0, 0.5, 1, NAN}, "clip");
  }
  // numpy: np.clip([[1, 5], [3, -1]], [0, 2], 4) -> [[1, 4], [3, 2]]
  const Tensor c = clip(tensor({1, 5, 3, -1}, Shape{2, 2}), tensor({0, 2}), tensor(4));
  EXPECT_EQ(c.dtype(), int32);
  expect_values(c, {1, 4, 3, 2});
  // Transposed input: [[1, 3], [5, -1]] clipped to [0, 2].
  expect_values(clip(transpose(tensor({1.0, 5.0, 3.0, -1.0}, Shape{2, 2})), 0.0, 2.0),
                {1, 2, 2, 0});
}

// ---- reductions ------------------------------------------------------------------------

// numpy: x = ((np.arange(24) * 7 % 13) - 6.5) * 0.5 reshaped to (2, 3, 4); views:
// 0: x, 1: x.transpose(2, 0, 1), 2: x[:, ::2, ::-1].
const D kRedX = {-3.25, 0.25,  -2.75, 0.75,  -2.25, 1.25,  -1.75, 1.75,
                 -1.25, 2.25,  -0.75, 2.75,  -0.25, -3.25, 0.25,  -2.75,
                 0.75,  -2.25, 1.25,  -1.75, 1.75,  -1.25, 2.25,  -0.75};
Tensor red_view(const Tensor& x, int v) {
  if (v == 1) return permute(x, {2, 0, 1});
  if (v == 2)
    return slice(
        x, {Slice{}, Slice{std::nullopt, std::nullopt, 2}, Slice{std::nullopt, std::nullopt, -1}});
  return x;
}
struct ReduceCase {
  const char* op;
  int view;
  I64 axes;
  I64 shape;
  D want;
};
// numpy: np.<op>(view, axis=axes or None) for sum, mean, prod, max, min, var (ddof=0), and
// logsumexp = max + log(sum(exp(v - max))) over the axes.
const ReduceCase kReduce[] = {
    {"sum", 0, {}, {}, {-9.0}},
    {"mean", 0, {}, {}, {-0.375}},
    {"prod", 0, {}, {}, {-637.3121560370154}},
    {"max", 0, {}, {}, {2.75}},
    {"min", 0, {}, {}, {-3.25}},
    {"var", 0, {}, {}, {3.4010416666666665}},
    {"logsumexp", 0, {}, {}, {4.142663816273885}},
    {"sum", 0, {0}, {3, 4}, {-3.5, -3.0, -2.5, -2.0, -1.5, -1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0}},
    {"mean",
     0,
     {0},
     {3, 4},
     {-1.75, -1.5, -1.25, -1.0, -0.75, -0.5, -0.25, 0.0, 0.25, 0.5, 0.75, 1.0}},
    {"prod",
     0,
     {0},
     {3, 4},
     {0.8125, -0.8125, -0.6875, -2.0625, -1.6875, -2.8125, -2.1875, -3.0625, -2.1875, -2.8125,
      -1.6875, -2.0625}},
    {"max",
     0,
     {0},
     {3, 4},
     {-0.25, 0.25, 0.25, 0.75, 0.75, 1.25, 1.25, 1.75, 1.75, 2.25, 2.25, 2.75}},
    {"min",
     0,
     {0},
     {3, 4},
     {-3.25, -3.25, -2.75, -2.75, -2.25, -2.25, -1.75, -1.75, -1.25, -1.25, -0.75, -0.75}},
    {"var",
     0,
     {0},
     {3, 4},
     {2.25, 3.0625, 2.25, 3.0625, 2.25, 3.0625, 2.25, 3.0625, 2.25, 3.0625, 2.25, 3.0625}},
    {"logsumexp",
     0,
     {0},
     {3, 4},
     {-0.20141264842625803, 0.27975041827262065, 0.29858735157374194, 0.7797504182726207,
      0.7985873515737419, 1.2797504182726207, 1.298587351573742, 1.7797504182726207,
      1.798587351573742, 2.2797504182726205, 2.298587351573742, 2.7797504182726205}},
    {"sum", 0, {1}, {2, 4}, {-6.75, 3.75, -5.25, 5.25, 2.25, -6.75, 3.75, -5.25}},
    {"mean", 0, {1}, {2, 4}, {-2.25, 1.25, -1.75, 1.75, 0.75, -2.25, 1.25, -1.75}},
    {"prod",
     0,
     {1},
     {2, 4},
     {-9.140625, 0.703125, -3.609375, 3.609375, -0.328125, -9.140625, 0.703125, -3.609375}},
    {"max", 0, {1}, {2, 4}, {-1.25, 2.25, -0.75, 2.75, 1.75, -1.25, 2.25, -0.75}},
    {"min", 0, {1}, {2, 4}, {-3.25, 0.25, -2.75, 0.75, -0.25, -3.25, 0.25, -2.75}},
    {"var",
     0,
     {1},
     {2, 4},
     {0.6666666666666666, 0.6666666666666666, 0.6666666666666666, 0.6666666666666666,
      0.6666666666666666, 0.6666666666666666, 0.6666666666666666, 0.6666666666666666}},
    {"logsumexp",
     0,
     {1},
     {2, 4},
     {-0.8423940355556196, 2.6576059644443806, -0.34239403555561965, 3.1576059644443806,
      2.1576059644443806, -0.8423940355556196, 2.6576059644443806, -0.34239403555561965}},
    {"sum", 0, {2}, {2, 3}, {-5.0, -1.0, 3.0, -6.0, -2.0, 2.0}},
    {"mean", 0, {2}, {2, 3}, {-1.25, -0.25, 0.75, -1.5, -0.5, 0.5}},
    {"prod",
     0,
     {2},
     {2, 3},
     {1.67578125, 8.61328125, 5.80078125, -0.55859375, 3.69140625, 3.69140625}},
    {"max", 0, {2}, {2, 3}, {0.75, 1.75, 2.75, 0.25, 1.25, 2.25}},
    {"min", 0, {2}, {2, 3}, {-3.25, -2.25, -1.25, -3.25, -2.25, -1.25}},
    {"var", 0, {2}, {2, 3}, {3.125, 3.125, 3.125, 2.3125, 2.3125, 2.3125}},
    {"logsumexp",
     0,
     {2},
     {2, 3},
     {1.2538274024527272, 2.2538274024527274, 3.2538274024527274, 0.7726643357538485,
      1.7726643357538485, 2.7726643357538485}},
    {"sum", 0, {-1}, {2, 3}, {-5.0, -1.0, 3.0, -6.0, -2.0, 2.0}},
    {"mean", 0, {-1}, {2, 3}, {-1.25, -0.25, 0.75, -1.5, -0.5, 0.5}},
    {"prod",
     0,
     {-1},
     {2, 3},
     {1.67578125, 8.61328125, 5.80078125, -0.55859375, 3.69140625, 3.69140625}},
    {"max", 0, {-1}, {2, 3}, {0.75, 1.75, 2.75, 0.25, 1.25, 2.25}},
    {"min", 0, {-1}, {2, 3}, {-3.25, -2.25, -1.25, -3.25, -2.25, -1.25}},
    {"var", 0, {-1}, {2, 3}, {3.125, 3.125, 3.125, 2.3125, 2.3125, 2.3125}},
    {"logsumexp",
     0,
     {-1},
     {2, 3},
     {1.2538274024527272, 2.2538274024527274, 3.2538274024527274, 0.7726643357538485,
      1.7726643357538485, 2.7726643357538485}},
    {"sum", 0, {0, 1}, {4}, {-4.5, -3.0, -1.5, 0.0}},
    {"mean", 0, {0, 1}, {4}, {-0.75, -0.5, -0.25, 0.0}},
    {"prod", 0, {0, 1}, {4}, {2.999267578125, -6.427001953125, -2.537841796875, -13.027587890625}},
    {"max", 0, {0, 1}, {4}, {1.75, 2.25, 2.25, 2.75}},
    {"min", 0, {0, 1}, {4}, {-3.25, -3.25, -2.75, -2.75}},
    {"var",
     0,
     {0, 1},
     {4},
     {2.9166666666666665, 3.7291666666666665, 2.9166666666666665, 3.7291666666666665}},
    {"logsumexp",
     0,
     {0, 1},
     {4},
     {2.206193316018122, 2.687356382717001, 2.706193316018122, 3.187356382717001}},
    {"sum", 0, {0, 2}, {3}, {-11.0, -3.0, 5.0}},
    {"mean", 0, {0, 2}, {3}, {-1.375, -0.375, 0.625}},
    {"prod", 0, {0, 2}, {3}, {-0.9360809326171875, 31.795120239257812, 21.413040161132812}},
    {"max", 0, {0, 2}, {3}, {0.75, 1.75, 2.75}},
    {"min", 0, {0, 2}, {3}, {-3.25, -2.25, -1.25}},
    {"var", 0, {0, 2}, {3}, {2.734375, 2.734375, 2.734375}},
    {"logsumexp", 0, {0, 2}, {3}, {1.7350578518295043, 2.735057851829504, 3.735057851829504}},
    {"sum", 0, {1, 2}, {2}, {-3.0, -6.0}},
    {"mean", 0, {1, 2}, {2}, {-0.25, -0.5}},
    {"prod", 0, {1, 2}, {2}, {83.72833281755447, -7.611666619777679}},
    {"max", 0, {1, 2}, {2}, {2.75, 2.25}},
    {"min", 0, {1, 2}, {2}, {-3.25, -3.25}},
    {"var", 0, {1, 2}, {2}, {3.7916666666666665, 2.9791666666666665}},
    {"logsumexp", 0, {1, 2}, {2}, {3.6614333668971075, 3.180270300198229}},
    {"sum", 0, {-3, -1}, {3}, {-11.0, -3.0, 5.0}},
    {"mean", 0, {-3, -1}, {3}, {-1.375, -0.375, 0.625}},
    {"prod", 0, {-3, -1}, {3}, {-0.9360809326171875, 31.795120239257812, 21.413040161132812}},
    {"max", 0, {-3, -1}, {3}, {0.75, 1.75, 2.75}},
    {"min", 0, {-3, -1}, {3}, {-3.25, -2.25, -1.25}},
    {"var", 0, {-3, -1}, {3}, {2.734375, 2.734375, 2.734375}},
    {"logsumexp", 0, {-3, -1}, {3}, {1.7350578518295043, 2.735057851829504, 3.735057851829504}},
    {"sum", 0, {0, 1, 2}, {}, {-9.0}},
    {"mean", 0, {0, 1, 2}, {}, {-0.375}},
    {"prod", 0, {0, 1, 2}, {}, {-637.3121560370154}},
    {"max", 0, {0, 1, 2}, {}, {2.75}},
    {"min", 0, {0, 1, 2}, {}, {-3.25}},
    {"var", 0, {0, 1, 2}, {}, {3.4010416666666665}},
    {"logsumexp", 0, {0, 1, 2}, {}, {4.142663816273885}},
    {"sum", 1, {}, {}, {-9.0}},
    {"mean", 1, {}, {}, {-0.375}},
    {"prod", 1, {}, {}, {-637.3121560370154}},
    {"max", 1, {}, {}, {2.75}},
    {"min", 1, {}, {}, {-3.25}},
    {"var", 1, {}, {}, {3.4010416666666665}},
    {"logsumexp", 1, {}, {}, {4.142663816273885}},
    {"sum", 1, {0}, {2, 3}, {-5.0, -1.0, 3.0, -6.0, -2.0, 2.0}},
    {"mean", 1, {0}, {2, 3}, {-1.25, -0.25, 0.75, -1.5, -0.5, 0.5}},
    {"prod",
     1,
     {0},
     {2, 3},
     {1.67578125, 8.61328125, 5.80078125, -0.55859375, 3.69140625, 3.69140625}},
    {"max", 1, {0}, {2, 3}, {0.75, 1.75, 2.75, 0.25, 1.25, 2.25}},
    {"min", 1, {0}, {2, 3}, {-3.25, -2.25, -1.25, -3.25, -2.25, -1.25}},
    {"var", 1, {0}, {2, 3}, {3.125, 3.125, 3.125, 2.3125, 2.3125, 2.3125}},
    {"logsumexp",
     1,
     {0},
     {2, 3},
     {1.2538274024527272, 2.2538274024527274, 3.2538274024527274, 0.7726643357538485,
      1.7726643357538485, 2.7726643357538485}},
    {"sum", 1, {1}, {4, 3}, {-3.5, -1.5, 0.5, -3.0, -1.0, 1.0, -2.5, -0.5, 1.5, -2.0, 0.0, 2.0}},
    {"mean",
     1,
     {1},
     {4, 3},
     {-1.75, -0.75, 0.25, -1.5, -0.5, 0.5, -1.25, -0.25, 0.75, -1.0, 0.0, 1.0}},
    {"prod",
     1,
     {1},
     {4, 3},
     {0.8125, -1.6875, -2.1875, -0.8125, -2.8125, -2.8125, -0.6875, -2.1875, -1.6875, -2.0625,
      -3.0625, -2.0625}},
    {"max",
     1,
     {1},
     {4, 3},
     {-0.25, 0.75, 1.75, 0.25, 1.25, 2.25, 0.25, 1.25, 2.25, 0.75, 1.75, 2.75}},
    {"min",
     1,
     {1},
     {4, 3},
     {-3.25, -2.25, -1.25, -3.25, -2.25, -1.25, -2.75, -1.75, -0.75, -2.75, -1.75, -0.75}},
    {"var",
     1,
     {1},
     {4, 3},
     {2.25, 2.25, 2.25, 3.0625, 3.0625, 3.0625, 2.25, 2.25, 2.25, 3.0625, 3.0625, 3.0625}},
    {"logsumexp",
     1,
     {1},
     {4, 3},
     {-0.20141264842625803, 0.7985873515737419, 1.798587351573742, 0.27975041827262065,
      1.2797504182726207, 2.2797504182726205, 0.29858735157374194, 1.298587351573742,
      2.298587351573742, 0.7797504182726207, 1.7797504182726207, 2.7797504182726205}},
    {"sum", 1, {2}, {4, 2}, {-6.75, 2.25, 3.75, -6.75, -5.25, 3.75, 5.25, -5.25}},
    {"mean", 1, {2}, {4, 2}, {-2.25, 0.75, 1.25, -2.25, -1.75, 1.25, 1.75, -1.75}},
    {"prod",
     1,
     {2},
     {4, 2},
     {-9.140625, -0.328125, 0.703125, -9.140625, -3.609375, 0.703125, 3.609375, -3.609375}},
    {"max", 1, {2}, {4, 2}, {-1.25, 1.75, 2.25, -1.25, -0.75, 2.25, 2.75, -0.75}},
    {"min", 1, {2}, {4, 2}, {-3.25, -0.25, 0.25, -3.25, -2.75, 0.25, 0.75, -2.75}},
    {"var",
     1,
     {2},
     {4, 2},
     {0.6666666666666666, 0.6666666666666666, 0.6666666666666666, 0.6666666666666666,
      0.6666666666666666, 0.6666666666666666, 0.6666666666666666, 0.6666666666666666}},
    {"logsumexp",
     1,
     {2},
     {4, 2},
     {-0.8423940355556196, 2.1576059644443806, 2.6576059644443806, -0.8423940355556196,
      -0.34239403555561965, 2.6576059644443806, 3.1576059644443806, -0.34239403555561965}},
    {"sum", 1, {-1}, {4, 2}, {-6.75, 2.25, 3.75, -6.75, -5.25, 3.75, 5.25, -5.25}},
    {"mean", 1, {-1}, {4, 2}, {-2.25, 0.75, 1.25, -2.25, -1.75, 1.25, 1.75, -1.75}},
    {"prod",
     1,
     {-1},
     {4, 2},
     {-9.140625, -0.328125, 0.703125, -9.140625, -3.609375, 0.703125, 3.609375, -3.609375}},
    {"max", 1, {-1}, {4, 2}, {-1.25, 1.75, 2.25, -1.25, -0.75, 2.25, 2.75, -0.75}},
    {"min", 1, {-1}, {4, 2}, {-3.25, -0.25, 0.25, -3.25, -2.75, 0.25, 0.75, -2.75}},
    {"var",
     1,
     {-1},
     {4, 2},
     {0.6666666666666666, 0.6666666666666666, 0.6666666666666666, 0.6666666666666666,
      0.6666666666666666, 0.6666666666666666, 0.6666666666666666, 0.6666666666666666}},
    {"logsumexp",
     1,
     {-1},
     {4, 2},
     {-0.8423940355556196, 2.1576059644443806, 2.6576059644443806, -0.8423940355556196,
      -0.34239403555561965, 2.6576059644443806, 3.1576059644443806, -0.34239403555561965}},
    {"sum", 1, {0, 1}, {3}, {-11.0, -3.0, 5.0}},
    {"mean", 1, {0, 1}, {3}, {-1.375, -0.375, 0.625}},
    {"prod", 1, {0, 1}, {3}, {-0.9360809326171875, 31.795120239257812, 21.413040161132812}},
    {"max", 1, {0, 1}, {3}, {0.75, 1.75, 2.75}},
    {"min", 1, {0, 1}, {3}, {-3.25, -2.25, -1.25}},
    {"var", 1, {0, 1}, {3}, {2.734375, 2.734375, 2.734375}},
    {"logsumexp", 1, {0, 1}, {3}, {1.7350578518295043, 2.735057851829504, 3.735057851829504}},
    {"sum", 1, {0, 2}, {2}, {-3.0, -6.0}},
    {"mean", 1, {0, 2}, {2}, {-0.25, -0.5}},
    {"prod", 1, {0, 2}, {2}, {83.72833281755447, -7.611666619777679}},
    {"max", 1, {0, 2}, {2}, {2.75, 2.25}},
    {"min", 1, {0, 2}, {2}, {-3.25, -3.25}},
    {"var", 1, {0, 2}, {2}, {3.7916666666666665, 2.9791666666666665}},
    {"logsumexp", 1, {0, 2}, {2}, {3.6614333668971075, 3.180270300198229}},
    {"sum", 1, {1, 2}, {4}, {-4.5, -3.0, -1.5, 0.0}},
    {"mean", 1, {1, 2}, {4}, {-0.75, -0.5, -0.25, 0.0}},
    {"prod", 1, {1, 2}, {4}, {2.999267578125, -6.427001953125, -2.537841796875, -13.027587890625}},
    {"max", 1, {1, 2}, {4}, {1.75, 2.25, 2.25, 2.75}},
    {"min", 1, {1, 2}, {4}, {-3.25, -3.25, -2.75, -2.75}},
    {"var",
     1,
     {1, 2},
     {4},
     {2.9166666666666665, 3.7291666666666665, 2.9166666666666665, 3.7291666666666665}},
    {"logsumexp",
     1,
     {1, 2},
     {4},
     {2.206193316018122, 2.687356382717001, 2.706193316018122, 3.187356382717001}},
    {"sum", 1, {-3, -1}, {2}, {-3.0, -6.0}},
    {"mean", 1, {-3, -1}, {2}, {-0.25, -0.5}},
    {"prod", 1, {-3, -1}, {2}, {83.72833281755447, -7.611666619777679}},
    {"max", 1, {-3, -1}, {2}, {2.75, 2.25}},
    {"min", 1, {-3, -1}, {2}, {-3.25, -3.25}},
    {"var", 1, {-3, -1}, {2}, {3.7916666666666665, 2.9791666666666665}},
    {"logsumexp", 1, {-3, -1}, {2}, {3.6614333668971075, 3.180270300198229}},
    {"sum", 1, {0, 1, 2}, {}, {-9.0}},
    {"mean", 1, {0, 1, 2}, {}, {-0.375}},
    {"prod", 1, {0, 1, 2}, {}, {-637.3121560370154}},
    {"max", 1, {0, 1, 2}, {}, {2.75}},
    {"min", 1, {0, 1, 2}, {}, {-3.25}},
    {"var", 1, {0, 1, 2}, {}, {3.4010416666666665}},
    {"logsumexp", 1, {0, 1, 2}, {}, {4.142663816273885}},
    {"sum", 2, {}, {}, {-6.0}},
    {"mean", 2, {}, {}, {-0.375}},
    {"prod", 2, {}, {}, {-20.044338604202494}},
    {"max", 2, {}, {}, {2.75}},
    {"min", 2, {}, {}, {-3.25}},
    {"var", 2, {}, {}, {3.734375}},
    {"logsumexp", 2, {}, {}, {3.861985862872477}},
    {"sum", 2, {0}, {2, 4}, {-2.0, -2.5, -3.0, -3.5, 2.0, 1.5, 1.0, 0.5}},
    {"mean", 2, {0}, {2, 4}, {-1.0, -1.25, -1.5, -1.75, 1.0, 0.75, 0.5, 0.25}},
    {"prod",
     2,
     {0},
     {2, 4},
     {-2.0625, -0.6875, -0.8125, 0.8125, -2.0625, -1.6875, -2.8125, -2.1875}},
    {"max", 2, {0}, {2, 4}, {0.75, 0.25, 0.25, -0.25, 2.75, 2.25, 2.25, 1.75}},
    {"min", 2, {0}, {2, 4}, {-2.75, -2.75, -3.25, -3.25, -0.75, -0.75, -1.25, -1.25}},
    {"var", 2, {0}, {2, 4}, {3.0625, 2.25, 3.0625, 2.25, 3.0625, 2.25, 3.0625, 2.25}},
    {"logsumexp",
     2,
     {0},
     {2, 4},
     {0.7797504182726207, 0.29858735157374194, 0.27975041827262065, -0.20141264842625803,
      2.7797504182726205, 2.298587351573742, 2.2797504182726205, 1.798587351573742}},
    {"sum", 2, {1}, {2, 4}, {3.5, -3.5, 2.5, -4.5, -3.5, 2.5, -4.5, 1.5}},
    {"mean", 2, {1}, {2, 4}, {1.75, -1.75, 1.25, -2.25, -1.75, 1.25, -2.25, 0.75}},
    {"prod", 2, {1}, {2, 4}, {2.0625, 2.0625, 0.5625, 4.0625, 2.0625, 0.5625, 4.0625, -0.4375}},
    {"max", 2, {1}, {2, 4}, {2.75, -0.75, 2.25, -1.25, -0.75, 2.25, -1.25, 1.75}},
    {"min", 2, {1}, {2, 4}, {0.75, -2.75, 0.25, -3.25, -2.75, 0.25, -3.25, -0.25}},
    {"var", 2, {1}, {2, 4}, {1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0}},
    {"logsumexp",
     2,
     {1},
     {2, 4},
     {2.8769280110429722, -0.6230719889570275, 2.3769280110429722, -1.1230719889570275,
      -0.6230719889570275, 2.3769280110429722, -1.1230719889570275, 1.8769280110429725}},
    {"sum", 2, {2}, {2, 2}, {-5.0, 3.0, -6.0, 2.0}},
    {"mean", 2, {2}, {2, 2}, {-1.25, 0.75, -1.5, 0.5}},
    {"prod", 2, {2}, {2, 2}, {1.67578125, 5.80078125, -0.55859375, 3.69140625}},
    {"max", 2, {2}, {2, 2}, {0.75, 2.75, 0.25, 2.25}},
    {"min", 2, {2}, {2, 2}, {-3.25, -1.25, -3.25, -1.25}},
    {"var", 2, {2}, {2, 2}, {3.125, 3.125, 2.3125, 2.3125}},
    {"logsumexp",
     2,
     {2},
     {2, 2},
     {1.2538274024527274, 3.2538274024527274, 0.7726643357538487, 2.7726643357538485}},
    {"sum", 2, {-1}, {2, 2}, {-5.0, 3.0, -6.0, 2.0}},
    {"mean", 2, {-1}, {2, 2}, {-1.25, 0.75, -1.5, 0.5}},
    {"prod", 2, {-1}, {2, 2}, {1.67578125, 5.80078125, -0.55859375, 3.69140625}},
    {"max", 2, {-1}, {2, 2}, {0.75, 2.75, 0.25, 2.25}},
    {"min", 2, {-1}, {2, 2}, {-3.25, -1.25, -3.25, -1.25}},
    {"var", 2, {-1}, {2, 2}, {3.125, 3.125, 2.3125, 2.3125}},
    {"logsumexp",
     2,
     {-1},
     {2, 2},
     {1.2538274024527274, 3.2538274024527274, 0.7726643357538487, 2.7726643357538485}},
    {"sum", 2, {0, 1}, {4}, {0.0, -1.0, -2.0, -3.0}},
    {"mean", 2, {0, 1}, {4}, {0.0, -0.25, -0.5, -0.75}},
    {"prod", 2, {0, 1}, {4}, {4.25390625, 1.16015625, 2.28515625, -1.77734375}},
    {"max", 2, {0, 1}, {4}, {2.75, 2.25, 2.25, 1.75}},
    {"min", 2, {0, 1}, {4}, {-2.75, -2.75, -3.25, -3.25}},
    {"var", 2, {0, 1}, {4}, {4.0625, 3.25, 4.0625, 3.25}},
    {"logsumexp",
     2,
     {0, 1},
     {4},
     {2.906678429315593, 2.4255153626167143, 2.406678429315593, 1.9255153626167145}},
    {"sum", 2, {0, 2}, {2}, {-11.0, 5.0}},
    {"mean", 2, {0, 2}, {2}, {-1.375, 0.625}},
    {"prod", 2, {0, 2}, {2}, {-0.9360809326171875, 21.413040161132812}},
    {"max", 2, {0, 2}, {2}, {0.75, 2.75}},
    {"min", 2, {0, 2}, {2}, {-3.25, -1.25}},
    {"var", 2, {0, 2}, {2}, {2.734375, 2.734375}},
    {"logsumexp", 2, {0, 2}, {2}, {1.7350578518295043, 3.735057851829504}},
    {"sum", 2, {1, 2}, {2}, {-2.0, -4.0}},
    {"mean", 2, {1, 2}, {2}, {-0.25, -0.5}},
    {"prod", 2, {1, 2}, {2}, {9.720840454101562, -2.0619964599609375}},
    {"max", 2, {1, 2}, {2}, {2.75, 2.25}},
    {"min", 2, {1, 2}, {2}, {-3.25, -3.25}},
    {"var", 2, {1, 2}, {2}, {4.125, 3.3125}},
    {"logsumexp", 2, {1, 2}, {2}, {3.3807554134956996, 2.899592346796821}},
    {"sum", 2, {-3, -1}, {2}, {-11.0, 5.0}},
    {"mean", 2, {-3, -1}, {2}, {-1.375, 0.625}},
    {"prod", 2, {-3, -1}, {2}, {-0.9360809326171875, 21.413040161132812}},
    {"max", 2, {-3, -1}, {2}, {0.75, 2.75}},
    {"min", 2, {-3, -1}, {2}, {-3.25, -1.25}},
    {"var", 2, {-3, -1}, {2}, {2.734375, 2.734375}},
    {"logsumexp", 2, {-3, -1}, {2}, {1.7350578518295043, 3.735057851829504}},
    {"sum", 2, {0, 1, 2}, {}, {-6.0}},
    {"mean", 2, {0, 1, 2}, {}, {-0.375}},
    {"prod", 2, {0, 1, 2}, {}, {-20.044338604202494}},
    {"max", 2, {0, 1, 2}, {}, {2.75}},
    {"min", 2, {0, 1, 2}, {}, {-3.25}},
    {"var", 2, {0, 1, 2}, {}, {3.734375}},
    {"logsumexp", 2, {0, 1, 2}, {}, {3.861985862872477}},
};

Tensor run_reduce(const std::string& op, const Tensor& x, const Axes& axes, bool keep) {
  if (op == "sum") return sum(x, axes, keep);
  if (op == "mean") return mean(x, axes, keep);
  if (op == "prod") return prod(x, axes, keep);
  if (op == "max") return max(x, axes, keep);
  if (op == "min") return min(x, axes, keep);
  if (op == "var") return var(x, axes, keep);
  if (op == "logsumexp") return logsumexp(x, axes, keep);
  ADD_FAILURE() << "unknown op " << op;
  return x;
}

// Shape with the reduced axes kept as size 1 (computed here from the input shape).
Shape kept_shape(const Shape& in, const I64& axes) {
  std::vector<int64_t> dims = in.dims();
  if (axes.empty()) return Shape(std::vector<int64_t>(dims.size(), 1));
  for (int64_t a : axes) dims[static_cast<std::size_t>(a < 0 ? a + in.rank() : a)] = 1;
  return Shape(dims);
}

TEST(Reduce, TableEveryFloatDtypeAndView) {
  for (DType d : kFloats) {
    const Tensor base = as(d, kRedX, Shape{2, 3, 4});
    for (const ReduceCase& c : kReduce) {
      const Tensor x = red_view(base, c.view);
      const std::string what = std::string(c.op) + " view " + std::to_string(c.view) + " axes " +
                               Shape(c.axes).to_string() + " " + std::string(dtype_name(d));
      const Tensor y = run_reduce(c.op, x, c.axes, false);
      EXPECT_EQ(y.dtype(), d) << what;
      EXPECT_EQ(y.shape(), Shape(c.shape)) << what;
      // Composite ops (var, logsumexp) round in between in 16-bit dtypes.
      const double rt = rtol(d) * (d == bfloat16 || d == float16 ? 4 : 1);
      expect_allclose(y, c.want, {.rtol = rt, .atol = rt * 4}, what);
      const Tensor k = run_reduce(c.op, x, c.axes, true);
      EXPECT_EQ(k.shape(), kept_shape(x.shape(), c.axes)) << what << " keepdims";
      expect_allclose(k, c.want, {.rtol = rt, .atol = rt * 4}, what + " keepdims");
    }
  }
}

struct ArgCase {
  const char* op;
  int view;
  std::optional<int64_t> axis;
  I64 shape;
  I64 want;
};
// numpy: np.argmax / np.argmin(view, axis) (first occurrence of ties).
const ArgCase kArg[] = {
    {"argmax", 0, std::nullopt, {}, {11}},
    {"argmin", 0, std::nullopt, {}, {0}},
    {"argmax", 0, 0, {3, 4}, {1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0}},
    {"argmin", 0, 0, {3, 4}, {0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1}},
    {"argmax", 0, 1, {2, 4}, {2, 2, 2, 2, 2, 2, 2, 2}},
    {"argmin", 0, 1, {2, 4}, {0, 0, 0, 0, 0, 0, 0, 0}},
    {"argmax", 0, 2, {2, 3}, {3, 3, 3, 2, 2, 2}},
    {"argmin", 0, 2, {2, 3}, {0, 0, 0, 1, 1, 1}},
    {"argmax", 0, -1, {2, 3}, {3, 3, 3, 2, 2, 2}},
    {"argmin", 0, -1, {2, 3}, {0, 0, 0, 1, 1, 1}},
    {"argmax", 1, std::nullopt, {}, {20}},
    {"argmin", 1, std::nullopt, {}, {0}},
    {"argmax", 1, 0, {2, 3}, {3, 3, 3, 2, 2, 2}},
    {"argmin", 1, 0, {2, 3}, {0, 0, 0, 1, 1, 1}},
    {"argmax", 1, 1, {4, 3}, {1, 1, 1, 0, 0, 0, 1, 1, 1, 0, 0, 0}},
    {"argmin", 1, 1, {4, 3}, {0, 0, 0, 1, 1, 1, 0, 0, 0, 1, 1, 1}},
    {"argmax", 1, 2, {4, 2}, {2, 2, 2, 2, 2, 2, 2, 2}},
    {"argmin", 1, 2, {4, 2}, {0, 0, 0, 0, 0, 0, 0, 0}},
    {"argmax", 1, -1, {4, 2}, {2, 2, 2, 2, 2, 2, 2, 2}},
    {"argmin", 1, -1, {4, 2}, {0, 0, 0, 0, 0, 0, 0, 0}},
    {"argmax", 2, std::nullopt, {}, {4}},
    {"argmin", 2, std::nullopt, {}, {3}},
    {"argmax", 2, 0, {2, 4}, {0, 1, 0, 1, 0, 1, 0, 1}},
    {"argmin", 2, 0, {2, 4}, {1, 0, 1, 0, 1, 0, 1, 0}},
    {"argmax", 2, 1, {2, 4}, {1, 1, 1, 1, 1, 1, 1, 1}},
    {"argmin", 2, 1, {2, 4}, {0, 0, 0, 0, 0, 0, 0, 0}},
    {"argmax", 2, 2, {2, 2}, {0, 0, 1, 1}},
    {"argmin", 2, 2, {2, 2}, {3, 3, 2, 2}},
    {"argmax", 2, -1, {2, 2}, {0, 0, 1, 1}},
    {"argmin", 2, -1, {2, 2}, {3, 3, 2, 2}},
};

TEST(Reduce, ArgmaxArgminTable) {
  for (DType d : kFloats) {
    const Tensor base = as(d, kRedX, Shape{2, 3, 4});
    for (const ArgCase& c : kArg) {
      const Tensor x = red_view(base, c.view);
      const std::string what = std::string(c.op) + " view " + std::to_string(c.view) + " axis " +
                               (c.axis ? std::to_string(*c.axis) : "None") + " " +
                               std::string(dtype_name(d));
      const bool is_max = std::string(c.op) == "argmax";
      const Tensor y = is_max ? argmax(x, c.axis) : argmin(x, c.axis);
      EXPECT_EQ(y.dtype(), int64) << what;
      EXPECT_EQ(y.shape(), Shape(c.shape)) << what;
      EXPECT_EQ(y.to_vector<int64_t>(), c.want) << what;
      const Tensor k = is_max ? argmax(x, c.axis, true) : argmin(x, c.axis, true);
      const Shape ks = c.axis ? kept_shape(x.shape(), {*c.axis}) : kept_shape(x.shape(), {});
      EXPECT_EQ(k.shape(), ks) << what << " keepdims";
      EXPECT_EQ(k.to_vector<int64_t>(), c.want) << what << " keepdims";
    }
  }
}

struct BoolCase {
  const char* op;
  int view;
  I64 axes;
  I64 shape;
  I64 want;
};
// numpy: np.any(view > 1, axis) and np.all(view > -2.9, axis).
const BoolCase kAnyAll[] = {
    {"any", 0, {}, {}, {1}},
    {"all", 0, {}, {}, {0}},
    {"any", 0, {0}, {3, 4}, {0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1}},
    {"all", 0, {0}, {3, 4}, {0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}},
    {"any", 0, {1}, {2, 4}, {0, 1, 0, 1, 1, 0, 1, 0}},
    {"all", 0, {1}, {2, 4}, {0, 1, 1, 1, 1, 0, 1, 1}},
    {"any", 0, {2}, {2, 3}, {0, 1, 1, 0, 1, 1}},
    {"all", 0, {2}, {2, 3}, {0, 1, 1, 0, 1, 1}},
    {"any", 0, {-1}, {2, 3}, {0, 1, 1, 0, 1, 1}},
    {"all", 0, {-1}, {2, 3}, {0, 1, 1, 0, 1, 1}},
    {"any", 0, {0, 1}, {4}, {1, 1, 1, 1}},
    {"all", 0, {0, 1}, {4}, {0, 0, 1, 1}},
    {"any", 0, {0, 2}, {3}, {0, 1, 1}},
    {"all", 0, {0, 2}, {3}, {0, 1, 1}},
    {"any", 0, {1, 2}, {2}, {1, 1}},
    {"all", 0, {1, 2}, {2}, {0, 0}},
    {"any", 0, {-3, -1}, {3}, {0, 1, 1}},
    {"all", 0, {-3, -1}, {3}, {0, 1, 1}},
    {"any", 0, {0, 1, 2}, {}, {1}},
    {"all", 0, {0, 1, 2}, {}, {0}},
    {"any", 1, {}, {}, {1}},
    {"all", 1, {}, {}, {0}},
    {"any", 1, {0}, {2, 3}, {0, 1, 1, 0, 1, 1}},
    {"all", 1, {0}, {2, 3}, {0, 1, 1, 0, 1, 1}},
    {"any", 1, {1}, {4, 3}, {0, 0, 1, 0, 1, 1, 0, 1, 1, 0, 1, 1}},
    {"all", 1, {1}, {4, 3}, {0, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 1}},
    {"any", 1, {2}, {4, 2}, {0, 1, 1, 0, 0, 1, 1, 0}},
    {"all", 1, {2}, {4, 2}, {0, 1, 1, 0, 1, 1, 1, 1}},
    {"any", 1, {-1}, {4, 2}, {0, 1, 1, 0, 0, 1, 1, 0}},
    {"all", 1, {-1}, {4, 2}, {0, 1, 1, 0, 1, 1, 1, 1}},
    {"any", 1, {0, 1}, {3}, {0, 1, 1}},
    {"all", 1, {0, 1}, {3}, {0, 1, 1}},
    {"any", 1, {0, 2}, {2}, {1, 1}},
    {"all", 1, {0, 2}, {2}, {0, 0}},
    {"any", 1, {1, 2}, {4}, {1, 1, 1, 1}},
    {"all", 1, {1, 2}, {4}, {0, 0, 1, 1}},
    {"any", 1, {-3, -1}, {2}, {1, 1}},
    {"all", 1, {-3, -1}, {2}, {0, 0}},
    {"any", 1, {0, 1, 2}, {}, {1}},
    {"all", 1, {0, 1, 2}, {}, {0}},
    {"any", 2, {}, {}, {1}},
    {"all", 2, {}, {}, {0}},
    {"any", 2, {0}, {2, 4}, {0, 0, 0, 0, 1, 1, 1, 1}},
    {"all", 2, {0}, {2, 4}, {1, 1, 0, 0, 1, 1, 1, 1}},
    {"any", 2, {1}, {2, 4}, {1, 0, 1, 0, 0, 1, 0, 1}},
    {"all", 2, {1}, {2, 4}, {1, 1, 1, 0, 1, 1, 0, 1}},
    {"any", 2, {2}, {2, 2}, {0, 1, 0, 1}},
    {"all", 2, {2}, {2, 2}, {0, 1, 0, 1}},
    {"any", 2, {-1}, {2, 2}, {0, 1, 0, 1}},
    {"all", 2, {-1}, {2, 2}, {0, 1, 0, 1}},
    {"any", 2, {0, 1}, {4}, {1, 1, 1, 1}},
    {"all", 2, {0, 1}, {4}, {1, 1, 0, 0}},
    {"any", 2, {0, 2}, {2}, {0, 1}},
    {"all", 2, {0, 2}, {2}, {0, 1}},
    {"any", 2, {1, 2}, {2}, {1, 1}},
    {"all", 2, {1, 2}, {2}, {0, 0}},
    {"any", 2, {-3, -1}, {2}, {0, 1}},
    {"all", 2, {-3, -1}, {2}, {0, 1}},
    {"any", 2, {0, 1, 2}, {}, {1}},
    {"all", 2, {0, 1, 2}, {}, {0}},
};

TEST(Reduce, AnyAllTable) {
  const Tensor base = tensor(kRedX, Shape{2, 3, 4});
  for (const BoolCase& c : kAnyAll) {
    const Tensor x = red_view(base, c.view);
    const bool is_any = std::string(c.op) == "any";
    const Tensor p = is_any ? (x > 1) : (x > -2.9);
    const std::string what = std::string(c.op) + " view " + std::to_string(c.view) + " axes " +
                             Shape(c.axes).to_string();
    const Tensor y = is_any ? any(p, c.axes) : all(p, c.axes);
    EXPECT_EQ(y.dtype(), bool_) << what;
    EXPECT_EQ(y.shape(), Shape(c.shape)) << what;
    EXPECT_EQ(y.to_vector<int64_t>(), c.want) << what;
    const Tensor k = is_any ? any(p, c.axes, true) : all(p, c.axes, true);
    EXPECT_EQ(k.shape(), kept_shape(x.shape(), c.axes)) << what;
  }
  // Numeric inputs count non-zero values.
  EXPECT_EQ(any(tensor({0, 0, 3})).item<bool>(), true);
  EXPECT_EQ(all(tensor({0.0f, 1.0f})).item<bool>(), false);
  EXPECT_EQ(all(tensor({NAN, 1.0f})).item<bool>(), true);
}

TEST(Reduce, IntegerDtypes) {
  // [[1, 2, 3], [4, 5, 6]] in every integer dtype: sums and products keep the dtype.
  for (DType d : {uint8, uint32, int32, int64}) {
    const Tensor x = as(d, {1, 2, 3, 4, 5, 6}, Shape{2, 3});
    const std::string n(dtype_name(d));
    EXPECT_EQ(sum(x).dtype(), d) << n;
    expect_values(sum(x), {21}, n);
    expect_values(sum(x, {0}), {5, 7, 9}, n);
    expect_values(sum(x, {-1}), {6, 15}, n);
    expect_values(sum(transpose(x), {0}), {6, 15}, n);
    expect_values(prod(x, {1}), {6, 120}, n);
    expect_values(prod(x), {d == uint8 ? 720.0 - 512 : 720.0}, n);  // u8 wraps mod 256
    expect_values(max(x, {0}), {4, 5, 6}, n);
    expect_values(min(x, {1}), {1, 4}, n);
    expect_values(max(x), {6}, n);
    EXPECT_EQ(argmax(x).item<int64_t>(), 5) << n;
    EXPECT_EQ(argmin(x, 1).to_vector<int64_t>(), (I64{0, 0})) << n;
    // mean and var of integers compute in f32: numpy np.mean(x, 1) = [2, 5], np.var = 2/3.
    EXPECT_EQ(mean(x, {1}).dtype(), float32) << n;
    expect_values(mean(x, {1}), {2, 5}, n);
    expect_allclose(var(x, {1}), {2.0 / 3, 2.0 / 3}, {.rtol = 1e-6, .atol = 0}, "var " + n);
    expect_allclose(var(x, {1}, false, 1), {1, 1}, {.rtol = 1e-6, .atol = 0}, "var ddof " + n);
  }
  // Signed: negative values and extremes.
  const Tensor s = tensor({-5, 3, -7, 2});
  expect_values(max(s), {3});
  expect_values(min(s), {-7});
  expect_values(sum(s), {-7});
  expect_values(prod(s), {210});
  // int32 sums wrap in the output dtype (accumulated in 64 bits, like JAX's int32 sum).
  const int32_t mx = std::numeric_limits<int32_t>::max();
  EXPECT_EQ(sum(tensor({mx, 1})).to_vector<int32_t>()[0], std::numeric_limits<int32_t>::min());
  EXPECT_EQ(max(tensor({int64_t{-1}, std::numeric_limits<int64_t>::min()})).item<int64_t>(), -1);
  EXPECT_EQ(min(tensor(std::vector<unsigned>{4000000000u, 7u}, Shape{2})).item<int64_t>(), 7);
  // Bool: sum counts trues (int64), like numpy; max/min work on 0/1.
  const Tensor b = tensor({true, false, true, true}, Shape{2, 2});
  EXPECT_EQ(sum(b).dtype(), int64);
  expect_values(sum(b), {3});
  expect_values(sum(b, {0}), {2, 1});
  EXPECT_EQ(argmax(tensor({false, true, true})).item<int64_t>(), 1);
  expect_values(mean(b), {0.75});
}

TEST(Reduce, MultipleAxesOrderAndNegative) {
  const Tensor x = as(float64, kRedX, Shape{2, 3, 4});
  // Axes may come in any order, negative or not.
  expect_values(sum(x, {2, 0}), sum(x, {0, -1}).to_vector<double>());
  expect_values(sum(x, {-3, -2, -1}), sum(x).to_vector<double>());
  // Reducing nothing: axes {} means all, so a 0-d input stays as it is.
  const Tensor s = tensor(2.5f);
  EXPECT_EQ(sum(s).item<float>(), 2.5f);
  EXPECT_EQ(sum(s).rank(), 0);
  EXPECT_EQ(max(s).item<float>(), 2.5f);
  EXPECT_EQ(mean(s).item<float>(), 2.5f);
  EXPECT_EQ(argmax(s).item<int64_t>(), 0);
  EXPECT_EQ(sum(s, {}, true).rank(), 0);
  expect_error([&] { (void)sum(x, {1, -2}); }, "reduce_sum", {"repeated axis"});
}

TEST(Reduce, EmptyInputs) {
  const Tensor e = zeros(Shape{0, 3});
  // numpy: np.zeros((0, 3)).sum(0) -> [0, 0, 0]; .prod(0) -> [1, 1, 1]; .sum(1) -> []
  expect_values(sum(e, {0}), {0, 0, 0});
  expect_values(prod(e, {0}), {1, 1, 1});
  EXPECT_EQ(sum(e, {1}).shape(), (Shape{0}));
  EXPECT_EQ(sum(e).item<float>(), 0.0f);
  EXPECT_EQ(max(e, {1}).shape(), (Shape{0}));  // nothing is reduced over an empty axis
  // numpy: np.zeros((0, 3)).mean(0) -> [nan, nan, nan]
  expect_rounded(mean(e, {0}), {NAN, NAN, NAN}, "mean empty");
  EXPECT_EQ(any(zeros(Shape{0}, bool_)).item<bool>(), false);
  EXPECT_EQ(all(zeros(Shape{0}, bool_)).item<bool>(), true);
  // Reductions without an identity refuse empty axes.
  EXPECT_THROW((void)max(e, {0}), Error);
  EXPECT_THROW((void)min(e), Error);
  EXPECT_THROW((void)argmax(e, 0), Error);
  EXPECT_THROW((void)argmin(zeros(Shape{0})), Error);
}

TEST(Reduce, NaN) {
  // numpy: np.max([[1, nan, 3], [4, 5, 6]], 1) -> [nan, 6]; np.min alike -> [nan, 4];
  // np.argmax([1, nan, 3]) -> 1 (the first NaN); np.sum -> nan.
  for (DType d : kFloats) {
    const Tensor x = as(d, {1, NAN, 3, 4, 5, 6}, Shape{2, 3});
    expect_rounded(max(x, {1}), {NAN, 6}, "max nan");
    expect_rounded(min(x, {1}), {NAN, 4}, "min nan");
    expect_rounded(max(x, {0}), {4, NAN, 6}, "max nan axis 0");
    expect_rounded(max(x), {NAN}, "max nan all");
    expect_rounded(sum(x, {1}), {NAN, 15}, "sum nan");
    EXPECT_EQ(argmax(x, 1).to_vector<int64_t>(), (I64{1, 2})) << d;
    EXPECT_EQ(argmin(x, 1).to_vector<int64_t>(), (I64{1, 0})) << d;
    EXPECT_EQ(argmax(as(d, {NAN, 7, NAN})).item<int64_t>(), 0) << d;
    // NaN in the first and the last position, reduced over a non-contiguous axis.
    const Tensor t = transpose(as(d, {1, 2, 3, NAN}, Shape{2, 2}));  // [[1, 3], [2, nan]]
    expect_rounded(max(t, {1}), {3, NAN}, "max nan T");
    expect_rounded(min(t, {0}), {1, NAN}, "min nan T");
  }
}

TEST(Reduce, LogsumexpStability) {
  // numpy: 1000 + np.log(2) = 1000.6931471805599; -inf stays -inf; +inf gives inf.
  expect_allclose(logsumexp(tensor({1000.0f, 1000.0f})), {1000.6931471805599},
                  {.rtol = 1e-6, .atol = 0}, "lse big");
  expect_allclose(logsumexp(tensor({-1000.0, -1000.0})), {-999.3068528194401},
                  {.rtol = 1e-12, .atol = 0}, "lse neg");
  expect_rounded(logsumexp(tensor({-INFINITY, -INFINITY})), {-INFINITY}, "lse -inf");
  expect_rounded(logsumexp(tensor({INFINITY, 1.0f})), {INFINITY}, "lse inf");
  expect_rounded(logsumexp(tensor({-INFINITY, 0.0f})), {0.0}, "lse -inf and 0");
  const Tensor k = logsumexp(tensor({1000.0, 1000.0, 0.0, 0.0}, Shape{2, 2}), {1}, true);
  EXPECT_EQ(k.shape(), (Shape{2, 1}));
  expect_allclose(k, {1000.6931471805599, 0.6931471805599453}, {.rtol = 1e-12, .atol = 0},
                  "lse keepdims");
  EXPECT_EQ(logsumexp(tensor({1, 2})).dtype(), float32);
}

// ---- softmax ---------------------------------------------------------------------------

TEST(Softmax, StableAtLargeLogits) {
  // numpy (float64): e = np.exp(x - x.max(-1, keepdims=True)); e / e.sum(-1, keepdims=True)
  // for x = [[1, 2, 3], [1000, 1001, 1002], [-1000, -999, -998], [0.5, -0.5, 0.25]].
  const D x = {1, 2, 3, 1000, 1001, 1002, -1000, -999, -998, 0.5, -0.5, 0.25};
  const D sm = {0.09003057317038043, 0.24472847105479767, 0.6652409557748218,  0.09003057317038043,
                0.24472847105479767, 0.6652409557748218,  0.09003057317038043, 0.24472847105479767,
                0.6652409557748218,  0.465835567266526,   0.17137132816379144, 0.36279310456968256};
  const D lsm = {-2.4076059644443806, -1.4076059644443804, -0.40760596444438035,
                 -2.4076059644443806, -1.4076059644443804, -0.40760596444438035,
                 -2.4076059644443806, -1.4076059644443804, -0.40760596444438035,
                 -0.7639225670692869, -1.7639225670692869, -1.0139225670692869};
  for (DType d : {float32, float64}) {
    const Tensor t = as(d, x, Shape{4, 3});
    const Tensor s = softmax(t);
    EXPECT_EQ(s.dtype(), d);
    EXPECT_EQ(s.shape(), (Shape{4, 3}));
    expect_allclose(s, sm, {.rtol = rtol(d) * 2, .atol = 1e-7}, "softmax");
    const Tensor l = log_softmax(t, -1);
    // x - logsumexp(x) near 1000 loses what float32 cannot hold of 1002.4 (ulp 6.1e-5).
    expect_allclose(l, lsm, {.rtol = rtol(d) * 4, .atol = d == float32 ? 1.2e-4 : 1e-9},
                    "log_softmax");
    expect_allclose(sum(s, {1}), {1, 1, 1, 1}, {.rtol = 1e-6, .atol = 0}, "softmax rows sum to 1");
    // The same along axis 0 of the transpose (a non-contiguous input).
    expect_allclose(transpose(softmax(transpose(t), 0)), sm, {.rtol = rtol(d) * 2, .atol = 1e-7},
                    "softmax axis 0");
  }
  // 16-bit inputs at large logits (exact in both formats): still finite and normalised.
  // numpy: softmax([992, 996, 1000]) in float64.
  for (DType d : {float16, bfloat16}) {
    const Tensor s = softmax(as(d, {992, 996, 1000}));
    EXPECT_EQ(s.dtype(), d);
    expect_rounded(s, {0.0003293204389638929, 0.017980286735531543, 0.9816903928255046},
                   "softmax 16");
  }
}

TEST(Softmax, OtherAxes) {
  // numpy: the same formulas along axis 0 of [[1, 2], [3, 4], [0.5, -1]].
  const Tensor y = tensor({1.0, 2.0, 3.0, 4.0, 0.5, -1.0}, Shape{3, 2});
  expect_allclose(softmax(y, 0),
                  {0.11116562230242114, 0.11849965453500959, 0.821409019465126, 0.8756005950630877,
                   0.06742535823245294, 0.0058997504019027815},
                  {.rtol = 1e-12, .atol = 1e-15}, "softmax axis 0");
  expect_allclose(log_softmax(y, -2),
                  {-2.196734096919617, -2.132845233727575, -0.19673409691961694,
                   -0.13284523372757537, -2.696734096919617, -5.132845233727576},
                  {.rtol = 1e-12, .atol = 1e-15}, "log_softmax axis -2");
  // Integer inputs compute in f32.
  const Tensor si = softmax(tensor({0, 0}));
  EXPECT_EQ(si.dtype(), float32);
  expect_values(si, {0.5, 0.5});
}

// ---- shape ops -------------------------------------------------------------------------

struct ShapeCase {
  const char* expr;
  Tensor (*fn)(const Tensor&);
  I64 shape;
  I64 want;
};
// numpy, x = np.arange(24).reshape(2, 3, 4): the numpy spelling of each expression
// (x.T, x.transpose(...), np.swapaxes, np.moveaxis, np.flip, x[...] slicing, np.broadcast_to,
// np.concatenate, np.stack, np.pad(..., constant_values=...)).
const ShapeCase kShapeOps[] = {
    {"transpose(x)",
     [](const Tensor& x) { return transpose(x); },
     {4, 3, 2},
     {0, 12, 4, 16, 8, 20, 1, 13, 5, 17, 9, 21, 2, 14, 6, 18, 10, 22, 3, 15, 7, 19, 11, 23}},
    {"permute(x, {1, 2, 0})",
     [](const Tensor& x) {
       return permute(x, {1, 2, 0});
     },
     {3, 4, 2},
     {0, 12, 1, 13, 2, 14, 3, 15, 4, 16, 5, 17, 6, 18, 7, 19, 8, 20, 9, 21, 10, 22, 11, 23}},
    {"permute(x, {-1, 0, 1})",
     [](const Tensor& x) {
       return permute(x, {-1, 0, 1});
     },
     {4, 2, 3},
     {0, 4, 8, 12, 16, 20, 1, 5, 9, 13, 17, 21, 2, 6, 10, 14, 18, 22, 3, 7, 11, 15, 19, 23}},
    {"swapaxes(x, 0, 2)",
     [](const Tensor& x) { return swapaxes(x, 0, 2); },
     {4, 3, 2},
     {0, 12, 4, 16, 8, 20, 1, 13, 5, 17, 9, 21, 2, 14, 6, 18, 10, 22, 3, 15, 7, 19, 11, 23}},
    {"swapaxes(x, -1, 1)",
     [](const Tensor& x) { return swapaxes(x, -1, 1); },
     {2, 4, 3},
     {0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11, 12, 16, 20, 13, 17, 21, 14, 18, 22, 15, 19, 23}},
    {"moveaxis(x, 0, -1)",
     [](const Tensor& x) { return moveaxis(x, 0, -1); },
     {3, 4, 2},
     {0, 12, 1, 13, 2, 14, 3, 15, 4, 16, 5, 17, 6, 18, 7, 19, 8, 20, 9, 21, 10, 22, 11, 23}},
    {"moveaxis(x, 2, 0)",
     [](const Tensor& x) { return moveaxis(x, 2, 0); },
     {4, 2, 3},
     {0, 4, 8, 12, 16, 20, 1, 5, 9, 13, 17, 21, 2, 6, 10, 14, 18, 22, 3, 7, 11, 15, 19, 23}},
    {"flip(x)",
     [](const Tensor& x) { return flip(x); },
     {2, 3, 4},
     {23, 22, 21, 20, 19, 18, 17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0}},
    {"flip(x, {1})",
     [](const Tensor& x) { return flip(x, {1}); },
     {2, 3, 4},
     {8, 9, 10, 11, 4, 5, 6, 7, 0, 1, 2, 3, 20, 21, 22, 23, 16, 17, 18, 19, 12, 13, 14, 15}},
    {"flip(x, {0, -1})",
     [](const Tensor& x) {
       return flip(x, {0, -1});
     },
     {2, 3, 4},
     {15, 14, 13, 12, 19, 18, 17, 16, 23, 22, 21, 20, 3, 2, 1, 0, 7, 6, 5, 4, 11, 10, 9, 8}},
    {"slice(x, {Slice{-1, std::nullopt, 1}, Slice{-2, std::nullopt, 1}})",
     [](const Tensor& x) {
       return slice(x, {Slice{-1, std::nullopt, 1}, Slice{-2, std::nullopt, 1}});
     },
     {1, 2, 4},
     {16, 17, 18, 19, 20, 21, 22, 23}},
    {"slice(x, {Slice{}, Slice{std::nullopt, std::nullopt, -1}, Slice{-1, 0, -2}})",
     [](const Tensor& x) {
       return slice(x, {Slice{}, Slice{std::nullopt, std::nullopt, -1}, Slice{-1, 0, -2}});
     },
     {2, 3, 2},
     {11, 9, 7, 5, 3, 1, 23, 21, 19, 17, 15, 13}},
    {"slice(x, {Slice{}, Slice{-100, 100, 2}, Slice{1, -1, 1}})",
     [](const Tensor& x) {
       return slice(x, {Slice{}, Slice{-100, 100, 2}, Slice{1, -1, 1}});
     },
     {2, 2, 2},
     {1, 2, 9, 10, 13, 14, 21, 22}},
    {"slice(x, {Slice{5, 7, 1}})",
     [](const Tensor& x) {
       return slice(x, {Slice{5, 7, 1}});
     },
     {0, 3, 4},
     {}},
    {"slice(x, {Slice{}, Slice{2, 0, 1}})",
     [](const Tensor& x) {
       return slice(x, {Slice{}, Slice{2, 0, 1}});
     },
     {2, 0, 4},
     {}},
    {"slice(x, {Slice{}, Slice{}, Slice{-1, -5, -1}})",
     [](const Tensor& x) {
       return slice(x, {Slice{}, Slice{}, Slice{-1, -5, -1}});
     },
     {2, 3, 4},
     {3, 2, 1, 0, 7, 6, 5, 4, 11, 10, 9, 8, 15, 14, 13, 12, 19, 18, 17, 16, 23, 22, 21, 20}},
    {"slice(x, {Slice{}, Slice{}, Slice{2, -10, -3}})",
     [](const Tensor& x) {
       return slice(x, {Slice{}, Slice{}, Slice{2, -10, -3}});
     },
     {2, 3, 1},
     {2, 6, 10, 14, 18, 22}},
    {"index(x, -1)",
     [](const Tensor& x) { return index(x, -1); },
     {3, 4},
     {12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23}},
    {"index(index(x, 1), -2)",
     [](const Tensor& x) { return index(index(x, 1), -2); },
     {4},
     {16, 17, 18, 19}},
    {"broadcast_to(index(x, 0), Shape{2, 3, 4})",
     [](const Tensor& x) {
       return broadcast_to(index(x, 0), Shape{2, 3, 4});
     },
     {2, 3, 4},
     {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}},
    {"concatenate({x, x}, 1)",
     [](const Tensor& x) {
       return concatenate({x, x}, 1);
     },
     {2, 6, 4},
     {0,  1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 0,  1,  2,  3,
      4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14, 15, 16, 17, 18, 19,
      20, 21, 22, 23, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23}},
    {"concatenate({x, flip(x, {2})}, -1)",
     [](const Tensor& x) {
       return concatenate({x, flip(x, {2})}, -1);
     },
     {2, 3, 8},
     {0,  1,  2,  3,  3,  2,  1,  0,  4,  5,  6,  7,  7,  6,  5,  4,
      8,  9,  10, 11, 11, 10, 9,  8,  12, 13, 14, 15, 15, 14, 13, 12,
      16, 17, 18, 19, 19, 18, 17, 16, 20, 21, 22, 23, 23, 22, 21, 20}},
    {"concatenate({index(x, 0), flip(index(x, 1), {0})}, 0)",
     [](const Tensor& x) {
       return concatenate({index(x, 0), flip(index(x, 1), {0})}, 0);
     },
     {6, 4},
     {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 20, 21, 22, 23, 16, 17, 18, 19, 12, 13, 14, 15}},
    {"stack({index(x, 0), index(x, 1)}, 1)",
     [](const Tensor& x) {
       return stack({index(x, 0), index(x, 1)}, 1);
     },
     {3, 2, 4},
     {0, 1, 2, 3, 12, 13, 14, 15, 4, 5, 6, 7, 16, 17, 18, 19, 8, 9, 10, 11, 20, 21, 22, 23}},
    {"stack({index(x, 0), index(x, 1)}, -1)",
     [](const Tensor& x) {
       return stack({index(x, 0), index(x, 1)}, -1);
     },
     {3, 4, 2},
     {0, 12, 1, 13, 2, 14, 3, 15, 4, 16, 5, 17, 6, 18, 7, 19, 8, 20, 9, 21, 10, 22, 11, 23}},
    {"pad(x, {{0, 1}, {1, 0}, {2, 1}}, 99.0)",
     [](const Tensor& x) {
       return pad(x, {{0, 1}, {1, 0}, {2, 1}}, 99.0);
     },
     {3, 4, 7},
     {99, 99, 99, 99, 99, 99, 99, 99, 99, 0,  1,  2,  3,  99, 99, 99, 4,  5,  6,  7,  99,
      99, 99, 8,  9,  10, 11, 99, 99, 99, 99, 99, 99, 99, 99, 99, 99, 12, 13, 14, 15, 99,
      99, 99, 16, 17, 18, 19, 99, 99, 99, 20, 21, 22, 23, 99, 99, 99, 99, 99, 99, 99, 99,
      99, 99, 99, 99, 99, 99, 99, 99, 99, 99, 99, 99, 99, 99, 99, 99, 99, 99, 99, 99, 99}},
    {"pad(permute(x, {2, 0, 1}), {{1, 1}, {0, 0}, {0, 2}})",
     [](const Tensor& x) {
       return pad(permute(x, {2, 0, 1}), {{1, 1}, {0, 0}, {0, 2}});
     },
     {6, 2, 5},
     {0, 0, 0,  0, 0, 0,  0,  0,  0, 0, 0, 4, 8,  0, 0, 12, 16, 20, 0, 0,
      1, 5, 9,  0, 0, 13, 17, 21, 0, 0, 2, 6, 10, 0, 0, 14, 18, 22, 0, 0,
      3, 7, 11, 0, 0, 15, 19, 23, 0, 0, 0, 0, 0,  0, 0, 0,  0,  0,  0, 0}},
};

TEST(ShapeOps, TableEveryDtype) {
  for (const ShapeCase& c : kShapeOps) {
    for (DType d : {int64, int32, float32, float64, float16, bfloat16, uint8, uint32}) {
      const Tensor x = reshape(arange(24, d), Shape{2, 3, 4});
      const Tensor y = c.fn(x);
      EXPECT_EQ(y.dtype(), d) << c.expr;
      EXPECT_EQ(y.shape(), Shape(c.shape)) << c.expr << " " << d;
      EXPECT_EQ(y.to_vector<int64_t>(), c.want) << c.expr << " " << d;
    }
  }
  // bool through the same views.
  const Tensor xb = reshape(tensor({true, false, false, true, true, false}), Shape{2, 3});
  EXPECT_EQ(transpose(xb).to_vector<bool>(), (B{1, 1, 0, 1, 0, 0}));
  EXPECT_EQ(flip(xb, {1}).to_vector<bool>(), (B{0, 0, 1, 0, 1, 1}));
  EXPECT_EQ(concatenate({xb, xb}, 0).to_vector<bool>(), (B{1, 0, 0, 1, 1, 0, 1, 0, 0, 1, 1, 0}));
  EXPECT_EQ(pad(xb, {{0, 0}, {1, 0}}, 1.0).to_vector<bool>(), (B{1, 1, 0, 0, 1, 1, 1, 0}));
}

TEST(ShapeOps, ViewsShareStorage) {
  const Tensor x = reshape(arange(24), Shape{2, 3, 4});
  for (const Tensor& v :
       {transpose(x), permute(x, {1, 0, 2}), swapaxes(x, 0, 1), moveaxis(x, 0, 2),
        broadcast_to(x, Shape{5, 2, 3, 4}), expand_dims(x, 1), squeeze(expand_dims(x, 0)),
        slice(x, {Slice{1, 2, 1}, Slice{std::nullopt, std::nullopt, -2}}), index(x, 1),
        flip(x, {0, 2}), split(x, 2, 2)[1], split(x, std::vector<int64_t>{1}, 1)[0],
        reshape(x, Shape{-1})})
    EXPECT_TRUE(v.shares_storage_with(x)) << v.type();
  for (const Tensor& c : {concatenate({x, x}, 0), stack({x, x}), pad(x, {{0, 0}, {0, 0}, {1, 1}})})
    EXPECT_FALSE(c.shares_storage_with(x)) << c.type();
}

TEST(ShapeOps, ReshapeWithInferredDim) {
  const Tensor x = arange(12);
  EXPECT_EQ(reshape(x, Shape{3, -1}).shape(), (Shape{3, 4}));
  EXPECT_EQ(reshape(x, Shape{-1, 6}).shape(), (Shape{2, 6}));
  EXPECT_EQ(reshape(x, Shape{2, -1, 3}).shape(), (Shape{2, 2, 3}));
  EXPECT_EQ(reshape(reshape(x, Shape{3, 4}), Shape{-1}).shape(), (Shape{12}));
  EXPECT_EQ(reshape(x, Shape{2, -1, 3}).to_vector<int64_t>(), x.to_vector<int64_t>());
  EXPECT_EQ(reshape(tensor(5), Shape{1, 1}).shape(), (Shape{1, 1}));
  EXPECT_EQ(reshape(tensor({5}), Shape{}).rank(), 0);
  EXPECT_EQ(reshape(zeros(Shape{0, 4}), Shape{4, 0}).shape(), (Shape{4, 0}));
  expect_error([&] { (void)reshape(x, Shape{-1, -1}); }, "reshape", {"-1"});
  expect_error([&] { (void)reshape(x, Shape{5, -1}); }, "reshape", {"i64[12]", "[5, -1]"});
  expect_error(
      [&] {
        (void)reshape(x, Shape{5, 2});
      },
      "reshape", {"i64[12]", "[5, 2]", "12 elements", "10 elements"});
}

TEST(ShapeOps, TransposeFamily) {
  const Tensor m = tensor({1, 2, 3, 4, 5, 6}, Shape{2, 3});
  EXPECT_EQ(transpose(m).to_vector<int32_t>(), (std::vector<int32_t>{1, 4, 2, 5, 3, 6}));
  EXPECT_EQ(transpose(m, {0, 1}).to_vector<int32_t>(), m.to_vector<int32_t>());
  EXPECT_EQ(transpose(tensor(3)).rank(), 0);
  EXPECT_EQ(transpose(tensor({1, 2})).shape(), (Shape{2}));
  EXPECT_EQ(swapaxes(m, 0, -1).shape(), (Shape{3, 2}));
  EXPECT_EQ(moveaxis(m, -1, 0).to_vector<int32_t>(), (std::vector<int32_t>{1, 4, 2, 5, 3, 6}));
  // Transposing twice gives back the values.
  EXPECT_EQ(transpose(transpose(m)).to_vector<int32_t>(), m.to_vector<int32_t>());
  EXPECT_THROW((void)transpose(m, {0, 0}), Error);
  EXPECT_THROW((void)transpose(m, {0}), Error);
  EXPECT_THROW((void)permute(m, {0, 1, 2}), Error);
  expect_error([&] { (void)swapaxes(m, 0, 2); }, "swapaxes", {"axis 2", "rank 2"});
}

TEST(ShapeOps, BroadcastExpandSqueeze) {
  const Tensor c = tensor({1, 2}, Shape{2, 1});
  EXPECT_EQ(broadcast_to(c, Shape{3, 2, 4}).to_vector<int32_t>(),
            (std::vector<int32_t>{1, 1, 1, 1, 2, 2, 2, 2, 1, 1, 1, 1,
                                  2, 2, 2, 2, 1, 1, 1, 1, 2, 2, 2, 2}));
  EXPECT_EQ(broadcast_to(tensor(7), Shape{2}).to_vector<int32_t>(), (std::vector<int32_t>{7, 7}));
  EXPECT_EQ(broadcast_to(c, Shape{2, 0}).numel(), 0);
  expect_error([&] { (void)broadcast_to(c, Shape{3, 3}); }, "broadcast_to", {"i32[2,1]", "[3, 3]"});
  expect_error([&] { (void)broadcast_to(c, Shape{2}); }, "broadcast_to", {"i32[2,1]", "[2]"});
  EXPECT_EQ(expand_dims(c, 0).shape(), (Shape{1, 2, 1}));
  EXPECT_EQ(expand_dims(c, 2).shape(), (Shape{2, 1, 1}));
  EXPECT_EQ(expand_dims(c, -3).shape(), (Shape{1, 2, 1}));
  EXPECT_EQ(expand_dims(tensor(1), 0).shape(), (Shape{1}));
  EXPECT_THROW((void)expand_dims(c, 3), Error);
  EXPECT_EQ(squeeze(c).shape(), (Shape{2}));
  EXPECT_EQ(squeeze(c, {1}).shape(), (Shape{2}));
  EXPECT_EQ(squeeze(tensor({4}, Shape{1, 1})).rank(), 0);
  expect_error([&] { (void)squeeze(c, {0}); }, "squeeze", {"axis 0", "size 2", "i32[2,1]"});
}

TEST(ShapeOps, SliceEdgeCases) {
  const Tensor v = arange(10);
  auto vals = [](const Tensor& t) { return t.to_vector<int64_t>(); };
  // numpy: a = np.arange(10); each expression written next to it.
  EXPECT_EQ(vals(slice(v, {Slice{std::nullopt, std::nullopt, -1}})),
            (I64{9, 8, 7, 6, 5, 4, 3, 2, 1, 0}));                             // a[::-1]
  EXPECT_EQ(vals(slice(v, {Slice{-3, std::nullopt, 1}})), (I64{7, 8, 9}));    // a[-3:]
  EXPECT_EQ(vals(slice(v, {Slice{std::nullopt, -7, 1}})), (I64{0, 1, 2}));    // a[:-7]
  EXPECT_EQ(vals(slice(v, {Slice{-2, -8, -2}})), (I64{8, 6, 4}));             // a[-2:-8:-2]
  EXPECT_EQ(vals(slice(v, {Slice{8, 2, -3}})), (I64{8, 5}));                  // a[8:2:-3]
  EXPECT_EQ(vals(slice(v, {Slice{2, 8, 3}})), (I64{2, 5}));                   // a[2:8:3]
  EXPECT_EQ(vals(slice(v, {Slice{1, 100, 4}})), (I64{1, 5, 9}));              // a[1:100:4]
  EXPECT_EQ(vals(slice(v, {Slice{100, std::nullopt, -4}})), (I64{9, 5, 1}));  // a[100::-4]
  EXPECT_EQ(vals(slice(v, {Slice{std::nullopt, -100, -1}})).size(), 10u);     // a[:-100:-1]
  EXPECT_EQ(vals(slice(v, {Slice{-100, 2, 1}})), (I64{0, 1}));                // a[-100:2]
  EXPECT_TRUE(vals(slice(v, {Slice{5, 5, 1}})).empty());                      // a[5:5]
  EXPECT_TRUE(vals(slice(v, {Slice{7, 3, 1}})).empty());                      // a[7:3]
  EXPECT_TRUE(vals(slice(v, {Slice{3, 7, -1}})).empty());                     // a[3:7:-1]
  EXPECT_EQ(vals(slice(v, {Slice{0, 1, -1}})), (I64{}));                      // a[0:1:-1]
  EXPECT_EQ(vals(slice(v, {Slice{1, std::nullopt, -1}})), (I64{1, 0}));       // a[1::-1]
  // Slicing a slice (a view of a view): a[::-1][1::3] -> [8, 5, 2]
  EXPECT_EQ(
      vals(slice(slice(v, {Slice{std::nullopt, std::nullopt, -1}}), {Slice{1, std::nullopt, 3}})),
      (I64{8, 5, 2}));
  // Empty and 0-d inputs.
  EXPECT_EQ(slice(zeros(Shape{0}), {Slice{1, 3, 1}}).numel(), 0);
  EXPECT_EQ(slice(tensor(3), {}).item<int32_t>(), 3);
  expect_error([&] { (void)slice(v, {Slice{0, 5, 0}}); }, "slice", {"zero step"});
  expect_error([&] { (void)slice(v, {Slice{}, Slice{}}); }, "slice", {"i64[10]"});
}

TEST(ShapeOps, Index) {
  const Tensor m = reshape(arange(6), Shape{3, 2});
  EXPECT_EQ(index(m, 0).to_vector<int64_t>(), (I64{0, 1}));
  EXPECT_EQ(index(m, -1).to_vector<int64_t>(), (I64{4, 5}));
  EXPECT_EQ(index(index(m, 1), 1).item<int64_t>(), 3);
  EXPECT_EQ(index(index(m, 1), 1).rank(), 0);
  EXPECT_EQ(index(transpose(m), 1).to_vector<int64_t>(), (I64{1, 3, 5}));
  expect_error([&] { (void)index(m, 3); }, "index", {"index out of range", "3", "i64[3,2]"});
  expect_error([&] { (void)index(m, -4); }, "index", {"-4"});
  expect_error([&] { (void)index(tensor(1), 0); }, "index", {"0-d"});
}

TEST(ShapeOps, ConcatenateAndStack) {
  const Tensor a = tensor({1, 2, 3, 4}, Shape{2, 2}), b = tensor({5, 6}, Shape{1, 2});
  EXPECT_EQ(concatenate({a, b}).to_vector<int32_t>(), (std::vector<int32_t>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(concatenate({a, transpose(b)}, 1).to_vector<int32_t>(),
            (std::vector<int32_t>{1, 2, 5, 3, 4, 6}));
  // Mixed dtypes promote (numpy: np.concatenate([int32, float32]) -> float32 here).
  const Tensor m = concatenate({tensor({1, 2}), tensor({0.5f})});
  EXPECT_EQ(m.dtype(), float32);
  expect_values(m, {1, 2, 0.5});
  EXPECT_EQ(concatenate({a, zeros(Shape{0, 2}, int32)}).shape(), (Shape{2, 2}));
  EXPECT_EQ(concatenate({a}).to_vector<int32_t>(), a.to_vector<int32_t>());
  // Broadcast (stride-0) inputs copy their repeated values.
  EXPECT_EQ(concatenate({broadcast_to(tensor({9}), Shape{3}), tensor({1})}).to_vector<int32_t>(),
            (std::vector<int32_t>{9, 9, 9, 1}));
  expect_error(
      [&] {
        (void)concatenate({a, tensor({1, 2, 3})});
      },
      "concatenate", {"i32[2,2]", "i32[3]"});
  expect_error([&] { (void)concatenate({a, b}, 1); }, "concatenate", {"i32[2,2]", "i32[1,2]"});
  EXPECT_THROW((void)concatenate({}), Error);
  EXPECT_THROW((void)concatenate({tensor(1), tensor(2)}), Error);

  // numpy: np.stack([[1, 2], [3, 4]], axis=1) -> [[1, 3], [2, 4]]
  const Tensor s = stack({tensor({1, 2}), tensor({3, 4})}, 1);
  EXPECT_EQ(s.shape(), (Shape{2, 2}));
  EXPECT_EQ(s.to_vector<int32_t>(), (std::vector<int32_t>{1, 3, 2, 4}));
  EXPECT_EQ(stack({tensor(1), tensor(2), tensor(3)}).shape(), (Shape{3}));
  EXPECT_EQ(stack({a, a}, -1).shape(), (Shape{2, 2, 2}));
  expect_error([&] { (void)stack({a, b}); }, "stack", {"i32[2,2]", "i32[1,2]"});
}

TEST(ShapeOps, Split) {
  const Tensor x = arange(6);
  auto vals = [](const std::vector<Tensor>& ts) {
    std::vector<I64> out;
    for (const Tensor& t : ts) out.push_back(t.to_vector<int64_t>());
    return out;
  };
  // numpy: np.split(np.arange(6), 3) -> [[0, 1], [2, 3], [4, 5]]
  EXPECT_EQ(vals(split(x, 3)), (std::vector<I64>{{0, 1}, {2, 3}, {4, 5}}));
  // numpy: np.split(np.arange(6), [1, 4]) -> [[0], [1, 2, 3], [4, 5]]
  EXPECT_EQ(vals(split(x, {1, 4}, 0)), (std::vector<I64>{{0}, {1, 2, 3}, {4, 5}}));
  // numpy: np.split(np.arange(6), [0, 6]) -> [[], [0..5], []]
  EXPECT_EQ(vals(split(x, {0, 6}, 0)), (std::vector<I64>{{}, {0, 1, 2, 3, 4, 5}, {}}));
  // Python slice semantics for unsorted, negative and out-of-range indices:
  // numpy: np.split(np.arange(6), ind) for ind in [3, 1], [-2], [2, 100], [-100, 2]
  EXPECT_EQ(vals(split(x, {3, 1}, 0)), (std::vector<I64>{{0, 1, 2}, {}, {1, 2, 3, 4, 5}}));
  EXPECT_EQ(vals(split(x, std::vector<int64_t>{-2}, 0)), (std::vector<I64>{{0, 1, 2, 3}, {4, 5}}));
  EXPECT_EQ(vals(split(x, {2, 100}, 0)), (std::vector<I64>{{0, 1}, {2, 3, 4, 5}, {}}));
  EXPECT_EQ(vals(split(x, {-100, 2}, 0)), (std::vector<I64>{{}, {0, 1}, {2, 3, 4, 5}}));
  // numpy: np.split(np.arange(8).reshape(2, 4), 2, axis=1) -> [[[0, 1], [4, 5]], [[2, 3], [6, 7]]]
  const Tensor m = reshape(arange(8), Shape{2, 4});
  const std::vector<Tensor> cols = split(m, 2, -1);
  ASSERT_EQ(cols.size(), 2u);
  EXPECT_EQ(cols[0].shape(), (Shape{2, 2}));
  EXPECT_EQ(vals(cols), (std::vector<I64>{{0, 1, 4, 5}, {2, 3, 6, 7}}));
  // Splitting a transposed view: m.T is [[0, 4], [1, 5], [2, 6], [3, 7]]
  EXPECT_EQ(vals(split(transpose(m), std::vector<int64_t>{3}, 0)),
            (std::vector<I64>{{0, 4, 1, 5, 2, 6}, {3, 7}}));
  expect_error([&] { (void)split(x, 4); }, "split", {"4 sections", "i64[6]"});
  EXPECT_THROW((void)split(x, 0), Error);
  EXPECT_THROW((void)split(x, 2, 1), Error);
}

TEST(ShapeOps, FlipAndPad) {
  const Tensor m = tensor({1, 2, 3, 4, 5, 6}, Shape{2, 3});
  EXPECT_EQ(flip(m).to_vector<int32_t>(), (std::vector<int32_t>{6, 5, 4, 3, 2, 1}));
  EXPECT_EQ(flip(m, {-1}).to_vector<int32_t>(), (std::vector<int32_t>{3, 2, 1, 6, 5, 4}));
  EXPECT_EQ(flip(flip(m, {0}), {0}).to_vector<int32_t>(), m.to_vector<int32_t>());
  EXPECT_EQ(flip(tensor(2)).item<int32_t>(), 2);
  EXPECT_EQ(flip(zeros(Shape{0, 2})).shape(), (Shape{0, 2}));
  // Arithmetic on flipped (negative-stride) views.
  EXPECT_EQ(add(flip(m, {1}), m).to_vector<int32_t>(), (std::vector<int32_t>{4, 4, 4, 10, 10, 10}));
  // numpy: np.pad([[1, 2], [3, 4]], ((1, 0), (0, 2)), constant_values=9)
  //        -> [[9, 9, 9, 9], [1, 2, 9, 9], [3, 4, 9, 9]]
  const Tensor p = pad(tensor({1, 2, 3, 4}, Shape{2, 2}), {{1, 0}, {0, 2}}, 9);
  EXPECT_EQ(p.shape(), (Shape{3, 4}));
  EXPECT_EQ(p.to_vector<int32_t>(), (std::vector<int32_t>{9, 9, 9, 9, 1, 2, 9, 9, 3, 4, 9, 9}));
  expect_values(pad(tensor({1.5f}), {{2, 1}}, -0.5), {-0.5, -0.5, 1.5, -0.5});
  EXPECT_EQ(pad(zeros(Shape{0}), {{1, 1}}).shape(), (Shape{2}));
  EXPECT_EQ(pad(tensor(3), {}).item<int32_t>(), 3);
  expect_error([&] { (void)pad(m, {{1, 1}}); }, "pad", {"i32[2,3]"});
  expect_error([&] { (void)pad(m, {{0, 0}, {-1, 0}}); }, "pad", {"negative width"});
}

// ---- large tensors: the parallel and blocked code paths ---------------------------------

TEST(Large, ReductionsAndElementwiseMatchNaiveLoops) {
  // x[i, j, k] = ((flat * 37) % 101) - 50 over a [64, 48, 33] tensor (101376 elements, above
  // the parallel grain); expected values come from plain loops here.
  constexpr int64_t A = 64, Bn = 48, C = 33;
  std::vector<double> v(static_cast<std::size_t>(A * Bn * C));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>((i * 37) % 101) - 50;
  auto at = [&](int64_t i, int64_t j, int64_t k) {
    return v[static_cast<std::size_t>((i * Bn + j) * C + k)];
  };
  const Tensor x = tensor(v, Shape{A, Bn, C});
  for (DType d : {float64, float32, int64, int32}) {
    const Tensor xd = astype(x, d);
    const std::string n(dtype_name(d));
    // sum over axis 0 (kept inner axis: the blocked path), axis 2 (strided path), {0, 2}.
    D s0(static_cast<std::size_t>(Bn * C), 0), s2(static_cast<std::size_t>(A * Bn), 0),
        s02(static_cast<std::size_t>(Bn), 0), m1(static_cast<std::size_t>(A * C), -1e9);
    I64 am0(static_cast<std::size_t>(Bn * C), 0);
    D best0(static_cast<std::size_t>(Bn * C), -1e9);
    for (int64_t i = 0; i < A; ++i)
      for (int64_t j = 0; j < Bn; ++j)
        for (int64_t k = 0; k < C; ++k) {
          const double e = at(i, j, k);
          s0[static_cast<std::size_t>(j * C + k)] += e;
          s2[static_cast<std::size_t>(i * Bn + j)] += e;
          s02[static_cast<std::size_t>(j)] += e;
          double& m = m1[static_cast<std::size_t>(i * C + k)];
          m = std::max(m, e);
          if (e > best0[static_cast<std::size_t>(j * C + k)]) {
            best0[static_cast<std::size_t>(j * C + k)] = e;
            am0[static_cast<std::size_t>(j * C + k)] = i;
          }
        }
    expect_values(sum(xd, {0}), s0, "sum 0 " + n);
    expect_values(sum(xd, {2}), s2, "sum 2 " + n);
    expect_values(sum(xd, {0, 2}), s02, "sum 02 " + n);
    expect_values(max(xd, {1}), m1, "max 1 " + n);
    EXPECT_EQ(argmax(xd, 0).to_vector<int64_t>(), am0) << n;
    // The same through a permuted view: y = x.transpose(2, 0, 1); y.sum(1) == x.sum(0).T
    const Tensor y = permute(xd, {2, 0, 1});
    D s0t(s0.size());
    for (int64_t j = 0; j < Bn; ++j)
      for (int64_t k = 0; k < C; ++k)
        s0t[static_cast<std::size_t>(k * Bn + j)] = s0[static_cast<std::size_t>(j * C + k)];
    expect_values(sum(y, {1}), s0t, "sum permuted " + n);
    // Elementwise on a permuted view with a broadcast operand: y * w[j] + 1.
    const Tensor w = astype(arange(Bn), d);
    const D z = add(mul(y, w), ones(Shape{1}, d)).to_vector<double>();
    ASSERT_EQ(z.size(), v.size());
    bool ok = true;
    for (int64_t k = 0; k < C && ok; ++k)
      for (int64_t i = 0; i < A && ok; ++i)
        for (int64_t j = 0; j < Bn && ok; ++j) {
          const double want = at(i, j, k) * static_cast<double>(j) + 1;
          const double got = z[static_cast<std::size_t>((k * A + i) * Bn + j)];
          ok = got == want;
          EXPECT_EQ(got, want) << n << " at " << i << "," << j << "," << k;
        }
  }
  // A stepped, reversed slice into a unary op and a contiguous copy.
  const Tensor s = slice(x, {Slice{std::nullopt, std::nullopt, -3}, Slice{1, std::nullopt, 2}});
  const D got = abs(s).to_vector<double>();
  std::size_t p = 0;
  bool ok = true;
  for (int64_t i = A - 1; i >= 0 && ok; i -= 3)
    for (int64_t j = 1; j < Bn && ok; j += 2)
      for (int64_t k = 0; k < C && ok; ++k) {
        ok = got[p++] == std::fabs(at(i, j, k));
        EXPECT_TRUE(ok) << i << "," << j << "," << k;
      }
  EXPECT_EQ(p, got.size());
}

// ---- errors users see --------------------------------------------------------------------

TEST(Errors, AxisOutOfRange) {
  const Tensor x = zeros(Shape{2, 3});
  expect_error([&] { (void)sum(x, {3}); }, "reduce_sum", {"axis 3", "rank 2"});
  expect_error([&] { (void)max(x, {-3}); }, "reduce_max", {"axis -3", "rank 2"});
  expect_error([&] { (void)argmax(x, 2); }, "argmax", {"axis 2", "rank 2"});
  expect_error([&] { (void)softmax(x, 5); }, "softmax", {"axis 5", "rank 2"});
  expect_error([&] { (void)log_softmax(x, -3); }, "log_softmax", {"axis -3", "rank 2"});
  expect_error([&] { (void)logsumexp(x, {2}); }, "logsumexp", {"axis 2", "rank 2"});
  expect_error([&] { (void)flip(x, {2}); }, "flip", {"axis 2", "rank 2"});
  expect_error([&] { (void)concatenate({x, x}, -3); }, "concatenate", {"axis -3", "rank 2"});
  expect_error([&] { (void)split(x, 1, 4); }, "split", {"axis 4", "rank 2"});
  expect_error([&] { (void)x.dim(2); }, "dim", {"axis 2", "rank 2"});
}

TEST(Errors, BroadcastIncompatible) {
  const Tensor a = zeros(Shape{2, 3}), b = zeros(Shape{4});
  expect_error([&] { (void)add(a, b); }, "add", {"[2, 3]", "[4]"});
  expect_error([&] { (void)(a * b); }, "mul", {"[2, 3]", "[4]"});
  expect_error([&] { (void)less(a, b); }, "lt", {"[2, 3]", "[4]"});
  expect_error(
      [&] {
        (void)where(tensor({true, false, true, true}), a, a);
      },
      "where", {"[4]", "[2, 3]"});
  expect_error(
      [&] {
        (void)maximum(zeros(Shape{2, 1, 3}), zeros(Shape{4, 2}));
      },
      "max", {"[2, 1, 3]", "[4, 2]"});
}

TEST(Errors, ReshapeAndItem) {
  const Tensor x = zeros(Shape{2, 3});
  expect_error([&] { (void)reshape(x, Shape{4}); }, "reshape", {"f32[2,3]", "[4]"});
  expect_error([&] { (void)x.item<float>(); }, "item", {"f32[2,3]"});
  // Errors raised inside a primitive carry the caller's source line.
  try {
    (void)reshape(x, Shape{7});
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("test_ops.cpp"), std::string::npos) << e.what();
  }
}

TEST(Errors, IntegerDivisionByZero) {
  for (DType d : {uint8, uint32, int32, int64}) {
    const Tensor a = as(d, {1, 2, 3}), b = as(d, {1, 0, 1});
    expect_error([&] { (void)div(a, b); }, "div",
                 {"division by zero", std::string(dtype_name(d)) + "[3]"});
  }
  // A zero reached through broadcasting counts too; a 0-d divisor names its type.
  expect_error([&] { (void)div(tensor({1, 2}), tensor(0)); }, "div", {"division by zero"});
  expect_error([&] { (void)(tensor({1, 2}) / 0); }, "div", {"division by zero"});
  // Negative integer exponents have no integer answer.
  expect_error([&] { (void)pow(tensor({2}), tensor({-1})); }, "pow", {"negative", "i32[1]"});
  // Float division by zero is fine.
  EXPECT_NO_THROW((void)div(tensor({1.0f}), tensor({0.0f})));
}

TEST(Errors, DtypeDomains) {
  expect_error([&] { (void)bind1(primitive("exp"), {tensor({1})}); }, "exp",
               {"i32[1]", "floating"});
  expect_error(
      [&] {
        (void)bind1(primitive("add"), {tensor({1}), tensor({1.0f})});
      },
      "add", {"i32[1]", "f32[1]"});
  expect_error(
      [&] {
        (void)bind1(primitive("and"), {tensor({1}), tensor({1})});
      },
      "and", {"i32[1]", "bool"});
  expect_error(
      [&] {
        (void)bind1(primitive("reduce_and"), {tensor({1})}, {{"axes", Axes{0}}});
      },
      "reduce_and", {"i32[1]"});
}

}  // namespace

// Whole-tensor reductions of many elements take the split-across-threads path.
TEST(Reductions, WholeTensorOfManyElementsMatchesPlainLoops) {
  const int64_t n = 200'003;  // not a multiple of the chunk count or the unroll
  const std::vector<double> v = kiln::testing::random_values(n, 7, -1.0, 1.0);
  double s = 0, mx = -1e9, mn = 1e9, p = 1;
  for (double x : v) {
    s += x;
    mx = std::max(mx, x);
    mn = std::min(mn, x);
    p *= 1.0 + x * 1e-5;
  }
  const Tensor x = tensor(v, {n});
  EXPECT_NEAR(sum(x).item<double>(), s, 1e-9);
  EXPECT_NEAR(sum(astype(x, float32)).item<float>(), s, 1e-2);
  EXPECT_EQ(max(x).item<double>(), mx);
  EXPECT_EQ(min(x).item<double>(), mn);
  EXPECT_NEAR(prod(x * 1e-5 + 1.0).item<double>(), p, 1e-12);
  EXPECT_EQ(sum(astype(x > 0.0, int32)).item<int64_t>(),
            std::count_if(v.begin(), v.end(), [](double e) { return e > 0; }));
  // A strided view (every other element) and a NaN that must propagate.
  double s2 = 0;
  for (int64_t i = 0; i < n; i += 2) s2 += v[static_cast<std::size_t>(i)];
  EXPECT_NEAR(sum(slice(x, {Slice{std::nullopt, std::nullopt, 2}})).item<double>(), s2, 1e-9);
  std::vector<double> w = v;
  w[123'457] = NAN;
  EXPECT_TRUE(std::isnan(max(tensor(w, {n})).item<double>()));
  std::vector<bool> b(static_cast<std::size_t>(n), true);
  EXPECT_TRUE(all(tensor(b, {n})).item<bool>());
  b[199'999] = false;
  EXPECT_FALSE(all(tensor(b, {n})).item<bool>());
  EXPECT_TRUE(any(tensor(b, {n})).item<bool>());
}

// ---- numpy's names: gradients against float64 finite differences ----------------------------

namespace {

// A float64 [rows, cols] tensor of fixed values in (-1, 1).
Tensor values64(int64_t rows, int64_t cols, uint32_t seed) {
  return tensor(kiln::testing::random_values(rows * cols, seed), Shape{rows, cols});
}

void expect_gradient_matches(const std::function<Tensor(const Tensor&)>& f, const Tensor& x,
                             const std::string& what) {
  const D g = grad(f)(x).to_vector<double>(), n = kiln::testing::numeric_grad(f, x);
  ASSERT_EQ(g.size(), n.size());
  for (std::size_t i = 0; i < g.size(); ++i) EXPECT_NEAR(g[i], n[i], 1e-6) << what << " at " << i;
}

}  // namespace

TEST(NumpyNames, GradientsMatchFiniteDifferences) {
  const Tensor x = values64(3, 4, 5), w = values64(3, 4, 6), v = values64(2, 3, 7);
  const std::vector<std::pair<std::string, std::function<Tensor(const Tensor&)>>> fs{
      {"diff",
       [w](const Tensor& a) {
         return sum(diff(a, {.n = 2, .axis = 1}) * slice(w, {{}, Slice{0, 2}}));
       }},
      {"diff prepend",
       [](const Tensor& a) { return sum(square(diff(a, {.axis = 0, .prepend = a}))); }},
      {"cross",
       [v](const Tensor& a) {
         return sum(cross(slice(a, {Slice{0, 2}, Slice{0, 3}}), v) * v);
       }},
      {"cross axis 0",
       [v](const Tensor& a) {
         return sum(square(cross(slice(a, {Slice{0, 3}, Slice{0, 2}}), transpose(v), 0)));
       }},
      {"dot", [w](const Tensor& a) { return sum(square(dot(a, transpose(w)))); }},
      {"dot 3-d",
       [w](const Tensor& a) {
         return sum(dot(reshape(a, Shape{3, 2, 2}), reshape(w, Shape{2, 2, 3})));
       }},
      {"erfc", [w](const Tensor& a) { return sum(erfc(a * 2.0) * w); }},
      {"xlogy", [w](const Tensor& a) { return sum(xlogy(a, w + 1.5) + xlogy(w, a + 1.5)); }},
      {"logcumsumexp", [w](const Tensor& a) { return sum(logcumsumexp(a, 1) * w); }},
      {"nanvar", [](const Tensor& a) { return sum(nanvar(a, {1}, false, 1)); }},
      {"unique", [w](const Tensor& a) { return sum(unique(a, 12) * reshape(w, Shape{12})); }},
  };
  for (const auto& [what, f] : fs) expect_gradient_matches(f, x, what);
}

TEST(NumpyNames, NanReductionsIgnoreNaNsAndTheirGradientIsZeroThere) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  // Row 1 holds a NaN, row 2 only NaNs.
  const Tensor x = tensor(D{0.5, -1.0, 2.0, 3.0, nan, -0.25, nan, nan, nan}, Shape{3, 3});
  const std::vector<std::pair<std::string, std::function<Tensor(const Tensor&)>>> fs{
      {"nansum", [](const Tensor& a) { return nansum(a * 3.0, {1}); }},
      {"nanprod", [](const Tensor& a) { return nanprod(a, {1}); }},
      {"nanmean", [](const Tensor& a) { return nanmean(a, {1}); }},
      {"nanmax", [](const Tensor& a) { return nanmax(a, {1}); }},
      {"nanmin", [](const Tensor& a) { return nanmin(a, {1}); }},
      {"nanvar", [](const Tensor& a) { return nanvar(a, {1}); }},
      {"nanstd", [](const Tensor& a) { return nanstd(a, {1}); }},
  };
  for (const auto& [what, f] : fs) {
    // Rows 0 and 1 only: row 2 (all NaN) gives NaN (0 for nansum, 1 for nanprod).
    const auto rows01 = [f = f](const Tensor& a) { return sum(slice(f(a), {Slice{0, 2}})); };
    const D g = grad(rows01)(x).to_vector<double>();
    const D xs = x.to_vector<double>();
    for (std::size_t i = 0; i < xs.size(); ++i) {
      if (std::isnan(xs[i])) {
        EXPECT_EQ(g[i], 0.0) << what << " at " << i;
        continue;
      }
      // Central differences of the element's own row, NaNs held fixed.
      const double h = 1e-6;
      D p = xs, m = xs;
      p[i] += h;
      m[i] -= h;
      const double fd = (rows01(tensor(p, x.shape())).item<double>() -
                         rows01(tensor(m, x.shape())).item<double>()) /
                        (2 * h);
      EXPECT_NEAR(g[i], fd, 1e-6) << what << " at " << i;
    }
  }
}

TEST(NumpyNames, XlogyHasJaxDerivativeAtZero) {
  // d/dx x log y = log y and d/dy = x / y, also at x = 0 (where the value is 0 whatever y is).
  const Tensor x = tensor(D{0.0, 0.0, 2.0}), y = tensor(D{0.5, 0.0, 3.0});
  const Tensor value = xlogy(x, y);
  const D v = value.to_vector<double>();
  EXPECT_EQ(v[0], 0.0);
  EXPECT_EQ(v[1], 0.0);
  EXPECT_DOUBLE_EQ(v[2], 2.0 * std::log(3.0));
  const D dx = grad([&](const Tensor& a) { return sum(xlogy(a, y)); })(x).to_vector<double>();
  EXPECT_DOUBLE_EQ(dx[0], std::log(0.5));
  EXPECT_DOUBLE_EQ(dx[2], std::log(3.0));
  const D dy = grad([&](const Tensor& b) { return sum(xlogy(x, b)); })(tensor(D{0.5, 1.0, 3.0}))
                   .to_vector<double>();
  EXPECT_EQ(dy[0], 0.0);
  EXPECT_EQ(dy[1], 0.0);
  EXPECT_DOUBLE_EQ(dy[2], 2.0 / 3.0);
}

TEST(NumpyNames, Errors) {
  const Tensor x = zeros(Shape{2, 3}, float64);
  expect_error([&] { diff(x, {.n = -1}); }, "diff", {"negative order", "n=-1"});
  expect_error([&] { cross(x, x, 0); }, "cross", {"not of length 3", "f64[2,3]", "size 3"});
  expect_error([&] { cross(x, zeros(Shape{}, float64)); }, "cross", {"0-d operand"});
  expect_error([&] { unique(x, -2); }, "unique", {"negative size"});
  expect_error([&] { kiln::random::poisson(kiln::random::key(0), -1.0, Shape{2}); },
               "random_poisson", {"rate out of range", "lam=-1"});
  expect_error([&] { kiln::random::exponential(kiln::random::key(0), Shape{2}, int32); },
               "exponential", {"non-float dtype"});
}
