// Shapes, axes and broadcasting.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <iosfwd>
#include <string>
#include <string_view>
#include <vector>

namespace kiln {

// A list of sizes. Any list can be held; numel() and check() are where sizes are validated:
// every size >= 0 and at most kMaxNumel elements (docs/DESIGN.md, "Sizes").
class Shape {
 public:
  // The most elements a shape may describe: at the widest dtype (8 bytes) its byte size still
  // fits in int64_t, so element counts, strides, offsets and byte sizes computed from a valid
  // shape never overflow.
  static constexpr int64_t kMaxNumel = INT64_MAX / 8;

  Shape() = default;
  Shape(std::initializer_list<int64_t> dims) : dims_(dims) {}
  explicit Shape(std::vector<int64_t> dims) : dims_(std::move(dims)) {}

  int rank() const { return static_cast<int>(dims_.size()); }
  int64_t operator[](int i) const { return dims_[static_cast<std::size_t>(i)]; }
  int64_t& operator[](int i) { return dims_[static_cast<std::size_t>(i)]; }
  // Number of elements. Raises Error naming `op` for a negative size, or when the product of
  // the non-zero sizes exceeds kMaxNumel (numpy's rule: an empty shape's strides must fit too).
  int64_t numel(std::string_view op = "shape") const;
  // Raises the same Error as numel(op) for an invalid shape.
  void check(std::string_view op) const { (void)numel(op); }
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

// Result shape of broadcasting a with b (numpy rules), checked; throws Error naming `op`.
Shape broadcast_shapes(std::string_view op, const Shape& a, const Shape& b);
// Normalises a possibly negative axis against `rank`; throws Error naming `op`.
int normalize_axis(std::string_view op, int64_t axis, int rank);
// Normalises and sorts a list of axes; empty `axes` with `all_if_empty` means every axis.
std::vector<int> normalize_axes(std::string_view op, const std::vector<int64_t>& axes, int rank,
                                bool all_if_empty);
// Row-major (C order) strides of a shape, in elements.
std::vector<int64_t> contiguous_strides(const Shape& s);

}  // namespace kiln
