// The IR: tracing, printing, parsing, verifying, evaluating, and the DCE/CSE passes.
#include <gtest/gtest.h>
#include <kiln/ir.h>
#include <kiln/kiln.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>

#include "ir/partial_eval.h"
#include "testing.h"

namespace kiln {
namespace {

using Ts = std::vector<Tensor>;
using testing::expect_error;

ir::Traced trace_fx() {
  return ir::trace_function("f", {{float32, {3}}, {float32, {3}}},
                            [](const Ts& a) { return Ts{sum(sin(a[0]) * a[1])}; });
}

TEST(Ir, TracePrintsReadableText) {
  const std::string expected =
      "func @f(%a0: f32[3], %a1: f32[3]) -> f32[] {\n"
      "  %0 = sin %a0 : f32[3]\n"
      "  %1 = mul %0, %a1 : f32[3]\n"
      "  %2 = reduce_sum %1 {axes=[0]} : f32[]\n"
      "  return %2\n"
      "}";
  EXPECT_EQ(ir::print(*trace_fx().function), expected);
}

TEST(Ir, ParseRoundTripsAndComputesTheSame) {
  const auto f = trace_fx().function;
  const std::string text = ir::print(*f);
  const auto g = ir::parse(text);
  EXPECT_EQ(ir::print(*g), text);
  const Tensor x = tensor({0.5f, 1.f, 2.f}), y = tensor({1.f, -2.f, 3.f});
  const float got = ir::evaluate(*g, Ts{x, y})[0].item<float>();
  const float want = std::sin(0.5f) * 1.f + std::sin(1.f) * -2.f + std::sin(2.f) * 3.f;
  EXPECT_NEAR(got, want, 1e-6);
}

TEST(Ir, CapturedConcreteTensorsBecomeConstants) {
  const Tensor c = tensor({1.0, 2.0});
  const auto f = ir::trace_function("g", {{float64, {2}}}, [&](const Ts& a) {
                   return Ts{a[0] * c + 2.0};
                 }).function;
  const std::string text = ir::print(*f);
  EXPECT_NE(text.find("= const [1, 2] : f64[2]"), std::string::npos) << text;
  EXPECT_NE(text.find("= const 2 : f64[]"), std::string::npos) << text;
  const auto back = ir::parse(text);
  EXPECT_EQ(ir::evaluate(*back, Ts{tensor({3.0, 4.0})})[0].to_vector<double>(),
            (std::vector<double>{5.0, 10.0}));
}

TEST(Ir, NestedTraceClosureConvertsOuterValues) {
  std::shared_ptr<ir::Function> inner;
  std::size_t captures = 0;
  const auto outer = ir::trace_function("outer", {{float32, {2}}}, [&](const Ts& a) {
                       const Tensor y = exp(a[0]);
                       const ir::Traced t = ir::trace_function(
                           "inner", {{float32, {2}}}, [&](const Ts& b) { return Ts{b[0] * y}; });
                       inner = t.function;
                       captures = t.captures.size();
                       Ts args{a[0]};
                       args.insert(args.end(), t.captures.begin(), t.captures.end());
                       return ir::evaluate(*t.function, args);  // records into the outer trace
                     }).function;
  EXPECT_EQ(captures, 1u);
  ASSERT_EQ(inner->params.size(), 2u);  // declared x, then the captured y
  const Tensor x = tensor({0.f, 1.f});
  const std::vector<float> got = ir::evaluate(*outer, Ts{x})[0].to_vector<float>();
  EXPECT_NEAR(got[0], 0.f, 1e-6);
  EXPECT_NEAR(got[1], std::exp(1.f), 1e-6);
}

TEST(Ir, ConcreteValueOfTracerRaisesPointingToCond) {
  try {
    ir::trace_function("h", {{float32, {}}}, [](const Ts& a) {
      if (a[0].item<float>() > 0) return Ts{a[0]};
      return Ts{-a[0]};
    });
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("kiln::cond"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("f32[]"), std::string::npos) << e.what();
  }
}

TEST(Ir, TypeErrorsWhileTracingNameTheCallSite) {
  try {
    ir::trace_function("h", {{float32, {2, 3}}}, [](const Ts& a) {
      return Ts{reshape(a[0], {4, 2})};
    });
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("test_ir.cpp"), std::string::npos) << e.what();
  }
}

TEST(Ir, VerifierRejectsWrongTypes) {
  const std::string bad =
      "func @f(%x: f32[3]) -> f32[2] {\n"
      "  %0 = sin %x : f32[2]\n"
      "  return %0\n"
      "}";
  EXPECT_THROW(ir::parse(bad), Error);
  const std::string undefined =
      "func @f(%x: f32[3]) -> f32[3] {\n"
      "  %0 = sin %y : f32[3]\n"
      "  return %0\n"
      "}";
  EXPECT_THROW(ir::parse(undefined), Error);
}

TEST(Ir, DceAndCse) {
  const auto f = ir::parse(
      "func @f(%x: f32[3]) -> f32[3] {\n"
      "  %0 = sin %x : f32[3]\n"
      "  %1 = sin %x : f32[3]\n"
      "  %2 = cos %x : f32[3]\n"
      "  %3 = add %0, %1 : f32[3]\n"
      "  return %3\n"
      "}");
  const ir::Function g = ir::optimize(*f);
  ir::verify(g);
  EXPECT_EQ(ir::print(g),
            "func @f(%x: f32[3]) -> f32[3] {\n"
            "  %0 = sin %x : f32[3]\n"
            "  %1 = add %0, %0 : f32[3]\n"
            "  return %1\n"
            "}");
}

// A scan's ys that nobody reads leave its body, and so do the xs only they read.
TEST(Passes, DceDropsUnreadScanOutputsAndTheXsOnlyTheyRead) {
  const std::string text =
      "func @f(%c: f64[], %xs: f64[4], %zs: f64[4]) -> f64[] {\n"
      "  %0, %1, %2 = scan %c, %xs, %zs {body=func @b(%a: f64[], %x: f64[], %z: f64[]) -> "
      "(f64[], f64[], f64[]) {\n"
      "    %0 = add %a, %x : f64[]\n"
      "    %1 = mul %z, %z : f64[]\n"
      "    return %0, %0, %1\n"
      "  }, length=4, num_carry=1, num_xs=2, reverse=false} : (f64[], f64[4], f64[4])\n"
      "  return %0\n"
      "}";
  const auto f = ir::parse(text);
  const ir::Function g = ir::dce(*f);
  ir::verify(g);
  EXPECT_EQ(ir::print(g),
            "func @f(%c: f64[], %xs: f64[4], %zs: f64[4]) -> f64[] {\n"
            "  %0 = scan %c, %xs {body=func @b(%a: f64[], %x: f64[]) -> f64[] {\n"
            "    %0 = add %a, %x : f64[]\n"
            "    return %0\n"
            "  }, length=4, num_carry=1, num_xs=1, reverse=false} : f64[]\n"
            "  return %0\n"
            "}");
  const std::vector<Tensor> args{tensor(0.5), tensor({1.0, 2.0, 3.0, 4.0}),
                                 tensor({5.0, 6.0, 7.0, 8.0})};
  EXPECT_EQ(ir::evaluate(g, args)[0].item<double>(), 10.5);  // 0.5 + 1 + 2 + 3 + 4
  // Nothing to drop: the same equation, body still shared.
  const ir::Function h = ir::dce(g);
  EXPECT_EQ(h.equations[0].attrs.get<FunctionRef>("body"),
            g.equations[0].attrs.get<FunctionRef>("body"));
}

std::vector<std::string> prims(const ir::Function& f) {
  std::vector<std::string> out;
  for (const ir::Equation& e : f.equations) out.push_back(e.prim->name);
  return out;
}

// split_known moves work that reads only known parameters into `known`, except layout
// equations, which `unknown` recomputes; needed known values become residuals.
TEST(PartialEval, SplitsKnownWorkAndRecomputesLayoutOps) {
  const auto f = ir::parse(
      "func @f(%k: f64[2,3], %u: f64[2,3], %w: f64[3]) -> (f64[2,3], f64[2,3]) {\n"
      "  %0 = exp %k : f64[2,3]\n"
      "  %1 = broadcast_to %w {shape=[2, 3]} : f64[2,3]\n"
      "  %2 = mul %0, %1 : f64[2,3]\n"
      "  %3 = mul %2, %u : f64[2,3]\n"
      "  %4 = add %3, %1 : f64[2,3]\n"
      "  %5 = sin %k : f64[2,3]\n"
      "  return %4, %0\n"
      "}");
  const ir::KnownSplit s = ir::split_known(*f, {true, false, true});
  ir::verify(*s.known);
  ir::verify(*s.unknown);
  EXPECT_EQ(s.num_residuals, 2u);
  EXPECT_EQ(prims(*s.known), (std::vector<std::string>{"exp", "broadcast_to", "mul"}));
  EXPECT_EQ(prims(*s.unknown), (std::vector<std::string>{"broadcast_to", "mul", "add"}));
  EXPECT_EQ(s.known->params.size(), 2u);
  EXPECT_EQ(ir::params_read(*s.unknown), (std::vector<bool>{false, true, true, true, true}));
  // unknown(p, known(p_known)) == f(p), exactly: the same operations on the same values.
  const Tensor k = random::normal(random::key(1), {2, 3}, float64),
               u = random::normal(random::key(2), {2, 3}, float64),
               w = random::normal(random::key(3), {3}, float64);
  const std::vector<Tensor> want = ir::evaluate(*f, std::vector<Tensor>{k, u, w});
  std::vector<Tensor> args{k, u, w};
  for (const Tensor& r : ir::evaluate(*s.known, std::vector<Tensor>{k, w})) args.push_back(r);
  const std::vector<Tensor> got = ir::evaluate(*s.unknown, args);
  ASSERT_EQ(got.size(), 2u);
  for (std::size_t i = 0; i < 2; ++i)
    EXPECT_EQ(got[i].to_vector<double>(), want[i].to_vector<double>()) << "result " << i;
  EXPECT_THROW(ir::split_known(*f, {true}), Error);
}

// Cheap arithmetic of one per-step value is redone rather than stored: tanh's derivative
// 1 - y² needs only y as a residual (which the backward reads anyway), not y and 1 - y²; a product
// of two per-step values and a transcendental function stay residuals.
TEST(PartialEval, RedoesCheapArithmeticOfOneStoredValue) {
  const auto f = ir::parse(
      "func @f(%k: f64[3], %u: f64[3], %j: f64[3]) -> (f64[3], f64[3], f64[3]) {\n"
      "  %c0 = const [1] : f64[1]\n"
      "  %0 = tanh %k : f64[3]\n"
      "  %1 = mul %0, %0 : f64[3]\n"
      "  %2 = broadcast_to %c0 {shape=[3]} : f64[3]\n"
      "  %3 = sub %2, %1 : f64[3]\n"
      "  %4 = mul %3, %u : f64[3]\n"
      "  %5 = mul %0, %j : f64[3]\n"
      "  %6 = mul %5, %u : f64[3]\n"
      "  %7 = mul %0, %u : f64[3]\n"
      "  return %4, %6, %7\n"
      "}");
  const ir::KnownSplit s = ir::split_known(*f, {true, false, true});
  ir::verify(*s.known);
  ir::verify(*s.unknown);
  EXPECT_EQ(s.num_residuals, 2u);  // tanh k and tanh k * j
  EXPECT_EQ(prims(*s.known), (std::vector<std::string>{"tanh", "mul"}));
  EXPECT_EQ(prims(*s.unknown),
            (std::vector<std::string>{"mul", "broadcast_to", "sub", "mul", "mul", "mul"}));
  const Tensor k = random::normal(random::key(4), {3}, float64),
               u = random::normal(random::key(5), {3}, float64),
               j = random::normal(random::key(6), {3}, float64);
  const std::vector<Tensor> want = ir::evaluate(*f, std::vector<Tensor>{k, u, j});
  std::vector<Tensor> args{k, u, j};
  for (const Tensor& r : ir::evaluate(*s.known, std::vector<Tensor>{k, j})) args.push_back(r);
  const std::vector<Tensor> got = ir::evaluate(*s.unknown, args);
  ASSERT_EQ(got.size(), 3u);
  for (std::size_t i = 0; i < 3; ++i)
    EXPECT_EQ(got[i].to_vector<double>(), want[i].to_vector<double>()) << "result " << i;
}

std::string optimized(const std::string& text) {
  const ir::Function g = ir::optimize(*ir::parse(text));
  ir::verify(g);
  return ir::print(g);
}

TEST(Passes, ConstantFoldingEvaluatesSmallConstantExpressions) {
  EXPECT_EQ(optimized("func @f(%x: f32[2]) -> f32[2] {\n"
                      "  %c0 = const [1, 2] : f32[2]\n"
                      "  %c1 = const [3, 4] : f32[2]\n"
                      "  %0 = mul %c0, %c1 : f32[2]\n"
                      "  %1 = add %x, %0 : f32[2]\n"
                      "  return %1\n"
                      "}"),
            "func @f(%x: f32[2]) -> f32[2] {\n"
            "  %c0 = const [3, 8] : f32[2]\n"
            "  %0 = add %x, %c0 : f32[2]\n"
            "  return %0\n"
            "}");
  // A broadcast stays a view of its constant, however small its result.
  EXPECT_EQ(optimized("func @f(%x: f32[3,2]) -> f32[3,2] {\n"
                      "  %c0 = const [1, 2] : f32[2]\n"
                      "  %c1 = const [3, 4] : f32[2]\n"
                      "  %0 = add %c0, %c1 : f32[2]\n"
                      "  %1 = broadcast_to %0 {shape=[3, 2]} : f32[3,2]\n"
                      "  %2 = mul %x, %1 : f32[3,2]\n"
                      "  return %2\n"
                      "}"),
            "func @f(%x: f32[3,2]) -> f32[3,2] {\n"
            "  %c0 = const [4, 6] : f32[2]\n"
            "  %0 = broadcast_to %c0 {shape=[3, 2]} : f32[3,2]\n"
            "  %1 = mul %x, %0 : f32[3,2]\n"
            "  return %1\n"
            "}");
}

TEST(Passes, SimplifiesIdentitiesSafely) {
  // x * 1 - 0 is x; float x * 0 stays (inf * 0 is NaN); neg(neg(x)) is x.
  EXPECT_EQ(optimized("func @f(%x: f32[2]) -> (f32[2], f32[2], f32[2]) {\n"
                      "  %c0 = const [1, 1] : f32[2]\n"
                      "  %c1 = const [0, 0] : f32[2]\n"
                      "  %0 = mul %x, %c0 : f32[2]\n"
                      "  %1 = sub %0, %c1 : f32[2]\n"
                      "  %2 = mul %x, %c1 : f32[2]\n"
                      "  %3 = neg %x : f32[2]\n"
                      "  %4 = neg %3 : f32[2]\n"
                      "  return %1, %2, %4\n"
                      "}"),
            "func @f(%x: f32[2]) -> (f32[2], f32[2], f32[2]) {\n"
            "  %c0 = const [0, 0] : f32[2]\n"
            "  %0 = mul %x, %c0 : f32[2]\n"
            "  return %x, %0, %x\n"
            "}");
  // Integers have no inf or NaN, so i * 0 folds to the zero constant.
  EXPECT_EQ(optimized("func @f(%i: i32[2]) -> i32[2] {\n"
                      "  %c0 = const [0, 0] : i32[2]\n"
                      "  %0 = mul %i, %c0 : i32[2]\n"
                      "  return %0\n"
                      "}"),
            "func @f(%i: i32[2]) -> i32[2] {\n"
            "  %c0 = const [0, 0] : i32[2]\n"
            "  return %c0\n"
            "}");
}

// Commutative operations are one value whichever operand comes first; the others are not.
TEST(Passes, CseMergesCommutedOperands) {
  EXPECT_EQ(optimized("func @f(%x: f32[2], %y: f32[2]) -> (f32[2], f32[2], f32[2], f32[2]) {\n"
                      "  %0 = mul %x, %y : f32[2]\n"
                      "  %1 = mul %y, %x : f32[2]\n"
                      "  %2 = sub %x, %y : f32[2]\n"
                      "  %3 = sub %y, %x : f32[2]\n"
                      "  %4 = max %x, %y : f32[2]\n"
                      "  %5 = max %y, %x : f32[2]\n"
                      "  %6 = add %1, %0 : f32[2]\n"
                      "  return %6, %2, %3, %5\n"
                      "}"),
            "func @f(%x: f32[2], %y: f32[2]) -> (f32[2], f32[2], f32[2], f32[2]) {\n"
            "  %0 = mul %x, %y : f32[2]\n"
            "  %1 = sub %x, %y : f32[2]\n"
            "  %2 = sub %y, %x : f32[2]\n"
            "  %3 = max %y, %x : f32[2]\n"
            "  %4 = add %0, %0 : f32[2]\n"
            "  return %4, %1, %2, %3\n"
            "}");
}

// Equal literals traced at different uses are one constant; +0 and -0 are not equal bits.
TEST(Passes, CseMergesEqualSmallConstants) {
  EXPECT_EQ(optimized("func @f(%x: f32[2]) -> (f32[2], f32[2], f32[2], f32[2]) {\n"
                      "  %c0 = const [3, 4] : f32[2]\n"
                      "  %c1 = const [3, 4] : f32[2]\n"
                      "  %c2 = const [0, 0] : f32[2]\n"
                      "  %c3 = const [-0, -0] : f32[2]\n"
                      "  %0 = div %x, %c0 : f32[2]\n"
                      "  %1 = div %x, %c1 : f32[2]\n"
                      "  %2 = max %x, %c2 : f32[2]\n"
                      "  %3 = max %x, %c3 : f32[2]\n"
                      "  return %0, %1, %2, %3\n"
                      "}"),
            "func @f(%x: f32[2]) -> (f32[2], f32[2], f32[2], f32[2]) {\n"
            "  %c0 = const [3, 4] : f32[2]\n"
            "  %c1 = const [0, 0] : f32[2]\n"
            "  %c2 = const [-0, -0] : f32[2]\n"
            "  %0 = div %x, %c0 : f32[2]\n"
            "  %1 = max %x, %c1 : f32[2]\n"
            "  %2 = max %x, %c2 : f32[2]\n"
            "  return %0, %0, %1, %2\n"
            "}");
}

// The identities see through the broadcast (and reshape) that reverse mode puts between its
// seed of ones and the first product: too large to fold, still known to be all ones.
TEST(Passes, SimplifiesIdentitiesThroughBroadcasts) {
  EXPECT_EQ(optimized("func @f(%x: f32[4096,2]) -> (f32[4096,2], f32[4096,2]) {\n"
                      "  %c0 = const [1] : f32[1]\n"
                      "  %c1 = const [2] : f32[1]\n"
                      "  %0 = reshape %c0 {shape=[1, 1]} : f32[1,1]\n"
                      "  %1 = broadcast_to %0 {shape=[4096, 2]} : f32[4096,2]\n"
                      "  %2 = mul %1, %x : f32[4096,2]\n"
                      "  %3 = broadcast_to %c1 {shape=[4096, 2]} : f32[4096,2]\n"
                      "  %4 = mul %x, %3 : f32[4096,2]\n"
                      "  return %2, %4\n"
                      "}"),
            "func @f(%x: f32[4096,2]) -> (f32[4096,2], f32[4096,2]) {\n"
            "  %c0 = const [2] : f32[1]\n"
            "  %0 = broadcast_to %c0 {shape=[4096, 2]} : f32[4096,2]\n"
            "  %1 = mul %x, %0 : f32[4096,2]\n"
            "  return %x, %1\n"
            "}");
}

TEST(Passes, CollapsesShapeChains) {
  EXPECT_EQ(optimized("func @f(%x: f32[2,3]) -> (f32[2,3], f32[6], f32[4,2,3]) {\n"
                      "  %0 = transpose %x {perm=[1, 0]} : f32[3,2]\n"
                      "  %1 = transpose %0 {perm=[1, 0]} : f32[2,3]\n"
                      "  %2 = reshape %x {shape=[3, 2]} : f32[3,2]\n"
                      "  %3 = reshape %2 {shape=[6]} : f32[6]\n"
                      "  %4 = broadcast_to %x {shape=[1, 2, 3]} : f32[1,2,3]\n"
                      "  %5 = broadcast_to %4 {shape=[4, 2, 3]} : f32[4,2,3]\n"
                      "  return %1, %3, %5\n"
                      "}"),
            "func @f(%x: f32[2,3]) -> (f32[2,3], f32[6], f32[4,2,3]) {\n"
            "  %0 = reshape %x {shape=[6]} : f32[6]\n"
            "  %1 = broadcast_to %x {shape=[4, 2, 3]} : f32[4,2,3]\n"
            "  return %x, %0, %1\n"
            "}");
}

TEST(Passes, SumOfPaddedPiecesBecomesOneConcatenate) {
  // Reverse mode through a split: each slice's transpose pads its cotangent to the whole, and
  // the cotangents add up. Pieces that tile the axis, in any order, are one concatenate.
  const std::string split_gradient =
      "func @f(%a: f32[2,3], %b: f32[2,1], %c: f32[2,2]) -> f32[2,6] {\n"
      "  %0 = pad %b {high=[0, 2], low=[0, 3], value=0.0} : f32[2,6]\n"
      "  %1 = pad %a {high=[0, 3], low=[0, 0], value=0.0} : f32[2,6]\n"
      "  %2 = add %0, %1 : f32[2,6]\n"
      "  %3 = pad %c {high=[0, 0], low=[0, 4], value=0.0} : f32[2,6]\n"
      "  %4 = add %3, %2 : f32[2,6]\n"
      "  return %4\n"
      "}";
  EXPECT_EQ(optimized(split_gradient),
            "func @f(%a: f32[2,3], %b: f32[2,1], %c: f32[2,2]) -> f32[2,6] {\n"
            "  %0 = concatenate %a, %b, %c {axis=1} : f32[2,6]\n"
            "  return %0\n"
            "}");
  // Room left at the ends: one pad of the concatenation.
  EXPECT_EQ(optimized("func @f(%a: f32[3], %b: f32[2]) -> f32[8] {\n"
                      "  %0 = pad %a {high=[4], low=[1], value=0.0} : f32[8]\n"
                      "  %1 = pad %b {high=[2], low=[4], value=0.0} : f32[8]\n"
                      "  %2 = add %0, %1 : f32[8]\n"
                      "  return %2\n"
                      "}"),
            "func @f(%a: f32[3], %b: f32[2]) -> f32[8] {\n"
            "  %0 = concatenate %a, %b {axis=0} : f32[5]\n"
            "  %1 = pad %0 {high=[2], low=[1], value=0.0} : f32[8]\n"
            "  return %1\n"
            "}");
  // Integers too; and one other term of the sum (a value also used whole) is added after.
  EXPECT_EQ(optimized("func @f(%a: i32[2], %b: i32[3], %r: i32[5]) -> i32[5] {\n"
                      "  %0 = pad %a {high=[3], low=[0], value=0.0} : i32[5]\n"
                      "  %1 = add %r, %0 : i32[5]\n"
                      "  %2 = pad %b {high=[0], low=[2], value=0.0} : i32[5]\n"
                      "  %3 = add %1, %2 : i32[5]\n"
                      "  return %3\n"
                      "}"),
            "func @f(%a: i32[2], %b: i32[3], %r: i32[5]) -> i32[5] {\n"
            "  %0 = concatenate %a, %b {axis=0} : i32[5]\n"
            "  %1 = add %0, %r : i32[5]\n"
            "  return %1\n"
            "}");
  // An unused sum is no root of anything (dce drops it later; the pass alone keeps it).
  const std::string unused =
      "func @f(%a: f32[2], %b: f32[3]) -> f32[2] {\n"
      "  %0 = pad %a {high=[3], low=[0], value=0.0} : f32[5]\n"
      "  %1 = pad %b {high=[0], low=[2], value=0.0} : f32[5]\n"
      "  %2 = add %0, %1 : f32[5]\n"
      "  return %a\n"
      "}";
  EXPECT_EQ(ir::print(ir::fold_pad_sums(*ir::parse(unused))),
            "func @f(%a: f32[2], %b: f32[3]) -> f32[2] {\n"
            "  %0 = pad %a {high=[3], low=[0], value=0.0} : f32[5]\n"
            "  %1 = pad %b {high=[0], low=[2], value=0.0} : f32[5]\n"
            "  %2 = concatenate %a, %b {axis=0} : f32[5]\n"
            "  return %a\n"
            "}");
  // A gap between pieces, overlapping pieces, a non-zero or negative-zero padding value, a pad
  // along two axes, the same piece twice, two other terms (their order would change the
  // rounding): the sums stay as they are.
  for (const char* kept : {
           "func @f(%a: f32[2], %b: f32[2]) -> f32[5] {\n"
           "  %0 = pad %a {high=[3], low=[0], value=0.0} : f32[5]\n"
           "  %1 = pad %b {high=[0], low=[3], value=0.0} : f32[5]\n"
           "  %2 = add %0, %1 : f32[5]\n"
           "  return %2\n"
           "}",
           "func @f(%a: f32[3], %b: f32[3]) -> f32[5] {\n"
           "  %0 = pad %a {high=[2], low=[0], value=0.0} : f32[5]\n"
           "  %1 = pad %b {high=[0], low=[2], value=0.0} : f32[5]\n"
           "  %2 = add %0, %1 : f32[5]\n"
           "  return %2\n"
           "}",
           "func @f(%a: f32[2], %b: f32[3]) -> f32[5] {\n"
           "  %0 = pad %a {high=[3], low=[0], value=1.0} : f32[5]\n"
           "  %1 = pad %b {high=[0], low=[2], value=0.0} : f32[5]\n"
           "  %2 = add %0, %1 : f32[5]\n"
           "  return %2\n"
           "}",
           "func @f(%a: f32[2], %b: f32[3]) -> f32[5] {\n"
           "  %0 = pad %a {high=[3], low=[0], value=-0.0} : f32[5]\n"
           "  %1 = pad %b {high=[0], low=[2], value=0.0} : f32[5]\n"
           "  %2 = add %0, %1 : f32[5]\n"
           "  return %2\n"
           "}",
           "func @f(%a: f32[2,2], %b: f32[3,3]) -> f32[3,3] {\n"
           "  %0 = pad %a {high=[1, 1], low=[0, 0], value=0.0} : f32[3,3]\n"
           "  %1 = add %0, %b : f32[3,3]\n"
           "  %2 = add %1, %0 : f32[3,3]\n"
           "  return %2\n"
           "}",
           "func @f(%a: f32[2]) -> f32[4] {\n"
           "  %0 = pad %a {high=[2], low=[0], value=0.0} : f32[4]\n"
           "  %1 = add %0, %0 : f32[4]\n"
           "  return %1\n"
           "}",
           "func @f(%a: f32[2], %b: f32[3], %r: f32[5], %s: f32[5]) -> f32[5] {\n"
           "  %0 = pad %a {high=[3], low=[0], value=0.0} : f32[5]\n"
           "  %1 = add %r, %0 : f32[5]\n"
           "  %2 = pad %b {high=[0], low=[2], value=0.0} : f32[5]\n"
           "  %3 = add %1, %2 : f32[5]\n"
           "  %4 = add %3, %s : f32[5]\n"
           "  return %4\n"
           "}",
       })
    EXPECT_EQ(optimized(kept), kept);
  // A partial sum also used elsewhere is a sum of its own: it is folded, and then the whole
  // sum, whose piece it has become, is folded too.
  EXPECT_EQ(optimized("func @f(%a: f32[2], %b: f32[1], %c: f32[2]) -> (f32[5], f32[5]) {\n"
                      "  %0 = pad %a {high=[3], low=[0], value=0.0} : f32[5]\n"
                      "  %1 = pad %b {high=[2], low=[2], value=0.0} : f32[5]\n"
                      "  %2 = add %0, %1 : f32[5]\n"
                      "  %3 = pad %c {high=[0], low=[3], value=0.0} : f32[5]\n"
                      "  %4 = add %2, %3 : f32[5]\n"
                      "  return %4, %2\n"
                      "}"),
            "func @f(%a: f32[2], %b: f32[1], %c: f32[2]) -> (f32[5], f32[5]) {\n"
            "  %0 = concatenate %a, %b {axis=0} : f32[3]\n"
            "  %1 = pad %0 {high=[2], low=[0], value=0.0} : f32[5]\n"
            "  %2 = concatenate %0, %c {axis=0} : f32[5]\n"
            "  return %2, %1\n"
            "}");
  // Values: a split's gradient, optimised, equals the unoptimised one.
  const auto f = ir::parse(split_gradient);
  const Ts in{random::normal(random::key(1), {2, 3}), random::normal(random::key(2), {2, 1}),
              random::normal(random::key(3), {2, 2})};
  EXPECT_EQ(ir::evaluate(ir::optimize(*f), in)[0].to_vector<float>(),
            ir::evaluate(*f, in)[0].to_vector<float>());
  // The one inexact case, as documented: a piece's -0 stays -0 (the sum gave +0).
  const auto signed_zero = ir::parse(
      "func @f(%a: f32[1], %b: f32[1]) -> f32[2] {\n"
      "  %0 = pad %a {high=[1], low=[0], value=0.0} : f32[2]\n"
      "  %1 = pad %b {high=[0], low=[1], value=0.0} : f32[2]\n"
      "  %2 = add %0, %1 : f32[2]\n"
      "  return %2\n"
      "}");
  const Ts zeros{tensor(std::vector<float>{-0.0f}), tensor(std::vector<float>{1.0f})};
  EXPECT_FALSE(std::signbit(ir::evaluate(*signed_zero, zeros)[0].to_vector<float>()[0]));
  EXPECT_TRUE(
      std::signbit(ir::evaluate(ir::optimize(*signed_zero), zeros)[0].to_vector<float>()[0]));
}

TEST(Passes, TransposedProductBecomesProductOfTransposes) {
  // The weight gradient of x W^T is transpose(matmul(x^T, g)); rewritten, matmul reads the
  // transposed operands in place and W's gradient comes out contiguous. A product that is
  // also used as it is stays one matmul.
  EXPECT_EQ(optimized("func @f(%x: f32[4,3], %g: f32[4,2]) -> f32[2,3] {\n"
                      "  %0 = transpose %x {perm=[1, 0]} : f32[3,4]\n"
                      "  %1 = matmul %0, %g : f32[3,2]\n"
                      "  %2 = transpose %1 {perm=[1, 0]} : f32[2,3]\n"
                      "  return %2\n"
                      "}"),
            "func @f(%x: f32[4,3], %g: f32[4,2]) -> f32[2,3] {\n"
            "  %0 = transpose %g {perm=[1, 0]} : f32[2,4]\n"
            "  %1 = matmul %0, %x : f32[2,3]\n"
            "  return %1\n"
            "}");
  const std::string shared =
      "func @f(%a: f32[2,3], %b: f32[3,2]) -> (f32[2,2], f32[2,2]) {\n"
      "  %0 = matmul %a, %b : f32[2,2]\n"
      "  %1 = transpose %0 {perm=[1, 0]} : f32[2,2]\n"
      "  return %0, %1\n"
      "}";
  EXPECT_EQ(optimized(shared), shared);
  // And the values agree with the unoptimised function.
  const auto f = ir::parse(
      "func @f(%a: f32[2,3], %b: f32[3,4]) -> f32[4,2] {\n"
      "  %0 = matmul %a, %b : f32[2,4]\n"
      "  %1 = transpose %0 {perm=[1, 0]} : f32[4,2]\n"
      "  return %1\n"
      "}");
  const Tensor a = random::normal(random::key(1), {2, 3}),
               b = random::normal(random::key(2), {3, 4});
  const Tensor want = ir::evaluate(*f, Ts{a, b})[0];
  const Tensor got = ir::evaluate(ir::optimize(*f), Ts{a, b})[0];
  EXPECT_LT(max(abs(got - want)).item<float>(), 1e-6);
  EXPECT_TRUE(got.is_contiguous());
}

TEST(Ir, CallPrimitiveRoundTrips) {
  const auto inner = trace_fx().function;
  const auto outer = ir::trace_function("outer", {{float32, {3}}}, [&](const Ts& a) {
                       return bind(primitive("call"), {a[0], a[0]}, {{"fn", FunctionRef(inner)}});
                     }).function;
  const std::string text = ir::print(*outer);
  EXPECT_NE(text.find("call %a0, %a0 {fn=func @f("), std::string::npos) << text;
  const auto back = ir::parse(text);
  EXPECT_EQ(ir::print(*back), text);
  const Tensor x = tensor({1.f, 2.f, 3.f});
  EXPECT_NEAR(ir::evaluate(*back, Ts{x})[0].item<float>(), sum(sin(x) * x).item<float>(), 1e-6);
}

// ---- the text form on bad input ----------------------------------------------------------

// `depth` levels of sub-functions, alternating call, cond, scan and checkpoint; only the
// innermost computes (sin), every level above passes its value on, so f(x) = sin(x).
std::string nested_program(int depth) {
  std::string head;
  std::vector<std::string> tails;
  for (int level = 0; level < depth; ++level) {
    head += "func @l" + std::to_string(level) + "(%x: f32[2]) -> f32[2] {\n";
    std::string tail = "} : f32[2]\n  return %0\n}";
    switch (level % 4) {
      case 0:
        head += "  %0 = call %x {fn=";
        break;
      case 1:
        head += "  %c0 = const 0 : i32[]\n  %0 = cond %c0, %x {branch0=";
        break;
      case 2:
        head += "  %0 = scan %x {body=";
        tail = ", length=1, num_carry=1, num_xs=0, reverse=false" + tail;
        break;
      default:
        head += "  %0 = checkpoint %x {fn=";
        break;
    }
    tails.push_back(tail);
  }
  head += "func @leaf(%x: f32[2]) -> f32[2] {\n  %0 = sin %x : f32[2]\n  return %0\n}";
  for (auto it = tails.rbegin(); it != tails.rend(); ++it) head += *it;
  return head;
}

TEST(IrText, NestingUpToTheLimitParsesVerifiesAndEvaluates) {
  // The deepest walks (AD and vmap through every level) are the ones that must fit the stack.
  const std::string text = nested_program(ir::kMaxNesting);
  const std::shared_ptr<ir::Function> f = ir::parse(text);
  ir::verify(*f);
  const std::string printed = ir::print(*f);
  EXPECT_EQ(ir::print(*ir::parse(printed)), printed);
  const Tensor x = tensor({0.5f, -1.f});
  const std::vector<float> y = ir::evaluate(*f, Ts{x})[0].to_vector<float>();
  EXPECT_NEAR(y[0], std::sin(0.5f), 1e-6);
  EXPECT_NEAR(y[1], std::sin(-1.f), 1e-6);
  const std::vector<Tangent> ct{ones({2})};
  const std::vector<float> g = ad::vjp(f, Ts{x}).pullback(ct)[0]->to_vector<float>();
  EXPECT_NEAR(g[0], std::cos(0.5f), 1e-6);
  EXPECT_NEAR(g[1], std::cos(-1.f), 1e-6);
  const std::vector<Tangent> t{ones({2})};
  const std::vector<float> d = ad::jvp(*f, Ts{x}, t).tangents[0]->to_vector<float>();
  EXPECT_NEAR(d[1], std::cos(-1.f), 1e-6);
  const Tensor xs = tensor({0.5f, -1.f, 2.f, 3.f}, {2, 2});
  const std::vector<Batched> batch{{xs, 0}};
  const std::vector<float> v = batching::evaluate(*f, batch, 2, "")[0].value.to_vector<float>();
  EXPECT_NEAR(v[3], std::sin(3.f), 1e-6);
  const auto jitted = jit(grad([&](const Tensor& a) { return sum(ir::evaluate(*f, Ts{a})[0]); }));
  EXPECT_NEAR(jitted(x).to_vector<float>()[0], std::cos(0.5f), 1e-6);
  const ir::Function o = ir::optimize(*f);
  ir::verify(o);
}

// Hand-written IR may give a reduction's axes from the end; its derivatives then reduce and
// broadcast back over the same axes (they once indexed the shape with -1: heap corruption).
TEST(IrText, NegativeReductionAxesDifferentiate) {
  const auto f = ir::parse(
      "func @f(%a0: f64[2,3]) -> f64[] {\n"
      "  %0 = reduce_max %a0 {axes=[-1]} : f64[2]\n"
      "  %1 = reduce_prod %a0 {axes=[-2]} : f64[3]\n"
      "  %2 = reduce_sum %0 {axes=[-1]} : f64[]\n"
      "  %3 = reduce_sum %1 {axes=[0]} : f64[]\n"
      "  %4 = add %2, %3 : f64[]\n"
      "  return %4\n"
      "}");
  const Tensor x = tensor({1.0, 5.0, 2.0, 7.0, 3.0, 4.0}, {2, 3});
  // By hand: row maxima 5 + 7, column products 1*7 + 5*3 + 2*4.
  EXPECT_EQ(ir::evaluate(*f, Ts{x})[0].item<double>(), 42.0);
  // d/dx: one-hot at each row's maximum, plus the other element of each column.
  const std::vector<double> want{7.0, 1.0 + 3.0, 4.0, 1.0 + 1.0, 5.0, 2.0};
  const std::vector<Tangent> ct{tensor(1.0)};
  EXPECT_EQ(ad::vjp(f, Ts{x}).pullback(ct)[0]->to_vector<double>(), want);
  const std::vector<Tangent> t{ones({2, 3}, float64)};
  EXPECT_EQ(ad::jvp(*f, Ts{x}, t).tangents[0]->item<double>(), 24.0);  // the sum of `want`
}

TEST(IrText, NestingPastTheLimitIsAnError) {
  expect_error([] { ir::parse(nested_program(ir::kMaxNesting + 1)); }, "parse",
               {"nested too deeply", "ir::kMaxNesting = 64", "line "});
  // Far past it: an Error too, not a stack overflow.
  expect_error([] { ir::parse(nested_program(30000)); }, "parse", {"nested too deeply"});
}

// A chain of `levels` sub-functions built directly (not parsed); each level applies its
// sub-function `calls` times.
std::shared_ptr<ir::Function> built_chain(int levels, int calls) {
  const TensorType t{float32, {2}};
  std::shared_ptr<ir::Function> f =
      ir::parse("func @leaf(%x: f32[2]) -> f32[2] {\n  %0 = sin %x : f32[2]\n  return %0\n}");
  for (int level = 0; level < levels; ++level) {
    auto g = std::make_shared<ir::Function>();
    g->params = {{0, t}};
    ir::Value last = g->params[0];
    for (int k = 0; k < calls; ++k) {
      ir::Equation e;
      e.prim = &primitive("call");
      e.attrs.set("fn", FunctionRef(f));
      e.inputs = {last};
      last = {k + 1, t};
      e.outputs = {last};
      g->equations.push_back(std::move(e));
    }
    g->results = {last};
    f = g;
  }
  return f;
}

TEST(Ir, VerifyBoundsTheNestingOfBuiltFunctions) {
  ir::verify(*built_chain(ir::kMaxNesting, 1));
  expect_error(
      [] { ir::verify(*built_chain(ir::kMaxNesting + 1, 1)); }, "verify",
      {"nests sub-functions too deeply", "got 65 levels", "expected at most ir::kMaxNesting = 64"});
}

TEST(Ir, VerifyChecksASharedSubFunctionOnce) {
  // 2^40 paths lead to the leaf; checking each path would never finish.
  ir::verify(*built_chain(40, 2));
}

TEST(Ir, VerifyNamesBothTypesOfAMistypedResult) {
  std::shared_ptr<ir::Function> f = built_chain(0, 0);
  auto g = std::make_shared<ir::Function>(*f);
  g->results[0].type = {float32, {3}};
  expect_error([&] { ir::verify(*g); }, "verify", {"return", "f32[3]", "f32[2]"});
}

TEST(IrText, DeclaredResultTypesMustMatchTheReturnedValues) {
  expect_error(
      [] { ir::parse("func @f(%x: f32[3]) -> f32[2] {\n  %0 = sin %x : f32[3]\n  return %0\n}"); },
      "parse",
      {"line 3:10", "@f returns other types than it declares", "got f32[3]", "expected f32[2]"});
  expect_error([] { ir::parse("func @f(%x: f32[3]) -> (f32[3], f32[3]) {\n  return %x\n}"); },
               "parse", {"line 2:10", "got f32[3], expected (f32[3], f32[3])"});
  // In a sub-function too, although the call's type rule reads the values' types.
  expect_error(
      [] {
        ir::parse(
            "func @f(%x: f32[3]) -> f32[3] {\n"
            "  %0 = call %x {fn=func @g(%y: f32[3]) -> i32[3] {\n"
            "    return %y\n"
            "  }} : f32[3]\n"
            "  return %0\n"
            "}");
      },
      "parse", {"line 3:12", "@g returns", "got f32[3], expected i32[3]"});
}

// Parses `text`, expecting an Error whose message contains each part.
void expect_parse_error(const std::string& text, const std::vector<std::string>& parts) {
  SCOPED_TRACE(text);
  expect_error([&] { ir::parse(text); }, "parse", parts);
}
std::string with_param(const std::string& type) {
  return "func @f(%x: " + type + ") -> " + type + " {\n  return %x\n}";
}
std::string with_constant(const std::string& literal, const std::string& type) {
  return "func @f() -> " + type + " {\n  %c0 = const " + literal + " : " + type +
         "\n  return %c0\n}";
}
std::string with_equation(const std::string& equation) {
  return "func @f(%x: f32[2]) -> f32[2] {\n  " + equation + "\n  return %0\n}";
}

TEST(IrText, DimensionsAreNonNegativeIntegersOfABoundedProduct) {
  expect_parse_error(with_param("f32[nan]"),
                     {"line 1:17: invalid integer: got 'nan', expected decimal digits"});
  expect_parse_error(with_param("f32[1e300]"), {"line 1:17: invalid integer: got '1e300'"});
  expect_parse_error(with_param("f32[2.5]"), {"line 1:17: invalid integer"});
  expect_parse_error(with_param("f32[-1]"),
                     {"line 1:17: integer out of range for a dimension: got '-1'"});
  expect_parse_error(with_param("f32[99999999999999999999]"),
                     {"integer out of range for a dimension"});
  expect_parse_error(with_param("f32[4294967296,4294967296]"), {"line 1:28: type too large"});
  // Zero-size dimensions do not hide the others: strides would still overflow.
  expect_parse_error(with_param("f32[0,4294967296,4294967296]"), {"type too large"});
  const auto f = ir::parse(with_param("f32[0,536870912,1073741824]"));  // 2^59 elements
  EXPECT_EQ(f->params[0].type.shape, Shape({0, 536870912, 1073741824}));
}

TEST(IrText, AttributeNumbersParseStrictly) {
  expect_parse_error(with_equation("%0 = reshape %x {shape=[1e300]} : f32[2]"),
                     {"line 2:27: invalid integer: got '1e300'"});
  expect_parse_error(with_equation("%0 = reshape %x {shape=[nan]} : f32[2]"),
                     {"invalid integer: got 'nan'"});
  expect_parse_error(with_equation("%0 = reshape %x {shape=[99999999999999999999]} : f32[2]"),
                     {"integer out of range for i64"});
  expect_parse_error(with_equation("%0 = sin %x {scale=1e999} : f32[2]"),
                     {"line 2:22: number out of range for f64"});
  expect_parse_error(with_equation("%0 = sin %x {scale=1.5.5} : f32[2]"),
                     {"invalid number: got '1.5.5'"});
  expect_parse_error(with_equation("%0 = sin %x {scale=nancy} : f32[2]"),
                     {"invalid number: got 'nancy'"});
  expect_parse_error(with_equation("%0 = sin %x {scale=12abc} : f32[2]"),
                     {"invalid integer: got '12abc'"});
  expect_parse_error(with_equation("%0 = sin %x {scale=} : f32[2]"),
                     {"line 2:22: got '} : f32[2]', expected an attribute value"});
  // Integers stay exact, doubles keep their spelling's kind.
  const auto f = ir::parse(
      with_equation("%0 = sin %x {a=-9223372036854775808, b=1e-300, c=-inf, d=2.0} : f32[2]"));
  const Attrs& a = f->equations[0].attrs;
  EXPECT_EQ(a.get_int("a"), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(a.get_double("b"), 1e-300);
  EXPECT_EQ(a.get_double("c"), -std::numeric_limits<double>::infinity());
  EXPECT_EQ(a.get_double("d"), 2.0);
}

TEST(IrText, ConstantsParseStrictlyForTheirDtype) {
  expect_parse_error(with_constant("nan", "i32[]"), {"line 2:15: invalid integer: got 'nan'"});
  expect_parse_error(with_constant("1e300", "i32[]"), {"invalid integer: got '1e300'"});
  expect_parse_error(with_constant("1.5", "i64[]"), {"invalid integer"});
  expect_parse_error(with_constant("2147483648", "i32[]"),
                     {"integer out of range for i32", "[-2147483648, 2147483647]"});
  expect_parse_error(with_constant("256", "u8[]"), {"integer out of range for u8"});
  expect_parse_error(with_constant("-1", "u32[]"), {"integer out of range for u32"});
  expect_parse_error(with_constant("1e39", "f32[]"), {"literal out of range for f32: got '1e39'"});
  expect_parse_error(with_constant("1e300", "bf16[]"), {"literal out of range for bf16"});
  expect_parse_error(with_constant("65520", "f16[]"), {"literal out of range for f16"});
  expect_parse_error(with_constant("1e999", "f64[]"), {"number out of range for f64"});
  expect_parse_error(with_constant("2", "bool[]"),
                     {"invalid bool literal: got '2', expected true or false"});
  expect_parse_error(with_constant("true", "f32[]"), {"invalid number: got 'true'"});
  expect_parse_error(
      with_constant("[1, 2]", "f32[3]"),
      {"line 2:15: the constant's value count differs from its type: got 2 values, expected 3"});
  expect_parse_error(with_constant("1", "f32[1]"), {"expected a flat list in brackets"});
  expect_parse_error(with_constant("[1]", "f32[]"), {"expected a scalar without brackets"});
  // The extremes of each dtype are fine: 3.40282347e+38 is FLT_MAX as printed, 65504 f16's.
  const auto f = ir::parse(
      "func @f() -> (i32[2], u8[2], f32[3], f16[], f64[]) {\n"
      "  %c0 = const [-2147483648, 2147483647] : i32[2]\n"
      "  %c1 = const [0, 255] : u8[2]\n"
      "  %c2 = const [3.40282347e+38, -inf, 1e-45] : f32[3]\n"
      "  %c3 = const -65504 : f16[]\n"
      "  %c4 = const nan : f64[]\n"
      "  return %c0, %c1, %c2, %c3, %c4\n"
      "}");
  EXPECT_EQ(f->constants[0].tensor.to_vector<int32_t>(),
            (std::vector<int32_t>{-2147483647 - 1, 2147483647}));
  EXPECT_EQ(f->constants[1].tensor.to_vector<int>(), (std::vector<int>{0, 255}));
  const std::vector<float> c2 = f->constants[2].tensor.to_vector<float>();
  EXPECT_EQ(c2[0], std::numeric_limits<float>::max());
  EXPECT_EQ(c2[1], -std::numeric_limits<float>::infinity());
  EXPECT_EQ(c2[2], std::numeric_limits<float>::denorm_min());
  EXPECT_EQ(f->constants[3].tensor.item<float>(), -65504.f);
  EXPECT_TRUE(std::isnan(f->constants[4].tensor.item<double>()));
}

TEST(IrText, ParsingUnderATraceGivesConcreteConstants) {
  // Converting the literals with ops would record them into the active trace instead.
  std::shared_ptr<ir::Function> f;
  ir::trace_function("outer", {{float32, {}}}, [&](const Ts& a) {
    f = ir::parse(with_constant("[1.5, 2]", "f32[2]"));
    return a;
  });
  EXPECT_EQ(f->constants[0].tensor.to_vector<float>(), (std::vector<float>{1.5f, 2.f}));
}

TEST(IrText, Int64ConstantsPrintExactly) {
  // 2^53 + 1 has no double; printing through one gave 9007199254740992.
  const Tensor c =
      tensor(std::vector<int64_t>{9007199254740993LL, -9223372036854775807LL - 1}, Shape{2});
  const auto f =
      ir::trace_function("g", {{int64, {2}}}, [&](const Ts& a) { return Ts{a[0] + c}; }).function;
  const std::string text = ir::print(*f);
  EXPECT_NE(text.find("const [9007199254740993, -9223372036854775808] : i64[2]"), std::string::npos)
      << text;
  EXPECT_EQ(ir::parse(text)->constants[0].tensor.to_vector<int64_t>(), c.to_vector<int64_t>());
}

TEST(IrText, NeverReadsPastTheView) {
  // Every prefix, from a heap buffer that ends where the text does (no NUL after it), so that
  // AddressSanitizer reports any read past the view.
  const std::string text =
      "func @f(%x: f32[2], %i: i32[]) -> (f32[2], f32[]) {\n"
      "  %c0 = const [1.5, -inf] : f32[2]\n"
      "  %0 = mul %x, %c0 {note=\"a \\\"b\\\\\", scale=2.5} : f32[2]\n"
      "  %1 = reduce_sum %0 {axes=[0], keepdims=false} : f32[]\n"
      "  %2 = call %x {fn=func @g(%y: f32[2]) -> f32[2] {\n"
      "    %0 = sin %y : f32[2]\n"
      "    return %0\n"
      "  }} : f32[2]\n"
      "  return %2, %1\n"
      "}";
  for (std::size_t n = 0; n <= text.size(); ++n) {
    const std::unique_ptr<char[]> buf(new char[n]);
    std::memcpy(buf.get(), text.data(), n);
    const std::string_view view(buf.get(), n);
    if (n == text.size()) {
      EXPECT_EQ(ir::print(*ir::parse(view)), text);
    } else {
      EXPECT_THROW(ir::parse(view), Error) << "prefix of " << n << " characters";
    }
  }
}

TEST(IrText, ErrorsNameLineAndColumn) {
  expect_parse_error(with_equation("%0 = frobnicate %x : f32[2]"),
                     {"line 2:8: unknown primitive: got 'frobnicate'"});
  expect_parse_error(with_equation("%0 = sin %y : f32[2]"), {"line 2:12: undefined value %y"});
  expect_parse_error(with_equation("%0 = sin %x : f32[3]"),
                     {"line 2:15: the declared types of sin's results differ from its type rule: "
                      "got f32[3], expected f32[2]"});
  expect_parse_error(with_equation("%0 = matmul %x, %x : f32[2]"), {"line 2:8: [matmul] "});
  expect_parse_error(with_equation("%0, %1 = sin %x : f32[2]"),
                     {"line 2:12: sin names another number of values"});
  expect_parse_error(with_equation("%0 = sin %x : f32[2]") + " x",
                     {"line 4:3: trailing text after the function: got 'x'"});
  expect_parse_error(with_equation("%0 = sin %x {note=\"open} : f32[2]"),
                     {"line 2:21: unterminated string"});
  expect_parse_error("func @f(%x: f32[2]) -> f32[2] {\n  return %x",
                     {"line 2:12: got the end of the input, expected '}'"});
}

TEST(IrText, StringAttributesRoundTripWithQuotesAndBackslashes) {
  // A string printed as it was ended at its first '"' when read back (an axis name is any
  // string the user chose).
  ir::Function f = *trace_fx().function;
  const std::string note = "say \"hi\" \\ \"bye\\";
  f.equations[0].attrs.set("note", note);
  const std::string text = ir::print(f);
  EXPECT_NE(text.find(R"(note="say \"hi\" \\ \"bye\\")"), std::string::npos) << text;
  const auto g = ir::parse(text);
  EXPECT_EQ(g->equations[0].attrs.get<std::string>("note"), note);
  EXPECT_EQ(ir::print(*g), text);
  expect_parse_error(with_equation(R"(%0 = sin %x {note="a\qb"} : f32[2])"),
                     {R"(line 2:23: invalid escape in a string: got '\q', expected \" or \\)"});
  expect_parse_error(with_equation(R"(%0 = sin %x {note="a\"} : f32[2])"),
                     {"line 2:21: unterminated string"});
}

TEST(IrText, NamesAreDefinedOnce) {
  expect_parse_error("func @f(%x: f32[2], %x: f32[2]) -> f32[2] {\n  return %x\n}",
                     {"line 1:21: value %x defined twice", "the first is at 1:9"});
  expect_parse_error(with_equation("%x = sin %x : f32[2]"), {"line 2:3: value %x defined twice"});
  expect_parse_error(with_equation("%0, %0 = sin %x : (f32[2], f32[2])"),
                     {"line 2:7: value %0 defined twice", "the first is at 2:3"});
  expect_parse_error(with_equation("%0, %1 = const 1 : f32[]"),
                     {"a constant defines one value: got 2 names"});
  expect_parse_error(with_equation("%0 = reduce_sum %x {axes=[0], axes=[0]} : f32[]"),
                     {"line 2:33: attribute 'axes' given twice"});
}

TEST(IrText, EquationsWithoutResultsRoundTrip) {
  // A call of a function that returns nothing prints without "%... =".
  const std::string text =
      "func @f(%x: f32[2]) -> f32[2] {\n"
      "  call %x {fn=func @g(%y: f32[2]) -> () {\n"
      "    return\n"
      "  }} : ()\n"
      "  return %x\n"
      "}";
  const auto f = ir::parse(text);
  EXPECT_EQ(f->equations.size(), 1u);
  EXPECT_EQ(ir::print(*f), text);
}

TEST(IrText, FunctionNamesPrintAsNames) {
  const auto f = ir::trace_function("my loss (v2)", {{float32, {}}}, [](const Ts& a) {
                   return Ts{sin(a[0])};
                 }).function;
  const std::string text = ir::print(*f);
  EXPECT_EQ(text.rfind("func @my_loss__v2_(", 0), 0u) << text;
  EXPECT_EQ(ir::print(*ir::parse(text)), text);
}

}  // namespace
}  // namespace kiln
