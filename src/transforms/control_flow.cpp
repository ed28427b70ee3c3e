// Structured control flow (docs/CONTROL_FLOW.md): the eager paths of cond / while_loop / scan,
// and the higher-order primitives they record under a trace, each with its type rule,
// interpreter kernel, derivative rules and batching rule in one place.
//
//   cond {branch0, ..., branchN}            (index: i32[], operands...) -> results
//   while {cond_fn, body_fn}                 (carry..., captures...) -> carry
//   scan {body, length, reverse, num_carry, num_xs}
//                                            (carry..., xs..., captures...) -> (carry..., ys...)
//   while_grad {cond_fn, body_fn, pullback_fn}
//                                            (carry..., captures..., ct_final...)
//                                            -> (ct_carry..., ct_captures...)
//
// Sub-functions take the primitive's operands in order (for scan: carry, one slice of each
// xs, captures) and, for while, cond_fn and body_fn share one operand layout.
#include "kiln/control_flow.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>

#include "core/interrupt.h"
#include "ir/partial_eval.h"
#include "ops/primitives.h"
#include "ops/rules.h"
#include "transforms/core.h"

namespace kiln {
namespace {

using Tensors = std::vector<Tensor>;
using TypeList = std::vector<TensorType>;
using Idx = std::vector<std::size_t>;

using detail::types_of;
Tensors sub(std::span<const Tensor> v, std::size_t b, std::size_t n) {
  return Tensors(v.begin() + static_cast<std::ptrdiff_t>(b),
                 v.begin() + static_cast<std::ptrdiff_t>(b + n));
}
void append(Tensors& a, std::span<const Tensor> b) { a.insert(a.end(), b.begin(), b.end()); }
Tensor or_zero(const Tangent& t, const TensorType& type) { return t ? *t : ops::zeros_of(type); }
// Indices (relative to b) of the floating entries of types[b, b+n): those carry derivatives.
Idx floating(const TypeList& types, std::size_t b, std::size_t n) {
  Idx r;
  for (std::size_t i = 0; i < n; ++i)
    if (is_floating(types[b + i].dtype)) r.push_back(i);
  return r;
}
TensorType unstacked(const TensorType& t) {
  std::vector<int64_t> d = t.shape.dims();
  d.erase(d.begin());
  return {t.dtype, Shape(d)};
}
TensorType stacked(const TensorType& t, int64_t n) {
  std::vector<int64_t> d{n};
  d.insert(d.end(), t.shape.begin(), t.shape.end());
  return {t.dtype, Shape(d)};
}

// A sub-function built by a rule. Rules only pass tensors in as parameters, so nothing of an
// enclosing trace can be captured; a capture would be a bug in the rule.
FunctionRef closed(const std::string& name, const TypeList& types,
                   const std::function<Tensors(const Tensors&)>& body) {
  ir::Traced t = ir::trace_function(name, types, body);
  if (!t.captures.empty())
    fail("control_flow", "internal error: the rule-built sub-function @", name, " captured ",
         t.captures.size(), " traced value(s), expected none");
  return t.function;
}

// fn (params: explicit..., own captures...) as a function of the shared layout
// (explicit..., all captures...), where its own captures sit at [cap_at, cap_at + n_caps).
FunctionRef relayout(const FunctionRef& fn, const TypeList& all, std::size_t n_explicit,
                     std::size_t cap_at, std::size_t n_caps) {
  if (fn->params.size() == all.size() && cap_at == n_explicit) return fn;
  return closed(fn->name, all, [&](const Tensors& p) {
    Tensors args = sub(p, 0, n_explicit);
    append(args, sub(p, cap_at, n_caps));
    return ir::evaluate(*fn, args);
  });
}

std::string bname(std::size_t k) { return "branch" + std::to_string(k); }
std::size_t num_branches(const Attrs& a) {
  std::size_t n = 0;
  while (a.has(bname(n))) ++n;
  return n;
}
std::size_t clamp_index(const Tensor& idx, std::size_t n) {
  const int64_t i = idx.item<int32_t>();
  return static_cast<std::size_t>(std::clamp<int64_t>(i, 0, static_cast<int64_t>(n) - 1));
}

std::string path_at(const std::vector<std::string>& paths, std::size_t i) {
  if (i >= paths.size() || paths[i].empty()) return "(root)";
  return paths[i];
}

// Errors for sub-functions whose results must agree in structure and leaf types.
void check_same_tree(std::string_view op, const std::string& what, const TreeDef& want_def,
                     const TypeList& want, const std::string& want_name, const TreeDef& got_def,
                     const TypeList& got, const std::string& got_name) {
  if (auto d = first_difference(want_def, got_def))
    fail(op, what, " differ in structure: ", want_name, " vs ", got_name, " at ", *d, " (got ",
         got_def.to_string(), " from ", got_name, ", expected ", want_def.to_string(), ")");
  const std::vector<std::string> paths = tree_paths(want_def);
  for (std::size_t i = 0; i < want.size() && i < got.size(); ++i)
    if (want[i] != got[i])
      fail(op, what, " differ in type at leaf ", path_at(paths, i), ": got ", got[i], " from ",
           got_name, ", expected ", want[i], " (as ", want_name, ")");
}

// ---- cond --------------------------------------------------------------------------------

TypeList cond_types(ops::Types in, const Attrs& a) {
  if (in.empty() || in[0].dtype != int32 || in[0].shape.rank() != 0)
    fail("cond", "the branch index must be an int32 scalar: got ",
         in.empty() ? std::string("no operands") : ops::types_str(in.first(1)), ", expected i32[]");
  const std::size_t n = num_branches(a);
  if (n == 0) fail("cond", "no branches: got no 'branch0' attribute, expected at least one");
  const TypeList ops(in.begin() + 1, in.end());
  TypeList out;
  for (std::size_t k = 0; k < n; ++k) {
    const FunctionRef& fn = a.get<FunctionRef>(bname(k));
    if (fn->param_types() != ops)
      fail("cond", "operands do not match branch ", k, " @", fn->name, ": got ",
           ops::types_str(ops), ", expected ", ops::types_str(fn->param_types()));
    const TypeList r = fn->result_types();
    if (k == 0)
      out = r;
    else if (r != out)
      fail("cond", "branch ", k, " returns ", ops::types_str(r), ", expected ", ops::types_str(out),
           " (what branch 0 returns)");
  }
  return out;
}

ops::Ts cond_jvp(const RuleArgs& r, std::span<const Tangent> t) {
  const std::size_t n = num_branches(r.attrs), nops = r.inputs.size() - 1;
  const Tensors ops = sub(r.inputs, 1, nops);
  const TypeList op_t = types_of(ops), out_t = types_of(r.outputs);
  const Idx fo = floating(op_t, 0, nops), fr = floating(out_t, 0, out_t.size());
  ops::Ts result(r.outputs.size());
  if (fr.empty()) return result;
  TypeList params = op_t;
  for (std::size_t i : fo) params.push_back(op_t[i]);
  Attrs a;
  for (std::size_t k = 0; k < n; ++k) {
    const FunctionRef fn = r.attrs.get<FunctionRef>(bname(k));
    a.set(bname(k), closed(fn->name + "_jvp", params, [&](const Tensors& p) {
            ops::Ts tan(nops);
            for (std::size_t j = 0; j < fo.size(); ++j) tan[fo[j]] = p[nops + j];
            const ad::JvpResult res = ad::jvp(*fn, sub(p, 0, nops), tan);
            Tensors out;
            for (std::size_t i : fr) out.push_back(or_zero(res.tangents[i], out_t[i]));
            return out;
          }));
  }
  Tensors ins{r.inputs[0]};
  append(ins, ops);
  for (std::size_t i : fo) ins.push_back(or_zero(t[1 + i], op_t[i]));
  const Tensors outs = bind(r.primitive, ins, a);
  for (std::size_t j = 0; j < fr.size(); ++j) result[fr[j]] = outs[j];
  return result;
}

// A cond over the branches' pullbacks: each recomputes its forward pass and pulls back.
ops::Ts cond_vjp(const RuleArgs& r, std::span<const Tangent> ct) {
  const std::size_t n = num_branches(r.attrs), nops = r.inputs.size() - 1;
  const Tensors ops = sub(r.inputs, 1, nops);
  const TypeList op_t = types_of(ops), out_t = types_of(r.outputs);
  const Idx fo = floating(op_t, 0, nops), fr = floating(out_t, 0, out_t.size());
  ops::Ts result(r.inputs.size());
  if (fo.empty() || fr.empty()) return result;
  TypeList params = op_t;
  for (std::size_t i : fr) params.push_back(out_t[i]);
  Attrs a;
  for (std::size_t k = 0; k < n; ++k) {
    const FunctionRef fn = r.attrs.get<FunctionRef>(bname(k));
    a.set(bname(k), closed(fn->name + "_vjp", params, [&](const Tensors& p) {
            ops::Ts cts(out_t.size());
            for (std::size_t j = 0; j < fr.size(); ++j) cts[fr[j]] = p[nops + j];
            const ops::Ts g = ad::vjp(fn, sub(p, 0, nops)).pullback(cts);
            Tensors out;
            for (std::size_t i : fo) out.push_back(or_zero(g[i], op_t[i]));
            return out;
          }));
  }
  Tensors ins{r.inputs[0]};
  append(ins, ops);
  for (std::size_t i : fr) ins.push_back(or_zero(ct[i], out_t[i]));
  const Tensors outs = bind(r.primitive, ins, a);
  for (std::size_t j = 0; j < fo.size(); ++j) result[1 + fo[j]] = outs[j];
  return result;
}

// Per-example results of fn on batched operands, each with its batch axis in front.
Tensors batch_apply(const ir::Function& fn, std::span<const Tensor> ins,
                    std::span<const std::optional<int>> dims, int64_t size, std::string_view axis) {
  std::vector<Batched> args;
  for (std::size_t i = 0; i < ins.size(); ++i) args.push_back({ins[i], dims[i]});
  Tensors out;
  for (const Batched& o : batching::evaluate(fn, args, size, axis))
    out.push_back(ops::batch_first(o.value, o.dim, size));
  return out;
}
// A [B] mask shaped to broadcast against a [B, ...] tensor of rank `rank`.
Tensor mask_for(const Tensor& m, int rank) {
  std::vector<int64_t> d{m.shape()[0]};
  d.resize(static_cast<std::size_t>(std::max(rank, 1)), 1);
  return reshape(m, Shape(d));
}

std::vector<Batched> cond_batch(const BatchArgs& b) {
  const std::size_t n = num_branches(b.attrs), nops = b.inputs.size() - 1;
  const Tensors ops = sub(b.inputs, 1, nops);
  const std::vector<std::optional<int>> dims(b.dims.begin() + 1, b.dims.end());
  const std::string axis(b.axis_name);
  std::vector<Batched> out;
  if (!b.dims[0]) {
    // Shared predicate: a real cond over batched branches.
    Attrs a = b.attrs;
    for (std::size_t k = 0; k < n; ++k) {
      const FunctionRef fn = b.attrs.get<FunctionRef>(bname(k));
      a.set(bname(k), closed(fn->name, types_of(ops), [&](const Tensors& p) {
              return batch_apply(*fn, p, dims, b.size, axis);
            }));
    }
    Tensors ins{b.inputs[0]};
    append(ins, ops);
    for (Tensor& t : bind(b.primitive, ins, a)) out.push_back({std::move(t), 0});
    return out;
  }
  // Per-example predicate: every branch runs, and each example selects its own. select's
  // VJP routes a zero cotangent to the branch not taken.
  const Tensor idx = ops::batch_first(b.inputs[0], b.dims[0], b.size);
  Tensors acc = batch_apply(*b.attrs.get<FunctionRef>(bname(0)), ops, dims, b.size, axis);
  for (std::size_t k = 1; k < n; ++k) {
    const Tensors rk = batch_apply(*b.attrs.get<FunctionRef>(bname(k)), ops, dims, b.size, axis);
    const Tensor m = k + 1 == n ? idx >= static_cast<int>(k) : idx == static_cast<int>(k);
    for (std::size_t i = 0; i < acc.size(); ++i)
      acc[i] = where(mask_for(m, acc[i].rank()), rk[i], acc[i]);
  }
  for (Tensor& t : acc) out.push_back({std::move(t), 0});
  return out;
}

// Variadic registrations need one input; a primitive that can take none (scan) gets a
// zero-input registration too.
std::vector<KernelRegistration> interpreter_kernels(Kernel k, bool nullary = false) {
  std::vector<KernelRegistration> r{{ops::cpu_variadic(DTypeSet::all()), k}};
  if (nullary)
    r.push_back({KernelSignature{.device = Device::cpu, .inputs = {}, .variadic = false}, k});
  return r;
}

}  // namespace

const Primitive& prim::cond() {
  static const Primitive& p =
      detail::register_builtin({.name = "cond",
                                .arity = 1,
                                .variadic = true,
                                .type_rule = cond_types,
                                .jvp = cond_jvp,
                                .vjp = cond_vjp,
                                .batch = cond_batch,
                                .algebra = {.selects_branch = true}},
                               interpreter_kernels([](ops::Ins in, const Attrs& a) {
                                 const std::size_t k = clamp_index(in[0], num_branches(a));
                                 return ir::evaluate(*a.get<FunctionRef>(bname(k)), in.subspan(1));
                               }));
  return p;
}

namespace {

// ---- while -------------------------------------------------------------------------------

std::size_t while_carry(const Attrs& a) { return a.get<FunctionRef>("body_fn")->results.size(); }

TypeList while_types(ops::Types in, const Attrs& a) {
  const FunctionRef& c = a.get<FunctionRef>("cond_fn");
  const FunctionRef& b = a.get<FunctionRef>("body_fn");
  const TypeList all(in.begin(), in.end());
  if (c->param_types() != all || b->param_types() != all)
    fail("while", "operands do not match @", c->name, " / @", b->name, ": got ",
         ops::types_str(all), ", expected ", ops::types_str(c->param_types()), " and ",
         ops::types_str(b->param_types()));
  const TypeList cr = c->result_types();
  if (cr.size() != 1 || cr[0] != TensorType{bool_, Shape{}})
    fail("while", "cond_fn must return one bool scalar: got ", ops::types_str(cr),
         ", expected (bool[])");
  const TypeList br = b->result_types();
  if (br.size() > all.size())
    fail("while", "body_fn returns ", br.size(), " values: got ", ops::types_str(br),
         ", expected at most the ", all.size(), " operands");
  for (std::size_t i = 0; i < br.size(); ++i)
    if (br[i] != all[i])
      fail("while", "body_fn changes the type of carry ", i, ": got ", br[i], ", expected ",
           all[i]);
  return br;
}

Tensors while_run(const ir::Function& c, const ir::Function& b, Tensors carry, ops::Ins caps,
                  std::vector<Tensors>* stack) {
  const std::size_t nc = carry.size();
  Tensors args = carry;
  append(args, caps);
  while (ir::evaluate(c, args)[0].item<bool>()) {
    detail::check_interrupt("while");  // the interpreter's loops stop as the compiled ones do
    if (stack) stack->push_back(sub(args, 0, nc));
    Tensors next = ir::evaluate(b, args);
    std::copy(next.begin(), next.end(), args.begin());
  }
  return sub(args, 0, nc);
}

// Forward mode: one while over (carry, carry tangents) whose body is the JVP of the body.
ops::Ts while_jvp(const RuleArgs& r, std::span<const Tangent> t) {
  const FunctionRef cf = r.attrs.get<FunctionRef>("cond_fn");
  const FunctionRef bf = r.attrs.get<FunctionRef>("body_fn");
  const std::size_t n = r.inputs.size(), nc = bf->results.size(), ncap = n - nc;
  const TypeList in_t = types_of(r.inputs);
  const Idx fc = floating(in_t, 0, nc), fk = floating(in_t, nc, ncap);
  ops::Ts result(nc);
  if (fc.empty()) return result;
  // Layout: carry, carry tangents, captures, capture tangents.
  TypeList params(in_t.begin(), in_t.begin() + static_cast<std::ptrdiff_t>(nc));
  for (std::size_t i : fc) params.push_back(in_t[i]);
  params.insert(params.end(), in_t.begin() + static_cast<std::ptrdiff_t>(nc), in_t.end());
  for (std::size_t i : fk) params.push_back(in_t[nc + i]);
  auto unpack = [&](const Tensors& p, Tensors& prim, ops::Ts& tan) {
    prim = sub(p, 0, nc);
    append(prim, sub(p, nc + fc.size(), ncap));
    tan.assign(n, std::nullopt);
    for (std::size_t j = 0; j < fc.size(); ++j) tan[fc[j]] = p[nc + j];
    for (std::size_t j = 0; j < fk.size(); ++j) tan[nc + fk[j]] = p[nc + fc.size() + ncap + j];
  };
  Attrs a;
  a.set("cond_fn", closed(cf->name + "_jvp", params, [&](const Tensors& p) {
          Tensors prim;
          ops::Ts tan;
          unpack(p, prim, tan);
          return ir::evaluate(*cf, prim);
        }));
  a.set("body_fn", closed(bf->name + "_jvp", params, [&](const Tensors& p) {
          Tensors prim;
          ops::Ts tan;
          unpack(p, prim, tan);
          const ad::JvpResult res = ad::jvp(*bf, prim, tan);
          Tensors out = res.outputs;
          for (std::size_t i : fc) out.push_back(or_zero(res.tangents[i], in_t[i]));
          return out;
        }));
  Tensors ins = sub(r.inputs, 0, nc);
  for (std::size_t i : fc) ins.push_back(or_zero(t[i], in_t[i]));
  append(ins, sub(r.inputs, nc, ncap));
  for (std::size_t i : fk) ins.push_back(or_zero(t[nc + i], in_t[nc + i]));
  const Tensors outs = bind(r.primitive, ins, a);
  for (std::size_t j = 0; j < fc.size(); ++j) result[fc[j]] = outs[nc + j];
  return result;
}

// The body's pullback as a function: (carry..., captures..., ct_next_carry...) ->
// (ct_carry..., ct_captures...), zeros where the body passes none. Staged once, so while_grad's
// backward walk evaluates it at every step (compiled, inside compiled code) instead of
// differentiating the body again at every step.
FunctionRef body_pullback(const FunctionRef& bf) {
  const TypeList params = bf->param_types();
  const std::size_t np = params.size(), nc = bf->results.size();
  TypeList types = params;
  types.insert(types.end(), params.begin(), params.begin() + static_cast<std::ptrdiff_t>(nc));
  return closed(bf->name + "_pullback", types, [&](const Tensors& p) {
    const Tensors args(p.begin(), p.begin() + static_cast<std::ptrdiff_t>(np));
    const ops::Ts ct(p.begin() + static_cast<std::ptrdiff_t>(np), p.end());
    const ops::Ts g = ad::vjp(bf, args).pullback(ct);
    Tensors out;
    for (std::size_t i = 0; i < np; ++i)
      out.push_back(g[i] ? *g[i] : zeros(params[i].shape, params[i].dtype));
    return out;
  });
}

// Reverse mode: while_grad runs the loop again keeping every iteration's carry on a stack
// (its length is only known at run time), then walks it backwards through the body's pullback.
ops::Ts while_vjp(const RuleArgs& r, std::span<const Tangent> ct) {
  const std::size_t n = r.inputs.size(), nc = r.outputs.size();
  const TypeList in_t = types_of(r.inputs);
  Tensors ins(r.inputs.begin(), r.inputs.end());
  for (std::size_t i = 0; i < nc; ++i) ins.push_back(or_zero(ct[i], in_t[i]));
  Attrs a;
  a.set("cond_fn", r.attrs.get<FunctionRef>("cond_fn"));
  a.set("body_fn", r.attrs.get<FunctionRef>("body_fn"));
  a.set("pullback_fn", body_pullback(r.attrs.get<FunctionRef>("body_fn")));
  const Tensors outs = bind(prim::while_grad(), ins, a);
  ops::Ts result(n);
  for (std::size_t i = 0; i < n; ++i)
    if (is_floating(in_t[i].dtype)) result[i] = outs[i];
  return result;
}

// vmap: every carry gets the batch axis in front. A shared predicate keeps the loop as it
// is; a per-example predicate runs until every example is done, and an example that is done
// keeps its carry (a select on its own predicate).
std::vector<Batched> while_batch(const BatchArgs& b) {
  const FunctionRef cf = b.attrs.get<FunctionRef>("cond_fn");
  const FunctionRef bf = b.attrs.get<FunctionRef>("body_fn");
  const std::size_t n = b.inputs.size(), nc = bf->results.size();
  Tensors ins;
  std::vector<std::optional<int>> dims;
  for (std::size_t i = 0; i < n; ++i) {
    if (i < nc) {
      ins.push_back(ops::batch_first(b.inputs[i], b.dims[i], b.size));
      dims.push_back(0);
    } else {
      ins.push_back(b.inputs[i]);
      dims.push_back(b.dims[i]);
    }
  }
  const std::string axis(b.axis_name);
  auto pred = [&](const Tensors& p) {
    std::vector<Batched> args;
    for (std::size_t i = 0; i < n; ++i) args.push_back({p[i], dims[i]});
    return batching::evaluate(*cf, args, b.size, axis)[0];
  };
  bool per_example = false;
  Attrs a;
  a.set("cond_fn", closed(cf->name, types_of(ins), [&](const Tensors& p) {
          const Batched c = pred(p);
          per_example = c.dim.has_value();
          return Tensors{per_example ? any(c.value) : c.value};
        }));
  a.set("body_fn", closed(bf->name, types_of(ins), [&](const Tensors& p) {
          Tensors next = batch_apply(*bf, p, dims, b.size, axis);
          if (per_example) {
            const Batched c = pred(p);
            const Tensor m = ops::batch_first(c.value, c.dim, b.size);
            for (std::size_t i = 0; i < nc; ++i)
              next[i] = where(mask_for(m, next[i].rank()), next[i], p[i]);
          }
          return next;
        }));
  std::vector<Batched> out;
  for (Tensor& t : bind(b.primitive, ins, a)) out.push_back({std::move(t), 0});
  return out;
}

Tensors while_kernel(ops::Ins in, const Attrs& a) {
  const std::size_t nc = while_carry(a);
  return while_run(*a.get<FunctionRef>("cond_fn"), *a.get<FunctionRef>("body_fn"), sub(in, 0, nc),
                   in.subspan(nc), nullptr);
}

}  // namespace

const Primitive& prim::while_() {
  static const Primitive& p = detail::register_builtin({.name = "while",
                                                        .arity = 1,
                                                        .variadic = true,
                                                        .type_rule = while_types,
                                                        .jvp = while_jvp,
                                                        .vjp = while_vjp,
                                                        .batch = while_batch},
                                                       interpreter_kernels(while_kernel));
  return p;
}

namespace {

// while_grad's result written with while loops only: count the iterations, then, from the
// last one back, recompute that iteration's carry from the start and pull the cotangent back
// through the body. O(n²) body evaluations instead of a stack, but every step is ordinary IR
// of primitives with rules, so it differentiates again: this is what while_grad's own JVP and
// VJP differentiate (second and higher order through a data-dependent loop).
Tensors while_grad_recompute(const FunctionRef& cf, const FunctionRef& bf,
                             std::span<const Tensor> in) {
  const std::size_t np = bf->params.size(), nc = bf->results.size(), ncap = np - nc;
  const Tensors carry0 = sub(in, 0, nc), caps = sub(in, nc, ncap), ct0 = sub(in, np, nc);
  auto with_caps = [&](Tensors c) {
    append(c, caps);
    return c;
  };
  auto pred = [&](const Tensors& c) { return ir::evaluate(*cf, with_caps(c))[0]; };
  // [carry..., counter] -> one more iteration.
  auto step = [&](const Tensors& s) {
    Tensors next = ir::evaluate(*bf, with_caps(sub(s, 0, nc)));
    next.push_back(s[nc] + 1);
    return next;
  };
  Tensors counted = carry0;
  counted.push_back(zeros({}, int32));
  const Tensor n =
      while_loop([&](const Tensors& s) { return pred(sub(s, 0, nc)); }, step, counted)[nc];
  // [j, ct_carry..., ct_caps...]: iteration n-1-j pulled back at step j.
  Tensors state{zeros({}, int32)};
  append(state, ct0);
  for (const Tensor& c : caps) state.push_back(ops::zeros_of(c.type()));
  state = while_loop([&](const Tensors& s) { return s[0] < n; },
                     [&](const Tensors& s) {
                       const Tensor i = n - 1 - s[0];
                       Tensors c = carry0;
                       c.push_back(zeros({}, int32));
                       c = while_loop([&](const Tensors& t) { return t[nc] < i; }, step, c);
                       const Tensors ct = sub(s, 1, nc);
                       const std::vector<Tangent> g =
                           ad::vjp(bf, with_caps(sub(c, 0, nc)))
                               .pullback(std::vector<Tangent>(ct.begin(), ct.end()));
                       Tensors next{s[0] + 1};
                       for (std::size_t k = 0; k < nc; ++k)
                         next.push_back(g[k] ? *g[k] : ops::zeros_of(carry0[k].type()));
                       for (std::size_t k = 0; k < ncap; ++k)
                         next.push_back(g[nc + k] ? s[1 + nc + k] + *g[nc + k] : s[1 + nc + k]);
                       return next;
                     },
                     state);
  return sub(state, 1, nc + ncap);
}

// The recomputing form of one while_grad application, as a function to differentiate.
std::shared_ptr<ir::Function> while_grad_as_ir(const RuleArgs& r) {
  const FunctionRef cf = r.attrs.get<FunctionRef>("cond_fn"),
                    bf = r.attrs.get<FunctionRef>("body_fn");
  return ir::trace_function(
             "while_grad", types_of(r.inputs),
             [&](const Tensors& params) { return while_grad_recompute(cf, bf, params); })
      .function;
}

// while_grad {cond_fn, body_fn}: (carry..., captures..., ct_final...) -> (ct_carry...,
// ct_captures...)
TypeList while_grad_types(ops::Types in, const Attrs& a) {
  const FunctionRef& b = a.get<FunctionRef>("body_fn");
  const std::size_t np = b->params.size(), nc = b->results.size();
  if (in.size() != np + nc)
    fail("while_grad", "expected the loop's ", np, " operands and ", nc, " cotangents: got ",
         in.size(), " inputs");
  const TypeList fwd(in.begin(), in.begin() + static_cast<std::ptrdiff_t>(np));
  while_types(fwd, a);
  for (std::size_t i = 0; i < nc; ++i)
    if (in[np + i] != in[i])
      fail("while_grad", "cotangent ", i, " has the wrong type: got ", in[np + i], ", expected ",
           in[i]);
  return fwd;
}

// The interpreter: the loop again with every carry on a stack, then the body's pullback
// (`pullback_fn`, or staged here when the equation has none) backwards.
Tensors while_grad_kernel(ops::Ins in, const Attrs& a) {
  const FunctionRef& cf = a.get<FunctionRef>("cond_fn");
  const FunctionRef& bf = a.get<FunctionRef>("body_fn");
  const FunctionRef pull =
      a.has("pullback_fn") ? a.get<FunctionRef>("pullback_fn") : body_pullback(bf);
  const std::size_t np = bf->params.size(), nc = bf->results.size(), ncap = np - nc;
  const Tensors caps = sub(in, nc, ncap);
  std::vector<Tensors> stack;
  while_run(*cf, *bf, sub(in, 0, nc), caps, &stack);
  const TypeList in_t = types_of(in);
  Tensors ct(in.begin() + static_cast<std::ptrdiff_t>(np), in.end());
  ops::Ts ct_caps(ncap);
  for (auto it = stack.rbegin(); it != stack.rend(); ++it) {
    Tensors args = *it;
    append(args, caps);
    append(args, ct);
    const Tensors g = ir::evaluate(*pull, args);
    for (std::size_t i = 0; i < nc; ++i) ct[i] = g[i];
    for (std::size_t i = 0; i < ncap; ++i)
      ct_caps[i] = ct_caps[i] ? add(*ct_caps[i], g[nc + i]) : g[nc + i];
  }
  Tensors out = ct;
  for (std::size_t i = 0; i < ncap; ++i)
    out.push_back(ct_caps[i] ? *ct_caps[i] : zeros(in_t[nc + i].shape, in_t[nc + i].dtype));
  return out;
}

}  // namespace

const Primitive& prim::while_grad() {
  static const Primitive& p = detail::register_builtin(
      {.name = "while_grad",
       .arity = 1,
       .variadic = true,
       .type_rule = while_grad_types,
       // Its own derivatives differentiate the stack-free recomputing form (second order and up).
       .jvp = [](const RuleArgs& r, std::span<const Tangent> t) -> std::vector<Tangent> {
         return ad::jvp(*while_grad_as_ir(r), r.inputs, t).tangents;
       },
       .vjp = [](const RuleArgs& r, std::span<const Tangent> ct) -> std::vector<Tangent> {
         return ad::vjp(while_grad_as_ir(r), r.inputs).pullback(ct);
       },
       .batch = ops::batch_by_loop},
      interpreter_kernels(while_grad_kernel));
  return p;
}

namespace {

// ---- scan --------------------------------------------------------------------------------

// A scan without the ys nobody reads, and then without the xs and captures its body no longer
// reads; carries stay (each step reads the last). The body is pruned the same way.
ir::Equation prune_scan(const ir::Equation& e, const std::set<int>& live) {
  using ir::Equation;
  using ir::Function;
  using ir::Value;
  const auto nc = static_cast<std::size_t>(e.attrs.get_int("num_carry"));
  const auto nx = static_cast<std::size_t>(e.attrs.get_int("num_xs"));
  Function body = *e.attrs.get<FunctionRef>("body");
  Equation out = e;
  out.outputs.resize(nc);
  body.results.resize(nc);
  for (std::size_t k = nc; k < e.outputs.size(); ++k)
    if (live.count(e.outputs[k].id)) {
      out.outputs.push_back(e.outputs[k]);
      body.results.push_back(e.attrs.get<FunctionRef>("body")->results[k]);
    }
  body = ir::dce(body);
  std::set<int> read;
  for (const Equation& b : body.equations)
    for (const Value& v : b.inputs) read.insert(v.id);
  for (const Value& v : body.results) read.insert(v.id);
  const std::vector<Value> params = body.params;
  const std::vector<std::string> names = body.param_names;
  body.params.clear();
  body.param_names.clear();
  out.inputs.clear();
  std::size_t kept_xs = 0;
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (i >= nc && !read.count(params[i].id)) continue;
    body.params.push_back(params[i]);
    if (i < names.size()) body.param_names.push_back(names[i]);
    out.inputs.push_back(e.inputs[i]);
    kept_xs += i >= nc && i < nc + nx;
  }
  // Unchanged: keep the body shared (CSE compares sub-functions by identity).
  if (out.inputs.size() == e.inputs.size() && out.outputs.size() == e.outputs.size()) return e;
  out.attrs.set("body", std::make_shared<const Function>(std::move(body)));
  out.attrs.set("num_xs", static_cast<int64_t>(kept_xs));
  return out;
}

struct ScanLayout {
  std::size_t nc, nx, ncap;
  int64_t length;
  bool reverse;
};
ScanLayout scan_layout(std::size_t n_in, const Attrs& a) {
  ScanLayout l;
  l.nc = static_cast<std::size_t>(a.get_int("num_carry"));
  l.nx = static_cast<std::size_t>(a.get_int("num_xs"));
  if (l.nc + l.nx > n_in)
    fail("scan", "num_carry + num_xs exceed the operands: got ", l.nc, " + ", l.nx, " for ", n_in,
         " operands");
  l.ncap = n_in - l.nc - l.nx;
  l.length = a.get_int("length");
  if (l.length < 0) fail("scan", "negative length: got ", l.length, ", expected >= 0");
  l.reverse = a.get_bool("reverse");
  return l;
}

TypeList scan_types(ops::Types in, const Attrs& a) {
  const ScanLayout l = scan_layout(in.size(), a);
  const FunctionRef& body = a.get<FunctionRef>("body");
  const TypeList p = body->param_types();
  if (p.size() != in.size())
    fail("scan", "@", body->name, " takes ", p.size(), " parameters: got ", in.size(), " operands");
  for (std::size_t i = 0; i < in.size(); ++i) {
    const bool x = i >= l.nc && i < l.nc + l.nx;
    const TensorType want = x ? stacked(p[i], l.length) : p[i];
    if (in[i] != want)
      fail("scan", x ? "xs " : "operand ", x ? i - l.nc : i, " does not match @", body->name,
           ": got ", in[i], ", expected ", want);
  }
  const TypeList r = body->result_types();
  if (r.size() < l.nc)
    fail("scan", "@", body->name, " returns ", r.size(), " values, expected at least ", l.nc);
  TypeList out;
  for (std::size_t i = 0; i < r.size(); ++i) {
    if (i < l.nc && r[i] != in[i])
      fail("scan", "the body changes the type of carry ", i, ": got ", r[i], ", expected ", in[i]);
    out.push_back(i < l.nc ? r[i] : stacked(r[i], l.length));
  }
  return out;
}

// The interpreter: xs are sliced natively, ys stacked at the end. With `residuals`, also
// stacks each step's incoming carry (what reverse mode needs).
Tensors scan_run(const ir::Function& body, const ScanLayout& l, ops::Ins in, bool residuals) {
  Tensors carry = sub(in, 0, l.nc);
  const TypeList rt = body.result_types();
  const std::size_t ny = rt.size() - l.nc;
  const std::size_t nstack = ny + (residuals ? l.nc : 0);
  std::vector<Tensors> ys(nstack);  // sized below: with nothing stacked, length is just a count
  for (Tensors& y : ys) y.resize(static_cast<std::size_t>(l.length));
  for (int64_t t = 0; t < l.length; ++t) {
    const int64_t i = l.reverse ? l.length - 1 - t : t;
    Tensors args = carry;
    for (std::size_t k = 0; k < l.nx; ++k) args.push_back(index(in[l.nc + k], i));
    append(args, in.subspan(l.nc + l.nx));
    Tensors out = ir::evaluate(body, args);
    const auto ii = static_cast<std::size_t>(i);
    for (std::size_t k = 0; k < ny; ++k) ys[k][ii] = out[l.nc + k];
    if (residuals)
      for (std::size_t k = 0; k < l.nc; ++k) ys[ny + k][ii] = carry[k];
    carry.assign(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(l.nc));
  }
  Tensors result = carry;
  for (std::size_t k = 0; k < nstack; ++k) {
    const TensorType yt = k < ny ? rt[l.nc + k] : in[k - ny].type();
    result.push_back(l.length == 0 ? zeros(stacked(yt, 0).shape, yt.dtype) : stack(ys[k], 0));
  }
  return result;
}

Attrs scan_attrs(FunctionRef body, int64_t length, bool reverse, std::size_t nc, std::size_t nx) {
  Attrs a;
  a.set("body", std::move(body));
  a.set("length", length);
  a.set("reverse", reverse);
  a.set("num_carry", static_cast<int64_t>(nc));
  a.set("num_xs", static_cast<int64_t>(nx));
  return a;
}

// Forward mode: a scan over (carry, carry tangents) with (xs, xs tangents) whose body is the
// JVP of the body.
ops::Ts scan_jvp(const RuleArgs& r, std::span<const Tangent> t) {
  const FunctionRef body = r.attrs.get<FunctionRef>("body");
  const ScanLayout l = scan_layout(r.inputs.size(), r.attrs);
  const std::size_t n = r.inputs.size(), ny = r.outputs.size() - l.nc;
  const TypeList in_t = types_of(r.inputs), p_t = body->param_types(), r_t = body->result_types();
  const Idx fc = floating(in_t, 0, l.nc), fx = floating(in_t, l.nc, l.nx),
            fk = floating(in_t, l.nc + l.nx, l.ncap), fy = floating(r_t, l.nc, ny);
  ops::Ts result(r.outputs.size());
  if (fc.empty() && fy.empty()) return result;
  // Layout: carry, carry tangents | xs, xs tangents | captures, capture tangents.
  const std::size_t c0 = 0, ct0 = l.nc, x0 = ct0 + fc.size(), xt0 = x0 + l.nx, k0 = xt0 + fx.size(),
                    kt0 = k0 + l.ncap;
  TypeList params;
  auto add_group = [&](std::size_t b, std::size_t cnt, const Idx& f) {
    for (std::size_t i = 0; i < cnt; ++i) params.push_back(p_t[b + i]);
    for (std::size_t i : f) params.push_back(p_t[b + i]);
  };
  add_group(0, l.nc, fc);
  add_group(l.nc, l.nx, fx);
  add_group(l.nc + l.nx, l.ncap, fk);
  FunctionRef fn = closed(body->name + "_jvp", params, [&](const Tensors& p) {
    Tensors prim = sub(p, c0, l.nc);
    append(prim, sub(p, x0, l.nx));
    append(prim, sub(p, k0, l.ncap));
    ops::Ts tan(n);
    for (std::size_t j = 0; j < fc.size(); ++j) tan[fc[j]] = p[ct0 + j];
    for (std::size_t j = 0; j < fx.size(); ++j) tan[l.nc + fx[j]] = p[xt0 + j];
    for (std::size_t j = 0; j < fk.size(); ++j) tan[l.nc + l.nx + fk[j]] = p[kt0 + j];
    const ad::JvpResult res = ad::jvp(*body, prim, tan);
    Tensors out = sub(res.outputs, 0, l.nc);
    for (std::size_t i : fc) out.push_back(or_zero(res.tangents[i], r_t[i]));
    append(out, sub(res.outputs, l.nc, ny));
    for (std::size_t i : fy) out.push_back(or_zero(res.tangents[l.nc + i], r_t[l.nc + i]));
    return out;
  });
  Tensors ins = sub(r.inputs, 0, l.nc);
  for (std::size_t i : fc) ins.push_back(or_zero(t[i], in_t[i]));
  append(ins, sub(r.inputs, l.nc, l.nx));
  for (std::size_t i : fx) ins.push_back(or_zero(t[l.nc + i], in_t[l.nc + i]));
  append(ins, sub(r.inputs, l.nc + l.nx, l.ncap));
  for (std::size_t i : fk) ins.push_back(or_zero(t[l.nc + l.nx + i], in_t[l.nc + l.nx + i]));
  const Tensors outs = bind(
      r.primitive, ins, scan_attrs(fn, l.length, l.reverse, l.nc + fc.size(), l.nx + fx.size()));
  for (std::size_t j = 0; j < fc.size(); ++j) result[fc[j]] = outs[l.nc + j];
  const std::size_t yt0 = l.nc + fc.size() + ny;
  for (std::size_t j = 0; j < fy.size(); ++j) result[l.nc + fy[j]] = outs[yt0 + j];
  return result;
}

// Residuals the forward scan computes anyway, so that they are not stacked a second time:
// a residual equal to one of the body's ys is read from the stacked ys, and one equal to a
// next carry whose incoming value is stacked (rc) is carried through the backward scan.
struct ResidualReuse {
  ir::Function forward;                           // without the reused residuals among its results
  std::map<std::size_t, std::size_t> as_ys;       // residual -> ys index
  std::map<std::size_t, std::size_t> next_carry;  // residual -> position in rc
  std::map<std::size_t, std::size_t> stacked;     // residual -> position among stacked ones
};
ResidualReuse reuse_residuals(const ir::Function& fwd, std::size_t nc, std::size_t ny,
                              const Idx& rc, std::size_t num_residuals) {
  ResidualReuse r;
  const std::size_t res0 = nc + ny + rc.size();
  std::vector<ir::Value> kept(fwd.results.begin(),
                              fwd.results.begin() + static_cast<std::ptrdiff_t>(res0));
  auto position = [&](const ir::Value& v, std::size_t from, std::size_t to) {
    std::optional<std::size_t> found;
    for (std::size_t i = from; i < to && !found; ++i)
      if (fwd.results[i] == v) found = i;
    return found;
  };
  std::vector<bool> carried(nc, false);
  for (std::size_t k = 0; k < num_residuals; ++k) {
    const ir::Value& v = fwd.results[res0 + k];
    if (const auto y = position(v, nc, nc + ny)) {
      r.as_ys[k] = *y - nc;
      continue;
    }
    const auto c = std::ranges::find_if(rc, [&](std::size_t i) { return fwd.results[i] == v; });
    if (c != rc.end() && !carried[*c]) {
      carried[*c] = true;
      r.next_carry[k] = static_cast<std::size_t>(c - rc.begin());
      continue;
    }
    r.stacked[k] = kept.size() - res0;
    kept.push_back(v);
  }
  r.forward = fwd;
  r.forward.results = std::move(kept);
  r.forward = ir::dce(r.forward);
  return r;
}

// Reverse mode: the per-step backward body (the body's VJP) split by what is known before
// any cotangent exists (ir::split_known, docs/DESIGN.md "Reverse mode through scan stores
// residuals"). A forward scan runs the body and the known part, stacking the residuals (and
// the incoming carries the rest reads) as extra ys; a scan in the opposite direction runs
// the unknown part, carrying the carry's cotangent and the captures' accumulated cotangents.
// Both are scans, so this differentiates again.
ops::Ts scan_vjp(const RuleArgs& r, std::span<const Tangent> ct) {
  const FunctionRef body = r.attrs.get<FunctionRef>("body");
  const ScanLayout l = scan_layout(r.inputs.size(), r.attrs);
  const std::size_t n = r.inputs.size(), ny = r.outputs.size() - l.nc;
  const TypeList in_t = types_of(r.inputs), p_t = body->param_types(), r_t = body->result_types();
  const TypeList out_t = types_of(r.outputs);
  const Idx fc = floating(in_t, 0, l.nc), fx = floating(in_t, l.nc, l.nx),
            fk = floating(in_t, l.nc + l.nx, l.ncap), fy = floating(r_t, l.nc, ny);
  ops::Ts result(n);
  if (fc.empty() && fx.empty() && fk.empty()) return result;
  // 1. One backward step. Parameters: carry cotangents, capture cotangents (the backward
  // scan's carry); the step's carry and xs; ys cotangents; captures.
  TypeList params;
  for (std::size_t i : fc) params.push_back(in_t[i]);
  for (std::size_t i : fk) params.push_back(in_t[l.nc + l.nx + i]);
  for (std::size_t i = 0; i < l.nc; ++i) params.push_back(p_t[i]);
  for (std::size_t i = 0; i < l.nx; ++i) params.push_back(p_t[l.nc + i]);
  for (std::size_t i : fy) params.push_back(r_t[l.nc + i]);
  for (std::size_t i = 0; i < l.ncap; ++i) params.push_back(p_t[l.nc + l.nx + i]);
  const std::size_t nbc = fc.size() + fk.size(), at_x = nbc + l.nc, at_y = at_x + l.nx,
                    at_k = at_y + fy.size();
  FunctionRef step = closed(body->name + "_bwd", params, [&](const Tensors& p) {
    Tensors prim = sub(p, nbc, l.nc + l.nx);
    ops::Ts cts(l.nc + ny);
    for (std::size_t j = 0; j < fc.size(); ++j) cts[fc[j]] = p[j];
    for (std::size_t j = 0; j < fy.size(); ++j) cts[l.nc + fy[j]] = p[at_y + j];
    append(prim, sub(p, at_k, l.ncap));
    const ops::Ts g = ad::vjp(body, prim).pullback(cts);
    Tensors out;
    for (std::size_t i : fc) out.push_back(or_zero(g[i], in_t[i]));
    for (std::size_t j = 0; j < fk.size(); ++j) {
      const Tangent& gk = g[l.nc + l.nx + fk[j]];
      out.push_back(gk ? add(p[fc.size() + j], *gk) : p[fc.size() + j]);
    }
    for (std::size_t i : fx) out.push_back(or_zero(g[l.nc + i], p_t[l.nc + i]));
    return out;
  });
  // Known: the step's carry, xs slice and captures — the forward body's own parameters.
  std::vector<bool> known(params.size(), false);
  for (std::size_t i = nbc; i < at_y; ++i) known[i] = true;
  for (std::size_t i = at_k; i < params.size(); ++i) known[i] = true;
  const ir::KnownSplit split = ir::split_known(*step, known);
  const std::vector<bool> reads = ir::params_read(*split.unknown);
  auto read = [&](std::size_t from, std::size_t count) {
    Idx r;
    for (std::size_t i = 0; i < count; ++i)
      if (reads[from + i]) r.push_back(i);
    return r;
  };
  const Idx rc = read(nbc, l.nc), rx = read(at_x, l.nx), ry = read(at_y, fy.size()),
            rk = read(at_k, l.ncap);
  // 2. Forward, with the carries the backward reads and the residuals as extra ys.
  const ir::Function fwd_trace = *closed(body->name + "_fwd", p_t, [&](const Tensors& p) {
    Tensors out = ir::evaluate(*body, p);
    for (std::size_t i : rc) out.push_back(p[i]);
    append(out, ir::evaluate(*split.known, p));
    return out;
  });
  // The known part recomputes the body's forward: merge the two.
  const ir::Function merged = ir::dce(ir::cse(fwd_trace));
  const ResidualReuse reuse = reuse_residuals(merged, l.nc, ny, rc, split.num_residuals);
  FunctionRef fwd = std::make_shared<const ir::Function>(reuse.forward);
  const Tensors f = bind(r.primitive, Tensors(r.inputs.begin(), r.inputs.end()),
                         scan_attrs(fwd, l.length, l.reverse, l.nc, l.nx));
  // 3. Backward over the unknown part, taking only the parameters it reads. Carry: the
  // cotangents, then the next carries reused as residuals; xs: carries, xs, ys cotangents,
  // residuals; then captures.
  ir::Function bwd = *split.unknown;
  const std::vector<ir::Value> all = bwd.params;
  bwd.params.assign(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(nbc));
  auto residual = [&](std::size_t k) { return all[params.size() + k]; };
  // A next carry read at step t is the incoming carry stacked for step t + 1 (t - 1 when
  // reversed): the backward scan carries it, starting from the final carry.
  const auto cot_out = static_cast<std::ptrdiff_t>(nbc);
  std::vector<ir::Value> next_carries;
  for (const auto& [k, c] : reuse.next_carry) {
    bwd.params.push_back(residual(k));
    next_carries.push_back(all[nbc + rc[c]]);
  }
  bwd.results.insert(bwd.results.begin() + cot_out, next_carries.begin(), next_carries.end());
  auto take = [&](std::size_t from, const Idx& which) {
    for (std::size_t i : which) bwd.params.push_back(all[from + i]);
  };
  take(nbc, rc);
  take(at_x, rx);
  take(at_y, ry);
  for (std::size_t k = 0; k < split.num_residuals; ++k)
    if (!reuse.next_carry.contains(k)) bwd.params.push_back(residual(k));
  take(at_k, rk);
  bwd.name = body->name + "_bwd";
  Tensors ins;
  for (std::size_t i : fc) ins.push_back(or_zero(ct[i], out_t[i]));
  for (std::size_t i : fk) ins.push_back(ops::zeros_of(in_t[l.nc + l.nx + i]));
  for (const auto& [k, c] : reuse.next_carry) ins.push_back(f[rc[c]]);
  for (std::size_t j = 0; j < rc.size(); ++j) ins.push_back(f[l.nc + ny + j]);
  for (std::size_t i : rx) ins.push_back(r.inputs[l.nc + i]);
  for (std::size_t j : ry) ins.push_back(or_zero(ct[l.nc + fy[j]], out_t[l.nc + fy[j]]));
  for (std::size_t k = 0; k < split.num_residuals; ++k) {
    if (const auto y = reuse.as_ys.find(k); y != reuse.as_ys.end())
      ins.push_back(f[l.nc + y->second]);
    else if (const auto s = reuse.stacked.find(k); s != reuse.stacked.end())
      ins.push_back(f[l.nc + ny + rc.size() + s->second]);
  }
  for (std::size_t i : rk) ins.push_back(r.inputs[l.nc + l.nx + i]);
  const std::size_t nbn = nbc + next_carries.size();
  const std::size_t nbx =
      rc.size() + rx.size() + ry.size() + split.num_residuals - reuse.next_carry.size();
  const Tensors b = bind(r.primitive, ins,
                         scan_attrs(std::make_shared<const ir::Function>(std::move(bwd)), l.length,
                                    !l.reverse, nbn, nbx));
  for (std::size_t j = 0; j < fc.size(); ++j) result[fc[j]] = b[j];
  for (std::size_t j = 0; j < fk.size(); ++j) result[l.nc + l.nx + fk[j]] = b[fc.size() + j];
  for (std::size_t j = 0; j < fx.size(); ++j) result[l.nc + fx[j]] = b[nbn + j];
  return result;
}

// vmap: carries batched in front; batched xs get the batch axis second (the scan axis stays
// first), so each step's slice has it in front; stacked ys come back batched on axis 1.
std::vector<Batched> scan_batch(const BatchArgs& b) {
  const FunctionRef body = b.attrs.get<FunctionRef>("body");
  const ScanLayout l = scan_layout(b.inputs.size(), b.attrs);
  const TypeList p_t = body->param_types();
  Tensors ins;
  std::vector<std::optional<int>> dims;
  TypeList params;
  for (std::size_t i = 0; i < b.inputs.size(); ++i) {
    if (i < l.nc) {
      ins.push_back(ops::batch_first(b.inputs[i], b.dims[i], b.size));
      dims.push_back(0);
      params.push_back(ins.back().type());
    } else if (i < l.nc + l.nx) {
      if (b.dims[i]) {
        ins.push_back(moveaxis(b.inputs[i], *b.dims[i], 1));
        dims.push_back(0);
        params.push_back(unstacked(ins.back().type()));
      } else {
        ins.push_back(b.inputs[i]);
        dims.push_back(std::nullopt);
        params.push_back(p_t[i]);
      }
    } else {
      ins.push_back(b.inputs[i]);
      dims.push_back(b.dims[i]);
      params.push_back(ins.back().type());
    }
  }
  const std::string axis(b.axis_name);
  FunctionRef fn = closed(body->name, params, [&](const Tensors& p) {
    return batch_apply(*body, p, dims, b.size, axis);
  });
  Attrs a = b.attrs;
  a.set("body", fn);
  std::vector<Batched> out;
  const Tensors outs = bind(b.primitive, ins, a);
  for (std::size_t i = 0; i < outs.size(); ++i) out.push_back({outs[i], i < l.nc ? 0 : 1});
  return out;
}

}  // namespace

const Primitive& prim::scan() {
  static const Primitive& p = detail::register_builtin(
      {.name = "scan",
       .arity = 0,
       .variadic = true,
       .type_rule = scan_types,
       .jvp = scan_jvp,
       .vjp = scan_vjp,
       .batch = scan_batch,
       .prune = prune_scan},
      interpreter_kernels(
          [](ops::Ins in, const Attrs& a) {
            return scan_run(*a.get<FunctionRef>("body"), scan_layout(in.size(), a), in, false);
          },
          true));
  return p;
}

// ---- the public entry points -------------------------------------------------------------

namespace detail::cf {

Tensor int_scalar(int64_t v) { return full(Shape{}, static_cast<double>(v), int32); }

int64_t trip_count(int64_t lo, int64_t hi) {
  if (hi <= lo) return 0;
  int64_t n = 0;
  if (__builtin_sub_overflow(hi, lo, &n) || lo < INT32_MIN || hi - 1 > INT32_MAX)
    fail("fori_loop", "the bounds do not fit the int32 counter: got lo=", lo, ", hi=", hi,
         ", expected both within int32");
  return n;
}

Tensor predicate_index(std::string_view op, const Tensor& pred) {
  if (!pred.defined())
    fail(op, "the predicate is undefined: got a default-constructed Tensor, expected bool[]");
  if (pred.dtype() != bool_ || pred.rank() != 0)
    fail(op, "the predicate must be a bool scalar: got ", pred.type(),
         ", expected bool[] (compare, e.g. x > 0, and reduce with any/all)");
  return astype(pred, int32);
}

std::pair<Tensors, TreeDef> switch_flat(std::string_view op, const Tensor& index,
                                        const std::vector<FlatFn>& branches,
                                        const std::vector<std::string>& names,
                                        const Tensors& operands) {
  if (branches.empty()) fail(op, "no branches: got 0, expected at least one");
  if (!index.defined() || index.rank() != 0 ||
      !(is_integral(index.dtype()) || index.dtype() == bool_))
    fail(op, "the branch index must be an integer scalar: got ",
         index.defined() ? index.type() : TensorType{}, ", expected i32[]");
  const Tensor idx = astype(index, int32);
  // Every branch is traced, eagerly too, so that eager and traced code accept the same
  // programs: branches must agree in structure and types whichever one runs.
  const TypeList op_t = types_of(operands);
  std::vector<Staged> traced;
  for (std::size_t k = 0; k < branches.size(); ++k) {
    traced.push_back(
        stage(op == "cond" ? names[k] : "branch" + std::to_string(k), op_t, branches[k]));
    if (k > 0)
      check_same_tree(op, "branch results", traced[0].out_def, traced[0].function->result_types(),
                      names[0], traced[k].out_def, traced[k].function->result_types(), names[k]);
  }
  if (!ir::tracing()) {
    const std::size_t k = clamp_index(idx, branches.size());
    TreeDef def;
    Tensors out = branches[k](operands, def);
    return {std::move(out), std::move(def)};
  }
  Tensors ins{idx};
  append(ins, operands);
  TypeList all = op_t;
  std::vector<std::size_t> cap_at;
  for (const Staged& t : traced) {
    cap_at.push_back(all.size());
    append(ins, t.captures);
    for (const Tensor& c : t.captures) all.push_back(c.type());
  }
  Attrs a;
  for (std::size_t k = 0; k < branches.size(); ++k)
    a.set(bname(k),
          relayout(traced[k].function, all, op_t.size(), cap_at[k], traced[k].captures.size()));
  return {bind(prim::cond(), ins, a), traced[0].out_def};
}

namespace {
void check_carry(std::string_view op, const std::string& what, const TreeDef& want_def,
                 const TypeList& want, const TreeDef& got_def, const TypeList& got) {
  if (auto d = first_difference(want_def, got_def))
    fail(op, what, " changes the carry's structure at ", *d, ": got ", got_def.to_string(),
         ", expected ", want_def.to_string(), " (the initial carry)");
  const std::vector<std::string> paths = tree_paths(want_def);
  for (std::size_t i = 0; i < want.size() && i < got.size(); ++i)
    if (want[i] != got[i])
      fail(op, what, " changes the type of carry leaf ", path_at(paths, i), ": got ", got[i],
           ", expected ", want[i], " (the initial carry's type)");
}
void check_pred(std::string_view op, const Tensors& p) {
  if (p.size() != 1 || p[0].dtype() != bool_ || p[0].rank() != 0)
    fail(op, "cond_fn must return a bool scalar: got ", p.size() == 1 ? p[0].type() : TensorType{},
         ", expected bool[]");
}
}  // namespace

Tensors while_flat(const FlatFn& cond_fn, const FlatFn& body_fn, const Tensors& init,
                   const TreeDef& init_def) {
  const TypeList init_t = types_of(init);
  TreeDef def;
  auto trace_body = [&] {
    return stage("body_fn", init_t, [&](const Tensors& p, TreeDef& d) {
      Tensors r = body_fn(p, d);
      check_carry("while_loop", "body_fn", init_def, init_t, d, types_of(r));
      return r;
    });
  };
  if (!ir::tracing()) {
    Tensors carry = init;
    bool ran = false;
    while (true) {
      const Tensors p = cond_fn(carry, def);
      check_pred("while_loop", p);
      if (!p[0].item<bool>()) break;
      Tensors next = body_fn(carry, def);
      check_carry("while_loop", "body_fn", init_def, init_t, def, types_of(next));
      carry = std::move(next);
      ran = true;
    }
    // A body that never ran is still checked, as a traced loop checks it.
    if (!ran) trace_body();
    return carry;
  }
  const Staged c = stage("cond_fn", init_t, [&](const Tensors& p, TreeDef& d) {
    Tensors r = cond_fn(p, d);
    check_pred("while_loop", r);
    return r;
  });
  const Staged b = trace_body();
  Tensors ins = init;
  append(ins, c.captures);
  append(ins, b.captures);
  const TypeList all = types_of(ins);
  const std::size_t nc = init.size();
  Attrs a;
  a.set("cond_fn", relayout(c.function, all, nc, nc, c.captures.size()));
  a.set("body_fn", relayout(b.function, all, nc, nc + c.captures.size(), b.captures.size()));
  return bind(prim::while_(), ins, a);
}

namespace {
// ScanOptions::unroll under a trace: a scan of L / k iterations whose body applies `body` to k
// consecutive slices (xs reshaped to [L / k, k, ...]), then, for the L % k remaining steps, a
// second scan with the plain body (run first with `reverse`, which visits them first).
std::pair<Tensors, TreeDef> scan_unrolled(const FlatFn& body, const Tensors& init,
                                          const TreeDef& init_def, const Tensors& xs, int64_t L,
                                          bool reverse, int64_t k) {
  const int64_t q = L / k, r = L - q * k;
  const std::size_t nc = init.size();
  Tensors xm, xr;
  for (const Tensor& x : xs) {
    const Tensor head = r ? slice(x, {Slice{0, q * k}}) : x;
    std::vector<int64_t> dims{q, k};
    dims.insert(dims.end(), x.shape().begin() + 1, x.shape().end());
    xm.push_back(reshape(head, Shape(dims)));
    if (r) xr.push_back(slice(x, {Slice{q * k, L}}));
  }
  FlatFn body_k = [&](const Tensors& in, TreeDef& out_def) {
    Tensors carry = sub(in, 0, nc);
    std::vector<Tensors> ys;
    for (int64_t t = 0; t < k; ++t) {
      const int64_t j = reverse ? k - 1 - t : t;
      Tensors args = carry;
      for (std::size_t m = nc; m < in.size(); ++m) args.push_back(index(in[m], j));
      Tensors out = body(args, out_def);
      if (out.size() < nc || (t > 0 && out.size() - nc != ys.size()))
        return out;  // malformed: the enclosing scan_flat's checks report it
      if (t == 0) ys.assign(out.size() - nc, Tensors(static_cast<std::size_t>(k)));
      for (std::size_t m = 0; m < ys.size(); ++m) ys[m][static_cast<std::size_t>(j)] = out[nc + m];
      carry = sub(out, 0, nc);
    }
    Tensors result = carry;
    for (Tensors& y : ys) result.push_back(stack(y, 0));
    return result;
  };
  auto run_main = [&](const Tensors& c0) {
    return scan_flat(body_k, c0, init_def, xm, q, reverse, 1);
  };
  auto run_rem = [&](const Tensors& c0) {
    return scan_flat(body, c0, init_def, xr, r, reverse, 1);
  };
  std::pair<Tensors, TreeDef> m, rm;
  Tensors carry;
  if (reverse && r) {
    rm = run_rem(init);
    m = run_main(sub(rm.first, 0, nc));
    carry = sub(m.first, 0, nc);
  } else {
    m = run_main(init);
    carry = sub(m.first, 0, nc);
    if (r) {
      rm = run_rem(carry);
      carry = sub(rm.first, 0, nc);
    }
  }
  Tensors result = carry;
  for (std::size_t i = nc; i < m.first.size(); ++i) {
    const Tensor& y = m.first[i];
    std::vector<int64_t> dims{q * k};
    dims.insert(dims.end(), y.shape().begin() + 2, y.shape().end());
    Tensor ym = reshape(y, Shape(dims));
    result.push_back(r ? concatenate({ym, rm.first[i]}, 0) : ym);
  }
  return {std::move(result), std::move(m.second)};
}
}  // namespace

std::pair<Tensors, TreeDef> scan_flat(const FlatFn& body, const Tensors& init,
                                      const TreeDef& init_def, const Tensors& xs,
                                      std::optional<int64_t> length, bool reverse, int64_t unroll) {
  int64_t n = -1;
  for (std::size_t k = 0; k < xs.size(); ++k) {
    if (xs[k].rank() == 0)
      fail("scan", "xs leaf ", k, " has no leading axis to scan over: got ", xs[k].type(),
           ", expected rank >= 1");
    if (n >= 0 && xs[k].shape()[0] != n)
      fail("scan", "xs leaves differ in length: got ", xs[k].shape()[0], " for leaf ", k,
           ", expected ", n, " (the leading axis of leaf 0)");
    n = xs[k].shape()[0];
  }
  if (length && n >= 0 && *length != n)
    fail("scan", "length does not match xs: got length=", *length, ", expected ", n);
  if (!length && n < 0)
    fail("scan", "no length: got xs without leaves, expected ScanOptions{.length = n}");
  if (length && *length < 0) fail("scan", "negative length: got ", *length, ", expected >= 0");
  const int64_t L = length ? *length : n;
  if (unroll < 1) fail("scan", "unroll must be >= 1: got unroll=", unroll, " for length=", L);
  if (ir::tracing() && unroll > 1 && L > 1)
    return scan_unrolled(body, init, init_def, xs, L, reverse, std::min(unroll, L));
  const std::size_t nc = init.size();
  const TypeList init_t = types_of(init);
  TypeList x_t;
  for (const Tensor& x : xs) x_t.push_back(unstacked(x.type()));
  TreeDef def;
  auto check = [&](const Tensors& out) {
    if (def.kind != TreeDef::Kind::tuple || def.children.size() != 2)
      fail("scan", "the body must return a (carry, y) pair: got ", def.to_string());
    TypeList got = types_of(out);
    got.resize(std::min(nc, got.size()));
    check_carry("scan", "the body", init_def, init_t, def.children[0], got);
  };
  if (!ir::tracing()) {
    Tensors carry = init;
    std::vector<Tensors> ys;
    TypeList y_t;
    TreeDef y_def;
    for (int64_t t = 0; t < L; ++t) {
      const int64_t i = reverse ? L - 1 - t : t;
      Tensors args = carry;
      for (const Tensor& x : xs) args.push_back(index(x, i));
      Tensors out = body(args, def);
      check(out);
      const Tensors y = sub(out, nc, out.size() - nc);
      if (t == 0) {
        y_def = def.children[1];
        y_t = types_of(y);
        ys.assign(y.size(), Tensors(static_cast<std::size_t>(L)));
      } else {
        check_carry("scan", "the body's y", y_def, y_t, def.children[1], types_of(y));
      }
      for (std::size_t k = 0; k < y.size(); ++k) ys[k][static_cast<std::size_t>(i)] = y[k];
      carry = sub(out, 0, nc);
    }
    if (L == 0) {
      // The structure and types of y come from a trace of the body (nothing runs).
      const Staged tr = stage("body", init_t, [&](const Tensors& p, TreeDef& d) {
        Tensors args = p;
        for (const TensorType& t : x_t) args.push_back(zeros(t.shape, t.dtype));
        Tensors out = body(args, d);
        def = d;
        check(out);
        return out;
      });
      Tensors result = carry;
      const TypeList rt = tr.function->result_types();
      for (std::size_t k = nc; k < rt.size(); ++k)
        result.push_back(zeros(stacked(rt[k], 0).shape, rt[k].dtype));
      return {std::move(result), def.children.size() == 2 ? def.children[1] : TreeDef{}};
    }
    Tensors result = carry;
    for (Tensors& y : ys) result.push_back(stack(y, 0));
    return {std::move(result), std::move(y_def)};
  }
  TypeList params = init_t;
  params.insert(params.end(), x_t.begin(), x_t.end());
  const Staged tr = stage("body", params, [&](const Tensors& p, TreeDef& d) {
    Tensors out = body(p, d);
    def = d;
    check(out);
    return out;
  });
  Tensors ins = init;
  append(ins, xs);
  append(ins, tr.captures);
  return {bind(prim::scan(), ins, scan_attrs(tr.function, L, reverse, nc, xs.size())),
          def.children[1]};
}

}  // namespace detail::cf
}  // namespace kiln
