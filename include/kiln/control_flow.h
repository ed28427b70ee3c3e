// Structured control flow: cond, switch_, while_loop, fori_loop and scan (docs/CONTROL_FLOW.md).
//
// Eagerly (no active trace) they run natively: cond runs only the chosen branch and loops are
// C++ loops that read the predicate with item<bool>(). Branches and bodies that do not run are
// still traced (abstractly, nothing computed), so eager code is checked exactly as traced code.
// Under a trace (jit, grad, vmap, ...) they become higher-order primitives whose branches and
// bodies are sub-functions (FunctionRef attributes); tensors of the enclosing trace that a branch
// or body closes over become extra operands of the primitive (closure conversion). Every transform
// handles them.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/impl/staging.h"
#include "kiln/ops.h"
#include "kiln/tree.h"

namespace kiln {

namespace detail::cf {

// The user's functions, flattened as every transformation stages them (kiln/impl/staging.h).
using detail::FlatFn;

// Applies branches[index] (index clamped to the valid range) to `operands`.
// `names` label the branches in errors ("true_fn", "branch 2").
std::pair<std::vector<Tensor>, TreeDef> switch_flat(std::string_view op, const Tensor& index,
                                                    const std::vector<FlatFn>& branches,
                                                    const std::vector<std::string>& names,
                                                    const std::vector<Tensor>& operands);
// cond_fn returns one leaf: a bool scalar.
std::vector<Tensor> while_flat(const FlatFn& cond_fn, const FlatFn& body_fn,
                               const std::vector<Tensor>& init, const TreeDef& init_def);
// body maps (carry leaves ++ x leaves) to the leaves of a (carry, y) pair. Returns the final
// carry leaves ++ the stacked y leaves, and the structure of y.
std::pair<std::vector<Tensor>, TreeDef> scan_flat(
    const FlatFn& body, const std::vector<Tensor>& init, const TreeDef& init_def,
    const std::vector<Tensor>& xs, std::optional<int64_t> length, bool reverse, int64_t unroll = 1);
// The predicate as a branch index (false -> 0, true -> 1); an Error unless it is a bool scalar.
Tensor predicate_index(std::string_view op, const Tensor& pred);
// An int32 scalar holding v.
Tensor int_scalar(int64_t v);
// The number of steps of fori_loop(lo, hi): 0 when hi <= lo; an Error when the int32 loop
// counter cannot hold the bounds.
int64_t trip_count(int64_t lo, int64_t hi);

// What f(args...) returns, or void when f cannot be called so: lets a static_assert be the
// one error a wrong user function produces.
template <class F, class... Args>
using result_or_void =
    typename std::conditional_t<std::is_invocable_v<F, Args...>, std::invoke_result<F, Args...>,
                                std::type_identity<void>>::type;

// body(i, carry) returns the carry's type.
template <class BF, class T>
concept fori_body = std::is_convertible_v<result_or_void<BF&, const Tensor&, const T&>, T>;

// A (carry, y) result: a std::pair or a two-element std::tuple.
template <class T>
concept carry_and_output = requires {
  std::tuple_size<T>::value;
}
&&std::tuple_size_v<T> == 2;

}  // namespace detail::cf

// cond(pred, true_fn, false_fn, operands...): true_fn(operands...) if the bool scalar `pred`
// holds, else false_fn(operands...). Branches may also take no operands and capture what they
// need. Both must return trees of the same structure, dtypes and shapes.
template <class TF, class FF, class... Ops>
auto cond(const Tensor& pred, TF true_fn, FF false_fn, const Ops&... operands) {
  using R = std::decay_t<std::invoke_result_t<TF&, const Ops&...>>;
  static_assert(std::is_same_v<R, std::decay_t<std::invoke_result_t<FF&, const Ops&...>>>,
                "cond: both branches must return the same C++ type");
  auto [leaves, def] = tree_flatten(std::tuple<Ops...>(operands...));
  std::vector<detail::cf::FlatFn> branches{detail::flat_fn<Ops...>(false_fn, def),
                                           detail::flat_fn<Ops...>(true_fn, def)};
  auto [out, out_def] = detail::cf::switch_flat("cond", detail::cf::predicate_index("cond", pred),
                                                branches, {"false_fn", "true_fn"}, leaves);
  return tree_unflatten<R>(out_def, out);
}

// switch_(index, branches): branches[index]() for an integer scalar index, clamped to
// [0, branches.size() - 1]. All branches return the same tree type, dtypes and shapes.
template <class R>
R switch_(const Tensor& index, const std::vector<std::function<R()>>& branches) {
  std::vector<detail::cf::FlatFn> flat;
  std::vector<std::string> names;
  const TreeDef no_operands = tree_flatten(std::tuple<>{}).second;
  for (std::size_t k = 0; k < branches.size(); ++k) {
    flat.push_back(detail::flat_fn<>(branches[k], no_operands));
    names.push_back("branch " + std::to_string(k));
  }
  auto [out, out_def] = detail::cf::switch_flat("switch", index, flat, names, {});
  return tree_unflatten<R>(out_def, out);
}
// switch_(index, f0, f1, ...): the same with the branches as arguments.
template <class F0, class... Fs>
requires std::invocable<F0&>
auto switch_(const Tensor& index, F0 f0, Fs... fs) {
  using R = std::decay_t<std::invoke_result_t<F0&>>;
  return switch_<R>(index, std::vector<std::function<R()>>{std::function<R()>(std::move(f0)),
                                                           std::function<R()>(std::move(fs))...});
}

// while_loop(cond_fn, body_fn, init): carry = init; while (cond_fn(carry)) carry =
// body_fn(carry); returns carry. The carry is any tree; body_fn must keep its structure,
// dtypes and shapes; cond_fn returns a bool scalar. The trip count may depend on data.
template <class CF, class BF, class T>
T while_loop(CF cond_fn, BF body_fn, const T& init) {
  constexpr bool cond_ok = std::is_convertible_v<detail::cf::result_or_void<CF&, const T&>, Tensor>;
  constexpr bool body_ok = std::is_convertible_v<detail::cf::result_or_void<BF&, const T&>, T>;
  if constexpr (!cond_ok || !body_ok) {
    static_assert(
        cond_ok,
        "while_loop: cond_fn must be callable as cond_fn(carry) and return a bool scalar Tensor");
    static_assert(
        body_ok,
        "while_loop: body_fn must be callable as body_fn(carry) and return the carry's type");
    return init;
  } else {
    auto [leaves, def] = tree_flatten(init);
    detail::cf::FlatFn c = [&cond_fn, def = def](const std::vector<Tensor>& in, TreeDef& out_def) {
      const Tensor p = cond_fn(tree_unflatten<T>(def, in));
      out_def = tree_flatten(p).second;
      return std::vector<Tensor>{p};
    };
    detail::cf::FlatFn b = [&body_fn, def = def](const std::vector<Tensor>& in, TreeDef& out_def) {
      auto [out, d] = tree_flatten(static_cast<T>(body_fn(tree_unflatten<T>(def, in))));
      out_def = std::move(d);
      return out;
    };
    return tree_unflatten<T>(def, detail::cf::while_flat(c, b, leaves, def));
  }
}

// scan(f, init, xs, {reverse, length}) -> (final carry, stacked ys): for i along the leading
// axis of every leaf of xs, (carry, y_i) = f(carry, xs[i]); the y_i are stacked along a new
// leading axis. With `reverse`, i runs from the end (ys stay in xs order). xs may be an
// empty tree (e.g. std::tuple<>{}) when `length` is given.
// `unroll` (>= 1, default 1): under a trace, the emitted scan's body applies the body `unroll`
// times (to `unroll` consecutive slices), so the scan runs length / unroll iterations; the
// remaining length % unroll steps run as a second, short scan (unroll = 1) after the first
// (before it with `reverse`). An unroll above length is clamped to length. Same results; eager
// (no trace) scans ignore it. unroll < 1 is an Error naming it.
struct ScanOptions {
  bool reverse = false;
  std::optional<int64_t> length;
  int64_t unroll = 1;
};
template <class F, class C, class X>
auto scan(F f, const C& init, const X& xs, ScanOptions options = {}) {
  using Out = std::decay_t<detail::cf::result_or_void<F&, const C&, const X&>>;
  if constexpr (!detail::cf::carry_and_output<Out>) {
    static_assert(detail::cf::carry_and_output<Out>,
                  "scan: the body must be callable as f(carry, x) and return (carry, y) as a "
                  "std::pair or a std::tuple of two");
  } else {
    using Y = std::decay_t<std::tuple_element_t<1, Out>>;
    auto [init_leaves, init_def] = tree_flatten(init);
    auto [x_leaves, x_def] = tree_flatten(xs);
    const std::size_t nc = init_leaves.size();
    detail::cf::FlatFn body = [&f, init_def = init_def, x_def = x_def, nc](
                                  const std::vector<Tensor>& in, TreeDef& out_def) {
      const C c = tree_unflatten<C>(init_def, std::vector<Tensor>(in.begin(), in.begin() + nc));
      const X x = tree_unflatten<X>(x_def, std::vector<Tensor>(in.begin() + nc, in.end()));
      const Out r = f(c, x);
      auto [leaves, def] = tree_flatten(std::pair<C, Y>(std::get<0>(r), std::get<1>(r)));
      out_def = std::move(def);
      return leaves;
    };
    auto [out, y_def] = detail::cf::scan_flat(body, init_leaves, init_def, x_leaves, options.length,
                                              options.reverse, options.unroll);
    return std::pair<C, Y>(
        tree_unflatten<C>(init_def, std::vector<Tensor>(out.begin(), out.begin() + nc)),
        tree_unflatten<Y>(y_def, std::vector<Tensor>(out.begin() + nc, out.end())));
  }
}

// fori_loop(lo, hi, body, init): carry = body(i, carry) for i = lo, ..., hi - 1, where i is
// an int32 scalar tensor. Static bounds lower to a scan (reverse mode without a stack of
// unknown size); tensor bounds (int scalars, may be traced) lower to a while_loop.
template <class BF, class T>
T fori_loop(int64_t lo, int64_t hi, BF body, const T& init) {
  if constexpr (!detail::cf::fori_body<BF, T>) {
    static_assert(detail::cf::fori_body<BF, T>,
                  "fori_loop: body must be callable as body(i, carry) and return the carry's type");
    return init;
  } else {
    const int64_t n = detail::cf::trip_count(lo, hi);
    auto step = [&body](const std::pair<Tensor, T>& c, const std::tuple<>&) {
      return std::pair{std::pair<Tensor, T>{c.first + 1, static_cast<T>(body(c.first, c.second))},
                       std::tuple<>{}};
    };
    return scan(step, std::pair<Tensor, T>{detail::cf::int_scalar(lo), init}, std::tuple<>{},
                ScanOptions{.reverse = false, .length = n})
        .first.second;
  }
}
template <class BF, class T>
T fori_loop(const Tensor& lo, const Tensor& hi, BF body, const T& init) {
  if constexpr (!detail::cf::fori_body<BF, T>) {
    static_assert(detail::cf::fori_body<BF, T>,
                  "fori_loop: body must be callable as body(i, carry) and return the carry's type");
    return init;
  } else {
    const Tensor l = astype(lo, int32), h = astype(hi, int32);
    auto res = while_loop(
        [&](const std::pair<Tensor, T>& c) { return c.first < h; },
        [&](const std::pair<Tensor, T>& c) {
          return std::pair<Tensor, T>{c.first + 1, static_cast<T>(body(c.first, c.second))};
        },
        std::pair<Tensor, T>{l, init});
    return res.second;
  }
}

}  // namespace kiln
