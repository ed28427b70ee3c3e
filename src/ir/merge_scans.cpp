// merge_scans: sibling scans over the same operands whose carries evolve identically become
// one scan. Reverse mode through a scan meets this whenever the primal result is used (a loss
// value returned with its gradient, a cotangent that reads the final carry): the VJP rule's
// forward scan recomputes the primal scan's carries and ys alongside its residuals, and CSE
// cannot merge the two equations because their bodies differ. A scan here is an equation of a
// primitive that declares Algebra::scans_body.
#include <algorithm>
#include <memory>
#include <optional>
#include <unordered_map>

#include "ir/partial_eval.h"
#include "kiln/ir.h"

namespace kiln::ir {
namespace {

// a's body with b's appended over the same parameters, returning a's results then b's ys not
// among them; or nothing when b's carries do not come out as the same values as a's (after
// CSE, which also merges equal constants). Equal carry updates from equal initial carries keep the
// carries equal at every step.
struct MergedBody {
  Function body;
  std::vector<std::size_t> b_ys;  // where each of b's ys is among body's results
};
std::optional<MergedBody> merged_body(const Function& a, const Function& b, std::size_t nc) {
  const Function m = cse(concat_bodies(a, b));
  const std::size_t na = a.results.size();
  for (std::size_t i = 0; i < nc; ++i)
    if (!(m.results[i] == m.results[na + i])) return std::nullopt;
  MergedBody r;
  r.body = m;
  r.body.results.resize(na);
  // b's ys: one result per distinct value (reverse mode's forward scan recomputes a's ys).
  for (std::size_t i = na + nc; i < m.results.size(); ++i) {
    const auto ys = r.body.results.begin() + static_cast<std::ptrdiff_t>(nc);
    const auto at = std::find(ys, r.body.results.end(), m.results[i]);
    r.b_ys.push_back(static_cast<std::size_t>(at - r.body.results.begin()));
    if (at == r.body.results.end()) r.body.results.push_back(m.results[i]);
  }
  r.body = dce(r.body);
  return r;
}

bool same_operands(const Equation& a, const Equation& b) {
  if (a.inputs.size() != b.inputs.size()) return false;
  for (std::size_t i = 0; i < a.inputs.size(); ++i)
    if (!(a.inputs[i] == b.inputs[i])) return false;
  Attrs other = b.attrs;
  other.set("body", a.attrs.get<FunctionRef>("body"));
  return other == a.attrs;
}

}  // namespace

Function merge_scans(const Function& f) {
  Function out = f;
  std::vector<Equation>& eqs = out.equations;
  std::vector<bool> merged_away(eqs.size(), false);
  std::unordered_map<int, Value> renamed;
  for (std::size_t i = 0; i < eqs.size(); ++i) {
    if (!eqs[i].prim->algebra.scans_body) continue;
    for (std::size_t j = i + 1; j < eqs.size(); ++j) {
      const Equation& b = eqs[j];
      if (merged_away[j] || b.prim != eqs[i].prim || !same_operands(eqs[i], b)) continue;
      Equation& a = eqs[i];
      const auto nc = static_cast<std::size_t>(a.attrs.get_int("num_carry"));
      std::optional<MergedBody> m =
          merged_body(*a.attrs.get<FunctionRef>("body"), *b.attrs.get<FunctionRef>("body"), nc);
      if (!m) continue;
      for (std::size_t k = 0; k < nc; ++k) renamed[b.outputs[k].id] = a.outputs[k];
      for (std::size_t k = 0; k < m->b_ys.size(); ++k) {
        const Value& y = b.outputs[nc + k];
        if (m->b_ys[k] < a.outputs.size())
          renamed[y.id] = a.outputs[m->b_ys[k]];
        else
          a.outputs.push_back(y);
      }
      a.attrs.set("body", std::make_shared<const Function>(std::move(m->body)));
      merged_away[j] = true;
    }
  }
  auto resolve = [&](Value& v) {
    if (const auto it = renamed.find(v.id); it != renamed.end()) v = it->second;
  };
  std::vector<Equation> kept;
  for (std::size_t i = 0; i < eqs.size(); ++i) {
    if (merged_away[i]) continue;
    kept.push_back(std::move(eqs[i]));
    for (Value& v : kept.back().inputs) resolve(v);
  }
  eqs = std::move(kept);
  for (Value& v : out.results) resolve(v);
  return out;
}

}  // namespace kiln::ir
