// The tests' one closeness check (testing.h, expect_allclose): numpy.isclose's rule, NaN and
// infinities, shapes, dtypes and the failure message.
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "kiln/kiln.h"
#include "testing.h"

using namespace kiln;
using kiln::testing::expect_allclose;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNan = std::numeric_limits<double>::quiet_NaN();

TEST(Allclose, BoundIsAtolPlusRtolTimesWant) {
  const Closeness tol{.rtol = 1e-3, .atol = 1e-6};
  // |got - want| = 1e-3 against a bound of 1e-6 + 1e-3 * 1.0: inside.
  expect_allclose(tensor({1.001, 0.0}), {1.0, 1e-6}, tol);
  // Just past the bound 1e-6 + 1e-3 * 2 = 2.001e-3, and past atol alone.
  EXPECT_NONFATAL_FAILURE(expect_allclose(tensor({2.0021}), {2.0}, tol), "bound");
  EXPECT_NONFATAL_FAILURE(expect_allclose(tensor({2e-6}), {0.0}, tol), "bound");
  // Relative to want, not got: numpy's asymmetric rule.
  EXPECT_NONFATAL_FAILURE(expect_allclose(tensor({2.0}), {1.0}, {.rtol = 0.6, .atol = 0}), "");
  expect_allclose(tensor({1.0}), {2.0}, {.rtol = 0.6, .atol = 0});
}

TEST(Allclose, NanMatchesOnlyANanAtTheSamePositionAndOnlyWithEqualNan) {
  expect_allclose(tensor({kNan, 1.0}), {kNan, 1.0}, {.rtol = 0, .atol = 0, .equal_nan = true});
  EXPECT_NONFATAL_FAILURE(expect_allclose(tensor({kNan}), {kNan}), "1 of 1 elements");
  EXPECT_NONFATAL_FAILURE(expect_allclose(tensor({kNan, 1.0}), {1.0, kNan}, {.equal_nan = true}),
                          "2 of 2 elements");
  EXPECT_NONFATAL_FAILURE(
      expect_allclose(tensor({1.0}), {kNan}, {.rtol = 1, .atol = 1, .equal_nan = true}), "");
}

TEST(Allclose, InfinityEqualsOnlyTheSameInfinity) {
  expect_allclose(tensor({kInf, -kInf}), {kInf, -kInf}, {.rtol = 0, .atol = 0});
  EXPECT_NONFATAL_FAILURE(expect_allclose(tensor({kInf}), {-kInf}, {.rtol = 1, .atol = 1}), "");
  // An infinite bound does not admit a finite value for an infinity, or the reverse.
  EXPECT_NONFATAL_FAILURE(expect_allclose(tensor({1e300}), {kInf}, {.rtol = 1, .atol = 1}), "");
  EXPECT_NONFATAL_FAILURE(expect_allclose(tensor({kInf}), {1e300}, {.rtol = 1, .atol = 1}), "");
}

TEST(Allclose, ShapesAndDtypesMustMatch) {
  EXPECT_NONFATAL_FAILURE(expect_allclose(zeros({2, 3}), zeros({3, 2})), "f32[2,3], want f32[3,2]");
  EXPECT_NONFATAL_FAILURE(expect_allclose(zeros({2}, int32), zeros({2}, int64)), "want i64[2]");
  EXPECT_NONFATAL_FAILURE(expect_allclose(zeros({2}, float64), zeros({2}, float32)), "");
  EXPECT_NONFATAL_FAILURE(expect_allclose(zeros({2}), {0.0, 0.0, 0.0}), "2 elements, want 3");
  // A floating result against a float64 reference is the one promotion.
  expect_allclose(astype(tensor({0.1, 0.2}), float32), tensor({0.1, 0.2}), {.rtol = 1e-7});
}

TEST(Allclose, FailuresPointAtTheCallersLine) {
  ::testing::TestPartResultArray results;
  int line = 0;
  {
    ::testing::ScopedFakeTestPartResultReporter reporter(
        ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD, &results);
    line = __LINE__ + 1;
    expect_allclose(tensor({1.0}), {2.0});
  }
  ASSERT_EQ(results.size(), 1);
  EXPECT_EQ(results.GetTestPartResult(0).line_number(), line);
  EXPECT_NE(std::string(results.GetTestPartResult(0).file_name()).find("test_allclose.cpp"),
            std::string::npos);
}

TEST(Allclose, FailureNamesWhatTheWorstElementAndTheBound) {
  EXPECT_NONFATAL_FAILURE(
      expect_allclose(tensor({1.0, 5.0, 2.5}), {1.0, 2.0, 2.0}, {.rtol = 0, .atol = 0.1}, "row"),
      "row: 2 of 3 elements differ; worst at flat index 1: got 5, want 2, |got - want| 3 > bound "
      "0.10000000000000001");
}

}  // namespace
