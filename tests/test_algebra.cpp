// The algebra walk: every fact a primitive declares for the IR optimiser (kiln::Algebra) holds
// on that primitive's samples, bit for bit, so a rewrite the passes make from a wrong fact
// fails here and not as a silently different program.
#include <gtest/gtest.h>
#include <kiln/kiln.h>

#include <cstring>
#include <limits>
#include <set>

#include "primitive_samples.h"

namespace kiln {
namespace {

using samples::Ts;

// Equal dtype, shape and bytes: signed zeros and NaN payloads count.
bool same_bits(const Tensor& a, const Tensor& b) {
  if (a.type() != b.type()) return false;
  const Tensor ca = a.contiguous(), cb = b.contiguous();
  return std::memcmp(ca.raw_data(), cb.raw_data(),
                     static_cast<std::size_t>(a.numel()) * dtype_size(a.dtype())) == 0;
}

Tensor apply1(const Primitive& p, const Ts& in, const Attrs& attrs = {}) {
  return bind(p, in, attrs)[0];
}

// x with signed zeros, infinities and NaN appended when floating: the values where an
// identity that is right for most numbers goes wrong (x + 0 turns -0 into +0).
Tensor with_edges(const Tensor& x) {
  if (!is_floating(x.dtype())) return reshape(x, {-1});
  const double inf = std::numeric_limits<double>::infinity();
  const Tensor edges = astype(tensor({-0.0, 0.0, inf, -inf, std::nan(""), 1e-310}), x.dtype());
  return concatenate({reshape(x, {-1}), edges});
}

class AlgebraWalk : public testing::TestWithParam<const Primitive*> {};

TEST_P(AlgebraWalk, DeclaredFactsHold) {
  const Primitive& p = *GetParam();
  const Algebra& alg = p.algebra;
  samples::Gen gen(samples::seed_of(p.name), samples::seed_of(p.name) + 1);
  std::optional<samples::Sample> sample;
  for (const samples::PrimitiveSample& s : samples::primitive_samples())
    if (s.prim == p.name && !s.body) {
      sample = s.make(gen);
      break;
    }
  ASSERT_TRUE(sample) << p.name << " declares algebra but has no sample to check it on";
  const Ts in = sample->values();
  const bool binary_facts =
      alg.right_identity || alg.left_identity || alg.integer_zero_absorbs || alg.commutative;
  // Logical primitives take their bools; arithmetic is checked on floats and integers.
  const std::vector<DType> dtypes = in[0].dtype() == bool_
                                        ? std::vector<DType>{bool_}
                                        : std::vector<DType>{float32, float64, int32};
  for (DType d : dtypes) {
    if (p.arity != 2 || !binary_facts) break;
    SCOPED_TRACE(p.name + " on " + std::string(dtype_name(d)));
    const Tensor x = astype(with_edges(in[0]), d);
    const Tensor x2 = flip(x, {0});  // the same values, paired differently
    if (alg.right_identity)
      EXPECT_TRUE(same_bits(apply1(p, {x, full_like(x, *alg.right_identity)}), x))
          << "op(x, " << *alg.right_identity << ") is not x";
    if (alg.left_identity)
      EXPECT_TRUE(same_bits(apply1(p, {full_like(x, *alg.left_identity), x}), x))
          << "op(" << *alg.left_identity << ", x) is not x";
    if (alg.integer_zero_absorbs && !is_floating(d)) {
      EXPECT_TRUE(same_bits(apply1(p, {x, zeros_like(x)}), zeros_like(x)));
      EXPECT_TRUE(same_bits(apply1(p, {zeros_like(x), x}), zeros_like(x)));
    }
    if (alg.commutative)
      EXPECT_TRUE(same_bits(apply1(p, {x, x2}), apply1(p, {x2, x}))) << "op(a, b) != op(b, a)";
    if (alg.adds && d != int32) {  // the sum, to float64's rounding of float32's operands
      const Tensor want = astype(astype(x, float64) + astype(x2, float64), d);
      EXPECT_TRUE(allclose(apply1(p, {x, x2}), want, {.rtol = 1e-7, .atol = 0, .equal_nan = true})
                      .item<bool>())
          << "op(a, b) is not a + b";
    }
  }
  if (alg.pads) {
    // The input at "low", the rest "value": the output cut back is the input, and the output
    // holds the value everywhere else (a constant input of that value fills it whole).
    const Tensor out = apply1(p, in, sample->attrs);
    const std::vector<int64_t>&low = sample->attrs.get_ints("low"),
          &high = sample->attrs.get_ints("high");
    std::vector<Slice> inside;
    for (int i = 0; i < out.rank(); ++i) {
      const auto u = static_cast<std::size_t>(i);
      EXPECT_EQ(out.shape()[i], in[0].shape()[i] + low[u] + high[u]);
      inside.push_back(Slice{low[u], low[u] + in[0].shape()[i], 1});
    }
    EXPECT_TRUE(same_bits(slice(out, inside).contiguous(), in[0]));
    const double value = sample->attrs.get_double("value");
    const Tensor filled = apply1(p, {full_like(in[0], value)}, sample->attrs);
    EXPECT_TRUE(same_bits(filled, full_like(filled, value))) << "the padding is not 'value'";
  }
  if (alg.involution)
    EXPECT_TRUE(same_bits(apply1(p, {apply1(p, {with_edges(in[0])})}), with_edges(in[0])));
  if (alg.reshapes) {
    const Tensor filled = full_like(in[0], -0.0);
    const Tensor out = apply1(p, {filled}, sample->attrs);
    EXPECT_TRUE(same_bits(out, full_like(out, -0.0))) << "a constant-filled input did not stay so";
  }
  if (alg.expands) EXPECT_GE(apply1(p, in, sample->attrs).numel(), in[0].numel());
  if (alg.rearranges) {
    // Every output element is an input element: no arithmetic.
    const Tensor out = apply1(p, in, sample->attrs);
    const std::vector<double> from = astype(in[0], float64).to_vector<double>();
    const std::set<double> have(from.begin(), from.end());
    for (double v : astype(out, float64).to_vector<double>())
      EXPECT_TRUE(have.count(v)) << v << " is not among the input's elements";
  }
  if (!alg.permutation_attr.empty()) {
    const std::string attr(alg.permutation_attr);
    const std::vector<int64_t> perm = sample->attrs.get_ints(attr);
    std::vector<int64_t> twice;
    for (int64_t i : perm) twice.push_back(perm[static_cast<std::size_t>(i)]);
    Attrs composed = sample->attrs;
    composed.set(attr, twice);
    EXPECT_TRUE(same_bits(apply1(p, {apply1(p, in, sample->attrs)}, sample->attrs),
                          apply1(p, in, composed).contiguous()))
        << "op(op(x, p), p) is not op(x, p o p)";
  }
  if (alg.transposes_as_product) {
    const Primitive* transpose = nullptr;
    for (const Primitive* q : all_primitives())
      if (!q->algebra.permutation_attr.empty()) transpose = q;
    ASSERT_TRUE(transpose);
    const Tensor a = in[0], b = in[1];
    if (a.rank() == 2 && b.rank() == 2) {
      Attrs swap;
      swap.set(std::string(transpose->algebra.permutation_attr), std::vector<int64_t>{1, 0});
      const Tensor lhs = apply1(*transpose, {apply1(p, {a, b}, sample->attrs)}, swap);
      const Tensor rhs =
          apply1(p, {apply1(*transpose, {b}, swap), apply1(*transpose, {a}, swap)}, sample->attrs);
      EXPECT_TRUE(allclose(lhs, rhs, {.rtol = 1e-12, .atol = 1e-12}).item<bool>());
    }
  }
}

std::vector<const Primitive*> with_algebra() {
  std::vector<const Primitive*> out;
  for (const Primitive* p : all_primitives()) {
    const Algebra& a = p->algebra;
    if (a.right_identity || a.left_identity || a.integer_zero_absorbs || a.involution ||
        a.reshapes || !a.permutation_attr.empty() || a.transposes_as_product || a.expands ||
        a.commutative || a.rearranges || a.adds || a.pads)
      out.push_back(p);
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Registry, AlgebraWalk, testing::ValuesIn(with_algebra()),
                         [](const testing::TestParamInfo<const Primitive*>& info) {
                           return info.param->name;
                         });

// The walk covers what the optimiser relies on: the facts of add, mul, transpose, ... are
// declared (a primitive that lost its facts would make the passes silently weaker).
TEST(AlgebraWalk, TheArithmeticAndLayoutFactsAreDeclared) {
  EXPECT_EQ(primitive("add").algebra.right_identity, -0.0);
  EXPECT_TRUE(std::signbit(*primitive("add").algebra.right_identity));
  EXPECT_EQ(primitive("mul").algebra.left_identity, 1.0);
  EXPECT_TRUE(primitive("neg").algebra.involution);
  EXPECT_EQ(primitive("transpose").algebra.permutation_attr, "perm");
  EXPECT_TRUE(primitive("reshape").algebra.reshapes);
  EXPECT_TRUE(primitive("matmul").algebra.transposes_as_product);
  EXPECT_TRUE(primitive("cond").algebra.selects_branch);
  EXPECT_TRUE(primitive("scan").algebra.scans_body);
  EXPECT_TRUE(primitive("scan").prune);
  EXPECT_TRUE(primitive("add").algebra.adds);
  EXPECT_TRUE(primitive("pad").algebra.pads);
}

}  // namespace
}  // namespace kiln
