// Function transformations over trees of tensors: jit, grad, vjp, jvp, vmap, checkpoint,
// custom derivative rules and Jacobians. Each one stages the function to IR through one path
// (kiln/impl/staging.h, docs/DESIGN.md "Staging"), rewrites or interprets it, and returns
// trees of the types the function uses; they nest in any order.
#pragma once

#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <variant>
#include <vector>

#include "kiln/ir.h"
#include "kiln/ops.h"
#include "kiln/tree.h"

namespace kiln {

// ---- options -------------------------------------------------------------------------------

// Which arguments to differentiate: grad(f, argnums<0, 2>). Default: the first.
template <int... I>
struct Argnums {};
template <int... I>
inline constexpr Argnums<I...> argnums{};
// f returns (loss, aux): grad gives (gradient, aux); value_and_grad ((loss, aux), gradient).
struct HasAux {};
inline constexpr HasAux has_aux{};

// "Not batched": the argument is the same for every example (broadcast).
struct NotBatched {};
inline constexpr NotBatched none{};
namespace detail {
inline std::optional<int> axis_of(int a) { return a; }
inline std::optional<int> axis_of(NotBatched) { return std::nullopt; }
inline std::optional<int> axis_of(std::optional<int> a) { return a; }  // chosen at run time
}  // namespace detail
// One axis per tensor leaf of an argument, in flatten order (a KILN_TREE struct: its field
// order): in_axes(leaf_axes(none, 0), 0) maps a Params{w, b} with w shared and b batched.
struct LeafAxes {
  std::vector<std::optional<int>> axes;
};
template <class... A>
LeafAxes leaf_axes(A... a) {
  return {{detail::axis_of(a)...}};
}
// Batch axes per argument: one axis (an int, negative from the end, or `none`) for all its
// leaves, or one per leaf.
using ArgAxes = std::variant<std::optional<int>, LeafAxes>;
struct InAxes {
  std::vector<ArgAxes> axes;
};
// Batch axis of each result.
struct OutAxes {
  std::vector<std::optional<int>> axes;
};
namespace detail {
inline ArgAxes arg_axes(int a) { return std::optional<int>(a); }
inline ArgAxes arg_axes(NotBatched) { return std::optional<int>(); }
inline ArgAxes arg_axes(std::optional<int> a) { return a; }
inline ArgAxes arg_axes(LeafAxes l) { return l; }
}  // namespace detail
template <class... A>
InAxes in_axes(A... a) {
  return {{detail::arg_axes(a)...}};
}
template <class... A>
OutAxes out_axes(A... a) {
  return {{detail::axis_of(a)...}};
}
// Names the mapped axis, so collectives (psum, pmean, pmax, pmin, all_gather, axis_index,
// ppermute, all_to_all, psum_scatter) inside the function can communicate over it.
struct AxisName {
  std::string name;
};
inline AxisName axis_name(std::string name) { return {std::move(name)}; }

// jit's options: the name its IR and logs show, and the backend (unset: KILN_JIT_BACKEND,
// else LLVM; ir::Backend::interpreter runs the optimised IR equation by equation).
struct JitOptions {
  std::string name = "jit";
  std::optional<ir::Backend> backend;
};

// What checkpoint(f, policy)'s backward pass recomputes (JAX's checkpoint policies). Without a
// policy it recomputes everything and stores only f's inputs. With one, it recomputes the
// results of the primitives named in `recompute`, stores every other value it reads from the
// forward pass, except layout ops and cheap arithmetic, which it always redoes from what it
// has. {"all_gather"} is FSDP's choice for sharded weights: activations are kept, gathered
// weights are gathered again. A collective's name also covers what it becomes across
// processes (psum: process_all_reduce). The policy is applied when jit optimises the program;
// eager reverse mode, and a checkpoint inside a scan's body, recompute everything.
struct CheckpointPolicy {
  std::vector<std::string> recompute;
};

}  // namespace kiln

// ---- backends ------------------------------------------------------------------------------

namespace kiln::ir {
// KILN_JIT_BACKEND=interpreter|llvm, read at each call; llvm when unset.
Backend default_backend();
struct CompileOptions {
  std::optional<Backend> backend;  // unset: default_backend()
};
// An optimised function as native code (the LLVM backend, src/compiler/) or as the
// interpreter's walk over its equations (the reference the compiler is tested against).
std::shared_ptr<const Executable> compile(std::shared_ptr<const Function> f,
                                          const CompileOptions& options = {});
}  // namespace kiln::ir

#include "kiln/impl/transforms.h"

namespace kiln {

// ---- staging and jit -----------------------------------------------------------------------

// The IR of f for the abstract types of args (trees of tensors), before optimisation. (A
// Tensor first is the matrix trace, kiln/indexing.h.)
template <class F, class... Args>
requires(!std::same_as<F, Tensor>) ir::Function trace(F f, const Args&... args) {
  const detail::FlatTree in = detail::flatten_args(args...);
  return *detail::stage("f", in.def, in.leaves, detail::flat_fn<Args...>(f, in.def)).function;
}

// jit(f): a Jitted<F> with f's call signature. The first call for each abstract signature
// (argument structure, static leaves, dtypes and shapes) traces f, optimises the IR and
// compiles it to native code (docs/DESIGN.md, "Compiler"); later calls run that. Inside
// another trace it becomes one `call` equation.
template <class F>
Jitted<F> jit(F f, JitOptions options = {}) {
  return Jitted<F>(std::move(f), std::move(options));
}
template <class F>
Jitted<F> jit(F f, std::string name) {
  return Jitted<F>(std::move(f), JitOptions{.name = std::move(name)});
}

// ---- reverse and forward mode --------------------------------------------------------------

// grad(f)(args...): the gradient of a scalar-valued f with respect to its first argument, as
// a tree of that argument's type. Options, in any order: argnums<0, 2> (a tuple of gradients)
// and has_aux (f returns (loss, aux); grad gives (gradient, aux)).
template <class F, class... Options>
auto grad(F f, Options... options) {
  return detail::make_grad<false>(std::move(f), options...);
}

// value_and_grad(f, options...)(args...) -> (f(args...), gradient).
template <class F, class... Options>
auto value_and_grad(F f, Options... options) {
  return detail::make_grad<true>(std::move(f), options...);
}

// vjp(f, args...) -> (f(args...), pullback); pullback(cotangent of the output) returns a
// tuple with the cotangent of each argument (zeros where there is none).
template <class F, class... Args>
auto vjp(F f, const Args&... args) {
  if constexpr (!detail::returns_tree<F&, Args...>) {
    static_assert(detail::returns_tree<F&, Args...>, "vjp: " KILN_DETAIL_NOT_TREE_FN);
  } else {
    using Out = std::decay_t<std::invoke_result_t<F&, const Args&...>>;
    const detail::FlatTree in = detail::flatten_args(args...);
    detail::VjpFlat r = detail::vjp_call(in.def, in.leaves, detail::flat_fn<Args...>(f, in.def));
    auto pullback = [p = std::move(r.pullback), def = in.def](const Out& cotangent) {
      const auto [leaves, ct_def] = tree_flatten(cotangent);
      return tree_unflatten<std::tuple<std::decay_t<Args>...>>(def, p(leaves, ct_def));
    };
    return std::make_pair(detail::unflatten<Out>(r.out), std::move(pullback));
  }
}

// jvp(f, primals, tangents): primals and tangents are tuples of f's arguments (trees of the
// same structure). Returns (f(primals...), the output tangent).
template <class F, class... Args>
auto jvp(F f, const std::tuple<Args...>& primals, const std::tuple<Args...>& tangents) {
  if constexpr (!detail::returns_tree<F&, Args...>) {
    static_assert(detail::returns_tree<F&, Args...>, "jvp: " KILN_DETAIL_NOT_TREE_FN);
  } else {
    using Out = std::decay_t<std::invoke_result_t<F&, const Args&...>>;
    auto flat = [](const auto&... a) { return detail::flatten_args(a...); };
    const detail::FlatTree p = std::apply(flat, primals), t = std::apply(flat, tangents);
    const detail::JvpFlat r =
        detail::jvp_call(p.def, p.leaves, t.def, t.leaves, detail::flat_fn<Args...>(f, p.def));
    return std::make_pair(detail::unflatten<Out>(r.out),
                          tree_unflatten<Out>(r.out.def, r.tangents));
  }
}

// checkpoint(f): the same function, but reverse mode stores only its inputs and recomputes
// its intermediates during the backward pass (rematerialisation: memory for compute).
// checkpoint(f, policy) chooses what is recomputed (JAX's checkpoint policies): see
// CheckpointPolicy.
template <class F>
auto checkpoint(F f, std::optional<CheckpointPolicy> policy = std::nullopt) {
  return [f = std::move(f), policy = std::move(policy)](const auto&... args) {
    using Out = detail::result_of<F, decltype(args)...>;
    const detail::FlatTree in = detail::flatten_args(args...);
    return detail::unflatten<Out>(detail::checkpoint_call(
        in.def, in.leaves, detail::flat_fn<decltype(args)...>(f, in.def), policy));
  };
}

// custom_jvp(f, rule): f with a user-given derivative. rule(primals, tangents) receives two
// std::tuples of f's arguments and returns the output tangent. Reverse mode uses the rule
// too (it is linear in the tangents), so grad sees it.
template <class F, class Rule>
auto custom_jvp(F f, Rule rule) {
  return [f = std::move(f), rule = std::move(rule)](const auto&... args) {
    using Args = std::tuple<std::decay_t<decltype(args)>...>;
    const detail::FlatTree in = detail::flatten_args(args...);
    return detail::unflatten<detail::result_of<F, decltype(args)...>>(detail::custom_jvp_call(
        in.def, in.leaves, detail::flat_fn<decltype(args)...>(f, in.def),
        [&](const TreeDef& d) { return detail::flat_fn<Args, Args>(rule, d); }));
  };
}

// custom_vjp(f, bwd): f with a user-given reverse rule. bwd(primals, output, cotangent)
// receives a std::tuple of f's arguments, f's output and its cotangent, and returns a
// std::tuple with the cotangent of each argument. (For residuals saved by a forward rule, use
// the three-argument form below.)
template <class F, class Bwd>
auto custom_vjp(F f, Bwd bwd) {
  return [f = std::move(f), bwd = std::move(bwd)](const auto&... args) {
    using Args = std::tuple<std::decay_t<decltype(args)>...>;
    using Out = detail::result_of<F, decltype(args)...>;
    const detail::FlatTree in = detail::flatten_args(args...);
    return detail::unflatten<Out>(detail::custom_vjp_call(
        in.def, in.leaves, detail::flat_fn<decltype(args)...>(f, in.def),
        [&](const TreeDef& d) { return detail::flat_fn<Args, Out, Out>(bwd, d); }));
  };
}

// custom_vjp(f, fwd, bwd): the residual form, JAX's f.defvjp(fwd, bwd). fwd(args...) returns
// a std::pair (or two-element std::tuple) (output, residuals) with f's output and any tree of
// tensors to save; bwd(residuals, cotangent) returns a std::tuple with the cotangent of each
// argument. fwd runs once, in the forward pass, and reverse mode keeps its residuals (they are
// not recomputed); f gives the output's structure and types. Differentiating the backward pass
// again (grad of grad) differentiates bwd, and fwd for the residuals, by ordinary reverse mode.
template <class F, class Fwd, class Bwd>
auto custom_vjp(F f, Fwd fwd, Bwd bwd) {
  return [f = std::move(f), fwd = std::move(fwd), bwd = std::move(bwd)](const auto&... args) {
    using Out = detail::result_of<F, decltype(args)...>;
    using FwdOut = detail::result_of<Fwd, decltype(args)...>;
    if constexpr (!detail::output_and_residuals<FwdOut, Out>) {
      static_assert(detail::output_and_residuals<FwdOut, Out>,
                    "custom_vjp: fwd must return a std::pair (output of f, residuals)");
    } else {
      using Res = std::decay_t<std::tuple_element_t<1, FwdOut>>;
      const detail::FlatTree in = detail::flatten_args(args...);
      return detail::unflatten<Out>(detail::custom_vjp_call(
          in.def, in.leaves, detail::flat_fn<decltype(args)...>(f, in.def),
          detail::flat_fn<decltype(args)...>(fwd, in.def),
          [&](const TreeDef& d) { return detail::flat_fn<Res, Out>(bwd, d); }));
    }
  };
}

// ---- vmap ----------------------------------------------------------------------------------

// vmap(f, in_axes(...), out_axes(...), axis_name("batch")): f written for one example, run
// on a batch. Options may come in any order; by default every argument and result is
// batched along axis 0. An argument mapped with `none` is shared by all examples.
template <class F, class... Options>
auto vmap(F f, Options... options) {
  return detail::Vmapped<F>(std::move(f), detail::vmap_options(options...));
}

// Collectives over a named vmap axis of size N, called per example inside the vmap (JAX's
// semantics, non-tiled forms); each one's transpose is a collective too.
// The sum (mean, max, min) of x over all examples.
Tensor psum(const Tensor& x, const std::string& axis_name, Loc loc = Loc::current());
Tensor pmean(const Tensor& x, const std::string& axis_name, Loc loc = Loc::current());
Tensor pmax(const Tensor& x, const std::string& axis_name, Loc loc = Loc::current());
Tensor pmin(const Tensor& x, const std::string& axis_name, Loc loc = Loc::current());
// Every example's x, stacked along a new leading axis.
Tensor all_gather(const Tensor& x, const std::string& axis_name, Loc loc = Loc::current());
// This example's position along the axis (int32 scalar).
Tensor axis_index(const std::string& axis_name, Loc loc = Loc::current());
// For each (source, dest) pair, example dest gets example source's x; others get zeros.
Tensor ppermute(const Tensor& x, const std::string& axis_name,
                const std::vector<std::pair<int64_t, int64_t>>& perm, Loc loc = Loc::current());
// Example i's result at j along concat_axis is example j's x at i along split_axis (size N).
Tensor all_to_all(const Tensor& x, const std::string& axis_name, int64_t split_axis,
                  int64_t concat_axis, Loc loc = Loc::current());
// Example i gets the sum over examples of x at index i along scatter_dimension (size N).
Tensor psum_scatter(const Tensor& x, const std::string& axis_name, int64_t scatter_dimension = 0,
                    Loc loc = Loc::current());

// Several named axes taken as one (JAX's tuple of axis names), the first the major: over
// axis_names("data", "model") the examples are those of the whole grid, the one at (i, j) in
// position i·N_model + j. psum, pmean, pmax, pmin, all_gather, axis_index and psum_scatter
// take it; each is the one-axis collective applied axis by axis.
struct AxisNames {
  std::vector<std::string> names;
  AxisNames() = default;
  explicit AxisNames(std::vector<std::string> n) : names(std::move(n)) {}
  // So that psum(x, {"a", "b"}) is ambiguous (a compile error) instead of a std::string made
  // from two pointers.
  AxisNames(std::initializer_list<std::string> n) : names(n) {}
};
template <class... S>
AxisNames axis_names(S... names) {
  return AxisNames(std::vector<std::string>{std::string(std::move(names))...});
}
Tensor psum(const Tensor& x, const AxisNames& axes, Loc loc = Loc::current());
Tensor pmean(const Tensor& x, const AxisNames& axes, Loc loc = Loc::current());
Tensor pmax(const Tensor& x, const AxisNames& axes, Loc loc = Loc::current());
Tensor pmin(const Tensor& x, const AxisNames& axes, Loc loc = Loc::current());
Tensor all_gather(const Tensor& x, const AxisNames& axes, Loc loc = Loc::current());
Tensor axis_index(const AxisNames& axes, Loc loc = Loc::current());
Tensor psum_scatter(const Tensor& x, const AxisNames& axes, int64_t scatter_dimension = 0,
                    Loc loc = Loc::current());

// ---- Jacobians -----------------------------------------------------------------------------

// jacfwd(f, argnums<...>)(args...) and jacrev(...): the Jacobian of f with respect to the
// arguments in argnums (default: the first), which may be trees. The result has f's result
// structure with each tensor replaced by the argument tree (a tuple of them for several
// argnums) whose leaves hold the blocks d(result) / d(leaf), shaped result.shape + leaf.shape;
// a KILN_TREE struct result becomes a std::map from leaf path (".w") to that tree. For a
// Tensor -> Tensor function that is one tensor, shaped out.shape + in.shape. jacfwd maps jvp
// over the input basis and jacrev the pullback over the output basis, both with vmap, so each
// is one batched program rather than a loop.
template <class F, class A = Argnums<0>>
auto jacfwd(F f, A a = {}) {
  return detail::make_jacobian<true>(std::move(f), a);
}
template <class F, class A = Argnums<0>>
auto jacrev(F f, A a = {}) {
  return detail::make_jacobian<false>(std::move(f), a);
}

// The Hessian of a scalar function: jacfwd of grad (forward over reverse), over the same
// argnums; for a parameter struct P it is a std::map from leaf path to P.
template <class F, class A = Argnums<0>>
auto hessian(F f, A a = {}) {
  return jacfwd(grad(std::move(f), a), a);
}

}  // namespace kiln
