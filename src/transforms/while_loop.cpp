// The while primitive (docs/CONTROL_FLOW.md), which while_loop and fori_loop record under a
// trace, and while_grad, its reverse mode: each with its type rule, interpreter kernel,
// derivative rules and batching rule in one place.
//
//   while {cond_fn, body_fn}                 (carry..., captures...) -> carry
//   while_grad {cond_fn, body_fn, pullback_fn}
//                                            (carry..., captures..., ct_final...)
//                                            -> (ct_carry..., ct_captures...)
//
// cond_fn and body_fn share one operand layout: the primitive's operands in order.
#include "core/interrupt.h"
#include "kiln/control_flow.h"
#include "ops/primitives.h"
#include "ops/rules.h"
#include "transforms/control_flow.h"

namespace kiln {
namespace {

using namespace detail::cf;

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
  const Idx fc = inexact(in_t, 0, nc), fk = inexact(in_t, nc, ncap);
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
    if (is_inexact(in_t[i].dtype)) result[i] = outs[i];
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

}  // namespace kiln
