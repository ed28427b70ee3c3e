// Fusion: list scheduling that keeps adding ready equations to the open group while they fit
// its domain, so that independent chains interleaved in the IR still fuse (docs/DESIGN.md,
// "Compiler").
#include "compiler/fusion.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>

namespace kiln::compiler {

using lowering::IndexMap;
using lowering::Lowering;
using lowering::Reduction;

int64_t Group::outer_size() const {
  int64_t n = 1;
  for (std::size_t a = 0; a < domain.size(); ++a)
    if (!reduced[a]) n *= domain[a];
  return n;
}
int64_t Group::inner_size() const {
  int64_t n = 1;
  for (std::size_t a = 0; a < domain.size(); ++a)
    if (reduced[a]) n *= domain[a];
  return n;
}
bool Group::has_reduction() const {
  return std::find(reduced.begin(), reduced.end(), true) != reduced.end();
}
std::vector<int> Group::rounds() const {
  std::vector<int> round(nodes.size(), 0);
  for (std::size_t k = 0; k < nodes.size(); ++k) {
    for (int a : nodes[k].args) round[k] = std::max(round[k], round[static_cast<std::size_t>(a)]);
    if (nodes[k].kind == Node::Kind::reduce) ++round[k];
  }
  return round;
}
std::vector<Group::TotalSlot> Group::totals() const {
  std::vector<TotalSlot> slots;
  int64_t offset = 0;
  for (std::size_t k = 0; k < nodes.size(); ++k) {
    if (nodes[k].kind != Node::Kind::total) continue;
    int64_t size = 1;
    for (int64_t a : nodes[k].slots_over) size *= domain[static_cast<std::size_t>(a)];
    slots.push_back({.node = static_cast<int>(k), .offset = offset, .size = size});
    offset += size;
  }
  return slots;
}
int64_t Group::total_doubles() const {
  const std::vector<TotalSlot> slots = totals();
  return slots.empty() ? 0 : slots.back().offset + slots.back().size;
}

namespace {

using Dims = std::vector<int64_t>;

Dims dims_of(const ir::Value& v) { return v.type.shape.dims(); }

Dims contiguous_strides(const Dims& shape) {
  Dims s(shape.size());
  int64_t st = 1;
  for (std::size_t i = shape.size(); i-- > 0;) {
    s[i] = st;
    st *= shape[i];
  }
  return s;
}

// The index map a layout primitive declares with its lowering (kiln/lowering.h).
std::optional<IndexMap> index_map(const Primitive* p) {
  return p->lowering ? p->lowering->index_map : std::nullopt;
}
bool is_layout(const Primitive* p) { return index_map(p).has_value(); }

// A reshape of a strided view without copying, when its dimensions can be regrouped (numpy's
// rule): each run of input dimensions that multiplies to a run of output dimensions must be
// contiguous with itself.
std::optional<Dims> reshape_strides(const Dims& in, const Dims& in_strides, const Dims& out) {
  Dims is, ist;
  for (std::size_t i = 0; i < in.size(); ++i)
    if (in[i] != 1) {
      is.push_back(in[i]);
      ist.push_back(in_strides[i]);
    }
  Dims os(out.size(), 0);
  int64_t numel = 1;
  for (int64_t d : out) numel *= d;
  if (numel == 0) return os;
  std::size_t i = 0, j = 0;
  while (i < is.size() || j < out.size()) {
    if (j < out.size() && out[j] == 1) {
      ++j;
      continue;
    }
    if (i >= is.size() || j >= out.size()) return std::nullopt;
    // Grow runs [i, i2) and [j, j2) until their products match.
    std::size_t i2 = i + 1, j2 = j + 1;
    int64_t pi = is[i], pj = out[j];
    while (pi != pj) {
      if (pi < pj) {
        if (i2 >= is.size()) return std::nullopt;
        pi *= is[i2++];
      } else {
        if (j2 >= out.size()) return std::nullopt;
        pj *= out[j2++];
      }
    }
    for (std::size_t k = i; k + 1 < i2; ++k)
      if (ist[k] != ist[k + 1] * is[k + 1]) return std::nullopt;
    int64_t st = ist[i2 - 1];
    for (std::size_t k = j2; k-- > j;) {
      os[k] = out[k] == 1 ? 0 : st;
      st *= out[k];
    }
    i = i2;
    j = j2;
  }
  return os;
}

// The view a layout equation makes of its input's view, if it can be read in place.
std::optional<View> layout_view(const ir::Equation& e, const View& in) {
  View out{.buffer = in.buffer, .shape = dims_of(e.outputs[0]), .access = in.access};
  const std::size_t r_out = out.shape.size(), r_in = in.shape.size();
  const std::optional<IndexMap> map = index_map(e.prim);
  if (map == IndexMap::broadcast) {
    out.access.strides.assign(r_out, 0);
    for (std::size_t j = r_out - r_in; j < r_out; ++j) {
      const std::size_t i = j - (r_out - r_in);
      out.access.strides[j] = in.shape[i] == out.shape[j] ? in.access.strides[i] : 0;
    }
  } else if (map == IndexMap::transpose) {
    const auto& perm = e.attrs.get_ints("perm");
    for (std::size_t j = 0; j < r_out; ++j)
      out.access.strides[j] = in.access.strides[static_cast<std::size_t>(perm[j])];
  } else if (map == IndexMap::slice) {
    const auto& start = e.attrs.get_ints("start");
    const auto& step = e.attrs.get_ints("step");
    for (std::size_t i = 0; i < r_in; ++i) {
      if (out.shape[i] > 0) out.access.offset += start[i] * in.access.strides[i];
      out.access.strides[i] *= step[i];
    }
  } else if (map == IndexMap::reshape) {
    auto s = reshape_strides(in.shape, in.access.strides, out.shape);
    if (!s) return std::nullopt;
    out.access.strides = *s;
  } else {
    return std::nullopt;
  }
  return out;
}

// Which axes of its input a reduce equation reduces; axes may be negative in the IR (the type
// rule accepts them) and count from the end.
std::vector<bool> reduced_axes(const ir::Equation& e) {
  const auto rank = static_cast<int64_t>(e.inputs[0].type.shape.rank());
  std::vector<bool> axes(static_cast<std::size_t>(rank), false);
  for (int64_t a : e.attrs.get_ints("axes"))
    axes[static_cast<std::size_t>(a < 0 ? a + rank : a)] = true;
  return axes;
}

// Whether a reduction over `reduced` keeps the domain's innermost axis of size > 1: the row
// template (codegen.cpp), which accumulates whole rows, one accumulator per kept index, and
// takes any reduced axes; otherwise the column template, which reduces along the innermost.
bool keeps_innermost(const Dims& domain, const std::vector<bool>& reduced) {
  for (std::size_t a = domain.size(); a-- > 0;)
    if (domain[a] != 1) return !reduced[a];
  return false;
}

// The most reduced indices of a total over the kept axes: each kernel call sums into an array
// of that many doubles, one per thread, which the runtime adds up after the kernel.
constexpr int64_t kMaxTotalSlots = int64_t{1} << 16;
// Nodes in one group at most: LLVM's register allocation and scheduling grow faster than the
// function they compile, so a long unrolled program fused into one loop body took most of its
// compile time there. Groups of real layers have tens to a few hundred nodes.
constexpr std::size_t kMaxGroupNodes = 512;

// Rows from which a row group of sums runs as totals, threads splitting its rows
// (Builder::sums_rows_only).
constexpr int64_t kMinSplitRows = 64;
// Elements of a domain from which a group reducing all its axes is serial (Builder::serial).
constexpr int64_t kSerialDomain = int64_t{1} << 16;
// Elements of the rows a sum over all axes of such a domain splits it into (Builder::
// add_total_by_rows): a few vectors' worth, so that a row's loop is not mostly its tail.
constexpr int64_t kRowElements = 256;

// Whether an access reads the domain's innermost axis of size > 1 contiguously or as a
// broadcast (the vector loops run along it).
bool reads_along_rows(const Access& a, const Dims& domain) {
  for (std::size_t k = domain.size(); k-- > 0;)
    if (domain[k] != 1) return a.strides[k] == 0 || a.strides[k] == 1;
  return true;
}

// A row reduction whose rows hold fewer than 8 elements runs its kernel: the row template's
// step of one element (what remains after steps of W, W/2, ..., 2) turns a select of loaded
// values into a branch on the data, and a bias gradient after relu over rows of 3 ran 2.5x
// slower than the kernel (docs/DESIGN.md, "Compiler").
bool short_rows(const ir::Equation& e) {
  const Dims s = dims_of(e.inputs[0]);
  const std::vector<bool> axes = reduced_axes(e);
  if (!keeps_innermost(s, axes)) return false;
  for (std::size_t a = s.size(); a-- > 0;)
    if (s[a] != 1) return s[a] < 8;
  return false;
}

// Whether a reduction is a sum of floats that accumulates in double (a total's arithmetic).
bool float_sum(const Primitive* p, DType in) {
  return p->lowering->reduction == Reduction::sum && (in == float32 || in == float64);
}

// Whether the lowering takes the equation's dtypes (Lowering::dtypes: integer division and
// power check their operands and raise, so their kernels run).
bool lowered_dtype(const ir::Equation& e, const Lowering& l) {
  const DType in = e.inputs.empty() ? float32 : e.inputs.back().type.dtype;
  // Complex values run through their kernels (the generator has no complex arithmetic).
  auto complex_value = [](const ir::Value& v) { return is_complex(v.type.dtype); };
  if (std::any_of(e.inputs.begin(), e.inputs.end(), complex_value) ||
      std::any_of(e.outputs.begin(), e.outputs.end(), complex_value))
    return false;
  return l.dtypes.contains(in);
}

// One group being built.
class Builder {
 public:
  Builder(const ir::Function& f, const std::vector<std::optional<View>>& views)
      : f_(f), views_(views) {}

  bool empty() const { return g_.equations.empty(); }
  // After finish: the broadcasts that are views of the group's stored outputs.
  const std::vector<int>& views_after() const { return views_after_; }
  bool holds(int value) const { return members_.count(value) != 0; }
  const Group& group() const { return g_; }

  // Adds equation i if it fits the group; false (and no change) otherwise.
  bool try_add(int i) {
    if (g_.nodes.size() >= kMaxGroupNodes) return false;
    const ir::Equation& e = f_.equations[static_cast<std::size_t>(i)];
    if (is_reduction(e.prim)) return add_reduce(i, e);
    if (is_layout(e.prim)) return add_alias(i, e);
    return add_elementwise(i, e);
  }

  // Closes the group: the values something outside it (or the caller) reads become outputs.
  // A reduced value broadcast back over the domain is stored once, unbroadcast: what reads the
  // broadcast outside reads a view of it (views_after(), for the caller to make).
  Group finish(const std::vector<std::vector<int>>& users, const std::vector<bool>& is_result,
               const std::vector<const ir::Value*>& value_of) {
    std::unordered_set<int> inside(g_.equations.begin(), g_.equations.end());
    std::set<int> stored;
    for (const auto& [value, member] : members_) {
      bool needed = is_result[static_cast<std::size_t>(value)];
      for (int u : users[static_cast<std::size_t>(value)])
        if (!inside.count(u)) needed = true;
      if (!needed) continue;
      if (auto b = broadcasts_.find(value); b != broadcasts_.end()) {
        views_after_.push_back(b->second);
        stored.insert(f_.equations[static_cast<std::size_t>(b->second)].inputs[0].id);
      } else {
        stored.insert(value);
      }
    }
    for (int value : stored) {
      const int member = members_.at(value);
      const Dims shape = dims_of(*value_of[static_cast<std::size_t>(value)]);
      Level level = reducing() && shape != g_.domain ? Level::outer : Level::inner;
      if (g_.nodes[static_cast<std::size_t>(member)].level == Level::total) level = Level::total;
      g_.outputs.push_back({.node = member, .value = value, .level = level});
    }
    if (sums_rows_only()) sum_rows_as_totals();
    std::sort(g_.outputs.begin(), g_.outputs.end(),
              [](const GroupOutput& a, const GroupOutput& b) { return a.value < b.value; });
    if (reduces_everything()) walk_first_input_contiguously();
    return std::move(g_);
  }

 private:
  // (Axes of size 1 do not count: kept or reduced, they are one index.)
  bool reduces_every_axis() const {
    if (!reducing()) return false;
    for (std::size_t a = 0; a < g_.domain.size(); ++a)
      if (!g_.reduced[a] && g_.domain[a] != 1) return false;
    return true;
  }

  // Whether the group reduces every axis of its domain and stores nothing over it: then the
  // order of its axes is its own choice (a sum's terms are added in another order, within the
  // reduction bound of the compiled walks).
  bool reduces_everything() const {
    if (!reduces_every_axis()) return false;
    for (const GroupOutput& o : g_.outputs)
      if (o.level != Level::outer) return false;
    return std::none_of(g_.nodes.begin(), g_.nodes.end(),
                        [](const Node& n) { return n.level == Level::total; });
  }

  // Whether a row group's reductions are float sums that nothing in the group reads and that
  // leave it only as sums (a broadcast of one is a view of it outside), over at least
  // kMinSplitRows rows and no fewer rows than kept indices. Threads split a row group's kept
  // indices, so each reads a slice of every row: a sum over the rows of [1024, 256] ran no faster
  // on two threads than on one. As totals, threads split the rows instead. (A handful of rows would
  // split unevenly, and many kept indices would make each thread's array of doubles large: those
  // stay as they are.)
  bool sums_rows_only() const {
    if (!reducing() || !keeps_innermost(g_.domain, g_.reduced) ||
        g_.outer_size() > kMaxTotalSlots ||
        g_.inner_size() < std::max(kMinSplitRows, g_.outer_size()))
      return false;
    for (const Node& n : g_.nodes) {
      if (n.level == Level::outer && n.kind != Node::Kind::reduce) return false;
      for (int a : n.args)
        if (g_.nodes[static_cast<std::size_t>(a)].kind == Node::Kind::reduce) return false;
      if (n.kind == Node::Kind::reduce &&
          !float_sum(n.prim, g_.nodes[static_cast<std::size_t>(n.args[0])].dtype))
        return false;
    }
    return std::all_of(g_.outputs.begin(), g_.outputs.end(), [&](const GroupOutput& o) {
      return g_.nodes[static_cast<std::size_t>(o.node)].kind != Node::Kind::reduce ||
             o.level == Level::outer;
    });
  }
  // The group's kept and reduced axes swap (the column template, threads splitting the rows)
  // and each sum becomes a total over the new kept axes, with a slot per index of the old ones.
  void sum_rows_as_totals() {
    for (Node& n : g_.nodes)
      if (n.kind == Node::Kind::reduce) {
        n.kind = Node::Kind::total;
        n.level = Level::total;
      }
    for (GroupOutput& o : g_.outputs)
      if (g_.nodes[static_cast<std::size_t>(o.node)].kind == Node::Kind::total)
        o.level = Level::total;
    for (std::size_t a = 0; a < g_.domain.size(); ++a)
      if (g_.domain[a] != 1) g_.reduced[a] = !g_.reduced[a];
    Dims slots;
    for (std::size_t a = 0; a < g_.domain.size(); ++a)
      if (g_.reduced[a]) slots.push_back(static_cast<int64_t>(a));
    for (Node& n : g_.nodes)
      if (n.kind == Node::Kind::total) n.slots_over = slots;
  }

  // Orders the domain's axes by the first inner load's strides (broadcasts aside, along any
  // axis), largest first, so that it is read along its memory: a gradient's global norm sums
  // the squares of a transposed view, and reading it across its rows ran at 1 GB/s.
  void walk_first_input_contiguously() {
    const auto first = std::find_if(g_.nodes.begin(), g_.nodes.end(), [&](const Node& n) {
      if (n.kind != Node::Kind::load || n.level != Level::inner) return false;
      for (std::size_t a = 0; a < g_.domain.size(); ++a)
        if (g_.domain[a] != 1 && n.access.strides[a] == 0) return false;
      return true;
    });
    if (first == g_.nodes.end()) return;
    const Dims strides = first->access.strides;
    std::vector<std::size_t> order(g_.domain.size());
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      return std::abs(strides[a]) > std::abs(strides[b]);
    });
    auto permuted = [&](const auto& d) {
      std::remove_cvref_t<decltype(d)> out(d.size());
      for (std::size_t i = 0; i < d.size(); ++i) out[i] = d[order[i]];
      return out;
    };
    g_.domain = permuted(g_.domain);
    g_.reduced = permuted(g_.reduced);  // a kept axis of size 1 moves with the others
    for (Node& n : g_.nodes)
      if (n.kind == Node::Kind::load) n.access.strides = permuted(n.access.strides);
  }

  // The kept axes' shape, and the same with the reduced axes as 1s.
  Dims outer_shape() const {
    Dims s;
    for (std::size_t a = 0; a < g_.domain.size(); ++a)
      if (!g_.reduced[a]) s.push_back(g_.domain[a]);
    return s;
  }
  Dims keepdims_shape() const {
    Dims s = g_.domain;
    for (std::size_t a = 0; a < s.size(); ++a)
      if (g_.reduced[a]) s[a] = 1;
    return s;
  }
  bool reducing() const { return g_.has_reduction(); }
  std::optional<Level> level_of_shape(const Dims& s) const {
    if (s == g_.domain) return Level::inner;
    if (reducing() && (s == outer_shape() || s == keepdims_shape())) return Level::outer;
    return std::nullopt;
  }

  // Whether a read gathers along the vector loop of a row reduction over `reduced` (the
  // domain's innermost axis of size > 1): a transposed operand made the row template 2x slower
  // than the reduction's kernel, which reads such an operand along the reduced axis instead.
  bool gathers_rows(const Access& a, const std::vector<bool>& reduced) const {
    return keeps_innermost(g_.domain, reduced) && !reads_along_rows(a, g_.domain);
  }

  // The node that reads IR value `value` (a member, or a view of a buffer) at `level`.
  std::optional<int> operand(const ir::Value& value, Level level) {
    const int v = value.id;
    if (auto it = members_.find(v); it != members_.end()) {
      const Node& n = g_.nodes[static_cast<std::size_t>(it->second)];
      // Outer values read from inner loops are broadcast; the reverse cannot be. A total is
      // known only after the group has run.
      if (n.level == Level::total) return std::nullopt;
      if (level == Level::outer && n.level == Level::inner) return std::nullopt;
      return it->second;
    }
    const auto& view = views_[static_cast<std::size_t>(v)];
    if (!view) return std::nullopt;  // not available yet
    Access a{.offset = view->access.offset, .strides = Dims(g_.domain.size(), 0)};
    if (view->shape == g_.domain) {
      if (level != Level::inner && reducing()) return std::nullopt;
      a.strides = view->access.strides;
    } else if (level == Level::outer && view->shape == keepdims_shape()) {
      for (std::size_t k = 0; k < g_.domain.size(); ++k)
        if (!g_.reduced[k]) a.strides[k] = view->access.strides[k];
    } else if (level == Level::outer && view->shape == outer_shape()) {
      std::size_t j = 0;
      for (std::size_t k = 0; k < g_.domain.size(); ++k)
        if (!g_.reduced[k]) a.strides[k] = view->access.strides[j++];
    } else {
      return std::nullopt;
    }
    for (std::size_t k = 0; k < g_.domain.size(); ++k)
      if (g_.domain[k] == 1) a.strides[k] = 0;
    if (reducing() && gathers_rows(a, g_.reduced)) return std::nullopt;
    auto in = std::find(g_.inputs.begin(), g_.inputs.end(), view->buffer);
    const int input = static_cast<int>(in - g_.inputs.begin());
    if (in == g_.inputs.end()) g_.inputs.push_back(view->buffer);
    for (std::size_t k = 0; k < g_.nodes.size(); ++k) {
      const Node& n = g_.nodes[k];
      if (n.kind == Node::Kind::load && n.input == input && n.access == a && n.level == level)
        return static_cast<int>(k);
    }
    Node n{.kind = Node::Kind::load,
           .level = level,
           .dtype = value.type.dtype,
           .input = input,
           .access = std::move(a)};
    g_.nodes.push_back(std::move(n));
    return static_cast<int>(g_.nodes.size() - 1);
  }

  void start(const Dims& domain) {
    g_.domain = domain;
    g_.reduced.assign(domain.size(), false);
  }

  // Collects operand nodes for all inputs of e at `level`, or nothing if one does not fit.
  std::optional<std::vector<int>> operands(const ir::Equation& e, Level level) {
    // Snapshot so that a failed attempt leaves no stray loads behind.
    const std::size_t nodes = g_.nodes.size(), inputs = g_.inputs.size();
    std::vector<int> args;
    for (const ir::Value& v : e.inputs) {
      auto n = operand(v, level);
      if (!n) {
        g_.nodes.resize(nodes);
        g_.inputs.resize(inputs);
        return std::nullopt;
      }
      args.push_back(*n);
    }
    return args;
  }

  // Adds equation i as a node computing its output from `args`.
  void add_node(int i, Node::Kind kind, Level level, std::vector<int> args) {
    const ir::Equation& e = f_.equations[static_cast<std::size_t>(i)];
    g_.nodes.push_back(Node{.kind = kind,
                            .level = level,
                            .dtype = e.outputs[0].type.dtype,
                            .prim = e.prim,
                            .attrs = e.attrs,
                            .args = std::move(args)});
    members_[e.outputs[0].id] = static_cast<int>(g_.nodes.size() - 1);
    g_.equations.push_back(i);
  }

  bool add_elementwise(int i, const ir::Equation& e) {
    const Dims s = dims_of(e.outputs[0]);
    const bool was_empty = empty();
    if (was_empty) start(s);
    const std::optional<Level> level = level_of_shape(s);
    if (!level) return false;
    auto args = operands(e, *level);
    if (!args) {
      if (was_empty) g_ = Group{};
      return false;
    }
    add_node(i, Node::Kind::op, *level, std::move(*args));
    return true;
  }

  // Whether the group reduces every axis of a large domain: it has one kept index, so one
  // thread runs all of it. Its result is then not broadcast back over the domain inside it:
  // what waits for it there (a clipped gradient's update after its global norm) reads the
  // broadcast as a view in a group of its own, which threads split. A small domain stays fused
  // (a group costs microseconds).
  bool serial() const { return reduces_every_axis() && g_.inner_size() >= kSerialDomain; }

  bool add_reduce(int i, const ir::Equation& e) {
    const Dims s = dims_of(e.inputs[0]);
    const std::vector<bool> axes = reduced_axes(e);
    // Reducing no axes is the identity: an elementwise node.
    if (std::find(axes.begin(), axes.end(), true) == axes.end()) return add_elementwise(i, e);
    const bool was_empty = empty(), had_reductions = reducing();
    if (was_empty) {
      start(s);
      g_.reduced = axes;
    } else if (s != g_.domain) {
      return false;
    } else if (!reducing()) {
      // A column reduction joins an elementwise group only over trailing axes (its other loops
      // then stay contiguous; size-1 axes do not count); a row reduction over any axes.
      bool seen = false, trailing = true;
      for (std::size_t a = 0; a < axes.size(); ++a) {
        if (s[a] == 1) continue;
        trailing = trailing && !(seen && !axes[a]);
        seen = seen || axes[a];
      }
      if (!trailing && !keeps_innermost(s, axes)) return add_split_sum(i, e, axes);
      for (const Node& n : g_.nodes)
        if (n.level != Level::inner || (n.kind == Node::Kind::load && gathers_rows(n.access, axes)))
          return false;
      g_.reduced = axes;
    } else if (axes != g_.reduced) {
      return add_total(i, e, axes);
    }
    if (!had_reductions && serial() && add_total_by_rows(i, e)) return true;
    auto args = operands(e, Level::inner);
    if (!args) {
      if (was_empty) {
        g_ = Group{};
      } else if (std::none_of(g_.nodes.begin(), g_.nodes.end(),
                              [](const Node& n) { return n.kind == Node::Kind::reduce; })) {
        g_.reduced.assign(g_.domain.size(), false);
      }
      return false;
    }
    add_node(i, Node::Kind::reduce, Level::outer, std::move(*args));
    return true;
  }

  // A float sum over the kept axes of a column group, or over all its reduced axes and some or
  // all of its kept ones: the first is accumulated per reduced index in the loop over the
  // reduced axes, the second as the sum of each kept index's sum over them, per index of the
  // kept axes it does not sum (kept in double, so that the result is rounded once, as the
  // interpreter's is). Either way the sum never goes through memory at the domain's size.
  bool add_total(int i, const ir::Equation& e, const std::vector<bool>& axes) {
    if (!float_sum(e.prim, e.inputs[0].type.dtype) || keeps_innermost(g_.domain, g_.reduced))
      return false;
    bool over_kept = true, over_reduced = true;
    for (std::size_t a = 0; a < axes.size(); ++a) {
      if (g_.domain[a] == 1) continue;
      over_kept = over_kept && axes[a] == !g_.reduced[a];
      over_reduced = over_reduced && (axes[a] || !g_.reduced[a]);
    }
    if (!over_kept && !over_reduced) return false;
    Dims slots_over;
    int64_t slots = 1;
    for (std::size_t a = 0; a < axes.size(); ++a)
      if (g_.domain[a] != 1 && !axes[a]) {
        slots_over.push_back(static_cast<int64_t>(a));
        slots *= g_.domain[a];
      }
    // A kernel call keeps a double per slot: bounded, as the row template's blocks.
    if (slots > kMaxTotalSlots) return false;
    const std::size_t nodes = g_.nodes.size(), inputs = g_.inputs.size();
    auto args = operands(e, Level::inner);
    if (!args) return false;
    const Node& arg = g_.nodes[static_cast<std::size_t>((*args)[0])];
    // A value broadcast over the reduced axes (an outer node) has one slot per kept index,
    // not per reduced index; and a load that gathers along the row would run slower here than
    // in a group of its own.
    const bool gathers = arg.kind == Node::Kind::load && !reads_along_rows(arg.access, g_.domain);
    if ((over_kept && arg.level != Level::inner) || gathers) {
      g_.nodes.resize(nodes);
      g_.inputs.resize(inputs);
      return false;
    }
    if (!over_kept) {
      std::vector<int64_t> reduced;
      for (std::size_t a = 0; a < axes.size(); ++a)
        if (g_.reduced[a]) reduced.push_back(static_cast<int64_t>(a));
      Attrs attrs;
      attrs.set("axes", reduced);
      g_.nodes.push_back(Node{.kind = Node::Kind::reduce,
                              .level = Level::outer,
                              .dtype = float64,
                              .prim = e.prim,
                              .attrs = std::move(attrs),
                              .args = std::move(*args)});
      args = std::vector<int>{static_cast<int>(g_.nodes.size() - 1)};
    }
    add_node(i, Node::Kind::total, Level::total, std::move(*args));
    g_.nodes.back().slots_over = std::move(slots_over);
    return true;
  }

  // A float sum whose reduced axes include the domain's innermost but are not all trailing (a
  // convolution's bias gradient, over N, H and W of [N, C, H, W]), joining an elementwise
  // group: the group reduces the trailing run of those axes, and the sum becomes a total over
  // the rest of each row's sum. Alone it was a group that read the elementwise output back.
  bool add_split_sum(int i, const ir::Equation& e, const std::vector<bool>& axes) {
    if (!float_sum(e.prim, e.inputs[0].type.dtype)) return false;
    for (const Node& n : g_.nodes)
      if (n.level != Level::inner) return false;
    std::vector<bool> rows(axes.size(), false);
    for (std::size_t a = axes.size(); a-- > 0 && (axes[a] || g_.domain[a] == 1);) rows[a] = axes[a];
    g_.reduced = rows;
    if (add_total(i, e, axes)) return true;
    g_.reduced.assign(g_.domain.size(), false);
    return false;
  }

  // A float sum over every axis of a large domain, which one thread would run, as a total over
  // all axes of a group that keeps the domain's leading axes: threads split those rows, each
  // summing its rows' sums over the fewest trailing axes that hold kRowElements, short of the
  // leading axis of size > 1. Not when a
  // load of the group reads across the rows (a transposed gradient): the serial group walks
  // it along its memory instead (walk_first_input_contiguously).
  bool add_total_by_rows(int i, const ir::Equation& e) {
    const std::vector<bool> every = g_.reduced;
    // The trailing axes up to kRowElements, always leaving the leading axis of size > 1 kept.
    const auto leading = static_cast<std::size_t>(
        std::find_if(g_.domain.begin(), g_.domain.end(), [](int64_t d) { return d != 1; }) -
        g_.domain.begin());
    std::vector<bool> rows(g_.domain.size(), false);
    int64_t row = 1;
    for (std::size_t a = g_.domain.size(); a-- > leading + 1 && row < kRowElements;) {
      rows[a] = true;
      row *= g_.domain[a];
    }
    if (row == 1) return false;  // one axis of size > 1: no rows to split it into
    g_.reduced = rows;
    const bool along_rows = std::all_of(g_.nodes.begin(), g_.nodes.end(), [&](const Node& n) {
      return n.kind != Node::Kind::load || reads_along_rows(n.access, g_.domain);
    });
    if (along_rows && add_total(i, e, every)) return true;
    g_.reduced = every;
    return false;
  }

  // Layout ops on members that only relabel: a reduced value reshaped to or from its keepdims
  // shape, or broadcast back over the domain (read as a broadcast by inner loops), and no-ops.
  bool add_alias(int i, const ir::Equation& e) {
    const int in = e.inputs[0].id;
    auto it = members_.find(in);
    if (it == members_.end()) return false;
    const Dims si = dims_of(e.inputs[0]), so = dims_of(e.outputs[0]);
    const Node& n = g_.nodes[static_cast<std::size_t>(it->second)];
    const std::optional<IndexMap> map = index_map(e.prim);
    bool ok = si == so && map != IndexMap::transpose && map != IndexMap::slice;
    if (!ok && n.level == Level::outer && reducing()) {
      if (map == IndexMap::reshape)
        ok = level_of_shape(si) == Level::outer && level_of_shape(so) == Level::outer;
      // (Not in a serial group: the broadcast is a view of the stored result outside it.)
      if (map == IndexMap::broadcast && so == g_.domain && !serial()) {
        Dims padded(so.size() - si.size(), 1);
        padded.insert(padded.end(), si.begin(), si.end());
        ok = padded == keepdims_shape();
      }
    }
    if (!ok) return false;
    members_[e.outputs[0].id] = it->second;
    if (map == IndexMap::broadcast && si != so) broadcasts_[e.outputs[0].id] = i;
    g_.equations.push_back(i);
    return true;
  }

  const ir::Function& f_;
  const std::vector<std::optional<View>>& views_;
  Group g_;
  std::map<int, int> members_;  // IR value id -> node
  // Reduced values broadcast back over the domain: the broadcast's output -> its equation.
  std::map<int, int> broadcasts_;
  std::vector<int> views_after_;
};

}  // namespace

bool is_reduction(const Primitive* p) { return p->lowering && p->lowering->reduction; }

bool fusible(const ir::Equation& e) {
  const std::optional<Lowering>& l = e.prim->lowering;
  if (!l || !(l->elementwise || l->reduction) || e.outputs.size() != 1) return false;
  if (l->reduction && short_rows(e)) return false;
  return lowered_dtype(e, *l);
}

Partition partition(const ir::Function& f) {
  const std::size_t n_values = static_cast<std::size_t>(f.next_id());
  const std::size_t n_eq = f.equations.size();
  Partition p;
  p.views.assign(n_values, std::nullopt);
  std::vector<std::vector<int>> users(n_values);
  std::vector<bool> is_result(n_values, false);
  for (std::size_t i = 0; i < n_eq; ++i)
    for (const ir::Value& v : f.equations[i].inputs)
      users[static_cast<std::size_t>(v.id)].push_back(static_cast<int>(i));
  for (const ir::Value& v : f.results) is_result[static_cast<std::size_t>(v.id)] = true;

  std::vector<const ir::Value*> value_of(n_values, nullptr);
  std::vector<int> producer(n_values, -1);  // the equation that makes each value (-1: none)
  for (std::size_t i = 0; i < n_eq; ++i)
    for (const ir::Value& v : f.equations[i].outputs) {
      value_of[static_cast<std::size_t>(v.id)] = &v;
      producer[static_cast<std::size_t>(v.id)] = static_cast<int>(i);
    }
  auto make_buffer = [&](const ir::Value& v) {
    const Dims d = dims_of(v);
    p.views[static_cast<std::size_t>(v.id)] =
        View{.buffer = v.id, .shape = d, .access = {.offset = 0, .strides = contiguous_strides(d)}};
  };
  for (const ir::Value& v : f.params) make_buffer(v);
  for (const ir::Constant& c : f.constants) make_buffer(c.value);

  auto available = [&](const ir::Value& v) {
    return p.views[static_cast<std::size_t>(v.id)].has_value();
  };
  std::vector<bool> done(n_eq, false);
  std::size_t first_pending = 0;
  std::optional<Builder> open;
  // Whether value v is there for an equation to read now: stored, a view, or in the open group.
  auto present = [&](const ir::Value& v) { return available(v) || (open && open->holds(v.id)); };
  // Whether a group could compute v now: present, or made by a fusible equation whose operands
  // are. (A product's result is not: the users' group cannot hold the product.)
  auto computable = [&](const ir::Value& v) {
    if (present(v)) return true;
    const int i = producer[static_cast<std::size_t>(v.id)];
    if (i < 0 || !fusible(f.equations[static_cast<std::size_t>(i)])) return false;
    const auto& in = f.equations[static_cast<std::size_t>(i)].inputs;
    return std::all_of(in.begin(), in.end(), present);
  };
  // An elementwise equation whose every user is a fusible one waiting for an operand that
  // cannot be computed yet waits with them: run now, its result would be stored and read back
  // later, where the users' group could compute it from what it reads anyway. (An optimiser's
  // m * b1, v * b2 and p * (1 - lr * wd) were computed in the clipping norm's group, before the
  // norm: three more tensors written and read back per parameter.)
  auto waits_for_users = [&](std::size_t i) {
    const ir::Equation& e = f.equations[i];
    if (is_reduction(e.prim) || !fusible(e)) return false;
    const ir::Value& out = e.outputs[0];
    const auto& us = users[static_cast<std::size_t>(out.id)];
    if (us.empty() || is_result[static_cast<std::size_t>(out.id)]) return false;
    return std::all_of(us.begin(), us.end(), [&](int u) {
      const ir::Equation& ue = f.equations[static_cast<std::size_t>(u)];
      return fusible(ue) &&
             std::any_of(ue.inputs.begin(), ue.inputs.end(),
                         [&](const ir::Value& v) { return v.id != out.id && !computable(v); });
    });
  };

  auto close = [&] {
    if (!open) return;
    if (!open->empty()) {
      Group g = open->finish(users, is_result, value_of);
      for (const GroupOutput& o : g.outputs)
        make_buffer(*value_of[static_cast<std::size_t>(o.value)]);
      for (int i : open->views_after()) {
        const ir::Equation& e = f.equations[static_cast<std::size_t>(i)];
        p.views[static_cast<std::size_t>(e.outputs[0].id)] =
            layout_view(e, *p.views[static_cast<std::size_t>(e.inputs[0].id)]);
      }
      p.steps.emplace_back(std::move(g));
    }
    open.reset();
  };
  auto run_opaque = [&](std::size_t i) {
    for (const ir::Value& v : f.equations[i].outputs) make_buffer(v);
    p.steps.emplace_back(Opaque{static_cast<int>(i)});
    done[i] = true;
  };

  while (first_pending < n_eq) {
    bool progressed = false;
    std::optional<std::size_t> first_ready;
    std::optional<std::size_t> first_waiting;  // ready, but waiting for its users
    // The open group takes equations from before the first pending product (a primitive bound
    // by arithmetic: matmul, the convolutions) only. Later ones belong to a later phase of the
    // program: pulled forward, their results would be stored until then and read back, which
    // is what a checkpoint's recomputation in the backward pass exists to avoid (gelu's would
    // add five tensors to its forward loop's two outputs).
    std::size_t barrier = n_eq;
    for (std::size_t i = first_pending; i < n_eq && barrier == n_eq; ++i)
      if (!done[i] && f.equations[i].prim->flops) barrier = i;
    for (std::size_t i = first_pending; i < n_eq; ++i) {
      if (done[i]) continue;
      const ir::Equation& e = f.equations[i];
      bool ready = true, in_group = false;
      for (const ir::Value& v : e.inputs) {
        if (open && open->holds(v.id)) {
          in_group = true;
        } else if (!available(v)) {
          ready = false;
          break;
        }
      }
      if (!ready) continue;
      // A layout op on a buffer is a view: free, and no step of its own.
      if (!in_group && is_layout(e.prim)) {
        if (auto v = layout_view(e, *p.views[static_cast<std::size_t>(e.inputs[0].id)])) {
          p.views[static_cast<std::size_t>(e.outputs[0].id)] = std::move(v);
          done[i] = true;
          progressed = true;
          break;
        }
      }
      if (!in_group && waits_for_users(i)) {
        if (!first_waiting) first_waiting = i;
        continue;
      }
      if (open && i < barrier && (fusible(e) || is_layout(e.prim)) &&
          open->try_add(static_cast<int>(i))) {
        done[i] = true;
        progressed = true;
        break;
      }
      if (!in_group && !first_ready) first_ready = i;
    }
    if (!progressed) {
      // Nothing fits the open group: close it, then start on the first ready equation.
      const bool had_group = open && !open->empty();
      close();
      if (had_group) continue;  // its outputs may have made more equations ready
      // (A guard, never taken: what waits, waits on a ready product or other unfusible
      // equation, which does not wait.)
      if (!first_ready) first_ready = first_waiting;
      if (!first_ready)
        fail("jit", "the fusion scheduler found no ready equation in @", f.name,
             ", expected a function in SSA order");
      const std::size_t i = *first_ready;
      const ir::Equation& e = f.equations[i];
      open.emplace(f, p.views);
      if (!fusible(e) || !open->try_add(static_cast<int>(i))) {
        open.reset();
        run_opaque(i);
      } else {
        done[i] = true;
      }
    }
    while (first_pending < n_eq && done[first_pending]) ++first_pending;
  }
  close();
  return p;
}

}  // namespace kiln::compiler
