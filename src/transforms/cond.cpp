// The cond primitive (docs/CONTROL_FLOW.md), which cond and switch_ record under a trace: its
// type rule, interpreter kernel, derivative rules and batching rule in one place.
//
//   cond {branch0, ..., branchN}            (index: i32[], operands...) -> results
//
// Each branch takes the operands in order.
#include "ops/primitives.h"
#include "ops/rules.h"
#include "transforms/control_flow.h"

namespace kiln {
namespace {

using namespace detail::cf;

std::size_t num_branches(const Attrs& a) {
  std::size_t n = 0;
  while (a.has(bname(n))) ++n;
  return n;
}

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
  const Idx fo = inexact(op_t, 0, nops), fr = inexact(out_t, 0, out_t.size());
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
  const Idx fo = inexact(op_t, 0, nops), fr = inexact(out_t, 0, out_t.size());
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

}  // namespace kiln
