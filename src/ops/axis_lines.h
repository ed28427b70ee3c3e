// A tensor seen as lines along one axis: what kernels that work along an axis (gather, sort,
// scans) loop over.
#pragma once

#include <cstdint>

#include "kiln/shape.h"

namespace kiln::ops {

// x viewed as [outer, n, inner] around an axis: line l = (o, k) holds the n elements
// o*n*inner + k + j*inner, j = 0..n-1.
struct AxisLines {
  int64_t outer = 1, n = 1, inner = 1;
  int64_t count() const { return outer * inner; }
  int64_t base(int64_t line) const { return (line / inner) * n * inner + line % inner; }
};
inline AxisLines axis_lines(const Shape& s, int axis) {
  AxisLines r;
  for (int i = 0; i < axis; ++i) r.outer *= s[i];
  r.n = s[axis];
  for (int i = axis + 1; i < s.rank(); ++i) r.inner *= s[i];
  return r;
}

}  // namespace kiln::ops
