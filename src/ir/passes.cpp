// Optimisation passes, each IR -> IR: dead-code elimination, common-subexpression
// elimination, constant folding and algebraic simplification.
#include "ir/passes.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <unordered_map>

#include "ir/trace.h"
#include "kiln/ir.h"

namespace kiln::ir {

bool swaps_last_two(const std::vector<int64_t>& perm) {
  const auto r = static_cast<int64_t>(perm.size());
  if (r < 2) return false;
  for (int64_t i = 0; i < r - 2; ++i)
    if (perm[static_cast<std::size_t>(i)] != i) return false;
  return perm[static_cast<std::size_t>(r - 2)] == r - 1 &&
         perm[static_cast<std::size_t>(r - 1)] == r - 2;
}

Function without_equations(const Function& f) {
  Function out;
  out.name = f.name;
  out.params = f.params;
  out.param_names = f.param_names;
  out.constants = f.constants;
  out.results = f.results;
  return out;
}

namespace {

// Appends `body`'s equations to `out` with fresh value ids, its parameters bound to `inputs`;
// returns the values of its results. `on_equation` sees each appended equation.
template <typename OnEquation>
std::vector<Value> inline_body(const Function& body, std::span<const Value> inputs, Function& out,
                               int& next_id, OnEquation&& on_equation) {
  std::unordered_map<int, Value> local;
  for (std::size_t i = 0; i < body.params.size(); ++i) local[body.params[i].id] = inputs[i];
  for (const Constant& c : body.constants) {
    const Value v{next_id++, c.value.type};
    out.constants.push_back({v, c.tensor});
    local[c.value.id] = v;
  }
  for (const Equation& be : body.equations) {
    Equation ne = be;
    for (Value& v : ne.inputs) v = local.at(v.id);
    for (Value& v : ne.outputs) {
      const Value fresh{next_id++, v.type};
      local[v.id] = fresh;
      v = fresh;
    }
    on_equation(ne);
    out.equations.push_back(std::move(ne));
  }
  std::vector<Value> results;
  for (const Value& r : body.results) results.push_back(local.at(r.id));
  return results;
}

}  // namespace

Function dce(const Function& f) {
  std::set<int> live;
  for (const Value& v : f.results) live.insert(v.id);
  std::vector<Equation> kept;
  for (auto it = f.equations.rbegin(); it != f.equations.rend(); ++it) {
    bool used = false;
    for (const Value& v : it->outputs) used = used || live.count(v.id);
    if (!used) continue;
    kept.push_back(it->prim->prune ? it->prim->prune(*it, live) : *it);
    for (const Value& v : kept.back().inputs) live.insert(v.id);
  }
  Function out = without_equations(f);
  out.equations.assign(kept.rbegin(), kept.rend());
  out.constants.clear();
  for (const Constant& c : f.constants)
    if (live.count(c.value.id)) out.constants.push_back(c);
  return out;
}

namespace {

// Constants of equal type and bits are one value (so -0 and +0 stay apart): tracing makes a
// fresh constant at every use of a literal, and traces of the same code make equal constants.
// The key is the type and the bytes; large constants get none and are left apart.
std::optional<std::string> constant_key(const Tensor& t) {
  constexpr int64_t kCompareLimit = 4096;
  if (t.numel() > kCompareLimit) return std::nullopt;
  const detail::TracingPaused concrete;  // an outer trace must not record this copy
  const Tensor c = t.contiguous();
  const auto* bytes = static_cast<const char*>(c.raw_data());
  return t.type().to_string() + ":" +
         std::string(bytes, static_cast<std::size_t>(c.numel()) * dtype_size(c.dtype()));
}

}  // namespace

Function cse(const Function& f) {
  // Two equations are the same when primitive, attributes and (renamed) inputs agree, the
  // inputs in either order for a commutative primitive.
  // Random primitives are pure functions of their key, so they may be merged too.
  std::unordered_map<int, Value> rename;
  auto resolve = [&](const Value& v) {
    auto it = rename.find(v.id);
    return it == rename.end() ? v : it->second;
  };
  std::map<std::pair<std::string, std::vector<int>>, std::vector<const Equation*>> seen;
  Function out = without_equations(f);
  out.constants.clear();
  std::map<std::string, Value> constants;
  for (const Constant& c : f.constants) {
    const std::optional<std::string> key = constant_key(c.tensor);
    if (key) {
      const auto [it, fresh] = constants.emplace(*key, c.value);
      if (!fresh) {
        rename[c.value.id] = it->second;
        continue;
      }
    }
    out.constants.push_back(c);
  }
  out.equations.reserve(f.equations.size());  // buckets hold pointers into it
  for (const Equation& e0 : f.equations) {
    Equation e = e0;
    std::vector<int> ids;
    for (Value& v : e.inputs) {
      v = resolve(v);
      ids.push_back(v.id);
    }
    if (ids.size() == 2 && e.prim->algebra.commutative) std::sort(ids.begin(), ids.end());
    auto& bucket = seen[{e.prim->name, ids}];
    const Equation* same = nullptr;
    for (const Equation* prev : bucket)
      if (prev->attrs == e.attrs) same = prev;
    if (same) {
      for (std::size_t k = 0; k < e.outputs.size(); ++k) rename[e.outputs[k].id] = same->outputs[k];
      continue;
    }
    out.equations.push_back(std::move(e));
    bucket.push_back(&out.equations.back());
  }
  for (Value& v : out.results) v = resolve(v);
  return out;
}

namespace {

// Folding never grows the program's constants by much: an output may be as large as the
// inputs together, or small. A broadcast is never folded into a larger constant: it is free
// as a view, and a compiled loop reads a scalar from a register instead of a table.
constexpr int64_t kFoldLimit = 4096;

// When every element of t equals one value, that value.
std::optional<double> uniform_value(const Tensor& t) {
  // Complex constants are never an identity here: their imaginary parts would be dropped.
  if (t.numel() == 0 || t.dtype() == bool_ || is_complex(t.dtype())) return std::nullopt;
  const std::vector<double> v = t.to_vector<double>();
  for (double x : v)
    if (!(x == v[0])) return std::nullopt;
  return v[0];
}

// Tracks which values are constants and which equation defines each value.
class Defs {
 public:
  explicit Defs(const Function& f) {
    for (const Constant& c : f.constants) constants_.emplace(c.value.id, c.tensor);
  }
  const Tensor* constant(const Value& v) const {
    auto it = constants_.find(v.id);
    return it == constants_.end() ? nullptr : &it->second;
  }
  // Seen through broadcasts and reshapes, which AD puts between a seed of ones and its use.
  std::optional<double> uniform(const Value& v) const {
    if (const Tensor* t = constant(v)) return uniform_value(*t);
    const Equation* e = producer(v);
    if (e && e->prim->algebra.reshapes && v.type.shape.numel() > 0) return uniform(e->inputs[0]);
    return std::nullopt;
  }
  void add_constant(const Value& v, const Tensor& t) { constants_.emplace(v.id, t); }
  void define(const Equation& e) {
    for (const Value& v : e.outputs) producer_[v.id] = e;
  }
  const Equation* producer(const Value& v) const {
    auto it = producer_.find(v.id);
    return it == producer_.end() ? nullptr : &it->second;
  }

 private:
  std::unordered_map<int, Tensor> constants_;
  std::unordered_map<int, Equation> producer_;
};

std::vector<int64_t> compose(const std::vector<int64_t>& inner, const std::vector<int64_t>& outer) {
  std::vector<int64_t> p;
  for (int64_t o : outer) p.push_back(inner[static_cast<std::size_t>(o)]);
  return p;
}

bool is_identity(const std::vector<int64_t>& perm) {
  for (std::size_t i = 0; i < perm.size(); ++i)
    if (perm[i] != static_cast<int64_t>(i)) return false;
  return true;
}

}  // namespace

Function fold_constants(const Function& f) {
  // Folding computes: it must not record into a trace that happens to be active (jit compiling
  // a function first called under grad, vmap or an outer jit).
  detail::TracingPaused concrete;
  Defs defs(f);
  Function out = without_equations(f);
  for (const Equation& e : f.equations) {
    bool all_const = !e.inputs.empty();
    int64_t in_size = 0;
    for (const Value& v : e.inputs) {
      all_const = all_const && defs.constant(v) != nullptr;
      in_size += v.type.shape.numel();
    }
    int64_t out_size = 0;
    for (const Value& v : e.outputs) out_size += v.type.shape.numel();
    const bool grows = out_size > in_size;
    if (!all_const || !e.prim->foldable || (grows && out_size > kFoldLimit) ||
        (grows && e.prim->algebra.expands)) {
      out.equations.push_back(e);
      continue;
    }
    std::vector<Tensor> ins;
    for (const Value& v : e.inputs) ins.push_back(*defs.constant(v));
    std::vector<Tensor> vals;
    try {
      vals = bind(*e.prim, ins, e.attrs, Loc{});
    } catch (const Error&) {
      // Leave it for run time, where the error will name the user's line.
      out.equations.push_back(e);
      continue;
    }
    // Tensors are immutable, so a folded view may share its input's storage.
    for (std::size_t k = 0; k < vals.size(); ++k) {
      out.constants.push_back({e.outputs[k], vals[k]});
      defs.add_constant(e.outputs[k], vals[k]);
    }
  }
  return out;
}

// A cond whose branch index is a constant: the chosen branch (clamped, as the kernel does).
const Function* constant_branch(const Equation& e, const Defs& defs) {
  if (!e.prim->algebra.selects_branch || e.inputs.empty()) return nullptr;
  const Tensor* index = defs.constant(e.inputs[0]);
  if (!index) return nullptr;
  int64_t n = 0;
  while (e.attrs.has("branch" + std::to_string(n))) ++n;
  if (n == 0) return nullptr;
  const int64_t k = std::clamp<int64_t>(index->item<int64_t>(), 0, n - 1);
  return e.attrs.get<FunctionRef>("branch" + std::to_string(k)).get();
}

// perm swaps the last two axes of a matmul whose operands have the output's rank.
bool swaps_last_two(const std::vector<int64_t>& perm, const Value& a, const Value& b) {
  const auto r = static_cast<int64_t>(perm.size());
  return a.type.shape.rank() == r && b.type.shape.rank() == r && swaps_last_two(perm);
}

Function simplify(const Function& f) {
  Defs defs(f);
  std::unordered_map<int, int> uses;  // of each value, by later equations and the results
  for (const Equation& e : f.equations)
    for (const Value& v : e.inputs) ++uses[v.id];
  for (const Value& v : f.results) ++uses[v.id];
  std::unordered_map<int, Value> rename;
  auto resolve = [&](const Value& v) {
    auto it = rename.find(v.id);
    return it == rename.end() ? v : it->second;
  };
  Function out = without_equations(f);
  int next_id = f.next_id();
  for (const Equation& e0 : f.equations) {
    Equation e = e0;
    for (Value& v : e.inputs) v = resolve(v);
    const Algebra& alg = e.prim->algebra;
    // A cond on a constant predicate is its chosen branch: inline it with fresh value ids.
    if (const Function* branch = constant_branch(e, defs)) {
      const std::size_t constants = out.constants.size();
      const std::vector<Value> results =
          inline_body(*branch, std::span(e.inputs).subspan(1), out, next_id,
                      [&](const Equation& ne) { defs.define(ne); });
      for (std::size_t c = constants; c < out.constants.size(); ++c)
        defs.add_constant(out.constants[c].value, out.constants[c].tensor);
      for (std::size_t i = 0; i < e.outputs.size(); ++i) rename[e.outputs[i].id] = results[i];
      continue;
    }
    if (e.outputs.empty()) {  // nothing to rewrite (a scan that carries and yields nothing)
      out.equations.push_back(std::move(e));
      continue;
    }
    const Value* a = e.inputs.empty() ? nullptr : &e.inputs[0];
    const Value* b = e.inputs.size() > 1 ? &e.inputs[1] : nullptr;
    auto forward = [&](const Value& to) { rename[e.outputs[0].id] = to; };
    // Only rewrites exact in IEEE arithmetic, signed zeros included: x * 1, 1 * x, x / 1,
    // x + (-0), (-0) + x and x - (+0) are x; x + (+0) is not (it turns -0 into +0).
    const bool floating = is_floating(e.outputs[0].type.dtype);
    auto zero = [&](const Value& v, bool negative) {
      const std::optional<double> u = defs.uniform(v);
      return u == 0.0 && (!floating || std::signbit(*u) == negative);
    };
    auto is = [&](const Value* v, std::optional<double> identity) {
      if (!v || !identity) return false;
      if (*identity == 0.0) return zero(*v, std::signbit(*identity));
      return defs.uniform(*v) == *identity;
    };
    if (b && is(b, alg.right_identity)) {
      forward(*a);
      continue;
    }
    if (b && is(a, alg.left_identity)) {
      forward(*b);
      continue;
    }
    // x * 0 is 0 only when x cannot be inf or NaN: integers and bools.
    if (alg.integer_zero_absorbs && b && !floating &&
        (defs.uniform(*a) == 0.0 || defs.uniform(*b) == 0.0)) {
      const Value& zero = defs.uniform(*a) == 0.0 ? *a : *b;
      forward(zero);
      continue;
    }
    const Equation* pa = a ? defs.producer(*a) : nullptr;
    if (alg.involution && pa && pa->prim == e.prim) {
      forward(pa->inputs[0]);
      continue;
    }
    const std::string perm(alg.permutation_attr);
    if (!perm.empty() && pa && pa->prim == e.prim) {
      const std::vector<int64_t> p = compose(pa->attrs.get_ints(perm), e.attrs.get_ints(perm));
      if (is_identity(p)) {
        forward(pa->inputs[0]);
        continue;
      }
      e.inputs[0] = pa->inputs[0];
      e.attrs.set(perm, p);
    }
    // (A B)^T = B^T A^T when the product has no other use: matmul reads transposed operands
    // in place, so the result comes out contiguous instead of as a transposed view that the
    // next elementwise op walks with a large stride (the weight gradient of x W^T, read by
    // the optimiser update, was 40x slower to walk than a contiguous one).
    if (!perm.empty() && pa && pa->prim->algebra.transposes_as_product && uses[a->id] == 1 &&
        swaps_last_two(e.attrs.get_ints(perm), pa->inputs[0], pa->inputs[1])) {
      auto transposed = [&](const Value& v) {
        std::vector<int64_t> dims = v.type.shape.dims();
        std::swap(dims[dims.size() - 1], dims[dims.size() - 2]);
        Equation t{
            e.prim, e.attrs, {v}, {Value{next_id++, TensorType{v.type.dtype, Shape(dims)}}}, e.loc};
        defs.define(t);
        out.equations.push_back(t);
        return t.outputs[0];
      };
      const Value bt = transposed(pa->inputs[1]);
      const Value at = transposed(pa->inputs[0]);
      Equation m{pa->prim, pa->attrs, {bt, at}, {e.outputs[0]}, e.loc};
      defs.define(m);
      out.equations.push_back(std::move(m));
      continue;
    }
    if (alg.reshapes && pa && pa->prim == e.prim) {
      e.inputs[0] = pa->inputs[0];  // reshape of reshape, broadcast of broadcast: one step
    }
    if (alg.reshapes && e.inputs[0].type == e.outputs[0].type) {
      forward(e.inputs[0]);
      continue;
    }
    defs.define(e);
    out.equations.push_back(std::move(e));
  }
  for (Value& v : out.results) v = resolve(v);
  return out;
}

// Sub-functions (loop bodies, branches, calls) are optimised too; their signatures stay.
// One optimised copy per distinct sub-function, so equations that shared a sub-function still
// share it afterwards (and CSE, which compares attributes, can still merge them).
Function map_sub_functions(const Function& f,
                           const std::function<Function(const Function&)>& pass) {
  Function out = f;
  std::unordered_map<const Function*, FunctionRef> done;
  for (Equation& e : out.equations) {
    Attrs attrs = e.attrs;
    for (const auto& [name, value] : e.attrs.items()) {
      const auto* sub = std::get_if<FunctionRef>(&value);
      if (!sub) continue;
      auto it = done.find(sub->get());
      if (it == done.end())
        it = done.emplace(sub->get(), std::make_shared<const Function>(pass(**sub))).first;
      attrs.set(name, it->second);
    }
    e.attrs = std::move(attrs);
  }
  return out;
}

namespace {

// inline_calls on f's own equations (and the calls within the bodies it inlines).
Function inline_top(const Function& f) {
  Function out = without_equations(f);
  int next_id = f.next_id();
  std::unordered_map<int, Value> rename;
  auto resolve = [&](const Value& v) {
    auto it = rename.find(v.id);
    return it == rename.end() ? v : it->second;
  };
  for (const Equation& e0 : f.equations) {
    Equation e = e0;
    for (Value& v : e.inputs) v = resolve(v);
    // The sub-function the equation computes, when it declares one (Algebra::computes).
    const FunctionRef* body = nullptr;
    for (const std::string_view attr : e.prim->algebra.computes)
      if (!body && e.attrs.has(attr)) body = std::get_if<FunctionRef>(&e.attrs.at(attr));
    if (!body || !*body) {
      out.equations.push_back(std::move(e));
      continue;
    }
    const Function inner = inline_top(**body);
    const std::vector<Value> results = inline_body(inner, e.inputs, out, next_id, [](auto&) {});
    for (std::size_t i = 0; i < e.outputs.size(); ++i) rename[e.outputs[i].id] = results[i];
  }
  for (Value& v : out.results) v = resolve(v);
  return out;
}

}  // namespace

Function inline_calls(const Function& f) { return map_sub_functions(inline_top(f), inline_calls); }

Function optimize(const Function& f) {
  // Each pass can expose work for the others; iterate while the program shrinks. Checkpoint
  // policies first (on live equations), so that the bodies they make are optimised too.
  Function cur = dce(merge_scans(cse(simplify(fold_pad_sums(
      fold_constants(map_sub_functions(apply_checkpoint_policies(dce(f)), optimize)))))));
  for (int round = 0; round < 8; ++round) {
    Function next = dce(merge_scans(cse(simplify(fold_pad_sums(fold_constants(cur))))));
    const bool same = next.equations.size() == cur.equations.size() &&
                      next.constants.size() == cur.constants.size();
    cur = std::move(next);
    if (same) break;
  }
  return cur;
}

}  // namespace kiln::ir
