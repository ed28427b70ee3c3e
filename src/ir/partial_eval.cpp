#include "ir/partial_eval.h"

#include <set>
#include <unordered_map>

#include "kiln/error.h"

namespace kiln::ir {

Function concat_bodies(const Function& a, const Function& b) {
  if (b.params.size() != a.params.size())
    fail("concat_bodies", "the bodies must take the same parameters: got ", b.params.size(),
         " for @", b.name, ", expected ", a.params.size(), " as @", a.name);
  Function m = a;
  int next = a.next_id();
  std::unordered_map<int, Value> renamed;
  for (std::size_t i = 0; i < b.params.size(); ++i) renamed[b.params[i].id] = a.params[i];
  auto fresh = [&](const Value& v) { return renamed[v.id] = Value{next++, v.type}; };
  for (const Constant& c : b.constants) m.constants.push_back({fresh(c.value), c.tensor});
  for (const Equation& e : b.equations) {
    Equation copy = e;
    for (Value& v : copy.inputs) v = renamed.at(v.id);
    for (Value& v : copy.outputs) v = fresh(v);
    m.equations.push_back(std::move(copy));
  }
  for (const Value& v : b.results) m.results.push_back(renamed.at(v.id));
  return m;
}

std::vector<bool> params_read(const Function& f) {
  std::set<int> read;
  for (const Equation& e : f.equations)
    for (const Value& v : e.inputs) read.insert(v.id);
  for (const Value& v : f.results) read.insert(v.id);
  std::vector<bool> out;
  for (const Value& p : f.params) out.push_back(read.count(p.id) > 0);
  return out;
}

KnownSplit split_known(const Function& f, const std::vector<bool>& param_known,
                       const std::function<bool(const Equation&)>& recompute) {
  if (param_known.size() != f.params.size())
    fail("split_known", "one flag per parameter: got ", param_known.size(), " flags for ",
         f.params.size(), " parameters of @", f.name);
  std::set<int> known_values;
  for (std::size_t i = 0; i < f.params.size(); ++i)
    if (param_known[i]) known_values.insert(f.params[i].id);
  for (const Constant& c : f.constants) known_values.insert(c.value.id);
  std::vector<bool> eq_known;
  for (const Equation& e : f.equations) {
    bool k = true;
    for (const Value& v : e.inputs) k = k && known_values.count(v.id);
    eq_known.push_back(k);
    if (k)
      for (const Value& v : e.outputs) known_values.insert(v.id);
  }
  // Values that are the same at every step: constants and layout or cheap arithmetic of them.
  std::set<int> fixed;
  for (const Constant& c : f.constants) fixed.insert(c.value.id);
  for (const Equation& e : f.equations) {
    bool all = e.prim->algebra.rearranges || e.prim->algebra.cheap_arithmetic;
    for (const Value& v : e.inputs) all = all && fixed.count(v.id);
    if (all)
      for (const Value& v : e.outputs) fixed.insert(v.id);
  }
  // A known equation the unknown side redoes instead of reading its result as a residual:
  // layout ops, and cheap arithmetic of at most one value that varies per step, which the
  // unknown side then reads instead — never more stored values, often fewer (tanh's 1 - y² is
  // redone from y, which the backward reads anyway).
  auto redo = [&](const Equation& e) {
    if (e.prim->algebra.rearranges || (recompute && recompute(e))) return true;
    if (!e.prim->algebra.cheap_arithmetic) return false;
    std::set<int> varying;
    for (const Value& v : e.inputs)
      if (!fixed.count(v.id)) varying.insert(v.id);
    return varying.size() <= 1;
  };
  // Backwards from the results: the unknown side keeps the unknown equations it needs and the
  // known ones it redoes; a needed output of any other known equation is a residual.
  std::set<int> needed;
  for (const Value& v : f.results) needed.insert(v.id);
  std::vector<bool> on_unknown(f.equations.size(), false);
  std::set<int> residual_ids;
  for (std::size_t i = f.equations.size(); i-- > 0;) {
    const Equation& e = f.equations[i];
    bool any = false;
    for (const Value& v : e.outputs) any = any || needed.count(v.id);
    if (!any) continue;
    if (eq_known[i] && !redo(e)) {
      for (const Value& v : e.outputs)
        if (needed.count(v.id)) residual_ids.insert(v.id);
      continue;
    }
    on_unknown[i] = true;
    for (const Value& v : e.inputs) needed.insert(v.id);
  }
  // Residuals in the order they are computed, so both sides agree on it.
  std::vector<Value> residuals;
  for (const Equation& e : f.equations)
    for (const Value& v : e.outputs)
      if (residual_ids.count(v.id)) residuals.push_back(v);

  Function known = f;
  known.name = f.name + "_known";
  known.params.clear();
  known.param_names.clear();
  for (std::size_t i = 0; i < f.params.size(); ++i)
    if (param_known[i]) known.params.push_back(f.params[i]);
  known.equations.clear();
  for (std::size_t i = 0; i < f.equations.size(); ++i)
    if (eq_known[i]) known.equations.push_back(f.equations[i]);
  known.results = residuals;

  Function unknown = f;
  unknown.name = f.name + "_unknown";
  unknown.param_names.clear();
  unknown.params.insert(unknown.params.end(), residuals.begin(), residuals.end());
  unknown.equations.clear();
  for (std::size_t i = 0; i < f.equations.size(); ++i)
    if (on_unknown[i]) unknown.equations.push_back(f.equations[i]);

  return {std::make_shared<const Function>(dce(known)),
          std::make_shared<const Function>(dce(unknown)), residuals.size()};
}

}  // namespace kiln::ir
