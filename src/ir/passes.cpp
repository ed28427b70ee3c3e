// Optimisation passes, each IR -> IR: dead-code elimination and common-subexpression
// elimination. (Constant folding and algebraic simplification: see docs/DESIGN.md, planned.)
#include <map>
#include <set>
#include <unordered_map>

#include "kiln/ir.h"

namespace kiln::ir {

Function dce(const Function& f) {
  std::set<int> live;
  for (const Value& v : f.results) live.insert(v.id);
  std::vector<const Equation*> kept;
  for (auto it = f.equations.rbegin(); it != f.equations.rend(); ++it) {
    bool used = false;
    for (const Value& v : it->outputs) used = used || live.count(v.id);
    if (!used) continue;
    kept.push_back(&*it);
    for (const Value& v : it->inputs) live.insert(v.id);
  }
  Function out = f;
  out.equations.clear();
  for (auto it = kept.rbegin(); it != kept.rend(); ++it) out.equations.push_back(**it);
  out.constants.clear();
  for (const Constant& c : f.constants)
    if (live.count(c.value.id)) out.constants.push_back(c);
  return out;
}

Function cse(const Function& f) {
  // Two equations are the same when primitive, attributes and (renamed) inputs agree.
  // Random primitives are pure functions of their key, so they may be merged too.
  std::unordered_map<int, Value> rename;
  auto resolve = [&](const Value& v) {
    auto it = rename.find(v.id);
    return it == rename.end() ? v : it->second;
  };
  std::map<std::pair<std::string, std::vector<int>>, std::vector<const Equation*>> seen;
  Function out = f;
  out.equations.clear();
  out.equations.reserve(f.equations.size());  // buckets hold pointers into it
  for (const Equation& e0 : f.equations) {
    Equation e = e0;
    std::vector<int> ids;
    for (Value& v : e.inputs) {
      v = resolve(v);
      ids.push_back(v.id);
    }
    auto& bucket = seen[{e.prim->name, ids}];
    const Equation* same = nullptr;
    for (const Equation* prev : bucket)
      if (prev->attrs == e.attrs) same = prev;
    if (same) {
      for (std::size_t k = 0; k < e.outputs.size(); ++k) rename[e.outputs[k].id] = same->outputs[k];
      continue;
    }
    out.equations.push_back(e);
    bucket.push_back(&out.equations.back());
  }
  for (Value& v : out.results) v = resolve(v);
  return out;
}

Function optimize(const Function& f) {
  Function cur = dce(cse(f));
  while (true) {
    Function next = dce(cse(cur));
    if (next.equations.size() == cur.equations.size()) return next;
    cur = std::move(next);
  }
}

}  // namespace kiln::ir
