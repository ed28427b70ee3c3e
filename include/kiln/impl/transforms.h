// Internal: the flat core of every transformation and the typed wrappers over it. Included
// by kiln/transforms.h after the option types it declares (Argnums, InAxes, ...); users read
// that header. Each wrapper flattens its arguments, calls one core function (src/transforms/)
// with a FlatFn of the user's callable, and unflattens the result types.
#pragma once

#include <concepts>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "kiln/impl/interpreters.h"
#include "kiln/impl/staging.h"

namespace kiln::detail {

// ---- the flat core -------------------------------------------------------------------------

// jit (src/transforms/jit.cpp): a per-signature cache shared by the copies of a jitted function.
class JitCache;
std::shared_ptr<JitCache> make_jit_cache(std::string name, std::optional<ir::Backend> backend);
std::size_t jit_cache_size(const JitCache& cache);
// Runs fn's specialisation for these arguments, tracing, optimising and compiling it on a
// miss; under another trace, records one `call` equation instead.
FlatTree jit_call(JitCache& cache, const TreeDef& args_def, const std::vector<Tensor>& leaves,
                  const FlatFn& fn);
// The optimised IR of that specialisation, and what the backend made of it.
ir::Function jit_lower(JitCache& cache, const TreeDef& args_def, const std::vector<Tensor>& leaves,
                       const FlatFn& fn);
ir::CompiledInfo jit_compiled(JitCache& cache, const TreeDef& args_def,
                              const std::vector<Tensor>& leaves, const FlatFn& fn);

// Reverse and forward mode (src/transforms/autodiff.cpp).
struct GradResult {
  FlatTree value;                          // fn's result; its first leaf is the loss
  std::vector<std::vector<Tensor>> grads;  // the gradient leaves of each argument in argnums
};
GradResult grad_call(std::string_view op, const std::vector<int>& argnums, const TreeDef& args_def,
                     const std::vector<Tensor>& leaves, const FlatFn& fn);

// Cotangent leaves of fn's result -> cotangent leaves of every argument (zeros where none
// reaches). Holds what the backward pass reads of the forward pass.
class FlatPullback {
 public:
  FlatPullback(ad::Pullback pullback, TreeDef out_def, std::vector<TensorType> arg_types);
  std::vector<Tensor> operator()(const std::vector<Tensor>& cotangent, const TreeDef& def) const;

 private:
  ad::Pullback pullback_;
  TreeDef out_def_;
  std::vector<TensorType> arg_types_;
};
struct VjpFlat {
  FlatTree out;
  FlatPullback pullback;
};
VjpFlat vjp_call(const TreeDef& args_def, const std::vector<Tensor>& leaves, const FlatFn& fn);

struct JvpFlat {
  FlatTree out;
  std::vector<Tensor> tangents;  // one per leaf of `out`
};
JvpFlat jvp_call(const TreeDef& args_def, const std::vector<Tensor>& leaves,
                 const TreeDef& tangents_def, const std::vector<Tensor>& tangents,
                 const FlatFn& fn);

// Jacobians (src/transforms/jacobian.cpp): blocks[o * n + i] is d(result leaf o) / d(leaf i of
// the arguments in argnums, n of them), shaped result.shape + leaf.shape.
struct FlatJacobian {
  TreeDef out_def;
  std::vector<Tensor> blocks;
};
FlatJacobian jacfwd_call(const std::vector<int>& argnums, const TreeDef& args_def,
                         const std::vector<Tensor>& leaves, const FlatFn& fn);
FlatJacobian jacrev_call(const std::vector<int>& argnums, const TreeDef& args_def,
                         const std::vector<Tensor>& leaves, const FlatFn& fn);

// vmap (src/transforms/vmap.cpp).
struct VmapOptions {
  std::optional<InAxes> in;
  std::optional<OutAxes> out;
  std::string name;
  std::optional<ProcessSpan> processes;  // pmap's axis (set by pmap_call, not by users)
  void set(const InAxes& a) { in = a; }
  void set(const OutAxes& a) { out = a; }
  void set(const AxisName& a) { name = a.name; }
};
template <class... Options>
VmapOptions vmap_options(const Options&... options) {
  VmapOptions o;
  (o.set(options), ...);
  return o;
}
FlatTree vmap_call(const VmapOptions& options, const TreeDef& args_def,
                   const std::vector<Tensor>& leaves, const FlatFn& fn);
// How vmap_call maps the argument leaves: each one's batch axis, and the number of examples
// (1 when no argument is batched). Raises vmap's Errors for bad in_axes.
struct MappedLeaves {
  std::vector<std::optional<int>> dims;
  int64_t size = 1;
};
MappedLeaves mapped_leaves(const VmapOptions& options, const TreeDef& args_def,
                           const std::vector<Tensor>& leaves);

// Sub-function primitives (src/transforms/custom.cpp). A rule is staged on arguments whose
// structure the core knows only after staging fn, so it comes as a factory of FlatFns.
using RuleFactory = std::function<FlatFn(const TreeDef& rule_args_def)>;
FlatTree checkpoint_call(const TreeDef& args_def, const std::vector<Tensor>& leaves,
                         const FlatFn& fn, const std::optional<CheckpointPolicy>& policy);
// jvp_rule(primals, tangents): both the argument tuple.
FlatTree custom_jvp_call(const TreeDef& args_def, const std::vector<Tensor>& leaves,
                         const FlatFn& fn, const RuleFactory& jvp_rule);
// bwd(primals, output, cotangent of the output) -> the argument tuple's cotangents.
FlatTree custom_vjp_call(const TreeDef& args_def, const std::vector<Tensor>& leaves,
                         const FlatFn& fn, const RuleFactory& bwd);
// The residual form: fwd(primals) -> the pair (output, residuals), run once in the forward
// pass; bwd(residuals, cotangent of the output) -> the argument tuple's cotangents.
FlatTree custom_vjp_call(const TreeDef& args_def, const std::vector<Tensor>& leaves,
                         const FlatFn& fn, const FlatFn& fwd, const RuleFactory& bwd);

// ---- typed wrappers ------------------------------------------------------------------------

// custom_vjp's fwd result: a pair (or two-element tuple) whose first element is f's output.
template <class T, class Out>
concept output_and_residuals = requires {
  std::tuple_size<T>::value;
}
&&std::tuple_size_v<T> == 2 && std::same_as<std::decay_t<std::tuple_element_t<0, T>>, Out>;

template <class Out>
Out unflatten(const FlatTree& t) {
  return tree_unflatten<Out>(t.def, t.leaves);
}

template <std::size_t K, class... Args>
using arg_t = std::decay_t<std::tuple_element_t<K, std::tuple<Args...>>>;

// The arguments in argnums: one type, or a tuple of them.
template <int N, int... I>
inline constexpr bool argnums_in_range = sizeof...(I) > 0 && ((I >= 0 && I < N) && ...);
#define KILN_DETAIL_BAD_ARGNUMS "argnums: every index must name an argument of the function"

template <class Argnums, class... Args>
struct SelectedArgs;
template <int... I, class... Args>
struct SelectedArgs<Argnums<I...>, Args...> {
  using type = std::conditional_t<sizeof...(I) == 1,
                                  std::tuple_element_t<0, std::tuple<arg_t<I, Args...>...>>,
                                  std::tuple<arg_t<I, Args...>...>>;
  // From the leaves of each selected argument, in order: parts[K] for argument I.
  static type build(const TreeDef& args_def, const std::vector<std::vector<Tensor>>& parts) {
    return build_at(args_def, parts, std::make_index_sequence<sizeof...(I)>{});
  }

 private:
  template <std::size_t... K>
  static type build_at(const TreeDef& args_def, const std::vector<std::vector<Tensor>>& parts,
                       std::index_sequence<K...>) {
    // One argument is returned as itself (a single-element list initialises from it).
    return type{unflatten_arg<arg_t<I, Args...>>(args_def, I, parts[K])...};
  }
};

template <bool ValueToo, bool Aux, class F, int... I>
class Grad {
 public:
  explicit Grad(F f) : f_(std::move(f)) {}

  template <class... Args>
  auto operator()(const Args&... args) const {
    if constexpr (!returns_tree<const F&, Args...>) {
      static_assert(returns_tree<const F&, Args...>, "grad: " KILN_DETAIL_NOT_TREE_FN);
    } else if constexpr (!argnums_in_range<sizeof...(Args), I...>) {
      static_assert(argnums_in_range<sizeof...(Args), I...>, KILN_DETAIL_BAD_ARGNUMS);
    } else {
      using Out = result_of<F, Args...>;
      using Sel = SelectedArgs<Argnums<I...>, Args...>;
      const FlatTree in = flatten_args(args...);
      const GradResult r = grad_call(ValueToo ? "value_and_grad" : "grad", {I...}, in.def,
                                     in.leaves, flat_fn<Args...>(f_, in.def));
      auto grads = Sel::build(in.def, r.grads);
      const Out out = unflatten<Out>(r.value);
      if constexpr (Aux && !ValueToo)
        return std::make_pair(std::move(grads), out.second);
      else if constexpr (ValueToo)
        return std::make_pair(out, std::move(grads));
      else
        return grads;
    }
  }

 private:
  F f_;
};

template <class T>
inline constexpr bool is_argnums = false;
template <int... I>
inline constexpr bool is_argnums<Argnums<I...>> = true;

template <bool ValueToo, bool Aux, class F, int... I>
auto grad_with(F f, Argnums<I...>) {
  return Grad<ValueToo, Aux, F, I...>(std::move(f));
}
// grad's options in any order: the first Argnums (default argnums<0>) and has_aux.
template <bool ValueToo, class F, class... Options>
auto make_grad(F f, Options...) {
  static_assert(((is_argnums<Options> || std::is_same_v<Options, HasAux>)&&...),
                "grad: the options are argnums<...> and has_aux");
  using Picked = decltype(std::tuple_cat(
      std::conditional_t<is_argnums<Options>, std::tuple<Options>, std::tuple<>>{}...,
      std::tuple<Argnums<0>>{}));
  return grad_with<ValueToo, (std::is_same_v<Options, HasAux> || ...)>(
      std::move(f), std::tuple_element_t<0, Picked>{});
}

template <class F>
class Vmapped {
 public:
  Vmapped(F f, VmapOptions o) : f_(std::move(f)), o_(std::move(o)) {}

  template <class... Args>
  auto operator()(const Args&... args) const {
    if constexpr (!returns_tree<const F&, Args...>) {
      static_assert(returns_tree<const F&, Args...>, "vmap: " KILN_DETAIL_NOT_TREE_FN);
    } else {
      const FlatTree in = flatten_args(args...);
      return unflatten<result_of<F, Args...>>(
          vmap_call(o_, in.def, in.leaves, flat_fn<Args...>(f_, in.def)));
    }
  }

 private:
  F f_;
  VmapOptions o_;
};

// ---- Jacobians of trees --------------------------------------------------------------------

// The type of a Jacobian: each Tensor of the result type Out replaced by In (the argument
// tree, or a tuple of them). Standard containers keep their shape; a KILN_TREE struct becomes
// a std::map from leaf path to In, since C++ cannot rebuild the struct with other field types.
template <class Out, class In>
struct JacobianTraits {
  static_assert(detail::registered_struct<Out>,
                "jacfwd/jacrev: the result is " KILN_DETAIL_NOT_A_TREE);
  using type = std::map<std::string, In>;
  static type build(const TreeDef& def, const In*& next) {
    type m;
    for (const std::string& path : tree_paths(def)) m.emplace(path, *next++);
    return m;
  }
};
template <class In>
struct JacobianTraits<Tensor, In> {
  using type = In;
  static type build(const TreeDef&, const In*& next) { return *next++; }
};
template <class T, class In>
requires static_leaf<T>
struct JacobianTraits<T, In> {  // a static result stays what it is
  using type = T;
  static type build(const TreeDef& def, const In*&) {
    return tree_unflatten<T>(def, std::span<const Tensor>{});
  }
};
template <class T, class In>
struct JacobianTraits<std::vector<T>, In> {
  using type = std::vector<typename JacobianTraits<T, In>::type>;
  static type build(const TreeDef& def, const In*& next) {
    type v;
    for (const TreeDef& c : def.children) v.push_back(JacobianTraits<T, In>::build(c, next));
    return v;
  }
};
template <class T, std::size_t N, class In>
struct JacobianTraits<std::array<T, N>, In> {
  using type = std::array<typename JacobianTraits<T, In>::type, N>;
  static type build(const TreeDef& def, const In*& next) {
    type a;
    for (std::size_t k = 0; k < N; ++k)
      a[k] = JacobianTraits<T, In>::build(def.children.at(k), next);
    return a;
  }
};
template <class T, class In>
struct JacobianTraits<std::map<std::string, T>, In> {
  using type = std::map<std::string, typename JacobianTraits<T, In>::type>;
  static type build(const TreeDef& def, const In*& next) {
    type m;
    for (std::size_t k = 0; k < def.children.size(); ++k)
      m.emplace(def.names.at(k), JacobianTraits<T, In>::build(def.children[k], next));
    return m;
  }
};
template <class T, class In>
struct JacobianTraits<std::optional<T>, In> {
  using type = std::optional<typename JacobianTraits<T, In>::type>;
  static type build(const TreeDef& def, const In*& next) {
    if (def.children.empty()) return std::nullopt;
    return JacobianTraits<T, In>::build(def.children[0], next);
  }
};
template <class In, class... Ts>
struct JacobianTuple {
  using type = std::tuple<typename JacobianTraits<Ts, In>::type...>;
  static type build(const TreeDef& def, const In*& next) {
    return build_at(def, next, std::index_sequence_for<Ts...>{});
  }
  // Braced initialisation runs left to right, so `next` walks the result leaves in order.
  template <std::size_t... K>
  static type build_at(const TreeDef& def, const In*& next, std::index_sequence<K...>) {
    return type{JacobianTraits<Ts, In>::build(def.children.at(K), next)...};
  }
};
template <class In, class... Ts>
struct JacobianTraits<std::tuple<Ts...>, In> : JacobianTuple<In, Ts...> {};
template <class A, class B, class In>
struct JacobianTraits<std::pair<A, B>, In> {
  using type =
      std::pair<typename JacobianTraits<A, In>::type, typename JacobianTraits<B, In>::type>;
  static type build(const TreeDef& def, const In*& next) {
    auto a = JacobianTraits<A, In>::build(def.children.at(0), next);
    return type{std::move(a), JacobianTraits<B, In>::build(def.children.at(1), next)};
  }
};

template <bool Forward, class F, int... I>
class Jacobian {
 public:
  explicit Jacobian(F f) : f_(std::move(f)) {}

  template <class... Args>
  auto operator()(const Args&... args) const {
    if constexpr (!returns_tree<const F&, Args...>) {
      static_assert(returns_tree<const F&, Args...>, "jacfwd/jacrev: " KILN_DETAIL_NOT_TREE_FN);
    } else if constexpr (!argnums_in_range<sizeof...(Args), I...>) {
      static_assert(argnums_in_range<sizeof...(Args), I...>, KILN_DETAIL_BAD_ARGNUMS);
    } else {
      using Out = result_of<F, Args...>;
      using Sel = SelectedArgs<Argnums<I...>, Args...>;
      using In = typename Sel::type;
      const FlatTree in = flatten_args(args...);
      const FlatFn fn = flat_fn<Args...>(f_, in.def);
      const FlatJacobian j = Forward ? jacfwd_call({I...}, in.def, in.leaves, fn)
                                     : jacrev_call({I...}, in.def, in.leaves, fn);
      // One In per result leaf, from its blocks split by argument.
      const std::vector<LeafRange> ranges = arg_ranges(in.def);
      const std::size_t n = (ranges[I].size() + ...);
      std::vector<In> per_leaf;
      for (std::size_t o = 0; o * n < j.blocks.size(); ++o) {
        std::vector<std::vector<Tensor>> parts;
        std::size_t at = o * n;
        for (const std::size_t k : {ranges[I].size()...}) {
          parts.emplace_back(j.blocks.begin() + static_cast<std::ptrdiff_t>(at),
                             j.blocks.begin() + static_cast<std::ptrdiff_t>(at + k));
          at += k;
        }
        per_leaf.push_back(Sel::build(in.def, parts));
      }
      const In* next = per_leaf.data();
      return JacobianTraits<Out, In>::build(j.out_def, next);
    }
  }

 private:
  F f_;
};

template <bool Forward, class F, int... I>
auto make_jacobian(F f, Argnums<I...>) {
  return Jacobian<Forward, F, I...>(std::move(f));
}

}  // namespace kiln::detail

namespace kiln {

// A jitted function: same call signature as f (trees in, trees out). The first call for each
// abstract signature traces f, optimises the IR and caches an executable; later calls run it.
template <class F>
class Jitted {
 public:
  Jitted(F f, JitOptions options)
      : f_(std::move(f)),
        cache_(detail::make_jit_cache(std::move(options.name), options.backend)) {}

  template <class... Args>
  auto operator()(const Args&... args) const {
    if constexpr (!detail::returns_tree<const F&, Args...>) {
      static_assert(detail::returns_tree<const F&, Args...>, "jit: " KILN_DETAIL_NOT_TREE_FN);
    } else {
      const detail::FlatTree in = detail::flatten_args(args...);
      return detail::unflatten<detail::result_of<F, Args...>>(
          detail::jit_call(*cache_, in.def, in.leaves, detail::flat_fn<Args...>(f_, in.def)));
    }
  }

  // The optimised IR for these arguments (traces if needed).
  template <class... Args>
  ir::Function lower(const Args&... args) const {
    const detail::FlatTree in = detail::flatten_args(args...);
    return detail::jit_lower(*cache_, in.def, in.leaves, detail::flat_fn<Args...>(f_, in.def));
  }

  // What the backend made of it: fused groups, kernel calls, compile time (compiles if needed).
  template <class... Args>
  ir::CompiledInfo compiled(const Args&... args) const {
    const detail::FlatTree in = detail::flatten_args(args...);
    return detail::jit_compiled(*cache_, in.def, in.leaves, detail::flat_fn<Args...>(f_, in.def));
  }

  std::size_t cache_size() const { return detail::jit_cache_size(*cache_); }

 private:
  F f_;
  std::shared_ptr<detail::JitCache> cache_;
};

}  // namespace kiln
