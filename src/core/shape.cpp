#include "kiln/shape.h"

#include <algorithm>
#include <ostream>

#include "kiln/error.h"

namespace kiln {

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int64_t d : dims_) n *= d;
  return n;
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
  return Shape(std::move(out));
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
