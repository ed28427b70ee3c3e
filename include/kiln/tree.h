// Trees of tensors: the values that jit, grad and vmap take and return.
//
// A tree is a Tensor, a static leaf (arithmetic, enum or std::string: not traced, but part of the
// structure, so jit specialises on its value), or a container of trees: std::vector, std::array,
// std::map<std::string, T>, std::tuple, std::pair, std::optional, or a struct registered with
// KILN_TREE. tree_flatten splits a tree into its Tensor leaves and a TreeDef (the structure plus
// the static values); tree_unflatten puts them back together. See docs/TREES.md.
#pragma once

#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "kiln/error.h"
#include "kiln/tensor.h"

namespace kiln {

// The value of a static leaf. Integers and enums are held as int64_t, floating point as double.
using StaticValue = std::variant<int64_t, double, bool, std::string>;

// The structure of a tree, without its tensors. Tensor types are not part of it (jit adds them to
// its cache key), so trees whose tensors differ only in dtype or shape have equal TreeDefs.
struct TreeDef {
  enum class Kind : uint8_t {
    leaf,         // a Tensor (an undefined Tensor too)
    static_leaf,  // a value that is not traced, held in `value`
    vector,       // std::vector: one child per element
    array,        // std::array: one child per element
    map,          // std::map<std::string, T>: keys in `names`, in key order
    tuple,        // std::tuple or std::pair
    optional,     // std::optional: no child when empty, one when set
    structure,    // a KILN_TREE struct: `type_name`, field names in `names`
  };

  Kind kind = Kind::leaf;
  std::vector<TreeDef> children;
  std::vector<std::string> names;  // map keys or struct field names, one per child
  std::string type_name;           // struct name as written in KILN_TREE
  StaticValue value;               // static_leaf only

  // Number of Tensor leaves (static leaves are not counted).
  std::size_t num_leaves() const;
  // Canonical text: equal TreeDefs give equal strings, different ones different strings.
  // `*` is a Tensor leaf: `Params{w: *, b: *, n: 3}`, `[*, *]`, `{"a": (*, 0.5)}`,
  // `array[*]`, `optional(*)`, `optional()`.
  std::string to_string() const;
  std::size_t hash() const noexcept;
  // Structural equality. Doubles compare by bit pattern, so a NaN static value still hits a cache.
  bool operator==(const TreeDef& other) const;
};

std::ostream& operator<<(std::ostream& os, const TreeDef& def);

// Where a and b first differ (depth-first, in leaf order), as "<path>: <a> vs <b>", e.g.
// ".w: static value 3 vs 4" or ".layers: vector of 2 vs 3 children"; the top is "(root)".
// nullopt when they are equal.
std::optional<std::string> first_difference(const TreeDef& a, const TreeDef& b);

// Paths of the Tensor leaves, in flatten order: ".w", "[0].b", "[\"key\"]", "" for a root leaf.
// std::optional adds no step of its own.
std::vector<std::string> tree_paths(const TreeDef& def);
// The same leaves in dotted style without a leading dot, for parameter names:
// "features.0.weight" (struct fields by name, elements by index, map entries by key).
std::vector<std::string> tree_names(const TreeDef& def);

namespace detail {

// The leaves tree_unflatten hands out, in order.
struct TreeCursor {
  std::span<const Tensor> leaves;
  std::size_t next = 0;
};

// One step of the path from the root to the node being rebuilt, kept on the stack and only
// rendered (".layers[0].w") when an error needs it.
struct TreePathLink {
  enum class Step : uint8_t { field, index, key };
  const TreePathLink* parent = nullptr;
  Step step = Step::index;
  std::string_view name;  // field name or map key
  std::size_t index = 0;  // vector, array or tuple position
};

std::string render_path(const TreePathLink* at);  // "" for the root
// "[tree_unflatten] structure does not match the type at <path>: got <def>, expected <expected>"
[[noreturn]] void tree_mismatch(const TreeDef& got, std::string_view expected,
                                const TreePathLink* at);
[[noreturn]] void tree_out_of_leaves(const TreePathLink* at);
// Raises "[op] structures differ at <path>: got …, expected …" unless got == expected.
void check_same_structure(std::string_view op, const TreeDef& expected, const TreeDef& got,
                          std::size_t got_index);
std::string describe_fields(const char* type_name, std::span<const std::string_view> fields);

// Static leaves: arithmetic types, enums and strings.
template <class T>
concept static_leaf =
    std::is_arithmetic_v<T> || std::is_enum_v<T> || std::is_same_v<T, std::string>;

// KILN_TREE declares kiln_tree_fields(TreeTag<T>) and kiln_tree_name(TreeTag<T>) next to the
// struct; argument-dependent lookup through the tag finds them from here.
template <class T>
struct TreeTag {};

template <class C, class M>
struct TreeField {
  const char* name;
  M C::*member;
};
template <class C, class M>
constexpr TreeField<C, M> tree_field(const char* name, M C::*member) {
  return {name, member};
}

template <class T>
concept registered_struct = requires {
  kiln_tree_fields(TreeTag<T>{});
  { kiln_tree_name(TreeTag<T>{}) } -> std::convertible_to<const char*>;
};

}  // namespace detail

// ---- the traits that make a type a tree ----------------------------------------------------

// Specialised for each kind of tree. A specialisation provides
//   static TreeDef flatten(const T& x, std::vector<Tensor>& leaves);  // appends x's leaves
//   static T unflatten(const TreeDef& def, detail::TreeCursor& in,
//                      const detail::TreePathLink* at);                // checks def against T
// The unspecialised template has neither: that type is not a tree.
template <class T>
struct TreeTraits {};

template <class T>
concept Tree = requires(const T& x, std::vector<Tensor>& leaves, const TreeDef& def,
                        detail::TreeCursor& in) {
  { TreeTraits<T>::flatten(x, leaves) } -> std::same_as<TreeDef>;
  { TreeTraits<T>::unflatten(def, in, nullptr) } -> std::same_as<T>;
};

#define KILN_DETAIL_NOT_A_TREE                                                                \
  "not a kiln tree: use Tensor, a static leaf (arithmetic, enum, std::string), std::vector, " \
  "std::array, std::map<std::string, T>, std::tuple, std::pair, std::optional, or a struct "  \
  "registered with KILN_TREE(Type, fields...)"

template <>
struct TreeTraits<Tensor> {
  static TreeDef flatten(const Tensor& x, std::vector<Tensor>& leaves) {
    leaves.push_back(x);
    return TreeDef{};
  }
  static Tensor unflatten(const TreeDef& def, detail::TreeCursor& in,
                          const detail::TreePathLink* at) {
    if (def.kind != TreeDef::Kind::leaf) detail::tree_mismatch(def, "tensor", at);
    if (in.next >= in.leaves.size()) detail::tree_out_of_leaves(at);
    return in.leaves[in.next++];
  }
};

template <class T>
requires detail::static_leaf<T>
struct TreeTraits<T> {
  static TreeDef flatten(const T& x, std::vector<Tensor>&) {
    TreeDef def;
    def.kind = TreeDef::Kind::static_leaf;
    if constexpr (std::is_same_v<T, bool>) {
      def.value = x;
    } else if constexpr (std::is_enum_v<T>) {
      def.value = static_cast<int64_t>(static_cast<std::underlying_type_t<T>>(x));
    } else if constexpr (std::is_integral_v<T>) {
      def.value = static_cast<int64_t>(x);
    } else if constexpr (std::is_floating_point_v<T>) {
      def.value = static_cast<double>(x);
    } else {
      def.value = x;  // std::string
    }
    return def;
  }
  static T unflatten(const TreeDef& def, detail::TreeCursor&, const detail::TreePathLink* at) {
    // The value comes back from the TreeDef, converted to T; the held alternative must match.
    using Held =
        std::conditional_t<std::is_same_v<T, bool>, bool,
                           std::conditional_t<std::is_floating_point_v<T>, double,
                                              std::conditional_t<std::is_same_v<T, std::string>,
                                                                 std::string, int64_t>>>;
    const Held* v =
        def.kind == TreeDef::Kind::static_leaf ? std::get_if<Held>(&def.value) : nullptr;
    if (v == nullptr) {
      detail::tree_mismatch(def,
                            std::is_same_v<Held, bool>          ? "static bool value"
                            : std::is_same_v<Held, double>      ? "static floating-point value"
                            : std::is_same_v<Held, std::string> ? "static string value"
                                                                : "static integer value",
                            at);
    }
    if constexpr (std::is_enum_v<T>) {
      return static_cast<T>(static_cast<std::underlying_type_t<T>>(*v));
    } else {
      return static_cast<T>(*v);
    }
  }
};

template <class T, class A>
struct TreeTraits<std::vector<T, A>> {
  static_assert(Tree<T>, "std::vector element type is " KILN_DETAIL_NOT_A_TREE);
  static TreeDef flatten(const std::vector<T, A>& x, std::vector<Tensor>& leaves) {
    TreeDef def;
    def.kind = TreeDef::Kind::vector;
    def.children.reserve(x.size());
    for (const auto& e : x) def.children.push_back(TreeTraits<T>::flatten(e, leaves));
    return def;
  }
  static std::vector<T, A> unflatten(const TreeDef& def, detail::TreeCursor& in,
                                     const detail::TreePathLink* at) {
    if (def.kind != TreeDef::Kind::vector) detail::tree_mismatch(def, "vector", at);
    std::vector<T, A> out;
    out.reserve(def.children.size());
    for (std::size_t i = 0; i < def.children.size(); ++i) {
      const detail::TreePathLink link{at, detail::TreePathLink::Step::index, {}, i};
      out.push_back(TreeTraits<T>::unflatten(def.children[i], in, &link));
    }
    return out;
  }
};

template <class T, std::size_t N>
struct TreeTraits<std::array<T, N>> {
  static_assert(Tree<T>, "std::array element type is " KILN_DETAIL_NOT_A_TREE);
  static TreeDef flatten(const std::array<T, N>& x, std::vector<Tensor>& leaves) {
    TreeDef def;
    def.kind = TreeDef::Kind::array;
    def.children.reserve(N);
    for (const auto& e : x) def.children.push_back(TreeTraits<T>::flatten(e, leaves));
    return def;
  }
  static std::array<T, N> unflatten(const TreeDef& def, detail::TreeCursor& in,
                                    const detail::TreePathLink* at) {
    if (def.kind != TreeDef::Kind::array || def.children.size() != N) {
      detail::tree_mismatch(def, "array of " + std::to_string(N) + " children", at);
    }
    auto one = [&](std::size_t i) {
      const detail::TreePathLink link{at, detail::TreePathLink::Step::index, {}, i};
      return TreeTraits<T>::unflatten(def.children[i], in, &link);
    };
    // Braced initialisation evaluates left to right, so leaves are consumed in order; T need
    // not be default-constructible.
    return [&]<std::size_t... I>(std::index_sequence<I...>) { return std::array<T, N>{one(I)...}; }
    (std::make_index_sequence<N>{});
  }
};

template <class T, class C, class A>
struct TreeTraits<std::map<std::string, T, C, A>> {
  static_assert(Tree<T>, "std::map value type is " KILN_DETAIL_NOT_A_TREE);
  using Map = std::map<std::string, T, C, A>;
  static TreeDef flatten(const Map& x, std::vector<Tensor>& leaves) {
    TreeDef def;
    def.kind = TreeDef::Kind::map;
    def.children.reserve(x.size());
    def.names.reserve(x.size());
    for (const auto& [key, e] : x) {
      def.names.push_back(key);
      def.children.push_back(TreeTraits<T>::flatten(e, leaves));
    }
    return def;
  }
  static Map unflatten(const TreeDef& def, detail::TreeCursor& in, const detail::TreePathLink* at) {
    if (def.kind != TreeDef::Kind::map || def.names.size() != def.children.size()) {
      detail::tree_mismatch(def, "map", at);
    }
    Map out;
    for (std::size_t i = 0; i < def.children.size(); ++i) {
      const detail::TreePathLink link{at, detail::TreePathLink::Step::key, def.names[i], 0};
      out.emplace_hint(out.end(), def.names[i],
                       TreeTraits<T>::unflatten(def.children[i], in, &link));
    }
    return out;
  }
};

namespace detail {
// Shared by std::tuple and std::pair: flatten each element, rebuild as Out{elements...}.
template <class Out, class... Ts>
struct TupleTreeTraits {
  static_assert((Tree<Ts> && ...), "a tuple or pair element type is " KILN_DETAIL_NOT_A_TREE);
  static TreeDef flatten(const Out& x, std::vector<Tensor>& leaves) {
    TreeDef def;
    def.kind = TreeDef::Kind::tuple;
    def.children.reserve(sizeof...(Ts));
    std::apply([&](const auto&... e) { (def.children.push_back(flatten_one(e, leaves)), ...); }, x);
    return def;
  }
  static Out unflatten(const TreeDef& def, TreeCursor& in, const TreePathLink* at) {
    if (def.kind != TreeDef::Kind::tuple || def.children.size() != sizeof...(Ts)) {
      tree_mismatch(def, "tuple of " + std::to_string(sizeof...(Ts)) + " children", at);
    }
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      return Out{unflatten_one<Ts>(def, in, at, I)...};  // braces: left to right
    }
    (std::index_sequence_for<Ts...>{});
  }

 private:
  template <class E>
  static TreeDef flatten_one(const E& e, std::vector<Tensor>& leaves) {
    return TreeTraits<E>::flatten(e, leaves);
  }
  template <class E>
  static E unflatten_one(const TreeDef& def, TreeCursor& in, const TreePathLink* at,
                         std::size_t i) {
    const TreePathLink link{at, TreePathLink::Step::index, {}, i};
    return TreeTraits<E>::unflatten(def.children[i], in, &link);
  }
};
}  // namespace detail

template <class... Ts>
struct TreeTraits<std::tuple<Ts...>> : detail::TupleTreeTraits<std::tuple<Ts...>, Ts...> {};
template <class A, class B>
struct TreeTraits<std::pair<A, B>> : detail::TupleTreeTraits<std::pair<A, B>, A, B> {};

template <class T>
struct TreeTraits<std::optional<T>> {
  static_assert(Tree<T>, "std::optional value type is " KILN_DETAIL_NOT_A_TREE);
  static TreeDef flatten(const std::optional<T>& x, std::vector<Tensor>& leaves) {
    TreeDef def;
    def.kind = TreeDef::Kind::optional;
    if (x) def.children.push_back(TreeTraits<T>::flatten(*x, leaves));
    return def;
  }
  // The optional adds no path step: an error inside it names the optional's own path.
  static std::optional<T> unflatten(const TreeDef& def, detail::TreeCursor& in,
                                    const detail::TreePathLink* at) {
    if (def.kind != TreeDef::Kind::optional || def.children.size() > 1) {
      detail::tree_mismatch(def, "optional", at);
    }
    if (def.children.empty()) return std::nullopt;
    return std::optional<T>(TreeTraits<T>::unflatten(def.children[0], in, at));
  }
};

// A struct registered with KILN_TREE: its listed fields, in the order listed. Unflatten
// value-initialises the struct and assigns the fields; fields not listed keep their defaults.
template <class T>
requires detail::registered_struct<T>
struct TreeTraits<T> {
  static TreeDef flatten(const T& x, std::vector<Tensor>& leaves) {
    TreeDef def;
    def.kind = TreeDef::Kind::structure;
    def.type_name = kiln_tree_name(detail::TreeTag<T>{});
    std::apply(
        [&](const auto&... f) {
          def.names.reserve(sizeof...(f));
          def.children.reserve(sizeof...(f));
          (def.names.emplace_back(f.name), ...);
          (def.children.push_back(flatten_field(x.*(f.member), leaves)), ...);
        },
        kiln_tree_fields(detail::TreeTag<T>{}));
    return def;
  }
  static T unflatten(const TreeDef& def, detail::TreeCursor& in, const detail::TreePathLink* at) {
    static constexpr auto fields = kiln_tree_fields(detail::TreeTag<T>{});
    if (!matches(def)) {
      std::apply(
          [&](const auto&... f) {
            const std::array<std::string_view, sizeof...(f)> names{f.name...};
            detail::tree_mismatch(
                def, detail::describe_fields(kiln_tree_name(detail::TreeTag<T>{}), names), at);
          },
          fields);
    }
    T out{};
    std::apply(
        [&](const auto&... f) {
          std::size_t i = 0;
          ((out.*(f.member) = unflatten_field<std::remove_cvref_t<decltype(out.*(f.member))>>(
                def, in, at, f.name, i++)),
           ...);
        },
        fields);
    return out;
  }

 private:
  template <class M>
  static TreeDef flatten_field(const M& m, std::vector<Tensor>& leaves) {
    static_assert(Tree<M>, "a KILN_TREE field type is " KILN_DETAIL_NOT_A_TREE);
    return TreeTraits<M>::flatten(m, leaves);
  }
  template <class M>
  static M unflatten_field(const TreeDef& def, detail::TreeCursor& in,
                           const detail::TreePathLink* at, const char* name, std::size_t i) {
    const detail::TreePathLink link{at, detail::TreePathLink::Step::field, name, 0};
    return TreeTraits<M>::unflatten(def.children[i], in, &link);
  }
  static bool matches(const TreeDef& def) {
    if (def.kind != TreeDef::Kind::structure ||
        def.type_name != kiln_tree_name(detail::TreeTag<T>{})) {
      return false;
    }
    return std::apply(
        [&](const auto&... f) {
          if (def.names.size() != sizeof...(f) || def.children.size() != sizeof...(f)) {
            return false;
          }
          std::size_t i = 0;
          return ((def.names[i++] == f.name) && ...);
        },
        kiln_tree_fields(detail::TreeTag<T>{}));
  }
};

// ---- the public functions -----------------------------------------------------------------

// The Tensor leaves of a tree (depth first: struct fields in KILN_TREE order, vectors and arrays
// by index, maps by key, tuples by position) and its structure.
template <class T>
std::pair<std::vector<Tensor>, TreeDef> tree_flatten(const T& tree) {
  static_assert(Tree<T>, "tree_flatten: the type is " KILN_DETAIL_NOT_A_TREE);
  std::vector<Tensor> leaves;
  TreeDef def = TreeTraits<T>::flatten(tree, leaves);
  return {std::move(leaves), std::move(def)};
}

// Rebuilds a T from its structure and leaves (static values come from def; vector and map sizes
// and keys too). Raises Error when def does not describe a T or the leaf count is wrong.
template <class T>
T tree_unflatten(const TreeDef& def, std::span<const Tensor> leaves) {
  static_assert(Tree<T>, "tree_unflatten: the type is " KILN_DETAIL_NOT_A_TREE);
  const std::size_t want = def.num_leaves();
  if (leaves.size() != want) {
    fail("tree_unflatten", "wrong number of leaves for ", def.to_string(), ": got ", leaves.size(),
         ", expected ", want);
  }
  detail::TreeCursor in{leaves, 0};
  return TreeTraits<T>::unflatten(def, in, nullptr);
}

template <class T>
std::vector<Tensor> tree_leaves(const T& tree) {
  return tree_flatten(tree).first;
}

template <class T>
TreeDef tree_structure(const T& tree) {
  return tree_flatten(tree).second;
}

template <class T>
requires(!std::is_same_v<T, TreeDef>) std::vector<std::string> tree_paths(const T& tree) {
  return tree_paths(tree_structure(tree));
}

template <class T>
requires(!std::is_same_v<T, TreeDef>) std::vector<std::string> tree_names(const T& tree) {
  return tree_names(tree_structure(tree));
}

namespace detail {
template <class>
using tensor_arg = const Tensor&;
}

// Applies f leaf by leaf: f(leaf of tree, leaf of rest...) -> Tensor. All trees must have the
// same structure, static values included (Error naming the first differing path otherwise).
// The result has the type of the first tree. Leaves undefined in every tree stay undefined and
// f is not called on them (so an unset parameter passes through an optimiser step).
template <class F, class T, class... Rest>
T tree_map(F&& f, const T& tree, const Rest&... rest) {
  static_assert(Tree<T> && (Tree<Rest> && ...), "tree_map: a type is " KILN_DETAIL_NOT_A_TREE);
  static_assert(std::is_invocable_r_v<Tensor, F&, const Tensor&, detail::tensor_arg<Rest>...>,
                "tree_map: f must take one const Tensor& per tree and return a Tensor");
  auto flat = tree_flatten(tree);
  const std::vector<Tensor>& leaves = flat.first;
  std::array<std::vector<Tensor>, sizeof...(Rest)> others;
  std::size_t k = 0;
  [[maybe_unused]] auto add = [&](const auto& other) {
    auto o = tree_flatten(other);
    detail::check_same_structure("tree_map", flat.second, o.second, k + 2);
    others[k++] = std::move(o.first);
  };
  (add(rest), ...);

  std::vector<Tensor> out(leaves.size());
  for (std::size_t i = 0; i < leaves.size(); ++i) {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      if (!leaves[i].defined() && (!others[I][i].defined() && ...)) return;
      out[i] = std::invoke(f, leaves[i], others[I][i]...);
    }
    (std::index_sequence_for<Rest...>{});
  }
  return tree_unflatten<T>(flat.second, out);
}

// ---- trees and printing ---------------------------------------------------------------------

// Folds f over the defined Tensor leaves in flatten order: f(f(init, leaf0), leaf1)...
// Undefined leaves are skipped. Works on traced leaves (under grad, vmap, jit) like any op.
template <class F, class T, class Acc>
Acc tree_reduce(F&& f, const T& tree, Acc init) {
  static_assert(Tree<T>, "tree_reduce: the type is " KILN_DETAIL_NOT_A_TREE);
  static_assert(std::is_invocable_r_v<Acc, F&, Acc, const Tensor&>,
                "tree_reduce: f must take (accumulator, const Tensor&) and return an accumulator");
  for (const Tensor& leaf : tree_leaves(tree))
    if (leaf.defined()) init = std::invoke(f, std::move(init), leaf);
  return init;
}

namespace detail {
Tensor leaves_sum(std::span<const Tensor> leaves);
Tensor leaves_dot(std::span<const Tensor> a, std::span<const Tensor> b);
Tensor leaves_norm(std::span<const Tensor> leaves, double ord);
}  // namespace detail

// The sum of every element of every defined leaf, a 0-d tensor. Its dtype is the promotion of
// the leaves' sum dtypes; partial sums of 16-bit floats are added in float32. 0.f for a tree
// without defined leaves.
template <class T>
Tensor tree_sum(const T& tree) {
  static_assert(Tree<T>, "tree_sum: the type is " KILN_DETAIL_NOT_A_TREE);
  return detail::leaves_sum(tree_leaves(tree));
}

// Σ over leaves of sum(a_leaf * b_leaf): the inner product of two trees of the same structure
// (Error naming the first differing path otherwise). Leaves undefined in both are skipped.
template <class A, class B>
Tensor tree_dot(const A& a, const B& b) {
  static_assert(Tree<A> && Tree<B>, "tree_dot: a type is " KILN_DETAIL_NOT_A_TREE);
  auto fa = tree_flatten(a);
  auto fb = tree_flatten(b);
  detail::check_same_structure("tree_dot", fa.second, fb.second, 2);
  return detail::leaves_dot(fa.first, fb.first);
}

// The norm of all elements of all leaves as one vector: ord 2 (default) sqrt(Σ x²), 1 Σ|x|,
// INFINITY max|x|, any other p > 0 (Σ|x|^p)^(1/p). Computed in the leaves' promoted float
// dtype, at least float32 (integer and 16-bit float leaves count as float32). Its gradient at
// an all-zero tree is 0 rather than NaN. A global gradient norm is tree_norm(grads);
// vmap(tree_norm) gives per-example norms. Error for ord <= 0 or NaN.
template <class T>
Tensor tree_norm(const T& tree, double ord = 2) {
  static_assert(Tree<T>, "tree_norm: the type is " KILN_DETAIL_NOT_A_TREE);
  return detail::leaves_norm(tree_leaves(tree), ord);
}

namespace detail {
// A tree that is not a single leaf: what operator<< and to_string below print.
template <class T>
concept printable_tree = Tree<T> && !std::is_same_v<T, Tensor> && !static_leaf<T>;
std::string tree_text(const TreeDef& def, std::span<const Tensor> leaves);
std::ostream& print_tree(std::ostream& os, const TreeDef& def, std::span<const Tensor> leaves);
}  // namespace detail

// A tree as nested text: struct fields and map keys by name, tensors as `std::cout << t` prints
// them (with the print options of kiln/printing.h). A container fits on one line when it can:
//   Params{w: [1., 2.], b: 0.5, n: 3}
// and otherwise puts each child on a line of its own, indented by two:
//   Params{
//     w: [[1., 2.],
//         [3., 4.]],
//     n: 3
//   }
template <class T>
requires detail::printable_tree<T> std::string to_string(const T& tree) {
  const auto flat = tree_flatten(tree);
  return detail::tree_text(flat.second, flat.first);
}

// Found by argument-dependent lookup for containers of kiln types, and (through KILN_TREE) for
// registered structs; elsewhere `using namespace kiln` or to_string(tree) reaches it.
template <class T>
requires detail::printable_tree<T> std::ostream& operator<<(std::ostream& os, const T& tree) {
  const auto flat = tree_flatten(tree);
  return detail::print_tree(os, flat.second, flat.first);
}

}  // namespace kiln

template <>
struct std::hash<kiln::TreeDef> {
  std::size_t operator()(const kiln::TreeDef& def) const noexcept { return def.hash(); }
};

// ---- KILN_TREE ------------------------------------------------------------------------------

// KILN_TREE(Type, field1, field2, ...) makes a struct a tree whose children are the listed
// fields (up to 32), in that order. Place it at namespace scope in the struct's own namespace
// (argument-dependent lookup finds it there), after the struct; the trailing `;` is expected.
// The struct must be default-constructible and its listed fields assignable.
#define KILN_TREE(Type, ...)                                                                    \
  [[maybe_unused]] inline constexpr auto kiln_tree_fields(::kiln::detail::TreeTag<Type>) {      \
    return ::std::make_tuple(KILN_DETAIL_FOR_EACH(KILN_DETAIL_TREE_FIELD, Type, __VA_ARGS__));  \
  }                                                                                             \
  [[maybe_unused]] inline constexpr const char* kiln_tree_name(::kiln::detail::TreeTag<Type>) { \
    return #Type;                                                                               \
  }                                                                                             \
  /* operator<< next to the struct, for argument-dependent lookup; more constrained than */     \
  /* kiln's own, and a user's non-template operator<< for Type wins over both. */               \
  template <class KilnTree>                                                                     \
  requires(::kiln::detail::printable_tree<KilnTree> &&                                          \
           ::std::is_same_v<KilnTree, Type>)::std::ostream&                                     \
  operator<<(::std::ostream& os, const KilnTree& tree) {                                        \
    const auto flat = ::kiln::tree_flatten(tree);                                               \
    return ::kiln::detail::print_tree(os, flat.second, flat.first);                             \
  }                                                                                             \
  static_assert(true, "KILN_TREE is followed by a semicolon")

#define KILN_DETAIL_TREE_FIELD(Type, field) ::kiln::detail::tree_field(#field, &Type::field)

// A preprocessor for-each: KILN_DETAIL_FOR_EACH(M, c, a, b) -> M(c, a), M(c, b).
#define KILN_DETAIL_CAT(a, b) KILN_DETAIL_CAT_(a, b)
#define KILN_DETAIL_CAT_(a, b) a##b
#define KILN_DETAIL_FOR_EACH(M, c, ...) \
  KILN_DETAIL_CAT(KILN_DETAIL_FE_, KILN_DETAIL_NARGS(__VA_ARGS__))(M, c, __VA_ARGS__)
#define KILN_DETAIL_NARGS(...)                                                                    \
  KILN_DETAIL_NARGS_(__VA_ARGS__, 32, 31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, \
                     16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0)
#define KILN_DETAIL_NARGS_(_1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, _13, _14, _15, _16, \
                           _17, _18, _19, _20, _21, _22, _23, _24, _25, _26, _27, _28, _29, _30,  \
                           _31, _32, N, ...)                                                      \
  N
#define KILN_DETAIL_FE_1(M, c, x) M(c, x)
#define KILN_DETAIL_FE_2(M, c, x, ...) M(c, x), KILN_DETAIL_FE_1(M, c, __VA_ARGS__)
#define KILN_DETAIL_FE_3(M, c, x, ...) M(c, x), KILN_DETAIL_FE_2(M, c, __VA_ARGS__)
#define KILN_DETAIL_FE_4(M, c, x, ...) M(c, x), KILN_DETAIL_FE_3(M, c, __VA_ARGS__)
#define KILN_DETAIL_FE_5(M, c, x, ...) M(c, x), KILN_DETAIL_FE_4(M, c, __VA_ARGS__)
#define KILN_DETAIL_FE_6(M, c, x, ...) M(c, x), KILN_DETAIL_FE_5(M, c, __VA_ARGS__)
#define KILN_DETAIL_FE_7(M, c, x, ...) M(c, x), KILN_DETAIL_FE_6(M, c, __VA_ARGS__)
#define KILN_DETAIL_FE_8(M, c, x, ...) M(c, x), KILN_DETAIL_FE_7(M, c, __VA_ARGS__)
#define KILN_DETAIL_FE_9(M, c, x, ...) M(c, x), KILN_DETAIL_FE_8(M, c, __VA_ARGS__)
#define KILN_DETAIL_FE_10(M, c, x, ...) M(c, x), KILN_DETAIL_FE_9(M, c, __VA_ARGS__)
#define KILN_DETAIL_FE_11(M, c, x, ...) M(c, x), KILN_DETAIL_FE_10(M, c, __VA_ARGS__)
#define KILN_DETAIL_FE_12(M, c, x, ...) M(c, x), KILN_DETAIL_FE_11(M, c, __VA_ARGS__)
#define KILN_DETAIL_FE_13(M, c, x, ...) M(c, x), KILN_DETAIL_FE_12(M, c, __VA_ARGS__)
#define KILN_DETAIL_FE_14(M, c, x, ...) M(c, x), KILN_DETAIL_FE_13(M, c, __VA_ARGS__)
#define KILN_DETAIL_FE_15(M, c, x, ...) M(c, x), KILN_DETAIL_FE_14(M, c, __VA_ARGS__)
#define KILN_DETAIL_FE_16(M, c, x, ...) M(c, x), KILN_DETAIL_FE_15(M, c, __VA_ARGS__)
#define KILN_DETAIL_FE_17(M, c, x, ...) M(c, x), KILN_DETAIL_FE_16(M, c, __VA_ARGS__)
#define KILN_DETAIL_FE_18(M, c, x, ...) M(c, x), KILN_DETAIL_FE_17(M, c, __VA_ARGS__)
#define KILN_DETAIL_FE_19(M, c, x, ...) M(c, x), KILN_DETAIL_FE_18(M, c, __VA_ARGS__)
#define KILN_DETAIL_FE_20(M, c, x, ...) M(c, x), KILN_DETAIL_FE_19(M, c, __VA_ARGS__)
#define KILN_DETAIL_FE_21(M, c, x, ...) M(c, x), KILN_DETAIL_FE_20(M, c, __VA_ARGS__)
#define KILN_DETAIL_FE_22(M, c, x, ...) M(c, x), KILN_DETAIL_FE_21(M, c, __VA_ARGS__)
#define KILN_DETAIL_FE_23(M, c, x, ...) M(c, x), KILN_DETAIL_FE_22(M, c, __VA_ARGS__)
#define KILN_DETAIL_FE_24(M, c, x, ...) M(c, x), KILN_DETAIL_FE_23(M, c, __VA_ARGS__)
#define KILN_DETAIL_FE_25(M, c, x, ...) M(c, x), KILN_DETAIL_FE_24(M, c, __VA_ARGS__)
#define KILN_DETAIL_FE_26(M, c, x, ...) M(c, x), KILN_DETAIL_FE_25(M, c, __VA_ARGS__)
#define KILN_DETAIL_FE_27(M, c, x, ...) M(c, x), KILN_DETAIL_FE_26(M, c, __VA_ARGS__)
#define KILN_DETAIL_FE_28(M, c, x, ...) M(c, x), KILN_DETAIL_FE_27(M, c, __VA_ARGS__)
#define KILN_DETAIL_FE_29(M, c, x, ...) M(c, x), KILN_DETAIL_FE_28(M, c, __VA_ARGS__)
#define KILN_DETAIL_FE_30(M, c, x, ...) M(c, x), KILN_DETAIL_FE_29(M, c, __VA_ARGS__)
#define KILN_DETAIL_FE_31(M, c, x, ...) M(c, x), KILN_DETAIL_FE_30(M, c, __VA_ARGS__)
#define KILN_DETAIL_FE_32(M, c, x, ...) M(c, x), KILN_DETAIL_FE_31(M, c, __VA_ARGS__)
