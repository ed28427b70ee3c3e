// Function transformations over trees of tensors: trace and jit (grad, vmap, ... build on the
// same machinery: trace to IR, rewrite, evaluate).
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <variant>
#include <vector>

#include "kiln/ir.h"
#include "kiln/ops.h"
#include "kiln/tree.h"

namespace kiln {

namespace detail {

// Parameter names for the flattened leaves of an argument tuple: "[1].w" -> "w", "[0]" -> "arg0".
std::vector<std::string> param_names(const TreeDef& args_def);

// Flattens an argument list as the tree std::tuple<Args...>, without copying the arguments.
template <class... Args>
std::pair<std::vector<Tensor>, TreeDef> flatten_args(const Args&... args) {
  std::pair<std::vector<Tensor>, TreeDef> out;
  out.second.kind = TreeDef::Kind::tuple;
  auto add = [&](const auto& a) {
    auto [leaves, def] = tree_flatten(a);
    out.first.insert(out.first.end(), leaves.begin(), leaves.end());
    out.second.children.push_back(std::move(def));
  };
  (add(args), ...);
  return out;
}

// The types of the flattened argument leaves; an Error names `op` if one is undefined.
std::vector<TensorType> leaf_types(std::string_view op, const std::vector<Tensor>& leaves);

// Runs body on flat inputs. With no trace active it is traced into one program, pruned of all
// its results do not need (cotangents nobody asked for, forward values the backward pass never
// reads) and evaluated; under a trace it simply records into that trace.
std::vector<Tensor> run_pruned(std::string_view op, const std::vector<Tensor>& inputs,
                               const std::function<std::vector<Tensor>(const std::vector<Tensor>&)>& body);

// f can be called with these arguments and returns a tree of tensors. The transformations
// check it first, so a wrong function gives one static_assert line, not pages of templates.
template <class F, class... Args>
concept returns_tree = std::is_invocable_v<F, const Args&...> &&
                       Tree<std::decay_t<std::invoke_result_t<F, const Args&...>>>;
#define KILN_DETAIL_NOT_TREE_FN \
  "the function must be callable with these arguments and return a tree of tensors (see docs/TREES.md)"

// Traces f(args...) and returns the function plus the structure of its result.
template <class F, class... Args>
struct TraceOf {
  using Result = std::decay_t<std::invoke_result_t<F&, const Args&...>>;
  ir::Traced traced;
  TreeDef out_def;
};

template <class F, class... Args>
TraceOf<F, Args...> trace_tree(F& f, std::string name, const TreeDef& in_def,
                               const std::vector<Tensor>& leaves) {
  using Result = typename TraceOf<F, Args...>::Result;
  static_assert(Tree<Result>, "the function must return a tree of tensors (see docs/TREES.md)");
  const std::vector<TensorType> types = leaf_types(name, leaves);
  TreeDef out_def;
  ir::Traced traced = ir::trace_function(
      std::move(name), types,
      [&](const std::vector<Tensor>& params) {
        auto args = tree_unflatten<std::tuple<std::decay_t<Args>...>>(in_def, params);
        Result out = std::apply(f, args);
        auto [out_leaves, def] = tree_flatten(out);
        out_def = std::move(def);
        return out_leaves;
      },
      param_names(in_def));
  return {std::move(traced), std::move(out_def)};
}

// One compiled specialisation of a jitted function.
struct JitEntry {
  std::shared_ptr<const ir::Function> function;  // optimised
  std::shared_ptr<const ir::Executable> executable;
  TreeDef out_def;
};

// The per-signature cache of a jitted function, shared by its copies; thread-safe. No lock is
// held while user code is traced, so a jitted function may call itself (on other signatures)
// or other jitted functions from any thread.
class JitCache {
 public:
  explicit JitCache(std::string name) : name_(std::move(name)) {}
  // Cache key: argument structure (with static leaves) and each leaf's dtype and shape.
  static std::string key(const TreeDef& def, const std::vector<Tensor>& leaves);
  std::shared_ptr<const JitEntry> find(const std::string& key) const;
  // Before tracing `key` on a miss: waits while another thread traces it and returns that
  // entry, or returns nullptr and this thread traces it, holding the returned claim meanwhile.
  // Recursion on the signature being traced raises an Error (it could never finish).
  class Claim;
  std::shared_ptr<const JitEntry> claim(const std::string& key, std::optional<Claim>& claim);
  // Stores an entry (the first one stored for a key wins); logs why it was needed when
  // KILN_LOG_RECOMPILES=1.
  std::shared_ptr<const JitEntry> insert(const std::string& key, const TreeDef& def,
                                         const std::vector<Tensor>& leaves, JitEntry entry);
  std::size_t size() const;
  const std::string& name() const { return name_; }

 private:
  void release(const std::string& key);

  std::string name_;
  mutable std::mutex mutex_;
  std::condition_variable traced_;  // signalled when a claim ends
  std::unordered_map<std::string, std::shared_ptr<const JitEntry>> entries_;
  std::unordered_map<std::string, std::thread::id> tracing_;  // claimed keys and their thread
  TreeDef last_def_;
  std::vector<TensorType> last_types_;
};

// This thread is tracing one signature of a cache (see JitCache::claim).
class JitCache::Claim {
 public:
  Claim(JitCache& cache, std::string key);
  ~Claim();
  Claim(const Claim&) = delete;
  Claim& operator=(const Claim&) = delete;

 private:
  JitCache& cache_;
  std::string key_;
};

std::shared_ptr<const ir::Function> optimized(const ir::Function& f);

}  // namespace detail

// The IR of f for the abstract types of args (trees of tensors), before optimisation.
template <class F, class... Args>
ir::Function trace(F f, const Args&... args) {
  auto [leaves, def] = detail::flatten_args(args...);
  auto t = detail::trace_tree<F, Args...>(f, "f", def, leaves);
  return *t.traced.function;
}

// A jitted function: same call signature as f (trees in, trees out). The first call for each
// abstract signature traces f, optimises the IR and caches an executable; later calls run it.
template <class F>
class Jitted {
 public:
  Jitted(F f, std::string name) : f_(std::move(f)), cache_(std::make_shared<detail::JitCache>(std::move(name))) {}

  template <class... Args>
  auto operator()(const Args&... args) const {
    if constexpr (!detail::returns_tree<const F&, Args...>)
      static_assert(detail::returns_tree<const F&, Args...>, "jit: " KILN_DETAIL_NOT_TREE_FN);
    else
      return call(args...);
  }

 private:
  template <class... Args>
  auto call(const Args&... args) const {
    using Result = std::decay_t<std::invoke_result_t<F&, const Args&...>>;
    auto [leaves, def] = detail::flatten_args(args...);
    const auto [entry, captures] = specialise<Args...>(def, leaves);
    std::vector<Tensor> outs;
    if (ir::tracing()) {
      // Inside another trace: one `call` equation, so the outer IR keeps the structure.
      std::vector<Tensor> ins = leaves;
      ins.insert(ins.end(), captures.begin(), captures.end());
      outs = kiln::bind(primitive("call"), std::move(ins), {{"fn", FunctionRef(entry->function)}});
    } else {
      outs = entry->executable->run(leaves);
    }
    return tree_unflatten<Result>(entry->out_def, outs);
  }

 public:
  // The optimised IR for these arguments (traces if needed).
  template <class... Args>
  ir::Function lower(const Args&... args) const {
    auto [leaves, def] = detail::flatten_args(args...);
    return *specialise<Args...>(def, leaves).first->function;
  }

  std::size_t cache_size() const { return cache_->size(); }

 private:
  template <class... Args>
  std::pair<std::shared_ptr<const detail::JitEntry>, std::vector<Tensor>> specialise(
      const TreeDef& def, const std::vector<Tensor>& leaves) const {
    const std::string key = detail::JitCache::key(def, leaves);
    if (auto hit = cache_->find(key)) return {hit, {}};
    std::optional<detail::JitCache::Claim> claim;
    if (auto hit = cache_->claim(key, claim)) return {hit, {}};
    auto t = detail::trace_tree<const F, Args...>(f_, cache_->name(), def, leaves);
    detail::JitEntry entry;
    entry.function = detail::optimized(*t.traced.function);
    entry.executable = ir::compile(entry.function);
    entry.out_def = std::move(t.out_def);
    if (!t.traced.captures.empty()) {
      // The function closes over values of an enclosing trace: valid for this trace only.
      return {std::make_shared<const detail::JitEntry>(std::move(entry)), t.traced.captures};
    }
    return {cache_->insert(key, def, leaves, std::move(entry)), {}};
  }

  F f_;
  std::shared_ptr<detail::JitCache> cache_;
};

template <class F>
Jitted<F> jit(F f, std::string name = "jit") {
  return Jitted<F>(std::move(f), std::move(name));
}

// ---- automatic differentiation over IR (src/transforms/ad.cpp) ---------------------------

namespace ad {

struct JvpResult {
  std::vector<Tensor> outputs;
  std::vector<Tangent> tangents;
};
// Forward mode: evaluates f and its directional derivative along `tangents`.
JvpResult jvp(const ir::Function& f, std::span<const Tensor> primals,
              std::span<const Tangent> tangents);

// The reverse pass of one evaluation; holds the values of the forward pass it needs.
class Pullback {
 public:
  // A backward program traced ahead of time: cotangents of f's results in, the non-zero
  // cotangents of f's parameters out (`result_of_param` says which result is whose).
  struct Program {
    std::shared_ptr<const ir::Function> backward;
    std::vector<std::optional<std::size_t>> result_of_param;
  };
  Pullback() = default;
  // Runs f's VJP rules equation by equation over the forward values `env` when called.
  Pullback(std::shared_ptr<const ir::Function> f, std::vector<Tensor> env)
      : f_(std::move(f)), env_(std::move(env)) {}
  Pullback(std::shared_ptr<const ir::Function> f, Program program)
      : f_(std::move(f)), program_(std::move(program)) {}
  // One cotangent per result (nullopt: zero) -> one cotangent per parameter.
  std::vector<Tangent> operator()(std::span<const Tangent> cotangents) const;

 private:
  std::vector<Tangent> run_rules(std::span<const Tangent> cotangents) const;

  std::shared_ptr<const ir::Function> f_;
  std::vector<Tensor> env_;
  std::optional<Program> program_;
};
struct VjpResult {
  std::vector<Tensor> outputs;
  Pullback pullback;
};
// Reverse mode: evaluates f now and returns the pullback.
VjpResult vjp(std::shared_ptr<const ir::Function> f, std::span<const Tensor> primals);
// The same for the public entry points: with no trace active, the backward program is traced
// once here and pruned, so it computes only cotangents that reach a parameter and holds only
// the forward values it reads. (Rules that call vjp inside kernels use the plain form.)
VjpResult vjp_pruned(std::shared_ptr<const ir::Function> f, std::span<const Tensor> primals);

}  // namespace ad

// Which arguments to differentiate: grad(f, argnums<0, 2>). Default: the first.
template <int... I>
struct Argnums {};
template <int... I>
inline constexpr Argnums<I...> argnums{};
// f returns (loss, aux): grad gives (gradient, aux); value_and_grad ((loss, aux), gradient).
struct HasAux {};
inline constexpr HasAux has_aux{};

namespace detail {

// Leaf ranges of each argument in the flattened argument list.
std::vector<std::pair<std::size_t, std::size_t>> arg_ranges(const TreeDef& args_def);
// The cotangent of each leaf, zeros where it is symbolically zero.
std::vector<Tensor> materialize(std::span<const Tangent> ct, std::span<const Tensor> like);
void check_scalar_loss(std::string_view op, const Tensor& loss);

template <bool ValueToo, bool Aux, class F, int... I>
class Grad {
 public:
  explicit Grad(F f) : f_(std::move(f)) {}

  template <class... Args>
  auto operator()(const Args&... args) const {
    if constexpr (!detail::returns_tree<const F&, Args...>)
      static_assert(detail::returns_tree<const F&, Args...>, "grad: " KILN_DETAIL_NOT_TREE_FN);
    else
      return differentiate(args...);
  }

 private:
  template <class... Args>
  auto differentiate(const Args&... args) const {
    using Out = std::decay_t<std::invoke_result_t<const F&, const Args&...>>;
    constexpr const char* op = ValueToo ? "value_and_grad" : "grad";
    const auto flat_args = flatten_args(args...);
    const std::vector<Tensor>& leaves = flat_args.first;
    const TreeDef& def = flat_args.second;
    const auto ranges = arg_ranges(def);
    // One flat program: f's outputs, then the gradient leaves of each requested argument.
    TreeDef out_def;
    std::size_t n_out = 0;
    const std::vector<Tensor> flat = run_pruned(op, leaves, [&](const std::vector<Tensor>& xs) {
      auto t = trace_tree<const F, Args...>(f_, op, def, xs);
      std::vector<Tensor> primals = xs;
      primals.insert(primals.end(), t.traced.captures.begin(), t.traced.captures.end());
      ad::VjpResult r = ad::vjp(t.traced.function, primals);
      check_scalar_loss(op, r.outputs.at(0));
      std::vector<Tangent> seed(r.outputs.size());
      seed[0] = ones_like(r.outputs[0]);
      const std::vector<Tangent> ct = r.pullback(seed);
      out_def = std::move(t.out_def);
      n_out = r.outputs.size();
      std::vector<Tensor> result = std::move(r.outputs);
      for (const auto& [b, e] : {ranges[I]...}) {
        const std::vector<Tensor> g = materialize(std::span(ct).subspan(b, e - b),
                                                  std::span<const Tensor>(xs).subspan(b, e - b));
        result.insert(result.end(), g.begin(), g.end());
      }
      return result;
    });
    std::size_t at = n_out;
    auto grad_of = [&]<int K>() {
      using A = std::decay_t<std::tuple_element_t<K, std::tuple<Args...>>>;
      const auto [b, e] = ranges[K];
      const std::vector<Tensor> g(flat.begin() + static_cast<std::ptrdiff_t>(at),
                                  flat.begin() + static_cast<std::ptrdiff_t>(at + e - b));
      at += e - b;
      return tree_unflatten<A>(def.children[K], g);
    };
    // Braced initialisation evaluates left to right, so `at` walks the arguments in order.
    auto grads = [&] {
      if constexpr (sizeof...(I) == 1) return grad_of.template operator()<I...>();
      else return std::tuple{grad_of.template operator()<I>()...};
    }();
    const Out out = tree_unflatten<Out>(
        out_def, std::vector<Tensor>(flat.begin(), flat.begin() + static_cast<std::ptrdiff_t>(n_out)));
    if constexpr (Aux && ValueToo) {
      return std::make_pair(out, grads);  // ((loss, aux), grads)
    } else if constexpr (Aux) {
      return std::make_pair(grads, out.second);
    } else if constexpr (ValueToo) {
      return std::make_pair(out, grads);
    } else {
      return grads;
    }
  }

 private:
  F f_;
};

}  // namespace detail

// grad(f)(args...): the gradient of a scalar-valued f with respect to its first argument, as
// a tree of that argument's type. grad(f, argnums<0, 2>) gives a tuple, grad(f, has_aux) a
// (gradient, aux) pair for f returning (loss, aux).
template <class F>
auto grad(F f) { return detail::Grad<false, false, F, 0>(std::move(f)); }
template <class F, int... I>
auto grad(F f, Argnums<I...>) { return detail::Grad<false, false, F, I...>(std::move(f)); }
template <class F>
auto grad(F f, HasAux) { return detail::Grad<false, true, F, 0>(std::move(f)); }
template <class F, int... I>
auto grad(F f, Argnums<I...>, HasAux) { return detail::Grad<false, true, F, I...>(std::move(f)); }

// value_and_grad(f)(args...) -> (f(args...), gradient).
template <class F>
auto value_and_grad(F f) { return detail::Grad<true, false, F, 0>(std::move(f)); }
template <class F, int... I>
auto value_and_grad(F f, Argnums<I...>) { return detail::Grad<true, false, F, I...>(std::move(f)); }
template <class F>
auto value_and_grad(F f, HasAux) { return detail::Grad<true, true, F, 0>(std::move(f)); }
template <class F, int... I>
auto value_and_grad(F f, Argnums<I...>, HasAux) {
  return detail::Grad<true, true, F, I...>(std::move(f));
}

// vjp(f, args...) -> (f(args...), pullback); pullback(cotangent of the output) returns a
// tuple with the cotangent of each argument (zeros where there is none).
template <class F, class... Args>
auto vjp(F f, const Args&... args) {
  if constexpr (!detail::returns_tree<F&, Args...>) {
    static_assert(detail::returns_tree<F&, Args...>, "vjp: " KILN_DETAIL_NOT_TREE_FN);
  } else {
  using Out = std::decay_t<std::invoke_result_t<F&, const Args&...>>;
  auto [leaves, def] = detail::flatten_args(args...);
  auto t = detail::trace_tree<F, Args...>(f, "vjp", def, leaves);
  std::vector<Tensor> primals = leaves;
  primals.insert(primals.end(), t.traced.captures.begin(), t.traced.captures.end());
  ad::VjpResult r = ad::vjp_pruned(t.traced.function, primals);
  Out out = tree_unflatten<Out>(t.out_def, r.outputs);
  auto pullback = [r = std::move(r), def = def, leaves = leaves, out_def = t.out_def,
                   n_args = sizeof...(Args)](const Out& cotangent) {
    auto [ct_leaves, ct_def] = tree_flatten(cotangent);
    detail::check_same_structure("vjp", out_def, ct_def, 1);
    const std::vector<Tangent> seed(ct_leaves.begin(), ct_leaves.end());
    const std::vector<Tangent> ct = r.pullback(seed);
    const std::vector<Tensor> g =
        detail::materialize(std::span(ct).first(leaves.size()), leaves);
    (void)n_args;
    return tree_unflatten<std::tuple<std::decay_t<Args>...>>(def, g);
  };
  return std::make_pair(std::move(out), std::move(pullback));
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
  auto [leaves, def] = std::apply([](const auto&... a) { return detail::flatten_args(a...); }, primals);
  auto [tleaves, tdef] = std::apply([](const auto&... a) { return detail::flatten_args(a...); }, tangents);
  detail::check_same_structure("jvp", def, tdef, 2);
  auto t = detail::trace_tree<F, Args...>(f, "jvp", def, leaves);
  std::vector<Tensor> ps = leaves;
  ps.insert(ps.end(), t.traced.captures.begin(), t.traced.captures.end());
  std::vector<Tangent> ts(tleaves.begin(), tleaves.end());
  ts.resize(ps.size());
  ad::JvpResult r = ad::jvp(ir::dce(*t.traced.function), ps, ts);
  const std::vector<Tensor> out_t = detail::materialize(r.tangents, r.outputs);
  return std::make_pair(tree_unflatten<Out>(t.out_def, r.outputs), tree_unflatten<Out>(t.out_def, out_t));
  }
}

namespace detail {

// Traces f for these arguments and applies it as one equation of a higher-order primitive
// (`fn` = the traced function, plus `extra` attributes).
template <class F, class... Args>
auto apply_traced(const char* prim, const char* what, const F& f, Attrs extra, const Args&... args) {
  using Out = std::decay_t<std::invoke_result_t<const F&, const Args&...>>;
  auto [leaves, def] = flatten_args(args...);
  auto t = trace_tree<const F, Args...>(f, what, def, leaves);
  std::vector<Tensor> ins = leaves;
  ins.insert(ins.end(), t.traced.captures.begin(), t.traced.captures.end());
  extra.set("fn", FunctionRef(t.traced.function));
  return tree_unflatten<Out>(t.out_def, kiln::bind(primitive(prim), std::move(ins), extra));
}

// Traces a user's derivative rule; rules may not close over traced values (their extra
// parameters would not line up with the primitive's operands).
template <class R, class... RArgs>
FunctionRef trace_rule(const char* what, const R& rule, const RArgs&... args) {
  auto [leaves, def] = flatten_args(args...);
  auto t = trace_tree<const R, RArgs...>(rule, what, def, leaves);
  if (!t.traced.captures.empty())
    fail(what, "the rule closes over a traced value: got ", t.traced.captures.size(),
         " captured tracer(s), expected a rule that takes what it needs as arguments");
  return t.traced.function;
}

}  // namespace detail

// checkpoint(f): the same function, but reverse mode stores only its inputs and recomputes
// its intermediates during the backward pass (rematerialisation: memory for compute).
template <class F>
auto checkpoint(F f) {
  return [f = std::move(f)](const auto&... args) {
    return detail::apply_traced("checkpoint", "checkpoint", f, {}, args...);
  };
}

namespace detail {

// Stand-ins with the types of a traced function's results (broadcast scalars: no memory),
// to trace a user's rule against.
template <class Out>
Out stand_ins(const TreeDef& def, const std::vector<TensorType>& types) {
  std::vector<Tensor> like;
  for (const TensorType& t : types) like.push_back(broadcast_to(full(Shape{}, 0.0, t.dtype), t.shape));
  return tree_unflatten<Out>(def, like);
}

// custom_jvp / custom_vjp: traces f and the rule, then binds one equation of `prim`.
template <class F, class... Args>
auto apply_custom(const char* prim, const F& f, const auto& trace_user_rule, const Args&... args) {
  using Out = std::decay_t<std::invoke_result_t<const F&, const Args&...>>;
  auto [leaves, def] = flatten_args(args...);
  auto t = trace_tree<const F, Args...>(f, prim, def, leaves);
  if (!t.traced.captures.empty())
    fail(prim, "the function closes over a traced value: got ", t.traced.captures.size(),
         " captured tracer(s), expected a function that takes what it needs as arguments");
  const Out like = stand_ins<Out>(t.out_def, t.traced.function->result_types());
  Attrs attrs = trace_user_rule(like);
  attrs.set("fn", FunctionRef(t.traced.function));
  return tree_unflatten<Out>(t.out_def, kiln::bind(primitive(prim), leaves, attrs));
}

}  // namespace detail

// custom_jvp(f, rule): f with a user-given derivative. rule(primals, tangents) receives two
// std::tuples of f's arguments and returns the output tangent. Reverse mode uses the rule
// too (it is linear in the tangents), so grad sees it.
template <class F, class Rule>
auto custom_jvp(F f, Rule rule) {
  return [f = std::move(f), rule = std::move(rule)](const auto&... args) {
    return detail::apply_custom("custom_jvp", f, [&](const auto&) {
      const auto primals = std::make_tuple(args...);
      const auto tangents = tree_map([](const Tensor& x) { return zeros_like(x); }, primals);
      return Attrs{{"jvp", detail::trace_rule("custom_jvp", rule, primals, tangents)}};
    }, args...);
  };
}

// custom_vjp(f, bwd): f with a user-given reverse rule. bwd(primals, output, cotangent)
// receives a std::tuple of f's arguments, f's output and its cotangent, and returns a
// std::tuple with the cotangent of each argument.
template <class F, class Bwd>
auto custom_vjp(F f, Bwd bwd) {
  return [f = std::move(f), bwd = std::move(bwd)](const auto&... args) {
    return detail::apply_custom("custom_vjp", f, [&](const auto& out) {
      return Attrs{{"bwd", detail::trace_rule("custom_vjp", bwd, std::make_tuple(args...), out, out)}};
    }, args...);
  };
}

// ---- vmap (src/transforms/vmap.cpp) ------------------------------------------------------

namespace batching {
// Evaluates a per-example function on inputs with optional batch axes.
std::vector<Batched> evaluate(const ir::Function& f, std::span<const Batched> args, int64_t size,
                              std::string_view axis_name);
}  // namespace batching

// "Not batched": the argument is the same for every example (broadcast).
struct NotBatched {};
inline constexpr NotBatched none{};

// Batch axes per argument (or per output): an int (negative counts from the end) or `none`.
namespace detail {
inline std::optional<int> axis_of(int a) { return a; }
inline std::optional<int> axis_of(NotBatched) { return std::nullopt; }
}  // namespace detail
// One axis per tensor leaf of an argument, in flatten order (a KILN_TREE struct: its field
// order): in_axes(leaf_axes(none, 0), 0) maps a Params{w, b} with w shared and b batched.
struct LeafAxes {
  std::vector<std::optional<int>> axes;
};
template <class... A>
LeafAxes leaf_axes(A... a) { return {{detail::axis_of(a)...}}; }
// Per argument: one axis for all its leaves, or one per leaf.
using ArgAxes = std::variant<std::optional<int>, LeafAxes>;
struct InAxes {
  std::vector<ArgAxes> axes;
};
struct OutAxes {
  std::vector<std::optional<int>> axes;
};
namespace detail {
inline ArgAxes arg_axes(int a) { return std::optional<int>(a); }
inline ArgAxes arg_axes(NotBatched) { return std::optional<int>(); }
inline ArgAxes arg_axes(LeafAxes l) { return l; }
}  // namespace detail
template <class... A>
InAxes in_axes(A... a) { return {{detail::arg_axes(a)...}}; }
template <class... A>
OutAxes out_axes(A... a) { return {{detail::axis_of(a)...}}; }
// Names the mapped axis, so collectives (psum, pmean, pmax, all_gather, axis_index) inside
// the function can reduce over it.
struct AxisName {
  std::string name;
};
inline AxisName axis_name(std::string name) { return {std::move(name)}; }

namespace detail {

// The named axes of the vmaps being traced or evaluated on this thread, innermost last.
struct AxisScope {
  std::string name;
  int64_t size = 0;
};
class AxisScopeGuard {
 public:
  AxisScopeGuard(std::string name, int64_t size);
  ~AxisScopeGuard();
  AxisScopeGuard(const AxisScopeGuard&) = delete;
  AxisScopeGuard& operator=(const AxisScopeGuard&) = delete;
};
// The innermost axis with this name; an Error naming the axes in scope otherwise.
const AxisScope& find_axis(std::string_view op, const std::string& name);

struct VmapOptions {
  std::optional<InAxes> in;
  std::optional<OutAxes> out;
  std::string name;
  void set(const InAxes& a) { in = a; }
  void set(const OutAxes& a) { out = a; }
  void set(const AxisName& a) { name = a.name; }
};

// Batch axis of each flattened leaf, normalised; and the common batch size.
struct VmapInputs {
  std::vector<std::optional<int>> dims;
  int64_t size = -1;
};
VmapInputs vmap_inputs(const TreeDef& def, const std::vector<Tensor>& leaves,
                       const std::optional<InAxes>& in);
// Per-example stand-ins for tracing (broadcast scalars: no memory).
std::vector<Tensor> example_stand_ins(const std::vector<Tensor>& leaves,
                                         const std::vector<std::optional<int>>& dims);
// Moves each result's batch axis to where out_axes asks (broadcasting unbatched results).
std::vector<Tensor> vmap_outputs(std::vector<Batched> results, int64_t size,
                                 const std::optional<OutAxes>& out);

template <class F>
class Vmapped {
 public:
  Vmapped(F f, VmapOptions o) : f_(std::move(f)), o_(std::move(o)) {}

  template <class... Args>
  auto operator()(const Args&... args) const {
    if constexpr (!detail::returns_tree<const F&, Args...>)
      static_assert(detail::returns_tree<const F&, Args...>, "vmap: " KILN_DETAIL_NOT_TREE_FN);
    else
      return map(args...);
  }

 private:
  template <class... Args>
  auto map(const Args&... args) const {
    using Out = std::decay_t<std::invoke_result_t<const F&, const Args&...>>;
    auto [leaves, def] = flatten_args(args...);
    const VmapInputs in = vmap_inputs(def, leaves, o_.in);
    const int64_t size = in.size < 0 ? 1 : in.size;
    std::optional<TraceOf<const F, Args...>> t;
    {
      AxisScopeGuard scope(o_.name, size);
      t = trace_tree<const F, Args...>(f_, "vmap", def, example_stand_ins(leaves, in.dims));
    }
    std::vector<Batched> ins;
    for (std::size_t i = 0; i < leaves.size(); ++i) ins.push_back({leaves[i], in.dims[i]});
    for (const Tensor& c : t->traced.captures) ins.push_back({c, std::nullopt});
    AxisScopeGuard scope(o_.name, size);
    std::vector<Batched> outs = batching::evaluate(ir::dce(*t->traced.function), ins, size, o_.name);
    return tree_unflatten<Out>(t->out_def, vmap_outputs(std::move(outs), size, o_.out));
  }

 private:
  F f_;
  VmapOptions o_;
};

}  // namespace detail

// vmap(f, in_axes(...), out_axes(...), axis_name("batch")): f written for one example, run
// on a batch. Options may come in any order; by default every argument and result is
// batched along axis 0. An argument mapped with `none` is shared by all examples.
template <class F, class... Options>
auto vmap(F f, Options... options) {
  detail::VmapOptions o;
  (o.set(options), ...);
  return detail::Vmapped<F>(std::move(f), std::move(o));
}

// Collectives over a named vmap axis (the same primitives distributed pmap will use).
Tensor psum(const Tensor& x, const std::string& axis_name, Loc loc = Loc::current());
Tensor pmean(const Tensor& x, const std::string& axis_name, Loc loc = Loc::current());
Tensor pmax(const Tensor& x, const std::string& axis_name, Loc loc = Loc::current());
// Every example's x, stacked along a new leading axis.
Tensor all_gather(const Tensor& x, const std::string& axis_name, Loc loc = Loc::current());
// This example's position along the axis (int32 scalar).
Tensor axis_index(const std::string& axis_name, Loc loc = Loc::current());

namespace detail {
// The standard basis of a tensor type, stacked: [numel, *shape].
Tensor basis(const Tensor& like);
// J as [n, *out] rows (one per input or output basis vector) -> [*out, *in].
Tensor jacobian_layout(const Tensor& rows, const Shape& out, const Shape& in, bool rows_are_inputs);
}  // namespace detail

// Jacobians of a Tensor -> Tensor function, shaped out.shape + in.shape. jacfwd maps jvp
// over the input basis and jacrev maps the pullback over the output basis, both with vmap,
// so the Jacobian is one batched program rather than a loop.
template <class F>
auto jacfwd(F f) {
  return [f](const Tensor& x) {
    const Tensor y = f(x);
    const Tensor cols = vmap([&](const Tensor& e) {
      return jvp(f, std::tuple<Tensor>{x}, std::tuple<Tensor>{e}).second;
    })(detail::basis(x));
    return detail::jacobian_layout(cols, y.shape(), x.shape(), true);
  };
}

template <class F>
auto jacrev(F f) {
  return [f](const Tensor& x) {
    const auto y_pullback = vjp(f, x);
    const Tensor& y = y_pullback.first;
    const auto& pullback = y_pullback.second;
    const Tensor rows = vmap([&](const Tensor& e) { return std::get<0>(pullback(e)); })(detail::basis(y));
    return detail::jacobian_layout(rows, y.shape(), x.shape(), false);
  };
}

// The Hessian of a scalar function of one tensor: jacfwd of jacrev (forward over reverse).
template <class F>
auto hessian(F f) {
  return jacfwd([f](const Tensor& x) { return grad(f)(x); });
}

}  // namespace kiln
