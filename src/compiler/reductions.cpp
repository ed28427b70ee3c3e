// Reductions' accumulators in LLVM values: their types, identities, combining step and result,
// in the interpreter's arithmetic (docs/DESIGN.md, "Compiler").
#include "compiler/reductions.h"

namespace kiln::compiler {

llvm::Type* ReduceOps::acc_scalar(const Reducer& r) {
  if (r.kind == Reduction::sum || r.kind == Reduction::prod)
    return is_floating(r.in) ? b_.getDoubleTy() : b_.getInt64Ty();
  return compute_scalar(r.in);
}
llvm::Value* ReduceOps::to_acc(const Reducer& r, llvm::Value* v) {
  llvm::Type* t = vec(acc_scalar(r), lanes_of(v));
  if (v->getType() == t) return v;
  if (is_floating(r.in)) return b_.CreateFPExt(v, t);
  return is_signed_int(r.in) ? b_.CreateSExt(v, t) : b_.CreateZExt(v, t);
}
llvm::Value* ReduceOps::identity(const Reducer& r, int lanes) {
  llvm::Type* t = acc_scalar(r);
  const Reduction k = r.kind;
  if (k == Reduction::all) return splat(b_.getTrue(), lanes);
  if (k == Reduction::any) return splat(b_.getFalse(), lanes);
  const bool fl = t->isFloatingPointTy();
  if (k == Reduction::sum)
    return fl ? splat(llvm::ConstantFP::get(t, 0.0), lanes) : iconst(t, 0, lanes);
  if (k == Reduction::prod)
    return fl ? splat(llvm::ConstantFP::get(t, 1.0), lanes) : iconst(t, 1, lanes);
  const bool is_max = k == Reduction::max;
  if (fl) return splat(llvm::ConstantFP::getInfinity(t, is_max), lanes);
  const unsigned bits = t->getIntegerBitWidth();
  llvm::APInt v =
      is_signed_int(r.in)
          ? (is_max ? llvm::APInt::getSignedMinValue(bits) : llvm::APInt::getSignedMaxValue(bits))
          : (is_max ? llvm::APInt::getMinValue(bits) : llvm::APInt::getMaxValue(bits));
  return splat(llvm::ConstantInt::get(t, v), lanes);
}
llvm::Value* ReduceOps::combine(const Reducer& r, llvm::Value* acc, llvm::Value* v) {
  const Reduction k = r.kind;
  const bool fl = acc->getType()->getScalarType()->isFloatingPointTy();
  if (k == Reduction::sum) return fl ? b_.CreateFAdd(acc, v) : b_.CreateAdd(acc, v);
  if (k == Reduction::prod) return fl ? b_.CreateFMul(acc, v) : b_.CreateMul(acc, v);
  if (k == Reduction::all) return b_.CreateAnd(acc, v);
  if (k == Reduction::any) return b_.CreateOr(acc, v);
  const bool is_max = k == Reduction::max;
  if (!fl) return extreme(is_max, r.in, acc, v);
  // Order-independent: NaN wins, and +0 beats -0 for max (-0 for min), so that lanes and
  // threads may combine in any order.
  llvm::Value* pick = is_max ? b_.CreateFCmpOGT(v, acc) : b_.CreateFCmpOLT(v, acc);
  llvm::Value* tie = b_.CreateFCmpOEQ(v, acc);
  llvm::Type* bits_t = vec(b_.getIntNTy(acc->getType()->getScalarSizeInBits()), lanes_of(acc));
  llvm::Value* sign_v =
      b_.CreateICmpSLT(b_.CreateBitCast(v, bits_t), llvm::Constant::getNullValue(bits_t));
  llvm::Value* tie_pick = is_max ? b_.CreateNot(sign_v) : sign_v;
  llvm::Value* chosen = b_.CreateSelect(b_.CreateOr(pick, b_.CreateAnd(tie, tie_pick)), v, acc);
  llvm::Value* nan = b_.CreateOr(is_nan(acc), is_nan(v));
  return b_.CreateSelect(nan, b_.CreateFAdd(acc, v), chosen);
}
llvm::Value* ReduceOps::from_acc(const Reducer& r, llvm::Value* acc) {
  llvm::Type* t = vec(compute_scalar(r.out), lanes_of(acc));
  if (acc->getType() == t) return round_to(r.out, acc);
  if (acc->getType()->isFPOrFPVectorTy()) return round_to(r.out, b_.CreateFPTrunc(acc, t));
  return b_.CreateTrunc(acc, t);
}

llvm::Value* ReduceOps::ordered_key(llvm::Value* bits) {
  llvm::Type* t = bits->getType();
  const unsigned w = t->getScalarSizeInBits();
  llvm::Value* sign = b_.CreateAShr(bits, w - 1);
  llvm::Value* magnitude = llvm::ConstantInt::get(t, llvm::APInt::getSignedMaxValue(w));
  return b_.CreateXor(bits, b_.CreateAnd(sign, magnitude));
}
llvm::Value* ReduceOps::key_of(llvm::Value* v) {
  llvm::Type* it = vec(b_.getIntNTy(v->getType()->getScalarSizeInBits()), lanes_of(v));
  return ordered_key(b_.CreateBitCast(v, it));
}
llvm::Value* ReduceOps::value_of_key(llvm::Value* k, llvm::Type* t) {
  return b_.CreateBitCast(ordered_key(k), t);
}

}  // namespace kiln::compiler
