// Sharded data parallelism: ZeRO stages 1-3 (DeepSpeed), FSDP's sharding in PyTorch, over the
// named axis of a pmap with one example per process (docs/DISTRIBUTED.md, "Sharded training").
//
// A ShardLayout cuts every leaf of a tree into `parts` pieces, the same way on every process;
// shard, gather and scatter_sum move a tree between its full and its sharded form with one
// collective per dtype; Zero is an optimiser whose state (stage 1 and 2), and whose
// parameters too (stage 3), are this process's pieces. The templates only flatten trees; the
// work is on lists of leaves in src/optim/zero.cpp.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "kiln/distributed.h"
#include "kiln/optim.h"

namespace kiln::distributed {

// Leaf i of n elements is flattened and padded with zeros to parts·k (k = ⌈n / parts⌉); piece
// p holds its elements [p·k, (p+1)·k), shaped [1, ..., 1, k] with the leaf's rank (at least 1),
// so that rules by rank (AdamW's weight decay on matrices) see a piece as they see its leaf.
class ShardLayout {
 public:
  ShardLayout() = default;
  // The layout of the full leaves (all defined) over `parts` processes.
  ShardLayout(std::span<const Tensor> full, int64_t parts);
  template <Tree P>
  ShardLayout(const P& full, int64_t parts)
      : ShardLayout(std::span<const Tensor>(tree_leaves(full)), parts) {}

  int64_t parts() const { return parts_; }
  const std::vector<TensorType>& full() const { return full_; }
  // The type of each piece of leaf i.
  TensorType piece(std::size_t i) const;

 private:
  int64_t parts_ = 1;
  std::vector<TensorType> full_;
};

namespace detail {
std::vector<Tensor> shard_leaves(const ShardLayout& layout, std::span<const Tensor> full,
                                 const Tensor& part);
std::vector<Tensor> gather_leaves(const ShardLayout& layout, std::span<const Tensor> pieces,
                                  const std::string& axis);
std::vector<Tensor> scatter_sum_leaves(const ShardLayout& layout, std::span<const Tensor> full,
                                       const std::string& axis);
}  // namespace detail

// Piece `part` (an integer scalar, traced or not: axis_index(axis) inside pmap) of every leaf
// of a full tree. No communication; undefined leaves stay undefined.
template <Tree P>
P shard(const P& full, const ShardLayout& layout, const Tensor& part) {
  auto [leaves, def] = tree_flatten(full);
  return tree_unflatten<P>(def, detail::shard_leaves(layout, leaves, part));
}
template <Tree P>
P shard(const P& full, const ShardLayout& layout, int64_t part) {
  if (part < 0 || part >= layout.parts())
    fail("zero", "bad part: got ", part, ", expected one in [0, ", layout.parts(), ")");
  return shard(full, layout, tensor(static_cast<int32_t>(part)));
}

// Inside pmap over `axis`: every process's pieces put back together into the full leaves
// (one all_gather per dtype). Its transpose is scatter_sum, so the gradient of a loss of the
// gathered tree, taken with respect to the pieces, is this process's piece of the gradient
// summed over the processes.
template <Tree P>
P gather(const P& pieces, const ShardLayout& layout, const std::string& axis) {
  auto [leaves, def] = tree_flatten(pieces);
  return tree_unflatten<P>(def, detail::gather_leaves(layout, leaves, axis));
}

// Inside pmap over `axis`: this process's piece of the sum over the processes of a full tree
// (one psum_scatter per dtype: a reduce-scatter, never the full sum).
template <Tree P>
P scatter_sum(const P& full, const ShardLayout& layout, const std::string& axis) {
  auto [leaves, def] = tree_flatten(full);
  return tree_unflatten<P>(def, detail::scatter_sum_leaves(layout, leaves, axis));
}

// An optimiser whose state is sharded over the processes of a pmap axis:
//   stage 1: the slots are pieces; the gradients are pmean-ed (all-reduce), each process
//            updates its piece of the parameters and gathers them;
//   stage 2: as 1, but the gradients are reduce-scattered (scatter_sum / N);
//   stage 3: the parameters are pieces too; the step's loss reads gather(pieces), and the
//            gradients with respect to the pieces (already summed by gather's transpose) are
//            divided by N.
// The wrapped algorithm runs unchanged on the pieces, so it must be elementwise, as SGD, Adam
// and AdamW are (one whose update mixes elements of a leaf, as LAMB's or Adafactor's, would
// see pieces instead of leaves); clipping by global norm adds up the pieces' squares over the
// processes. Same results as data parallelism with pmean up to the
// order of the cross-process sums (stage 1: bitwise without clipping).
class Zero {
 public:
  Zero(optim::Optimizer optimizer, int stage, std::string axis, ShardLayout layout);

  // This process's part of the state before the first update (eager).
  template <Tree P>
  optim::OptState<P> init(const P& full_params, int64_t part) const {
    return shard_state(optimizer_.init(full_params), part);
  }

  // One step inside pmap over the axis. Stages 1 and 2: `params` are the full parameters and
  // `grads` this process's gradients (the mean over its examples); returns the new full
  // parameters. Stage 3: `params` are this process's pieces and `grads` the gradients with
  // respect to them; returns the new pieces. The state is this process's.
  template <Tree P>
  std::pair<P, optim::OptState<P>> update(const P& params, const P& grads,
                                          const optim::OptState<P>& state) const {
    return optim::detail::update_tree(
        params, grads, state,
        [this](const optim::detail::FlatTree& p, const optim::detail::FlatTree& g,
               const Tensor& step, const auto& slots) { return update_leaves(p, g, step, slots); });
  }

  // The full state from every process's part (inside pmap over the axis: for a checkpoint,
  // which then loads under any layout), and this process's part of a full state (eager).
  template <Tree P>
  optim::OptState<P> gather_state(const optim::OptState<P>& pieces) const {
    optim::OptState<P> out{pieces.step, {}};
    for (const auto& [name, slot] : pieces.slots)
      out.slots.emplace(name, gather(slot, layout_, axis_));
    return out;
  }
  template <Tree P>
  optim::OptState<P> shard_state(const optim::OptState<P>& full, int64_t part) const {
    optim::OptState<P> out{full.step, {}};
    for (const auto& [name, slot] : full.slots) out.slots.emplace(name, shard(slot, layout_, part));
    return out;
  }

  int stage() const { return stage_; }
  const std::string& axis() const { return axis_; }
  const ShardLayout& layout() const { return layout_; }
  const optim::Optimizer& optimizer() const { return optimizer_; }

  // update on flattened trees: its work, and what the Python binding calls.
  optim::detail::FlatUpdate update_leaves(
      const optim::detail::FlatTree& params, const optim::detail::FlatTree& grads,
      const Tensor& step, const std::map<std::string, optim::detail::FlatTree>& slots) const;

 private:
  optim::Optimizer optimizer_;
  int stage_;
  std::string axis_;
  ShardLayout layout_;
};

}  // namespace kiln::distributed
