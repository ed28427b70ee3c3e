// Shard layouts and the sharded optimiser of kiln/zero.h (docs/DESIGN.md, "Sharded training").
#include "kiln/zero.h"

#include <map>

#include "detail/checked.h"
#include "kiln/impl/interpreters.h"
#include "kiln/indexing.h"
#include "kiln/ops.h"

namespace kiln::distributed {

namespace {

// k = ⌈n / parts⌉, the elements of each piece of a leaf of n.
int64_t piece_size(const TensorType& t, int64_t parts) {
  const int64_t n = t.shape.numel("zero");
  return n / parts + (n % parts != 0);
}

// The axis must have one example per part.
void check_axis(const ShardLayout& layout, const std::string& axis) {
  const int64_t size = kiln::detail::find_axis("zero", axis).size;
  if (size != layout.parts())
    fail("zero", "the shard layout has ", layout.parts(), " parts: got the axis '", axis,
         "' of size ", size, ", expected one example per part (one per process)");
}

void check_count(const ShardLayout& layout, std::size_t leaves, const char* what) {
  if (leaves != layout.full().size())
    fail("zero", "the tree does not match the shard layout: got ", leaves, " ", what, ", expected ",
         layout.full().size(), " (the leaves the layout was made from)");
}

// Full leaf i must have the type the layout was made from.
void check_leaf(const ShardLayout& layout, std::span<const Tensor> full, std::size_t i) {
  if (full[i].type() != layout.full()[i])
    fail("zero", "leaf ", i, " does not match the shard layout: got ", full[i].type(),
         ", expected ", layout.full()[i]);
}

// A full leaf as [parts, k]: flattened and padded with zeros.
Tensor as_rows(const Tensor& full, int64_t parts, int64_t k) {
  const int64_t n = full.numel();
  const Tensor flat = reshape(full, Shape{n});
  const int64_t padded = kiln::detail::checked_mul("zero", parts, k);
  return reshape(padded == n ? flat : pad(flat, {{0, padded - n}}), Shape{parts, k});
}

// Leaf indices by dtype, in leaf order: each group travels as one concatenated buffer.
std::map<DType, std::vector<std::size_t>> by_dtype(const ShardLayout& layout,
                                                   std::span<const Tensor> leaves) {
  std::map<DType, std::vector<std::size_t>> groups;
  for (std::size_t i = 0; i < leaves.size(); ++i)
    if (leaves[i].defined()) groups[layout.full()[i].dtype].push_back(i);
  return groups;
}

}  // namespace

ShardLayout::ShardLayout(std::span<const Tensor> full, int64_t parts) : parts_(parts) {
  if (parts < 1) fail("zero", "a shard layout needs at least one part: got ", parts);
  for (std::size_t i = 0; i < full.size(); ++i) {
    if (!full[i].defined())
      fail("zero", "leaf ", i, " of the tree to shard is an undefined tensor: expected every ",
           "parameter defined");
    full_.push_back(full[i].type());
  }
}

TensorType ShardLayout::piece(std::size_t i) const {
  const TensorType& t = full_.at(i);
  std::vector<int64_t> dims(std::max<std::size_t>(t.shape.rank(), 1) - 1, 1);
  dims.push_back(piece_size(t, parts_));
  return {t.dtype, Shape(std::move(dims))};
}

namespace detail {

std::vector<Tensor> shard_leaves(const ShardLayout& layout, std::span<const Tensor> full,
                                 const Tensor& part) {
  check_count(layout, full.size(), "leaves");
  std::vector<Tensor> out(full.size());
  const Tensor zero = zeros_like(part);
  for (std::size_t i = 0; i < full.size(); ++i) {
    if (!full[i].defined()) continue;
    check_leaf(layout, full, i);
    const TensorType piece = layout.piece(i);
    const int64_t k = piece.shape.dims().back();
    out[i] = reshape(dynamic_slice(as_rows(full[i], layout.parts(), k), {part, zero}, Shape{1, k}),
                     piece.shape);
  }
  return out;
}

std::vector<Tensor> gather_leaves(const ShardLayout& layout, std::span<const Tensor> pieces,
                                  const std::string& axis) {
  check_count(layout, pieces.size(), "leaves");
  check_axis(layout, axis);
  std::vector<Tensor> out(pieces.size());
  for (const auto& [dtype, group] : by_dtype(layout, pieces)) {
    std::vector<Tensor> flat;
    for (const std::size_t i : group) {
      if (pieces[i].type() != layout.piece(i))
        fail("zero", "piece ", i, " does not match the shard layout: got ", pieces[i].type(),
             ", expected ", layout.piece(i), " (a piece of ", layout.full()[i], ")");
      flat.push_back(reshape(pieces[i], Shape{pieces[i].numel()}));
    }
    const Tensor rows = all_gather(concatenate(flat), axis);  // [parts, Σ k]
    int64_t offset = 0;
    for (const std::size_t i : group) {
      const TensorType& full = layout.full()[i];
      const int64_t k = layout.piece(i).shape.dims().back(), n = full.shape.numel();
      const Tensor columns = slice(rows, {Slice(), Slice{offset, offset + k}});
      offset += k;
      out[i] =
          reshape(slice(reshape(columns, Shape{layout.parts() * k}), {Slice{0, n}}), full.shape);
    }
  }
  return out;
}

std::vector<Tensor> scatter_sum_leaves(const ShardLayout& layout, std::span<const Tensor> full,
                                       const std::string& axis) {
  check_count(layout, full.size(), "leaves");
  check_axis(layout, axis);
  std::vector<Tensor> out(full.size());
  for (const auto& [dtype, group] : by_dtype(layout, full)) {
    std::vector<Tensor> rows;
    for (const std::size_t i : group) {
      check_leaf(layout, full, i);
      rows.push_back(as_rows(full[i], layout.parts(), layout.piece(i).shape.dims().back()));
    }
    const Tensor mine = psum_scatter(concatenate(rows, 1), axis, 0);  // [Σ k]
    int64_t offset = 0;
    for (const std::size_t i : group) {
      const TensorType piece = layout.piece(i);
      const int64_t k = piece.shape.dims().back();
      out[i] = reshape(slice(mine, {Slice{offset, offset + k}}), piece.shape);
      offset += k;
    }
  }
  return out;
}

}  // namespace detail

Zero::Zero(optim::Optimizer optimizer, int stage, std::string axis, ShardLayout layout)
    : optimizer_(std::move(optimizer)),
      stage_(stage),
      axis_(std::move(axis)),
      layout_(std::move(layout)) {
  if (stage < 1 || stage > 3) fail("zero", "unknown stage: got ", stage, ", expected 1, 2 or 3");
}

optim::detail::FlatUpdate Zero::update_leaves(
    const optim::detail::FlatTree& params, const optim::detail::FlatTree& grads, const Tensor& step,
    const std::map<std::string, optim::detail::FlatTree>& slots) const {
  check_axis(layout_, axis_);
  const double parts = static_cast<double>(layout_.parts());
  auto divided = [&](std::vector<Tensor> g) {  // as pmean: the sum, then / N
    for (Tensor& t : g)
      if (t.defined()) t = t / scalar_like(t, parts);
    return g;
  };
  std::vector<Tensor> p = params.leaves, g;
  if (stage_ == 3) {
    g = divided(grads.leaves);
  } else {
    const Tensor part = axis_index(axis_);
    p = detail::shard_leaves(layout_, params.leaves, part);
    if (stage_ == 1) {
      g = grads.leaves;
      for (Tensor& t : g)
        if (t.defined()) t = pmean(t, axis_);
      g = detail::shard_leaves(layout_, g, part);
    } else {
      g = divided(detail::scatter_sum_leaves(layout_, grads.leaves, axis_));
    }
  }
  const std::string axis = axis_;
  optim::detail::FlatUpdate u = optim::detail::update_leaves(
      optimizer_.algorithm(), {std::move(p), params.def}, {std::move(g), grads.def}, step, slots,
      [axis](const Tensor& t) { return psum(t, axis); });
  if (stage_ != 3) u.params = detail::gather_leaves(layout_, u.params, axis_);
  return u;
}

}  // namespace kiln::distributed
