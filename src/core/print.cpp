// numpy-style printing: nested brackets, aligned columns, summarised beyond 1000 elements.
#include <algorithm>
#include <cmath>
#include <iomanip>
#include <ostream>
#include <sstream>

#include "kiln/tensor.h"

namespace kiln {
namespace {

constexpr int64_t kSummariseAbove = 1000;
constexpr int64_t kEdgeItems = 3;

std::string format_value(double v, DType dtype) {
  if (dtype == bool_) return v != 0 ? "true" : "false";
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  std::ostringstream os;
  if (is_floating(dtype)) {
    os << std::setprecision(6) << v;
  } else {
    os << static_cast<int64_t>(v);
  }
  return os.str();
}

struct Printer {
  const std::vector<double>& values;
  const std::vector<int64_t>& ints;  // integer dtypes: exact values (doubles lose digits > 2^53)
  const Shape& shape;
  DType dtype;
  bool summarise;
  std::size_t width = 0;

  std::string format(int64_t i) const {
    if (is_integral(dtype)) return std::to_string(ints[static_cast<std::size_t>(i)]);
    return format_value(values[static_cast<std::size_t>(i)], dtype);
  }

  // Indices shown along an axis of size n, with -1 marking the "..." gap.
  std::vector<int64_t> shown(int64_t n) const {
    std::vector<int64_t> idx;
    if (!summarise || n <= 2 * kEdgeItems) {
      for (int64_t i = 0; i < n; ++i) idx.push_back(i);
    } else {
      for (int64_t i = 0; i < kEdgeItems; ++i) idx.push_back(i);
      idx.push_back(-1);
      for (int64_t i = n - kEdgeItems; i < n; ++i) idx.push_back(i);
    }
    return idx;
  }

  void measure(int axis, int64_t base) {
    if (axis == shape.rank()) {
      width = std::max(width, format(base).size());
      return;
    }
    for (int64_t i : shown(shape[axis]))
      if (i >= 0) measure(axis + 1, base * shape[axis] + i);
  }

  void print(std::ostream& os, int axis, int64_t base) const {
    if (axis == shape.rank()) {
      std::string s = format(base);
      os << std::string(width - s.size(), ' ') << s;
      return;
    }
    os << "[";
    const std::vector<int64_t> idx = shown(shape[axis]);
    for (std::size_t k = 0; k < idx.size(); ++k) {
      if (k) {
        os << ",";
        if (axis == shape.rank() - 1) {
          os << " ";
        } else {
          os << std::string(static_cast<std::size_t>(shape.rank() - axis - 1), '\n')
             << std::string(static_cast<std::size_t>(axis + 1), ' ');
        }
      }
      if (idx[k] < 0) {
        os << "...";
      } else {
        print(os, axis + 1, base * shape[axis] + idx[k]);
      }
    }
    os << "]";
  }
};

}  // namespace

std::ostream& operator<<(std::ostream& os, const Tensor& t) {
  if (!t.defined()) return os << "Tensor(undefined)";
  if (t.is_traced()) return os << "Tracer(" << t.type() << ")";
  const bool integral = is_integral(t.dtype());
  const std::vector<double> values = integral ? std::vector<double>{} : t.to_vector<double>();
  const std::vector<int64_t> ints = integral ? t.to_vector<int64_t>() : std::vector<int64_t>{};
  Printer p{values, ints, t.shape(), t.dtype(), t.numel() > kSummariseAbove};
  p.measure(0, 0);
  p.print(os, 0, 0);
  return os;
}

std::string to_string(const Tensor& t) {
  std::ostringstream os;
  os << t;
  return os.str();
}

}  // namespace kiln
