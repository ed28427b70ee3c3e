// Axis attributes of primitives (docs/DESIGN.md, "Primitives and dispatch"), a walk over the
// shared sample table (tests/primitive_samples.h).
//
// An `axis` or `axes` attribute may count from the end of the first input's axes (-1 is the
// last), and every rule of the primitive (type rule, kernel, JVP, VJP, batching) reads it
// normalised. For every sample with such an attribute, the primitive applied with the
// attribute in its non-negative form and in its negative form gives the same values, the same
// JVPs and VJPs and the same vmapped values; an axis outside [-rank, rank) is an Error naming
// the primitive. Collectives (all_to_all, psum_scatter) are applied per example inside a vmap
// over their axis name, their axes counting from the end of one example's axes. A `perm`
// (transpose) is a permutation of 0..rank-1 and nothing else: its negative form is an Error naming
// the primitive. Every integer attribute in the table is classified below, so that a primitive with
// an axis attribute under a new name cannot pass by this walk.
#include <gtest/gtest.h>
#include <kiln/kiln.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "primitive_samples.h"

namespace kiln {
namespace {

using Ts = std::vector<Tensor>;

using samples::Gen;
using samples::PrimitiveSample;

enum class Kind { axes, permutation, other };

// Every integer attribute name of the table's samples.
const std::map<std::string, Kind>& kinds() {
  static const std::map<std::string, Kind> k{
      {"axis", Kind::axes},
      {"axes", Kind::axes},
      {"perm", Kind::permutation},
      // Collectives (all_to_all, psum_scatter).
      {"split_axis", Kind::axes},
      {"concat_axis", Kind::axes},
      {"scatter_dimension", Kind::axes},
      // Process-level collectives: each process's example count.
      {"sizes", Kind::other},
      // Sizes, bounds, window geometry, counts, labels and data: not axes.
      {"shape", Kind::other},
      {"start", Kind::other},
      {"stop", Kind::other},
      {"step", Kind::other},
      {"low", Kind::other},
      {"high", Kind::other},
      {"stride", Kind::other},
      {"padding", Kind::other},
      {"dilation", Kind::other},
      {"groups", Kind::other},
      {"input_size", Kind::other},
      {"kernel_size", Kind::other},
      {"kernel", Kind::other},
      {"classes", Kind::other},
      {"ignore_index", Kind::other},
      {"n", Kind::other},
      {"data", Kind::other},
      {"axis_size", Kind::other},
      {"length", Kind::other},
      {"num_carry", Kind::other},
      {"num_xs", Kind::other},
      {"num_samples", Kind::other},  // random_gumbel_top_k
      // nonzero: the static result length and its padding value.
      {"size", Kind::other},
      {"fill", Kind::other},
  };
  return k;
}

bool is_integer(const AttrValue& v) {
  return std::holds_alternative<int64_t>(v) || std::holds_alternative<std::vector<int64_t>>(v);
}

bool has_kind(const Attrs& a, Kind kind) {
  return std::any_of(a.items().begin(), a.items().end(), [&](const auto& item) {
    const auto k = kinds().find(item.first);
    return is_integer(item.second) && k != kinds().end() && k->second == kind;
  });
}

// `a` with every value of its attributes of `kind` mapped by f (an int stays an int).
Attrs map_values(const Attrs& a, Kind kind, const std::function<int64_t(int64_t)>& f) {
  Attrs out = a;
  for (const auto& [name, v] : a.items()) {
    const auto k = kinds().find(name);
    if (k == kinds().end() || k->second != kind) continue;
    if (const auto* i = std::get_if<int64_t>(&v)) {
      out.set(name, f(*i));
    } else if (const auto* l = std::get_if<std::vector<int64_t>>(&v)) {
      std::vector<int64_t> m = *l;
      std::transform(m.begin(), m.end(), m.begin(), f);
      out.set(name, m);
    }
  }
  return out;
}

samples::Sample make(const PrimitiveSample& c, uint64_t value_stream = 0) {
  const uint64_t seed = samples::seed_of(name_of(c));
  Gen g(seed, seed + value_stream);
  return c.make(g);
}

// The samples that bind their primitive with an axis or permutation attribute.
std::vector<PrimitiveSample> axis_samples() {
  std::vector<PrimitiveSample> out;
  for (const PrimitiveSample& c : samples::primitive_samples()) {
    if (c.body || !c.axis_name.empty()) continue;
    const Attrs a = make(c).attrs;
    if (has_kind(a, Kind::axes) || has_kind(a, Kind::permutation)) out.push_back(c);
  }
  return out;
}

std::vector<double> values(const Tensor& t) { return astype(t, float64).to_vector<double>(); }

// Same types; values within rtol * max(1, |want|) (0: exactly equal).
void expect_same(const Ts& got, const Ts& want, double rtol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].type(), want[i].type()) << what << " [" << i << "]";
    const std::vector<double> g = values(got[i]), w = values(want[i]);
    for (std::size_t k = 0; k < g.size(); ++k)
      ASSERT_LE(std::abs(g[k] - w[k]), rtol * std::max(1.0, std::abs(w[k])))
          << what << " [" << i << "] element " << k << ": got " << g[k] << ", expected " << w[k];
  }
}

TEST(AxisAttributes, EveryIntegerAttributeOfTheTableIsClassified) {
  for (const PrimitiveSample& c : samples::primitive_samples()) {
    const samples::Sample s = make(c);
    for (const auto& [name, v] : s.attrs.items())
      if (is_integer(v) && !kinds().count(name))
        ADD_FAILURE() << "sample '" << name_of(c) << "' has the integer attribute '" << name
                      << "': say in kinds() (tests/test_axis_attributes.cpp) whether it names "
                         "axes, so that this walk checks its negative forms";
  }
}

class AxisForms : public ::testing::TestWithParam<PrimitiveSample> {};

// The sample's primitive of its differentiated inputs, the fixed ones constants.
std::shared_ptr<const ir::Function> trace_sample(const Primitive& p, const samples::Sample& s,
                                                 const Attrs& attrs) {
  std::vector<TensorType> types;
  for (const samples::Arg& a : s.args)
    if (a.wrt) types.push_back(a.value.type());
  return ir::trace_function(p.name, types,
                            [&](const Ts& params) {
                              Ts ins;
                              std::size_t k = 0;
                              for (const samples::Arg& a : s.args)
                                ins.push_back(a.wrt ? params[k++] : a.value);
                              return kiln::bind(p, ins, attrs);
                            })
      .function;
}

Ts or_zeros(const std::vector<Tangent>& ts, const Ts& like) {
  Ts out;
  for (std::size_t i = 0; i < like.size(); ++i)
    out.push_back(ts[i] ? *ts[i] : zeros(like[i].shape(), like[i].dtype()));
  return out;
}

TEST_P(AxisForms, NegativeAxesMeanTheSameAsNonNegativeOnes) {
  const PrimitiveSample& c = GetParam();
  const Primitive& p = primitive(c.prim);
  const samples::Sample s = make(c);
  const Ts ins = s.values();
  const int rank = ins[0].rank();
  if (has_kind(s.attrs, Kind::permutation)) {
    const Attrs negative =
        map_values(s.attrs, Kind::permutation, [rank](int64_t a) { return a < 0 ? a : a - rank; });
    try {
      (void)kiln::bind(p, ins, negative);
      ADD_FAILURE() << c.prim << " accepted the permutation " << negative.to_string();
    } catch (const Error& e) {
      EXPECT_EQ(e.op(), c.prim) << e.what();
    }
  }
  if (!has_kind(s.attrs, Kind::axes)) return;
  const Attrs canonical =
      map_values(s.attrs, Kind::axes, [rank](int64_t a) { return a < 0 ? a + rank : a; });
  const Attrs negative =
      map_values(s.attrs, Kind::axes, [rank](int64_t a) { return a < 0 ? a : a - rank; });
  SCOPED_TRACE(c.prim + " " + canonical.to_string() + " vs " + negative.to_string());

  // Values.
  const Ts want = kiln::bind(p, ins, canonical);
  expect_same(kiln::bind(p, ins, negative), want, 0.0, "values");

  // Derivatives: the JVP and the VJP of each form, at the same point along the same directions.
  if (p.differentiable) {
    const auto f_canonical = trace_sample(p, s, canonical),
               f_negative = trace_sample(p, s, negative);
    Ts x;
    for (const samples::Arg& a : s.args)
      if (a.wrt) x.push_back(a.value);
    Gen g(1, 2);
    std::vector<Tangent> t, ct;
    for (const Tensor& xi : x) t.push_back(astype(g.normal(xi.shape()), xi.dtype()));
    for (const Tensor& yi : want) ct.push_back(astype(g.normal(yi.shape()), yi.dtype()));
    const ad::JvpResult jc = ad::jvp(*f_canonical, x, t), jn = ad::jvp(*f_negative, x, t);
    expect_same(jn.outputs, jc.outputs, 0.0, "JVP outputs");
    expect_same(or_zeros(jn.tangents, jn.outputs), or_zeros(jc.tangents, jc.outputs), 1e-12,
                "JVP tangents");
    expect_same(or_zeros(ad::vjp(f_negative, x).pullback(ct), x),
                or_zeros(ad::vjp(f_canonical, x).pullback(ct), x), 1e-12, "VJP cotangents");
  }

  // vmap with the batch axis first and last, against each example applied eagerly.
  const Ts second = make(c, 1000003).values();
  for (int at : {0, -1}) {
    Ts stacked;
    for (std::size_t k = 0; k < ins.size(); ++k) stacked.push_back(stack({ins[k], second[k]}, at));
    const Ts per_example = kiln::bind(p, second, canonical);
    Ts expected;
    for (std::size_t j = 0; j < want.size(); ++j)
      expected.push_back(stack({want[j], per_example[j]}, 0));
    for (const Attrs& attrs : {canonical, negative}) {
      const Ts got =
          vmap([&](const Ts& a) { return kiln::bind(p, a, attrs); }, in_axes(at))(stacked);
      expect_same(got, expected, 1e-12,
                  "vmap over axis " + std::to_string(at) + " with " + attrs.to_string());
    }
  }

  // An axis before the first is an Error naming the primitive, not a wild read.
  const Attrs outside = map_values(s.attrs, Kind::axes, [rank](int64_t) { return -rank - 1; });
  if (outside != s.attrs) {
    try {
      (void)kiln::bind(p, ins, outside);
      ADD_FAILURE() << c.prim << " accepted " << outside.to_string() << " for rank " << rank;
    } catch (const Error& e) {
      EXPECT_EQ(e.op(), c.prim) << e.what();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AxisAttributes, AxisForms, ::testing::ValuesIn(axis_samples()),
                         [](const ::testing::TestParamInfo<PrimitiveSample>& info) {
                           return name_of(info.param);
                         });

// ---- collectives with axis attributes (all_to_all, psum_scatter) ----
// They exist only inside a vmap over their axis name, so each form is applied per example
// there (axes count from the end of one example's axes), and again from inside an inner vmap,
// where the rule for another axis runs.

std::vector<PrimitiveSample> collective_axis_samples() {
  std::vector<PrimitiveSample> out;
  for (const PrimitiveSample& c : samples::primitive_samples())
    if (!c.axis_name.empty() && has_kind(make(c).attrs, Kind::axes)) out.push_back(c);
  return out;
}

class CollectiveAxisForms : public ::testing::TestWithParam<PrimitiveSample> {};

TEST_P(CollectiveAxisForms, NegativeAxesMeanTheSameAsNonNegativeOnes) {
  const PrimitiveSample& c = GetParam();
  const Primitive& p = primitive(c.prim);
  const Tensor x = make(c).values().at(0), x2 = make(c, 1000003).values().at(0);
  const int rank = x.rank() - 1;  // of one example
  const Attrs canonical =
      map_values(make(c).attrs, Kind::axes, [rank](int64_t a) { return a < 0 ? a + rank : a; });
  const Attrs negative =
      map_values(make(c).attrs, Kind::axes, [rank](int64_t a) { return a < 0 ? a : a - rank; });
  SCOPED_TRACE(c.prim + " " + canonical.to_string() + " vs " + negative.to_string());
  const auto named = axis_name(c.axis_name);
  const auto over = [&](const Attrs& attrs, const Tensor& batch) {
    return vmap([&](const Tensor& v) { return kiln::bind1(p, {v}, attrs); }, named)(batch);
  };
  const Tensor want = over(canonical, x);
  expect_same({over(negative, x)}, {want}, 0.0, "values");

  if (is_floating(x.dtype())) {
    Gen g(1, 2);
    const Tensor t = g.normal(x.shape()), ct = g.normal(want.shape());
    const auto jvp_of = [&](const Attrs& attrs) {
      return vmap(
          [&](const Tensor& v, const Tensor& tv) {
            return jvp([&](const Tensor& u) { return kiln::bind1(p, {u}, attrs); },
                       std::tuple<Tensor>{v}, std::tuple<Tensor>{tv})
                .second;
          },
          named)(x, t);
    };
    const auto vjp_of = [&](const Attrs& attrs) {
      return vmap(
          [&](const Tensor& v, const Tensor& cv) {
            auto [y, pullback] =
                vjp([&](const Tensor& u) { return kiln::bind1(p, {u}, attrs); }, v);
            return std::get<0>(pullback(cv));
          },
          named)(x, ct);
    };
    expect_same({jvp_of(negative)}, {jvp_of(canonical)}, 1e-12, "JVP tangents");
    expect_same({vjp_of(negative)}, {vjp_of(canonical)}, 1e-12, "VJP cotangents");
  }

  // From inside an inner vmap over a second batch, its axis first and last.
  for (int at : {0, -1}) {
    const Tensor expected = stack({want, over(canonical, x2)}, 1);
    for (const Attrs& attrs : {canonical, negative}) {
      const Tensor got =
          vmap(vmap([&](const Tensor& v) { return kiln::bind1(p, {v}, attrs); }, in_axes(at)),
               named)(stack({x, x2}, at < 0 ? at : 1));
      expect_same({got}, {expected}, 1e-12,
                  "inner vmap over axis " + std::to_string(at) + " with " + attrs.to_string());
    }
  }

  const Attrs outside =
      map_values(make(c).attrs, Kind::axes, [rank](int64_t) { return -rank - 1; });
  try {
    (void)over(outside, x);
    ADD_FAILURE() << c.prim << " accepted " << outside.to_string() << " for rank " << rank;
  } catch (const Error& e) {
    EXPECT_EQ(e.op(), c.prim) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(AxisAttributes, CollectiveAxisForms,
                         ::testing::ValuesIn(collective_axis_samples()),
                         [](const ::testing::TestParamInfo<PrimitiveSample>& info) {
                           return name_of(info.param);
                         });

}  // namespace
}  // namespace kiln
