// The IR: tracing, printing, parsing, verifying, evaluating, and the DCE/CSE passes.
#include <gtest/gtest.h>

#include <cmath>
#include <kiln/ir.h>
#include <kiln/kiln.h>

namespace kiln {
namespace {

using Ts = std::vector<Tensor>;

ir::Traced trace_fx() {
  return ir::trace_function("f", {{float32, {3}}, {float32, {3}}}, [](const Ts& a) {
    return Ts{sum(sin(a[0]) * a[1])};
  });
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
    const ir::Traced t = ir::trace_function("inner", {{float32, {2}}},
                                            [&](const Ts& b) { return Ts{b[0] * y}; });
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
    ir::trace_function("h", {{float32, {2, 3}}}, [](const Ts& a) { return Ts{reshape(a[0], {4, 2})}; });
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
  const auto f = ir::parse("func @f(%a: f32[2,3], %b: f32[3,4]) -> f32[4,2] {\n"
                           "  %0 = matmul %a, %b : f32[2,4]\n"
                           "  %1 = transpose %0 {perm=[1, 0]} : f32[4,2]\n"
                           "  return %1\n"
                           "}");
  const Tensor a = random::normal(random::key(1), {2, 3}), b = random::normal(random::key(2), {3, 4});
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

}  // namespace
}  // namespace kiln
