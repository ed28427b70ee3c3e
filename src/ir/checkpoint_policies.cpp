// apply_checkpoint_policies: a checkpoint with a policy (kiln/transforms.h, CheckpointPolicy)
// stores what its backward pass reads instead of recomputing it, all but the results of the
// policy's primitives. Reverse mode leaves two equations of the checkpoint primitive: the
// forward one over the inputs, and its pullback over (inputs, cotangents), which recomputes
// the forward pass (function_primitives.cpp marks it with `primals`, the number of inputs the
// two share). Here the pullback is split by what the inputs alone determine (split_known, as
// reverse mode through scan splits its step), the policy's primitives staying on the backward
// side; the known part joins the forward equation, whose own values CSE merges with it, and
// the forward equation returns the residuals the pullback then reads.
#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ir/partial_eval.h"
#include "kiln/ir.h"

namespace kiln::ir {
namespace {

// Whether e is the named primitive or, for a collective over a named axis, what it becomes
// across processes (pmap and shard_map batch it into a process-level collective).
bool is(const Equation& e, const std::string& name) {
  const std::string& p = e.prim->name;
  if (p == name) return true;
  const auto reduces = [&](const char* op) {
    return p == "process_all_reduce" && e.attrs.get<std::string>("op") == op;
  };
  if (name == "psum") return reduces("sum");
  if (name == "pmax") return reduces("max");
  if (name == "pmin") return reduces("min");
  if (name == "psum_scatter") return p == "process_reduce_scatter";
  if (name == "ppermute") return p == "process_permute";
  return p == "process_" + name;  // all_gather, all_to_all
}

// The policy's primitives, from the comma-separated names checkpoint_call stored.
std::function<bool(const Equation&)> recomputed(const std::string& names) {
  std::vector<std::string> list;
  for (std::size_t at = 0; at < names.size();) {
    const std::size_t end = std::min(names.find(',', at), names.size());
    list.push_back(names.substr(at, end - at));
    at = end + 1;
  }
  return [list](const Equation& e) {
    return std::any_of(list.begin(), list.end(), [&](const std::string& n) { return is(e, n); });
  };
}

// The forward equation of the pullback at eqs[j]: the latest one before it of the same
// primitive and policy over the pullback's first `primals` inputs.
std::optional<std::size_t> forward_of(const std::vector<Equation>& eqs, std::size_t j) {
  const Equation& b = eqs[j];
  const auto n = static_cast<std::size_t>(b.attrs.get_int("primals"));
  for (std::size_t i = j; i-- > 0;) {
    const Equation& a = eqs[i];
    if (a.prim == b.prim && !a.attrs.has("primals") && a.attrs.has("recompute") &&
        a.attrs.at("recompute") == b.attrs.at("recompute") && a.inputs.size() == n &&
        n <= b.inputs.size() && std::equal(a.inputs.begin(), a.inputs.end(), b.inputs.begin()))
      return i;
  }
  return std::nullopt;
}

}  // namespace

Function apply_checkpoint_policies(const Function& f) {
  Function out = f;
  int next = f.next_id();
  std::vector<Equation>& eqs = out.equations;
  for (std::size_t j = 0; j < eqs.size(); ++j) {
    if (!eqs[j].attrs.has("primals") || !eqs[j].attrs.has("recompute")) continue;
    const std::optional<std::size_t> i = forward_of(eqs, j);
    // No forward equation in this body (it went to another pullback, was pruned as dead, or
    // lives in another body): the pullback recomputes everything, as without a policy.
    if (!i) continue;
    Equation& a = eqs[*i];
    Equation& b = eqs[j];
    const Function& pullback = *b.attrs.get<FunctionRef>("fn");
    std::vector<bool> known(pullback.params.size(), false);
    std::fill_n(known.begin(), a.inputs.size(), true);
    const KnownSplit split =
        split_known(pullback, known, recomputed(a.attrs.get<std::string>("recompute")));
    const std::size_t na = a.outputs.size();
    const Function fwd = dce(cse(concat_bodies(*a.attrs.get<FunctionRef>("fn"), *split.known)));
    for (std::size_t k = 0; k < split.num_residuals; ++k) {
      const Value residual{next++, fwd.results[na + k].type};
      a.outputs.push_back(residual);
      b.inputs.push_back(residual);
    }
    // Plain checkpoints now: inlined when compiled, their rules as before if differentiated.
    a.attrs = Attrs{{"fn", FunctionRef(std::make_shared<const Function>(fwd))}};
    b.attrs = Attrs{{"fn", split.unknown}};
  }
  return out;
}

}  // namespace kiln::ir
