// The code generator's operations on element values (scalars or vectors of lanes): LLVM types
// of each dtype, conversions between storage and compute types, constants, max/min, convert and
// the vector math library's functions, each as the interpreter's kernels compute it.
#pragma once

#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/Intrinsics.h>

#include <cstdint>
#include <functional>
#include <string>
#include <unordered_set>
#include <vector>

#include "kiln/dtype.h"
#include "math/vector_math.h"

namespace kiln::compiler {

inline bool is_signed_int(DType d) { return d == int32 || d == int64; }

// Emits into `fn_` (set by the code generator before it emits) through `b_`.
class ScalarOps {
 public:
  explicit ScalarOps(llvm::Module& m);

  // ---- types and conversions ----
  llvm::Type* compute_scalar(DType d);
  llvm::Type* storage_scalar(DType d);
  llvm::Type* vec(llvm::Type* t, int lanes);
  int lanes_of(llvm::Value* v);
  llvm::Value* splat(llvm::Value* v, int lanes);
  llvm::Value* fconst(DType d, double v, int lanes);
  llvm::Value* iconst(llvm::Type* t, int64_t v, int lanes);
  llvm::Value* intrinsic(llvm::Intrinsic::ID id, std::vector<llvm::Value*> args,
                         std::vector<llvm::Type*> types = {});
  // float16/bfloat16 values are computed as float and rounded to their dtype after every
  // operation, as the interpreter stores each result.
  llvm::Value* to_storage(DType d, llvm::Value* v);
  llvm::Value* to_compute(DType d, llvm::Value* v);
  llvm::Value* round_to(DType d, llvm::Value* v);

  // ---- operations ----
  // fn on every lane, through the same SLEEF functions and patches as the eager kernels
  // (math::host_functions, math::patches).
  llvm::Value* call_math(math::MathFn fn, DType d, const std::vector<llvm::Value*>& args);
  llvm::Value* is_nan(llvm::Value* x);
  // max/min as the interpreter's kernels: NaN propagates (as a + b), ties give b.
  llvm::Value* extreme(bool is_max, DType d, llvm::Value* a, llvm::Value* c);
  // As the convert kernel, before rounding to a float16 or bfloat16 `to`.
  llvm::Value* convert(DType from, DType to, llvm::Value* x);
  // x / d on floats, correctly rounded as fdiv: by a reciprocal where d is invariant and x is
  // not (docs/DESIGN.md, "Compiler").
  llvm::Value* divide(llvm::Value* x, llvm::Value* d);

 protected:
  // v, marked as the same for every iteration of the innermost loop it is used in.
  llvm::Value* invariant(llvm::Value* v);
  bool is_invariant(llvm::Value* v) const;

  llvm::Module& m_;
  llvm::LLVMContext& ctx_;
  llvm::IRBuilder<> b_;
  llvm::Function* fn_ = nullptr;

 private:
  llvm::Value* libm_on_overflow(math::MathFn fn, DType t, const std::vector<llvm::Value*>& args,
                                llvm::Value* r);
  // `value`, or where `needed` holds what `slow` computes, on a branch laid out as unlikely.
  llvm::Value* on_rare_branch(llvm::Value* needed, llvm::Value* value, const std::string& name,
                              const std::function<llvm::Value*()>& slow);
  llvm::Value* call_sleef(math::MathFn fn, DType t, const std::vector<llvm::Value*>& args);

  std::unordered_set<const llvm::Value*> invariant_;
};

}  // namespace kiln::compiler
