// Tensor products (einsum, tensordot, outer, kron) and indexing operations (diagonal, diag,
// trace, tril/triu, dynamic_slice, dynamic_update_slice, tile, repeat, roll, meshgrid, pad
// modes): values against numpy (tests/reference/indexing_ref.py, generated at build time) in
// float64 and float32, jit against eager, gradients against central finite differences in
// float64, vmap against a loop, edge cases and errors. All are compositions of primitives, so
// the registry walks cover their rules; these tests cover the compositions.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "kiln/kiln.h"
#include "testing.h"

using namespace kiln;
using kiln::testing::expect_error;

namespace {

using kiln::testing::expect_allclose;

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

const io::TensorFile& refs() {
  static const io::TensorFile f = kiln::testing::reference("indexing");
  return f;
}

std::vector<double> vals(const Tensor& t) { return astype(t, float64).to_vector<double>(); }

std::vector<Tensor> inputs(const std::string& name, int n) {
  std::vector<Tensor> xs;
  for (int i = 0; i < n; ++i)
    xs.push_back(kiln::testing::at(refs(), name + "/in" + std::to_string(i)));
  return xs;
}

std::vector<Tensor> cast_all(const std::vector<Tensor>& xs, DType dt) {
  std::vector<Tensor> out;
  for (const Tensor& x : xs) out.push_back(astype(x, dt));
  return out;
}

// One reference case: numpy's value in float64 and float32, eager and under jit.
void check_case(const std::string& name, int n_inputs, const Fn& f) {
  SCOPED_TRACE(name);
  const std::vector<Tensor> xs = inputs(name, n_inputs);
  const Tensor want = kiln::testing::at(refs(), name + "/out");
  const Tensor got = f(xs);
  EXPECT_EQ(got.dtype(), float64);
  expect_allclose(got, want, {.rtol = 1e-12, .atol = 1e-12}, "f64");
  const Tensor got32 = f(cast_all(xs, float32));
  EXPECT_EQ(got32.dtype(), float32);
  expect_allclose(got32, want, {.rtol = 1e-5, .atol = 1e-5}, "f32");
  auto jf = jit([&](const std::vector<Tensor>& v) { return f(v); });
  expect_allclose(jf(xs), want, {.rtol = 1e-12, .atol = 1e-12}, "jit f64");
}

// d/dx sum(w * f(x)) for a fixed random w, by grad and by central differences, in float64.
void check_grad(const std::vector<Tensor>& xs, const Fn& f, const std::string& what) {
  SCOPED_TRACE(what);
  const Tensor y0 = f(xs);
  const Tensor w = tensor(kiln::testing::random_values(y0.numel(), 7), y0.shape());
  const auto loss = [&](const std::vector<Tensor>& v) { return sum(w * f(v)); };
  const std::vector<Tensor> g = grad(loss)(xs);
  ASSERT_EQ(g.size(), xs.size());
  const double h = 1e-6;
  for (std::size_t k = 0; k < xs.size(); ++k) {
    std::vector<double> v = vals(xs[k]), fd(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) {
      const auto at = [&](double d) {
        std::vector<double> p = v;
        p[i] += d;
        std::vector<Tensor> ys = xs;
        ys[k] = tensor(p, xs[k].shape());
        return loss(ys).item<double>();
      };
      fd[i] = (at(h) - at(-h)) / (2 * h);
    }
    expect_allclose(g[k], tensor(fd, xs[k].shape()), {.rtol = 1e-6, .atol = 1e-6},
                    "input " + std::to_string(k));
  }
}

// vmap over a new leading axis of every input against a loop over the examples.
void check_vmap(const std::vector<Tensor>& xs, const Fn& f, const std::string& what) {
  SCOPED_TRACE(what);
  const int64_t n = 3;
  std::vector<Tensor> batched;
  for (std::size_t k = 0; k < xs.size(); ++k) {
    std::vector<Tensor> copies;
    for (int64_t i = 0; i < n; ++i) copies.push_back(xs[k] * double(i + 1) + double(k));
    batched.push_back(stack(copies));
  }
  const Tensor got = vmap(f)(batched);
  std::vector<Tensor> loop;
  for (int64_t i = 0; i < n; ++i) {
    std::vector<Tensor> ex;
    for (const Tensor& b : batched) ex.push_back(index(b, i));
    loop.push_back(f(ex));
  }
  expect_allclose(got, stack(loop), {.rtol = 1e-12, .atol = 1e-12}, "vmap vs loop");
}

Tensor rand64(const Shape& s, uint32_t seed) {
  return tensor(kiln::testing::random_values(s.numel(), seed), s);
}

Fn einsum_fn(std::string s) {
  return [s](const std::vector<Tensor>& v) { return einsum(s, v); };
}

struct EinsumCase {
  std::string name, subscripts;
  int operands;
};
const std::vector<EinsumCase> kEinsumCases{
    {"einsum_attention", "bhqd,bhkd->bhqk", 2},
    {"einsum_bmm", "bij,bjk->bik", 2},
    {"einsum_diag", "ii->i", 1},
    {"einsum_trace", "ii", 1},
    {"einsum_sum_all", "ij->", 1},
    {"einsum_transpose", "ij->ji", 1},
    {"einsum_dot", "i,i", 2},
    {"einsum_outer", "i,j->ij", 2},
    {"einsum_implicit", "ij,jk", 2},
    {"einsum_case_order", "bA,Ac", 2},
    {"einsum_upper_first", "ab,cA->", 2},
    {"einsum_implicit_upper", "aB,c", 2},
    {"einsum_ellipsis", "...ij,...jk->...ik", 2},
    {"einsum_ellipsis_implicit", "...i,...i", 2},
    {"einsum_broadcast_one", "ij,jk->ik", 2},
    {"einsum_three", "ijk,jl,lk->i", 3},
    {"einsum_four", "abc,cd,de,ea->b", 4},
    {"einsum_repeated_three", "iij->ij", 1},
    {"einsum_repeated_across", "iij,jk->ik", 2},
    {"einsum_batch_kept", "ij,ij->ij", 2},
    {"einsum_mixed", "bik,bkj,j->bi", 3},
    {"einsum_spaces", " ij , jk -> ik ", 2},
    {"einsum_empty_axis", "ij,jk->ik", 2},
    {"einsum_scalar", ",ij->ij", 2},
};

TEST(Einsum, MatchesNumpy) {
  for (const EinsumCase& c : kEinsumCases) check_case(c.name, c.operands, einsum_fn(c.subscripts));
}

TEST(Einsum, GradientsMatchFiniteDifferences) {
  for (const EinsumCase& c : kEinsumCases)
    check_grad(inputs(c.name, c.operands), einsum_fn(c.subscripts), c.name);
}

TEST(Einsum, VmapMatchesLoop) {
  for (const EinsumCase& c : kEinsumCases)
    check_vmap(inputs(c.name, c.operands), einsum_fn(c.subscripts), c.name);
}

TEST(Einsum, UsageFromTheIssue) {
  Tensor q = ones({2, 4, 8, 16}), k = ones({2, 4, 8, 16});
  EXPECT_EQ(einsum("bhqd,bhkd->bhqk", q, k).shape(), Shape({2, 4, 8, 8}));
  EXPECT_EQ(einsum("bhqd,bhkd->bhqk", q, k).to_vector<float>().front(), 16.0f);
}

TEST(Einsum, IntegerAndPromotedDtypes) {
  const Tensor a = tensor({1, 2, 3, 4}, {2, 2}), b = tensor({5, 6, 7, 8}, {2, 2});
  const Tensor c = einsum("ij,jk->ik", a, b);
  EXPECT_EQ(c.dtype(), int32);
  EXPECT_EQ(c.to_vector<int32_t>(), (std::vector<int32_t>{19, 22, 43, 50}));
  const Tensor d = einsum("ij,jk->ik", a, astype(b, float64));
  EXPECT_EQ(d.dtype(), float64);
  EXPECT_EQ(d.to_vector<double>(), (std::vector<double>{19, 22, 43, 50}));
}

TEST(Einsum, PropagatesNonFiniteValues) {
  const double inf = std::numeric_limits<double>::infinity();
  const Tensor a = tensor({inf, 1.0}), b = tensor({1.0, std::nan("")});
  const std::vector<double> o = einsum("i,j->ij", a, b).to_vector<double>();
  EXPECT_EQ(o[0], inf);
  EXPECT_TRUE(std::isnan(o[1]));
  EXPECT_TRUE(std::isnan(einsum("i,i", a, b).item<double>()));
}

TEST(Einsum, InvalidSubscriptsRaise) {
  const Tensor m = ones({2, 3}), v = ones({3});
  const auto bad = [](const std::function<void()>& f, const std::vector<std::string>& parts) {
    expect_error(f, "einsum", parts);
  };
  bad([&] { einsum("ij,j", m); }, {"\"ij,j\"", "2 input terms for 1 operands"});
  bad([&] { einsum("ijk", m); }, {"\"ijk\"", "rank 2", "names 3 axes"});
  bad([&] { einsum("i1", m); }, {"\"i1\"", "'1'"});
  bad([&] { einsum("ij->ii", m); }, {"repeats 'i'"});
  bad([&] { einsum("ij->k", m); }, {"'k' is in no input"});
  bad([&] { einsum("ij,ij", m, ones({3, 2})); }, {"sizes differ", "label 'i'", "2 and 3"});
  bad([&] { einsum("i..j", m); }, {"'.' outside an ellipsis"});
  bad([&] { einsum("...i...", m); }, {"two ellipses"});
  bad([&] { einsum("ij->i->j", m); }, {"two \"->\""});
  bad([&] { einsum("ij-i", m); }, {"'-' or '>'"});
  bad([&] { einsum("i,i", tensor({true}), tensor({true})); }, {"bool"});
  bad([&] { einsum("ij->i,j", m); }, {"',' in the output"});
  bad([&] { einsum("ij", v); }, {"rank 1"});
}

TEST(Einsum, GreedyOrderContractsTheSmallPairFirst) {
  // a [2,100] b [100,100] c [100,50]: the greedy path contracts (a b) first (its first matmul
  // gives [1, 2, 100]); a (b c) would first make [1, 100, 50].
  const Tensor a = rand64({2, 100}, 1), b = rand64({100, 100}, 2), c = rand64({100, 50}, 3);
  expect_allclose(einsum("ij,jk,kl->il", a, b, c), matmul(matmul(a, b), c),
                  {.rtol = 1e-12, .atol = 1e-12}, "chain");
  const ir::Function f =
      kiln::trace([](const Tensor& a, const Tensor& b,
                     const Tensor& c) { return einsum("ij,jk,kl->il", a, b, c); },
                  a, b, c);
  std::vector<Shape> products;
  for (const auto& e : f.equations)
    if (e.prim->name == "matmul") products.push_back(e.outputs.at(0).type.shape);
  ASSERT_EQ(products.size(), 2u);
  EXPECT_EQ(products[0], Shape({1, 2, 100}));
}

TEST(Tensordot, MatchesNumpy) {
  check_case("tensordot_2", 2, [](const std::vector<Tensor>& v) { return tensordot(v[0], v[1]); });
  check_case("tensordot_0", 2,
             [](const std::vector<Tensor>& v) { return tensordot(v[0], v[1], 0); });
  const Fn pairs = [](const std::vector<Tensor>& v) {
    return tensordot(v[0], v[1], {Axes{0, 2}, Axes{2, 1}});
  };
  check_case("tensordot_pairs", 2, pairs);
  check_grad(inputs("tensordot_pairs", 2), pairs, "tensordot grad");
  check_vmap(inputs("tensordot_pairs", 2), pairs, "tensordot vmap");
}

TEST(Tensordot, BadAxesRaise) {
  const Tensor a = ones({2, 3}), b = ones({3, 4});
  expect_error([&] { tensordot(a, b, 3); }, "tensordot", {"axes out of range", "got 3"});
  expect_error(
      [&] {
        tensordot(a, b, {Axes{0}, Axes{0}});
      },
      "tensordot", {"differ in size", "axis 0"});
  expect_error([&] { tensordot(a, b, {Axes{1, 1}, Axes{0, 1}}); }, "tensordot", {"paired twice"});
  expect_error([&] { tensordot(a, b, {Axes{1}, Axes{}}); }, "tensordot", {"differ in length"});
}

TEST(OuterKron, MatchNumpy) {
  const Fn o = [](const std::vector<Tensor>& v) { return outer(v[0], v[1]); };
  const Fn k = [](const std::vector<Tensor>& v) { return kron(v[0], v[1]); };
  check_case("outer", 2, o);
  check_case("kron", 2, k);
  check_case("kron_ranks", 2, k);
  check_grad(inputs("kron", 2), k, "kron grad");
  check_vmap(inputs("kron", 2), k, "kron vmap");
  check_grad(inputs("outer", 2), o, "outer grad");
}

// ---- indexing ----------------------------------------------------------------------------

struct UnaryCase {
  std::string name;
  std::function<Tensor(const Tensor&)> f;
};
std::vector<UnaryCase> unary_cases() {
  std::vector<UnaryCase> c{
      {"diagonal", [](const Tensor& x) { return diagonal(x); }},
      {"diagonal_offset", [](const Tensor& x) { return diagonal(x, 2); }},
      {"diagonal_negative", [](const Tensor& x) { return diagonal(x, -1); }},
      {"diagonal_axes", [](const Tensor& x) { return diagonal(x, 1, 2, 0); }},
      {"diagonal_past", [](const Tensor& x) { return diagonal(x, 7); }},
      {"diag_vector", [](const Tensor& x) { return diag(x); }},
      {"diag_vector_k", [](const Tensor& x) { return diag(x, 2); }},
      {"diag_vector_negative", [](const Tensor& x) { return diag(x, -1); }},
      {"diag_matrix", [](const Tensor& x) { return diag(x, -2); }},
      {"trace", [](const Tensor& x) { return trace(x); }},
      {"trace_offset_axes", [](const Tensor& x) { return trace(x, 1, 1, 2); }},
      {"tile",
       [](const Tensor& x) {
         return tile(x, {2, 3});
       }},
      {"tile_more_reps",
       [](const Tensor& x) {
         return tile(x, {2, 1, 2});
       }},
      {"tile_fewer_reps", [](const Tensor& x) { return tile(x, {2}); }},
      {"tile_zero",
       [](const Tensor& x) {
         return tile(x, {0, 2});
       }},
      {"repeat_axis", [](const Tensor& x) { return repeat(x, 3, 1); }},
      {"repeat_flat", [](const Tensor& x) { return repeat(x, 2); }},
      {"roll", [](const Tensor& x) { return roll(x, 2, 1); }},
      {"roll_negative", [](const Tensor& x) { return roll(x, -7, 0); }},
      {"roll_flat", [](const Tensor& x) { return roll(x, 4); }},
  };
  for (int64_t k : {0, 1, -2, 9, -9}) {
    c.push_back({"tril_" + std::to_string(k), [k](const Tensor& x) { return tril(x, k); }});
    c.push_back({"triu_" + std::to_string(k), [k](const Tensor& x) { return triu(x, k); }});
  }
  const std::pair<const char*, PadMode> modes[] = {
      {"reflect", PadMode::reflect}, {"edge", PadMode::edge}, {"wrap", PadMode::wrap}};
  for (const auto& [name, m] : modes) {
    const std::string n = std::string("pad_") + name;
    c.push_back({n, [m](const Tensor& x) { return pad(x, {{2, 1}, {4, 3}}, m); }});
    c.push_back({n + "_long", [m](const Tensor& x) { return pad(x, {{7, 9}}, m); }});
    c.push_back({n + "_one", [m](const Tensor& x) { return pad(x, {{2, 3}}, m); }});
  }
  return c;
}

Fn unary(const std::function<Tensor(const Tensor&)>& f) {
  return [f](const std::vector<Tensor>& v) { return f(v[0]); };
}

TEST(Indexing, MatchesNumpy) {
  for (const UnaryCase& c : unary_cases()) check_case(c.name, 1, unary(c.f));
}

TEST(Indexing, GradientsMatchFiniteDifferences) {
  for (const UnaryCase& c : unary_cases()) check_grad(inputs(c.name, 1), unary(c.f), c.name);
}

TEST(Indexing, VmapMatchesLoop) {
  for (const UnaryCase& c : unary_cases()) check_vmap(inputs(c.name, 1), unary(c.f), c.name);
}

TEST(Indexing, MeshgridMatchesNumpy) {
  for (const char* ix : {"xy", "ij"}) {
    const std::string name = std::string("meshgrid_") + ix;
    const std::vector<Tensor> xs = inputs(name, 3);
    const std::vector<Tensor> got = meshgrid(xs, ix);
    ASSERT_EQ(got.size(), 3u);
    for (int i = 0; i < 3; ++i)
      expect_allclose(got[std::size_t(i)],
                      kiln::testing::at(refs(), name + "/out" + std::to_string(i)),
                      {.rtol = 0, .atol = 0}, name);
  }
  EXPECT_TRUE(meshgrid({}).empty());
  expect_error([] { meshgrid({ones({2})}, "xz"); }, "meshgrid", {"\"xz\"", "\"xy\" or \"ij\""});
}

TEST(Indexing, DiagonalIsAViewOfTheLastTwoAxes) {
  const Tensor x = rand64({3, 4, 4}, 1);
  const Tensor d = diagonal(x, 0, 1, 2);
  EXPECT_EQ(d.shape(), Shape({3, 4}));
  EXPECT_EQ(d.storage(), x.storage());
}

TEST(Indexing, EdgeCases) {
  // Empty and degenerate shapes.
  EXPECT_EQ(diagonal(zeros({0, 3})).shape(), Shape({0}));
  EXPECT_EQ(diag(zeros({0}), 2).shape(), Shape({2, 2}));
  EXPECT_EQ(trace(zeros({0, 0})).item<float>(), 0.0f);
  EXPECT_EQ(tril(zeros({2, 0, 3})).shape(), Shape({2, 0, 3}));
  EXPECT_EQ(roll(zeros({0, 2}), 3, 0).shape(), Shape({0, 2}));
  EXPECT_EQ(repeat(ones({2}), 0).shape(), Shape({0}));
  EXPECT_EQ(tile(tensor(2.0), {3}).to_vector<double>(), (std::vector<double>{2, 2, 2}));
  EXPECT_EQ(pad(tensor({1.0}), {{1, 2}}, PadMode::constant, 7.0).to_vector<double>(),
            (std::vector<double>{7, 1, 7, 7}));
  // Integer and bool dtypes keep their dtype.
  const Tensor i = tensor({1, 2, 3, 4}, {2, 2});
  EXPECT_EQ(tril(i).to_vector<int32_t>(), (std::vector<int32_t>{1, 0, 3, 4}));
  EXPECT_EQ(trace(i).item<int32_t>(), 5);
  EXPECT_EQ(triu(tensor({true, true, true, true}, {2, 2})).to_vector<bool>(),
            (std::vector<bool>{true, true, false, true}));
  // NaN and -0 pass through exactly (selection, not arithmetic).
  const Tensor s = tensor({-0.0, std::nan(""), 1.0, 2.0}, {2, 2});
  const std::vector<double> d = diag(s).to_vector<double>();
  EXPECT_TRUE(std::signbit(d[0]));
  EXPECT_TRUE(std::signbit(tril(s).to_vector<double>()[0]));
  EXPECT_TRUE(std::isnan(triu(s).to_vector<double>()[1]));
}

TEST(Indexing, BadArgumentsRaise) {
  expect_error([] { diagonal(ones({3})); }, "diagonal", {"rank below 2", "f32[3]"});
  expect_error([] { diagonal(ones({3, 3}), 0, 1, -1); }, "diagonal", {"one axis"});
  expect_error([] { diag(ones({2, 2, 2})); }, "diag", {"rank not 1 or 2"});
  expect_error([] { tril(ones({3})); }, "tril", {"rank below 2"});
  expect_error([] { triu(ones({3})); }, "triu", {"rank below 2"});
  expect_error([] { tile(ones({3}), {-1}); }, "tile", {"negative repeat count"});
  expect_error([] { repeat(ones({3}), -2); }, "repeat", {"negative repeat count", "-2"});
  expect_error([] { roll(ones({3}), 1, 2); }, "roll", {"axis"});
  expect_error([] { pad(ones({0, 2}), {{1, 0}, {0, 0}}, PadMode::edge); }, "pad", {"empty axis 0"});
  expect_error(
      [] {
        pad(ones({2}), {{1, 0}, {0, 0}}, PadMode::wrap);
      },
      "pad", {"wrong number of widths"});
  expect_error([] { pad(ones({2}), {{-1, 0}}, PadMode::reflect); }, "pad", {"negative width"});
  expect_error([] { tile(ones({2}), {int64_t{1} << 62}); }, "tile", {"overflow"});
}

// ---- dynamic slices ----------------------------------------------------------------------

// Starts as int32 scalars (like JAX's).
std::vector<Tensor> starts(std::initializer_list<int> s) {
  std::vector<Tensor> out;
  for (int v : s) out.push_back(tensor(v));
  return out;
}

TEST(DynamicSlice, MatchesStaticSliceAndClampsLikeJax) {
  const Tensor x = reshape(arange(0.0, 20.0, 1.0, float64), Shape{4, 5});
  expect_allclose(dynamic_slice(x, starts({1, 2}), Shape{2, 3}),
                  slice(x, {Slice{1, 3, 1}, Slice{2, 5, 1}}), {.rtol = 0, .atol = 0}, "inside");
  // Starts past the end (or negative) clamp so that the block stays inside x.
  expect_allclose(dynamic_slice(x, starts({9, -3}), Shape{2, 3}),
                  slice(x, {Slice{2, 4, 1}, Slice{0, 3, 1}}), {.rtol = 0, .atol = 0}, "clamped");
  EXPECT_EQ(dynamic_slice(x, starts({1, 1}), Shape{0, 5}).shape(), Shape({0, 5}));
  // Traced starts under jit: one compiled program for every start.
  auto f = jit([](const Tensor& x, const Tensor& i, const Tensor& j) {
    return dynamic_slice(x, {i, j}, Shape{2, 2});
  });
  for (int i = -1; i < 5; ++i)
    expect_allclose(f(x, tensor(i), tensor(i)), dynamic_slice(x, starts({i, i}), Shape{2, 2}),
                    {.rtol = 0, .atol = 0}, "jit start " + std::to_string(i));
}

TEST(DynamicUpdateSlice, MatchesAReferenceAndClamps) {
  const Tensor x = zeros({4, 5}, float64), u = reshape(arange(1.0, 7.0, 1.0, float64), Shape{2, 3});
  const auto ref = [&](int r, int c) {  // written out: u at rows r.., cols c..
    std::vector<double> v(20, 0.0);
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 3; ++j) v[std::size_t((r + i) * 5 + c + j)] = 1 + i * 3 + j;
    return tensor(v, Shape{4, 5});
  };
  expect_allclose(dynamic_update_slice(x, u, starts({1, 1})), ref(1, 1), {.rtol = 0, .atol = 0},
                  "inside");
  expect_allclose(dynamic_update_slice(x, u, starts({7, -2})), ref(2, 0), {.rtol = 0, .atol = 0},
                  "clamped");
  expect_allclose(dynamic_update_slice(x, u, starts({3, 4})), ref(2, 2), {.rtol = 0, .atol = 0},
                  "clamped high");
  // -0 in the update is written as it is.
  const Tensor z = dynamic_update_slice(ones({3}, float64), tensor({-0.0}), starts({1}));
  EXPECT_TRUE(std::signbit(z.to_vector<double>()[1]));
  // The update's dtype is converted to x's.
  EXPECT_EQ(dynamic_update_slice(x, astype(u, float32), starts({0, 0})).dtype(), float64);
  auto f = jit([](const Tensor& x, const Tensor& u, const Tensor& i) {
    return dynamic_update_slice(x, u, {i, i});
  });
  for (int i = -1; i < 5; ++i)
    expect_allclose(f(x, u, tensor(i)), dynamic_update_slice(x, u, starts({i, i})),
                    {.rtol = 0, .atol = 0}, "jit");
}

TEST(DynamicUpdateSlice, ABlockAlongOneAxisMatchesAReference) {
  // An update spanning every axis but one is written as a scatter of its rows (which compiled
  // loops write in place): the same values, clamping, dtypes, derivatives and batching as
  // the select a block along several axes is.
  const Tensor x = reshape(arange(0.0, 20.0, 1.0, float64), Shape{4, 5});
  const Tensor u = reshape(arange(-1.0, -11.0, -1.0, float64), Shape{2, 5});
  const auto ref = [&](int r) {  // written out: u at rows r, r + 1
    std::vector<double> v = vals(x);
    const std::vector<double> w = vals(u);
    for (std::size_t k = 0; k < 10; ++k) v[std::size_t(r) * 5 + k] = w[k];
    return tensor(v, Shape{4, 5});
  };
  for (const auto& [start, row] : std::vector<std::pair<int, int>>{{1, 1}, {-3, 0}, {9, 2}})
    expect_allclose(dynamic_update_slice(x, u, starts({start, 0})), ref(row),
                    {.rtol = 0, .atol = 0}, "start " + std::to_string(start));
  // Along the last axis, in int32 and bool (bool takes the select: scatters are numeric).
  const Tensor xi = zeros({2, 4}, int32), ui = full({2, 1}, 7.0, int32);
  EXPECT_EQ(dynamic_update_slice(xi, ui, starts({0, 2})).to_vector<int32_t>(),
            (std::vector<int32_t>{0, 0, 7, 0, 0, 0, 7, 0}));
  const Tensor xb = zeros({2, 4}, bool_), ub = full({2, 1}, 1.0, bool_);
  EXPECT_EQ(astype(dynamic_update_slice(xb, ub, starts({0, 5})), int32).to_vector<int32_t>(),
            (std::vector<int32_t>{0, 0, 0, 1, 0, 0, 0, 1}));
  auto f = jit([](const Tensor& x, const Tensor& u, const Tensor& i) {
    return dynamic_update_slice(x, u, {i, tensor(int64_t{0})});
  });
  for (int i = -1; i < 5; ++i)
    expect_allclose(f(x, u, tensor(i)), dynamic_update_slice(x, u, starts({i, 0})),
                    {.rtol = 0, .atol = 0}, "jit");
  const Fn dus = [](const std::vector<Tensor>& v) {
    return dynamic_update_slice(v[0], v[1], starts({2, 0}));
  };
  check_grad({rand64({4, 5}, 7), rand64({2, 5}, 8)}, dus, "dynamic_update_slice along rows");
  check_vmap({rand64({4, 5}, 7), rand64({2, 5}, 8)}, dus, "dynamic_update_slice along rows");
  // Batched starts: each example its own rows.
  const Tensor xs = rand64({3, 4, 5}, 9), us = rand64({3, 1, 5}, 10);
  const Tensor got = vmap([](const Tensor& x, const Tensor& u, const Tensor& i) {
    return dynamic_update_slice(x, u, {i, tensor(int64_t{0})});
  })(xs, us, tensor({0, 2, 9}));
  for (int64_t b = 0; b < 3; ++b) {
    const int i = std::vector<int>{0, 2, 9}[std::size_t(b)];
    expect_allclose(index(got, b), dynamic_update_slice(index(xs, b), index(us, b), starts({i, 0})),
                    {.rtol = 0, .atol = 0}, "batched starts");
  }
  // No examples: an empty batch of the example's shape.
  const Tensor none = vmap([](const Tensor& x, const Tensor& u, const Tensor& i) {
    return dynamic_update_slice(x, u, {i, tensor(int64_t{0})});
  })(zeros({0, 4, 5}), zeros({0, 1, 5}), zeros({0}, int64));
  EXPECT_EQ(none.shape(), Shape({0, 4, 5}));
}

TEST(DynamicSlice, GradientsAndVmap) {
  const Tensor x = rand64({4, 5}, 3), u = rand64({2, 3}, 4);
  const Fn ds = [](const std::vector<Tensor>& v) {
    return dynamic_slice(v[0], starts({2, 1}), Shape{2, 3});
  };
  const Fn dus = [](const std::vector<Tensor>& v) {
    return dynamic_update_slice(v[0], v[1], starts({1, 3}));
  };
  check_grad({x}, ds, "dynamic_slice");
  check_grad({x, u}, dus, "dynamic_update_slice");
  check_vmap({x}, ds, "dynamic_slice");
  check_vmap({x, u}, dus, "dynamic_update_slice");
  // Batched start indices: each example its own block.
  const Tensor xs = rand64({3, 4, 5}, 5);
  const Tensor is = tensor({0, 2, 9});
  const Tensor got = vmap([](const Tensor& x, const Tensor& i) {
    return dynamic_slice(x, {i, i}, Shape{2, 2});
  })(xs, is);
  for (int64_t b = 0; b < 3; ++b) {
    const int i = std::vector<int>{0, 2, 9}[std::size_t(b)];
    expect_allclose(index(got, b), dynamic_slice(index(xs, b), starts({i, i}), Shape{2, 2}),
                    {.rtol = 0, .atol = 0}, "batched starts");
  }
}

TEST(DynamicSlice, BadArgumentsRaise) {
  const Tensor x = ones({4, 5});
  expect_error(
      [&] {
        dynamic_slice(x, starts({1}), Shape{2, 2});
      },
      "dynamic_slice", {"wrong number of start indices", "got 1"});
  expect_error(
      [&] {
        dynamic_slice(x, starts({1, 1}), Shape{2});
      },
      "dynamic_slice", {"wrong number of sizes"});
  expect_error(
      [&] {
        dynamic_slice(x, starts({1, 1}), Shape{5, 2});
      },
      "dynamic_slice", {"larger than the operand", "axis 0"});
  expect_error(
      [&] {
        dynamic_slice(x, {tensor(1.5), tensor(1)}, Shape{2, 2});
      },
      "dynamic_slice", {"start index 0 is not an integer scalar", "f64[]"});
  expect_error(
      [&] {
        dynamic_update_slice(x, ones({5, 1}), starts({0, 0}));
      },
      "dynamic_update_slice", {"update does not fit"});
}

// ---- nonzero and bincount ---------------------------------------------------------------

TEST(Nonzero, MatchesNumpyEagerAndJitted) {
  const Tensor x = kiln::testing::at(refs(), "nonzero/in0");
  const Tensor want = kiln::testing::at(refs(), "nonzero/out");
  for (DType dt : {float64, float32})
    EXPECT_EQ(argwhere(astype(x, dt), 10, -1).to_vector<int64_t>(), want.to_vector<int64_t>());
  auto f = jit([](const Tensor& x) { return argwhere(x, 10, -1); });
  EXPECT_EQ(f(x).to_vector<int64_t>(), want.to_vector<int64_t>());
  const std::vector<Tensor> cols = nonzero(x, 10, -1);
  ASSERT_EQ(cols.size(), 2u);
  EXPECT_EQ(cols[0].shape(), Shape({10}));
  EXPECT_EQ(stack(cols, 1).to_vector<int64_t>(), want.to_vector<int64_t>());
}

TEST(Nonzero, DtypesAndEdges) {
  EXPECT_EQ(argwhere(tensor({0, 3, 0, -1}), 3).to_vector<int64_t>(),
            (std::vector<int64_t>{1, 3, 0}));
  EXPECT_EQ(argwhere(tensor({false, true}), 2, 7).to_vector<int64_t>(),
            (std::vector<int64_t>{1, 7}));
  EXPECT_EQ(argwhere(tensor(-0.0), 1).shape(), Shape({1, 0}));
  EXPECT_EQ(argwhere(zeros({0, 3}), 2, 5).to_vector<int64_t>(), (std::vector<int64_t>{5, 5, 5, 5}));
  EXPECT_EQ(argwhere(zeros({4}), 0).shape(), Shape({0, 1}));
}

TEST(Nonzero, SizeTooSmallRaisesEagerlyAndInJit) {
  const Tensor x = tensor({1.0, 0.0, 2.0, 3.0});
  expect_error([&] { argwhere(x, 2); }, "nonzero",
               {"more non-zero elements than size", "got more than 2", "f64[4]"});
  auto f = jit([](const Tensor& x) { return argwhere(x, 2); });
  expect_error([&] { f(x); }, "nonzero", {"more non-zero elements than size"});
  expect_error([&] { argwhere(x, -1); }, "nonzero", {"negative size"});
}

TEST(Nonzero, VmapMatchesLoop) {
  const Tensor xs = where(rand64({3, 4, 2}, 9) > 0.0, rand64({3, 4, 2}, 10), zeros({}, float64));
  const Tensor got = vmap([](const Tensor& x) { return argwhere(x, 8, -1); })(xs);
  for (int64_t b = 0; b < 3; ++b)
    EXPECT_EQ(index(got, b).to_vector<int64_t>(),
              argwhere(index(xs, b), 8, -1).to_vector<int64_t>());
}

TEST(Bincount, MatchesNumpy) {
  const Tensor v = kiln::testing::at(refs(), "bincount/in0");
  const Tensor w = kiln::testing::at(refs(), "bincount/weights");
  const Tensor counts = bincount(v, 5);
  EXPECT_EQ(counts.dtype(), int64);
  EXPECT_EQ(counts.to_vector<int64_t>(),
            kiln::testing::at(refs(), "bincount/out").to_vector<int64_t>());
  EXPECT_EQ(bincount(astype(v, int32), 5).to_vector<int64_t>(), counts.to_vector<int64_t>());
  expect_allclose(bincount(v, 5, w), kiln::testing::at(refs(), "bincount/out_weighted"),
                  {.rtol = 1e-12, .atol = 1e-12}, "weighted");
  auto f = jit([](const Tensor& v, const Tensor& w) { return bincount(v, 5, w); });
  expect_allclose(f(v, w), kiln::testing::at(refs(), "bincount/out_weighted"),
                  {.rtol = 1e-12, .atol = 1e-12}, "jit");
  EXPECT_EQ(bincount(tensor(std::vector<int64_t>{}), 3).to_vector<int64_t>(),
            (std::vector<int64_t>{0, 0, 0}));
  EXPECT_EQ(bincount(v, 0).shape(), Shape({0}));
}

TEST(Bincount, GradientAndVmap) {
  const Tensor v = tensor(std::vector<int64_t>{0, 2, 2, 5, -1, 1});
  const Fn f = [v](const std::vector<Tensor>& a) { return bincount(v, 4, a[0]); };
  check_grad({rand64({6}, 11)}, f, "bincount weights");
  check_vmap({rand64({6}, 12)}, f, "bincount weights");
}

TEST(Bincount, BadArgumentsRaise) {
  expect_error([] { bincount(ones({3}), 2); }, "bincount", {"not a 1-d integer tensor", "f32[3]"});
  expect_error([] { bincount(tensor({1, 2}), -1); }, "bincount", {"negative length"});
  expect_error(
      [] {
        bincount(tensor({1, 2}), 3, ones({3}));
      },
      "bincount", {"weights do not match"});
}

// ---- scatter variants --------------------------------------------------------------------

TEST(Scatter, MatchesNumpyWithRepeatedIndices) {
  const Tensor x = kiln::testing::at(refs(), "scatter/x");
  const Tensor idx = kiln::testing::at(refs(), "scatter/idx");
  const Tensor u = kiln::testing::at(refs(), "scatter/u");
  const std::pair<const char*, ScatterMode> modes[] = {{"set", ScatterMode::set},
                                                       {"add", ScatterMode::add},
                                                       {"mul", ScatterMode::mul},
                                                       {"max", ScatterMode::max},
                                                       {"min", ScatterMode::min}};
  for (const auto& [name, mode] : modes) {
    const Tensor want = kiln::testing::at(refs(), std::string("scatter/") + name);
    expect_allclose(scatter(x, idx, u, 1, mode), want, {.rtol = 0, .atol = 0}, name);
    expect_allclose(scatter(astype(x, float32), idx, u, 1, mode), want,
                    {.rtol = 1e-6, .atol = 1e-6}, name);
    auto f = jit([mode](const Tensor& x, const Tensor& i, const Tensor& u) {
      return scatter(x, i, u, 1, mode);
    });
    expect_allclose(f(x, idx, u), want, {.rtol = 0, .atol = 0}, std::string("jit ") + name);
    const Fn g = [mode, idx](const std::vector<Tensor>& v) {
      return scatter(v[0], idx, v[1], 1, mode);
    };
    check_grad({x, u}, g, name);
    check_vmap({x, u}, g, name);
  }
}

TEST(Scatter, AtHelperAndBroadcastUpdates) {
  const Tensor x = zeros({4}, float64), i = tensor({1, 3});
  EXPECT_EQ(at(x, i).set(tensor(5.0)).to_vector<double>(), (std::vector<double>{0, 5, 0, 5}));
  EXPECT_EQ(at(x, i).add(tensor({1.0, 2.0})).to_vector<double>(),
            (std::vector<double>{0, 1, 0, 2}));
  EXPECT_EQ(at(x, i).max(tensor(-1.0)).to_vector<double>(), (std::vector<double>{0, 0, 0, 0}));
  EXPECT_EQ(at(x, i).min(tensor(-1.0)).to_vector<double>(), (std::vector<double>{0, -1, 0, -1}));
  EXPECT_EQ(at(tensor({7, 8, 9}), tensor({-1})).get().to_vector<int32_t>(),
            (std::vector<int32_t>{9}));
  // Integer scatter; ties in max share the gradient equally.
  EXPECT_EQ(at(tensor({1, 2, 3}), tensor({0, 0})).max(tensor({5, 4})).to_vector<int32_t>(),
            (std::vector<int32_t>{5, 2, 3}));
  const Tensor g = grad([](const Tensor& x) { return sum(at(x, tensor({0})).max(tensor({1.0}))); })(
      tensor({1.0, 2.0}));
  EXPECT_EQ(g.to_vector<double>(), (std::vector<double>{0.5, 1.0}));
  // NaN propagates through max.
  EXPECT_TRUE(std::isnan(at(x, i).max(tensor(std::nan(""))).to_vector<double>()[1]));
}

// The product's derivative for an update is the product of the rest at its position; with
// zeros among them it must not divide by zero. f is multilinear in the updates, so central
// differences are exact up to round-off.
TEST(Scatter, MulGradientsWithZeroUpdates) {
  const Tensor x = tensor({2.0, 3.0, -1.5});
  const Tensor idx = tensor({0, 0, 0, 1, 1, 2});
  const std::vector<Tensor> cases = {tensor({0.5, 4.0, -2.0, 0.0, 3.0, 7.0}),
                                     tensor({0.0, 4.0, -2.0, 0.0, 0.0, 7.0}),
                                     tensor({0.0, 0.0, 0.0, 0.0, 0.0, 0.0})};
  for (const Tensor& u : cases) {
    // numpy.multiply.at, by hand: position 0 gets u0 u1 u2, 1 gets u3 u4, 2 gets u5.
    const std::vector<double> uv = u.to_vector<double>();
    const std::vector<double> want = {2.0 * uv[0] * uv[1] * uv[2], 3.0 * uv[3] * uv[4],
                                      -1.5 * uv[5]};
    EXPECT_EQ(at(x, idx).mul(u).to_vector<double>(), want);
    const Fn f = [idx](const std::vector<Tensor>& v) {
      return at(v[0], idx).mul(v[1]) * tensor({1.0, -2.0, 0.5});
    };
    check_grad({x, u}, f, "mul with zeros");
    const Tensor gu = grad([&](const Tensor& u) { return sum(at(x, idx).mul(u)); })(u);
    const std::vector<double> want_gu = {2.0 * uv[1] * uv[2], 2.0 * uv[0] * uv[2],
                                         2.0 * uv[0] * uv[1], 3.0 * uv[4],
                                         3.0 * uv[3],         -1.5};
    EXPECT_EQ(gu.to_vector<double>(), want_gu);
  }
  // Integer products; overflow wraps as in numpy (2^30 * 2 * 2 = 2^32 = 0 in int32).
  EXPECT_EQ(at(tensor({1, 2, 3}), tensor({2, 2})).mul(tensor({4, 5})).to_vector<int32_t>(),
            (std::vector<int32_t>{1, 2, 60}));
  EXPECT_EQ(at(tensor({1 << 30}), tensor({0, 0})).mul(tensor({2, 2})).to_vector<int32_t>(),
            (std::vector<int32_t>{0}));
}

// Second derivatives through the cofactor where updates are zero: for f(u) = sum_p x_p times
// the product of the updates at p, d2f/du_j du_k (j != k at one position p) is x_p times the
// product of the others there; every other entry is 0.
TEST(Scatter, MulHessianWithZeroUpdates) {
  const Tensor x = tensor({2.0, 3.0, -1.5});
  const std::vector<int64_t> pos = {0, 0, 0, 1, 1, 2};
  const Tensor idx = tensor(pos);
  const std::vector<Tensor> cases = {
      tensor({0.5, 4.0, -2.0, 0.0, 3.0, 7.0}), tensor({0.0, 4.0, -2.0, 0.0, 0.0, 7.0}),
      tensor({0.0, 0.0, 0.0, 0.0, 0.0, 0.0}), tensor({0.0, 0.0, 5.0, 0.0, 2.0, 0.0})};
  const std::vector<double> xv = x.to_vector<double>();
  for (const Tensor& u : cases) {
    const std::vector<double> uv = u.to_vector<double>();
    const auto n = uv.size();
    std::vector<double> want(n * n, 0.0);
    for (std::size_t j = 0; j < n; ++j)
      for (std::size_t k = 0; k < n; ++k) {
        if (j == k || pos[j] != pos[k]) continue;
        double rest = xv[static_cast<std::size_t>(pos[j])];
        for (std::size_t l = 0; l < n; ++l)
          if (l != j && l != k && pos[l] == pos[j]) rest *= uv[l];
        want[j * n + k] = rest;
      }
    const Tensor h = hessian([&](const Tensor& u) { return sum(at(x, idx).mul(u)); })(u);
    EXPECT_EQ(h.to_vector<double>(), want) << u;
  }
  // The report's case: 3 u0 u1 through two updates at one position.
  const auto f = [](const Tensor& u) { return sum(at(tensor({3.0}), tensor({0, 0})).mul(u)); };
  for (const Tensor& u : {tensor({0.0, 2.0}), tensor({0.0, 0.0})})
    EXPECT_EQ(hessian(f)(u).to_vector<double>(), (std::vector<double>{0, 3, 3, 0})) << u;
}

TEST(Scatter, BadArgumentsRaise) {
  const Tensor x = zeros({4});
  expect_error([&] { at(x, tensor({4})).set(tensor(1.0f)); }, "scatter_set",
               {"index out of range", "got 4", "[-4, 3]"});
  expect_error([&] { at(x, tensor({-5})).max(tensor(1.0f)); }, "scatter_max",
               {"index out of range"});
  expect_error([&] { at(x, tensor({0.5})).set(tensor(1.0f)); }, "scatter", {"non-integer indices"});
  expect_error([&] { at(x, tensor({1})).set(ones({3})); }, "broadcast_to", {});
  auto f = jit([](const Tensor& x, const Tensor& i) { return at(x, i).min(tensor(1.0f)); });
  expect_error([&] { f(x, tensor({9})); }, "scatter_min", {"index out of range"});
}

}  // namespace
