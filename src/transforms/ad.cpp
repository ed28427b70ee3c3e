// Forward and reverse mode over the IR. Both interpret a function equation by equation
// through bind, so with concrete inputs they compute now, and under a trace they record the
// derivative program into it — the source-to-source rewrite that makes grad(grad(f)) and
// jit(grad(f)) work.
#include <algorithm>

#include "ir/trace.h"
#include "kiln/impl/interpreters.h"
#include "kiln/ops.h"
#include "ops/rules.h"

namespace kiln::ad {
namespace {

Tangent add_tangents(const Tangent& a, const Tangent& b) {
  if (!a) return b;
  if (!b) return a;
  return add(*a, *b, Loc{});
}

// Derivatives only flow through floating and complex values.
bool carries_derivative(const TensorType& t) { return is_inexact(t.dtype); }

void check_rule_result(std::string_view kind, const ir::Equation& e,
                       const std::vector<Tangent>& got, std::span<const ir::Value> want) {
  if (got.size() != want.size())
    fail(kind, "rule of '", e.prim->name, "' returned ", got.size(), " values, expected ",
         want.size());
  for (std::size_t i = 0; i < got.size(); ++i)
    if (got[i] && carries_derivative(want[i].type) && got[i]->type() != want[i].type)
      fail(kind, "rule of '", e.prim->name, "' returned ", got[i]->type(), " for operand ", i,
           ", expected ", want[i].type);
}

}  // namespace

JvpResult jvp(const ir::Function& f, std::span<const Tensor> primals,
              std::span<const Tangent> tangents) {
  if (primals.size() != f.params.size() || tangents.size() != f.params.size())
    fail("jvp", "@", f.name, " takes ", f.params.size(), " arguments: got ", primals.size(),
         " primals and ", tangents.size(), " tangents, expected one of each per argument");
  const auto n = static_cast<std::size_t>(f.next_id());
  std::vector<Tensor> val(n);
  std::vector<Tangent> tan(n);
  for (std::size_t i = 0; i < primals.size(); ++i) {
    const auto id = static_cast<std::size_t>(f.params[i].id);
    val[id] = primals[i];
    if (tangents[i] && carries_derivative(f.params[i].type)) {
      if (tangents[i]->type() != f.params[i].type)
        fail("jvp", "tangent ", i, " has the wrong type: got ", tangents[i]->type(), ", expected ",
             f.params[i].type, " (the primal's type)");
      tan[id] = tangents[i];
    }
  }
  for (const ir::Constant& c : f.constants) val[static_cast<std::size_t>(c.value.id)] = c.tensor;
  for (const ir::Equation& e : f.equations) {
    std::vector<Tensor> ins;
    std::vector<Tangent> tins;
    bool any = false;
    for (const ir::Value& v : e.inputs) {
      ins.push_back(val[static_cast<std::size_t>(v.id)]);
      tins.push_back(tan[static_cast<std::size_t>(v.id)]);
      any = any || tins.back().has_value();
    }
    std::vector<Tensor> outs;
    try {
      outs = bind(*e.prim, ins, e.attrs, Loc{});
    } catch (const Error& err) {
      detail::rethrow_at(err, e.loc);
    }
    for (std::size_t k = 0; k < outs.size(); ++k)
      val[static_cast<std::size_t>(e.outputs[k].id)] = outs[k];
    if (!any || !e.prim->differentiable) continue;
    if (!e.prim->jvp)
      fail("jvp", "no JVP rule for primitive '", e.prim->name, "'", e.prim->where_defined());
    std::vector<Tangent> touts = e.prim->jvp(RuleArgs{ins, outs, e.attrs, *e.prim}, tins);
    check_rule_result("jvp", e, touts, e.outputs);
    for (std::size_t k = 0; k < touts.size(); ++k)
      if (carries_derivative(e.outputs[k].type))
        tan[static_cast<std::size_t>(e.outputs[k].id)] = std::move(touts[k]);
  }
  JvpResult r;
  for (const ir::Value& v : f.results) {
    r.outputs.push_back(val[static_cast<std::size_t>(v.id)]);
    r.tangents.push_back(tan[static_cast<std::size_t>(v.id)]);
  }
  return r;
}

std::vector<Tangent> Pullback::operator()(std::span<const Tangent> cotangents) const {
  const ir::Function& f = *f_;
  if (cotangents.size() != f.results.size())
    fail("vjp", "the pullback of @", f.name, " takes ", f.results.size(), " cotangents: got ",
         cotangents.size(), ", expected one per output");
  for (std::size_t i = 0; i < cotangents.size(); ++i)
    if (cotangents[i] && carries_derivative(f.results[i].type) &&
        cotangents[i]->type() != f.results[i].type)
      fail("vjp", "cotangent ", i, " has the wrong type: got ", cotangents[i]->type(),
           ", expected ", f.results[i].type, " (the output's type)");
  if (!program_) return run_rules(cotangents);
  std::vector<Tensor> args;
  for (std::size_t i = 0; i < cotangents.size(); ++i) {
    const TensorType& t = f.results[i].type;
    const bool given = cotangents[i] && carries_derivative(t);
    args.push_back(given ? *cotangents[i] : ops::zeros_of(t));
  }
  const std::vector<Tensor> outs = ir::evaluate(*program_->backward, args);
  std::vector<Tangent> ct;
  for (const std::optional<std::size_t>& k : program_->result_of_param)
    ct.push_back(k ? Tangent(outs[*k]) : std::nullopt);
  return ct;
}

std::vector<Tangent> Pullback::run_rules(std::span<const Tangent> cotangents) const {
  const ir::Function& f = *f_;
  std::vector<Tangent> ct(env_.size());
  for (std::size_t i = 0; i < cotangents.size(); ++i) {
    if (!cotangents[i] || !carries_derivative(f.results[i].type)) continue;
    const auto id = static_cast<std::size_t>(f.results[i].id);
    ct[id] = add_tangents(ct[id], cotangents[i]);
  }
  for (auto it = f.equations.rbegin(); it != f.equations.rend(); ++it) {
    const ir::Equation& e = *it;
    std::vector<Tangent> couts;
    bool any = false;
    for (const ir::Value& v : e.outputs) {
      couts.push_back(ct[static_cast<std::size_t>(v.id)]);
      any = any || couts.back().has_value();
    }
    if (!any || !e.prim->differentiable) continue;
    if (!e.prim->vjp)
      fail("vjp", "no VJP rule for primitive '", e.prim->name, "'", e.prim->where_defined());
    std::vector<Tensor> ins, outs;
    for (const ir::Value& v : e.inputs) ins.push_back(env_[static_cast<std::size_t>(v.id)]);
    for (const ir::Value& v : e.outputs) outs.push_back(env_[static_cast<std::size_t>(v.id)]);
    std::vector<Tangent> cins = e.prim->vjp(RuleArgs{ins, outs, e.attrs, *e.prim}, couts);
    check_rule_result("vjp", e, cins, e.inputs);
    for (std::size_t k = 0; k < cins.size(); ++k) {
      if (!cins[k] || !carries_derivative(e.inputs[k].type)) continue;
      const auto id = static_cast<std::size_t>(e.inputs[k].id);
      ct[id] = add_tangents(ct[id], cins[k]);
    }
  }
  std::vector<Tangent> out;
  for (const ir::Value& v : f.params) out.push_back(ct[static_cast<std::size_t>(v.id)]);
  return out;
}

VjpResult vjp(std::shared_ptr<const ir::Function> f, std::span<const Tensor> primals) {
  if (primals.size() != f->params.size())
    fail("vjp", "@", f->name, " takes ", f->params.size(), " arguments: got ", primals.size());
  std::vector<Tensor> env = ir::evaluate_values(*f, primals);
  VjpResult r;
  for (const ir::Value& v : f->results) r.outputs.push_back(env[static_cast<std::size_t>(v.id)]);
  r.pullback = Pullback(std::move(f), std::move(env));
  return r;
}

VjpResult vjp_pruned(std::shared_ptr<const ir::Function> f, std::span<const Tensor> primals) {
  VjpResult r = vjp(f, primals);
  if (ir::tracing()) return r;
  Pullback::Program program;
  program.result_of_param.resize(f->params.size());
  const Pullback& rules = r.pullback;
  const ir::Traced backward =
      ir::trace_function("pullback", f->result_types(), [&](const std::vector<Tensor>& cotangents) {
        const std::vector<Tangent> ct =
            rules(std::vector<Tangent>(cotangents.begin(), cotangents.end()));
        std::vector<Tensor> out;
        for (std::size_t i = 0; i < ct.size(); ++i)
          if (ct[i]) {
            program.result_of_param[i] = out.size();
            out.push_back(*ct[i]);
          }
        return out;
      });
  // The forward values the backward program reads are its constants; dce drops the rest.
  program.backward = std::make_shared<const ir::Function>(ir::dce(*backward.function));
  r.pullback = Pullback(std::move(f), std::move(program));
  return r;
}

}  // namespace kiln::ad
