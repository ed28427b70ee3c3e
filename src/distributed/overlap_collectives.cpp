// overlap_collectives: the next layer's all-gather runs while the current layer computes, and
// a layer's reduce-scatter while the layers before it compute their gradients. Each collective
// is split into a start, whose kernel queues it on the collectives' thread, and a done, which
// waits for it: gathers start early, scatters are waited for late (docs/DESIGN.md,
// "Overlapping collectives").
#include "distributed/overlap_collectives.h"

#include <algorithm>
#include <cstdlib>
#include <unordered_map>
#include <variant>

#include "core/allocator.h"  // detail::parse_env_int
#include "ops/primitives.h"

namespace kiln::distributed {
namespace {

using ir::Equation;
using ir::Function;
using ir::Value;

// A count from the environment in [0, 64]; unset or invalid (with a warning): `fallback`.
int setting(const char* name, int fallback) {
  return static_cast<int>(detail::parse_env_int(name, std::getenv(name), 0, 64).value_or(fallback));
}

bool across_processes(const Equation& e, const Primitive& p) {
  return e.prim == &p && e.attrs.get_ints("sizes").size() > 1;
}

// Equations the pass never moves: collectives and equations holding sub-functions (which may
// hold collectives). A start's hoisting stops after one its operand needs, a done's sinking
// before one that reads its result. Starts and dones may pass others: a collective that runs
// in place first waits for the queued ones, so the order is still the same on every process.
bool fixed(const Equation& e) {
  if (e.prim->name.starts_with("process_")) return true;
  for (const auto& [name, attr] : e.attrs.items())
    if (std::holds_alternative<FunctionRef>(attr)) return true;
  return false;
}

// Gathers: each start after the done of the gather `ahead` places before it, with what its
// operand needs after that point (concatenating a layer's pieces, converting them) hoisted
// along, unless that holds a fixed equation: then after it.
Function gathers_ahead(const Function& f, int ahead) {
  const std::size_t n = f.equations.size();
  std::vector<std::size_t> gathers;  // equation indices, in program order
  std::unordered_map<int, std::size_t> defined_by;
  for (std::size_t i = 0; i < n; ++i) {
    const Equation& e = f.equations[i];
    for (const Value& v : e.outputs) defined_by[v.id] = i;
    if (across_processes(e, prim::process_all_gather())) gathers.push_back(i);
  }
  if (gathers.empty()) return f;
  // Equation i is emitted after the first slot[i] equations' own places (slot[i] = i + 1
  // where it stays); a start goes after the equations hoisted to its slot.
  std::vector<std::size_t> slot(n);
  for (std::size_t i = 0; i < n; ++i) slot[i] = i + 1;
  std::vector<std::vector<std::size_t>> starts(n + 1);
  for (std::size_t k = 0; k < gathers.size(); ++k) {
    const auto before = static_cast<std::size_t>(ahead);
    std::size_t at = k >= before ? gathers[k - before] + 1 : 0;
    std::vector<std::size_t> needs;
    for (bool settled = false; !settled;) {
      settled = true;
      needs.clear();
      std::vector<int> pending{f.equations[gathers[k]].inputs[0].id};
      std::vector<bool> seen(n, false);
      while (!pending.empty()) {
        const auto it = defined_by.find(pending.back());
        pending.pop_back();
        if (it == defined_by.end() || slot[it->second] <= at || seen[it->second]) continue;
        seen[it->second] = true;
        if (fixed(f.equations[it->second])) {
          at = slot[it->second];
          settled = false;
          break;
        }
        needs.push_back(it->second);
        for (const Value& v : f.equations[it->second].inputs) pending.push_back(v.id);
      }
    }
    for (std::size_t j : needs) slot[j] = at;
    starts[at].push_back(k);
  }
  std::vector<std::vector<std::size_t>> hoisted(n + 1);
  for (std::size_t i = 0; i < n; ++i)
    if (slot[i] != i + 1) hoisted[slot[i]].push_back(i);
  Function out = f;
  out.equations.clear();
  int next_id = f.next_id();
  std::vector<Value> started(gathers.size());
  std::size_t done = 0;
  const auto emit = [&](std::size_t i) {
    const Equation& e = f.equations[i];
    if (done < gathers.size() && gathers[done] == i)
      out.equations.push_back(
          {&prim::process_all_gather_done(), e.attrs, {started[done++]}, e.outputs, e.loc});
    else
      out.equations.push_back(e);
  };
  for (std::size_t at = 0; at <= n; ++at) {
    if (at > 0 && slot[at - 1] == at) emit(at - 1);
    for (std::size_t i : hoisted[at]) emit(i);  // in program order: each after what it reads
    for (std::size_t k : starts[at]) {
      const Equation& g = f.equations[gathers[k]];
      started[k] = Value{next_id++, g.outputs[0].type};
      out.equations.push_back(
          {&prim::process_all_gather_start(), g.attrs, g.inputs, {started[k]}, g.loc});
    }
  }
  return out;
}

// Scatters in flight at once: their operands (whole gradients) are held until they run.
constexpr int kScattersInFlight = 2;

// Scatters: each done (with what reads its result, and what reads that, ...) sinks to the
// first reader that must stay: a fixed equation or a product (computation too large to move),
// or the end; and at the latest to the start of the scatter kScattersInFlight after it.
// Moving equations later keeps every value defined before its use.
Function scatters_deferred(const Function& f) {
  std::vector<Equation> eqs = f.equations;
  int next_id = f.next_id();
  std::size_t i = 0;
  while (i < eqs.size()) {
    if (!across_processes(eqs[i], prim::process_reduce_scatter())) {
      ++i;
      continue;
    }
    const Value result = eqs[i].outputs[0];
    const Value pending{next_id++, result.type};
    Equation start = eqs[i];
    start.prim = &prim::process_reduce_scatter_start();
    start.outputs = {pending};
    Equation done{
        &prim::process_reduce_scatter_done(), eqs[i].attrs, {pending}, {result}, eqs[i].loc};
    // Readers of the result, directly or through other readers, up to the first that stays.
    std::vector<bool> reads(static_cast<std::size_t>(next_id), false);
    reads[static_cast<std::size_t>(result.id)] = true;
    std::vector<std::size_t> moved;
    std::size_t until = i + 1;
    for (int later = 0; until < eqs.size(); ++until) {
      const Equation& e = eqs[until];
      if (across_processes(e, prim::process_reduce_scatter()) && ++later == kScattersInFlight)
        break;
      const bool reader = std::any_of(e.inputs.begin(), e.inputs.end(), [&](const Value& v) {
        return reads[static_cast<std::size_t>(v.id)];
      });
      if (!reader) continue;
      if (fixed(e) || e.prim->flops) break;
      moved.push_back(until);
      for (const Value& v : e.outputs) reads[static_cast<std::size_t>(v.id)] = true;
    }
    std::vector<Equation> order(eqs.begin(), eqs.begin() + static_cast<std::ptrdiff_t>(i));
    order.push_back(std::move(start));
    std::size_t m = 0;
    for (std::size_t j = i + 1; j < until; ++j) {
      if (m < moved.size() && moved[m] == j)
        ++m;
      else
        order.push_back(std::move(eqs[j]));
    }
    order.push_back(std::move(done));
    for (std::size_t j : moved) order.push_back(std::move(eqs[j]));
    for (std::size_t j = until; j < eqs.size(); ++j) order.push_back(std::move(eqs[j]));
    eqs = std::move(order);
    ++i;  // the equations that stayed between, other scatters among them, come next
  }
  Function out = f;
  out.equations = std::move(eqs);
  return out;
}

// Whether f or a function it holds has a collective the pass would split.
bool has_overlappable(const Function& f) {
  for (const Equation& e : f.equations) {
    if (across_processes(e, prim::process_all_gather()) ||
        across_processes(e, prim::process_reduce_scatter()))
      return true;
    for (const auto& [name, attr] : e.attrs.items())
      if (const auto* sub = std::get_if<FunctionRef>(&attr); sub && *sub && has_overlappable(**sub))
        return true;
  }
  return false;
}

Function overlap_in(const Function& f, int ahead, bool defer) {
  const Function body =
      ir::map_sub_functions(f, [=](const Function& sub) { return overlap_in(sub, ahead, defer); });
  const Function gathered = ahead > 0 ? gathers_ahead(body, ahead) : body;
  return defer ? scatters_deferred(gathered) : gathered;
}

}  // namespace

Function overlap_collectives(const Function& f) {
  const int ahead = setting("KILN_GATHER_AHEAD", 1);
  const bool defer = setting("KILN_DEFER_SCATTERS", 1) > 0;
  if ((ahead == 0 && !defer) || !has_overlappable(f)) return f;
  return overlap_in(ir::inline_calls(f), ahead, defer);
}

}  // namespace kiln::distributed
