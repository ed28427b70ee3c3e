// Primitives that hold sub-functions, each with its derivative rules: call (nested jit),
// checkpoint (rematerialisation), custom_jvp and custom_vjp (user rules).
#include <algorithm>

#include "kiln/transforms.h"
#include "ops/primitives.h"
#include "ops/rules.h"

namespace kiln {
namespace {

// Type rule shared by every primitive whose `fn` attribute is applied to its inputs.
std::vector<TensorType> apply_fn_types(std::string_view op, ops::Types in, const Attrs& a) {
  const FunctionRef& fn = a.get<FunctionRef>("fn");
  const std::vector<TensorType> want = fn->param_types();
  if (!std::equal(in.begin(), in.end(), want.begin(), want.end()))
    fail(op, "arguments do not match @", fn->name, ": got ", ops::types_str(in), ", expected ",
         ops::types_str(want));
  return fn->result_types();
}

// k for any inputs: variadic registrations need one input; no arguments get their own.
std::vector<KernelRegistration> any_inputs(const Kernel& k) {
  return {{ops::cpu_variadic(DTypeSet::all()), k},
          {KernelSignature{.device = Device::cpu, .inputs = {}, .variadic = false}, k}};
}
std::vector<KernelRegistration> apply_fn_kernels() {
  return any_inputs(
      [](ops::Ins in, const Attrs& a) { return ir::evaluate(*a.get<FunctionRef>("fn"), in); });
}

std::vector<Tensor> zeros_for(ops::Ins like, std::span<const Tangent> t) {
  std::vector<Tensor> out;
  for (std::size_t i = 0; i < like.size(); ++i)
    out.push_back(t[i] ? *t[i] : ops::zeros_of(like[i].type()));
  return out;
}

// Forward mode through the sub-function itself.
ops::Ts jvp_through_fn(const RuleArgs& r, std::span<const Tangent> t) {
  return ad::jvp(*r.attrs.get<FunctionRef>("fn"), r.inputs, t).tangents;
}
// Reverse mode through the sub-function, recomputing its forward pass: what `checkpoint`
// is for, and what keeps a nested jit's intermediates out of the outer residuals. The
// recomputation and pullback are one equation of the same primitive over (inputs,
// cotangents), so no pass can merge the recomputed forward with the original one or move it
// out of the backward pass (scan's residual split: docs/DESIGN.md).
ops::Ts vjp_recompute(const RuleArgs& r, std::span<const Tangent> ct) {
  const FunctionRef fn = r.attrs.get<FunctionRef>("fn");
  const std::size_t n = r.inputs.size();
  std::vector<TensorType> types;
  for (const Tensor& t : r.inputs) types.push_back(t.type());
  std::vector<std::size_t> given;  // outputs with a cotangent
  for (std::size_t i = 0; i < ct.size(); ++i)
    if (ct[i]) {
      given.push_back(i);
      types.push_back(ct[i]->type());
    }
  std::vector<bool> has_grad(n, false);
  ir::Traced bwd = ir::trace_function(fn->name + "_bwd", types, [&](const std::vector<Tensor>& p) {
    ops::Ts cts(ct.size());
    for (std::size_t j = 0; j < given.size(); ++j) cts[given[j]] = p[n + j];
    const ops::Ts g =
        ad::vjp(fn, std::span<const Tensor>(p.data(), n)).pullback(std::span<const Tangent>(cts));
    std::vector<Tensor> out;
    for (std::size_t i = 0; i < n; ++i)
      if (g[i]) {
        has_grad[i] = true;
        out.push_back(*g[i]);
      }
    return out;
  });
  ops::Ts result(n);
  if (bwd.function->results.empty()) return result;
  std::vector<Tensor> ins(r.inputs.begin(), r.inputs.end());
  for (std::size_t i : given) ins.push_back(*ct[i]);
  ins.insert(ins.end(), bwd.captures.begin(), bwd.captures.end());
  Attrs a = r.attrs;
  a.set("fn", FunctionRef(bwd.function));
  // A checkpoint with a policy marks its pullback, whose first `primals` inputs are the
  // forward equation's, so that optimisation can pair the two (ir::apply_checkpoint_policies).
  if (a.has("recompute")) a.set("primals", static_cast<int64_t>(n));
  const std::vector<Tensor> g = bind(r.primitive, ins, a);
  for (std::size_t i = 0, k = 0; i < n; ++i)
    if (has_grad[i]) result[i] = g[k++];
  return result;
}

// Batching keeps the sub-function boundary: the sub-function is batched into a new one
// (every result with its batch axis in front) and applied by the same primitive, so a
// checkpoint stays a checkpoint under vmap.
std::vector<Batched> batch_sub_function(const BatchArgs& b) {
  const FunctionRef fn = b.attrs.get<FunctionRef>("fn");
  std::vector<TensorType> types;
  for (const Tensor& t : b.inputs) types.push_back(t.type());
  const std::vector<std::optional<int>> dims(b.dims.begin(), b.dims.end());
  const std::string axis(b.axis_name);
  const int64_t size = b.size;
  ir::Traced batched = ir::trace_function(fn->name, types, [&](const std::vector<Tensor>& params) {
    std::vector<Batched> ins;
    for (std::size_t i = 0; i < params.size(); ++i) ins.push_back({params[i], dims[i]});
    std::vector<Tensor> outs;
    for (const Batched& o : batching::evaluate(*fn, ins, size, axis))
      outs.push_back(ops::batch_first(o.value, o.dim, size));
    return outs;
  });
  std::vector<Tensor> ins(b.inputs.begin(), b.inputs.end());
  ins.insert(ins.end(), batched.captures.begin(), batched.captures.end());
  Attrs a = b.attrs;
  a.set("fn", FunctionRef(batched.function));
  std::vector<Batched> out;
  for (Tensor& t : bind(b.primitive, ins, a)) out.push_back({std::move(t), 0});
  return out;
}

}  // namespace

const Primitive& prim::call() {
  static const Primitive& p = detail::register_builtin(
      {.name = "call",
       .arity = 0,
       .variadic = true,
       .type_rule = [](ops::Types in, const Attrs& a) { return apply_fn_types("call", in, a); },
       .jvp = jvp_through_fn,
       .vjp = vjp_recompute,
       .batch = batch_sub_function},
      apply_fn_kernels());
  return p;
}

const Primitive& prim::checkpoint() {
  static const Primitive& p = detail::register_builtin(
      {.name = "checkpoint",
       .arity = 0,
       .variadic = true,
       .type_rule = [](ops::Types in,
                       const Attrs& a) { return apply_fn_types("checkpoint", in, a); },
       .jvp = jvp_through_fn,
       .vjp = vjp_recompute,
       .batch = batch_sub_function,
       .algebra = {.computes = {"fn"}}},
      apply_fn_kernels());
  return p;
}

// custom_jvp{fn, jvp}: `jvp` maps (primals..., tangents...) to the output tangents. It is
// linear in the tangents, so reverse mode is its transpose: the VJP of `jvp` with respect to
// the tangents, taken at zero tangents.
const Primitive& prim::custom_jvp() {
  static const Primitive& p = detail::register_builtin(
      {.name = "custom_jvp",
       .arity = 0,
       .variadic = true,
       .type_rule = [](ops::Types in,
                       const Attrs& a) { return apply_fn_types("custom_jvp", in, a); },
       .jvp = [](const RuleArgs& r, std::span<const Tangent> t) -> ops::Ts {
         std::vector<Tensor> args(r.inputs.begin(), r.inputs.end());
         const std::vector<Tensor> tz = zeros_for(r.inputs, t);
         args.insert(args.end(), tz.begin(), tz.end());
         const std::vector<Tensor> out = ir::evaluate(*r.attrs.get<FunctionRef>("jvp"), args);
         return ops::Ts(out.begin(), out.end());
       },
       .vjp = [](const RuleArgs& r, std::span<const Tangent> ct) -> ops::Ts {
         std::vector<Tensor> args(r.inputs.begin(), r.inputs.end());
         const std::vector<Tensor> tz = zeros_for(r.inputs, std::vector<Tangent>(r.inputs.size()));
         args.insert(args.end(), tz.begin(), tz.end());
         const ops::Ts all = ad::vjp(r.attrs.get<FunctionRef>("jvp"), args).pullback(ct);
         return ops::Ts(all.begin() + static_cast<std::ptrdiff_t>(r.inputs.size()), all.end());
       },
       // One application per example keeps the user's rule attached to each.
       .batch = ops::batch_by_loop,
       .algebra = {.computes = {"fn"}}},
      apply_fn_kernels());
  return p;
}

// custom_vjp has two forms. custom_vjp{fn, bwd}: `bwd` maps (primals..., outputs...,
// cotangents...) to the cotangents of the primals. custom_vjp{fn, fwd, bwd}, the residual form
// (JAX's defvjp): `fwd` maps the primals to (outputs..., residuals...), the primitive's results
// are all of them, and `bwd` maps (residuals..., cotangents of the outputs...) to the cotangents
// of the primals. The residuals are results, so reverse mode saves them with the forward pass
// instead of recomputing them. Forward mode is not defined by a reverse rule (as in JAX).
namespace {

std::vector<TensorType> custom_vjp_types(ops::Types in, const Attrs& a) {
  const std::vector<TensorType> out = apply_fn_types("custom_vjp", in, a);
  if (!a.has("fwd")) return out;
  const FunctionRef& fwd = a.get<FunctionRef>("fwd");
  const FunctionRef& bwd = a.get<FunctionRef>("bwd");
  const std::vector<TensorType> all = fwd->result_types();
  if (fwd->param_types() != std::vector<TensorType>(in.begin(), in.end()) ||
      all.size() < out.size() || !std::equal(out.begin(), out.end(), all.begin()))
    fail("custom_vjp", "@", fwd->name, " does not match @", a.get<FunctionRef>("fn")->name,
         ": got ", ops::types_str(fwd->param_types()), " -> ", ops::types_str(all), ", expected ",
         ops::types_str(in), " -> ", ops::types_str(out), " followed by the residuals");
  // bwd: (residuals..., cotangents...) -> one cotangent per primal.
  std::vector<TensorType> bwd_in(all.begin() + static_cast<std::ptrdiff_t>(out.size()), all.end());
  bwd_in.insert(bwd_in.end(), out.begin(), out.end());
  if (bwd->param_types() != bwd_in)
    fail("custom_vjp", "@", bwd->name, " takes the wrong arguments: got ",
         ops::types_str(bwd->param_types()), ", expected the residuals and cotangents ",
         ops::types_str(bwd_in));
  if (bwd->result_types() != std::vector<TensorType>(in.begin(), in.end()))
    fail("custom_vjp", "@", bwd->name, " must return one cotangent per argument: got ",
         ops::types_str(bwd->result_types()), ", expected ", ops::types_str(in));
  return all;
}

ops::Ts custom_vjp_pullback(const RuleArgs& r, std::span<const Tangent> ct) {
  const FunctionRef bwd = r.attrs.get<FunctionRef>("bwd");
  if (!r.attrs.has("fwd")) {
    std::vector<Tensor> args(r.inputs.begin(), r.inputs.end());
    args.insert(args.end(), r.outputs.begin(), r.outputs.end());
    const std::vector<Tensor> cz = zeros_for(r.outputs, ct);
    args.insert(args.end(), cz.begin(), cz.end());
    const std::vector<Tensor> out = ir::evaluate(*bwd, args);
    return ops::Ts(out.begin(), out.end());
  }
  const auto n_out = static_cast<std::ptrdiff_t>(r.attrs.get<FunctionRef>("fn")->results.size());
  const std::span<const Tangent> ct_out = ct.first(static_cast<std::size_t>(n_out));
  ops::Ts result(r.inputs.size());
  if (std::any_of(ct_out.begin(), ct_out.end(), [](const Tangent& t) { return t.has_value(); })) {
    std::vector<Tensor> args(r.outputs.begin() + n_out, r.outputs.end());  // residuals
    const std::vector<Tensor> cz = zeros_for(r.outputs.first(ct_out.size()), ct_out);
    args.insert(args.end(), cz.begin(), cz.end());
    const std::vector<Tensor> out = ir::evaluate(*bwd, args);
    result.assign(out.begin(), out.end());
  }
  // A cotangent on a residual arises only when the backward pass is differentiated again
  // (grad of grad): the residuals are fwd's ordinary functions of the primals, so that part
  // goes through fwd by ordinary reverse mode (as in JAX), with fwd recomputed.
  if (std::any_of(ct.begin() + n_out, ct.end(), [](const Tangent& t) { return t.has_value(); })) {
    std::vector<Tangent> ct_res(ct.begin(), ct.end());
    std::fill(ct_res.begin(), ct_res.begin() + n_out, std::nullopt);
    const ops::Ts g = ad::vjp(r.attrs.get<FunctionRef>("fwd"), r.inputs)
                          .pullback(std::span<const Tangent>(ct_res));
    for (std::size_t i = 0; i < result.size(); ++i)
      if (g[i]) result[i] = result[i] ? *result[i] + *g[i] : *g[i];
  }
  return result;
}

}  // namespace

const Primitive& prim::custom_vjp() {
  static const Primitive& p = detail::register_builtin(
      {.name = "custom_vjp",
       .arity = 0,
       .variadic = true,
       .type_rule = custom_vjp_types,
       .jvp = [](const RuleArgs&, std::span<const Tangent>) -> ops::Ts {
         fail("custom_vjp",
              "forward-mode differentiation requested: got a tangent for a "
              "function with a custom VJP, expected reverse mode only (give it "
              "a custom_jvp rule for jvp, jacfwd or hessian)");
       },
       .vjp = custom_vjp_pullback,
       .batch = ops::batch_by_loop,
       .algebra = {.computes = {"fwd", "fn"}}},
      any_inputs([](ops::Ins in, const Attrs& a) {  // the residual form's results come from fwd
        return ir::evaluate(*a.get<FunctionRef>(a.has("fwd") ? "fwd" : "fn"), in);
      }));
  return p;
}

}  // namespace kiln
