// Trees of tensors: flatten/unflatten round trips for every kind of node, leaf order, TreeDef
// equality, text and differences, tree_map over one and several trees, paths and names, and the
// errors for mismatched structures.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <unordered_set>
#include <utility>
#include <vector>

#include "kiln/kiln.h"
#include "kiln/tree.h"
#include "testing.h"

// A user's parameter struct as typically written: in the global namespace.
struct Params {
  kiln::Tensor w, b;
};
KILN_TREE(Params, w, b);

struct Layer {
  kiln::Tensor weight;
  std::optional<kiln::Tensor> bias;
  int64_t width = 0;
};
KILN_TREE(Layer, weight, bias, width);

struct Model {
  std::vector<Layer> layers;
  std::string activation;
  double dropout = 0.0;
};
KILN_TREE(Model, layers, activation, dropout);

// Fields not listed are not part of the tree and come back default-initialised.
struct Partial {
  kiln::Tensor kept;
  int skipped = 7;
};
KILN_TREE(Partial, kept);

namespace user {
enum class Mode { train = 1, eval = 2 };
// A struct inside a namespace: KILN_TREE sits in the same namespace.
struct Sixteen {
  kiln::Tensor f0, f1, f2, f3, f4, f5, f6, f7, f8, f9, f10, f11, f12, f13, f14;
  Mode mode = Mode::train;
};
KILN_TREE(Sixteen, f0, f1, f2, f3, f4, f5, f6, f7, f8, f9, f10, f11, f12, f13, f14, mode);

struct Outer {
  struct Inner {
    kiln::Tensor x;
  };
  Inner inner;
  std::array<kiln::Tensor, 2> pair;
};
KILN_TREE(Outer::Inner, x);
KILN_TREE(Outer, inner, pair);
}  // namespace user

using namespace kiln;

namespace {

using kiln::testing::expect_error;

using F = std::vector<float>;

Tensor vec(std::initializer_list<float> v) { return tensor(v); }

// Same handle (flatten/unflatten never copy tensors), or both undefined.
void expect_same(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.defined(), b.defined());
  EXPECT_EQ(a.impl(), b.impl());
}

template <class T>
T round_trip(const T& x, const std::string& expected_def, std::size_t expected_leaves) {
  auto [leaves, def] = tree_flatten(x);
  EXPECT_EQ(def.to_string(), expected_def);
  EXPECT_EQ(leaves.size(), expected_leaves);
  EXPECT_EQ(def.num_leaves(), expected_leaves);
  return tree_unflatten<T>(def, leaves);
}

TEST(Tree, TensorLeaf) {
  Tensor t = vec({1, 2});
  Tensor back = round_trip(t, "*", 1);
  expect_same(back, t);
  EXPECT_EQ(tree_paths(t), std::vector<std::string>{""});
  EXPECT_EQ(tree_names(t), std::vector<std::string>{""});
}

TEST(Tree, UndefinedTensorIsALeaf) {
  Tensor u;
  auto [leaves, def] = tree_flatten(u);
  ASSERT_EQ(leaves.size(), 1u);
  EXPECT_FALSE(leaves[0].defined());
  EXPECT_EQ(def.to_string(), "*");
  EXPECT_FALSE(tree_unflatten<Tensor>(def, leaves).defined());

  Params p;  // default-constructed struct round-trips
  Params q = round_trip(p, "Params{w: *, b: *}", 2);
  EXPECT_FALSE(q.w.defined());
  EXPECT_FALSE(q.b.defined());
}

TEST(Tree, StaticLeaves) {
  EXPECT_EQ(round_trip(3, "3", 0), 3);
  EXPECT_EQ(round_trip(int64_t{-5000000000}, "-5000000000", 0), -5000000000);
  EXPECT_EQ(round_trip(2.5, "2.5", 0), 2.5);
  EXPECT_EQ(round_trip(3.0, "3.0", 0), 3.0);  // a double never prints like an int
  EXPECT_EQ(round_trip(0.1f, "0.10000000149011612", 0), 0.1f);
  EXPECT_EQ(round_trip(true, "true", 0), true);
  EXPECT_EQ(round_trip(std::string("a\"b"), "\"a\\\"b\"", 0), "a\"b");
  EXPECT_EQ(round_trip(user::Mode::eval, "2", 0), user::Mode::eval);
  EXPECT_EQ(round_trip(std::vector<bool>{true, false}, "[true, false]", 0),
            (std::vector<bool>{true, false}));
  EXPECT_EQ(round_trip(std::vector<unsigned>{1u, 2u}, "[1, 2]", 0),
            (std::vector<unsigned>{1u, 2u}));
}

TEST(Tree, LeavesInFlattenOrder) {
  Tensor w = vec({1}), b = vec({2});
  std::vector<Tensor> leaves =
      tree_leaves(std::make_tuple(Params{w, b}, 3, std::vector<Tensor>{b}));
  ASSERT_EQ(leaves.size(), 3u);
  expect_same(leaves[0], w);
  expect_same(leaves[1], b);
  expect_same(leaves[2], b);
}

TEST(Tree, Vector) {
  Tensor a = vec({1}), b = vec({2}), c = vec({3});
  std::vector<Tensor> v{a, b, c};
  auto back = round_trip(v, "[*, *, *]", 3);
  ASSERT_EQ(back.size(), 3u);
  expect_same(back[0], a);
  expect_same(back[1], b);
  expect_same(back[2], c);
  EXPECT_TRUE(round_trip(std::vector<Tensor>{}, "[]", 0).empty());
  EXPECT_EQ(tree_paths(v), (std::vector<std::string>{"[0]", "[1]", "[2]"}));
  EXPECT_EQ(tree_names(v), (std::vector<std::string>{"0", "1", "2"}));
}

TEST(Tree, Array) {
  Tensor a = vec({1}), b = vec({2});
  std::array<Tensor, 2> arr{a, b};
  auto back = round_trip(arr, "array[*, *]", 2);
  expect_same(back[0], a);
  expect_same(back[1], b);
}

TEST(Tree, MapInKeyOrder) {
  Tensor x = vec({1}), y = vec({2}), z = vec({3});
  std::map<std::string, Tensor> m{{"zeta", z}, {"alpha", x}, {"mid", y}};
  auto [leaves, def] = tree_flatten(m);
  EXPECT_EQ(def.to_string(), "{\"alpha\": *, \"mid\": *, \"zeta\": *}");
  ASSERT_EQ(leaves.size(), 3u);
  expect_same(leaves[0], x);
  expect_same(leaves[1], y);
  expect_same(leaves[2], z);
  auto back = tree_unflatten<std::map<std::string, Tensor>>(def, leaves);
  ASSERT_EQ(back.size(), 3u);
  expect_same(back.at("zeta"), z);
  EXPECT_EQ(tree_paths(m), (std::vector<std::string>{"[\"alpha\"]", "[\"mid\"]", "[\"zeta\"]"}));
  EXPECT_EQ(tree_names(m), (std::vector<std::string>{"alpha", "mid", "zeta"}));
}

TEST(Tree, MapOfTuples) {
  Tensor a = vec({1}), b = vec({2});
  std::map<std::string, std::tuple<Tensor, int, std::string>> m{{"k2", {b, 2, "two"}},
                                                                {"k1", {a, 1, "one"}}};
  auto back = round_trip(m, "{\"k1\": (*, 1, \"one\"), \"k2\": (*, 2, \"two\")}", 2);
  expect_same(std::get<0>(back.at("k1")), a);
  expect_same(std::get<0>(back.at("k2")), b);
  EXPECT_EQ(std::get<1>(back.at("k2")), 2);
  EXPECT_EQ(std::get<2>(back.at("k1")), "one");
}

TEST(Tree, PairWithStaticDouble) {
  Tensor a = vec({1, 2});
  std::pair<Tensor, double> p{a, 0.25};
  auto back = round_trip(p, "(*, 0.25)", 1);
  expect_same(back.first, a);
  EXPECT_EQ(back.second, 0.25);
}

TEST(Tree, Optional) {
  Tensor a = vec({1});
  std::optional<Tensor> set = a, empty;
  auto s = round_trip(set, "optional(*)", 1);
  ASSERT_TRUE(s.has_value());
  expect_same(*s, a);
  EXPECT_FALSE(round_trip(empty, "optional()", 0).has_value());
  EXPECT_EQ(tree_paths(set), std::vector<std::string>{""});  // optional adds no step
}

TEST(Tree, StructWithVectorOfStructs) {
  Tensor w0 = vec({1}), b0 = vec({2}), w1 = vec({3});
  Model m{{Layer{w0, b0, 4}, Layer{w1, std::nullopt, 8}}, "relu", 0.5};
  auto [leaves, def] = tree_flatten(m);
  EXPECT_EQ(def.to_string(),
            "Model{layers: [Layer{weight: *, bias: optional(*), width: 4}, "
            "Layer{weight: *, bias: optional(), width: 8}], activation: \"relu\", dropout: 0.5}");
  // Leaf order: declaration order, depth first.
  ASSERT_EQ(leaves.size(), 3u);
  expect_same(leaves[0], w0);
  expect_same(leaves[1], b0);
  expect_same(leaves[2], w1);

  Model back = tree_unflatten<Model>(def, leaves);
  ASSERT_EQ(back.layers.size(), 2u);
  expect_same(back.layers[0].weight, w0);
  ASSERT_TRUE(back.layers[0].bias.has_value());
  expect_same(*back.layers[0].bias, b0);
  EXPECT_EQ(back.layers[0].width, 4);
  expect_same(back.layers[1].weight, w1);
  EXPECT_FALSE(back.layers[1].bias.has_value());
  EXPECT_EQ(back.layers[1].width, 8);
  EXPECT_EQ(back.activation, "relu");
  EXPECT_EQ(back.dropout, 0.5);

  EXPECT_EQ(tree_paths(m), (std::vector<std::string>{".layers[0].weight", ".layers[0].bias",
                                                     ".layers[1].weight"}));
  EXPECT_EQ(tree_names(m),
            (std::vector<std::string>{"layers.0.weight", "layers.0.bias", "layers.1.weight"}));
}

TEST(Tree, NamesInFeaturesStyle) {
  std::map<std::string, std::vector<Layer>> net{{"features", {Layer{vec({1}), {}, 1}}},
                                                {"head", {Layer{vec({2}), vec({3}), 1}}}};
  EXPECT_EQ(tree_names(net),
            (std::vector<std::string>{"features.0.weight", "head.0.weight", "head.0.bias"}));
  EXPECT_EQ(tree_paths(net),
            (std::vector<std::string>{"[\"features\"][0].weight", "[\"head\"][0].weight",
                                      "[\"head\"][0].bias"}));
}

TEST(Tree, UnlistedFieldsKeepDefaults) {
  Partial p{vec({1}), 99};
  auto [leaves, def] = tree_flatten(p);
  EXPECT_EQ(def.to_string(), "Partial{kept: *}");
  Partial back = tree_unflatten<Partial>(def, leaves);
  expect_same(back.kept, p.kept);
  EXPECT_EQ(back.skipped, 7);
}

TEST(Tree, SixteenFieldsInANamespace) {
  user::Sixteen s;
  s.f0 = vec({0});
  s.f14 = vec({14});
  s.mode = user::Mode::eval;
  auto [leaves, def] = tree_flatten(s);
  EXPECT_EQ(leaves.size(), 15u);
  EXPECT_EQ(def.names.size(), 16u);
  EXPECT_EQ(def.names.back(), "mode");
  expect_same(leaves[0], s.f0);
  expect_same(leaves[14], s.f14);
  user::Sixteen back = tree_unflatten<user::Sixteen>(def, leaves);
  expect_same(back.f14, s.f14);
  EXPECT_FALSE(back.f7.defined());
  EXPECT_EQ(back.mode, user::Mode::eval);
  EXPECT_EQ(tree_names(s)[14], "f14");
}

TEST(Tree, NestedClassRegisteredAtNamespaceScope) {
  user::Outer o{{vec({1})}, {vec({2}), vec({3})}};
  auto [leaves, def] = tree_flatten(o);
  EXPECT_EQ(def.to_string(), "Outer{inner: Outer::Inner{x: *}, pair: array[*, *]}");
  auto back = tree_unflatten<user::Outer>(def, leaves);
  expect_same(back.inner.x, o.inner.x);
  expect_same(back.pair[1], o.pair[1]);
  EXPECT_EQ(tree_paths(o), (std::vector<std::string>{".inner.x", ".pair[0]", ".pair[1]"}));
}

TEST(Tree, NestedStandardContainers) {
  using T =
      std::vector<std::pair<std::optional<Tensor>, std::array<std::map<std::string, Tensor>, 1>>>;
  Tensor a = vec({1}), b = vec({2});
  T t{{a, {{{{"k", b}}}}}, {std::nullopt, {{{}}}}};
  auto back = round_trip(t, "[(optional(*), array[{\"k\": *}]), (optional(), array[{}])]", 2);
  ASSERT_EQ(back.size(), 2u);
  expect_same(*back[0].first, a);
  expect_same(back[0].second[0].at("k"), b);
  EXPECT_FALSE(back[1].first.has_value());
  EXPECT_TRUE(back[1].second[0].empty());
}

TEST(TreeDef, EqualityAndHash) {
  Tensor a = vec({1}), b = vec({1, 2, 3});
  auto def = [](const auto& x) { return tree_structure(x); };
  // Tensor types are not part of the structure.
  EXPECT_EQ(def(std::pair<Tensor, int>{a, 3}), def(std::pair<Tensor, int>{b, 3}));
  EXPECT_EQ(def(std::pair<Tensor, int>{a, 3}).hash(), def(std::pair<Tensor, int>{b, 3}).hash());
  EXPECT_EQ(def(Params{a, b}), def(Params{b, Tensor{}}));
  // A static value changes it.
  EXPECT_NE(def(std::pair<Tensor, int>{a, 3}), def(std::pair<Tensor, int>{a, 4}));
  EXPECT_NE(def(std::pair<Tensor, double>{a, 0.0}), def(std::pair<Tensor, double>{a, -0.0}));
  EXPECT_NE(def(std::pair<Tensor, std::string>{a, "x"}),
            def(std::pair<Tensor, std::string>{a, "y"}));
  EXPECT_NE(def(1), def(1.0));
  EXPECT_NE(def(1), def(true));
  // A container size changes it.
  EXPECT_NE(def(std::vector<Tensor>{a, a}), def(std::vector<Tensor>{a, a, a}));
  EXPECT_NE(def(std::optional<Tensor>{a}), def(std::optional<Tensor>{}));
  // The kind of node changes it, even with the same leaves.
  EXPECT_NE(def(std::vector<Tensor>{a, a}), def(std::array<Tensor, 2>{a, a}));
  EXPECT_NE(def(std::vector<Tensor>{a, a}), def(std::tuple<Tensor, Tensor>{a, a}));
  EXPECT_NE(def(std::map<std::string, Tensor>{{"a", a}}),
            def(std::map<std::string, Tensor>{{"b", a}}));
  EXPECT_NE(def(std::optional<Tensor>{a}), def(a));
  // NaN static values still compare equal to themselves (jit cache hits).
  const double nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_EQ(def(nan), def(nan));
  EXPECT_EQ(def(nan).hash(), def(nan).hash());

  std::unordered_set<TreeDef> seen;
  seen.insert(def(std::pair<Tensor, int>{a, 3}));
  seen.insert(def(std::pair<Tensor, int>{b, 3}));
  seen.insert(def(std::pair<Tensor, int>{a, 4}));
  EXPECT_EQ(seen.size(), 2u);
}

TEST(TreeDef, PrintsItsCanonicalString) {
  std::ostringstream os;
  os << tree_structure(Params{});
  EXPECT_EQ(os.str(), "Params{w: *, b: *}");
}

TEST(TreeDef, FirstDifference) {
  Tensor a = vec({1});
  auto def = [](const auto& x) { return tree_structure(x); };
  EXPECT_EQ(first_difference(def(Params{a, a}), def(Params{})), std::nullopt);
  EXPECT_EQ(first_difference(def(Layer{a, a, 3}), def(Layer{a, a, 4})),
            ".width: static value 3 vs 4");
  Model two{{Layer{}, Layer{}}, "relu", 0.0}, three{{Layer{}, Layer{}, Layer{}}, "relu", 0.0};
  EXPECT_EQ(first_difference(def(two), def(three)), ".layers: vector of 2 vs 3 children");
  Model m1{{Layer{a, a, 1}}, "relu", 0.0}, m2{{Layer{a, std::nullopt, 1}}, "relu", 0.0};
  EXPECT_EQ(first_difference(def(m1), def(m2)),
            ".layers[0].bias: optional with a value vs empty optional");
  EXPECT_EQ(first_difference(def(std::map<std::string, Tensor>{{"a", a}, {"b", a}}),
                             def(std::map<std::string, Tensor>{{"a", a}, {"c", a}})),
            "(root): map keys [\"a\", \"b\"] vs [\"a\", \"c\"]");
  EXPECT_EQ(first_difference(def(std::map<std::string, std::pair<Tensor, int>>{{"k", {a, 1}}}),
                             def(std::map<std::string, std::pair<Tensor, int>>{{"k", {a, 2}}})),
            "[\"k\"][1]: static value 1 vs 2");
  EXPECT_EQ(first_difference(def(a), def(2.0)), "(root): tensor vs static value 2.0");
  EXPECT_EQ(first_difference(def(Params{}), def(Partial{})),
            "(root): struct Params vs struct Partial");
}

TEST(TreeMap, OneTree) {
  // tree_map over a KILN_TREE struct, as a user writes it.
  Params p{ones({3, 2}), zeros({2})};
  auto doubled = tree_map([](const Tensor& t) { return t * 2.0; }, p);  // Params
  static_assert(std::is_same_v<decltype(doubled), Params>);
  EXPECT_EQ(doubled.w.shape(), (Shape{3, 2}));
  EXPECT_EQ(doubled.w.to_vector<float>(), F(6, 2.0f));
  EXPECT_EQ(doubled.b.to_vector<float>(), F(2, 0.0f));
  EXPECT_EQ(p.w.to_vector<float>(), F(6, 1.0f));  // the input is untouched
}

TEST(TreeMap, TwoTreesSgdStep) {
  Params w{tensor({1.0f, 2.0f}), tensor({3.0f})};
  Params g{tensor({10.0f, -10.0f}), tensor({1.0f})};
  Params next = tree_map([](const Tensor& p, const Tensor& d) { return p - 0.1 * d; }, w, g);
  EXPECT_EQ(next.w.to_vector<float>(), (F{0.0f, 3.0f}));
  EXPECT_FLOAT_EQ(next.b.item<float>(), 2.9f);
}

TEST(TreeMap, KeepsStaticLeavesAndUndefinedLeaves) {
  Model m{{Layer{tensor({1.0f}), std::nullopt, 5}}, "tanh", 0.1};
  int calls = 0;
  Model out = tree_map(
      [&](const Tensor& t) {
        ++calls;
        return t + 1.0;
      },
      m);
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(out.layers[0].weight.to_vector<float>(), F{2.0f});
  EXPECT_EQ(out.layers[0].width, 5);
  EXPECT_EQ(out.activation, "tanh");
  EXPECT_EQ(out.dropout, 0.1);

  // An undefined leaf in every tree passes through without calling f.
  Params a{tensor({1.0f}), Tensor{}}, b{tensor({2.0f}), Tensor{}};
  calls = 0;
  Params sum = tree_map(
      [&](const Tensor& x, const Tensor& y) {
        ++calls;
        return x + y;
      },
      a, b);
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(sum.w.to_vector<float>(), F{3.0f});
  EXPECT_FALSE(sum.b.defined());
}

TEST(TreeMap, ThreeTreesOfAStandardContainer) {
  std::vector<Tensor> x{tensor({1.0f}), tensor({2.0f})}, y{tensor({10.0f}), tensor({20.0f})},
      z{tensor({100.0f}), tensor({200.0f})};
  auto r = tree_map([](const Tensor& a, const Tensor& b, const Tensor& c) { return a + b + c; }, x,
                    y, z);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[1].to_vector<float>(), F{222.0f});
}

TEST(TreeMap, MismatchedStructuresNameThePath) {
  auto add = [](const Tensor& x, const Tensor& y) { return x + y; };
  Tensor a = tensor({1.0f});
  Model two{{Layer{a, a, 1}, Layer{a, a, 1}}, "relu", 0.0};
  Model three{{Layer{a, a, 1}, Layer{a, a, 1}, Layer{a, a, 1}}, "relu", 0.0};
  expect_error([&] { tree_map(add, two, three); }, "tree_map",
               {"structures differ at .layers: got vector of 3 children in tree 2, "
                "expected vector of 2 children as in tree 1"});
  Model other_width{{Layer{a, a, 1}, Layer{a, a, 2}}, "relu", 0.0};
  expect_error([&] { tree_map(add, two, other_width); }, "tree_map",
               {"at .layers[1].width: got static value 2 in tree 2, expected static value 1"});
  expect_error(
      [&] {
        tree_map(add, Params{a, a}, std::map<std::string, Tensor>{{"w", a}, {"b", a}});
      },
      "tree_map",
      {"at (root): got map with keys [\"b\", \"w\"] in tree 2, expected struct Params "
       "with fields (w, b)"});
  std::map<std::string, Tensor> m1{{"x", a}}, m2{{"y", a}};
  expect_error([&] { tree_map(add, m1, m2); }, "tree_map",
               {"got map with keys [\"y\"] in tree 2, expected map with keys [\"x\"]"});
  Layer with_bias{a, a, 1}, without{a, std::nullopt, 1};
  expect_error([&] { tree_map(add, with_bias, without); }, "tree_map",
               {"at .bias: got empty optional in tree 2, expected optional with a value"});
  // The third tree is named as such.
  expect_error(
      [&] {
        tree_map([](const Tensor& x, const Tensor&, const Tensor&) { return x; },
                 std::vector<Tensor>{a}, std::vector<Tensor>{a}, std::vector<Tensor>{a, a});
      },
      "tree_map", {"at (root): got vector of 2 children in tree 3"});
}

TEST(TreeUnflatten, WrongLeafCount) {
  auto [leaves, def] = tree_flatten(Params{tensor({1.0f}), tensor({2.0f})});
  leaves.pop_back();
  expect_error([&, def = def, leaves = leaves] { tree_unflatten<Params>(def, leaves); },
               "tree_unflatten",
               {"wrong number of leaves for Params{w: *, b: *}: got 1, expected 2"});
}

TEST(TreeUnflatten, StructureDoesNotMatchTheType) {
  Tensor a = tensor({1.0f});
  const TreeDef model = tree_structure(Model{{Layer{a, a, 1}}, "relu", 0.0});
  std::vector<Tensor> two{a, a};
  expect_error([&] { tree_unflatten<Params>(model, two); }, "tree_unflatten",
               {"structure does not match the type at (root): got struct Model with fields "
                "(layers, activation, dropout), expected struct Params with fields (w, b)"});
  expect_error(
      [&] {
        tree_unflatten<std::vector<Tensor>>(tree_structure(std::array<Tensor, 2>{a, a}), two);
      },
      "tree_unflatten", {"at (root): got array of 2 children, expected vector"});
  expect_error(
      [&] {
        tree_unflatten<std::array<Tensor, 3>>(tree_structure(std::array<Tensor, 2>{a, a}), two);
      },
      "tree_unflatten", {"got array of 2 children, expected array of 3 children"});
  // A static value of the wrong type, deep inside.
  using Wrong = std::vector<std::pair<Tensor, double>>;
  const TreeDef ints = tree_structure(std::vector<std::pair<Tensor, int>>{{a, 1}, {a, 2}});
  expect_error([&] { tree_unflatten<Wrong>(ints, two); }, "tree_unflatten",
               {"at [0][1]: got static value 1, expected static floating-point value"});
  expect_error(
      [&] {
        tree_unflatten<std::map<std::string, Tensor>>(
            tree_structure(std::map<std::string, int>{{"k", 1}}), {});
      },
      "tree_unflatten", {"at [\"k\"]: got static value 1, expected tensor"});
  expect_error(
      [&] {
        tree_unflatten<Layer>(tree_structure(Layer{a, a, 1}), std::vector<Tensor>{a});
      },
      "tree_unflatten", {"wrong number of leaves"});
}

TEST(TreeUnflatten, HandBuiltTreeDef) {
  // jit builds TreeDefs of outputs itself; a hand-built one rebuilds the same value.
  TreeDef def;
  def.kind = TreeDef::Kind::vector;
  def.children.resize(2);  // two tensor leaves
  Tensor a = tensor({1.0f}), b = tensor({2.0f});
  auto v = tree_unflatten<std::vector<Tensor>>(def, std::vector<Tensor>{a, b});
  ASSERT_EQ(v.size(), 2u);
  expect_same(v[1], b);
  EXPECT_EQ(def, tree_structure(v));
}

// ---- tree_reduce, tree_sum, tree_dot, tree_norm ------------------------------------------

// The values of all leaves, in flatten order, for the independent references below.
std::vector<double> all_values(const std::vector<Tensor>& leaves) {
  std::vector<double> out;
  for (const Tensor& t : leaves)
    if (t.defined())
      for (double v : t.to_vector<double>()) out.push_back(v);
  return out;
}

double p_norm(const std::vector<double>& v, double ord) {
  double acc = 0;
  for (double x : v)
    acc = std::isinf(ord) ? std::max(acc, std::abs(x)) : acc + std::pow(std::abs(x), ord);
  return std::isinf(ord) ? acc : std::pow(acc, 1.0 / ord);
}

Model reduction_model() {
  const auto w = kiln::testing::random_values(6, 1), b = kiln::testing::random_values(3, 2),
             v = kiln::testing::random_values(4, 3);
  return Model{{Layer{tensor(w, Shape{2, 3}), tensor(b, Shape{3}), 3},
                Layer{tensor(v, Shape{4}), std::nullopt, 4}},
               "relu",
               0.5};
}

TEST(TreeReduce, FoldsOverDefinedLeavesInFlattenOrder) {
  Model m = reduction_model();
  m.layers[1].weight = Tensor();  // undefined: skipped
  const std::string order =
      tree_reduce([](std::string acc, const Tensor& t) { return acc + t.type().to_string() + ";"; },
                  m, std::string());
  EXPECT_EQ(order, "f64[2,3];f64[3];");
  EXPECT_EQ(tree_reduce([](int64_t n, const Tensor& t) { return n + t.numel(); }, reduction_model(),
                        int64_t{0}),
            13);
  // A Tensor accumulator: the sum of the leaves' maxima.
  const Tensor top =
      tree_reduce([](Tensor acc, const Tensor& t) { return acc + max(t); },
                  std::vector<Tensor>{tensor({1.0, 5.0}), tensor({-2.0})}, tensor(0.0));
  EXPECT_EQ(top.item<double>(), 3.0);
}

TEST(TreeSum, MatchesTheSumOfAllValues) {
  const Model m = reduction_model();
  const std::vector<double> v = all_values(tree_leaves(m));
  double want = 0;
  for (double x : v) want += x;
  const Tensor got = tree_sum(m);
  EXPECT_EQ(got.type(), (TensorType{float64, Shape{}}));
  EXPECT_NEAR(got.item<double>(), want, 1e-12);
  // Leaves of several dtypes promote; a tree without leaves sums to 0.f.
  const Tensor mixed = tree_sum(std::make_tuple(tensor({1.5f, 2.0f}), tensor({int64_t{3}}), 7));
  EXPECT_EQ(mixed.dtype(), float32);
  EXPECT_EQ(mixed.item<float>(), 6.5f);
  const Tensor empty = tree_sum(std::vector<Tensor>{});
  EXPECT_EQ(empty.type(), (TensorType{float32, Shape{}}));
  EXPECT_EQ(empty.item<float>(), 0.0f);
  EXPECT_EQ(tree_sum(std::vector<Tensor>{zeros(Shape{0, 3})}).item<float>(), 0.0f);
}

TEST(TreeDot, MatchesTheInnerProductAndChecksStructure) {
  const Model a = reduction_model();
  const Model b = tree_map([](const Tensor& t) { return t * 2.0 - 0.25; }, a);
  const std::vector<double> va = all_values(tree_leaves(a)), vb = all_values(tree_leaves(b));
  double want = 0;
  for (std::size_t i = 0; i < va.size(); ++i) want += va[i] * vb[i];
  EXPECT_NEAR(tree_dot(a, b).item<double>(), want, 1e-12);
  Model c = a;
  c.layers.pop_back();
  expect_error([&] { (void)tree_dot(a, c); }, "tree_dot", {".layers", "vector of 1 children"});
}

TEST(TreeNorm, MatchesManualNormsForEachOrd) {
  const Model m = reduction_model();
  const std::vector<double> v = all_values(tree_leaves(m));
  for (double ord : {2.0, 1.0, 3.0, 0.5, double(INFINITY)}) {
    const Tensor got = tree_norm(m, ord);
    EXPECT_EQ(got.type(), (TensorType{float64, Shape{}})) << ord;
    EXPECT_NEAR(got.item<double>(), p_norm(v, ord), 1e-12) << ord;
  }
  // float32 leaves: the norm of the float32 values, in float32.
  const Tensor f = tensor({3.0f, -4.0f});
  EXPECT_EQ(tree_norm(std::vector<Tensor>{f, tensor({12.0f})}).item<float>(), 13.0f);
  // Integer leaves count as float32; an empty tree has norm 0.
  const Tensor i = tree_norm(std::vector<Tensor>{tensor({int64_t{3}, int64_t{-4}})});
  EXPECT_EQ(i.dtype(), float32);
  EXPECT_EQ(i.item<float>(), 5.0f);
  EXPECT_EQ(tree_norm(std::vector<Tensor>{}, INFINITY).item<float>(), 0.0f);
  EXPECT_EQ(tree_norm(std::vector<Tensor>{zeros(Shape{0})}, INFINITY).item<float>(), 0.0f);
  for (double bad : {0.0, -1.0, double(NAN)})
    expect_error([&] { (void)tree_norm(m, bad); }, "tree_norm", {"invalid ord", "expected"});
}

TEST(TreeNorm, GradMatchesFiniteDifferences) {
  const Tensor w = tensor(kiln::testing::random_values(6, 4), Shape{2, 3});
  const Tensor b = tensor(kiln::testing::random_values(3, 5), Shape{3});
  for (double ord : {2.0, 3.0, 1.0}) {
    const auto f = [ord](const Params& p) { return tree_norm(p, ord); };
    const Params g = grad(f)(Params{w, b});
    const double h = 1e-6;
    for (Tensor Params::*field : {&Params::w, &Params::b}) {
      const Tensor x = Params{w, b}.*field;
      const std::vector<double> got = (g.*field).to_vector<double>();
      std::vector<double> xs = x.to_vector<double>();
      for (std::size_t k = 0; k < xs.size(); ++k) {
        auto at = [&](double delta) {
          std::vector<double> moved = xs;
          moved[k] += delta;
          Params p{w, b};
          p.*field = tensor(moved, x.shape());
          return f(p).item<double>();
        };
        EXPECT_NEAR(got[k], (at(h) - at(-h)) / (2 * h), 1e-6) << "ord " << ord << " k " << k;
      }
    }
  }
  // At an all-zero tree the gradient is 0, not NaN.
  const Params zero = grad([](const Params& p) { return tree_norm(p); })(
      Params{zeros(Shape{2}, float64), zeros(Shape{1}, float64)});
  EXPECT_EQ(zero.w.to_vector<double>(), (std::vector<double>{0, 0}));
  EXPECT_EQ(zero.b.to_vector<double>(), (std::vector<double>{0}));
}

TEST(TreeNorm, PerExampleNormsUnderVmapAndJitMatchALoop) {
  // A batch of 5 examples' gradients: w [5, 2, 3], b [5, 3].
  const Params batch{tensor(kiln::testing::random_values(30, 6), Shape{5, 2, 3}),
                     tensor(kiln::testing::random_values(15, 7), Shape{5, 3})};
  const auto norm = [](const Params& p) { return tree_norm(p); };
  const Tensor eager = vmap(norm)(batch);
  const Tensor compiled = jit(vmap(norm))(batch);
  ASSERT_EQ(eager.shape(), (Shape{5}));
  for (int64_t i = 0; i < 5; ++i) {
    const double want = p_norm(all_values({index(batch.w, i), index(batch.b, i)}), 2.0);
    EXPECT_NEAR(eager.to_vector<double>()[static_cast<std::size_t>(i)], want, 1e-12);
    EXPECT_NEAR(compiled.to_vector<double>()[static_cast<std::size_t>(i)], want, 1e-12);
  }
  // tree_sum and tree_dot batch too.
  const Tensor dots = vmap([](const Params& p) { return tree_dot(p, p); })(batch);
  EXPECT_NEAR(dots.to_vector<double>()[2], std::pow(eager.to_vector<double>()[2], 2), 1e-12);
  const Tensor sums = jit(vmap([](const Params& p) { return tree_sum(p); }))(batch);
  EXPECT_NEAR(sums.to_vector<double>()[4],
              sum(index(batch.w, 4)).item<double>() + sum(index(batch.b, 4)).item<double>(), 1e-12);
}

TEST(TreeNorm, GlobalGradientNormForClipping) {
  // The DP-SGD / clipping use: the norm of a gradient tree, without a loop over leaves.
  const Params p{tensor({1.0, 2.0}), tensor({3.0})};
  const auto loss = [](const Params& q) { return sum(q.w * q.w) + sum(q.b); };
  const Params g = grad(loss)(p);  // w: 2w = [2, 4], b: [1]
  EXPECT_NEAR(tree_norm(g).item<double>(), std::sqrt(4.0 + 16.0 + 1.0), 1e-12);
  const Tensor scale = minimum(tensor(1.0), 1.0 / tree_norm(g));
  const Params clipped = tree_map([&](const Tensor& t) { return t * scale; }, g);
  EXPECT_NEAR(tree_norm(clipped).item<double>(), 1.0, 1e-12);
}

}  // namespace
