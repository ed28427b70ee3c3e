// Iteration over strided views: dimensions are coalesced, then each operand is walked row by
// row along the innermost dimension. Broadcast operands have stride 0 where they repeat.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

#include "detail/parallel.h"
#include "kiln/tensor.h"

namespace kiln::detail {

template <std::size_t N>
struct StridedLayout {
  std::vector<int64_t> shape;                   // after coalescing, rank >= 1
  std::array<std::vector<int64_t>, N> strides;  // per operand, in elements
};

// Merges adjacent dimensions that every operand walks contiguously, and drops size-1 ones.
template <std::size_t N>
StridedLayout<N> coalesce(const std::vector<int64_t>& shape,
                          const std::array<const std::vector<int64_t>*, N>& strides) {
  StridedLayout<N> out;
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    bool merge = !out.shape.empty();
    for (std::size_t k = 0; merge && k < N; ++k)
      merge = out.strides[k].back() == (*strides[k])[d] * shape[d];
    if (merge) {
      out.shape.back() *= shape[d];
      for (std::size_t k = 0; k < N; ++k) out.strides[k].back() = (*strides[k])[d];
    } else {
      out.shape.push_back(shape[d]);
      for (std::size_t k = 0; k < N; ++k) out.strides[k].push_back((*strides[k])[d]);
    }
  }
  if (out.shape.empty()) {
    out.shape.push_back(1);
    for (std::size_t k = 0; k < N; ++k) out.strides[k].push_back(1);
  }
  return out;
}

// Calls row(offsets, n, inner_strides) for every innermost row; offsets are per operand, in
// elements from each operand's element 0. Rows are split across threads when there is work.
template <std::size_t N, typename Row>
void for_each_row(const std::vector<int64_t>& shape,
                  const std::array<const std::vector<int64_t>*, N>& strides, Row&& row) {
  int64_t total = 1;
  for (int64_t d : shape) total *= d;
  if (total == 0) return;
  const StridedLayout<N> L = coalesce<N>(shape, strides);
  const int r = static_cast<int>(L.shape.size());
  const int64_t inner = L.shape[static_cast<std::size_t>(r - 1)];
  std::array<int64_t, N> inner_strides;
  for (std::size_t k = 0; k < N; ++k) inner_strides[k] = L.strides[k].back();
  const int64_t rows = total / inner;
  // A few long rows (a contiguous tensor is a single row) are cut into pieces, so that every
  // thread gets a share; many rows are shared out whole.
  const int64_t pieces =
      rows >= 64 ? 1
                 : std::clamp<int64_t>(inner / kParallelGrain, 1, 64 / std::max<int64_t>(rows, 1));
  if (pieces > 1) {
    parallel_for(
        rows * pieces,
        [&](int64_t begin, int64_t end) {
          for (int64_t t = begin; t < end; ++t) {
            std::array<int64_t, N> off{};
            int64_t rem = t / pieces;
            for (int d = r - 2; d >= 0; --d) {
              const auto du = static_cast<std::size_t>(d);
              for (std::size_t k = 0; k < N; ++k) off[k] += rem % L.shape[du] * L.strides[k][du];
              rem /= L.shape[du];
            }
            const int64_t lo = inner * (t % pieces) / pieces,
                          hi = inner * (t % pieces + 1) / pieces;
            for (std::size_t k = 0; k < N; ++k) off[k] += lo * inner_strides[k];
            row(off, hi - lo, inner_strides);
          }
        },
        inner / pieces);
    return;
  }
  parallel_for(
      rows,
      [&](int64_t begin, int64_t end) {
        std::vector<int64_t> idx(static_cast<std::size_t>(r), 0);
        std::array<int64_t, N> off{};
        int64_t rem = begin;
        for (int d = r - 2; d >= 0; --d) {
          const auto du = static_cast<std::size_t>(d);
          idx[du] = rem % L.shape[du];
          rem /= L.shape[du];
          for (std::size_t k = 0; k < N; ++k) off[k] += idx[du] * L.strides[k][du];
        }
        for (int64_t i = begin; i < end; ++i) {
          row(off, inner, inner_strides);
          for (int d = r - 2; d >= 0; --d) {  // odometer increment of the outer index
            const auto du = static_cast<std::size_t>(d);
            for (std::size_t k = 0; k < N; ++k) off[k] += L.strides[k][du];
            if (++idx[du] < L.shape[du]) break;
            for (std::size_t k = 0; k < N; ++k) off[k] -= L.strides[k][du] * L.shape[du];
            idx[du] = 0;
          }
        }
      },
      inner);
}

// Strides that view `t` as broadcast to `shape` (0 along repeated dimensions).
inline std::vector<int64_t> broadcast_strides(const Tensor& t, const Shape& shape) {
  const Shape& s = t.shape();
  const auto& st = t.strides();
  std::vector<int64_t> out(static_cast<std::size_t>(shape.rank()), 0);
  for (int i = 0; i < s.rank(); ++i) {
    const int j = shape.rank() - s.rank() + i;
    out[static_cast<std::size_t>(j)] = s[i] == 1 ? 0 : st[static_cast<std::size_t>(i)];
  }
  return out;
}

}  // namespace kiln::detail
