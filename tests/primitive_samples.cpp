// The table of primitive samples (see primitive_samples.h), and the completeness check.
//
// Shapes come from Gen::dim where the exact sizes do not matter (so the vmap walk sees size-1
// axes, ranks and layouts vary), fixed where the sample is built around them (conv/pool
// geometry, masks). Values come from the primitive's domain, away from kinks, poles and ties
// where a derivative is checked there.
#include "primitive_samples.h"

#include <algorithm>
#include <cstddef>
#include <iterator>
#include <limits>
#include <optional>
#include <set>
#include <tuple>
#include <utility>

#include "../examples/custom_primitive.h"

namespace kiln::samples {

uint64_t seed_of(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : s) h = (h ^ ch) * 1099511628211ull;
  return h;
}

// ---- Gen ------------------------------------------------------------------------------

Gen::Gen(uint64_t shape_seed, uint64_t value_seed, int64_t axis_size)
    : rng_(shape_seed), key_(random::key(value_seed)), axis_size_(axis_size) {}

int64_t Gen::dim(int64_t lo, int64_t hi) {
  return lo + static_cast<int64_t>(rng_() % static_cast<uint64_t>(hi - lo + 1));
}
Tensor Gen::normal(const Shape& s) { return random::normal(next(), s, float64); }
Tensor Gen::uniform(const Shape& s, double lo, double hi) {
  return random::uniform(next(), s, float64, lo, hi);
}
Tensor Gen::away_from_zero(const Shape& s, double lo, double hi) {
  const Tensor sign = where(random::bernoulli(next(), 0.5, s), full(Shape{}, 1.0, float64),
                            full(Shape{}, -1.0, float64));
  return sign * uniform(s, lo, hi);
}
Tensor Gen::distinct(const Shape& s) {
  const int64_t n = s.numel();
  const Tensor p = astype(random::permutation(next(), n), float64);
  return reshape(p * 0.3 + uniform(Shape{n}, 0.0, 0.1) - 0.15 * static_cast<double>(n), s);
}
Tensor Gen::small_ints(const Shape& s) { return floor(uniform(s, -2.0, 2.0)); }
Tensor Gen::bernoulli(const Shape& s) { return random::bernoulli(next(), 0.5, s); }
Tensor Gen::indices(const Shape& s, int64_t lo, int64_t hi, DType dtype) {
  return random::randint(next(), s, lo, hi, dtype);
}
Tensor Gen::key() { return next(); }
Tensor Gen::keys(int64_t n) { return random::split(next(), n); }
Tensor Gen::next() { return random::fold_in(key_, counter_++); }

Ts Sample::values() const {
  Ts v;
  for (const Arg& a : args) v.push_back(a.value);
  return v;
}

std::string name_of(const PrimitiveSample& s) {
  return s.label.empty() ? s.prim : s.prim + "_" + s.label;
}
void PrintTo(const PrimitiveSample& s, std::ostream* os) { *os << name_of(s); }

namespace {

// ---- building blocks ----------------------------------------------------------------------

using Draw = std::function<Tensor(Gen&, const Shape&)>;
using Ints = std::vector<int64_t>;

Tensor normal(Gen& g, const Shape& s) { return g.normal(s); }
Tensor bools(Gen& g, const Shape& s) { return g.bernoulli(s); }
Tensor small(Gen& g, const Shape& s) { return g.small_ints(s); }
Tensor ints(Gen& g, const Shape& s) { return astype(g.small_ints(s) * 7.0, int32); }
Draw uniform_in(double lo, double hi) {
  return [lo, hi](Gen& g, const Shape& s) { return g.uniform(s, lo, hi); };
}
Draw away(double lo, double hi) {
  return [lo, hi](Gen& g, const Shape& s) { return g.away_from_zero(s, lo, hi); };
}

// The shape of elementwise and reduction samples: random sizes, the first possibly 1 (the vmap
// walk sees size-1 axes), at least 12 elements (the AD walk sees both sides of value-dependent
// rules: abs's sign, max's choice, huber's two pieces).
Shape elementwise_shape(Gen& g) { return Shape{g.dim(), g.dim(3, 4), g.dim(4, 5)}; }

PrimitiveSample unary(std::string prim, Draw draw, std::string label = "") {
  return {.prim = std::move(prim), .label = std::move(label), .make = [draw](Gen& g) {
            const Shape s = elementwise_shape(g);
            return Sample{{{draw(g, s)}}, {}};
          }};
}
PrimitiveSample binary(std::string prim, Draw a, Draw b, std::string label = "") {
  return {.prim = std::move(prim), .label = std::move(label), .make = [a, b](Gen& g) {
            const Shape s = elementwise_shape(g);
            return Sample{{{a(g, s)}, {b(g, s)}}, {}};
          }};
}
// Integers carry no derivatives (docs/DESIGN.md), so integer samples are not the AD walk's.
PrimitiveSample integers(PrimitiveSample s) {
  s.ad.check = false;
  return s;
}

// x: f64[3,4,5] with no zeros, and zeros at chosen places: one in slice (0, :, 0) and two in
// slice (1, :, 2) along axis 1 (the cases reduce_prod's rule treats specially).
Tensor with_zeros(Gen& g) {
  std::vector<double> mask(60, 1.0);
  auto at = [](int i, int j, int k) { return static_cast<std::size_t>((i * 4 + j) * 5 + k); };
  mask[at(0, 1, 0)] = 0.0;
  mask[at(1, 0, 2)] = 0.0;
  mask[at(1, 3, 2)] = 0.0;
  return g.away_from_zero(Shape{3, 4, 5}, 0.5, 1.5) * tensor(mask, Shape{3, 4, 5});
}

// The vmap reference for collectives: `combine` of all examples' first inputs, the same for
// each example.
Reference collective(std::function<Tensor(const Ts& xs)> combine) {
  return [combine](const std::vector<Ts>& ex, const Attrs&) {
    Ts xs;
    for (const Ts& e : ex) xs.push_back(e[0]);
    const Tensor r = combine(xs);
    return std::vector<Ts>(ex.size(), Ts{r});
  };
}

// ---- the table ----------------------------------------------------------------------------

std::vector<PrimitiveSample> make_table() {
  std::vector<PrimitiveSample> c;
  // ---- unary elementwise ----
  for (const char* p : {"neg", "exp", "expm1", "sin", "cos", "tanh", "sigmoid", "erf", "sign"})
    c.push_back(unary(p, normal));
  c.push_back(integers(unary("neg", ints, "int32")));
  c.push_back(unary("abs", away(0.2, 1.5)));  // away from the kink
  c.push_back(integers(unary("abs", ints, "int32")));
  for (const char* p : {"log", "sqrt", "rsqrt"}) c.push_back(unary(p, uniform_in(0.5, 2.0)));
  c.push_back(unary("log1p", uniform_in(-0.5, 2.0)));
  c.push_back(unary("tan", uniform_in(-1.0, 1.0)));
  for (const char* p : {"floor", "ceil", "round"})
    c.push_back(unary(p, [](Gen& g, const Shape& s) { return g.normal(s) * 3.0; }));
  c.push_back(unary("not", bools));
  c.push_back(unary("isnan", [](Gen& g, const Shape& s) {
    return where(g.bernoulli(s), full(Shape{}, NAN, float64), g.normal(s));
  }));
  c.push_back(unary("stop_gradient", normal));
  // convert is linear, so finite differences with a large step are exact up to float32
  // rounding of the values (~6e-8 relative): step 1e-2, tolerance 1e-4.
  const AdKnobs through_f32{.fd_h = 1e-2, .fd_rtol = 1e-4, .dot_rtol = 1e-6};
  c.push_back({.prim = "convert",
               .label = "f64_to_f32",
               .make =
                   [](Gen& g) {
                     return Sample{{{g.normal(elementwise_shape(g))}}, {{"dtype", float32}}};
                   },
               .ad = through_f32});
  c.push_back({.prim = "convert",
               .label = "f32_to_f64",
               .make =
                   [](Gen& g) {
                     return Sample{{{astype(g.normal(elementwise_shape(g)), float32)}},
                                   {{"dtype", float64}}};
                   },
               .ad = through_f32});
  c.push_back(
      integers({.prim = "convert", .label = "f64_to_i32", .make = [](Gen& g) {
                  return Sample{{{g.normal(elementwise_shape(g)) * 4.0}}, {{"dtype", int32}}};
                }}));

  // ---- binary elementwise and select ----
  for (const char* p : {"add", "sub", "mul"}) c.push_back(binary(p, normal, normal));
  c.push_back(integers(binary("add", ints, ints, "int32")));
  c.push_back(binary("div", normal, away(0.5, 2.0)));
  c.push_back(binary("pow", uniform_in(0.5, 2.0), uniform_in(-1.5, 1.5)));
  for (const char* p : {"max", "min"})  // operands at least 0.2 apart: no ties
    c.push_back({.prim = p, .label = "", .make = [](Gen& g) {
                   const Shape s = elementwise_shape(g);
                   const Tensor b = g.normal(s);
                   return Sample{{{b + g.away_from_zero(s, 0.2, 1.0)}, {b}}, {}};
                 }});
  for (const char* p : {"eq", "ne", "lt", "le", "gt", "ge"}) c.push_back(binary(p, small, small));
  for (const char* p : {"and", "or", "xor"}) c.push_back(binary(p, bools, bools));
  c.push_back({.prim = "select", .label = "", .make = [](Gen& g) {
                 const Shape s = elementwise_shape(g);
                 return Sample{{fixed(g.bernoulli(s)), {g.normal(s)}, {g.normal(s)}}, {}};
               }});

  // ---- reductions (negative axes count from the end) ----
  const auto reduce = [&](const char* p, Ints axes, Draw draw, std::string label) {
    c.push_back({.prim = p, .label = std::move(label), .make = [axes, draw](Gen& g) {
                   return Sample{{{draw(g, elementwise_shape(g))}}, {{"axes", axes}}};
                 }});
  };
  const Draw distinct = [](Gen& g, const Shape& s) { return g.distinct(s); };
  reduce("reduce_sum", {0, 2}, normal, "");
  reduce("reduce_sum", {-1}, normal, "negative_axis");
  reduce("reduce_sum", {}, normal, "no_axes");
  reduce("reduce_prod", {1}, away(0.5, 1.5), "");
  reduce("reduce_prod", {0, -1}, away(0.5, 1.5), "negative_axis");
  // A product is a polynomial, so it is smooth at zeros too and finite differences hold there.
  c.push_back({.prim = "reduce_prod", .label = "with_zeros", .make = [](Gen& g) {
                 return Sample{{{with_zeros(g)}}, {{"axes", Ints{1}}}};
               }});
  c.push_back({.prim = "reduce_prod", .label = "two_axes_with_zeros", .make = [](Gen& g) {
                 return Sample{{{with_zeros(g)}}, {{"axes", Ints{0, 2}}}};
               }});
  reduce("reduce_max", {2}, distinct, "");
  reduce("reduce_max", {-2, -1}, distinct, "negative_axes");
  reduce("reduce_min", {0, 1}, distinct, "");
  reduce("reduce_min", {-3}, distinct, "negative_axis");
  reduce("reduce_min", {2}, distinct, "last_axis");  // the compiled column template
  reduce("reduce_and", {1}, bools, "");
  reduce("reduce_and", {-1}, bools, "last_axis");  // the compiled column template
  reduce("reduce_or", {0, -1}, bools, "");
  for (const char* p : {"argmax", "argmin"}) {
    c.push_back({.prim = p, .label = "", .make = [](Gen& g) {
                   return Sample{{{g.normal(Shape{g.dim(), g.dim(2, 5), g.dim()})}},
                                 {{"axis", int64_t{1}}}};
                 }});
    c.push_back(
        {.prim = p, .label = "negative_axis", .make = [](Gen& g) {
           return Sample{{{g.normal(Shape{g.dim(), g.dim(2, 5)})}}, {{"axis", int64_t{-1}}}};
         }});
  }
  // nn.cross_entropy's label check (the identity on valid labels; -100 is the ignore_index).
  c.push_back({.prim = "check_labels", .label = "", .make = [](Gen& g) {
                 const Shape s{g.dim(), g.dim()};
                 const Tensor ignored = full(Shape{}, -100.0, int64);
                 return Sample{{{where(g.bernoulli(s), g.indices(s, 0, 4), ignored)}},
                               {{"classes", int64_t{4}}, {"ignore_index", int64_t{-100}}}};
               }});

  // ---- shapes ----
  c.push_back({.prim = "reshape", .label = "", .make = [](Gen& g) {
                 const int64_t a = g.dim(), b = g.dim();
                 return Sample{{{g.normal(Shape{a, 2, b})}}, {{"shape", Ints{b, 2 * a}}}};
               }});
  c.push_back({.prim = "reshape", .label = "to_scalar", .make = [](Gen& g) {
                 return Sample{{{g.normal(Shape{1, 1})}}, {{"shape", Ints{}}}};
               }});
  c.push_back(
      {.prim = "transpose", .label = "", .make = [](Gen& g) {
         return Sample{{{g.normal(Shape{g.dim(), g.dim(), g.dim()})}}, {{"perm", Ints{2, 0, 1}}}};
       }});
  c.push_back({.prim = "broadcast_to", .label = "", .make = [](Gen& g) {
                 const int64_t n = g.dim();
                 return Sample{{{g.normal(Shape{n, 1})}}, {{"shape", Ints{2, n, 4}}}};
               }});
  c.push_back({.prim = "broadcast_to", .label = "scalar", .make = [](Gen& g) {
                 return Sample{{{g.normal(Shape{})}}, {{"shape", Ints{3, 2}}}};
               }});
  c.push_back({.prim = "slice", .label = "steps", .make = [](Gen& g) {
                 return Sample{
                     {{g.normal(Shape{7, g.dim(5, 6), 3})}},
                     {{"start", Ints{1, 0, 1}}, {"stop", Ints{7, 5, 3}}, {"step", Ints{2, 3, 1}}}};
               }});
  c.push_back({.prim = "slice", .label = "ragged_steps", .make = [](Gen& g) {
                 return Sample{{{g.normal(Shape{8, 7})}},
                               {{"start", Ints{2, 1}}, {"stop", Ints{7, 6}}, {"step", Ints{3, 2}}}};
               }});
  c.push_back(
      {.prim = "flip", .label = "", .make = [](Gen& g) {
         return Sample{{{g.normal(Shape{g.dim(), g.dim(), g.dim()})}}, {{"axes", Ints{0, 2}}}};
       }});
  c.push_back({.prim = "flip", .label = "negative_axis", .make = [](Gen& g) {
                 return Sample{{{g.normal(Shape{g.dim(), g.dim(2, 4)})}}, {{"axes", Ints{-1}}}};
               }});
  c.push_back(
      {.prim = "concatenate", .label = "", .make = [](Gen& g) {
         const int64_t n = g.dim();
         return Sample{
             {{g.normal(Shape{n, 3})}, {g.normal(Shape{n, 1})}, {g.normal(Shape{n, g.dim()})}},
             {{"axis", int64_t{1}}}};
       }});
  c.push_back({.prim = "concatenate", .label = "negative_axis", .make = [](Gen& g) {
                 const int64_t n = g.dim();
                 return Sample{{{g.normal(Shape{2, n})}, {g.normal(Shape{2, g.dim()})}},
                               {{"axis", int64_t{-1}}}};
               }});
  c.push_back({.prim = "pad", .label = "", .make = [](Gen& g) {
                 return Sample{{{g.normal(Shape{g.dim(), g.dim()})}},
                               {{"low", Ints{1, 0}}, {"high", Ints{2, 3}}, {"value", 1.5}}};
               }});

  // ---- gather and scatter: random indices (negative ones too), and fixed indices that repeat,
  // so that scatter_add (gather's transpose) accumulates ----
  const auto repeated = [] { return tensor(std::vector<int64_t>{4, 0, 4, 1}, Shape{2, 2}); };
  c.push_back({.prim = "gather", .label = "", .make = [](Gen& g) {
                 return Sample{{{g.normal(Shape{g.dim(), 5, 2})},
                                fixed(g.indices(Shape{g.dim(), g.dim()}, -5, 5))},
                               {{"axis", int64_t{1}}}};
               }});
  c.push_back(
      {.prim = "gather", .label = "repeated_indices", .make = [repeated](Gen& g) {
         return Sample{{{g.normal(Shape{3, 5, 2})}, fixed(repeated())}, {{"axis", int64_t{1}}}};
       }});
  c.push_back({.prim = "gather", .label = "negative_axis_i32", .make = [](Gen& g) {
                 return Sample{
                     {{g.normal(Shape{g.dim(), 4})}, fixed(g.indices(Shape{3}, 0, 4, int32))},
                     {{"axis", int64_t{-1}}}};
               }});
  c.push_back({.prim = "gather", .label = "scalar_index", .make = [](Gen& g) {
                 return Sample{{{g.normal(Shape{4, g.dim()})}, fixed(g.indices(Shape{}, 0, 4))},
                               {{"axis", int64_t{0}}}};
               }});
  c.push_back({.prim = "scatter_add", .label = "", .make = [](Gen& g) {
                 const int64_t a = g.dim();
                 return Sample{{{g.normal(Shape{a, 5, 2})},
                                fixed(g.indices(Shape{2, 2}, 0, 5)),
                                {g.normal(Shape{a, 2, 2, 2})}},
                               {{"axis", int64_t{1}}}};
               }});
  c.push_back({.prim = "scatter_add", .label = "repeated_indices", .make = [repeated](Gen& g) {
                 return Sample{
                     {{g.normal(Shape{3, 5, 2})}, fixed(repeated()), {g.normal(Shape{3, 2, 2, 2})}},
                     {{"axis", int64_t{1}}}};
               }});
  c.push_back({.prim = "gather_along", .label = "", .make = [](Gen& g) {
                 const int64_t a = g.dim();
                 return Sample{{{g.normal(Shape{a, 4})}, fixed(g.indices(Shape{a, 5}, 0, 4))},
                               {{"axis", int64_t{1}}}};
               }});
  c.push_back({.prim = "scatter_add_along", .label = "", .make = [](Gen& g) {
                 const int64_t a = g.dim();
                 return Sample{{{g.normal(Shape{a, 4})},
                                fixed(g.indices(Shape{a, 5}, 0, 4)),
                                {g.normal(Shape{a, 5})}},
                               {{"axis", int64_t{1}}}};
               }});

  // ---- linear algebra, convolution, pooling ----
  c.push_back({.prim = "matmul", .label = "", .make = [](Gen& g) {
                 const int64_t m = g.dim(), k = g.dim(2, 5), n = g.dim();
                 return Sample{{{g.normal(Shape{m, k})}, {g.normal(Shape{k, n})}}, {}};
               }});
  c.push_back({.prim = "matmul", .label = "batched", .make = [](Gen& g) {
                 return Sample{{{g.normal(Shape{2, 3, 4})}, {g.normal(Shape{2, 4, g.dim()})}}, {}};
               }});
  c.push_back({.prim = "conv", .label = "", .make = [](Gen& g) {
                 return Sample{{{g.normal(Shape{g.dim(1, 2), 3, 5, 6})},
                                {g.normal(Shape{g.dim(1, 3), 3, 3, 2})}},
                               {{"stride", Ints{1, 1}},
                                {"padding", Ints{0, 0}},
                                {"dilation", Ints{1, 1}},
                                {"groups", int64_t{1}}}};
               }});
  c.push_back({.prim = "conv", .label = "strided_padded_dilated_grouped", .make = [](Gen& g) {
                 return Sample{{{g.normal(Shape{2, 4, 7, 6})}, {g.normal(Shape{6, 2, 3, 2})}},
                               {{"stride", Ints{2, 1}},
                                {"padding", Ints{1, 2}},
                                {"dilation", Ints{1, 2}},
                                {"groups", int64_t{2}}}};
               }});
  // x [2, 4, 7, 6] and w [6, 2, 3, 2] under these attributes give dy [2, 6, 4, 8].
  const auto conv_grad_attrs = [](const char* name, Ints value) {
    Attrs a{{"stride", Ints{2, 1}},
            {"padding", Ints{1, 2}},
            {"dilation", Ints{1, 2}},
            {"groups", int64_t{2}}};
    a.set(name, std::move(value));
    return a;
  };
  c.push_back(
      {.prim = "conv_input_grad", .label = "strided_padded_dilated_grouped", .make = [=](Gen& g) {
         return Sample{{{g.normal(Shape{2, 6, 4, 8})}, {g.normal(Shape{6, 2, 3, 2})}},
                       conv_grad_attrs("input_size", Ints{7, 6})};
       }});
  c.push_back(
      {.prim = "conv_weight_grad", .label = "strided_padded_dilated_grouped", .make = [=](Gen& g) {
         return Sample{{{g.normal(Shape{2, 6, 4, 8})}, {g.normal(Shape{2, 4, 7, 6})}},
                       conv_grad_attrs("kernel_size", Ints{3, 2})};
       }});
  const Attrs pool{{"kernel", Ints{2, 3}}, {"stride", Ints{2, 1}}, {"padding", Ints{1, 1}}};
  c.push_back({.prim = "max_pool2d", .label = "", .make = [pool](Gen& g) {
                 return Sample{{{g.distinct(Shape{g.dim(1, 2), 3, 5, 6})}}, pool};  // no ties
               }});
  c.push_back(
      {.prim = "max_pool2d_grad", .label = "", .make = [pool](Gen& g) {
         const int64_t n = g.dim(1, 2);
         return Sample{{{g.distinct(Shape{n, 3, 5, 6})}, {g.normal(Shape{n, 3, 3, 6})}}, pool};
       }});
  c.push_back({.prim = "avg_pool2d", .label = "", .make = [pool](Gen& g) {
                 return Sample{{{g.normal(Shape{g.dim(1, 2), 3, 5, 6})}}, pool};
               }});

  // ---- random: batched keys give independent streams, unbatched keys the same numbers ----
  c.push_back({.prim = "random_bits", .label = "", .make = [](Gen& g) {
                 return Sample{{{g.key()}}, {{"shape", Ints{g.dim(), 3}}}};
               }});
  c.push_back({.prim = "random_bits", .label = "key_batch", .make = [](Gen& g) {
                 return Sample{{{g.keys(3)}}, {{"shape", Ints{g.dim()}}}};
               }});
  c.push_back({.prim = "random_uniform", .label = "", .make = [](Gen& g) {
                 return Sample{{{g.key()}}, {{"shape", Ints{g.dim(), 2}}, {"dtype", float32}}};
               }});
  c.push_back({.prim = "random_uniform", .label = "key_batch_f64", .make = [](Gen& g) {
                 return Sample{{{g.keys(2)}}, {{"shape", Ints{3}}, {"dtype", float64}}};
               }});
  c.push_back({.prim = "random_split", .label = "", .make = [](Gen& g) {
                 return Sample{{{g.key()}}, {{"n", int64_t{3}}}};
               }});
  c.push_back({.prim = "random_fold_in", .label = "", .make = [](Gen& g) {
                 return Sample{{{g.keys(2)}}, {{"data", int64_t{17}}}};
               }});
  c.push_back({.prim = "random_permutation", .label = "", .make = [](Gen& g) {
                 return Sample{{{g.key()}}, {{"n", int64_t{6}}}};
               }});

  // ---- random distributions (src/ops/random_distributions.cpp): parameters follow the key's
  // batch axes ----
  c.push_back(
      {.prim = "random_truncated_normal", .label = "", .make = [](Gen& g) {
         return Sample{
             {{g.key()}},
             {{"shape", Ints{g.dim(), 3}}, {"dtype", float64}, {"lower", -0.5}, {"upper", 2.0}}};
       }});
  c.push_back({.prim = "random_truncated_normal", .label = "key_batch_tail", .make = [](Gen& g) {
                 return Sample{{{g.keys(2)}},
                               {{"shape", Ints{4}},
                                {"dtype", float32},
                                {"lower", 3.0},
                                {"upper", std::numeric_limits<double>::infinity()}}};
               }});
  for (const double lam : {3.0, 25.0})  // Knuth's method, transformed rejection
    c.push_back(
        {.prim = "random_poisson", .label = lam < 10 ? "small" : "large", .make = [lam](Gen& g) {
           return Sample{{{g.keys(2)}}, {{"shape", Ints{g.dim()}}, {"dtype", int32}, {"lam", lam}}};
         }});
  c.push_back({.prim = "random_gamma", .label = "", .make = [](Gen& g) {
                 return Sample{{fixed(g.keys(3)), {g.uniform(Shape{3, g.dim()}, 0.2, 4.0)}},
                               {{"log", false}}};
               }});
  c.push_back({.prim = "random_gamma", .label = "log", .make = [](Gen& g) {
                 return Sample{{fixed(g.key()), {g.uniform(Shape{g.dim(), 2}, 0.01, 2.0)}},
                               {{"log", true}}};
               }});
  c.push_back(
      {.prim = "random_gumbel_top_k", .label = "", .make = [](Gen& g) {
         return Sample{{fixed(g.keys(2)), {g.normal(Shape{2, 5})}}, {{"num_samples", int64_t{3}}}};
       }});

  // ---- primitives holding sub-functions ----
  c.push_back({.prim = "call", .label = "two_results", .make = [](Gen& g) {
                 const TensorType m{float64, Shape{3, 4}}, v{float64, Shape{4}};
                 FunctionRef fn = traced("inner", {m, v}, [](const Ts& a) {
                   return Ts{sin(a[0]) * a[1], sum(exp(a[1])) + matmul(a[0], a[1])};
                 });
                 return Sample{{{g.normal(Shape{3, 4})}, {g.normal(Shape{4})}}, with_fn("fn", fn)};
               }});
  c.push_back({.prim = "call", .label = "nested_call_with_constant", .make = [](Gen& g) {
                 const TensorType m{float64, Shape{2, 3}};
                 FunctionRef inner = traced("inner", {m}, [](const Ts& a) {
                   return Ts{a[0] * tensor({1.0, 2.0, 3.0})};
                 });
                 FunctionRef fn = traced("outer", {m}, [inner](const Ts& a) {
                   Ts r = kiln::bind(primitive("call"), {tanh(a[0])}, with_fn("fn", inner));
                   return Ts{r[0] + a[0], sum(a[0], {1})};
                 });
                 return Sample{{{g.normal(Shape{2, 3})}}, with_fn("fn", fn)};
               }});
  c.push_back({.prim = "checkpoint", .label = "", .make = [](Gen& g) {
                 const TensorType m{float64, Shape{3, 4}};
                 FunctionRef fn =
                     traced("inner", {m}, [](const Ts& a) { return Ts{tanh(a[0]) * a[0]}; });
                 return Sample{{{g.normal(Shape{3, 4})}}, with_fn("fn", fn)};
               }});
  c.push_back(
      {.prim = "checkpoint", .label = "two_inputs_with_max", .make = [](Gen& g) {
         const TensorType m{float64, Shape{3, 4}};
         FunctionRef fn = traced("inner", {m, m}, [](const Ts& a) {
           return Ts{tanh(a[0]) * a[1] + max(a[0], {1}, true)};
         });
         return Sample{{{g.distinct(Shape{3, 4})}, {g.normal(Shape{3, 4})}}, with_fn("fn", fn)};
       }});
  // f(x, y) = sin(x) y with its true derivative as the user rule: checks the mechanism.
  c.push_back(
      {.prim = "custom_jvp", .label = "", .make = [](Gen& g) {
         const TensorType m{float64, Shape{3, 4}};
         FunctionRef fn = traced("f", {m, m}, [](const Ts& a) { return Ts{sin(a[0]) * a[1]}; });
         FunctionRef rule = traced("f_jvp", {m, m, m, m}, [](const Ts& a) {
           return Ts{cos(a[0]) * a[2] * a[1] + sin(a[0]) * a[3]};
         });
         return Sample{{{g.normal(Shape{3, 4})}, {g.normal(Shape{3, 4})}},
                       with_fn("fn", fn, with_fn("jvp", rule))};
       }});
  // custom_vjp has no JVP by design: the AD walk checks its VJP against finite differences
  // directly, and its second derivatives reverse-over-reverse only.
  c.push_back(
      {.prim = "custom_vjp",
       .label = "",
       .make =
           [](Gen& g) {
             const TensorType m{float64, Shape{3, 4}};
             FunctionRef fn = traced("f", {m, m}, [](const Ts& a) { return Ts{sin(a[0]) * a[1]}; });
             FunctionRef bwd = traced("f_bwd", {m, m, m, m}, [](const Ts& a) {
               return Ts{a[3] * cos(a[0]) * a[1], a[3] * sin(a[0])};  // (x, y, out, ct)
             });
             return Sample{{{g.normal(Shape{3, 4})}, {g.normal(Shape{3, 4})}},
                           with_fn("fn", fn, with_fn("bwd", bwd))};
           },
       .ad = {.forward_mode = false}});
  // custom_vjp's residual form: fwd returns (sin(x) y, cos x, sin x, y), so the walks see the
  // residuals as results too (their VJP goes through fwd by ordinary reverse mode).
  c.push_back(
      {.prim = "custom_vjp",
       .label = "residuals",
       .make =
           [](Gen& g) {
             const TensorType m{float64, Shape{3, 4}};
             FunctionRef fn = traced("f", {m, m}, [](const Ts& a) { return Ts{sin(a[0]) * a[1]}; });
             FunctionRef fwd = traced("f_fwd", {m, m}, [](const Ts& a) {
               return Ts{sin(a[0]) * a[1], cos(a[0]), sin(a[0]), a[1]};
             });
             FunctionRef bwd = traced("f_bwd", {m, m, m, m}, [](const Ts& a) {
               return Ts{a[3] * a[0] * a[2], a[3] * a[1]};  // (cos x, sin x, y, ct)
             });
             return Sample{{{g.normal(Shape{3, 4})}, {g.normal(Shape{3, 4})}},
                           with_fn("fn", fn, with_fn("fwd", fwd, with_fn("bwd", bwd)))};
           },
       .ad = {.forward_mode = false}});

  // ---- control flow: the primitives bound directly (operand layouts in
  // src/transforms/cond.cpp, while_loop.cpp, scan.cpp), and through the public API (batched and
  // shared predicates, per-example trip counts, batched carries and xs, the reverse pass of a
  // data-dependent loop) ----
  const TensorType m3{float64, Shape{3}}, i0{int32, Shape{}};
  // cond: (index, operands...) with one branch function per index; both branches checked.
  for (int32_t taken : {0, 1}) {
    c.push_back({.prim = "cond", .label = taken ? "branch1" : "branch0", .make = [=](Gen& g) {
                   FunctionRef b0 =
                       traced("b0", {m3, m3}, [](const Ts& a) { return Ts{cos(a[0]) * a[1]}; });
                   FunctionRef b1 = traced("b1", {m3, m3},
                                           [](const Ts& a) { return Ts{sin(a[0]) * a[0] + a[1]}; });
                   return Sample{{fixed(tensor(taken)), {g.normal(Shape{3})}, {g.normal(Shape{3})}},
                                 with_fn("branch0", b0, with_fn("branch1", b1))};
                 }});
  }
  c.push_back({.prim = "cond",
               .label = "api",
               .make =
                   [](Gen& g) {
                     const Shape s{g.dim()};
                     return Sample{{fixed(g.bernoulli(Shape{})), {g.normal(s)}, {g.normal(s)}}, {}};
                   },
               .body =
                   [](const Ts& a) {
                     return Ts{cond(
                         a[0], [](const Tensor& x, const Tensor& y) { return sin(x) * y; },
                         [](const Tensor& x, const Tensor& y) { return x - exp(y); }, a[1], a[2])};
                   }});
  // while: (carry..., captures...); three iterations of a smooth map, the counter fixed.
  c.push_back(
      {.prim = "while", .label = "", .make = [=](Gen& g) {
         FunctionRef cf = traced("c", {m3, i0, m3}, [](const Ts& a) { return Ts{a[1] < 3}; });
         FunctionRef bf = traced("b", {m3, i0, m3}, [](const Ts& a) {
           return Ts{sin(a[0]) * a[2] + a[0] * 0.5, a[1] + 1};
         });
         return Sample{{{g.normal(Shape{3})}, fixed(tensor(int32_t{0})), {g.normal(Shape{3})}},
                       with_fn("cond_fn", cf, with_fn("body_fn", bf))};
       }});
  using Carry = std::pair<Tensor, Tensor>;
  const auto trips = [](const Tensor& x, const Tensor& n) {
    return while_loop([&](const Carry& s) { return s.first < n; },
                      [](const Carry& s) {
                        return Carry{s.first + 1, sin(s.second) * 1.5 + 0.1};
                      },
                      Carry{tensor(int32_t{0}), x})
        .second;
  };
  c.push_back({.prim = "while",
               .label = "per_example_trip_counts",
               .make =
                   [](Gen& g) {
                     return Sample{
                         {{g.normal(Shape{g.dim()})}, fixed(g.indices(Shape{}, 0, 4, int32))}, {}};
                   },
               .body = [trips](const Ts& a) { return Ts{trips(a[0], a[1])}; }});
  c.push_back({.prim = "while_grad",
               .label = "",
               .make =
                   [](Gen& g) {
                     return Sample{
                         {{g.normal(Shape{g.dim()})}, fixed(g.indices(Shape{}, 0, 4, int32))}, {}};
                   },
               .body =
                   [trips](const Ts& a) {
                     return Ts{grad([trips](const Tensor& x, const Tensor& n) {
                       return sum(trips(x, n));
                     })(a[0], a[1])};
                   }});
  // scan: (carry..., xs...) -> (carry..., stacked ys...), forward and reverse.
  for (bool reverse : {false, true}) {
    c.push_back({.prim = "scan", .label = reverse ? "reverse" : "forward", .make = [=](Gen& g) {
                   FunctionRef body = traced("body", {m3, m3}, [](const Ts& a) {
                     return Ts{tanh(a[0] * 0.8 + a[1]), a[0] * a[1]};
                   });
                   Attrs attrs = with_fn("body", body);
                   attrs.set("length", int64_t{4});
                   attrs.set("reverse", reverse);
                   attrs.set("num_carry", int64_t{1});
                   attrs.set("num_xs", int64_t{1});
                   return Sample{{{g.normal(Shape{3})}, {g.normal(Shape{4, 3})}}, attrs};
                 }});
  }
  c.push_back({.prim = "scan",
               .label = "api",
               .make =
                   [](Gen& g) {
                     const int64_t n = g.dim();
                     return Sample{{{g.normal(Shape{n})}, {g.normal(Shape{g.dim(), n})}}, {}};
                   },
               .body =
                   [](const Ts& a) {
                     auto [carry, ys] = scan(
                         [](const Tensor& c, const Tensor& x) {
                           return Carry{tanh(c + x), c * x};
                         },
                         a[0], a[1]);
                     return Ts{carry, ys};
                   }});
  c.push_back({.prim = "scan",
               .label = "api_reverse",
               .make =
                   [](Gen& g) {
                     return Sample{{{g.normal(Shape{2})}, {g.normal(Shape{3, 2})}}, {}};
                   },
               .body =
                   [](const Ts& a) {
                     auto [carry, ys] = scan(
                         [](const Tensor& c, const Tensor& x) {
                           return Carry{c * 0.5 + x, sum(c)};
                         },
                         a[0], a[1], ScanOptions{.reverse = true, .length = std::nullopt});
                     return Ts{carry, ys};
                   }});

  // ---- collectives over a named axis (inputs: the whole axis, Gen::axis_size examples) ----
  const Attrs named{{"axis_name", std::string("batch")}};
  // The reference of a reduction over the axis: the examples folded with op, in order.
  const auto folded = [](auto op) {
    return collective([op](const Ts& xs) {
      Tensor r = xs[0];
      for (std::size_t i = 1; i < xs.size(); ++i) r = op(r, xs[i]);
      return r;
    });
  };
  c.push_back(
      {.prim = "psum",
       .label = "",
       .make =
           [named](Gen& g) {
             return Sample{{{g.normal(Shape{g.axis_size(), g.dim(), 2})}}, named};
           },
       .axis_name = "batch",
       .vmap = {.reference = folded([](const Tensor& a, const Tensor& b) { return a + b; })}});
  c.push_back({.prim = "pmax",
               .label = "",
               .make =
                   [named](Gen& g) {  // no ties across examples
                     return Sample{{{g.distinct(Shape{g.axis_size(), g.dim(), 2})}}, named};
                   },
               .axis_name = "batch",
               .vmap = {.reference = folded(
                            [](const Tensor& a, const Tensor& b) { return maximum(a, b); })}});
  c.push_back({.prim = "all_gather",
               .label = "",
               .make =
                   [](Gen& g) {
                     return Sample{
                         {{g.normal(Shape{g.axis_size(), g.dim(), 2})}},
                         {{"axis_name", std::string("batch")}, {"axis_size", g.axis_size()}}};
                   },
               .axis_name = "batch",
               .vmap = {.reference = collective([](const Ts& xs) { return stack(xs, 0); })}});
  c.push_back({.prim = "axis_index",
               .label = "",
               .make =
                   [named](Gen&) {
                     return Sample{{}, named};
                   },
               .axis_name = "batch",
               .vmap = {.reference = [](const std::vector<Ts>& ex, const Attrs&) {
                 std::vector<Ts> out;
                 for (std::size_t i = 0; i < ex.size(); ++i)
                   out.push_back({tensor(std::vector<int32_t>{static_cast<int32_t>(i)}, Shape{})});
                 return out;
               }}});

  // ---- pmin and the collectives that move data between examples (inputs: the whole axis).
  // References built per example i from every example's first input xs[j], with numpy's
  // indexing ----
  const auto each = [](std::function<Tensor(const Ts& xs, int64_t i, const Attrs&)> f) {
    return [f](const std::vector<Ts>& ex, const Attrs& a) {
      Ts xs;
      for (const Ts& e : ex) xs.push_back(e[0]);
      std::vector<Ts> out;
      for (std::size_t i = 0; i < ex.size(); ++i)
        out.push_back({f(xs, static_cast<int64_t>(i), a)});
      return out;
    };
  };
  // x[..., i, ...] with i at `axis` (negative: from the end).
  const auto at = [](const Tensor& x, int64_t axis, int64_t i) {
    return index(moveaxis(x, axis < 0 ? axis + x.rank() : axis, 0), i);
  };
  c.push_back({.prim = "pmin",
               .label = "",
               .make =
                   [named](Gen& g) {  // no ties across examples
                     return Sample{{{g.distinct(Shape{g.axis_size(), g.dim(), 2})}}, named};
                   },
               .axis_name = "batch",
               .vmap = {.reference = folded(
                            [](const Tensor& a, const Tensor& b) { return minimum(a, b); })}});
  c.push_back(integers({.prim = "pmin",
                        .label = "int32",
                        .make =
                            [named](Gen& g) {
                              return Sample{{{ints(g, Shape{g.axis_size(), 3})}}, named};
                            },
                        .axis_name = "batch",
                        .vmap = {.reference = collective([](const Ts& xs) {
                                   Tensor m = xs[0];
                                   for (std::size_t i = 1; i < xs.size(); ++i)
                                     m = minimum(m, xs[i]);
                                   return m;
                                 })}}));
  // ppermute's pairs (i, i + 1): example 0 receives nothing, the last sends nothing; with
  // `cycle` also (n - 1, 0), a whole permutation.
  const auto shifted = [](int64_t n, bool cycle) {
    std::vector<int64_t> perm;
    for (int64_t i = 0; i < (cycle ? n : n - 1); ++i) {
      perm.push_back(i);
      perm.push_back((i + 1) % n);
    }
    return Attrs{{"axis_name", std::string("batch")}, {"perm", perm}};
  };
  const Reference permuted = [](const std::vector<Ts>& ex, const Attrs& a) {
    const std::vector<int64_t>& perm = a.get_ints("perm");
    std::vector<Ts> out(ex.size(), Ts{zeros_like(ex[0][0])});
    for (std::size_t k = 0; k < perm.size(); k += 2)
      out[static_cast<std::size_t>(perm[k + 1])] = {ex[static_cast<std::size_t>(perm[k])][0]};
    return out;
  };
  for (const auto& [label, cycle, draw, differentiable] :
       {std::tuple{"", false, Draw(normal), true}, std::tuple{"cycle", true, Draw(normal), true},
        std::tuple{"bool", false, Draw(bools), false},
        std::tuple{"int32_cycle", true, Draw(ints), false}}) {
    const PrimitiveSample ps{.prim = "ppermute",
                             .label = label,
                             .make =
                                 [shifted, cycle = cycle, draw = draw](Gen& g) {
                                   return Sample{{{draw(g, Shape{g.axis_size(), g.dim(), 3})}},
                                                 shifted(g.axis_size(), cycle)};
                                 },
                             .axis_name = "batch",
                             .vmap = {.reference = permuted}};
    c.push_back(differentiable ? ps : integers(ps));
  }
  // all_to_all: example i's result at j along concat_axis is example j's x at i along
  // split_axis.
  const Reference exchanged = each([at](const Ts& xs, int64_t i, const Attrs& a) {
    Ts parts;
    for (const Tensor& x : xs) parts.push_back(at(x, a.get_int("split_axis"), i));
    const int64_t concat = a.get_int("concat_axis");
    return stack(parts, concat < 0 ? concat + xs[0].rank() : concat);
  });
  const auto to_all = [](int64_t split, int64_t concat) {
    return Attrs{
        {"axis_name", std::string("batch")}, {"split_axis", split}, {"concat_axis", concat}};
  };
  c.push_back({.prim = "all_to_all",
               .label = "",
               .make =
                   [to_all](Gen& g) {
                     const int64_t n = g.axis_size();
                     return Sample{{{g.normal(Shape{n, 2, n, 3})}}, to_all(1, 0)};
                   },
               .axis_name = "batch",
               .vmap = {.reference = exchanged}});
  c.push_back({.prim = "all_to_all",
               .label = "negative_axes",
               .make =
                   [to_all](Gen& g) {
                     const int64_t n = g.axis_size();
                     return Sample{{{g.normal(Shape{n, g.dim(), n, 2})}}, to_all(-2, -1)};
                   },
               .axis_name = "batch",
               .vmap = {.reference = exchanged}});
  c.push_back(integers({.prim = "all_to_all",
                        .label = "bool_same_axis",
                        .make =
                            [to_all](Gen& g) {
                              const int64_t n = g.axis_size();
                              return Sample{{{g.bernoulli(Shape{n, n, 3})}}, to_all(0, 0)};
                            },
                        .axis_name = "batch",
                        .vmap = {.reference = exchanged}}));
  // psum_scatter: example i gets the sum over examples j of x_j at i along scatter_dimension.
  const Reference scattered = each([at](const Ts& xs, int64_t i, const Attrs& a) {
    Tensor s = at(xs[0], a.get_int("scatter_dimension"), i);
    for (std::size_t j = 1; j < xs.size(); ++j)
      s = s + at(xs[j], a.get_int("scatter_dimension"), i);
    return s;
  });
  const auto scatter = [](int64_t dimension) {
    return Attrs{{"axis_name", std::string("batch")}, {"scatter_dimension", dimension}};
  };
  c.push_back({.prim = "psum_scatter",
               .label = "",
               .make =
                   [scatter](Gen& g) {
                     const int64_t n = g.axis_size();
                     return Sample{{{g.normal(Shape{n, n, g.dim()})}}, scatter(0)};
                   },
               .axis_name = "batch",
               .vmap = {.reference = scattered}});
  c.push_back({.prim = "psum_scatter",
               .label = "negative_dimension",
               .make =
                   [scatter](Gen& g) {
                     const int64_t n = g.axis_size();
                     return Sample{{{g.normal(Shape{n, 2, 3, n})}}, scatter(-1)};
                   },
               .axis_name = "batch",
               .vmap = {.reference = scattered}});
  c.push_back(integers({.prim = "psum_scatter",
                        .label = "int32_middle",
                        .make =
                            [scatter](Gen& g) {
                              const int64_t n = g.axis_size();
                              return Sample{{{ints(g, Shape{n, 2, n})}}, scatter(1)};
                            },
                        .axis_name = "batch",
                        .vmap = {.reference = scattered}}));

  // ---- process-level collectives (src/distributed/collectives.cpp). The walks run as one
  // process, where each is the identity on its rows (or all_to_all's block move) with the
  // same rules as across processes; tests/distributed/ checks them under mpirun ----
  const auto over = [](Attrs a) {
    a.set("over", std::string("dp"));
    return a;
  };
  c.push_back({.prim = "process_all_reduce", .label = "", .make = [over](Gen& g) {
                 return Sample{{{g.normal(Shape{g.dim(), 2})}}, over({{"op", std::string("sum")}})};
               }});
  c.push_back(
      {.prim = "process_all_reduce", .label = "max", .make = [over](Gen& g) {
         return Sample{{{g.distinct(Shape{g.dim(), 2})}}, over({{"op", std::string("max")}})};
       }});
  for (const char* prim : {"process_all_gather", "process_all_gather_start",
                           "process_reduce_scatter", "process_reduce_scatter_start"})
    c.push_back({.prim = prim, .label = "", .make = [over](Gen& g) {
                   return Sample{{{g.normal(Shape{3, g.dim()})}},
                                 over({{"sizes", std::vector<int64_t>{3}}})};
                 }});
  c.push_back({.prim = "process_all_to_all", .label = "", .make = [over](Gen& g) {
                 return Sample{{{g.normal(Shape{3, 3, g.dim()})}},
                               over({{"sizes", std::vector<int64_t>{3}}})};
               }});
  // One process: the group is this process alone, so both transposes are the identity too.
  for (const char* prim : {"process_broadcast", "process_replicated", "process_all_gather_done",
                           "process_reduce_scatter_done"})
    c.push_back({.prim = prim, .label = "", .make = [over](Gen& g) {
                   return Sample{{{g.normal(Shape{g.dim(), 2})}},
                                 over({{"sizes", std::vector<int64_t>{1}}})};
                 }});
  c.push_back({.prim = "process_permute",
               .label = "",
               .make = [over](Gen& g) {  // example 0 receives nothing: zeros
                 return Sample{{{g.normal(Shape{3, g.dim()})}},
                               over({{"sizes", std::vector<int64_t>{3}},
                                     {"perm", std::vector<int64_t>{0, 2, 2, 1}}})};
               }});

  // ---- linear algebra through LAPACK (src/ops/linalg.cpp): well-conditioned matrices, so
  // finite differences are accurate; SPD ones for cholesky ----
  const auto conditioned = [](Gen& g, int64_t n, double diagonal) {
    return g.normal(Shape{n, n}) * 0.3 + eye(n, float64) * diagonal;
  };
  c.push_back({.prim = "cholesky", .label = "", .make = [](Gen& g) {
                 const int64_t n = g.dim(1, 4);
                 const Tensor m = g.normal(Shape{n, n});
                 return Sample{{{matmul(m, swapaxes(m, 0, 1)) + eye(n, float64) * 2.0}}, {}};
               }});
  for (const auto& [label, lower, transpose, unit] :
       {std::tuple{"", true, false, false}, std::tuple{"upper_transposed", false, true, false},
        std::tuple{"lower_unit_transposed", true, true, true}}) {
    c.push_back({.prim = "triangular_solve",
                 .label = label,
                 .make = [=, lower = lower, transpose = transpose, unit = unit](Gen& g) {
                   const int64_t n = g.dim(1, 4);
                   return Sample{
                       {{conditioned(g, n, 2.0)}, {g.normal(Shape{n, g.dim(1, 3)})}},
                       {{"lower", lower}, {"transpose", transpose}, {"unit_diagonal", unit}}};
                 }});
  }
  c.push_back({.prim = "solve", .label = "", .make = [=](Gen& g) {
                 const int64_t n = g.dim(1, 4);
                 return Sample{{{conditioned(g, n, 2.0)}, {g.normal(Shape{n, g.dim(1, 3)})}}, {}};
               }});
  c.push_back({.prim = "solve", .label = "batched", .make = [=](Gen& g) {
                 const Tensor a = stack({conditioned(g, 3, 2.0), conditioned(g, 3, -2.0)});
                 return Sample{{{a}, {g.normal(Shape{2, 3, 2})}}, {}};
               }});
  c.push_back({.prim = "slogdet", .label = "", .make = [=](Gen& g) {
                 return Sample{{{conditioned(g, g.dim(1, 4), 2.0)}}, {}};
               }});
  // Eigenvalues about 1.5 apart: eigenvector derivatives scale with 1 / gap.
  c.push_back({.prim = "eigh", .label = "", .make = [=](Gen& g) {
                 const int64_t n = g.dim(1, 4);
                 std::vector<double> d;
                 for (int64_t i = 0; i < n; ++i) d.push_back(1.5 * static_cast<double>(i));
                 const Tensor m = g.normal(Shape{n, n}) * 0.1;
                 return Sample{{{m + swapaxes(m, 0, 1) + eye(n, float64) * tensor(d)}}, {}};
               }});
  // LU: pivoting stays put under small steps (no ties); "pivoted" makes it swap rows.
  c.push_back({.prim = "lu", .label = "", .make = [=](Gen& g) {
                 return Sample{{{conditioned(g, g.dim(1, 4), 2.0)}}, {}};
               }});
  c.push_back({.prim = "lu", .label = "pivoted", .make = [=](Gen& g) {
                 const Tensor m = conditioned(g, 3, 2.0);
                 return Sample{{{stack({index(m, 2), index(m, 0), index(m, 1)})}}, {}};
               }});
  c.push_back(
      integers({.prim = "lu_pivots_to_permutation", .label = "", .make = [](Gen& g) {
                  return Sample{{{g.indices(Shape{3}, 0, 4, int32)}}, {{"size", int64_t{4}}}};
                }}));
  c.push_back({.prim = "slogdet", .label = "negative_batched", .make = [=](Gen& g) {
                 return Sample{{{stack({conditioned(g, 3, -2.0), conditioned(g, 3, 1.5)})}}, {}};
               }});

  // ---- linear algebra decompositions (src/ops/linalg_decomp.cpp): well-separated, non-zero
  // singular values (derivatives scale with 1 / gap); shapes whose derivatives the rules
  // cover, and the others for the vmap and compiled walks only ----
  const auto separated = [](Gen& g, int64_t m, int64_t n) {
    std::vector<double> d(static_cast<std::size_t>(m * n), 0.0);
    for (int64_t i = 0; i < std::min(m, n); ++i)
      d[static_cast<std::size_t>(i * n + i)] = 1.5 * static_cast<double>(i + 1);
    return g.normal(Shape{m, n}) * 0.1 + tensor(d, Shape{m, n});
  };
  for (const auto& [label, tall, complete] :
       {std::tuple{"", true, false}, std::tuple{"complete_square", false, true}}) {
    c.push_back(
        {.prim = "qr", .label = label, .make = [=, tall = tall, complete = complete](Gen& g) {
           const int64_t n = g.dim(1, 3), m = tall ? n + g.dim(0, 2) : n;
           return Sample{{{separated(g, m, n)}}, {{"complete", complete}}};
         }});
  }
  c.push_back({.prim = "qr",
               .label = "wide_complete",
               .make =
                   [=](Gen& g) {
                     const int64_t m = g.dim(1, 3);
                     return Sample{{{separated(g, m, m + g.dim(1, 2))}}, {{"complete", true}}};
                   },
               .ad = {.check = false}});  // no derivative for m < n (Error)
  for (const auto& [label, tall] : {std::tuple{"", true}, std::tuple{"wide", false}}) {
    c.push_back({.prim = "svd", .label = label, .make = [=, tall = tall](Gen& g) {
                   const int64_t k = g.dim(1, 3), extra = g.dim(0, 2);
                   return Sample{{{tall ? separated(g, k + extra, k) : separated(g, k, k + extra)}},
                                 {{"full_matrices", false}}};
                 }});
  }
  c.push_back({.prim = "svd", .label = "full_square", .make = [=](Gen& g) {
                 const int64_t n = g.dim(1, 3);
                 return Sample{{{separated(g, n, n)}}, {{"full_matrices", true}}};
               }});
  c.push_back({.prim = "svd",
               .label = "full_tall",
               .make =
                   [=](Gen& g) {
                     const int64_t n = g.dim(1, 3);
                     return Sample{{{separated(g, n + g.dim(1, 2), n)}}, {{"full_matrices", true}}};
                   },
               .ad = {.check = false}});  // no derivative with full_matrices for m != n (Error)
  for (const auto& [label, tall] : {std::tuple{"", true}, std::tuple{"wide", false}}) {
    c.push_back({.prim = "pinv", .label = label, .make = [=, tall = tall](Gen& g) {
                   const int64_t k = g.dim(1, 3), extra = g.dim(0, 2);
                   return Sample{{{tall ? separated(g, k + extra, k) : separated(g, k, k + extra)}},
                                 {{"rcond", 1e-10}}};
                 }});
  }
  c.push_back({.prim = "svdvals", .label = "", .make = [=](Gen& g) {
                 const int64_t m = g.dim(1, 4);
                 return Sample{{{separated(g, m, g.dim(1, 4))}}, {}};
               }});

  // ---- user-defined: the example primitive (examples/custom_primitive.h), registered on
  // first use here. |x| stays 0.2 away from delta = 1, where the second derivative jumps.
  const std::string huber = example::huber_primitive().name;
  c.push_back({.prim = huber, .label = "", .make = [](Gen& g) {
                 const Shape s = elementwise_shape(g);
                 return Sample{{{where(g.bernoulli(s), g.uniform(s, -0.8, 0.8),
                                       g.away_from_zero(s, 1.2, 3.0))}},
                               {{"delta", 1.0}}};
               }});
  // The float32 kernel. Finite differences in float32 are too coarse for the AD walk's
  // tolerances; the float64 sample above checks the rules.
  c.push_back({.prim = huber,
               .label = "f32_delta_half",
               .make =
                   [](Gen& g) {
                     return Sample{{{astype(g.normal(Shape{g.dim(), g.dim()}) * 2.0, float32)}},
                                   {{"delta", 0.5}}};
                   },
               .ad = {.check = false}});

  // ---- math (src/ops/math.cpp): domains away from poles, branch points and kinks ----
  {
    const Draw three_normal = [](Gen& g, const Shape& s) { return g.normal(s) * 3.0; };
    const Draw with_inf = [](Gen& g, const Shape& s) {
      return where(g.bernoulli(s), full(Shape{}, INFINITY, float64), g.normal(s));
    };
    // Integer divisors without zeros: |b| in {1, 2}.
    const Draw int_divisor = [](Gen& g, const Shape& s) {
      return astype(g.away_from_zero(s, 1.0, 2.99), int32);
    };
    const Draw small_bools = [](Gen& g, const Shape& s) { return g.bernoulli(s); };
    const Draw shift_counts = [](Gen& g, const Shape& s) { return g.indices(s, -2, 34, int32); };
    c.push_back(unary("trunc", three_normal));
    for (const char* p : {"exp2", "sinh", "cosh", "atan", "asinh"}) c.push_back(unary(p, normal));
    for (const char* p : {"log2", "log10"}) c.push_back(unary(p, uniform_in(0.5, 2.0)));
    for (const char* p : {"asin", "acos", "atanh"}) c.push_back(unary(p, uniform_in(-0.8, 0.8)));
    c.push_back(unary("acosh", uniform_in(1.2, 3.0)));
    c.push_back(unary("erfinv", uniform_in(-0.9, 0.9)));
    c.push_back(unary("erfc", normal));
    c.push_back(unary("lgamma", uniform_in(0.5, 4.0)));
    c.push_back(unary("lgamma", uniform_in(-2.9, -2.1), "negative"));
    c.push_back(unary("digamma", uniform_in(0.5, 4.0)));
    c.push_back(unary("digamma", uniform_in(-1.9, -1.1), "negative"));
    for (int64_t n : {1, 2})
      c.push_back({.prim = "polygamma", .label = "n" + std::to_string(n), .make = [n](Gen& g) {
                     return Sample{{{g.uniform(elementwise_shape(g), 0.5, 4.0)}}, {{"n", n}}};
                   }});
    for (const char* p : {"isinf", "isfinite"}) c.push_back(unary(p, with_inf));
    for (const char* p : {"remainder", "fmod"}) {
      c.push_back(binary(p, three_normal, away(0.5, 2.0)));
      c.push_back(integers(binary(p, ints, int_divisor, "int32")));
    }
    c.push_back(binary("floor_divide", three_normal, away(0.5, 2.0)));
    c.push_back(integers(binary("floor_divide", ints, int_divisor, "int32")));
    for (const char* p : {"atan2", "hypot", "logaddexp"}) c.push_back(binary(p, normal, normal));
    c.push_back(binary("copysign", away(0.2, 1.5), normal));
    for (const char* p : {"bitwise_and", "bitwise_or", "bitwise_xor"}) {
      c.push_back(integers(binary(p, ints, ints)));
      c.push_back(integers(binary(p, small_bools, small_bools, "bool")));
    }
    c.push_back(integers(unary("bitwise_not", ints)));
    c.push_back(integers(unary("bitwise_not", small_bools, "bool")));
    for (const char* p : {"left_shift", "right_shift"})
      c.push_back(integers(binary(p, ints, shift_counts)));
  }
  // ---- sorting, scans and selection (src/ops/sort.cpp) ----
  const auto along = [&](const char* p, int64_t axis, Draw draw, std::string label,
                         Attrs extra = {}) {
    c.push_back({.prim = p, .label = std::move(label), .make = [=](Gen& g) {
                   Attrs a = extra;
                   a.set("axis", axis);
                   return Sample{{{draw(g, elementwise_shape(g))}}, a};
                 }});
  };
  // Distinct values: no ties, so the permutation and finite differences agree.
  along("sort", 1, distinct, "", {{"descending", false}});
  along("sort", -1, distinct, "descending_negative_axis", {{"descending", true}});
  along("cumsum", 1, normal, "");
  along("cumsum", -1, normal, "negative_axis");
  along("cumprod", 2, away(0.5, 1.5), "");
  along("cumprod", -3, away(0.5, 1.5), "negative_axis");
  // Exact where x has zeros (the rules never divide), including second order.
  c.push_back({.prim = "cumprod", .label = "with_zeros", .make = [](Gen& g) {
                 return Sample{{{with_zeros(g)}}, {{"axis", int64_t{1}}}};
               }});
  along("cummax", 1, distinct, "");
  along("cummin", -1, distinct, "negative_axis");
  along("cumlogsumexp", 2, normal, "");
  along("cumlogsumexp", -2, uniform_in(-30.0, 30.0), "wide_range_negative_axis");
  for (const bool right : {false, true})
    c.push_back(
        {.prim = "searchsorted", .label = right ? "right" : "left", .make = [right](Gen& g) {
           // Small integers: values equal to elements of the sequence, where sides differ.
           return Sample{
               {{sort(g.small_ints(Shape{g.dim(2, 6)}))}, {g.small_ints(Shape{g.dim(), 3})}},
               {{"right", right}}};
         }});
  // ---- tensor products and indexing (the rest of the group are compositions) -------------
  // nonzero: zeros mixed in; size above the element count, so that fill rows show.
  c.push_back({.prim = "nonzero", .label = "", .make = [](Gen& g) {
                 const Shape s{3, 4};
                 return Sample{{{where(g.bernoulli(s), g.normal(s), zeros({}, float64))}},
                               {{"size", int64_t{14}}, {"fill", int64_t{-1}}}};
               }});
  // scatter_set/mul/max/min: repeated indices (set keeps the last; the others combine); distinct
  // values so that max/min have no ties for the finite differences.
  for (const char* p : {"scatter_set", "scatter_mul", "scatter_max", "scatter_min"}) {
    c.push_back({.prim = p, .label = "", .make = [](Gen& g) {
                   const int64_t a = g.dim();
                   return Sample{{{g.distinct(Shape{a, 5, 2})},
                                  fixed(tensor(std::vector<int64_t>{4, 0, -1, 1}, Shape{2, 2})),
                                  {g.distinct(Shape{a, 2, 2, 2})}},
                                 {{"axis", int64_t{1}}}};
                 }});
  }
  // ---- convolutions and resampling: conv over 1 and 3 spatial axes; the
  // transposed convolutions are conv_input_grad, resampling composes existing primitives ----
  c.push_back({.prim = "conv", .label = "1d_strided_padded_dilated_grouped", .make = [](Gen& g) {
                 return Sample{{{g.normal(Shape{g.dim(1, 2), 4, 9})}, {g.normal(Shape{6, 2, 3})}},
                               {{"stride", Ints{2}},
                                {"padding", Ints{1}},
                                {"dilation", Ints{2}},
                                {"groups", int64_t{2}}}};
               }});
  const Attrs conv3d{{"stride", Ints{1, 2, 1}},
                     {"padding", Ints{1, 0, 1}},
                     {"dilation", Ints{1, 1, 2}},
                     {"groups", int64_t{2}}};
  // x [1, 4, 3, 4, 5] and w [2, 2, 2, 2, 2] under conv3d give dy [1, 2, 4, 2, 5].
  c.push_back({.prim = "conv", .label = "3d_strided_padded_dilated_grouped", .make = [=](Gen& g) {
                 return Sample{
                     {{g.normal(Shape{g.dim(1, 2), 4, 3, 4, 5})}, {g.normal(Shape{2, 2, 2, 2, 2})}},
                     conv3d};
               }});
  const auto with3 = [=](const char* name, Ints value) {
    Attrs a = conv3d;
    a.set(name, std::move(value));
    return a;
  };
  c.push_back({.prim = "conv_input_grad", .label = "3d", .make = [=](Gen& g) {
                 return Sample{{{g.normal(Shape{1, 2, 4, 2, 5})}, {g.normal(Shape{2, 2, 2, 2, 2})}},
                               with3("input_size", Ints{3, 4, 5})};
               }});
  c.push_back({.prim = "conv_weight_grad", .label = "3d", .make = [=](Gen& g) {
                 return Sample{{{g.normal(Shape{1, 2, 4, 2, 5})}, {g.normal(Shape{1, 4, 3, 4, 5})}},
                               with3("kernel_size", Ints{2, 2, 2})};
               }});
  add_complex_samples(c);
  return c;
}

}  // namespace

const std::vector<PrimitiveSample>& primitive_samples() {
  static const std::vector<PrimitiveSample> table = make_table();
  return table;
}

bool ad_checks(const PrimitiveSample& s) {
  const Primitive* p = find_primitive(s.prim);
  return p && p->differentiable && s.ad.check;
}
bool vmap_checks(const PrimitiveSample& s) {
  const Primitive* p = find_primitive(s.prim);
  return p && p->batch && s.vmap.check;
}
bool compiled_checks(const PrimitiveSample& s) {
  return find_primitive(s.prim) && s.compiled.check;
}
std::vector<PrimitiveSample> ad_samples() {
  std::vector<PrimitiveSample> out;
  std::copy_if(primitive_samples().begin(), primitive_samples().end(), std::back_inserter(out),
               ad_checks);
  return out;
}
std::vector<PrimitiveSample> vmap_samples() {
  std::vector<PrimitiveSample> out;
  std::copy_if(primitive_samples().begin(), primitive_samples().end(), std::back_inserter(out),
               vmap_checks);
  return out;
}

std::vector<PrimitiveSample> compiled_samples() {
  std::vector<PrimitiveSample> out;
  std::copy_if(primitive_samples().begin(), primitive_samples().end(), std::back_inserter(out),
               compiled_checks);
  return out;
}

Ts apply(const PrimitiveSample& s, const Ts& inputs, const Attrs& attrs) {
  return s.body ? s.body(inputs) : kiln::bind(primitive(s.prim), inputs, attrs);
}

bool traces_primitive(const ir::Function& f, const PrimitiveSample& s) {
  const Primitive& p = primitive(s.prim);
  return std::any_of(f.equations.begin(), f.equations.end(),
                     [&](const ir::Equation& e) { return e.prim == &p; });
}

std::vector<std::string> coverage_gaps() {
  std::vector<std::string> gaps;
  std::set<std::string> any, ad, vmap, compiled;
  for (const PrimitiveSample& s : primitive_samples()) {
    if (!find_primitive(s.prim))
      gaps.push_back("sample '" + name_of(s) + "' names no registered primitive");
    any.insert(s.prim);
    if (ad_checks(s)) ad.insert(s.prim);
    if (vmap_checks(s)) vmap.insert(s.prim);
    if (compiled_checks(s)) compiled.insert(s.prim);
  }
  const std::string add = ": add one to the table in tests/primitive_samples.cpp";
  for (const Primitive* p : all_primitives()) {
    if (!any.count(p->name)) gaps.push_back("primitive '" + p->name + "' has no sample" + add);
    if (p->differentiable && !ad.count(p->name))
      gaps.push_back("differentiable primitive '" + p->name + "' has no sample the AD walk checks" +
                     add);
    if (p->batch && !vmap.count(p->name))
      gaps.push_back("primitive '" + p->name +
                     "' has a batching rule but no sample the vmap walk checks" + add);
    if (!compiled.count(p->name))
      gaps.push_back("primitive '" + p->name +
                     "' has no sample the compiled-vs-interpreted walk checks" + add);
  }
  return gaps;
}

}  // namespace kiln::samples
