#include "kiln/shape.h"

#include <algorithm>
#include <ostream>

#include "kiln/error.h"

namespace kiln {

namespace {

// Out of line and cold: inlined, its message code made numel() save registers on every call.
[[noreturn, gnu::cold, gnu::noinline]] void fail_invalid(std::string_view op, const Shape& s) {
  double product = 1;  // approximate, for the message: the exact one may not fit in 64 bits
  bool has_zero = false;
  for (int64_t d : s) {
    if (d < 0) fail(op, "negative dimension: got shape ", s, ", expected sizes >= 0");
    if (d == 0)
      has_zero = true;
    else
      product *= static_cast<double>(d);
  }
  if (has_zero)
    fail(op, "shape too large: got shape ", s, " whose non-zero sizes multiply to ", product,
         ", expected at most ", Shape::kMaxNumel, " (the strides of an empty shape must fit too)");
  fail(op, "too many elements: got shape ", s, " with ", product, " elements, expected at most ",
       Shape::kMaxNumel, " (so that its size in bytes fits in 64 bits)");
}

}  // namespace

int64_t Shape::numel(std::string_view op) const {
  int64_t n = 1;
  bool empty = false;
  for (int64_t d : dims_) {
    if (d <= 0) {
      if (d < 0) fail_invalid(op, *this);
      empty = true;
    } else if (__builtin_mul_overflow(n, d, &n)) {
      fail_invalid(op, *this);
    }
  }
  if (n > kMaxNumel) fail_invalid(op, *this);
  return empty ? 0 : n;
}

std::string Shape::to_string() const {
  std::string s = "[";
  for (std::size_t i = 0; i < dims_.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(dims_[i]);
  }
  return s + "]";
}

std::ostream& operator<<(std::ostream& os, const Shape& s) { return os << s.to_string(); }

Shape broadcast_shapes(std::string_view op, const Shape& a, const Shape& b) {
  if (a == b) return a;
  const int rank = std::max(a.rank(), b.rank());
  std::vector<int64_t> out(static_cast<std::size_t>(rank));
  for (int i = 0; i < rank; ++i) {
    const int ia = a.rank() - rank + i, ib = b.rank() - rank + i;
    const int64_t da = ia >= 0 ? a[ia] : 1, db = ib >= 0 ? b[ib] : 1;
    if (da != db && da != 1 && db != 1)
      fail(op, "shapes cannot be broadcast together: got ", a, " and ", b,
           ", expected equal sizes or 1 in each trailing dimension (axis ", i - rank, ": ", da,
           " vs ", db, ")");
    out[static_cast<std::size_t>(i)] = da == 1 ? db : da;
  }
  Shape s(std::move(out));
  s.check(op);  // two valid shapes can broadcast to one too large: [2^40, 1] with [2^40]
  return s;
}

int normalize_axis(std::string_view op, int64_t axis, int rank) {
  if (axis < -rank || axis >= rank || (rank == 0 && axis != 0) || rank == 0)
    fail(op, "axis out of range: got axis ", axis, " for a tensor of rank ", rank,
         ", expected an axis in [", -rank, ", ", rank - 1, "]");
  return static_cast<int>(axis < 0 ? axis + rank : axis);
}

std::vector<int> normalize_axes(std::string_view op, const std::vector<int64_t>& axes, int rank,
                                bool all_if_empty) {
  std::vector<int> out;
  if (axes.empty() && all_if_empty) {
    for (int i = 0; i < rank; ++i) out.push_back(i);
    return out;
  }
  for (int64_t a : axes) out.push_back(normalize_axis(op, a, rank));
  std::sort(out.begin(), out.end());
  if (std::adjacent_find(out.begin(), out.end()) != out.end())
    fail(op, "repeated axis: got axes ", Shape(axes), ", expected each axis at most once");
  return out;
}

std::vector<int64_t> contiguous_strides(const Shape& s) {
  std::vector<int64_t> st(static_cast<std::size_t>(s.rank()));
  int64_t acc = 1;
  for (int i = s.rank() - 1; i >= 0; --i) {
    st[static_cast<std::size_t>(i)] = acc;
    acc *= std::max<int64_t>(s[i], 1);
  }
  return st;
}

}  // namespace kiln
