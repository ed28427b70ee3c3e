// Coalescing a group's loops (layout.h).
#include "compiler/layout.h"

#include <algorithm>

namespace kiln::compiler {

using Dims = std::vector<int64_t>;

Layout coalesce(const Group& g) {
  Layout l;
  const std::size_t rank = g.domain.size();
  // Output strides: contiguous over the domain (inner) or over the kept axes (outer).
  Dims inner(rank, 0), outer(rank, 0);
  int64_t si = 1, so = 1;
  for (std::size_t a = rank; a-- > 0;) {
    inner[a] = si;
    si *= g.domain[a];
    if (!g.reduced[a]) {
      outer[a] = so;
      so *= g.domain[a];
    }
  }
  std::vector<Access*> all;
  l.loads.resize(g.nodes.size());
  for (std::size_t k = 0; k < g.nodes.size(); ++k)
    if (g.nodes[k].kind == Node::Kind::load) l.loads[k] = g.nodes[k].access;
  for (const GroupOutput& o : g.outputs)
    l.outputs.push_back({.offset = 0, .strides = o.level == Level::inner ? inner : outer});
  for (std::size_t k = 0; k < g.nodes.size(); ++k)
    if (g.nodes[k].kind == Node::Kind::load) all.push_back(&l.loads[k]);
  for (Access& a : l.outputs) all.push_back(&a);
  // A total's slot is row-major over the axes it keeps a sum per index of.
  l.totals.resize(g.nodes.size());
  for (const Group::TotalSlot& t : g.totals()) {
    const std::vector<int64_t>& over = g.nodes[static_cast<std::size_t>(t.node)].slots_over;
    Access& a = l.totals[static_cast<std::size_t>(t.node)];
    a = {.offset = t.offset, .strides = Dims(rank, 0)};
    int64_t st = 1;
    for (auto d = over.rbegin(); d != over.rend(); ++d) {
      a.strides[static_cast<std::size_t>(*d)] = st;
      st *= g.domain[static_cast<std::size_t>(*d)];
    }
    all.push_back(&a);
  }

  // Keep axes of size > 1; a reduction over size-1 axes only keeps one of them.
  std::vector<std::size_t> keep;
  for (std::size_t a = 0; a < rank; ++a)
    if (g.domain[a] != 1) keep.push_back(a);
  const bool reduces = g.has_reduction();
  bool kept_reduced = false;
  for (std::size_t a : keep) kept_reduced = kept_reduced || g.reduced[a];
  for (std::size_t a : keep) {
    l.domain.push_back(g.domain[a]);
    l.reduced.push_back(g.reduced[a]);
  }
  // Rebuild the accesses over the kept axes, then merge neighbours.
  for (Access* x : all) {
    Dims s;
    for (std::size_t a : keep) s.push_back(x->strides[a]);
    x->strides = std::move(s);
  }
  if (reduces && !kept_reduced) {
    // Only size-1 axes are reduced: one in front, so a kept innermost axis stays innermost.
    l.domain.insert(l.domain.begin(), 1);
    l.reduced.insert(l.reduced.begin(), true);
    for (Access* x : all) x->strides.insert(x->strides.begin(), 0);
  }
  if (l.domain.empty()) {
    l.domain.push_back(1);
    l.reduced.push_back(false);
    for (Access* x : all) x->strides.push_back(0);
  }
  for (std::size_t a = l.domain.size() - 1; a > 0; --a) {
    const bool same_kind = l.reduced[a] == l.reduced[a - 1];
    const bool contiguous = std::all_of(all.begin(), all.end(), [&](const Access* x) {
      return x->strides[a - 1] == x->strides[a] * l.domain[a];
    });
    if (!same_kind || !contiguous) continue;
    l.domain[a - 1] *= l.domain[a];
    l.domain.erase(l.domain.begin() + static_cast<std::ptrdiff_t>(a));
    l.reduced.erase(l.reduced.begin() + static_cast<std::ptrdiff_t>(a));
    for (Access* x : all) {
      x->strides[a - 1] = x->strides[a];
      x->strides.erase(x->strides.begin() + static_cast<std::ptrdiff_t>(a));
    }
  }
  return l;
}

}  // namespace kiln::compiler
