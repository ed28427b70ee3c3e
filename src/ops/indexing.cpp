// Indexing operations as compositions of primitives: a diagonal is a strided slice of the two
// axes flattened into one; triangles are a select against an iota mask; dynamic slices gather
// with clamped traced indices, and a dynamic update along one axis scatters its rows (a select
// over x otherwise); tile, repeat, roll, meshgrid are broadcasts, reshapes and
// slices; padding modes gather with a static index map. Derivatives, batching and jit come
// from those primitives' rules.
#include "kiln/indexing.h"

#include <algorithm>
#include <numeric>

#include "detail/checked.h"
#include "ops/rules.h"

namespace kiln {
namespace {

// x with `axes` (in that order) moved behind the others.
Tensor axes_last(const Tensor& x, const Axes& axes, Loc loc) {
  Axes perm;
  for (int i = 0; i < x.rank(); ++i)
    if (std::find(axes.begin(), axes.end(), i) == axes.end()) perm.push_back(i);
  perm.insert(perm.end(), axes.begin(), axes.end());
  Axes identity(perm.size());
  std::iota(identity.begin(), identity.end(), 0);
  return perm == identity ? x : transpose(x, perm, loc);
}

// Slices along one axis (all others whole).
Tensor slice_axis(const Tensor& x, int axis, Slice s, Loc loc) {
  std::vector<Slice> sl(static_cast<std::size_t>(axis) + 1);
  sl.back() = s;
  return slice(x, sl, loc);
}

// A scalar start index as int64, checked to be an integer scalar.
Tensor start_index(std::string_view op, const Tensor& s, std::size_t axis, Loc loc) {
  if (s.rank() != 0 || !is_integral(s.dtype()) || s.dtype() == bool_)
    fail(op, "start index ", axis, " is not an integer scalar: got ", s.type(),
         ", expected a 0-d integer tensor");
  return ops::cast_if_needed(s, int64, loc);
}

void expect_starts(std::string_view op, const Tensor& x, const std::vector<Tensor>& starts) {
  if (static_cast<int>(starts.size()) != x.rank())
    fail(op, "wrong number of start indices: got ", starts.size(), " for ", x.type(),
         ", expected one per axis (", x.rank(), ")");
}

// `s` clamped into [0, hi], as int64.
Tensor clamp_index(const Tensor& s, int64_t hi) { return minimum(maximum(s, int64_t{0}), hi); }

// [1, ..., n, ..., 1] of `rank` axes with n at `axis`.
Shape along(int rank, int axis, int64_t n) {
  std::vector<int64_t> d(static_cast<std::size_t>(rank), 1);
  d[static_cast<std::size_t>(axis)] = n;
  return Shape(d);
}

Tensor triangle(std::string_view op, const Tensor& x, int64_t k, bool lower, Loc loc) {
  const detail::CallSite site(loc);
  if (x.rank() < 2)
    fail(op, "rank below 2: got ", x.type(), ", expected a matrix or a batch of them");
  const int64_t n = x.shape()[x.rank() - 2], m = x.shape()[x.rank() - 1];
  // Beyond +-(n + m) every k gives the same mask; clamping keeps the iota arithmetic in range.
  const int64_t kk = std::clamp<int64_t>(k, -(n + m), n + m);
  const Tensor rows = reshape(arange(n, int64), Shape{n, 1}, loc) + kk;
  const Tensor cols = reshape(arange(m, int64), Shape{1, m}, loc);
  const Tensor keep = lower ? less_equal(cols, rows, loc) : greater_equal(cols, rows, loc);
  return where(keep, x, zeros({}, x.dtype()), loc);
}

}  // namespace

Tensor diagonal(const Tensor& x, int64_t offset, int64_t axis1, int64_t axis2, Loc loc) {
  const detail::CallSite site(loc);
  if (x.rank() < 2) fail("diagonal", "rank below 2: got ", x.type(), ", expected 2 axes or more");
  const int a1 = normalize_axis("diagonal", axis1, x.rank());
  const int a2 = normalize_axis("diagonal", axis2, x.rank());
  if (a1 == a2)
    fail("diagonal", "axis1 and axis2 are one axis: got ", axis1, " and ", axis2, " for ", x.type(),
         ", expected two different axes");
  const int64_t n1 = x.shape()[a1], n2 = x.shape()[a2];
  const int64_t len =
      std::max<int64_t>(0, offset >= 0 ? std::min(n1, n2 - offset) : std::min(n1 + offset, n2));
  // x[i, i + offset] sits at i * (n2 + 1) + offset in the flattened pair of axes.
  std::vector<int64_t> shape(x.shape().begin(), x.shape().end());
  shape.erase(shape.begin() + std::max(a1, a2));
  shape.erase(shape.begin() + std::min(a1, a2));
  shape.push_back(n1 * n2);
  const Tensor flat = reshape(axes_last(x, {a1, a2}, loc), Shape(shape), loc);
  const int last = flat.rank() - 1;
  if (len == 0) return slice_axis(flat, last, Slice{0, 0, 1}, loc);
  const int64_t start = offset >= 0 ? offset : -offset * n2;
  return slice_axis(flat, last, Slice{start, start + (len - 1) * (n2 + 1) + 1, n2 + 1}, loc);
}

Tensor diag(const Tensor& x, int64_t k, Loc loc) {
  const detail::CallSite site(loc);
  if (x.rank() == 2) return diagonal(x, k, 0, 1, loc);
  if (x.rank() != 1)
    fail("diag", "rank not 1 or 2: got ", x.type(), ", expected a vector or a matrix");
  const int64_t n = x.numel();
  const int64_t a = k >= 0 ? k : -k;
  Shape({detail::checked_add("diag", n, a), detail::checked_add("diag", n, a)}).check("diag");
  // Each v[i] followed by n zeros, flattened and cut to n * n: v[i] lands at i * (n + 1).
  const Tensor rows = pad(reshape(x, Shape{n, 1}, loc), {{0, 0}, {0, n}}, 0.0, loc);
  const Tensor square = reshape(
      slice(reshape(rows, Shape{n * (n + 1)}, loc), {Slice{0, n * n, 1}}, loc), Shape{n, n}, loc);
  if (k == 0) return square;
  return k > 0 ? pad(square, {{0, a}, {a, 0}}, 0.0, loc) : pad(square, {{a, 0}, {0, a}}, 0.0, loc);
}

Tensor trace(const Tensor& x, int64_t offset, int64_t axis1, int64_t axis2, Loc loc) {
  const detail::CallSite site(loc);
  const Tensor d = diagonal(x, offset, axis1, axis2, loc);
  return sum(d, {int64_t{d.rank() - 1}}, false, loc);
}

Tensor tril(const Tensor& x, int64_t k, Loc loc) { return triangle("tril", x, k, true, loc); }
Tensor triu(const Tensor& x, int64_t k, Loc loc) { return triangle("triu", x, k, false, loc); }

Tensor dynamic_slice(const Tensor& x, const std::vector<Tensor>& starts, const Shape& sizes,
                     Loc loc) {
  const detail::CallSite site(loc);
  expect_starts("dynamic_slice", x, starts);
  if (sizes.rank() != x.rank())
    fail("dynamic_slice", "wrong number of sizes: got ", sizes, " for ", x.type(),
         ", expected one per axis");
  for (int a = 0; a < x.rank(); ++a)
    if (sizes[a] < 0 || sizes[a] > x.shape()[a])
      fail("dynamic_slice", "slice larger than the operand: got sizes ", sizes, " for ", x.type(),
           ", expected 0 <= sizes[i] <= x.shape[i] (axis ", a, ")");
  Tensor out = x;
  for (int a = 0; a < x.rank(); ++a) {
    const auto u = static_cast<std::size_t>(a);
    const Tensor s = start_index("dynamic_slice", starts[u], u, loc);
    if (sizes[a] == x.shape()[a]) continue;  // the start clamps to 0
    out = take(out, clamp_index(s, x.shape()[a] - sizes[a]) + arange(sizes[a], int64), a, loc);
  }
  return out;
}

Tensor dynamic_update_slice(const Tensor& x, const Tensor& update,
                            const std::vector<Tensor>& starts, Loc loc) {
  const detail::CallSite site(loc);
  expect_starts("dynamic_update_slice", x, starts);
  bool fits = update.rank() == x.rank();
  for (int a = 0; fits && a < x.rank(); ++a) fits = update.shape()[a] <= x.shape()[a];
  if (!fits)
    fail("dynamic_update_slice", "update does not fit: got x ", x.type(), " and update ",
         update.type(), ", expected an update of x's rank, no larger on any axis");
  Tensor placed = ops::cast_if_needed(update, x.dtype(), loc);
  std::vector<Tensor> start;
  std::vector<int> partial;  // the axes the update does not span
  for (int a = 0; a < x.rank(); ++a) {
    start.push_back(start_index("dynamic_update_slice", starts[static_cast<std::size_t>(a)],
                                static_cast<std::size_t>(a), loc));
    if (update.shape()[a] == 0) return x;
    if (update.shape()[a] != x.shape()[a]) partial.push_back(a);
  }
  // A block along one axis (a position of a cache, a row of a buffer filled in a loop) is a
  // scatter of its rows, which compiled code writes in place when it owns x: a loop that
  // updates its carry so touches the block, not the whole buffer, at each step.
  if (partial.size() == 1 && DTypeSet::numeric().contains(x.dtype())) {
    const int a = partial[0];
    const int64_t n = x.shape()[a], m = update.shape()[a];
    return scatter(x, clamp_index(start[static_cast<std::size_t>(a)], n - m) + arange(m, int64),
                   placed, a, ScatterMode::set, loc);
  }
  // Otherwise the update spread over x's shape (each position takes the update element at its
  // clamped offset from the start), then selected where the block is.
  std::optional<Tensor> inside;
  for (int a : partial) {
    const auto u = static_cast<std::size_t>(a);
    const int64_t n = x.shape()[a], m = update.shape()[a];
    const Tensor rel = arange(n, int64) - clamp_index(start[u], n - m);
    const Tensor in =
        reshape(logical_and(rel >= int64_t{0}, rel < m, loc), along(x.rank(), a, n), loc);
    inside = inside ? logical_and(*inside, in, loc) : in;
    if (m == 1) {  // one position: a broadcast, read in place
      std::vector<int64_t> shape(placed.shape().begin(), placed.shape().end());
      shape[u] = n;
      placed = broadcast_to(placed, Shape(shape), loc);
    } else {
      placed = take(placed, clamp_index(rel, m - 1), a, loc);
    }
  }
  return inside ? where(*inside, placed, x, loc) : placed;
}

Tensor tile(const Tensor& x, const std::vector<int64_t>& reps, Loc loc) {
  const detail::CallSite site(loc);
  for (int64_t r : reps)
    if (r < 0) fail("tile", "negative repeat count: got ", Shape(reps), ", expected counts >= 0");
  const int rank = std::max(x.rank(), static_cast<int>(reps.size()));
  // x as [1, d0, 1, d1, ...] broadcast to [r0, d0, r1, d1, ...], then pairs merged.
  std::vector<int64_t> split, wide, out;
  for (int i = 0; i < rank; ++i) {
    const int ix = i - (rank - x.rank()), ir = i - (rank - static_cast<int>(reps.size()));
    const int64_t d = ix >= 0 ? x.shape()[ix] : 1;
    const int64_t r = ir >= 0 ? reps[static_cast<std::size_t>(ir)] : 1;
    split.insert(split.end(), {1, d});
    wide.insert(wide.end(), {r, d});
    out.push_back(detail::checked_mul("tile", r, d));
  }
  Shape(wide).check("tile");
  return reshape(broadcast_to(reshape(x, Shape(split), loc), Shape(wide), loc), Shape(out), loc);
}

Tensor repeat(const Tensor& x, int64_t repeats, std::optional<int64_t> axis, Loc loc) {
  const detail::CallSite site(loc);
  if (repeats < 0) fail("repeat", "negative repeat count: got ", repeats, ", expected >= 0");
  if (!axis) return repeat(flatten(x, loc), repeats, 0, loc);
  const int a = normalize_axis("repeat", *axis, x.rank());
  std::vector<int64_t> wide = x.shape().dims(), out = x.shape().dims();
  wide.insert(wide.begin() + a + 1, repeats);
  out[static_cast<std::size_t>(a)] =
      detail::checked_mul("repeat", out[static_cast<std::size_t>(a)], repeats);
  Shape(wide).check("repeat");
  return reshape(broadcast_to(expand_dims(x, a + 1, loc), Shape(wide), loc), Shape(out), loc);
}

Tensor roll(const Tensor& x, int64_t shift, std::optional<int64_t> axis, Loc loc) {
  const detail::CallSite site(loc);
  if (!axis) return reshape(roll(flatten(x, loc), shift, 0, loc), x.shape(), loc);
  const int a = normalize_axis("roll", *axis, x.rank());
  const int64_t n = x.shape()[a];
  if (n == 0) return x;
  const int64_t s = ((shift % n) + n) % n;
  if (s == 0) return x;
  return concatenate(
      {slice_axis(x, a, Slice{n - s, n, 1}, loc), slice_axis(x, a, Slice{0, n - s, 1}, loc)}, a,
      loc);
}

namespace {

// A prepended or appended operand of diff: a 0-d one becomes one slice of x along axis.
Tensor diff_edge(const Tensor& edge, const Tensor& x, int axis, Loc loc) {
  if (edge.rank() != 0) return edge;
  std::vector<int64_t> dims = x.shape().dims();
  dims[static_cast<std::size_t>(axis)] = 1;
  return broadcast_to(edge, Shape(dims), loc);
}

}  // namespace

Tensor diff(const Tensor& x, const DiffOptions& options, Loc loc) {
  const detail::CallSite site(loc);
  if (options.n < 0) fail("diff", "negative order: got n=", options.n, ", expected n >= 0");
  if (x.rank() == 0)
    fail("diff", "a 0-d input has no axis: got ", x.type(), ", expected rank >= 1");
  const int a = normalize_axis("diff", options.axis, x.rank());
  std::vector<Tensor> parts;
  if (options.prepend) parts.push_back(diff_edge(*options.prepend, x, a, loc));
  parts.push_back(x);
  if (options.append) parts.push_back(diff_edge(*options.append, x, a, loc));
  Tensor y = parts.size() == 1 ? x : concatenate(parts, a, loc);
  for (int64_t i = 0; i < options.n && y.shape()[a] > 0; ++i) {
    const Tensor later = slice_axis(y, a, Slice{1, std::nullopt, 1}, loc);
    const Tensor earlier = slice_axis(y, a, Slice{0, -1, 1}, loc);
    y = y.dtype() == bool_ ? not_equal(later, earlier, loc) : sub(later, earlier, loc);
  }
  return y;
}

std::vector<Tensor> meshgrid(const std::vector<Tensor>& xs, std::string_view indexing, Loc loc) {
  const detail::CallSite site(loc);
  if (indexing != "xy" && indexing != "ij")
    fail("meshgrid", "unknown indexing: got \"", indexing, "\", expected \"xy\" or \"ij\"");
  const int rank = static_cast<int>(xs.size());
  // Output axis of input i: its own, but "xy" swaps the first two.
  const auto axis_of = [&](int i) { return indexing == "xy" && rank >= 2 && i < 2 ? 1 - i : i; };
  std::vector<int64_t> shape(static_cast<std::size_t>(rank));
  for (int i = 0; i < rank; ++i)
    shape[static_cast<std::size_t>(axis_of(i))] = xs[static_cast<std::size_t>(i)].numel();
  std::vector<Tensor> out;
  for (int i = 0; i < rank; ++i) {
    const Tensor& x = xs[static_cast<std::size_t>(i)];
    out.push_back(
        broadcast_to(reshape(x, along(rank, axis_of(i), x.numel()), loc), Shape(shape), loc));
  }
  return out;
}

Tensor pad(const Tensor& x, const std::vector<std::pair<int64_t, int64_t>>& widths, PadMode mode,
           double value, Loc loc) {
  const detail::CallSite site(loc);
  if (mode == PadMode::constant) return pad(x, widths, value, loc);
  if (static_cast<int>(widths.size()) != x.rank())
    fail("pad", "wrong number of widths: got ", widths.size(), " for ", x.type(),
         ", expected one (before, after) pair per axis");
  Tensor out = x;
  for (int a = 0; a < x.rank(); ++a) {
    const auto [before, after] = widths[static_cast<std::size_t>(a)];
    if (before < 0 || after < 0)
      fail("pad", "negative width on axis ", a, ": got (", before, ", ", after, "), expected >= 0");
    if (before == 0 && after == 0) continue;
    const int64_t n = x.shape()[a];
    if (n == 0)
      fail("pad", "cannot extend the empty axis ", a, " of ", x.type(),
           " by reflect, edge or wrap, expected a non-empty axis (or constant mode)");
    const int64_t total = detail::checked_add("pad", detail::checked_add("pad", n, before), after);
    std::vector<int64_t> shape = out.shape().dims();
    shape[static_cast<std::size_t>(a)] = total;
    Shape(shape).check("pad");
    // Source position of each output position j - before along the axis.
    std::vector<int64_t> src(static_cast<std::size_t>(total));
    const int64_t period = 2 * (n - 1);
    for (int64_t j = 0; j < total; ++j) {
      const int64_t p = j - before;
      int64_t& s = src[static_cast<std::size_t>(j)];
      if (mode == PadMode::edge) {
        s = std::clamp<int64_t>(p, 0, n - 1);
      } else if (mode == PadMode::wrap) {
        s = ((p % n) + n) % n;
      } else if (n == 1) {
        s = 0;
      } else {
        const int64_t t = ((p % period) + period) % period;
        s = t < n ? t : period - t;
      }
    }
    out = take(out, tensor(src), a, loc);
  }
  return out;
}

Tensor bincount(const Tensor& x, int64_t length, const std::optional<Tensor>& weights, Loc loc) {
  const detail::CallSite site(loc);
  if (x.rank() != 1 || !is_integral(x.dtype()) || x.dtype() == bool_)
    fail("bincount", "x is not a 1-d integer tensor: got ", x.type(),
         ", expected a vector of an integer dtype");
  if (length < 0) fail("bincount", "negative length: got ", length, ", expected >= 0");
  if (weights && weights->shape() != x.shape())
    fail("bincount", "weights do not match x: got x ", x.type(), " and weights ", weights->type(),
         ", expected weights of x's shape");
  const int64_t bins = detail::checked_add("bincount", length, 1);
  // Values outside [0, length) go to one more bin, which is cut off.
  const Tensor xi = ops::cast_if_needed(x, int64, loc);
  const Tensor inside = logical_and(xi >= int64_t{0}, xi < length, loc);
  const Tensor idx = where(inside, xi, tensor(length), loc);
  const Tensor w = weights ? *weights : ones(x.shape(), int64);
  const Tensor counts = scatter_add(zeros(Shape{bins}, w.dtype()), idx, w, 0, loc);
  return slice(counts, {Slice{0, length, 1}}, loc);
}

}  // namespace kiln
