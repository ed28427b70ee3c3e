// Indexing operations: diagonals and triangles, dynamic (traced-start) slices, tiling, rolling,
// grids and padding modes. Each is a composition of primitives (reshape, slice, pad, gather,
// select, concatenate, ...), so it runs eagerly, traces, jits, differentiates and batches
// through theirs. See docs/OPS.md.
#pragma once

#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/ops.h"

namespace kiln {

// numpy.diagonal: the diagonal x[i, i + offset] of the axes axis1 and axis2, which are removed;
// the diagonal becomes the last axis. A view when those axes are the last two of contiguous x.
Tensor diagonal(const Tensor& x, int64_t offset = 0, int64_t axis1 = 0, int64_t axis2 = 1,
                Loc loc = Loc::current());
// numpy.diag: of a 1-d v, the square matrix with v on diagonal k (zeros elsewhere); of a 2-d
// x, its diagonal k.
Tensor diag(const Tensor& x, int64_t k = 0, Loc loc = Loc::current());
// numpy.trace: the sum of diagonal(x, offset, axis1, axis2) over its last axis.
Tensor trace(const Tensor& x, int64_t offset = 0, int64_t axis1 = 0, int64_t axis2 = 1,
             Loc loc = Loc::current());
// numpy.tril / triu over the last two axes: zeros above (tril) / below (triu) diagonal k.
Tensor tril(const Tensor& x, int64_t k = 0, Loc loc = Loc::current());
Tensor triu(const Tensor& x, int64_t k = 0, Loc loc = Loc::current());

// jax.lax.dynamic_slice: the block of the given sizes starting at `starts` (one integer
// scalar tensor per axis, traced or not). Starts are clamped into [0, size(axis) - sizes[axis]]
// so that the block always lies inside x, as in JAX.
Tensor dynamic_slice(const Tensor& x, const std::vector<Tensor>& starts, const Shape& sizes,
                     Loc loc = Loc::current());
// jax.lax.dynamic_update_slice: x with the block `update` written at `starts` (clamped as in
// dynamic_slice so that the whole update lands inside x). Under jit, a loop whose carry is a
// numeric x updated with a block spanning every axis but one (a cache position, a row), and
// read by nothing after the update, writes the block in place instead of copying the carry.
Tensor dynamic_update_slice(const Tensor& x, const Tensor& update,
                            const std::vector<Tensor>& starts, Loc loc = Loc::current());

// numpy.tile: x repeated reps[i] times along axis i (ranks aligned at the right).
Tensor tile(const Tensor& x, const std::vector<int64_t>& reps, Loc loc = Loc::current());
// numpy.repeat with one repeat count: each element `repeats` times in a row along axis
// (nullopt: of the flattened x).
Tensor repeat(const Tensor& x, int64_t repeats, std::optional<int64_t> axis = std::nullopt,
              Loc loc = Loc::current());
// numpy.roll: elements shifted by `shift` along axis, wrapping around (nullopt: of the
// flattened x, reshaped back).
Tensor roll(const Tensor& x, int64_t shift, std::optional<int64_t> axis = std::nullopt,
            Loc loc = Loc::current());
// numpy.diff: the n-th forward difference x[i + 1] - x[i] along axis (n = 0: x), with
// `prepend` / `append` concatenated first (a 0-d one is broadcast to one slice of x). Bools
// difference as not_equal, as numpy.
struct DiffOptions {
  int64_t n = 1;
  int64_t axis = -1;
  std::optional<Tensor> prepend;
  std::optional<Tensor> append;
};
Tensor diff(const Tensor& x, const DiffOptions& options = {}, Loc loc = Loc::current());
// numpy.meshgrid of 1-d tensors: "xy" (Cartesian, the first two output axes swapped) or "ij"
// (matrix) indexing.
std::vector<Tensor> meshgrid(const std::vector<Tensor>& xs, std::string_view indexing = "xy",
                             Loc loc = Loc::current());

// numpy.pad's modes: constant (the value), reflect (mirrored without repeating the edge),
// edge (the edge value repeated), wrap (periodic). Widths are (before, after) per axis.
enum class PadMode { constant, reflect, edge, wrap };
Tensor pad(const Tensor& x, const std::vector<std::pair<int64_t, int64_t>>& widths, PadMode mode,
           double value = 0.0, Loc loc = Loc::current());

// The indices of x's non-zero elements (NaN counts as non-zero) in row-major order, padded with
// `fill` to the static length `size` (the fixed shape jit needs; JAX's `size=`). More non-zero
// elements than `size` raise an Error, eagerly and inside jit (JAX drops them silently).
// argwhere: one int64 row per element, [size, rank]; nonzero: one int64 [size] per axis.
Tensor argwhere(const Tensor& x, int64_t size, int64_t fill = 0, Loc loc = Loc::current());
std::vector<Tensor> nonzero(const Tensor& x, int64_t size, int64_t fill = 0,
                            Loc loc = Loc::current());
// Counts of each value 0..length-1 in the 1-d integer x (weights: their sums instead), as
// int64 (weights: the weights' dtype). Values outside [0, length) are dropped, as in JAX with
// `length`, so that the output shape is static.
Tensor bincount(const Tensor& x, int64_t length,
                const std::optional<Tensor>& weights = std::nullopt, Loc loc = Loc::current());

// Scatter in numpy.take's index layout along `axis`: updates[..., j, ...] (x's shape with the
// indices' shape at axis; updates broadcast to it) combined into x[..., indices[j], ...].
// Negative indices count from the end; out-of-range ones raise. Repeated indices: `set` keeps
// the last in index order, `add`, `mul`, `max`, `min` combine all (NaN propagates through
// max/min). Gradients: `set` passes the cotangent to the winning update only; `mul` gives an
// update the product of everything else at its position (exact with zeros); `max`/`min` go to
// whichever of x and the updates attain the result, shared equally among ties.
enum class ScatterMode { set, add, mul, max, min };
Tensor scatter(const Tensor& x, const Tensor& indices, const Tensor& updates, int64_t axis = 0,
               ScatterMode mode = ScatterMode::set, Loc loc = Loc::current());

// JAX's x.at[idx].set(v), functionally: at(x, idx).set(v) is x with v written at idx along
// axis 0 (or `axis`); .add/.mul/.max/.min combine instead; .get() is take(x, idx, axis).
struct IndexedUpdate {
  Tensor x, indices;
  int64_t axis = 0;
  Tensor get(Loc loc = Loc::current()) const;
  Tensor set(const Tensor& v, Loc loc = Loc::current()) const;
  Tensor add(const Tensor& v, Loc loc = Loc::current()) const;
  Tensor mul(const Tensor& v, Loc loc = Loc::current()) const;
  Tensor max(const Tensor& v, Loc loc = Loc::current()) const;
  Tensor min(const Tensor& v, Loc loc = Loc::current()) const;
};
inline IndexedUpdate at(const Tensor& x, const Tensor& indices, int64_t axis = 0) {
  return {x, indices, axis};
}

}  // namespace kiln
