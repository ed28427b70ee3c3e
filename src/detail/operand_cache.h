// Copies of kernel operands in another layout (oneDNN's blocked formats), shared by the kernel
// calls of one compiled call: a convolution's input and weight gradients read the same output
// gradient, its forward and weight gradient the same input (docs/DESIGN.md, "Operand copies
// shared within a call").
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "kiln/tensor.h"

namespace kiln::detail {

// Opens a cache on this thread for as long as it lives; the compiled executable opens one per
// call, around its steps, and turns it off around a kernel that is a user's code
// (OperandCacheOff), which may refill a buffer it keeps between two calls. Scopes nest (a
// loop's body runs its own call inside a kernel), and a kernel sees only the innermost. Within
// it, what a built-in kernel reads does not change while anyone holds it: every write in place
// over a value first checks that nothing else holds its storage, and an entry holds its
// source (so a write in place forgets the copies of its target first).
class OperandCacheScope {
 public:
  OperandCacheScope();
  ~OperandCacheScope();
  OperandCacheScope(const OperandCacheScope&) = delete;
  OperandCacheScope& operator=(const OperandCacheScope&) = delete;

  // Drops the copies of sources that only the cache still holds: no later kernel can read them,
  // and their memory may be reused.
  void drop_unheld();
  // Drops the copies of what shares t's storage, which is about to be written over.
  void forget(const Tensor& t);

 private:
  struct Entry {
    Tensor source;
    std::vector<int64_t> key;
    Tensor copy;
  };
  std::vector<Entry> entries_;
  OperandCacheScope* outer_;

  friend Tensor cached_copy(const Tensor&, std::vector<int64_t>, const std::function<Tensor()>&);
};

// No cache for the kernels run while it lives (a user's kernel), whatever scope is open.
class OperandCacheOff {
 public:
  OperandCacheOff();
  ~OperandCacheOff();
  OperandCacheOff(const OperandCacheOff&) = delete;
  OperandCacheOff& operator=(const OperandCacheOff&) = delete;

 private:
  OperandCacheScope* saved_;
};

// The copy of `source` that `make` returns, where `key` names the copy's layout: made once per
// source and key while a scope is open (the same storage, offset, dtype, shape and strides is
// the same source), made on every call outside one.
Tensor cached_copy(const Tensor& source, std::vector<int64_t> key,
                   const std::function<Tensor()>& make);

}  // namespace kiln::detail
