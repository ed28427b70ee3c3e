// The LLVM implementation of kiln/lowering.h's Builder: each operation emits the instructions
// of the code generator's value helpers (scalar_ops.h), on values of one lane count.
#pragma once

#include <llvm/IR/Value.h>

#include <span>

#include "compiler/scalar_ops.h"
#include "kiln/lowering.h"

namespace kiln::compiler {

class LlvmBuilder final : public lowering::Builder {
 public:
  // Constants are splat to `lanes`, the lanes of the operation's operands.
  LlvmBuilder(ScalarOps& ops, llvm::IRBuilder<>& b, int lanes) : ops_(ops), b_(b), lanes_(lanes) {}

  static lowering::Value wrap(llvm::Value* v) { return lowering::Value(v); }
  static llvm::Value* unwrap(lowering::Value v) { return static_cast<llvm::Value*>(v.handle()); }

  lowering::Value constant(DType d, double v) override;
  lowering::Value add(DType d, lowering::Value x, lowering::Value y) override;
  lowering::Value sub(DType d, lowering::Value x, lowering::Value y) override;
  lowering::Value mul(DType d, lowering::Value x, lowering::Value y) override;
  lowering::Value div(lowering::Value x, lowering::Value y) override;
  lowering::Value neg(DType d, lowering::Value x) override;
  lowering::Value abs(lowering::Value x) override;
  lowering::Value sqrt(lowering::Value x) override;
  lowering::Value round(lowering::Rounding mode, lowering::Value x) override;
  lowering::Value copysign(lowering::Value magnitude, lowering::Value sign) override;
  lowering::Value max(DType d, lowering::Value x, lowering::Value y) override;
  lowering::Value min(DType d, lowering::Value x, lowering::Value y) override;
  lowering::Value compare(lowering::Comparison c, DType d, lowering::Value x,
                          lowering::Value y) override;
  lowering::Value unsigned_less(lowering::Value x, lowering::Value y) override;
  lowering::Value is_nan(lowering::Value x) override;
  lowering::Value select(lowering::Value condition, lowering::Value if_true,
                         lowering::Value if_false) override;
  lowering::Value bit_and(lowering::Value x, lowering::Value y) override;
  lowering::Value bit_or(lowering::Value x, lowering::Value y) override;
  lowering::Value bit_xor(lowering::Value x, lowering::Value y) override;
  lowering::Value bit_not(lowering::Value x) override;
  lowering::Value shift_left(lowering::Value x, lowering::Value count) override;
  lowering::Value shift_right(DType d, lowering::Value x, lowering::Value count) override;
  lowering::Value convert(DType from, DType to, lowering::Value x) override;
  lowering::Value call(lowering::MathFunction f, DType d,
                       std::span<const lowering::Value> args) override;

 private:
  ScalarOps& ops_;
  llvm::IRBuilder<>& b_;
  int lanes_;
};

}  // namespace kiln::compiler
