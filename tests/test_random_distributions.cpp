// The samplers of kiln/random.h beyond uniform and normal: categorical, truncated normal,
// gamma / loggamma, beta, dirichlet, choice.
//
// Statistical checks use fixed keys and tolerances from the sample size: decile bins against
// scipy's quantiles (tests/reference/random_distributions_ref.py) with a chi-square threshold
// at p = 1e-6, and counts or means within 5 standard errors of the analytic value. Also:
// determinism (same key, same samples; split keys differ), vmap over keys vs a loop, jit vs
// eager, edge parameters, errors, and the zero derivative with respect to the parameters.
#include <gtest/gtest.h>
#include <kiln/kiln.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "testing.h"

namespace kiln {
namespace {

constexpr int64_t kN = 20000;
constexpr double kInf = std::numeric_limits<double>::infinity();

std::vector<double> values(const Tensor& t) { return t.to_vector<double>(); }

// Chi-square statistic of samples binned at the nine deciles (expected n/10 per bin).
double decile_chi2(const std::vector<double>& xs, const std::vector<double>& deciles) {
  std::vector<double> count(10, 0.0);
  for (double x : xs)
    count[std::upper_bound(deciles.begin(), deciles.end(), x) - deciles.begin()] += 1;
  const double expect = static_cast<double>(xs.size()) / 10;
  double chi2 = 0;
  for (double c : count) chi2 += (c - expect) * (c - expect) / expect;
  return chi2;
}

void expect_deciles(const Tensor& samples, const std::string& ref_case) {
  const io::TensorFile ref = testing::reference("random_distributions");
  const double limit = testing::at(ref, "chi2_9_isf_1e-6").item<double>();
  EXPECT_LT(decile_chi2(values(samples), values(testing::at(ref, ref_case))), limit) << ref_case;
}

// The counts of each index in [0, p.size()) within 5 binomial standard deviations of n p.
void expect_frequencies(const Tensor& indices, const std::vector<double>& p) {
  std::vector<double> count(p.size(), 0.0);
  for (double i : values(indices)) count.at(static_cast<std::size_t>(i)) += 1;
  const auto n = static_cast<double>(indices.numel());
  for (std::size_t i = 0; i < p.size(); ++i)
    EXPECT_NEAR(count[i], n * p[i], 5 * std::sqrt(n * p[i] * (1 - p[i])) + 1e-9) << "index " << i;
}

void expect_same(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  EXPECT_EQ(a.dtype(), b.dtype());
  const std::vector<double> va = values(a), vb = values(b);
  ASSERT_EQ(va.size(), vb.size());
  for (std::size_t i = 0; i < va.size(); ++i)
    EXPECT_TRUE(va[i] == vb[i] || (std::isnan(va[i]) && std::isnan(vb[i])))
        << "element " << i << ": " << va[i] << " vs " << vb[i];
}

// ---- statistics ----------------------------------------------------------------------------

TEST(Categorical, FrequenciesFollowSoftmax) {
  const std::vector<double> logits{0.5, -1.0, 2.0, 0.0, -0.3};
  double z = 0;
  for (double l : logits) z += std::exp(l);
  std::vector<double> p;
  for (double l : logits) p.push_back(std::exp(l) / z);
  for (DType dt : {float32, float64}) {
    const Tensor s = random::categorical(random::key(1), astype(tensor(logits), dt), -1, {kN});
    EXPECT_EQ(s.dtype(), int64);
    EXPECT_EQ(s.shape(), Shape({kN}));
    expect_frequencies(s, p);
  }
}

TEST(Categorical, IssueUsageAndAxis) {
  const Tensor s = random::categorical(random::key(0), log_softmax(zeros({3, 5})));
  EXPECT_EQ(s.shape(), Shape({3}));
  for (double v : values(s)) EXPECT_TRUE(v >= 0 && v < 5);
  // axis 0 of [5, 3]: categories along the rows.
  const Tensor t = random::categorical(random::key(0), zeros({5, 3}), 0);
  EXPECT_EQ(t.shape(), Shape({3}));
  // Many rows of one distribution: each row is its own draw.
  const Tensor rows =
      random::categorical(random::key(2), broadcast_to(tensor({0.0, 0.0}), {kN, 2}));
  expect_frequencies(rows, {0.5, 0.5});
}

TEST(Categorical, MinusInfinityIsNeverDrawn) {
  const Tensor logits = tensor({-kInf, 0.0, -kInf, 3.0, -kInf});
  const Tensor s = random::categorical(random::key(3), logits, -1, Shape{kN});
  for (double v : values(s)) EXPECT_TRUE(v == 1 || v == 3) << v;
  // All -inf: index 0, documented.
  EXPECT_EQ(random::categorical(random::key(3), full({4}, -kInf, float64)).item<int64_t>(), 0);
}

TEST(TruncatedNormal, DecilesMatchScipy) {
  const struct {
    double lo, hi;
    const char* name;
  } cases[] = {{-1.0, 2.0, "-1_2"},
               {3.0, kInf, "3_inf"},
               {-kInf, -5.0, "-inf_-5"},
               {10.0, 10.5, "10_10.5"},
               {-0.5, 0.5, "-0.5_0.5"}};
  for (const auto& c : cases) {
    const Tensor s = random::truncated_normal(random::key(4), c.lo, c.hi, {kN}, float64);
    for (double v : values(s)) ASSERT_TRUE(v >= c.lo && v <= c.hi) << c.name << ": " << v;
    expect_deciles(s, std::string("truncnorm/") + c.name);
  }
  const Tensor f = random::truncated_normal(random::key(5), -1.0, 2.0, {kN}, float32);
  EXPECT_EQ(f.dtype(), float32);
  expect_deciles(f, "truncnorm/-1_2");
}

TEST(TruncatedNormal, FarTailsAndNarrowIntervalsStayInside) {
  // Beyond double's normal CDF: the exponential approximation, mean ~ a + 1/a.
  const Tensor far = random::truncated_normal(random::key(6), 40.0, kInf, {kN}, float64);
  double m = 0;
  for (double v : values(far)) {
    ASSERT_TRUE(v >= 40.0 && std::isfinite(v)) << v;
    m += v / kN;
  }
  // Mean of the tail beyond a: phi(a) / (1 - Phi(a)) = a + 1/a - 2/a^3 + ...; sd ~ 1/a.
  EXPECT_NEAR(m, 40.0 + 1.0 / 40, 5 * (1.0 / 40) / std::sqrt(kN) + 1e-4);
  const Tensor below = random::truncated_normal(random::key(6), -kInf, -50.0, {100}, float64);
  for (double v : values(below)) ASSERT_TRUE(v <= -50.0 && v > -51.0) << v;
  const Tensor narrow = random::truncated_normal(random::key(7), 1.0, 1.0 + 1e-13, {100}, float64);
  for (double v : values(narrow)) ASSERT_TRUE(v >= 1.0 && v <= 1.0 + 1e-13) << v;
  const Tensor all = random::truncated_normal(random::key(8), -kInf, kInf, {kN}, float64);
  EXPECT_NEAR(values(mean(all)).at(0), 0.0, 5 / std::sqrt(kN));
}

TEST(Gamma, DecilesMatchScipy) {
  for (double alpha : {0.1, 0.5, 1.0, 2.5, 10.0, 1e4}) {
    const Tensor s = random::gamma(random::key(9), full({}, alpha, float64), {kN});
    EXPECT_EQ(s.shape(), Shape({kN}));
    char name[32];
    std::snprintf(name, sizeof name, "gamma/%g", alpha);
    expect_deciles(s, name);
  }
  const Tensor f = random::gamma(random::key(10), full({kN}, 2.5, float32));
  EXPECT_EQ(f.dtype(), float32);
  expect_deciles(f, "gamma/2.5");
}

TEST(Gamma, MeanAndVarianceWithinStandardErrors) {
  // Gamma(alpha): mean alpha, variance alpha; the sample variance's sd is ~ alpha sqrt(2/n)
  // (plus the excess kurtosis 6/alpha).
  for (double alpha : {0.3, 3.0, 1e10}) {
    const Tensor s = random::gamma(random::key(11), full({}, alpha, float64), Shape{kN});
    const double m = values(mean(s)).at(0), v = values(var(s)).at(0);
    EXPECT_NEAR(m, alpha, 5 * std::sqrt(alpha / kN)) << alpha;
    EXPECT_NEAR(v, alpha, 5 * alpha * std::sqrt((2 + 6 / alpha) / kN)) << alpha;
  }
}

TEST(Gamma, TinyAndHugeAlpha) {
  // Tiny alpha: gamma underflows to 0 (or a tiny value), loggamma stays finite and matches
  // the analytic log-quantiles.
  for (const char* name : {"1e-30", "0.001"}) {
    const double alpha = std::stod(name);
    const Tensor lg = random::loggamma(random::key(12), full({kN}, alpha, float64));
    for (double v : values(lg)) ASSERT_TRUE(std::isfinite(v)) << v;
    expect_deciles(lg, std::string("loggamma/") + name);
    for (double v : values(random::gamma(random::key(12), full({100}, alpha, float64))))
      ASSERT_TRUE(v >= 0 && std::isfinite(v)) << v;
  }
  // Huge alpha: relative spread 1/sqrt(alpha).
  for (double v : values(random::gamma(random::key(13), full({100}, 1e300, float64))))
    EXPECT_NEAR(v / 1e300, 1.0, 1e-12);
  EXPECT_EQ(values(random::gamma(random::key(13), full({}, 3e38, float32))).size(), 1u);
}

TEST(Gamma, InvalidAlphaGivesNaNAndInfinity) {
  const Tensor s = random::gamma(
      random::key(14), tensor({0.0, -1.0, std::numeric_limits<double>::quiet_NaN(), kInf, -0.0}));
  const std::vector<double> v = values(s);
  EXPECT_TRUE(std::isnan(v[0]) && std::isnan(v[1]) && std::isnan(v[2]) && std::isnan(v[4]));
  EXPECT_EQ(v[3], kInf);
}

TEST(Beta, DecilesMatchScipy) {
  const struct {
    double a, b;
    const char* name;
  } cases[] = {{0.5, 0.5, "0.5_0.5"}, {2.0, 5.0, "2_5"}, {0.1, 0.3, "0.1_0.3"}};
  for (const auto& c : cases) {
    const Tensor s =
        random::beta(random::key(15), full({}, c.a, float64), full({}, c.b, float64), Shape{kN});
    for (double v : values(s)) ASSERT_TRUE(v >= 0 && v <= 1) << v;
    expect_deciles(s, std::string("beta/") + c.name);
  }
  // Tiny parameters: samples pile at 0 and 1 but stay numbers (no 0/0).
  for (double v :
       values(random::beta(random::key(16), full({1000}, 1e-4, float64), full({}, 1e-4, float64))))
    ASSERT_TRUE(v >= 0 && v <= 1) << v;
}

TEST(Dirichlet, RowsSumToOneAndMarginalsAreBeta) {
  const Tensor alpha = tensor({1.0, 2.0, 3.0});
  const Tensor s = random::dirichlet(random::key(17), alpha, Shape{kN});
  EXPECT_EQ(s.shape(), Shape({kN, 3}));
  for (double v : values(sum(s, {1}))) ASSERT_NEAR(v, 1.0, 1e-12);
  for (int64_t i = 0; i < 3; ++i)
    expect_deciles(take(s, full({}, static_cast<double>(i), int64), 1),
                   "dirichlet/" + std::to_string(i));
  // alpha's own batch shape is the default.
  EXPECT_EQ(random::dirichlet(random::key(17), ones({4, 2}, float32)).shape(), Shape({4, 2}));
}

TEST(Choice, WithReplacementUniformAndWeighted) {
  expect_frequencies(random::choice(random::key(18), 4, {kN}), {0.25, 0.25, 0.25, 0.25});
  const std::vector<double> p{0.1, 0.0, 0.6, 0.3};
  const Tensor w = random::choice(random::key(19), 4, {kN}, true, tensor(p));
  expect_frequencies(w, p);
}

TEST(Choice, WithoutReplacementDistinctAndWeighted) {
  const Tensor s = random::choice(random::key(20), 10, {2, 5}, false);
  EXPECT_EQ(s.shape(), Shape({2, 5}));
  std::vector<double> v = values(s);
  EXPECT_EQ(std::set<double>(v.begin(), v.end()).size(), 10u);
  // Weighted, one draw per key: the first draw follows p.
  const std::vector<double> p{0.1, 0.0, 0.6, 0.3};
  const Tensor keys = random::split(random::key(21), 4000);
  const Tensor w = random::choice(keys, 4, {3}, false, tensor(p));
  EXPECT_EQ(w.shape(), Shape({4000, 3}));
  std::vector<double> first;
  const std::vector<double> all = values(w);
  for (std::size_t r = 0; r < 4000; ++r) {
    const std::set<double> row(all.begin() + 3 * r, all.begin() + 3 * r + 3);
    ASSERT_EQ(row.size(), 3u);
    ASSERT_EQ(row.count(1.0), 0u);  // weight 0 never drawn
    first.push_back(all[3 * r]);
  }
  expect_frequencies(tensor(first), p);
  // Elements of an array.
  const Tensor a = tensor({10.0, 20.0, 30.0, 40.0, 50.0, 60.0}, {3, 2});
  const Tensor rows = random::choice(random::key(22), a, {3}, false);
  EXPECT_EQ(rows.shape(), Shape({3, 2}));
  EXPECT_DOUBLE_EQ(values(sum(rows)).at(0), 210.0);
}

TEST(Choice, Errors) {
  testing::expect_error([] { random::choice(random::key(0), 3, {4}, false); }, "choice",
                        {"too many draws without replacement", "4", "n=3"});
  testing::expect_error([] { random::choice(random::key(0), 0, {1}); }, "choice",
                        {"nothing to choose from"});
  testing::expect_error(
      [] {
        random::choice(random::key(0), 3, {2}, false, tensor({0.5, 0.0, 0.0}));
      },
      "choice", {"too few non-zero weights", "got 1 of 3"});
  testing::expect_error(
      [] {
        random::choice(random::key(0), 3, {2}, true, tensor({0.5, 0.5}));
      },
      "choice", {"weights do not match", "[3]"});
  testing::expect_error(
      [] {
        random::choice(random::key(0), 2, {2}, false, tensor({0.5, std::nan("")}));
      },
      "choice", {"invalid weight"});
}

TEST(RandomDistributions, Errors) {
  testing::expect_error([] { random::truncated_normal(random::key(0), 1.0, 1.0, {3}); },
                        "random_truncated_normal", {"empty interval", "lower < upper"});
  testing::expect_error([] { random::truncated_normal(random::key(0), 0.0, 1.0, {3}, int32); },
                        "random_truncated_normal", {"non-float dtype"});
  testing::expect_error(
      [] {
        random::gamma(random::key(0), tensor({1, 2}));
      },
      "gamma", {"non-float alpha", "i32"});
  testing::expect_error([] { random::categorical(random::key(0), zeros({3}), 1); }, "categorical",
                        {"axis out of range"});
  testing::expect_error(
      [] {
        random::categorical(random::key(0), zeros({3, 0}));
      },
      "categorical", {"no categories"});
  testing::expect_error([] { random::gamma(zeros({2}), ones({3})); }, "random_gamma",
                        {"invalid key"});
  testing::expect_error([] { random::dirichlet(random::key(0), ones({})); }, "dirichlet",
                        {"0-d alpha"});
  // The primitives: parameters must follow the key's batch axes.
  testing::expect_error(
      [] {
        bind(primitive("random_gamma"), {random::split(random::key(0), 3), ones({2, 4})},
             {{"log", false}});
      },
      "random_gamma",
      {"parameters do not follow the key's batch axes", "whose leading axes are [3]"});
  testing::expect_error(
      [] {
        bind(primitive("random_gumbel_top_k"), {random::split(random::key(0), 3), ones({3, 2, 4})},
             {{"num_samples", int64_t{1}}});
      },
      "random_gumbel_top_k", {"not one row per key"});
  testing::expect_error(
      [] {
        bind(primitive("random_gumbel_top_k"), {random::key(0), ones({4})},
             {{"num_samples", int64_t{5}}});
      },
      "random_gumbel_top_k", {"invalid count", "num_samples=5"});
}

// ---- determinism, transformations ----------------------------------------------------------

// Each sampler as a function of the key alone.
std::vector<std::pair<std::string, std::function<Tensor(const Tensor&)>>> samplers() {
  return {
      {"categorical",
       [](const Tensor& k) {
         return random::categorical(k, tensor({0.1, 1.0, -2.0}), -1, Shape{6});
       }},
      {"truncated_normal",
       [](const Tensor& k) { return random::truncated_normal(k, -1.0, 2.5, {5}, float64); }},
      {"gamma",
       [](const Tensor& k) {
         return random::gamma(k, tensor({0.3, 1.0, 7.0}), {2, 3});
       }},
      {"beta",
       [](const Tensor& k) { return random::beta(k, tensor({0.5f}), tensor({2.0f}), Shape{4}); }},
      {"dirichlet",
       [](const Tensor& k) {
         return random::dirichlet(k, tensor({0.5, 1.0, 4.0}), Shape{2});
       }},
      {"choice", [](const Tensor& k) { return random::choice(k, 9, {4}); }},
      {"choice_no_replace", [](const Tensor& k) { return random::choice(k, 9, {4}, false); }},
      {"choice_weighted_no_replace",
       [](const Tensor& k) {
         return random::choice(k, 5, {3}, false, tensor({0.1, 0.2, 0.3, 0.2, 0.2}));
       }},
  };
}

TEST(RandomDistributions, SameKeySameSamplesSplitKeysDiffer) {
  const auto [k1, k2] = random::split(random::key(23));
  for (const auto& [name, f] : samplers()) {
    SCOPED_TRACE(name);
    expect_same(f(k1), f(k1));
    EXPECT_NE(values(f(k1)), values(f(k2)));
  }
}

TEST(RandomDistributions, VmapOverKeysIsALoop) {
  const Tensor keys = random::split(random::key(24), 5);
  for (const auto& [name, f] : samplers()) {
    SCOPED_TRACE(name);
    std::vector<Tensor> loop;
    for (int64_t i = 0; i < 5; ++i) loop.push_back(f(index(keys, i)));
    expect_same(vmap(f)(keys), stack(loop));
    // A batch of keys given directly: the same.
    expect_same(f(keys), stack(loop));
  }
}

TEST(RandomDistributions, ThreadCountDoesNotMatter) {
  const int threads = num_threads();
  const Tensor key = random::key(28);
  const auto draw = [&] {
    return std::vector<Tensor>{random::gamma(key, full({}, 0.7, float64), Shape{50000}),
                               random::truncated_normal(key, -0.2, 1.0, {50000}, float64)};
  };
  set_num_threads(1);
  const std::vector<Tensor> one = draw();
  set_num_threads(2);
  const std::vector<Tensor> two = draw();
  set_num_threads(threads);
  for (std::size_t i = 0; i < one.size(); ++i) expect_same(one[i], two[i]);
}

TEST(RandomDistributions, JitMatchesEager) {
  const Tensor key = random::key(25);
  for (const auto& [name, f] : samplers()) {
    SCOPED_TRACE(name);
    expect_same(jit(f)(key), f(key));
  }
}

TEST(RandomDistributions, VmapOverParameters) {
  // One key, a batch of alphas: each example is the unbatched call with its alpha.
  const Tensor alphas = tensor({0.2, 1.5, 30.0});
  const Tensor key = random::key(26);
  const auto f = [&](const Tensor& a) { return random::gamma(key, a, Shape{4}); };
  std::vector<Tensor> loop;
  for (int64_t i = 0; i < 3; ++i) loop.push_back(f(index(alphas, i)));
  expect_same(vmap(f)(alphas), stack(loop));
  const auto g = [&](const Tensor& p) { return random::choice(key, 4, {2}, false, p); };
  const Tensor ps = tensor({0.1, 0.2, 0.3, 0.4, 0.4, 0.3, 0.2, 0.1}, {2, 4});
  expect_same(vmap(g)(ps), stack({g(index(ps, 0)), g(index(ps, 1))}));
}

TEST(RandomDistributions, ParametersGetZeroGradient) {
  // Documented: sampling primitives are not differentiated (no reparameterised gamma).
  const Tensor key = random::key(27);
  const Tensor ga =
      grad([&](const Tensor& a) { return sum(random::gamma(key, a)); })(tensor({0.5, 2.0}));
  expect_same(ga, zeros({2}, float64));
  const Tensor gb = grad([&](const Tensor& a) {
    return sum(random::beta(key, a, ones({2}, float64)));
  })(tensor({0.5, 2.0}));
  expect_same(gb, zeros({2}, float64));
}

}  // namespace
}  // namespace kiln
