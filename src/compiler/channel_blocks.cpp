// Channel-blocked values (channel_blocks.h).
#include "compiler/channel_blocks.h"

#include <algorithm>
#include <numeric>

#include "core/builtins.h"

namespace kiln::compiler {
namespace {

using Dims = std::vector<int64_t>;

Dims row_major(const Dims& shape) {
  Dims s(shape.size(), 1);
  for (std::size_t a = shape.size(); a-- > 1;) s[a - 1] = s[a] * shape[a];
  return s;
}

// How a group can take part. Its loops split C when its domain is [N, C, H, W] with C a
// multiple of the block and what it stores once per kept index (outer outputs, totals) keeps
// its order over the split axes (C's two parts are apart when H or W lies between them). The
// values it reads or writes whole — over its domain, element by element, at every read — are
// then stored blocked all together or not at all: a group whose operands differ in layout would
// transpose in its loops.
struct GroupFit {
  bool splits = false;
  std::vector<int> whole;  // value ids
  std::vector<int> other;  // the values it reads or writes otherwise
};

GroupFit fit(const Group& g, int64_t block, const std::vector<TensorType>& types) {
  GroupFit r;
  const Dims& d = g.domain;
  r.splits = d.size() == 4 && d[1] % block == 0;
  auto keeps_c_apart = [&](const std::vector<bool>& kept) {
    return kept[1] && (kept[2] || kept[3]);
  };
  std::vector<bool> kept(d.size());
  for (std::size_t a = 0; a < d.size(); ++a) kept[a] = !g.reduced[a];
  for (const GroupOutput& o : g.outputs)
    if (r.splits && o.level == Level::outer) r.splits = !keeps_c_apart(kept);
  for (const Node& n : g.nodes)
    if (r.splits && n.kind == Node::Kind::total) {
      std::vector<bool> over(d.size(), false);
      for (int64_t a : n.slots_over) over[static_cast<std::size_t>(a)] = true;
      r.splits = !keeps_c_apart(over);
    }
  const Dims plain = row_major(d);
  auto whole_read = [&](const Access& a) {
    if (a.offset != 0 || a.strides.size() != d.size()) return false;
    for (std::size_t k = 0; k < d.size(); ++k)
      if (a.strides[k] != 0 && a.strides[k] != plain[k]) return false;
    return true;
  };
  for (std::size_t i = 0; i < g.inputs.size(); ++i) {
    const int v = g.inputs[i];
    bool whole = types[static_cast<std::size_t>(v)].shape.dims() == d;
    for (const Node& n : g.nodes)
      if (n.kind == Node::Kind::load && n.input == static_cast<int>(i))
        whole = whole && whole_read(n.access);
    (whole ? r.whole : r.other).push_back(v);
  }
  for (const GroupOutput& o : g.outputs) {
    const bool whole =
        o.level == Level::inner && types[static_cast<std::size_t>(o.value)].shape.dims() == d;
    (whole ? r.whole : r.other).push_back(o.value);
  }
  return r;
}

// The rule of an equation that can run with blocked operands, or null. Not for a primitive that
// may write its result over an input (the executor would write plain data there first).
const Primitive::ChannelBlocked* rule_of(const ir::Equation& e, int64_t block) {
  const auto& r = e.prim->channel_blocked;
  if (!r || e.prim->in_place || !detail::builtin_kernels_only(*e.prim)) return nullptr;
  std::vector<TensorType> in;
  for (const ir::Value& v : e.inputs) in.push_back(v.type);
  return r->applies(in, e.attrs, block) ? &*r : nullptr;
}

// The group over [N, C/b, H, W, b], element (n, c, h, w) at (n, c / b, h, w, c % b): blocked
// values read and write along that domain's rows, plain ones with C's stride split in two.
void split_channels(Group& g, int64_t b, const std::vector<bool>& blocked) {
  const Dims d = g.domain;
  const Dims in_blocks{d[1] * d[2] * d[3], d[2] * d[3] * b, d[3] * b, b, 1};
  g.domain = {d[0], d[1] / b, d[2], d[3], b};
  g.reduced.push_back(g.reduced[1]);
  auto split = [](int64_t a) { return a == 1 ? Dims{1, 4} : Dims{a}; };
  for (Node& n : g.nodes) {
    if (n.kind == Node::Kind::load) {
      const Dims s = n.access.strides;
      if (blocked[static_cast<std::size_t>(g.inputs[static_cast<std::size_t>(n.input)])]) {
        n.access.strides.clear();
        for (std::size_t k = 0; k < 5; ++k)
          n.access.strides.push_back(s[k == 4 ? 1 : k] != 0 ? in_blocks[k] : 0);
      } else {
        n.access.strides = {s[0], s[1] * b, s[2], s[3], s[1]};
      }
    }
    if (n.kind == Node::Kind::total) {
      Dims over;
      for (int64_t a : n.slots_over)
        for (int64_t x : split(a)) over.push_back(x);
      std::sort(over.begin(), over.end());
      n.slots_over = std::move(over);
    }
  }
}

struct Components {
  std::vector<int> parent;
  explicit Components(std::size_t n) : parent(n) { std::iota(parent.begin(), parent.end(), 0); }
  int root(int v) {
    while (parent[static_cast<std::size_t>(v)] != v)
      v = parent[static_cast<std::size_t>(v)] =
          parent[static_cast<std::size_t>(parent[static_cast<std::size_t>(v)])];
    return v;
  }
  void join(int a, int b) { parent[static_cast<std::size_t>(root(a))] = root(b); }
};

}  // namespace

ChannelBlocks block_channels(const ir::Function& f, Partition& p, std::optional<int64_t> block) {
  const std::size_t n = static_cast<std::size_t>(f.next_id());
  ChannelBlocks out{.block = block.value_or(0), .blocked = std::vector<bool>(n, false)};
  if (!block) return out;
  const int64_t b = *block;
  std::vector<TensorType> types(n);
  for (const ir::Equation& e : f.equations)
    for (const ir::Value& v : e.outputs) types[static_cast<std::size_t>(v.id)] = v.type;

  // Candidates: images made by a step, stored in a buffer of their own, read by no view and not
  // returned, then struck off by every step that cannot take them blocked.
  std::vector<bool>& cand = out.blocked;
  for (const ir::Equation& e : f.equations)
    for (const ir::Value& v : e.outputs) {
      const Shape& s = v.type.shape;
      const auto& view = p.views[static_cast<std::size_t>(v.id)];
      cand[static_cast<std::size_t>(v.id)] =
          s.rank() == 4 && s.numel() > 0 && s[1] % b == 0 && view && view->buffer == v.id;
    }
  auto strike = [&](int v) { cand[static_cast<std::size_t>(v)] = false; };
  for (std::size_t v = 0; v < n; ++v)
    if (p.views[v] && p.views[v]->buffer != static_cast<int>(v)) strike(p.views[v]->buffer);
  for (const ir::Value& v : f.results) strike(p.views[static_cast<std::size_t>(v.id)]->buffer);

  std::vector<GroupFit> fits;
  std::vector<const Primitive::ChannelBlocked*> rules;
  for (const Step& s : p.steps) {
    if (const auto* g = std::get_if<Group>(&s)) {
      GroupFit gf = fit(*g, b, types);
      for (int v : gf.other) strike(v);
      if (!gf.splits) {
        for (int v : gf.whole) strike(v);
        gf.whole.clear();
      }
      fits.push_back(std::move(gf));
      rules.push_back(nullptr);
      continue;
    }
    const ir::Equation& e = f.equations[static_cast<std::size_t>(std::get<Opaque>(s).equation)];
    const Primitive::ChannelBlocked* r = rule_of(e, b);
    for (std::size_t k = 0; k < e.inputs.size(); ++k) {
      const int v = e.inputs[k].id;
      const bool takes = r && std::count(r->inputs.begin(), r->inputs.end(), static_cast<int>(k));
      if (!takes) strike(v);
    }
    for (std::size_t k = 0; k < e.outputs.size(); ++k)
      if (!r || k != 0 || !r->output) strike(e.outputs[k].id);
    fits.emplace_back();
    rules.push_back(r);
  }
  // A group whose whole values cannot all be blocked blocks none of them.
  for (bool changed = true; changed;) {
    changed = false;
    for (const GroupFit& gf : fits) {
      const auto blocked = [&](int v) { return cand[static_cast<std::size_t>(v)]; };
      if (std::any_of(gf.whole.begin(), gf.whole.end(), blocked) &&
          !std::all_of(gf.whole.begin(), gf.whole.end(), blocked)) {
        for (int v : gf.whole) strike(v);
        changed = true;
      }
    }
  }
  // Blocking pays where it spares a convolution its reorders: keep the values connected, through
  // the steps that read and write them, to one that computes blocked.
  Components c(n);
  std::vector<std::vector<int>> operands(p.steps.size());
  for (std::size_t i = 0; i < p.steps.size(); ++i) {
    std::vector<int>& vs = operands[i];
    if (std::holds_alternative<Group>(p.steps[i])) {
      vs = fits[i].whole;
    } else {
      const ir::Equation& e =
          f.equations[static_cast<std::size_t>(std::get<Opaque>(p.steps[i]).equation)];
      for (const ir::Value& v : e.inputs) vs.push_back(v.id);
      for (const ir::Value& v : e.outputs) vs.push_back(v.id);
    }
    std::erase_if(vs, [&](int v) { return !cand[static_cast<std::size_t>(v)]; });
    for (int v : vs) c.join(v, vs.front());
  }
  std::vector<bool> anchored(n, false);
  for (std::size_t i = 0; i < p.steps.size(); ++i)
    if (!operands[i].empty() && rules[i] && rules[i]->computes_blocked)
      anchored[static_cast<std::size_t>(c.root(operands[i].front()))] = true;
  for (std::size_t v = 0; v < n; ++v)
    cand[v] = cand[v] && anchored[static_cast<std::size_t>(c.root(static_cast<int>(v)))];
  for (std::size_t i = 0; i < p.steps.size(); ++i)
    if (auto* g = std::get_if<Group>(&p.steps[i]);
        g && !fits[i].whole.empty() && cand[static_cast<std::size_t>(fits[i].whole[0])])
      split_channels(*g, b, cand);
  return out;
}

}  // namespace kiln::compiler
