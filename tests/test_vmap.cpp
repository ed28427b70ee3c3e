// vmap: per-primitive batching rules against a loop over examples, and the public API.
//
// 1. Registry: every primitive has a batching rule (that each has a sample is checked with the
//    shared sample table, tests/primitive_samples.h).
// 2. The vmap walk over that table: for every sample and several batching patterns — every
//    input batched along its first, middle or last axis, one input batched alone, one input
//    left out — the result of `batching::evaluate` on the traced sample function, with its
//    batch axis moved to the front, equals the function applied eagerly to each example and
//    stacked. Collectives compare with the hand-computed sum / max / stack / arange /
//    permutation / exchange over the examples instead.
// 3. The API: in_axes / out_axes / none / axis_name, nesting, composition with grad, jvp/vjp,
//    jacfwd/jacrev and jit, random numbers under vmap, and the errors users see.
// 4. The collectives against loops over examples, their gradients against finite differences,
//    over an outer axis from inside an inner vmap, under jit and grad, and their errors.
#include <gtest/gtest.h>
#include <kiln/kiln.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "primitive_samples.h"
#include "testing.h"

namespace kiln {
namespace {

using kiln::testing::expect_allclose;

using Ts = std::vector<Tensor>;
using Dims = std::vector<std::optional<int>>;

using samples::Gen;
using samples::PrimitiveSample;

// ---- comparison -----------------------------------------------------------------------

std::vector<double> values(const Tensor& t) { return astype(t, float64).to_vector<double>(); }

// Exact for integers and bools; at least 1e-6 for floats narrower than float64.
// Half of rtol on each side of |got - want| <= atol + rtol |want| keeps it within rtol * max(1,
// |want|).
Closeness vmap_tolerance(DType d, double rtol) {
  const double tol = !is_floating(d) ? 0.0 : d == float64 ? rtol : std::max(rtol, 1e-6);
  return {.rtol = tol / 2, .atol = tol / 2};
}
void expect_batched_allclose(const Tensor& got, const Tensor& want, double rtol,
                             const std::string& what,
                             std::source_location at = std::source_location::current()) {
  expect_allclose(got, want, vmap_tolerance(want.dtype(), rtol), what, at);
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

// ---- the per-primitive check ------------------------------------------------------------

// A batching pattern: for each input, where its batch axis goes (nullopt: unbatched).
struct Pattern {
  std::string label;
  Dims dims;
  int64_t size;
};

// First, middle and last axes of every input; each input batched alone; each left out.
std::vector<Pattern> patterns(const Ts& example, bool collective) {
  const std::size_t n = example.size();
  auto where_ = [&](std::size_t k, int which) -> int {  // 0 first, 1 middle, 2 last
    const int r = example[k].rank();
    return which == 0 ? 0 : which == 1 ? (r + 1) / 2 : r;
  };
  std::vector<Pattern> out;
  const char* names[] = {"first", "middle", "last"};
  for (int w = 0; w < 3; ++w) {
    Dims d;
    for (std::size_t k = 0; k < n; ++k) d.push_back(where_(k, w));
    out.push_back({std::string("all_") + names[w], d, 2 + w});
  }
  if (n > 1) {
    Dims mixed;  // every input on another axis
    for (std::size_t k = 0; k < n; ++k) mixed.push_back(where_(k, static_cast<int>((k + 1) % 3)));
    out.push_back({"all_mixed_axes", mixed, 3});
    for (std::size_t k = 0; k < n; ++k) {
      Dims only(n);
      only[k] = where_(k, static_cast<int>(k % 3));
      out.push_back({"only_" + std::to_string(k), only, 3});
      if (n > 2) {
        Dims but(n);
        for (std::size_t j = 0; j < n; ++j)
          if (j != k) but[j] = where_(j, static_cast<int>((j + k) % 3));
        out.push_back({"all_but_" + std::to_string(k), but, 2});
      }
    }
  }
  // Nothing batched: evaluate binds eagerly (collectives still reach their rule).
  out.push_back({"none", Dims(n), collective ? 3 : 2});
  if (n > 0) out.push_back({"size_one", Dims(n, std::optional<int>(0)), 1});
  return out;
}

// B examples of a sample, all of the same shapes, and the attributes to apply them with.
struct Examples {
  std::vector<Ts> inputs;
  Attrs attrs;
};
Examples draw(const PrimitiveSample& c, int64_t B) {
  const uint64_t seed = samples::seed_of(name_of(c));
  Examples out;
  if (!c.axis_name.empty()) {
    // A collective's sample is the whole named axis: example b is row b of every input.
    Gen g(seed, seed, B);
    const samples::Sample s = c.make(g);
    out.inputs.resize(static_cast<std::size_t>(B));
    for (int64_t b = 0; b < B; ++b)
      for (const samples::Arg& a : s.args)
        out.inputs[static_cast<std::size_t>(b)].push_back(index(a.value, b));
    out.attrs = s.attrs;
    return out;
  }
  // Independent examples: one shape stream, a value stream each.
  for (int64_t b = 0; b < B; ++b) {
    Gen g(seed, seed + 1000003ull * static_cast<uint64_t>(b + 1));
    const samples::Sample s = c.make(g);
    out.inputs.push_back(s.values());
    if (b == 0) out.attrs = s.attrs;
  }
  return out;
}

class BatchRules : public ::testing::TestWithParam<PrimitiveSample> {};

TEST_P(BatchRules, MatchesLoopOverExamples) {
  const PrimitiveSample& c = GetParam();
  const Ts first = draw(c, 1).inputs[0];
  for (const Pattern& pat : patterns(first, !c.axis_name.empty())) {
    SCOPED_TRACE(name_of(c) + " / " + pat.label + " / batch size " + std::to_string(pat.size));
    const int64_t B = pat.size;
    Examples drawn = draw(c, B);  // not a structured binding: the lambda below captures it
    std::vector<Ts>& ex = drawn.inputs;
    const Attrs& attrs = drawn.attrs;
    const std::size_t n = first.size();
    // Unbatched inputs: example 0's for everyone.
    for (int64_t b = 1; b < B; ++b)
      for (std::size_t k = 0; k < n; ++k)
        if (!pat.dims[k]) ex[static_cast<std::size_t>(b)][k] = ex[0][k];

    std::vector<TensorType> types;
    for (const Tensor& t : ex[0]) types.push_back(t.type());
    const ir::Traced f = ir::trace_function(
        c.prim, types, [&](const Ts& params) { return samples::apply(c, params, attrs); });
    ir::verify(*f.function);
    ASSERT_TRUE(f.captures.empty());
    ASSERT_TRUE(samples::traces_primitive(*f.function, c))
        << "the sample's function does not contain '" << c.prim << "':\n"
        << ir::print(*f.function);
    std::vector<Batched> args;
    for (std::size_t k = 0; k < n; ++k) {
      if (!pat.dims[k]) {
        args.push_back({ex[0][k], std::nullopt});
        continue;
      }
      Ts parts;
      for (const Ts& e : ex) parts.push_back(e[k]);
      args.push_back({stack(parts, *pat.dims[k]), pat.dims[k]});
    }
    std::vector<Batched> outs;
    {
      detail::AxisScopeGuard scope(c.axis_name, B);
      outs = batching::evaluate(*f.function, args, B, c.axis_name);
    }

    std::vector<Ts> want;
    if (c.vmap.reference) {
      want = c.vmap.reference(ex, attrs);
    } else {
      for (const Ts& e : ex) want.push_back(samples::apply(c, e, attrs));
    }
    const std::vector<TensorType> out_types = f.function->result_types();
    ASSERT_EQ(outs.size(), out_types.size());
    for (std::size_t j = 0; j < outs.size(); ++j) {
      const Batched& o = outs[j];
      ASSERT_TRUE(o.value.defined());
      Tensor got;
      if (o.dim) {
        ASSERT_GE(*o.dim, 0);
        ASSERT_LT(*o.dim, o.value.rank());
        ASSERT_EQ(o.value.shape()[*o.dim], B) << "result " << j << " batch axis " << *o.dim;
        got = moveaxis(o.value, *o.dim, 0);
      } else {
        got = stack(Ts(static_cast<std::size_t>(B), o.value), 0);
      }
      Ts parts;
      for (const Ts& w : want) parts.push_back(w[j]);
      const Tensor expected = stack(parts, 0);
      std::vector<int64_t> shape{B};
      shape.insert(shape.end(), out_types[j].shape.begin(), out_types[j].shape.end());
      EXPECT_EQ(got.type(), (TensorType{out_types[j].dtype, Shape(shape)})) << "result " << j;
      expect_batched_allclose(got, expected, c.vmap.rtol, "result " + std::to_string(j));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Vmap, BatchRules, ::testing::ValuesIn(samples::vmap_samples()),
                         [](const ::testing::TestParamInfo<PrimitiveSample>& info) {
                           return name_of(info.param);
                         });

// ---- the registry ----------------------------------------------------------------------

// That every primitive with a batching rule has a sample this walk checks is part of the
// shared table's one completeness check, PrimitiveSamples.EveryPrimitiveHasTheSamplesItsWalksNeed
// (tests/test_ad_rules.cpp).
TEST(VmapRegistry, EveryPrimitiveHasABatchRule) {
  for (const Primitive* p : all_primitives())
    if (!p->batch) ADD_FAILURE() << "primitive '" << p->name << "' has no batching rule";
}

// ---- the API ---------------------------------------------------------------------------

Tensor rand(uint64_t seed, const Shape& s) { return random::normal(random::key(seed), s, float64); }

// f applied to example i of each argument (index along `axes`, nullopt: shared) and stacked.
template <int N, class F>
Tensor loop(F f, const Ts& args, const Dims& axes, int64_t n, int out_axis = 0) {
  Ts outs;
  for (int64_t i = 0; i < n; ++i) {
    Ts a;
    for (std::size_t k = 0; k < args.size(); ++k)
      a.push_back(axes[k] ? index(moveaxis(args[k], *axes[k], 0), i) : args[k]);
    if constexpr (N == 1)
      outs.push_back(f(a[0]));
    else
      outs.push_back(f(a[0], a[1]));
  }
  return stack(outs, out_axis);
}

TEST(VmapApi, InAxesIntsNegativeAndNone) {
  auto f = [](const Tensor& x, const Tensor& y) { return sin(x) * y + sum(y * y); };
  const Tensor x = rand(1, Shape{4, 3}), y_last = rand(2, Shape{3, 4}), y = rand(3, Shape{3});
  expect_batched_allclose(vmap(f)(x, transpose(y_last)),
                          loop<2>(f, {x, transpose(y_last)}, {0, 0}, 4), 1e-12, "default");
  expect_batched_allclose(vmap(f, in_axes(0, -1))(x, y_last), loop<2>(f, {x, y_last}, {0, 1}, 4),
                          1e-12, "negative");
  expect_batched_allclose(vmap(f, in_axes(-2, 1))(x, y_last), loop<2>(f, {x, y_last}, {0, 1}, 4),
                          1e-12, "both");
  expect_batched_allclose(vmap(f, in_axes(0, none))(x, y), loop<2>(f, {x, y}, {0, std::nullopt}, 4),
                          1e-12, "none");
  expect_batched_allclose(vmap(f, in_axes(none, 1))(y, y_last),
                          loop<2>(f, {y, y_last}, {std::nullopt, 1}, 4), 1e-12, "none first");
  // A pair argument: in_axes applies to every leaf of the argument.
  auto g = [](const std::pair<Tensor, Tensor>& p, const Tensor& x) {
    return p.first * x + p.second;
  };
  const Tensor a = rand(4, Shape{4, 3}), b = rand(5, Shape{4, 3});
  const Tensor got = vmap(g, in_axes(0, 0))(std::make_pair(a, b), x);
  expect_batched_allclose(got, a * x + b, 1e-12, "tree argument");
}

TEST(VmapApi, OutAxes) {
  auto f = [](const Tensor& x) { return x * 2.0; };
  const Tensor x = rand(6, Shape{4, 3});
  expect_batched_allclose(vmap(f, out_axes(1))(x), transpose(x * 2.0), 0, "out_axes 1");
  expect_batched_allclose(vmap(f, out_axes(-1))(x), transpose(x * 2.0), 0, "out_axes -1");
  // An unbatched result may be returned as is...
  const Tensor c = rand(7, Shape{3});
  auto g = [](const Tensor&, const Tensor& shared) { return exp(shared); };
  const Tensor u = vmap(g, in_axes(0, none), out_axes(none))(x, c);
  expect_batched_allclose(u, exp(c), 0, "out_axes none");
  // ... or broadcast along the requested axis.
  expect_batched_allclose(vmap(g, in_axes(0, none))(x, c), broadcast_to(exp(c), Shape{4, 3}), 0,
                          "broadcast");
  expect_batched_allclose(vmap(g, in_axes(0, none), out_axes(1))(x, c),
                          broadcast_to(expand_dims(exp(c), 1), Shape{3, 4}), 0, "broadcast at 1");
  // Several results, one axis each.
  auto two = [](const Tensor& v) { return std::make_tuple(v + 1.0, sum(v)); };
  const auto [p, q] = vmap(two, out_axes(1, 0))(x);
  expect_batched_allclose(p, transpose(x + 1.0), 0, "tuple 0");
  expect_batched_allclose(q, sum(x, {1}), 1e-12, "tuple 1");
  // A batched result cannot be `none`.
  const std::string e = error_of([&] { vmap(f, out_axes(none))(x); });
  EXPECT_NE(e.find("varies across the batch"), std::string::npos) << e;
  EXPECT_NE(e.find("out_axes none"), std::string::npos) << e;
}

TEST(VmapApi, NestedVmapMatchesDoubleLoop) {
  auto f = [](const Tensor& x, const Tensor& w) { return tanh(matmul(w, x)) + sum(x); };
  const Tensor x = rand(8, Shape{2, 3, 4});  // [A, B, 4]
  const Tensor w = rand(9, Shape{5, 4});
  Ts rows;
  for (int64_t a = 0; a < 2; ++a) {
    Ts cols;
    for (int64_t b = 0; b < 3; ++b) cols.push_back(f(index(index(x, a), b), w));
    rows.push_back(stack(cols, 0));
  }
  const Tensor want = stack(rows, 0);
  const Tensor got = vmap(vmap(f, in_axes(0, none)), in_axes(0, none))(x, w);
  expect_batched_allclose(got, want, 1e-12, "vmap(vmap)");
  // Inner over axis 1 of a [A, 4, B] layout, outer over axis 0, inner result axis 1.
  const Tensor xt = moveaxis(x, 1, 2);
  const Tensor got2 = vmap(vmap(f, in_axes(1, none), out_axes(1)), in_axes(0, none))(xt, w);
  expect_batched_allclose(got2, moveaxis(want, 1, 2), 1e-12, "vmap(vmap) with axes");
  // A per-example weight matrix: the outer batch maps w too.
  const Tensor ws = rand(10, Shape{2, 5, 4});
  Ts rows3;
  for (int64_t a = 0; a < 2; ++a) {
    Ts cols;
    for (int64_t b = 0; b < 3; ++b) cols.push_back(f(index(index(x, a), b), index(ws, a)));
    rows3.push_back(stack(cols, 0));
  }
  expect_batched_allclose(vmap(vmap(f, in_axes(0, none)))(x, ws), stack(rows3, 0), 1e-12,
                          "outer maps w");
}

// A collective inside a jitted call or a loop body whose inputs are all unbatched still
// reduces over the axis (it ran unbatched and raised "not bound" before).
TEST(VmapApi, CollectivesInsideSubFunctionsOfUnbatchedValues) {
  const Tensor xs = tensor(std::vector<double>{1, 2, 3, 4}, {4}), w = tensor(2.5);
  auto inner = jit([](const Tensor& v) { return psum(v, "i"); });
  const Tensor got = vmap([&](const Tensor& x, const Tensor& v) { return x + inner(v); },
                          in_axes(0, none), axis_name("i"))(xs, w);
  EXPECT_EQ(got.to_vector<double>(), (std::vector<double>{11, 12, 13, 14}));  // x + 4 * 2.5
  const Tensor looped = vmap(
      [&](const Tensor& x, const Tensor& v) {
        return x + fori_loop(
                       0, 2, [](const Tensor&, const Tensor& c) { return psum(c, "i"); }, v);
      },
      in_axes(0, none), axis_name("i"))(xs, w);
  EXPECT_EQ(looped.to_vector<double>(), (std::vector<double>{41, 42, 43, 44}));  // 16 * 2.5
}

TEST(VmapApi, CollectivesOverNestedNamedAxes) {
  const Tensor x = rand(11, Shape{2, 3});
  auto f = [](const Tensor& v) {
    return v - psum(v, "outer") + 10.0 * pmax(v, "inner") + astype(axis_index("inner"), float64) +
           100.0 * astype(axis_index("outer"), float64);
  };
  const Tensor got = vmap(vmap(f, axis_name("inner")), axis_name("outer"))(x);
  const Tensor want = x - sum(x, {0}, true) + 10.0 * max(x, {1}, true) +
                      astype(arange(3, int32), float64) +
                      100.0 * expand_dims(astype(arange(2, int32), float64), 1);
  expect_batched_allclose(got, want, 1e-12, "nested collectives");
  // all_gather and pmean over the outer axis from inside the inner one.
  auto g = [](const Tensor& v) {
    return std::make_pair(all_gather(v, "outer"), pmean(v, "outer"));
  };
  const auto [ga, pm] = vmap(vmap(g, axis_name("inner")), axis_name("outer"))(x);
  // Example (a, b) gathers x[:, b].
  EXPECT_EQ(ga.shape(), (Shape{2, 3, 2}));
  for (int64_t a = 0; a < 2; ++a)
    for (int64_t b = 0; b < 3; ++b)
      expect_batched_allclose(index(index(ga, a), b), index(transpose(x), b), 0, "all_gather");
  expect_batched_allclose(pm, broadcast_to(mean(x, {0}, true), Shape{2, 3}), 1e-12, "pmean");
}

// Collectives over axis_names("a", "b") against loops over the examples of the 2 x 3 grid.
TEST(VmapApi, CollectivesOverATupleOfAxes) {
  const Tensor x = rand(14, Shape{2, 3, 4});
  auto grid = [](auto f) { return vmap(vmap(f, axis_name("b")), axis_name("a")); };
  const AxisNames ab = axis_names("a", "b"), ba = axis_names("b", "a");
  const auto at = [&](const Tensor& t, int64_t i, int64_t j) { return index(index(t, i), j); };
  auto reduced = [&](auto op) {
    std::vector<double> out(4);
    for (int64_t k = 0; k < 4; ++k) {
      std::vector<double> v;
      for (int64_t i = 0; i < 2; ++i)
        for (int64_t j = 0; j < 3; ++j) v.push_back(at(x, i, j).to_vector<double>()[k]);
      out[k] = op(v);
    }
    return out;
  };
  const std::vector<double> total = reduced([](const std::vector<double>& v) {
    double t = 0;
    for (double e : v) t += e;
    return t;
  });
  const std::vector<double> largest =
      reduced([](const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); });
  const std::vector<double> smallest =
      reduced([](const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); });
  std::vector<double> mean = total;
  for (double& m : mean) m /= 6;
  const Tensor sums = grid([&](const Tensor& v) { return psum(v, ab); })(x);
  const Tensor means = grid([&](const Tensor& v) { return pmean(v, ba); })(x);
  const Tensor maxes = grid([&](const Tensor& v) { return pmax(v, ab); })(x);
  const Tensor mins = grid([&](const Tensor& v) { return pmin(v, ab); })(x);
  const Tensor gathered = grid([&](const Tensor& v) { return all_gather(v, ab); })(x);
  const Tensor gathered_ba = grid([&](const Tensor& v) { return all_gather(v, ba); })(x);
  const Tensor index_ab = grid([&](const Tensor&) { return axis_index(ab); })(x);
  const Tensor index_ba = grid([&](const Tensor&) { return axis_index(ba); })(x);
  // Example (i, j) brings y[i, j] = [6, 2] (dimension 0 scattered) and its transpose.
  const Tensor y = rand(15, Shape{2, 3, 6, 2});
  const Tensor scattered = grid([&](const Tensor& v) { return psum_scatter(v, ab, 0); })(y);
  const Tensor scattered_1 =
      grid([&](const Tensor& v) { return psum_scatter(transpose(v), ab, -1); })(y);
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 3; ++j) {
      const std::string where = " at (" + std::to_string(i) + ", " + std::to_string(j) + ")";
      expect_allclose(at(sums, i, j), total, {.rtol = 1e-14, .atol = 1e-14}, "psum" + where);
      expect_allclose(at(means, i, j), mean, {.rtol = 1e-14, .atol = 1e-14}, "pmean" + where);
      expect_allclose(at(maxes, i, j), largest, {.rtol = 0, .atol = 0}, "pmax" + where);
      expect_allclose(at(mins, i, j), smallest, {.rtol = 0, .atol = 0}, "pmin" + where);
      std::vector<double> want_ab, want_ba;  // the grid's examples, a major / b major
      for (int64_t p = 0; p < 2; ++p)
        for (int64_t q = 0; q < 3; ++q) {
          const std::vector<double> e = at(x, p, q).to_vector<double>();
          want_ab.insert(want_ab.end(), e.begin(), e.end());
        }
      for (int64_t q = 0; q < 3; ++q)
        for (int64_t p = 0; p < 2; ++p) {
          const std::vector<double> e = at(x, p, q).to_vector<double>();
          want_ba.insert(want_ba.end(), e.begin(), e.end());
        }
      EXPECT_EQ(at(gathered, i, j).shape(), (Shape{6, 4}));
      expect_allclose(at(gathered, i, j), want_ab, {.rtol = 0, .atol = 0}, "all_gather" + where);
      expect_allclose(at(gathered_ba, i, j), want_ba, {.rtol = 0, .atol = 0},
                      "all_gather b, a" + where);
      EXPECT_EQ(at(index_ab, i, j).item<int32_t>(), i * 3 + j) << where;
      EXPECT_EQ(at(index_ba, i, j).item<int32_t>(), j * 2 + i) << where;
      std::vector<double> want_scatter(2, 0.0);
      for (int64_t p = 0; p < 2; ++p)
        for (int64_t q = 0; q < 3; ++q)
          for (int64_t k = 0; k < 2; ++k)
            want_scatter[static_cast<std::size_t>(k)] +=
                index(at(y, p, q), i * 3 + j).to_vector<double>()[static_cast<std::size_t>(k)];
      expect_allclose(at(scattered, i, j), want_scatter, {.rtol = 1e-14, .atol = 1e-14},
                      "psum_scatter" + where);
      expect_allclose(at(scattered_1, i, j), want_scatter, {.rtol = 1e-14, .atol = 1e-14},
                      "psum_scatter at -1" + where);
    }
  auto error_of = [&](auto f) {
    try {
      grid(f)(x);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error_of([](const Tensor& v) { return psum(v, AxisNames{}); }).find("no axis named"),
            std::string::npos);
  EXPECT_NE(error_of([](const Tensor& v) {
              return psum(v, axis_names("a", "a"));
            }).find("axis 'a' named twice"),
            std::string::npos);
  EXPECT_NE(
      error_of([](const Tensor& v) { return all_gather(v, axis_names("a", "c")); }).find("'c'"),
      std::string::npos);
  EXPECT_NE(error_of([](const Tensor& v) {
              return psum_scatter(v, axis_names("a", "b"), 0);
            }).find("size of axis 'a, b'"),
            std::string::npos);
}

TEST(VmapApi, VmapOfGradMatchesLoopOfGrad) {
  auto f = [](const Tensor& w, const Tensor& x) {
    return sum(tanh(matmul(x, w)) * tanh(matmul(x, w)));
  };
  const Tensor ws = rand(12, Shape{4, 3, 2}), xs = rand(13, Shape{4, 5, 3}),
               w = rand(14, Shape{3, 2});
  expect_batched_allclose(vmap(grad(f))(ws, xs), loop<2>(grad(f), {ws, xs}, {0, 0}, 4), 1e-12,
                          "both batched");
  expect_batched_allclose(vmap(grad(f), in_axes(none, 0))(w, xs),
                          loop<2>(grad(f), {w, xs}, {std::nullopt, 0}, 4), 1e-12,
                          "per-example gradients");
  expect_batched_allclose(vmap(grad(f), in_axes(2, none))(moveaxis(ws, 0, 2), index(xs, 0)),
                          loop<2>(grad(f), {ws, index(xs, 0)}, {0, std::nullopt}, 4), 1e-12,
                          "weights on axis 2");
}

TEST(VmapApi, GradOfVmappedFunctionMatchesLoop) {
  auto f = [](const Tensor& w, const Tensor& x) { return sum(sin(matmul(w, x))); };
  const Tensor w = rand(15, Shape{3, 4}), xs = rand(16, Shape{5, 4});
  auto total = [f](const Tensor& w_, const Tensor& xs_) {
    return sum(vmap(f, in_axes(none, 0))(w_, xs_));
  };
  Tensor want = zeros(Shape{3, 4}, float64);
  for (int64_t i = 0; i < 5; ++i) want = want + grad(f)(w, index(xs, i));
  expect_batched_allclose(grad(total)(w, xs), want, 1e-12, "grad of sum of vmap");
  // With respect to the batched argument: row i is the gradient for example i.
  const Tensor gx = grad(total, argnums<1>)(w, xs);
  expect_batched_allclose(gx, loop<2>(grad(f, argnums<1>), {w, xs}, {std::nullopt, 0}, 5), 1e-12,
                          "grad wrt batch");
  // jit of the whole thing.
  expect_batched_allclose(jit(grad(total))(w, xs), want, 1e-12, "jit(grad(sum of vmap))");
}

TEST(VmapApi, JacobiansMatchVmapOfJvpAndVjp) {
  const Tensor a = rand(17, Shape{3, 4});
  auto f = [a](const Tensor& x) { return tanh(matmul(a, x)) + sum(x * x); };
  const Tensor x = rand(18, Shape{4});
  // Forward: J e_j for every basis vector at once, stacked as columns.
  const Tensor jf = vmap(
      [&](const Tensor& t) { return jvp(f, std::tuple<Tensor>{x}, std::tuple<Tensor>{t}).second; },
      in_axes(0), out_axes(1))(eye(4, float64));
  // Reverse: e_i^T J for every output at once, stacked as rows.
  const Tensor jr = vmap([&](const Tensor& ct) {
    auto [y, pullback] = vjp(f, x);
    return std::get<0>(pullback(ct));
  })(eye(3, float64));
  EXPECT_EQ(jf.shape(), (Shape{3, 4}));
  expect_batched_allclose(jacfwd(f)(x), jf, 1e-12, "jacfwd");
  expect_batched_allclose(jacrev(f)(x), jr, 1e-12, "jacrev");
  expect_batched_allclose(jf, jr, 1e-12, "forward vs reverse");
  // Jacobians of every example of a batch.
  const Tensor xs = rand(19, Shape{2, 4});
  expect_batched_allclose(vmap(jacrev(f))(xs),
                          stack(Ts{jacrev(f)(index(xs, 0)), jacrev(f)(index(xs, 1))}, 0), 1e-12,
                          "vmap(jacrev)");
}

TEST(VmapApi, JitAndVmapCompose) {
  auto f = [](const Tensor& x, const Tensor& y) { return sin(x) * y + sum(x); };
  const Tensor x = rand(20, Shape{4, 3}), y = rand(21, Shape{3});
  const Tensor plain = vmap(f, in_axes(0, none))(x, y);
  expect_batched_allclose(plain, loop<2>(f, {x, y}, {0, std::nullopt}, 4), 1e-12, "plain");
  auto jv = jit(vmap(f, in_axes(0, none)));
  expect_batched_allclose(jv(x, y), plain, 1e-12, "jit(vmap)");
  expect_batched_allclose(jv(x, y), plain, 1e-12, "jit(vmap), cached");
  EXPECT_EQ(jv.cache_size(), 1u);
  expect_batched_allclose(vmap(jit(f), in_axes(0, none))(x, y), plain, 1e-12, "vmap(jit)");
  // Both batched, through the nested jit's call.
  const Tensor ys = rand(22, Shape{4, 3});
  expect_batched_allclose(vmap(jit(f))(x, ys), loop<2>(f, {x, ys}, {0, 0}, 4), 1e-12,
                          "vmap(jit) both");
  expect_batched_allclose(jit(vmap(jit(f)))(x, ys), loop<2>(f, {x, ys}, {0, 0}, 4), 1e-12,
                          "jit(vmap(jit))");
  // The jitted program is the batched one: no per-example loop.
  const std::string ir = ir::print(jv.lower(x, y));
  EXPECT_EQ(ir.find("call"), std::string::npos) << ir;
}

struct Params {
  Tensor w, b;
};
KILN_TREE(Params, w, b);

// vmap as a user writes it: jitted per-example gradients over a parameter struct, and a
// named-axis pmean.
TEST(VmapApi, UsageExample) {
  auto loss = [](const Params& p, const Tensor& x, const Tensor& y) {
    Tensor z = matmul(x, p.w) + p.b;
    return sum((z - y) * (z - y));
  };
  Params p{ones({3, 2}), zeros({2})};
  Tensor xs = ones({5, 3}), ys = zeros({5, 2});
  auto per_example = jit(vmap(grad(loss), in_axes(none, 0, 0)));
  Params g = per_example(p, xs, ys);
  EXPECT_EQ(g.w.shape(), (Shape{5, 3, 2}));
  EXPECT_EQ(g.b.shape(), (Shape{5, 2}));
  // z = 3 everywhere, dL/dz = 2 z = 6, dL/dw = x^T (6) = 6, dL/db = 6.
  expect_batched_allclose(g.w, full(Shape{5, 3, 2}, 6.0), 0, "g.w");
  expect_batched_allclose(g.b, full(Shape{5, 2}, 6.0), 0, "g.b");
  auto centered =
      vmap([](const Tensor& v) { return v - pmean(v, "batch"); }, in_axes(0), axis_name("batch"));
  expect_batched_allclose(centered(tensor({1.f, 2.f, 3.f})), tensor({-1.f, 0.f, 1.f}), 0,
                          "centered");
  std::ostringstream os;
  os << g.w.shape();
  EXPECT_EQ(os.str(), "[5, 3, 2]");
}

TEST(VmapErrors, InconsistentBatchSizesNameTheInputsAndSizes) {
  auto f = [](const Tensor& x, const Tensor& y) { return x + y; };
  const std::string e = error_of([&] { vmap(f)(ones({5, 3}), ones({4, 3})); });
  EXPECT_NE(e.find("inconsistent batch sizes"), std::string::npos) << e;
  EXPECT_NE(e.find("5 for argument 0"), std::string::npos) << e;
  EXPECT_NE(e.find("4 for argument 1"), std::string::npos) << e;
}

TEST(VmapErrors, AxisOutOfRangeNamesTheArgumentAndRank) {
  auto f = [](const Tensor& x, const Tensor& y) { return x + y; };
  const std::string e = error_of([&] { vmap(f, in_axes(0, 2))(ones({4, 3}), ones({4, 3})); });
  EXPECT_NE(e.find("axis out of range for argument 1"), std::string::npos) << e;
  EXPECT_NE(e.find("rank 2"), std::string::npos) << e;
  const std::string neg = error_of([&] { vmap(f, in_axes(-3, 0))(ones({4, 3}), ones({4, 3})); });
  EXPECT_NE(neg.find("argument 0"), std::string::npos) << neg;
  EXPECT_NE(neg.find("rank 2"), std::string::npos) << neg;
  const std::string count = error_of([&] { vmap(f, in_axes(0))(ones({4, 3}), ones({4, 3})); });
  EXPECT_NE(count.find("one per argument"), std::string::npos) << count;
}

TEST(VmapErrors, UnknownAxisNameNamesTheAxesInScope) {
  auto bad =
      vmap([](const Tensor& v) { return v - pmean(v, "oops"); }, in_axes(0), axis_name("batch"));
  const std::string e = error_of([&] { bad(tensor({1.f, 2.f, 3.f})); });
  EXPECT_NE(e.find("'oops'"), std::string::npos) << e;
  EXPECT_NE(e.find("[batch]"), std::string::npos) << e;
  // Outside any vmap: no axes in scope.
  const std::string outside = error_of([] { psum(ones({2}), "batch"); });
  EXPECT_NE(outside.find("'batch'"), std::string::npos) << outside;
}

TEST(VmapRandom, BatchedKeysGiveIndependentStreams) {
  const Tensor k = random::key(1234);
  const Tensor keys = random::split(k, 4);
  const Tensor rows = vmap([](const Tensor& key) { return random::normal(key, {3}); })(keys);
  ASSERT_EQ(rows.type(), (TensorType{float32, Shape{4, 3}}));
  for (int64_t i = 0; i < 4; ++i) {
    expect_batched_allclose(index(rows, i), random::normal(index(keys, i), {3}), 0,
                            "row " + std::to_string(i));
    for (int64_t j = 0; j < i; ++j)
      EXPECT_NE(values(index(rows, i)), values(index(rows, j))) << "rows " << i << " and " << j;
  }
  // Keys on another axis, and a split inside the function.
  auto two = [](const Tensor& key) {
    const auto [a, b] = random::split(key);
    return random::uniform(a, {2}) + random::uniform(b, {2});
  };
  const Tensor got = vmap(two, in_axes(1))(transpose(keys));
  expect_batched_allclose(got, loop<1>(two, {keys}, {0}, 4), 0, "split inside");
}

TEST(VmapRandom, UnbatchedKeyGivesTheSameNumbersForEveryExample) {
  const Tensor k = random::key(99);
  const Tensor xs = rand(23, Shape{4, 3});
  auto f = [](const Tensor& key, const Tensor& x) { return random::normal(key, {3}, float64) + x; };
  const Tensor got = vmap(f, in_axes(none, 0))(k, xs);
  const Tensor draw = random::normal(k, {3}, float64);
  for (int64_t i = 0; i < 4; ++i)
    expect_batched_allclose(index(got, i) - index(xs, i), draw, 1e-14,
                            "example " + std::to_string(i));
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

TEST(VmapApi, LeafAxesMapEachLeafOfAnArgument) {
  // w shared by every example, b batched along its last axis; x batched along axis 0.
  const Tensor w = tensor({1.0, 2.0, 3.0, 4.0}, {2, 2});
  const Tensor bs = tensor({10.0, 20.0, 30.0, 40.0, 50.0, 60.0}, {2, 3});  // 3 examples of b[2]
  const Tensor xs = tensor({1.0, 0.0, 0.0, 1.0, 1.0, 1.0}, {3, 2});
  auto f = [](const Params& p, const Tensor& x) { return matmul(x, p.w) + p.b; };
  const Tensor got = vmap(f, in_axes(leaf_axes(none, -1), 0))(Params{w, bs}, xs);
  for (int64_t i = 0; i < 3; ++i) {  // reference: a loop over examples
    const Tensor want = f(Params{w, index(swapaxes(bs, 0, 1), i)}, index(xs, i));
    EXPECT_EQ(index(got, i).to_vector<double>(), want.to_vector<double>()) << "example " << i;
  }
  kiln::testing::expect_error(
      [&] {
        vmap(f, in_axes(leaf_axes(0), 0))(Params{w, bs}, xs);
      },
      "vmap", {"leaf_axes for argument 0", "expected 2"});
}

}  // namespace
}  // namespace kiln

// ---- pmin, ppermute, all_to_all, psum_scatter, all_gather: against loops over examples ----
namespace kiln {
namespace {

using Pairs = std::vector<std::pair<int64_t, int64_t>>;

// x[..., i, ...] with i at `axis`.
Tensor at(const Tensor& x, int64_t axis, int64_t i) { return index(moveaxis(x, axis, 0), i); }

// The references: example i's result from the examples xs (numpy-style indexing only).
Tensor ppermute_ref(const Ts& xs, const Pairs& perm, int64_t i) {
  for (const auto& [source, dest] : perm)
    if (dest == i) return xs[static_cast<std::size_t>(source)];
  return zeros_like(xs[0]);
}
Tensor all_to_all_ref(const Ts& xs, int64_t split, int64_t concat, int64_t i) {
  Ts parts;
  for (const Tensor& x : xs) parts.push_back(at(x, split, i));
  return stack(parts, concat);
}
Tensor psum_scatter_ref(const Ts& xs, int64_t dimension, int64_t i) {
  Tensor s = at(xs[0], dimension, i);
  for (std::size_t j = 1; j < xs.size(); ++j) s = s + at(xs[j], dimension, i);
  return s;
}
Ts rows(const Tensor& x) {
  Ts r;
  for (int64_t i = 0; i < x.shape()[0]; ++i) r.push_back(index(x, i));
  return r;
}
// ref(examples, i) for every example, stacked.
template <class R>
Tensor each_example(const Ts& xs, R ref) {
  Ts out;
  for (std::size_t i = 0; i < xs.size(); ++i) out.push_back(ref(xs, static_cast<int64_t>(i)));
  return stack(out, 0);
}

TEST(VmapCollectives, EachMatchesALoopOverExamples) {
  const Tensor x = rand(40, Shape{4, 3, 2});
  const Ts xs = rows(x);
  auto over = [](auto f) { return vmap(f, axis_name("i")); };
  expect_batched_allclose(over([](const Tensor& v) { return pmin(v, "i"); })(x),
                          broadcast_to(min(x, {0}, true), x.shape()), 0, "pmin");
  const Tensor xi = astype(x * 10.0, int32);
  expect_batched_allclose(over([](const Tensor& v) { return pmin(v, "i"); })(xi),
                          broadcast_to(min(xi, {0}, true), xi.shape()), 0, "pmin int32");

  const Pairs perm{{0, 2}, {2, 1}, {1, 0}};  // example 3 receives nothing, sends nothing
  expect_batched_allclose(
      over([&](const Tensor& v) { return ppermute(v, "i", perm); })(x),
      each_example(xs, [&](const Ts& e, int64_t i) { return ppermute_ref(e, perm, i); }), 0,
      "ppermute");
  const Tensor xb = x > 0.0;
  expect_batched_allclose(
      over([&](const Tensor& v) { return ppermute(v, "i", perm); })(xb),
      each_example(rows(xb), [&](const Ts& e, int64_t i) { return ppermute_ref(e, perm, i); }), 0,
      "ppermute bool");

  // Per example [2, 4, 3]: split the axis of size 4, concatenate at 2 (or -1).
  const Tensor y = rand(41, Shape{4, 2, 4, 3});
  const Tensor want_a2a =
      each_example(rows(y), [](const Ts& e, int64_t i) { return all_to_all_ref(e, 1, 2, i); });
  EXPECT_EQ(want_a2a.shape(), (Shape{4, 2, 3, 4}));
  expect_batched_allclose(over([](const Tensor& v) { return all_to_all(v, "i", 1, 2); })(y),
                          want_a2a, 0, "all_to_all");
  expect_batched_allclose(over([](const Tensor& v) { return all_to_all(v, "i", -2, -1); })(y),
                          want_a2a, 0, "all_to_all, negative axes");
  const Tensor yi = astype(y * 10.0, int64);
  expect_batched_allclose(
      over([](const Tensor& v) { return all_to_all(v, "i", 1, 0); })(yi),
      each_example(rows(yi), [](const Ts& e, int64_t i) { return all_to_all_ref(e, 1, 0, i); }), 0,
      "all_to_all int64");

  for (int64_t d : {0, 1, 2}) {
    const Tensor z = moveaxis(rand(42, Shape{4, 4, 2, 3}), 1, d + 1);  // the axis of size 4 at d
    const Tensor want =
        each_example(rows(z), [d](const Ts& e, int64_t i) { return psum_scatter_ref(e, d, i); });
    expect_batched_allclose(over([d](const Tensor& v) { return psum_scatter(v, "i", d); })(z), want,
                            1e-12, "psum_scatter at " + std::to_string(d));
    expect_batched_allclose(over([d](const Tensor& v) { return psum_scatter(v, "i", d - 3); })(z),
                            want, 1e-12, "psum_scatter at " + std::to_string(d - 3));
  }
}

// The own-axis rules return what the design promises: psum_scatter's sum keeps the batch at
// scatter_dimension (no transpose), all_to_all is one transpose.
TEST(VmapCollectives, OwnAxisRulesAreCheap) {
  const Tensor z = rand(43, Shape{3, 2, 3});
  auto f = [](const Tensor& v) { return psum_scatter(v, "i", 1); };
  const std::string ir = ir::print(jit(vmap(f, axis_name("i"), out_axes(1))).lower(z));
  EXPECT_EQ(ir.find("transpose"), std::string::npos) << ir;
  auto g = [](const Tensor& v) { return all_to_all(v, "i", 1, 0); };
  const std::string ir2 = ir::print(jit(vmap(g, axis_name("i"))).lower(z));
  EXPECT_NE(ir2.find("transpose"), std::string::npos) << ir2;
  EXPECT_EQ(ir2.find("gather"), std::string::npos) << ir2;
}

// Gradients of total(x) = sum over examples of loss(example's x, example's w), with loss(v, w) =
// sum(w * c(v) + sin(c(v))) for a collective c, vs float64 central differences of total:
// vmap(grad(loss)) runs each collective's own VJP rule (example j's gradient is d total / d x_j:
// the transposed collective sums over the examples), grad(total) differentiates the batched
// program. Each for c over the vmap's own axis, and over the outer axis "i" from inside a vmap
// "inner" (the rules for another axis, batched again by the outer vmap).
TEST(VmapCollectives, GradientsMatchFiniteDifferences) {
  const Pairs perm{{0, 1}, {1, 2}};
  using Fn = std::function<Tensor(const Tensor&)>;
  struct Case {
    std::string name;
    Fn c;         // per example, over axis "i"
    Shape shape;  // the batch [3, ...]
  };
  const std::vector<Case> cases{
      {"pmin", [](const Tensor& v) { return pmin(v, "i"); }, Shape{3, 2}},
      {"pmax", [](const Tensor& v) { return pmax(v, "i"); }, Shape{3, 2}},
      {"ppermute", [perm](const Tensor& v) { return ppermute(v, "i", perm); }, Shape{3, 2}},
      {"all_to_all", [](const Tensor& v) { return all_to_all(v, "i", 0, 1); }, Shape{3, 3, 2}},
      {"psum_scatter", [](const Tensor& v) { return psum_scatter(v, "i", 1); }, Shape{3, 2, 3}},
      {"all_gather", [](const Tensor& v) { return all_gather(v, "i"); }, Shape{3, 2}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    auto loss = [&c](const Tensor& v, const Tensor& w) {
      const Tensor y = c.c(v);
      return sum(w * y + sin(y));
    };
    const Tensor x = samples::Gen(7, 7).distinct(c.shape);  // no ties for pmin/pmax
    const Tensor w = rand(44, vmap(c.c, axis_name("i"))(x).shape());
    auto total = [&](const Tensor& v) { return sum(vmap(loss, axis_name("i"))(v, w)); };
    const Tensor want = tensor(kiln::testing::numeric_grad(total, x), x.shape());
    expect_batched_allclose(vmap(grad(loss), axis_name("i"))(x, w), want, 1e-7,
                            "vmap(grad), own axis");
    expect_batched_allclose(grad(total)(x), want, 1e-7, "grad(vmap), own axis");

    // Example (a, b) of the nested vmaps is x2[a, b]; the collective runs over a.
    const Tensor x2 = stack({x, x * 0.5 + 0.25}, 1), w2 = stack({w, w * -2.0}, 1);
    auto nested = [&](const auto& f) { return vmap(vmap(f, axis_name("inner")), axis_name("i")); };
    auto total2 = [&](const Tensor& v) { return sum(nested(loss)(v, w2)); };
    const Tensor want2 = tensor(kiln::testing::numeric_grad(total2, x2), x2.shape());
    expect_batched_allclose(nested(grad(loss))(x2, w2), want2, 1e-7, "vmap(grad), outer axis");
    expect_batched_allclose(grad(total2)(x2), want2, 1e-7, "grad(vmap), outer axis");
  }
}

// A collective over the outer name inside the inner vmap: example (a, b) is x[a, b] and the
// collective runs over a for each b. Inner batch axes before and after the collective's axes.
TEST(VmapCollectives, OverTheOuterAxisInsideAnInnerVmap) {
  const int64_t A = 3, B = 2;
  const Pairs perm{{0, 1}, {1, 2}, {2, 0}};
  // x[a, b] for an inner batch on axis `inner_axis` of the outer example.
  auto run = [](auto f, const Tensor& x, int inner_axis) {
    return vmap(vmap(f, in_axes(inner_axis), axis_name("inner")), axis_name("outer"))(x);
  };
  auto ref = [&](const Tensor& x, auto per_b) {  // result[a][b] = per_b(column b, a)
    Ts out_a;
    for (int64_t a = 0; a < A; ++a) {
      Ts out_b;
      for (int64_t b = 0; b < B; ++b) out_b.push_back(per_b(rows(at(x, 1, b)), a));
      out_a.push_back(stack(out_b, 0));
    }
    return stack(out_a, 0);
  };
  const Tensor x = rand(45, Shape{A, B, 4, A});  // example (a, b): [4, A]
  for (int inner_axis : {0, 2}) {
    SCOPED_TRACE("inner batch on axis " + std::to_string(inner_axis));
    const Tensor xin = moveaxis(x, 1, 1 + inner_axis);
    expect_batched_allclose(run([](const Tensor& v) { return pmin(v, "outer"); }, xin, inner_axis),
                            ref(x, [](const Ts& e, int64_t) { return min(stack(e, 0), {0}); }), 0,
                            "pmin");
    expect_batched_allclose(
        run([&](const Tensor& v) { return ppermute(v, "outer", perm); }, xin, inner_axis),
        ref(x, [&](const Ts& e, int64_t a) { return ppermute_ref(e, perm, a); }), 0, "ppermute");
    expect_batched_allclose(
        run([](const Tensor& v) { return all_to_all(v, "outer", 1, 0); }, xin, inner_axis),
        ref(x, [](const Ts& e, int64_t a) { return all_to_all_ref(e, 1, 0, a); }), 0, "all_to_all");
    expect_batched_allclose(
        run([](const Tensor& v) { return psum_scatter(v, "outer", 1); }, xin, inner_axis),
        ref(x, [](const Ts& e, int64_t a) { return psum_scatter_ref(e, 1, a); }), 1e-12,
        "psum_scatter");
  }
  // Both names in one function: scatter over the outer axis, then permute over the inner.
  auto both = [](const Tensor& v) {
    return ppermute(psum_scatter(v, "outer", 1), "inner", Pairs{{0, 1}, {1, 0}});
  };
  const Tensor got = run(both, x, 0);
  const Tensor scattered = ref(x, [](const Ts& e, int64_t a) { return psum_scatter_ref(e, 1, a); });
  expect_batched_allclose(got, flip(scattered, {1}), 1e-12, "two names");
}

TEST(VmapCollectives, ComposeWithJitAndGrad) {
  const Tensor x = rand(46, Shape{3, 3, 3});
  const Pairs perm{{0, 1}, {1, 2}, {2, 0}};
  auto f = [perm](const Tensor& v) {
    return psum_scatter(all_to_all(ppermute(v, "i", perm), "i", 0, 1), "i", 0) + pmin(v, "i");
  };
  const Tensor plain = vmap(f, axis_name("i"))(x);
  auto jf = jit(vmap(f, axis_name("i")));
  expect_batched_allclose(jf(x), plain, 1e-12, "jit(vmap)");
  expect_batched_allclose(jf(x), plain, 1e-12, "jit(vmap), cached");
  // vmap(grad(h)): the transposed collectives sum over the examples, so example j's gradient is
  // that of the total over examples with respect to x_j.
  auto h = [f](const Tensor& v) { return sum(sin(f(v))); };
  auto total = [h](const Tensor& xs) { return sum(vmap(h, axis_name("i"))(xs)); };
  const Tensor want = tensor(kiln::testing::numeric_grad(total, x), x.shape());
  expect_batched_allclose(vmap(grad(h), axis_name("i"))(x), want, 1e-7, "vmap(grad)");
  expect_batched_allclose(jit(vmap(grad(h), axis_name("i")))(x), want, 1e-7, "jit(vmap(grad))");
  expect_batched_allclose(grad(total)(x), want, 1e-7, "grad(vmap)");
}

TEST(VmapCollectives, ErrorsSayWhatWasExpected) {
  const Tensor x = ones({3, 2}, float64);
  auto permuted = [&](Pairs perm) {
    return [&x, perm] {
      vmap([&](const Tensor& v) { return ppermute(v, "i", perm); }, axis_name("i"))(x);
    };
  };
  kiln::testing::expect_error(permuted({{0, 3}}), "ppermute",
                              {"got the pair (0, 3)", "expected indices in [0, 3)", "'i'"});
  kiln::testing::expect_error(permuted({{-1, 0}}), "ppermute", {"got the pair (-1, 0)"});
  kiln::testing::expect_error(permuted({{0, 1}, {0, 2}}), "ppermute",
                              {"repeated source: got 0", "expected each example to send"});
  kiln::testing::expect_error(permuted({{0, 1}, {2, 1}}), "ppermute",
                              {"repeated destination: got 1", "expected each example to receive"});
  kiln::testing::expect_error(
      [&] { vmap([](const Tensor& v) { return all_to_all(v, "i", 0, 0); }, axis_name("i"))(x); },
      "all_to_all", {"split_axis 0", "got f64[2]", "expected size 3"});
  kiln::testing::expect_error(
      [&] {
        vmap([](const Tensor& v) { return psum_scatter(v, "i", -1); },
             axis_name("i"))(ones({3, 4, 5}));
      },
      "psum_scatter", {"scatter_dimension -1", "got f32[4,5]", "expected size 3"});
  // An unknown name lists the axes in scope, outermost first.
  auto unknown = [](const Tensor& v) { return all_to_all(v, "oops", 0, 0); };
  kiln::testing::expect_error(
      [&] {
        vmap(vmap(unknown, axis_name("inner")), axis_name("outer"))(ones({2, 3, 4}));
      },
      "all_to_all", {"'oops'", "[outer, inner]"});
  // Bound directly outside any vmap: the kernel says the axis is not bound.
  kiln::testing::expect_error(
      [] {
        bind1(primitive("pmin"), {ones({2})}, Attrs{{"axis_name", std::string("i")}});
      },
      "pmin", {"axis 'i' is not bound"});
}

}  // namespace
}  // namespace kiln
