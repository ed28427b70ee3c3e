// Sorting, scans and selection (src/ops/sort.cpp) against numpy and PyTorch 1.13 reference
// values generated at build time (tests/reference/sort_ref.py); edge values, errors, jit vs
// eager, gradients vs finite differences and vmap vs a loop. The registry walks
// (tests/primitive_samples.cpp) check every rule of the primitives as well.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kiln/kiln.h"
#include "testing.h"

using namespace kiln;

namespace {

using kiln::testing::at;
using kiln::testing::expect_close;
using kiln::testing::expect_error;
using kiln::testing::numeric_grad;

const io::TensorFile& ref() {
  static const io::TensorFile f = kiln::testing::reference("sort");
  return f;
}
Tensor R(const std::string& name) { return at(ref(), name); }

// Same shape, dtype and values: NaN matches NaN, and zeros match in sign.
void expect_identical(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  ASSERT_EQ(got.dtype(), want.dtype()) << what;
  const std::vector<double> g = astype(got, float64).to_vector<double>();
  const std::vector<double> w = astype(want, float64).to_vector<double>();
  for (std::size_t i = 0; i < g.size(); ++i) {
    if (std::isnan(w[i])) {
      ASSERT_TRUE(std::isnan(g[i])) << what << " at " << i;
      continue;
    }
    ASSERT_EQ(g[i], w[i]) << what << " at " << i;
    ASSERT_EQ(std::signbit(g[i]), std::signbit(w[i])) << what << " sign of zero at " << i;
  }
}
TEST(Sort, MatchesNumpyAndTorchWithTiesZerosInfAndNaN) {
  for (const std::string name : {"f32", "f64", "i32", "long"}) {
    const Tensor x = R("sort/" + name + "/x");
    for (const int64_t axis :
         x.rank() > 1 ? std::vector<int64_t>{0, -1} : std::vector<int64_t>{-1}) {
      const std::string c = "sort/" + name + "/axis" + std::to_string(axis) + "/";
      const SortResult up = sort_with_indices(x, axis);
      expect_identical(up.values, R(c + "values"), c + "values");
      expect_identical(up.indices, R(c + "indices"), c + "indices");
      expect_identical(argsort(x, axis), R(c + "indices"), c + "argsort");
      const SortResult down = sort_with_indices(x, axis, true);
      expect_identical(down.values, R(c + "desc_values"), c + "desc_values");
      expect_identical(down.indices, R(c + "desc_indices"), c + "desc_indices");
    }
  }
}

TEST(Sort, LongLinesGiveTheSameResultOnOneAndTwoThreads) {
  const Tensor x = R("sort/long/x");
  const int threads = num_threads();
  set_num_threads(1);
  const SortResult one = sort_with_indices(x);
  set_num_threads(2);
  const SortResult two = sort_with_indices(x);
  set_num_threads(threads);
  expect_identical(one.indices, two.indices, "indices");
  expect_identical(one.indices, R("sort/long/axis-1/indices"), "indices vs numpy");
}

TEST(Sort, BoolAndUnsigned) {
  EXPECT_EQ(sort(tensor(std::vector<bool>{true, false, true})).to_vector<bool>(),
            (std::vector<bool>{false, true, true}));
  const Tensor u = astype(tensor(std::vector<int64_t>{200, 3, 255, 0}), uint8);
  EXPECT_EQ(argsort(u, 0, true).to_vector<int64_t>(), (std::vector<int64_t>{2, 0, 1, 3}));
}

TEST(Sort, EmptyAndErrors) {
  EXPECT_EQ(sort(zeros(Shape{0})).shape(), Shape{0});
  EXPECT_EQ(argsort(zeros(Shape{3, 0}), 0).shape(), (Shape{3, 0}));
  expect_error([] { sort(tensor(1.0f)); }, "sort", {"axis"});
  expect_error([] { sort(zeros(Shape{2, 3}), 2); }, "sort", {"axis"});
  expect_error([] { top_k(zeros(Shape{2, 3}), 4); }, "top_k", {"k out of range", "got k = 4"});
  expect_error([] { top_k(zeros(Shape{2, 3}), -1); }, "top_k", {"k out of range"});
  expect_error([] { top_k(tensor(1.0f), 1); }, "top_k", {"0-d"});
}

TEST(TopK, MatchesTorchAndTheIssueExample) {
  const SortResult t = top_k(R("top_k/x"), 3);
  expect_identical(t.values, R("top_k/values"), "values");
  expect_identical(t.indices, R("top_k/indices"), "indices");
  // top_k as documented (docs/OPS.md); ties go to the lower index.
  const SortResult u = top_k(tensor({3.f, 1.f, 4.f, 1.f, 5.f}), 2);
  EXPECT_EQ(u.values.to_vector<float>(), (std::vector<float>{5.f, 4.f}));
  EXPECT_EQ(top_k(tensor({1.f, 2.f, 2.f, 2.f}), 2).indices.to_vector<int64_t>(),
            (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(top_k(zeros(Shape{2, 3}), 0).values.shape(), (Shape{2, 0}));
}

TEST(Scans, MatchNumpy) {
  for (const std::string name : {"f32", "f64", "i32", "edge", "zeros"}) {
    const Tensor x = R("scan/" + name + "/x");
    // float32 sums accumulate in double here and in float32 in numpy.
    const double rtol = x.dtype() == float32 ? 1e-5 : 1e-12;
    for (const int64_t axis : {0, 1}) {
      const std::string c = "scan/" + name + "/axis" + std::to_string(axis) + "/";
      expect_close(cumsum(x, axis), R(c + "cumsum"), rtol, c + "cumsum");
      expect_close(cumprod(x, axis), R(c + "cumprod"), rtol, c + "cumprod");
      expect_identical(cummax(x, axis), R(c + "cummax"), c + "cummax");
      expect_identical(cummin(x, axis), R(c + "cummin"), c + "cummin");
      if (is_floating(x.dtype()))
        expect_close(cumlogsumexp(x, axis), R(c + "cumlogsumexp"), rtol, c + "cumlogsumexp");
    }
  }
}

TEST(Scans, LongLinesMatchNumpyOnOneAndTwoThreads) {
  const Tensor x = R("scan/long/x");
  const int threads = num_threads();
  for (const int n : {1, 2}) {
    set_num_threads(n);
    // Chunked sums round differently from numpy's running sum (by ~1e-13 here).
    expect_close(cumsum(x), R("scan/long/cumsum"), 1e-10, "cumsum");
    expect_close(cumlogsumexp(x), R("scan/long/cumlogsumexp"), 1e-12, "cumlogsumexp");
    expect_identical(cummax(x), R("scan/long/cummax"), "cummax");
  }
  set_num_threads(1);
  const Tensor one = cumsum(x);
  set_num_threads(2);
  expect_identical(cumsum(x), one, "cumsum: the same bits on one and two threads");
  set_num_threads(threads);
}

TEST(Scans, DtypesShapesAndErrors) {
  EXPECT_EQ(cumsum(tensor(std::vector<bool>{true, false, true})).dtype(), int64);
  EXPECT_EQ(cumsum(arange(5), 0).to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 3, 6, 10}));
  EXPECT_EQ(cumsum(tensor(2.0)).shape(), Shape{1});  // no axis: flattened, like numpy
  EXPECT_EQ(cumprod(zeros(Shape{0, 3}), 0).shape(), (Shape{0, 3}));
  EXPECT_EQ(cummax(zeros(Shape{2, 0}), 1).shape(), (Shape{2, 0}));
  EXPECT_EQ(cumlogsumexp(arange(3)).dtype(), to_floating(int64));
  expect_error([] { cumsum(zeros(Shape{2, 3}), 2); }, "cumsum", {"axis"});
  expect_error([] { cummin(zeros(Shape{2, 3}), -3); }, "cummin", {"axis"});
}

TEST(SearchSorted, MatchesNumpyOnBothSides) {
  const Tensor s = R("searchsorted/sorted"), v = R("searchsorted/values");
  expect_identical(searchsorted(s, v), R("searchsorted/left"), "left");
  expect_identical(searchsorted(s, v, Side::right), R("searchsorted/right"), "right");
  expect_identical(searchsorted(astype(s, float32), astype(v, float32), Side::right),
                   R("searchsorted/right"), "right, f32");
  EXPECT_EQ(searchsorted(zeros(Shape{0}), tensor(1.0f)).item<int64_t>(), 0);
  expect_error([] { searchsorted(zeros(Shape{2, 2}), zeros(Shape{3})); }, "searchsorted", {"1-d"});
}

TEST(Quantile, MatchesNumpyLinearInterpolationAndNaN) {
  const Tensor x = R("quantile/x");
  for (const double q : {0.0, 0.25, 0.5, 0.7, 1.0}) {
    std::string qs = std::to_string(q);
    qs = qs.substr(0, qs.find_last_not_of('0') + 1);
    if (qs.back() == '.') qs += "0";
    expect_close(quantile(x, q, 1), R("quantile/axis1/q" + qs), 1e-12, "axis 1, q " + qs);
    expect_close(quantile(x, q, 0), R("quantile/axis0/q" + qs), 1e-12, "axis 0, q " + qs);
  }
  const Tensor xi = R("median/i32/x");
  expect_close(median(xi), reshape(R("median/i32/all"), Shape{}), 1e-12, "median");
  expect_close(median(xi, 0), R("median/i32/axis0"), 1e-12, "median axis 0");
  EXPECT_EQ(median(xi, 1, true).shape(), (Shape{4, 1}));
  EXPECT_EQ(median(xi, std::nullopt, true).shape(), (Shape{1, 1}));
  EXPECT_EQ(median(tensor(3.0)).item<double>(), 3.0);
  expect_error([] { quantile(zeros(Shape{3}), 1.5); }, "quantile", {"q out of range"});
  expect_error([] { median(zeros(Shape{2, 0}), 1); }, "quantile", {"empty axis"});
}

TEST(Std, MatchesNumpyWithDdof) {
  const Tensor x = R("std/x");
  expect_close(kiln::std(x), reshape(R("std/all"), Shape{}), 1e-6, "std");
  expect_close(kiln::std(x, {1}, false, 1), R("std/axis1_ddof1"), 1e-6, "std ddof 1");
}

// ---- transformations ----------------------------------------------------------------------

Tensor sample(Shape s, uint32_t seed) {
  return tensor(kiln::testing::random_values(s.numel(), seed, -2.0, 2.0), s);
}

TEST(SortTransforms, JitMatchesEager) {
  const Tensor x = sample(Shape{4, 7}, 1);
  auto f = [](const Tensor& a) {
    return sort(a, 0) + cumsum(a, 1) + cumprod(a, 0) + cummax(a, 1) + cummin(a, 0) +
           cumlogsumexp(a, 1) + astype(argsort(a, 1, true), float64) + sum(top_k(a, 2).values) +
           median(a, 1, true) + quantile(a, 0.3, 0, true) + kiln::std(a) +
           astype(searchsorted(sort(flatten(a)), a), float64);
  };
  expect_close(jit(f)(x), f(x), 1e-12, "jit vs eager");
}

TEST(SortTransforms, GradientsMatchFiniteDifferences) {
  const Tensor x = sample(Shape{3, 6}, 2), w = sample(Shape{3, 6}, 3);
  const std::vector<std::function<Tensor(const Tensor&)>> fs{
      [w](const Tensor& a) { return sum(sort(a, 1) * w); },
      [w](const Tensor& a) {
        return sum(top_k(a, 2).values * slice(w, {{}, Slice{0, 2}}));
      },
      [w](const Tensor& a) { return sum(cumsum(a, 0) * w); },
      [w](const Tensor& a) { return sum(cumprod(a, 1) * w); },
      [w](const Tensor& a) { return sum(cummax(a, 1) * w); },
      [w](const Tensor& a) { return sum(cumlogsumexp(a, 1) * w); },
      [](const Tensor& a) { return sum(median(a, 1)); },
      [](const Tensor& a) { return sum(quantile(a, 0.3, 0)); },
      [](const Tensor& a) { return sum(kiln::std(a, {1}, false, 1)); },
  };
  for (std::size_t k = 0; k < fs.size(); ++k) {
    const std::vector<double> g = grad(fs[k])(x).to_vector<double>(), n = numeric_grad(fs[k], x);
    for (std::size_t i = 0; i < g.size(); ++i)
      EXPECT_NEAR(g[i], n[i], 1e-5) << "f" << k << " at " << i;
  }
}

TEST(SortTransforms, CumprodGradientIsExactAtZeros) {
  // d/dx_j prod_{k<=i} x_k = prod of the others: with one zero, only its own partial survives;
  // with two zeros, all partials are zero. No division, so no NaN.
  const Tensor x = tensor({2.0, 0.0, 3.0, 0.0, 5.0});
  const std::vector<double> g =
      grad([](const Tensor& a) { return sum(cumprod(a)); })(x).to_vector<double>();
  // Partials of y1 = 2*0, y2 = 2*0*3 (y3, y4 have two zeros): dy/dx1 = 2 + 2*3.
  EXPECT_EQ(g, (std::vector<double>{1.0, 8.0, 0.0, 0.0, 0.0}));
}

TEST(SortTransforms, CummaxRoutesTiesToTheEarliestIndex) {
  const Tensor x = tensor({1.0, 3.0, 3.0, 2.0});
  const std::vector<double> g =
      grad([](const Tensor& a) { return sum(cummax(a)); })(x).to_vector<double>();
  EXPECT_EQ(g, (std::vector<double>{1.0, 3.0, 0.0, 0.0}));
}

TEST(SortTransforms, CumlogsumexpGradientIsFiniteForMinusInf) {
  const Tensor x = tensor(std::vector<double>{-INFINITY, -INFINITY, 0.0, 1.0});
  const std::vector<double> g =
      grad([](const Tensor& a) { return sum(cumlogsumexp(a)); })(x).to_vector<double>();
  for (double v : g) EXPECT_TRUE(std::isfinite(v));
  EXPECT_EQ(g[0], 0.0);
}

TEST(SortTransforms, VmapMatchesALoop) {
  const Tensor xs = sample(Shape{3, 4, 5}, 4);
  auto f = [](const Tensor& a) {
    return sort(a, 0, true) + cumsum(a, 1) + cummax(a, 0) + median(a, 1, true) +
           astype(argsort(a, -1), float64);
  };
  const Tensor batched = vmap(f)(xs);
  for (int64_t i = 0; i < 3; ++i)
    expect_close(index(batched, i), f(index(xs, i)), 1e-12, "example");
  const Tensor s = sort(flatten(xs));
  const Tensor found = vmap([&](const Tensor& v) { return searchsorted(s, v); })(xs);
  expect_identical(found, searchsorted(s, xs), "searchsorted, shared sequence");
}

}  // namespace
