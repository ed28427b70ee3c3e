// kiln/lowering.h's Builder over LLVM: the instructions the code generator emitted for each
// built-in primitive before lowerings moved to the primitives (src/ops), so that compiled
// results keep the interpreter's bits (docs/DESIGN.md, "Compiler").
#include "compiler/lowering_builder.h"

#include <llvm/IR/Intrinsics.h>

#include <vector>

namespace kiln::compiler {

using lowering::Value;

namespace {

math::MathFn math_fn(lowering::MathFunction f) {
  switch (f) {
    case lowering::MathFunction::exp:
      return math::MathFn::exp;
    case lowering::MathFunction::log:
      return math::MathFn::log;
    case lowering::MathFunction::log1p:
      return math::MathFn::log1p;
    case lowering::MathFunction::expm1:
      return math::MathFn::expm1;
    case lowering::MathFunction::sin:
      return math::MathFn::sin;
    case lowering::MathFunction::cos:
      return math::MathFn::cos;
    case lowering::MathFunction::tan:
      return math::MathFn::tan;
    case lowering::MathFunction::tanh:
      return math::MathFn::tanh;
    case lowering::MathFunction::erf:
      return math::MathFn::erf;
    case lowering::MathFunction::pow:
      return math::MathFn::pow;
  }
  return math::MathFn::exp;
}

llvm::Intrinsic::ID rounding(lowering::Rounding mode) {
  switch (mode) {
    case lowering::Rounding::floor:
      return llvm::Intrinsic::floor;
    case lowering::Rounding::ceil:
      return llvm::Intrinsic::ceil;
    case lowering::Rounding::nearest_even:
      return llvm::Intrinsic::roundeven;
    case lowering::Rounding::toward_zero:
      return llvm::Intrinsic::trunc;
  }
  return llvm::Intrinsic::trunc;
}

// Float predicates are ordered except ne (C++'s !=); integer ones follow d's signedness.
llvm::CmpInst::Predicate predicate(lowering::Comparison c, DType d) {
  using P = llvm::CmpInst::Predicate;
  const bool fl = is_floating(d), sg = is_signed_int(d);
  auto pick = [&](P f, P s, P u) { return fl ? f : sg ? s : u; };
  switch (c) {
    case lowering::Comparison::eq:
      return pick(P::FCMP_OEQ, P::ICMP_EQ, P::ICMP_EQ);
    case lowering::Comparison::ne:
      return pick(P::FCMP_UNE, P::ICMP_NE, P::ICMP_NE);
    case lowering::Comparison::lt:
      return pick(P::FCMP_OLT, P::ICMP_SLT, P::ICMP_ULT);
    case lowering::Comparison::le:
      return pick(P::FCMP_OLE, P::ICMP_SLE, P::ICMP_ULE);
    case lowering::Comparison::gt:
      return pick(P::FCMP_OGT, P::ICMP_SGT, P::ICMP_UGT);
    case lowering::Comparison::ge:
      return pick(P::FCMP_OGE, P::ICMP_SGE, P::ICMP_UGE);
  }
  return P::ICMP_EQ;
}

}  // namespace

Value LlvmBuilder::constant(DType d, double v) {
  if (is_floating(d)) return wrap(ops_.fconst(d, v, lanes_));
  return wrap(ops_.iconst(ops_.compute_scalar(d), static_cast<int64_t>(v), lanes_));
}
Value LlvmBuilder::add(DType d, Value x, Value y) {
  return wrap(is_floating(d) ? b_.CreateFAdd(unwrap(x), unwrap(y))
                             : b_.CreateAdd(unwrap(x), unwrap(y)));
}
Value LlvmBuilder::sub(DType d, Value x, Value y) {
  return wrap(is_floating(d) ? b_.CreateFSub(unwrap(x), unwrap(y))
                             : b_.CreateSub(unwrap(x), unwrap(y)));
}
Value LlvmBuilder::mul(DType d, Value x, Value y) {
  return wrap(is_floating(d) ? b_.CreateFMul(unwrap(x), unwrap(y))
                             : b_.CreateMul(unwrap(x), unwrap(y)));
}
Value LlvmBuilder::div(Value x, Value y) { return wrap(ops_.divide(unwrap(x), unwrap(y))); }
Value LlvmBuilder::neg(DType d, Value x) {
  if (is_floating(d)) return wrap(b_.CreateFNeg(unwrap(x)));
  return wrap(b_.CreateSub(unwrap(constant(d, 0)), unwrap(x)));
}
Value LlvmBuilder::abs(Value x) { return wrap(ops_.intrinsic(llvm::Intrinsic::fabs, {unwrap(x)})); }
Value LlvmBuilder::sqrt(Value x) {
  return wrap(ops_.intrinsic(llvm::Intrinsic::sqrt, {unwrap(x)}));
}
Value LlvmBuilder::round(lowering::Rounding mode, Value x) {
  return wrap(ops_.intrinsic(rounding(mode), {unwrap(x)}));
}
Value LlvmBuilder::copysign(Value magnitude, Value sign) {
  return wrap(ops_.intrinsic(llvm::Intrinsic::copysign, {unwrap(magnitude), unwrap(sign)}));
}
Value LlvmBuilder::max(DType d, Value x, Value y) {
  return wrap(ops_.extreme(true, d, unwrap(x), unwrap(y)));
}
Value LlvmBuilder::min(DType d, Value x, Value y) {
  return wrap(ops_.extreme(false, d, unwrap(x), unwrap(y)));
}
Value LlvmBuilder::compare(lowering::Comparison c, DType d, Value x, Value y) {
  const llvm::CmpInst::Predicate p = predicate(c, d);
  return wrap(is_floating(d) ? b_.CreateFCmp(p, unwrap(x), unwrap(y))
                             : b_.CreateICmp(p, unwrap(x), unwrap(y)));
}
Value LlvmBuilder::unsigned_less(Value x, Value y) {
  return wrap(b_.CreateICmpULT(unwrap(x), unwrap(y)));
}
Value LlvmBuilder::is_nan(Value x) { return wrap(ops_.is_nan(unwrap(x))); }
Value LlvmBuilder::select(Value condition, Value if_true, Value if_false) {
  return wrap(b_.CreateSelect(unwrap(condition), unwrap(if_true), unwrap(if_false)));
}
Value LlvmBuilder::bit_and(Value x, Value y) { return wrap(b_.CreateAnd(unwrap(x), unwrap(y))); }
Value LlvmBuilder::bit_or(Value x, Value y) { return wrap(b_.CreateOr(unwrap(x), unwrap(y))); }
Value LlvmBuilder::bit_xor(Value x, Value y) { return wrap(b_.CreateXor(unwrap(x), unwrap(y))); }
Value LlvmBuilder::bit_not(Value x) { return wrap(b_.CreateNot(unwrap(x))); }
Value LlvmBuilder::shift_left(Value x, Value count) {
  return wrap(b_.CreateShl(unwrap(x), unwrap(count)));
}
Value LlvmBuilder::shift_right(DType d, Value x, Value count) {
  return wrap(is_signed_int(d) ? b_.CreateAShr(unwrap(x), unwrap(count))
                               : b_.CreateLShr(unwrap(x), unwrap(count)));
}
Value LlvmBuilder::convert(DType from, DType to, Value x) {
  return wrap(ops_.convert(from, to, unwrap(x)));
}
Value LlvmBuilder::call(lowering::MathFunction f, DType d, std::span<const Value> args) {
  std::vector<llvm::Value*> a;
  for (Value v : args) a.push_back(unwrap(v));
  return wrap(ops_.call_math(math_fn(f), d, a));
}

}  // namespace kiln::compiler
