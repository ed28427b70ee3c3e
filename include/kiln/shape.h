// Shapes, axes and broadcasting.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <iosfwd>
#include <string>
#include <string_view>
#include <vector>

namespace kiln {

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims) : dims_(dims) {}
  explicit Shape(std::vector<int64_t> dims) : dims_(std::move(dims)) {}

  int rank() const { return static_cast<int>(dims_.size()); }
  int64_t operator[](int i) const { return dims_[static_cast<std::size_t>(i)]; }
  int64_t& operator[](int i) { return dims_[static_cast<std::size_t>(i)]; }
  int64_t numel() const;
  const std::vector<int64_t>& dims() const { return dims_; }
  std::vector<int64_t>& dims() { return dims_; }
  auto begin() const { return dims_.begin(); }
  auto end() const { return dims_.end(); }
  bool operator==(const Shape&) const = default;
  std::string to_string() const;  // "[2, 3]"

 private:
  std::vector<int64_t> dims_;
};

std::ostream& operator<<(std::ostream& os, const Shape& s);

// Result shape of broadcasting a with b (numpy rules); throws Error naming `op`.
Shape broadcast_shapes(std::string_view op, const Shape& a, const Shape& b);
// Normalises a possibly negative axis against `rank`; throws Error naming `op`.
int normalize_axis(std::string_view op, int64_t axis, int rank);
// Normalises and sorts a list of axes; empty `axes` with `all_if_empty` means every axis.
std::vector<int> normalize_axes(std::string_view op, const std::vector<int64_t>& axes, int rank,
                                bool all_if_empty);
// Row-major (C order) strides of a shape, in elements.
std::vector<int64_t> contiguous_strides(const Shape& s);

}  // namespace kiln
