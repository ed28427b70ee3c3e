// What a user sees: every op's error names the caller's line (by name and through operators),
// escaped tracers say so, compound assignment, scan bodies returning tuples.
#include <gtest/gtest.h>
#include <kiln/kiln.h>

#include <functional>
#include <string>
#include <vector>

namespace kiln {
namespace {

struct BadCall {
  const char* what;
  std::function<void()> call;
};

// Each call fails in the op's own checks; the error must end with this file's name and line.
TEST(Errors, EveryOpNamesTheCallersLine) {
  const Tensor a = ones({2, 3}), b = ones({4}), m = ones({3, 2}), i = tensor({0, 1});
  const Tensor flag = tensor({1.0, -1.0}) > 0.0;
  const std::vector<BadCall> calls = {
      {"add", [&] { (void)add(a, b); }},
      {"sub", [&] { (void)sub(a, b); }},
      {"mul", [&] { (void)mul(a, b); }},
      {"div", [&] { (void)div(a, b); }},
      {"pow", [&] { (void)pow(a, b); }},
      {"maximum", [&] { (void)maximum(a, b); }},
      {"minimum", [&] { (void)minimum(a, b); }},
      {"equal", [&] { (void)equal(a, b); }},
      {"less", [&] { (void)less(a, b); }},
      {"logical_and", [&] { (void)logical_and(flag, ones({3}, bool_)); }},
      {"where", [&] { (void)where(flag, a, b); }},
      {"clip", [&] { (void)clip(a, b, b); }},
      {"matmul", [&] { (void)matmul(a, a); }},
      {"reshape", [&] { (void)reshape(a, {5}); }},
      {"transpose",
       [&] {
         (void)transpose(a, {0, 0});
       }},
      {"broadcast_to",
       [&] {
         (void)broadcast_to(a, {3, 3});
       }},
      {"expand_dims", [&] { (void)expand_dims(a, 5); }},
      {"squeeze", [&] { (void)squeeze(a, {0}); }},
      {"slice",
       [&] {
         (void)slice(a, {Slice{0, 1, 0}});
       }},
      {"index", [&] { (void)index(a, 7); }},
      {"concatenate",
       [&] {
         (void)concatenate({a, b});
       }},
      {"stack",
       [&] {
         (void)stack({a, m});
       }},
      {"split", [&] { (void)split(a, 4, 1); }},
      {"pad",
       [&] {
         (void)pad(a, {{1, 1}});
       }},
      {"sum", [&] { (void)sum(a, {3}); }},
      {"mean", [&] { (void)mean(a, {-4}); }},
      {"max", [&] { (void)max(a, {2}); }},
      {"softmax", [&] { (void)softmax(a, 2); }},
      {"argmax", [&] { (void)argmax(a, 2); }},
      {"take", [&] { (void)take(a, tensor({9})); }},
      {"one_hot", [&] { (void)one_hot(a, 3); }},
      {"conv2d", [&] { (void)conv2d(a, a); }},
      {"max_pool2d", [&] { (void)max_pool2d(a); }},
      {"astype of undefined", [&] { (void)astype(Tensor(), float64); }},
      {"operator+", [&] { (void)(a + b); }},
      {"operator-", [&] { (void)(a - b); }},
      {"operator*", [&] { (void)(a * b); }},
      {"operator/", [&] { (void)(a / b); }},
      {"operator<", [&] { (void)(a < b); }},
      {"operator==", [&] { (void)(a == b); }},
      {"operator&&", [&] { (void)(flag && ones({3}, bool_)); }},
      {"operator+ (scalar)", [&] { (void)(Tensor() + 1.0); }},
      {"operator+=",
       [&] {
         Tensor c = a;
         c += b;
       }},
      {"operator*= (scalar)",
       [&] {
         Tensor c;
         c *= 2.0;
       }},
  };
  for (const BadCall& c : calls) {
    try {
      c.call();
      ADD_FAILURE() << c.what << ": expected an Error";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("test_usability.cpp:"), std::string::npos) << c.what << ": " << msg;
    }
  }
}

TEST(Errors, OperatorErrorsNameTheLineOfTheExpression) {
  const Tensor a = ones({2, 3}), b = ones({4});
  const int line = __LINE__ + 2;
  try {
    (void)(a * 2.0 + b);
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind("[add] shapes cannot be broadcast together", 0), 0u) << msg;
    EXPECT_NE(msg.find("test_usability.cpp:" + std::to_string(line)), std::string::npos) << msg;
  }
}

TEST(Errors, ATracedValueUsedAfterItsTraceSaysItEscaped) {
  Tensor leaked;
  auto f = jit([&](const Tensor& x) {
    leaked = x * 2.0;
    return x + 1.0;
  });
  (void)f(ones({3}));
  for (const auto& use : std::vector<std::function<void()>>{
           [&] { (void)leaked.to_vector<float>(); },  // asking for its value
           [&] { (void)(leaked + 1.0); },             // computing with it eagerly
           [&] { (void)jit([&](const Tensor& x) { return x + leaked; })(ones({3})); }}) {
    try {
      use();
      ADD_FAILURE() << "expected an Error";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("a traced value escaped the function that traced it"), std::string::npos)
          << msg;
      EXPECT_NE(msg.find("created at"), std::string::npos) << msg;
      EXPECT_NE(msg.find("test_usability.cpp"), std::string::npos) << msg;
      EXPECT_EQ(msg.find("kiln::cond"), std::string::npos) << msg;
    }
  }
}

TEST(Operators, CompoundAssignmentRebindsTheHandle) {
  Tensor x = tensor({1.0, 2.0, 3.0});
  const Tensor view = x;  // another handle to the old value
  x += tensor({1.0, 1.0, 1.0});
  x *= 2.0;
  x -= 1;
  x /= tensor({1.0, 2.0, 4.0});
  // ((v + 1) * 2 - 1) / d
  EXPECT_EQ(x.to_vector<double>(), (std::vector<double>{3.0, 2.5, 1.75}));
  EXPECT_EQ(view.to_vector<double>(), (std::vector<double>{1.0, 2.0, 3.0}));  // untouched
  // Inside a traced function it records like the plain operators.
  auto f = jit([](Tensor a) {
    a += 1.0;
    a *= a;
    return a;
  });
  EXPECT_EQ(f(tensor({1.f, 2.f})).to_vector<float>(), (std::vector<float>{4.f, 9.f}));
  EXPECT_EQ(grad([](Tensor a) {
              a *= a;
              return sum(a);
            })(tensor({3.0}))
                .to_vector<double>(),
            (std::vector<double>{6.0}));
}

// A JAX user writes `return carry, y`: in C++ a std::tuple is as natural as a std::pair.
TEST(ControlFlowTypes, ScanBodyMayReturnATuple) {
  const Tensor xs = tensor({1.0, 2.0, 3.0, 4.0});
  auto cumsum = [](const Tensor& c, const Tensor& x) { return std::tuple{c + x, c + x}; };
  const auto [last, ys] = scan(cumsum, tensor(0.0), xs);
  EXPECT_EQ(last.to_vector<double>(), (std::vector<double>{10.0}));
  EXPECT_EQ(ys.to_vector<double>(), (std::vector<double>{1.0, 3.0, 6.0, 10.0}));
  const auto traced = jit([&](const Tensor& x) { return scan(cumsum, tensor(0.0), x).second; });
  EXPECT_EQ(traced(xs).to_vector<double>(), (std::vector<double>{1.0, 3.0, 6.0, 10.0}));
}

}  // namespace
}  // namespace kiln
