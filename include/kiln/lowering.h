// Compiled lowerings: how the compiler's fused loops compute a primitive, declared with the
// primitive (Primitive::lowering) as its type rule and kernels are (docs/DESIGN.md, "Compiler").
//
// An elementwise lowering is a function that builds one element's value from its operands'
// through an abstract Builder; the LLVM backend implements the Builder with its vector emitter,
// so a lowering holds no backend type. Reductions and index maps (broadcast, reshape, transpose,
// slice) are loops of their own kinds, which a lowering names as data.
#pragma once

#include <functional>
#include <optional>
#include <span>

#include "kiln/dtype.h"

namespace kiln {

class Attrs;

namespace lowering {

// A value the builder made: one element in its dtype's compute type, a scalar or a vector of
// lanes (the backend decides; a lowering never sees which). Opaque to lowerings.
class Value {
 public:
  Value() = default;
  explicit Value(void* handle) : handle_(handle) {}
  void* handle() const { return handle_; }

 private:
  void* handle_ = nullptr;
};

// The vector math library's functions (kiln's eager kernels call the same ones, so compiled
// and eager results agree: docs/DESIGN.md, "Compiler"). pow takes two operands.
enum class MathFunction { exp, log, log1p, expm1, sin, cos, tan, tanh, erf, pow };
// Float comparisons are ordered (false on NaN) except ne, as C++'s operators.
enum class Comparison { eq, ne, lt, le, gt, ge };
enum class Rounding { floor, ceil, nearest_even, toward_zero };

// Builds one element's expression. Values are in their dtype's compute type: bool a truth value,
// the integer dtypes integers of their width, float16 and bfloat16 float32 (the compiler rounds
// each lowering's result to its dtype, as the kernels store it, unless it is an operand of that
// dtype returned as it is), float32 and float64 themselves.
// Operations whose instruction depends on the dtype (float or integer, signed or not) take it.
class Builder {
 public:
  virtual ~Builder() = default;
  // v in dtype d: integer dtypes take its integer value, bool v != 0.
  virtual Value constant(DType d, double v) = 0;
  virtual Value add(DType d, Value x, Value y) = 0;  // integers wrap
  virtual Value sub(DType d, Value x, Value y) = 0;
  virtual Value mul(DType d, Value x, Value y) = 0;
  virtual Value div(Value x, Value y) = 0;  // floats only (integer division raises in kernels)
  virtual Value neg(DType d, Value x) = 0;
  virtual Value abs(Value x) = 0;  // floats: the sign bit cleared
  virtual Value sqrt(Value x) = 0;
  virtual Value round(Rounding mode, Value x) = 0;
  virtual Value copysign(Value magnitude, Value sign) = 0;
  // As the kernels: a NaN operand gives NaN (x + y), a tie gives y.
  virtual Value max(DType d, Value x, Value y) = 0;
  virtual Value min(DType d, Value x, Value y) = 0;
  virtual Value compare(Comparison c, DType d, Value x, Value y) = 0;
  virtual Value unsigned_less(Value x, Value y) = 0;  // integers' bits compared as unsigned
  virtual Value is_nan(Value x) = 0;
  virtual Value select(Value condition, Value if_true, Value if_false) = 0;
  // Bitwise on integers, logical on bools.
  virtual Value bit_and(Value x, Value y) = 0;
  virtual Value bit_or(Value x, Value y) = 0;
  virtual Value bit_xor(Value x, Value y) = 0;
  virtual Value bit_not(Value x) = 0;
  // Counts outside [0, bits of the dtype) give an unspecified result.
  virtual Value shift_left(Value x, Value count) = 0;
  virtual Value shift_right(DType d, Value x, Value count) = 0;  // arithmetic for signed d
  // As the convert kernel: float to integer saturates, NaN gives 0.
  virtual Value convert(DType from, DType to, Value x) = 0;
  // f of d's float type on each element, with the eager kernels' bits.
  virtual Value call(MathFunction f, DType d, std::span<const Value> args) = 0;
};

// What an elementwise lowering sees of one equation besides its operands.
struct Site {
  DType in;   // the last operand's dtype (select: the chosen values')
  DType out;  // the result's
  const Attrs& attrs;
};
using Elementwise = std::function<Value(Builder&, std::span<const Value> operands, const Site&)>;

// A reduction over the equation's "axes" attribute.
enum class Reduction { sum, prod, max, min, all, any };
// An index map: the output is the input read at an affine map of its indices (a view).
enum class IndexMap { broadcast, reshape, transpose, slice };

// How the compiler fuses a primitive: exactly one of the three kinds. A primitive without a
// lowering runs its kernel (an opaque step), as do complex operands and outputs.
struct Lowering {
  Elementwise elementwise;
  std::optional<Reduction> reduction;
  std::optional<IndexMap> index_map;
  // The operand dtypes it lowers (Site::in); others run the kernel (integer div and pow, whose
  // kernels check their operands and raise).
  DTypeSet dtypes = DTypeSet::real();
  // It calls a math function: worth keeping in memory rather than computing again in a later
  // pass over the same row (softmax's exp).
  bool transcendental = false;
};

}  // namespace lowering
}  // namespace kiln
