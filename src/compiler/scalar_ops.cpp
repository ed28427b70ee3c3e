// LLVM values of one element: types, conversions, constants, and the math library's calls
// that compiled loops share with the eager kernels (docs/DESIGN.md, "Compiler").
#include "compiler/scalar_ops.h"

#include <llvm/IR/Intrinsics.h>
#include <llvm/IR/IntrinsicsX86.h>
#include <llvm/IR/MDBuilder.h>
#include <llvm/IR/Module.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include "math/fast_math_impl.h"

namespace kiln::compiler {

namespace {

// fast_math_impl.h's policy for compiled code: each operation emits its instruction, so loops
// compute Kiln's own float32 exp and tanh inline (no call, which would spill every vector
// register around it) and bit for bit as the library's variants: llvm.fma where the host's
// variant fuses, fmul then fadd where it does not (no fast-math flags, so LLVM contracts
// nothing), selects for the clamps, which keep NaN as maxps/minps do, and vscalefps for exp's
// scaling at 16 lanes where the host's variant is AVX-512's (narrower steps and the scalar tail
// scale by products, which round to the same bits).
struct IrMath {
  llvm::IRBuilder<>& b;
  int lanes;
  bool fused;
  bool avx512;
  using V = llvm::Value*;
  using I = llvm::Value*;
  using Mask = llvm::Value*;

  llvm::Type* lanes_of(llvm::Type* t) const {
    return lanes == 1 ? t : llvm::FixedVectorType::get(t, static_cast<unsigned>(lanes));
  }
  V set(float v) const {
    llvm::Constant* c = llvm::ConstantFP::get(b.getFloatTy(), v);
    return lanes == 1 ? c : b.CreateVectorSplat(static_cast<unsigned>(lanes), c);
  }
  I iset(int32_t v) const {
    llvm::Constant* c = b.getInt32(static_cast<uint32_t>(v));
    return lanes == 1 ? c : b.CreateVectorSplat(static_cast<unsigned>(lanes), c);
  }
  V add(V x, V y) const { return b.CreateFAdd(x, y); }
  V sub(V x, V y) const { return b.CreateFSub(x, y); }
  V mul(V x, V y) const { return b.CreateFMul(x, y); }
  V div(V x, V y) const { return b.CreateFDiv(x, y); }
  V fma(V x, V y, V z) const {
    if (!fused) return b.CreateFAdd(b.CreateFMul(x, y), z);
    return b.CreateIntrinsic(llvm::Intrinsic::fma, {x->getType()}, {x, y, z});
  }
  V clamp(V x, V lo, V hi) const {  // NaN fails both comparisons and passes
    V m = b.CreateSelect(b.CreateFCmpOLT(x, lo), lo, x);
    return b.CreateSelect(b.CreateFCmpOGT(m, hi), hi, m);
  }
  I bits(V v) const { return b.CreateBitCast(v, lanes_of(b.getInt32Ty())); }
  V from_bits(I i) const { return b.CreateBitCast(i, lanes_of(b.getFloatTy())); }
  V abs(V v) const { return from_bits(b.CreateAnd(bits(v), iset(0x7fffffff))); }
  V copysign(V mag, V s) const {
    return from_bits(b.CreateOr(b.CreateAnd(bits(mag), iset(0x7fffffff)),
                                b.CreateAnd(bits(s), iset(std::numeric_limits<int32_t>::min()))));
  }
  Mask lt(V x, V y) const { return b.CreateFCmpOLT(x, y); }
  V select(Mask k, V x, V y) const { return b.CreateSelect(k, x, y); }
  I iadd(I x, I y) const { return b.CreateAdd(x, y); }  // wrapping, as the vector instructions
  I isub(I x, I y) const { return b.CreateSub(x, y); }
  I shl(I x, int n) const { return b.CreateShl(x, static_cast<uint64_t>(n)); }
  I sra(I x, int n) const { return b.CreateAShr(x, static_cast<uint64_t>(n)); }
  bool has_scalef() const { return avx512 && lanes == 16; }
  V scalef(V y, V n) const {
    llvm::Value* all = b.getInt16(0xffff);  // every lane; the pass-through operand is unused
    llvm::Value* round = b.getInt32(4);     // the current rounding mode
    return b.CreateIntrinsic(llvm::Intrinsic::x86_avx512_mask_scalef_ps_512, {},
                             {y, n, y, all, round});
  }
};

}  // namespace

ScalarOps::ScalarOps(llvm::Module& m) : m_(m), ctx_(m.getContext()), b_(ctx_) {}

llvm::Type* ScalarOps::compute_scalar(DType d) {
  switch (d) {
    case DType::bool_:
      return b_.getInt1Ty();
    case DType::uint8:
      return b_.getInt8Ty();
    case DType::uint32:
    case DType::int32:
      return b_.getInt32Ty();
    case DType::int64:
      return b_.getInt64Ty();
    case DType::float64:
      return b_.getDoubleTy();
    default:
      return b_.getFloatTy();
  }
}
llvm::Type* ScalarOps::storage_scalar(DType d) {
  switch (d) {
    case DType::bool_:
      return b_.getInt8Ty();
    case DType::float16:
      return b_.getHalfTy();
    case DType::bfloat16:
      return b_.getInt16Ty();
    default:
      return compute_scalar(d);
  }
}
llvm::Type* ScalarOps::vec(llvm::Type* t, int lanes) {
  return lanes == 1 ? t : llvm::FixedVectorType::get(t, static_cast<unsigned>(lanes));
}
int ScalarOps::lanes_of(llvm::Value* v) {
  if (auto* t = llvm::dyn_cast<llvm::FixedVectorType>(v->getType()))
    return static_cast<int>(t->getNumElements());
  return 1;
}
llvm::Value* ScalarOps::splat(llvm::Value* v, int lanes) {
  if (lanes == 1 || lanes_of(v) == lanes) return v;
  return b_.CreateVectorSplat(static_cast<unsigned>(lanes), v);
}
llvm::Value* ScalarOps::fconst(DType d, double v, int lanes) {
  return splat(llvm::ConstantFP::get(compute_scalar(d), v), lanes);
}
llvm::Value* ScalarOps::iconst(llvm::Type* t, int64_t v, int lanes) {
  return splat(llvm::ConstantInt::get(t, static_cast<uint64_t>(v), true), lanes);
}
llvm::Value* ScalarOps::intrinsic(llvm::Intrinsic::ID id, std::vector<llvm::Value*> args,
                                  std::vector<llvm::Type*> types) {
  if (types.empty()) types = {args[0]->getType()};
  return b_.CreateCall(llvm::Intrinsic::getDeclaration(&m_, id, types), args);
}

llvm::Value* ScalarOps::to_storage(DType d, llvm::Value* v) {
  const int lanes = lanes_of(v);
  if (d == bool_) return b_.CreateZExt(v, vec(b_.getInt8Ty(), lanes));
  if (d == float16) return b_.CreateFPTrunc(v, vec(b_.getHalfTy(), lanes));
  if (d == bfloat16) {
    // BFloat16(float): round to nearest even; a NaN stays a (quiet) NaN.
    auto* i32 = vec(b_.getInt32Ty(), lanes);
    llvm::Value* u = b_.CreateBitCast(v, i32);
    llvm::Value* is_nan =
        b_.CreateICmpUGT(b_.CreateAnd(u, iconst(b_.getInt32Ty(), 0x7fffffff, lanes)),
                         iconst(b_.getInt32Ty(), 0x7f800000, lanes));
    llvm::Value* nan_bits = b_.CreateOr(b_.CreateLShr(u, iconst(b_.getInt32Ty(), 16, lanes)),
                                        iconst(b_.getInt32Ty(), 0x40, lanes));
    llvm::Value* odd = b_.CreateAnd(b_.CreateLShr(u, iconst(b_.getInt32Ty(), 16, lanes)),
                                    iconst(b_.getInt32Ty(), 1, lanes));
    llvm::Value* rounded =
        b_.CreateLShr(b_.CreateAdd(b_.CreateAdd(u, iconst(b_.getInt32Ty(), 0x7fff, lanes)), odd),
                      iconst(b_.getInt32Ty(), 16, lanes));
    return b_.CreateTrunc(b_.CreateSelect(is_nan, nan_bits, rounded), vec(b_.getInt16Ty(), lanes));
  }
  return v;
}
llvm::Value* ScalarOps::to_compute(DType d, llvm::Value* v) {
  const int lanes = lanes_of(v);
  if (d == bool_) return b_.CreateICmpNE(v, iconst(b_.getInt8Ty(), 0, lanes));
  if (d == float16) return b_.CreateFPExt(v, vec(b_.getFloatTy(), lanes));
  if (d == bfloat16) {
    llvm::Value* u = b_.CreateShl(b_.CreateZExt(v, vec(b_.getInt32Ty(), lanes)),
                                  iconst(b_.getInt32Ty(), 16, lanes));
    return b_.CreateBitCast(u, vec(b_.getFloatTy(), lanes));
  }
  return v;
}
llvm::Value* ScalarOps::round_to(DType d, llvm::Value* v) {
  if (d != float16 && d != bfloat16) return v;
  return to_compute(d, to_storage(d, v));
}

llvm::Value* ScalarOps::call_math(math::MathFn fn, DType d, const std::vector<llvm::Value*>& args) {
  const DType t = d == float64 ? float64 : float32;
  if (math::is_own(fn, t)) {  // Kiln's own: emitted inline (fast_math_impl.h)
    const IrMath m{b_, lanes_of(args[0]), math::host_isa() >= math::Isa::avx2,
                   math::host_isa() >= math::Isa::avx512};
    return fn == math::MathFn::exp ? math::fast::exp(m, args[0]) : math::fast::tanh(m, args[0]);
  }
  llvm::Value* r = call_sleef(fn, t, args);
  const math::Patches patch = math::patches(fn, t);
  llvm::Value* x = args[0];
  const int lanes = lanes_of(x);
  if (patch.identity_below_normal) {
    const double tiny =
        t == float64 ? std::numeric_limits<double>::min() : std::numeric_limits<float>::min();
    r = b_.CreateSelect(
        b_.CreateFCmpOLT(intrinsic(llvm::Intrinsic::fabs, {x}), fconst(t, tiny, lanes)), x, r);
  }
  if (patch.log_above)
    r = b_.CreateSelect(b_.CreateFCmpOGT(x, fconst(t, *patch.log_above, lanes)),
                        call_sleef(math::MathFn::log, t, {x}), r);
  if (patch.libm_on_overflow) r = libm_on_overflow(fn, t, args, r);
  return r;
}

llvm::Value* ScalarOps::invariant(llvm::Value* v) {
  invariant_.insert(v);
  return v;
}
bool ScalarOps::is_invariant(llvm::Value* v) const {
  return llvm::isa<llvm::Constant>(v) || invariant_.contains(v);
}

// A divisor that stays the same over the innermost loop (a constant; a softmax's sum, broadcast
// over its row) is divided into 1 once, outside the loop (LICM hoists it), and each quotient
// becomes a product and two fused multiply-adds, off the divider (a vdivps of 16 floats
// occupies it for several cycles): with y = RN(1/d) and q = RN(x y), r = x - d q is exact and
// RN(q + r y) = RN(x / d) (Markstein's theorem where q is within an ulp of x / d; where x's
// significand is below d's, q may be up to 1.5 ulps off, and the result was checked instead on
// every float32 x in [1, 2) against 4000 divisors and every divisor within 2^-10 of 2, on
// random float32 and float64 pairs, and on float64 pairs near 2; docs/DESIGN.md). It holds away
// from underflow and overflow: for d within [2^-24, 2^40] and |q| within [2^-76, 2^86]
// (float64: [2^-200, 2^200] and [2^-700, 2^700]), so x and r are normal or exact and 1/d is
// normal. A zero x gives q, its sign right; a vector with any other lane outside divides, on a
// branch. A constant whose reciprocal is exact (LLVM then multiplies) or outside the range
// divides. On AVX-512 only: at AVX2's width a division costs less, and the checks without mask
// registers more (a softmax over rows of 1024 at KILN_ISA=avx2 went from 0.734 to 0.809 ns an
// element).
llvm::Value* ScalarOps::divide(llvm::Value* x, llvm::Value* d) {
  if (!is_invariant(d) || is_invariant(x) || math::host_isa() < math::Isa::avx512)
    return b_.CreateFDiv(x, d);
  const bool f64 = x->getType()->getScalarType()->isDoubleTy();
  const double d_lo = f64 ? 0x1p-200 : 0x1p-24, d_hi = f64 ? 0x1p200 : 0x1p40;
  if (const auto* c = llvm::dyn_cast<llvm::Constant>(d)) {
    const auto* f = llvm::dyn_cast_or_null<llvm::ConstantFP>(c->getSplatValue());
    if (!f || f->getValueAPF().getExactInverse(nullptr)) return b_.CreateFDiv(x, d);
    // Outside the range (NaN included), the checks below would always send it to the division.
    const double magnitude = std::fabs(f->getValueAPF().convertToDouble());
    if (!(magnitude >= d_lo && magnitude <= d_hi)) return b_.CreateFDiv(x, d);
  }
  const int lanes = lanes_of(x);
  const DType t = f64 ? float64 : float32;
  auto within = [&](llvm::Value* v, double lo, double hi) {
    llvm::Value* a = intrinsic(llvm::Intrinsic::fabs, {v});
    return b_.CreateAnd(b_.CreateFCmpOGE(a, fconst(t, lo, lanes)),
                        b_.CreateFCmpOLE(a, fconst(t, hi, lanes)));
  };
  llvm::Value* y = b_.CreateFDiv(fconst(t, 1.0, lanes), d);
  llvm::Value* q = b_.CreateFMul(x, y);
  llvm::Value* r = intrinsic(llvm::Intrinsic::fma, {b_.CreateFNeg(d), q, x});
  llvm::Value* zero = b_.CreateFCmpOEQ(x, fconst(t, 0.0, lanes));
  llvm::Value* quotient = b_.CreateSelect(zero, q, intrinsic(llvm::Intrinsic::fma, {r, y, q}));
  llvm::Value* ok = b_.CreateAnd(
      within(d, d_lo, d_hi),
      b_.CreateOr(zero, f64 ? within(q, 0x1p-700, 0x1p700) : within(q, 0x1p-76, 0x1p86)));
  llvm::Value* all = lanes == 1 ? ok : b_.CreateAndReduce(ok);
  return on_rare_branch(b_.CreateNot(all), quotient, "divide", [&] { return b_.CreateFDiv(x, d); });
}

llvm::Value* ScalarOps::on_rare_branch(llvm::Value* needed, llvm::Value* value,
                                       const std::string& name,
                                       const std::function<llvm::Value*()>& slow) {
  llvm::BasicBlock* fast = b_.GetInsertBlock();
  auto* branch = llvm::BasicBlock::Create(ctx_, name, fn_);
  auto* join = llvm::BasicBlock::Create(ctx_, name + ".done", fn_);
  b_.CreateCondBr(needed, branch, join, llvm::MDBuilder(ctx_).createBranchWeights(1, 1 << 20));
  b_.SetInsertPoint(branch);
  llvm::Value* fixed = slow();
  llvm::BasicBlock* branch_end = b_.GetInsertBlock();
  b_.CreateBr(join);
  b_.SetInsertPoint(join);
  llvm::PHINode* phi = b_.CreatePHI(value->getType(), 2);
  phi->addIncoming(value, fast);
  phi->addIncoming(fixed, branch_end);
  return phi;
}

// Lanes where SLEEF overflowed to inf from finite arguments are recomputed by libm, on a
// branch that only runs when some lane needs it.
llvm::Value* ScalarOps::libm_on_overflow(math::MathFn fn, DType t,
                                         const std::vector<llvm::Value*>& args, llvm::Value* r) {
  const int lanes = lanes_of(r);
  llvm::Value* inf = fconst(t, std::numeric_limits<double>::infinity(), lanes);
  llvm::Value* mask = b_.CreateFCmpOEQ(intrinsic(llvm::Intrinsic::fabs, {r}), inf);
  for (llvm::Value* a : args)
    mask = b_.CreateAnd(mask, b_.CreateFCmpONE(intrinsic(llvm::Intrinsic::fabs, {a}), inf));
  llvm::Value* any = lanes == 1 ? mask : b_.CreateOrReduce(mask);
  return on_rare_branch(any, r, "libm", [&] {
    llvm::Type* scalar = compute_scalar(t);
    const std::string name = std::string(math::fn_name(fn)) + (t == float32 ? "f" : "");
    std::vector<llvm::Type*> types(args.size(), scalar);
    auto libm = m_.getOrInsertFunction(name, llvm::FunctionType::get(scalar, types, false));
    llvm::Value* fixed = r;
    for (int k = 0; k < lanes; ++k) {
      auto lane = [&](llvm::Value* v) {
        return lanes == 1 ? v : b_.CreateExtractElement(v, static_cast<uint64_t>(k));
      };
      std::vector<llvm::Value*> a;
      for (llvm::Value* v : args) a.push_back(lane(v));
      llvm::Value* y = b_.CreateSelect(lane(mask), b_.CreateCall(libm, a), lane(r));
      fixed = lanes == 1 ? y : b_.CreateInsertElement(fixed, y, static_cast<uint64_t>(k));
    }
    return fixed;
  });
}

// One call per native vector of the host's SLEEF variant (or the scalar one in tails).
llvm::Value* ScalarOps::call_sleef(math::MathFn fn, DType t,
                                   const std::vector<llvm::Value*>& args) {
  const int lanes = lanes_of(args[0]);
  const math::MathFunctions fns = math::host_functions(fn, t);
  const math::VectorFunction& v = lanes == 1 ? fns.scalar : fns.vector;
  const int native = v.lanes;
  llvm::Type* scalar = compute_scalar(t);
  auto call = [&](const std::vector<llvm::Value*>& a, int n) -> llvm::Value* {
    std::vector<llvm::Type*> types(a.size(), vec(scalar, n));
    auto callee =
        m_.getOrInsertFunction(v.symbol, llvm::FunctionType::get(vec(scalar, n), types, false));
    return b_.CreateCall(callee, a);
  };
  if (lanes == native) return call(args, lanes);
  if (lanes > 1 && lanes < native) {  // a part of a vector: zeros in the unused lanes
    std::vector<int> widen(static_cast<std::size_t>(native)), narrow;
    for (int k = 0; k < native; ++k) widen[static_cast<std::size_t>(k)] = k < lanes ? k : lanes;
    for (int k = 0; k < lanes; ++k) narrow.push_back(k);
    std::vector<llvm::Value*> wide;
    for (llvm::Value* a : args)
      wide.push_back(b_.CreateShuffleVector(a, llvm::Constant::getNullValue(a->getType()), widen));
    return b_.CreateShuffleVector(call(wide, native), narrow);
  }
  if (native == 1) {  // no vector variant on this host: lane by lane
    llvm::Value* out = llvm::UndefValue::get(vec(scalar, lanes));
    for (int k = 0; k < lanes; ++k) {
      std::vector<llvm::Value*> a;
      for (llvm::Value* x : args) a.push_back(b_.CreateExtractElement(x, static_cast<uint64_t>(k)));
      out = b_.CreateInsertElement(out, call(a, 1), static_cast<uint64_t>(k));
    }
    return out;
  }
  llvm::Value* out = llvm::UndefValue::get(vec(scalar, lanes));
  for (int start = 0; start < lanes; start += native) {
    std::vector<int> mask;
    for (int k = 0; k < native; ++k) mask.push_back(start + k);
    std::vector<llvm::Value*> part;
    for (llvm::Value* a : args) part.push_back(b_.CreateShuffleVector(a, mask));
    llvm::Value* r = call(part, native);
    for (int k = 0; k < native; ++k)
      out = b_.CreateInsertElement(out, b_.CreateExtractElement(r, static_cast<uint64_t>(k)),
                                   static_cast<uint64_t>(start + k));
  }
  return out;
}

llvm::Value* ScalarOps::is_nan(llvm::Value* x) { return b_.CreateFCmpUNO(x, x); }

llvm::Value* ScalarOps::extreme(bool is_max, DType d, llvm::Value* a, llvm::Value* c) {
  if (is_floating(d)) {
    llvm::Value* pick = is_max ? b_.CreateFCmpOGT(a, c) : b_.CreateFCmpOLT(a, c);
    llvm::Value* nan = b_.CreateOr(is_nan(a), is_nan(c));
    return b_.CreateSelect(nan, b_.CreateFAdd(a, c), b_.CreateSelect(pick, a, c));
  }
  llvm::Value* pick = is_signed_int(d) ? (is_max ? b_.CreateICmpSGT(a, c) : b_.CreateICmpSLT(a, c))
                                       : (is_max ? b_.CreateICmpUGT(a, c) : b_.CreateICmpULT(a, c));
  return b_.CreateSelect(pick, a, c);
}

llvm::Value* ScalarOps::convert(DType from, DType to, llvm::Value* x) {
  const int lanes = lanes_of(x);
  llvm::Type* t = vec(compute_scalar(to), lanes);
  if (from == to) return x;
  if (to == bool_) {
    if (is_floating(from)) return b_.CreateFCmpUNE(x, fconst(from, 0.0, lanes));
    return b_.CreateICmpNE(x, iconst(x->getType()->getScalarType(), 0, lanes));
  }
  if (is_floating(to)) {
    llvm::Value* r;
    if (is_floating(from)) {
      // double -> half goes through float, as the interpreter converts.
      r = from == float64 && to != float64 ? b_.CreateFPTrunc(x, vec(b_.getFloatTy(), lanes))
                                           : b_.CreateFPCast(x, t);
    } else if (is_signed_int(from)) {
      r = b_.CreateSIToFP(x, t);
    } else {
      r = b_.CreateUIToFP(x, t);
    }
    return r;  // the caller rounds a float16 or bfloat16 result
  }
  // To an integer dtype.
  if (is_floating(from)) {
    // Saturating, NaN to 0: exactly detail::convert.
    return intrinsic(is_signed_int(to) ? llvm::Intrinsic::fptosi_sat : llvm::Intrinsic::fptoui_sat,
                     {x}, {t, x->getType()});
  }
  return is_signed_int(from) || from == bool_
             ? (from == bool_ ? b_.CreateZExt(x, t) : b_.CreateSExtOrTrunc(x, t))
             : b_.CreateZExtOrTrunc(x, t);
}

}  // namespace kiln::compiler
