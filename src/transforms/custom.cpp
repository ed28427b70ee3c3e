// checkpoint, custom_jvp and custom_vjp on flat trees: each stages the user's function (and
// rules) and binds one equation of its sub-function primitive (function_primitives.cpp).
#include "ops/primitives.h"
#include "ops/rules.h"
#include "transforms/core.h"

namespace kiln::detail {
namespace {

// Stand-ins of these types for staging a rule (broadcast scalars: no memory).
void append_stand_ins(std::vector<Tensor>& out, const std::vector<TensorType>& types) {
  for (const TensorType& t : types) out.push_back(ops::zeros_of(t));
}

// A function with a user rule may not close over traced values: the rule's parameters would
// not line up with the primitive's operands.
void check_closed(std::string_view op, std::string_view what, const Staged& s) {
  if (!s.captures.empty())
    fail(op, "the ", what, " closes over a traced value: got ", s.captures.size(),
         " captured tracer(s), expected a ", what, " that takes what it needs as arguments");
}

// Stages fn and its rule (on rule_leaves of structure rule_def) and binds `prim`.
FlatTree apply_with_rule(const Primitive& prim, const char* rule_attr, const Staged& s,
                         const std::vector<Tensor>& leaves, const TreeDef& rule_def,
                         const std::vector<Tensor>& rule_leaves, const RuleFactory& rule) {
  const Staged r = stage(prim.name, rule_def, rule_leaves, rule(rule_def));
  check_closed(prim.name, "rule", r);
  const Attrs attrs{{"fn", FunctionRef(s.function)}, {rule_attr, FunctionRef(r.function)}};
  return {bind(prim, leaves, attrs), s.out_def};
}

}  // namespace

FlatTree checkpoint_call(const TreeDef& args_def, const std::vector<Tensor>& leaves,
                         const FlatFn& fn, const std::optional<CheckpointPolicy>& policy) {
  const Staged s = stage("checkpoint", args_def, leaves, fn);
  Attrs attrs{{"fn", FunctionRef(s.function)}};
  if (policy) {  // the primitives' names, comma-separated (ir::apply_checkpoint_policies)
    std::string names;
    for (const std::string& n : policy->recompute) {
      if (!find_primitive(n) || n.find(',') != std::string::npos)
        fail("checkpoint", "a policy names primitives to recompute: got '", n,
             "', expected a registered primitive's name such as all_gather");
      names += (names.empty() ? "" : ",") + n;
    }
    attrs.set("recompute", names);
  }
  return {bind(prim::checkpoint(), s.inputs(leaves), attrs), s.out_def};
}

FlatTree custom_jvp_call(const TreeDef& args_def, const std::vector<Tensor>& leaves,
                         const FlatFn& fn, const RuleFactory& jvp_rule) {
  const Staged s = stage("custom_jvp", args_def, leaves, fn);
  check_closed("custom_jvp", "function", s);
  std::vector<Tensor> rule_leaves = leaves;  // (primals, tangents)
  append_stand_ins(rule_leaves, leaf_types("custom_jvp", leaves));
  return apply_with_rule(prim::custom_jvp(), "jvp", s, leaves, tuple_of({args_def, args_def}),
                         rule_leaves, jvp_rule);
}

FlatTree custom_vjp_call(const TreeDef& args_def, const std::vector<Tensor>& leaves,
                         const FlatFn& fn, const RuleFactory& bwd) {
  const Staged s = stage("custom_vjp", args_def, leaves, fn);
  check_closed("custom_vjp", "function", s);
  std::vector<Tensor> rule_leaves = leaves;  // (primals, output, cotangent)
  const std::vector<TensorType> out_types = s.function->result_types();
  append_stand_ins(rule_leaves, out_types);
  append_stand_ins(rule_leaves, out_types);
  return apply_with_rule(prim::custom_vjp(), "bwd", s, leaves,
                         tuple_of({args_def, s.out_def, s.out_def}), rule_leaves, bwd);
}

FlatTree custom_vjp_call(const TreeDef& args_def, const std::vector<Tensor>& leaves,
                         const FlatFn& fn, const FlatFn& fwd, const RuleFactory& bwd) {
  const Staged s = stage("custom_vjp", args_def, leaves, fn);
  check_closed("custom_vjp", "function", s);
  const Staged fw = stage("custom_vjp_fwd", args_def, leaves, fwd);
  check_closed("custom_vjp", "fwd", fw);
  const TreeDef& out_def = s.out_def;
  if (fw.out_def.kind != TreeDef::Kind::tuple || fw.out_def.children.size() != 2 ||
      fw.out_def.children[0] != out_def)
    fail("custom_vjp", "fwd must return (output, residuals) with the output of the function: got ",
         fw.out_def.to_string(), ", expected a pair whose first element is ", out_def.to_string());
  // bwd's arguments: (residuals, cotangent of the output).
  const std::vector<TensorType> all = fw.function->result_types();
  const std::size_t n_out = s.function->results.size();
  std::vector<Tensor> rule_leaves;
  append_stand_ins(rule_leaves, {all.begin() + static_cast<std::ptrdiff_t>(n_out), all.end()});
  append_stand_ins(rule_leaves, s.function->result_types());
  const TreeDef rule_def = tuple_of({fw.out_def.children[1], out_def});
  const Staged r = stage("custom_vjp_bwd", rule_def, rule_leaves, bwd(rule_def));
  check_closed("custom_vjp", "bwd", r);
  const Attrs attrs{{"fn", FunctionRef(s.function)},
                    {"fwd", FunctionRef(fw.function)},
                    {"bwd", FunctionRef(r.function)}};
  std::vector<Tensor> outs = bind(prim::custom_vjp(), leaves, attrs);
  outs.resize(n_out);  // the residuals stay in the program, for reverse mode
  return {std::move(outs), out_def};
}

}  // namespace kiln::detail
