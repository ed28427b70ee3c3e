// How tensors print: numpy's array2string (with separator ", ") and its print options.
//
// `std::cout << t` follows numpy 1.24's default float mode ("maxprec"): floats print the
// shortest digits that read back as the same value of their dtype, with at most `precision`
// digits after the point, in positional notation, or in scientific notation for the whole tensor
// when its magnitudes span too much. Tensors with more than `threshold` elements print only
// `edgeitems` rows and columns at each end around "..."; lines wrap at `linewidth`.
#pragma once

#include <cstdint>

namespace kiln {

struct PrintOptions {
  int precision = 8;         // digits after the decimal point, at most (0 to 100)
  int64_t threshold = 1000;  // more elements than this print summarised (>= 0)
  int64_t edgeitems = 3;     // items shown at each end of a summarised axis (>= 1)
  int64_t linewidth = 75;    // characters per line before a row wraps (>= 1)
  bool suppress = false;     // true: never scientific for small values; they print as 0.
};

// The options every printed tensor uses; process-wide, like numpy's.
PrintOptions get_printoptions();
// Raises Error("[set_printoptions] ...") for a value out of range, leaving the options as they
// were.
void set_printoptions(const PrintOptions& options);

// Sets options for a scope and restores the previous ones when it ends:
//   { ScopedPrintOptions p({.precision = 3}); std::cout << x; }
// The options are process-wide, so a scope is visible to other threads while it lasts.
class ScopedPrintOptions {
 public:
  explicit ScopedPrintOptions(const PrintOptions& options);
  ~ScopedPrintOptions();
  ScopedPrintOptions(const ScopedPrintOptions&) = delete;
  ScopedPrintOptions& operator=(const ScopedPrintOptions&) = delete;

 private:
  PrintOptions saved_;
};

}  // namespace kiln
