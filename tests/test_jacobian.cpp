// Jacobians and Hessians of functions of trees, with argnums: each block against float64
// central finite differences or analytic values; forward and reverse mode; under jit and vmap.
#include <gtest/gtest.h>
#include <kiln/kiln.h>

#include <cmath>
#include <functional>

#include "testing.h"

struct Layer {
  kiln::Tensor w, b;
};
KILN_TREE(Layer, w, b);

namespace kiln {
namespace {

using kiln::testing::expect_allclose;

using D = std::vector<double>;

Tensor f64(const D& v, const Shape& s) { return tensor(v, s); }

// d out / d leaf by central differences in float64, laid out out.shape + leaf.shape.
// `eval` maps a perturbed copy of the leaf to the output.
D fd_block(const std::function<Tensor(const Tensor&)>& eval, const Tensor& leaf, double h = 1e-6) {
  const D v = leaf.to_vector<double>();
  std::vector<D> cols;
  for (std::size_t i = 0; i < v.size(); ++i) {
    D p = v, m = v;
    p[i] += h;
    m[i] -= h;
    const D yp = eval(f64(p, leaf.shape())).to_vector<double>();
    const D ym = eval(f64(m, leaf.shape())).to_vector<double>();
    D c(yp.size());
    for (std::size_t k = 0; k < c.size(); ++k) c[k] = (yp[k] - ym[k]) / (2 * h);
    cols.push_back(c);
  }
  D out;
  for (std::size_t k = 0; k < (cols.empty() ? 0 : cols[0].size()); ++k)
    for (const D& c : cols) out.push_back(c[k]);
  return out;
}

Shape cat(const Shape& a, const Shape& b) {
  std::vector<int64_t> d = a.dims();
  d.insert(d.end(), b.begin(), b.end());
  return Shape(d);
}

Tensor layer(const Layer& p, const Tensor& x) { return tanh(matmul(x, p.w) + p.b); }

struct JacobianOfTrees : ::testing::Test {
  Layer p{f64(testing::random_values(6, 1), {3, 2}), f64(testing::random_values(2, 2), {2})};
  Tensor x = f64(testing::random_values(12, 3), {4, 3});
};

TEST_F(JacobianOfTrees, StructArgumentGivesOneBlockPerField) {
  const Shape out{4, 2};
  const D dw = fd_block([&](const Tensor& w) { return layer({w, p.b}, x); }, p.w);
  const D db = fd_block([&](const Tensor& b) { return layer({p.w, b}, x); }, p.b);
  for (const auto& [mode, j] :
       {std::pair{"jacfwd", jacfwd(layer)(p, x)}, std::pair{"jacrev", jacrev(layer)(p, x)}}) {
    expect_allclose(j.w, tensor(dw, cat(out, p.w.shape())), {.rtol = 1e-8, .atol = 1e-8},
                    std::string(mode) + " w");
    expect_allclose(j.b, tensor(db, cat(out, p.b.shape())), {.rtol = 1e-8, .atol = 1e-8},
                    std::string(mode) + " b");
  }
}

TEST_F(JacobianOfTrees, SeveralArgnumsGiveATuple) {
  const Shape out{4, 2};
  const D dx = fd_block([&](const Tensor& xx) { return layer(p, xx); }, x);
  const D db = fd_block([&](const Tensor& b) { return layer({p.w, b}, x); }, p.b);
  const auto fwd = jacfwd(layer, argnums<0, 1>)(p, x);
  const auto rev = jacrev(layer, argnums<0, 1>)(p, x);
  for (const auto& [mode, j] : {std::pair{"jacfwd", fwd}, std::pair{"jacrev", rev}}) {
    expect_allclose(std::get<1>(j), tensor(dx, cat(out, x.shape())), {.rtol = 1e-8, .atol = 1e-8},
                    std::string(mode) + " x");
    expect_allclose(std::get<0>(j).b, tensor(db, cat(out, p.b.shape())),
                    {.rtol = 1e-8, .atol = 1e-8}, std::string(mode) + " b");
  }
  // argnums<1> alone: the Jacobian with respect to x, a plain tensor.
  expect_allclose(jacrev(layer, argnums<1>)(p, x), tensor(dx, cat(out, x.shape())),
                  {.rtol = 1e-8, .atol = 1e-8}, "argnums<1>");
}

TEST_F(JacobianOfTrees, TreeResultsGiveATreeOfArgumentTrees) {
  // A pair result: each element's Jacobian is a Layer.
  auto f = [](const Layer& q, const Tensor& xx) {
    const Tensor y = layer(q, xx);
    return std::make_pair(y, sum(y * y));
  };
  const D dw_y = fd_block([&](const Tensor& w) { return f({w, p.b}, x).first; }, p.w);
  const D db_s = fd_block([&](const Tensor& b) { return f({p.w, b}, x).second; }, p.b);
  for (const auto& [mode, j] :
       {std::pair{"jacfwd", jacfwd(f)(p, x)}, std::pair{"jacrev", jacrev(f)(p, x)}}) {
    expect_allclose(j.first.w, tensor(dw_y, Shape{4, 2, 3, 2}), {.rtol = 1e-8, .atol = 1e-8},
                    std::string(mode) + " y/w");
    expect_allclose(j.second.b, tensor(db_s, Shape{2}), {.rtol = 1e-8, .atol = 1e-8},
                    std::string(mode) + " s/b");
  }
  // A vector of tensors in, a vector out.
  auto g = [](const std::vector<Tensor>& v) { return std::vector<Tensor>{v[0] * v[1], sin(v[0])}; };
  const std::vector<Tensor> v{f64({0.5, -1.0}, {2}), f64({2.0, 3.0}, {2})};
  const auto jg = jacrev(g)(v);
  ASSERT_EQ(jg.size(), 2u);
  expect_allclose(jg[0][1], f64({0.5, 0, 0, -1.0}, Shape{2, 2}), {.rtol = 1e-14, .atol = 1e-14},
                  "d(v0*v1)/dv1");
  expect_allclose(jg[1][0], f64({std::cos(0.5), 0, 0, std::cos(-1.0)}, Shape{2, 2}),
                  {.rtol = 1e-14, .atol = 1e-14}, "d sin(v0)/dv0");
  expect_allclose(jacfwd(g)(v)[0][0], f64({2.0, 0, 0, 3.0}, Shape{2, 2}),
                  {.rtol = 1e-14, .atol = 1e-14}, "jacfwd d(v0*v1)/dv0");
}

TEST_F(JacobianOfTrees, HessianOfAStructIsAMapOfStructs) {
  // L = 0.5 * sum((x w + b)^2): d2L/dw_ij dw_kl = [j==l] sum_n x_ni x_nk,
  // d2L/dw_ij db_l = [j==l] sum_n x_ni, d2L/db_j db_l = [j==l] N.
  auto loss = [](const Layer& q, const Tensor& xx) {
    const Tensor z = matmul(xx, q.w) + q.b;
    return 0.5 * sum(z * z);
  };
  const D xv = x.to_vector<double>();
  auto xx = [&](int i, int k) {
    double s = 0;
    for (int n = 0; n < 4; ++n) s += xv[n * 3 + i] * xv[n * 3 + k];
    return s;
  };
  auto xs = [&](int i) {
    double s = 0;
    for (int n = 0; n < 4; ++n) s += xv[n * 3 + i];
    return s;
  };
  D ww, wb, bw, bb;
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 2; ++j)
      for (int k = 0; k < 3; ++k)
        for (int l = 0; l < 2; ++l) ww.push_back(j == l ? xx(i, k) : 0.0);
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 2; ++j)
      for (int l = 0; l < 2; ++l) wb.push_back(j == l ? xs(i) : 0.0);
  for (int j = 0; j < 2; ++j)
    for (int k = 0; k < 3; ++k)
      for (int l = 0; l < 2; ++l) bw.push_back(j == l ? xs(k) : 0.0);
  for (int j = 0; j < 2; ++j)
    for (int l = 0; l < 2; ++l) bb.push_back(j == l ? 4.0 : 0.0);
  const std::map<std::string, Layer> h = hessian(loss)(p, x);
  ASSERT_EQ(h.size(), 2u);
  expect_allclose(h.at(".w").w, tensor(ww, Shape{3, 2, 3, 2}), {.rtol = 1e-12, .atol = 1e-12},
                  "w,w");
  expect_allclose(h.at(".w").b, tensor(wb, Shape{3, 2, 2}), {.rtol = 1e-12, .atol = 1e-12}, "w,b");
  expect_allclose(h.at(".b").w, tensor(bw, Shape{2, 3, 2}), {.rtol = 1e-12, .atol = 1e-12}, "b,w");
  expect_allclose(h.at(".b").b, tensor(bb, Shape{2, 2}), {.rtol = 1e-12, .atol = 1e-12}, "b,b");
  // Reverse over reverse agrees.
  const auto hr = jacrev(grad(loss))(p, x);
  expect_allclose(hr.at(".w").b, tensor(wb, Shape{3, 2, 2}), {.rtol = 1e-12, .atol = 1e-12},
                  "jacrev(grad) w,b");
}

TEST_F(JacobianOfTrees, ComposesWithJitAndVmap) {
  const Layer eager = jacfwd(layer)(p, x);
  const Layer jitted = jit(jacfwd(layer))(p, x);
  expect_allclose(jitted.w, eager.w, {.rtol = 1e-14, .atol = 1e-14}, "jit(jacfwd) w");
  // Per-example Jacobians with respect to the input row, against a loop.
  auto row = [&](const Tensor& xi) { return layer(p, xi); };
  const Tensor batched = vmap(jacrev(row))(x);
  ASSERT_EQ(batched.shape(), (Shape{4, 2, 3}));
  for (int64_t n = 0; n < 4; ++n) {
    const Tensor one = jacrev(row)(index(x, n));
    expect_allclose(index(batched, n), one, {.rtol = 1e-14, .atol = 1e-14}, "vmap row");
  }
}

TEST(JacobianErrors, IntegerLeavesAndRepeatedArgnums) {
  auto f = [](const Tensor& a, const Tensor& b) { return a * astype(b, float64); };
  const Tensor a = tensor(D{1.0, 2.0}), b = tensor(std::vector<int32_t>{3, 4});
  testing::expect_error([&] { jacfwd(f, argnums<1>)(a, b); }, "jacfwd",
                        {"argument leaf [1]", "i32[2]", "expected a floating dtype"});
  testing::expect_error([&] { jacrev(f, argnums<0, 0>)(a, b); }, "jacrev",
                        {"argnums repeats an argument: got 0 twice"});
}

}  // namespace
}  // namespace kiln
