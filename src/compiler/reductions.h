// The code generator's reduction arithmetic: how a reduction (kiln/lowering.h's Reduction,
// declared with reduce_sum, ..., reduce_or) accumulates its terms, lane by lane.
#pragma once

#include "compiler/scalar_ops.h"
#include "kiln/lowering.h"

namespace kiln::compiler {

using lowering::Reduction;

struct Reducer {
  Reduction kind;
  DType in;   // the reduced values' dtype
  DType out;  // the result's dtype
};

class ReduceOps : public ScalarOps {
 public:
  using ScalarOps::ScalarOps;

  // Sums and products of floats accumulate in double, of integers in 64 bits (wrapping), as
  // the interpreter does; max/min in the compute type; and/or in bool.
  llvm::Type* acc_scalar(const Reducer& r);
  llvm::Value* to_acc(const Reducer& r, llvm::Value* v);
  llvm::Value* identity(const Reducer& r, int lanes);
  // Order-independent for float max/min: NaN wins, and +0 beats -0 for max (-0 for min).
  llvm::Value* combine(const Reducer& r, llvm::Value* acc, llvm::Value* v);
  llvm::Value* from_acc(const Reducer& r, llvm::Value* acc);
  // A float's bits as a signed integer that orders as the float does, -0 below +0 (so max
  // picks +0 and min -0, as combine does); NaNs get keys too, but the NaN flag overrides them.
  // Its own inverse.
  llvm::Value* ordered_key(llvm::Value* bits);
  llvm::Value* key_of(llvm::Value* v);
  llvm::Value* value_of_key(llvm::Value* k, llvm::Type* t);
};

}  // namespace kiln::compiler
