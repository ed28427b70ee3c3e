// grad, vjp and jvp on flat trees: the core the typed wrappers in kiln/transforms.h call.
#include "transforms/core.h"

namespace kiln::detail {
namespace {

void check_scalar_loss(std::string_view op, const std::vector<Tensor>& outputs) {
  if (outputs.empty() || outputs[0].rank() != 0 || !is_floating(outputs[0].dtype()))
    fail(op, "the function must return a scalar: got ",
         outputs.empty() ? std::string("no tensor") : outputs[0].type().to_string(),
         ", expected a 0-d real float tensor (or a (loss, aux) pair with has_aux; for a complex "
         "output take its real part, or use vjp)");
}

// The cotangent of each leaf, zeros where it is symbolically zero (no derivative reaches it).
std::vector<Tensor> materialize(std::span<const Tangent> ct, std::span<const TensorType> like) {
  std::vector<Tensor> out;
  for (std::size_t i = 0; i < like.size(); ++i)
    out.push_back(i < ct.size() && ct[i] ? *ct[i] : zeros(like[i].shape, like[i].dtype));
  return out;
}

// Runs body on flat inputs. With no trace active it is traced into one program, pruned of all
// its results do not need (cotangents nobody asked for, forward values the backward pass never
// reads) and evaluated; under a trace it simply records into that trace.
std::vector<Tensor> run_pruned(
    std::string_view op, const std::vector<Tensor>& inputs,
    const std::function<std::vector<Tensor>(const std::vector<Tensor>&)>& body) {
  if (ir::tracing()) return body(inputs);
  const ir::Traced program = ir::trace_function(std::string(op), leaf_types(op, inputs), body);
  return ir::evaluate(ir::dce(*program.function), inputs);
}

}  // namespace

std::vector<LeafRange> picked_ranges(std::string_view op, const std::vector<int>& argnums,
                                     const TreeDef& args_def) {
  const std::vector<LeafRange> ranges = arg_ranges(args_def);
  std::vector<LeafRange> picked;
  for (const int k : argnums) {
    if (k < 0 || static_cast<std::size_t>(k) >= ranges.size())
      fail(op, "argnums out of range: got ", k, ", expected an argument index in [0, ",
           ranges.size(), ")");
    picked.push_back(ranges[static_cast<std::size_t>(k)]);
  }
  return picked;
}

GradResult grad_call(std::string_view op, const std::vector<int>& argnums, const TreeDef& args_def,
                     const std::vector<Tensor>& leaves, const FlatFn& fn) {
  const std::vector<LeafRange> picked = picked_ranges(op, argnums, args_def);
  // One flat program: fn's outputs, then the gradient leaves of each requested argument.
  TreeDef out_def;
  std::size_t n_out = 0;
  const std::vector<Tensor> flat = run_pruned(op, leaves, [&](const std::vector<Tensor>& xs) {
    const Staged s = stage(std::string(op), args_def, xs, fn);
    ad::VjpResult r = ad::vjp(s.function, s.inputs(xs));
    check_scalar_loss(op, r.outputs);
    std::vector<Tangent> seed(r.outputs.size());
    seed[0] = ones_like(r.outputs[0]);
    const std::vector<Tangent> ct = r.pullback(seed);
    out_def = s.out_def;
    n_out = r.outputs.size();
    std::vector<Tensor> result = std::move(r.outputs);
    const std::vector<TensorType> types = types_of(xs);
    for (const LeafRange& a : picked) {
      const std::vector<Tensor> g = materialize(std::span(ct).subspan(a.begin, a.size()),
                                                std::span(types).subspan(a.begin, a.size()));
      result.insert(result.end(), g.begin(), g.end());
    }
    return result;
  });
  GradResult g;
  auto at = flat.begin() + static_cast<std::ptrdiff_t>(n_out);
  g.value = {std::vector<Tensor>(flat.begin(), at), std::move(out_def)};
  for (const LeafRange& a : picked) {
    g.grads.emplace_back(at, at + static_cast<std::ptrdiff_t>(a.size()));
    at += static_cast<std::ptrdiff_t>(a.size());
  }
  return g;
}

FlatPullback::FlatPullback(ad::Pullback pullback, TreeDef out_def,
                           std::vector<TensorType> arg_types)
    : pullback_(std::move(pullback)),
      out_def_(std::move(out_def)),
      arg_types_(std::move(arg_types)) {}

std::vector<Tensor> FlatPullback::operator()(const std::vector<Tensor>& cotangent,
                                             const TreeDef& def) const {
  check_same_structure("vjp", out_def_, def, 1);
  const std::vector<Tangent> ct =
      pullback_(std::vector<Tangent>(cotangent.begin(), cotangent.end()));
  return materialize(std::span(ct).first(arg_types_.size()), arg_types_);
}

VjpFlat vjp_call(const TreeDef& args_def, const std::vector<Tensor>& leaves, const FlatFn& fn) {
  const Staged s = stage("vjp", args_def, leaves, fn);
  ad::VjpResult r = ad::vjp_pruned(s.function, s.inputs(leaves));
  return {{std::move(r.outputs), s.out_def},
          FlatPullback(std::move(r.pullback), s.out_def, types_of(leaves))};
}

JvpFlat jvp_call(const TreeDef& args_def, const std::vector<Tensor>& leaves,
                 const TreeDef& tangents_def, const std::vector<Tensor>& tangents,
                 const FlatFn& fn) {
  check_same_structure("jvp", args_def, tangents_def, 2);
  return jvp_along(args_def, leaves, std::vector<Tangent>(tangents.begin(), tangents.end()), fn);
}

JvpFlat jvp_along(const TreeDef& args_def, const std::vector<Tensor>& leaves,
                  std::vector<Tangent> tangents, const FlatFn& fn) {
  const Staged s = stage("jvp", args_def, leaves, fn);
  tangents.resize(leaves.size() + s.captures.size());
  const ad::JvpResult r = ad::jvp(ir::dce(*s.function), s.inputs(leaves), tangents);
  return {{r.outputs, s.out_def}, materialize(r.tangents, types_of(r.outputs))};
}

}  // namespace kiln::detail
