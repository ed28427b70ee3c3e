// Partitions an optimised IR function into the steps a compiled function runs: fusion groups
// (one loop nest each, see docs/DESIGN.md "Compiler") and opaque equations (their kernels).
// Pure analysis: no LLVM here.
#pragma once

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "kiln/ir.h"

namespace kiln::compiler {

// How a group reads a buffer: domain element (i_0, ..., i_{n-1}) is element
// offset + Σ i_a·strides[a] of the buffer (in elements; 0 strides broadcast, negative ones
// flip). Reads at outer level use only the kept axes' strides (the reduced ones are 0).
struct Access {
  int64_t offset = 0;
  std::vector<int64_t> strides;
  bool operator==(const Access&) const = default;
};

// Where a node's values live: on the whole domain, once per index of the kept axes (what a
// reduction produces), or, for a total, once per index of the axes it does not sum
// (Node::slots_over).
enum class Level { inner, outer, total };

struct Node {
  // total: a float sum over the kept axes of a column group (a layer norm's scale gradient,
  // summed over the rows that the group normalises) of an inner node, or of an outer node over
  // some or all of them (a convolution's bias gradient: over N of the sums over H and W), which
  // each kernel call accumulates over its kept indices in double and the runtime finishes by
  // adding the calls' partial sums in order. Nothing in the group reads it.
  enum class Kind { load, op, reduce, total };
  Kind kind = Kind::op;
  Level level = Level::inner;
  DType dtype = float32;  // the stored dtype of the node's values
  // load: which group input, and how it is read.
  int input = -1;
  Access access;
  // op and reduce: the primitive (an elementwise one, or reduce_*), its attributes and its
  // arguments (node indices, earlier in `nodes`).
  const Primitive* prim = nullptr;
  Attrs attrs;
  std::vector<int> args;
  // total: the domain axes it keeps a partial sum per index of (row-major, in axis order), the
  // axes it does not sum: the reduced axes for an inner node, kept ones for an outer node.
  std::vector<int64_t> slots_over;
};

struct GroupOutput {
  int node = -1;
  int value = -1;  // the IR value it is
  // Stored over the whole domain, or once per kept index (contiguous either way). An outer
  // node is stored inner when the IR value is a layout op's relabelling of its broadcast back
  // over the domain (the broadcast itself is a view of the node's stored value).
  Level level = Level::inner;
};

// One fusion group: a loop nest over `domain`. With no reduced axes it is a plain elementwise
// loop; otherwise one pass over the reduced axes per round of reductions, per kept index when
// the innermost axis is reduced (column template) or per block of kept indices along it when
// it is kept (row template), then a last pass for inner outputs that need the last round.
struct Group {
  std::vector<int64_t> domain;
  std::vector<bool> reduced;  // per domain axis
  std::vector<int> inputs;    // IR value ids of the buffers it reads
  std::vector<Node> nodes;    // in dependency order
  std::vector<GroupOutput> outputs;
  std::vector<int> equations;  // indices into the function's equations

  int64_t outer_size() const;  // product of the kept axes
  int64_t inner_size() const;  // product of the reduced axes
  bool has_reduction() const;
  // Per node, the round of reductions it waits for (0: none; a reduction is one round after
  // its operand). A reduction group runs one pass over the reduced axes per round r ≥ 1,
  // storing there the inner outputs of round r - 1, then a last pass for those of the last
  // round (codegen.cpp).
  std::vector<int> rounds() const;
  // Where each total's partial sums lie in a kernel call's array of doubles (the 4th argument
  // of KernelFn): `size` of them from `offset`, row-major over the node's slots_over.
  struct TotalSlot {
    int node = -1;
    int64_t offset = 0, size = 0;
  };
  std::vector<TotalSlot> totals() const;
  int64_t total_doubles() const;  // the array's length
};

// An equation run by binding its primitive (its registered kernel).
struct Opaque {
  int equation = -1;
};

using Step = std::variant<Group, Opaque>;

// Values the function reads as buffers are `view`s of others (a layout op's output read in
// place) or buffers in their own right.
struct View {
  int buffer = -1;  // the IR value holding the memory (a parameter, constant or step output)
  std::vector<int64_t> shape;
  Access access;  // over `shape`
};

struct Partition {
  std::vector<Step> steps;
  // For each IR value that is a view of another (by value id; absent: none).
  std::vector<std::optional<View>> views;
};

// The partition of an optimised function. Every equation lands in exactly one step, and each
// step's inputs are parameters, constants or outputs of earlier steps.
Partition partition(const ir::Function& f);

// Whether the primitive's lowering (kiln/lowering.h) is a reduction: reduce_sum, reduce_prod,
// reduce_max, reduce_min, reduce_and, reduce_or.
bool is_reduction(const Primitive* p);

// Whether the equation's primitive has an elementwise or reduction lowering that takes its
// dtypes (else it is opaque: its kernel runs).
bool fusible(const ir::Equation& e);

}  // namespace kiln::compiler
