// The loops of vector_math.cpp over contiguous arrays, one per instruction set and dtype: each
// calls a vector math function (SLEEF's or Kiln's own) through a pointer, whole registers at a
// time, then the tail through a zero-padded register (zeros are in every function's domain).
//
// Each instruction set's loops are compiled in a file of their own for that set
// (vector_loops_<isa>.cpp, CMake's kiln_fast_math_flags), so that a vector passed to the
// function travels in a vector register, as the functions expect. In a function given the set
// only by __attribute__((target)), clang passes it through memory instead (gcc does not): pow's
// second argument then arrived as garbage. They run only where detected_isa() found the set.
#pragma once

#include <cstdint>

namespace kiln::math {

// A function pointer of any signature; cast back to the variant's own type before a call.
using AnyFn = void (*)();

#define KILN_DECLARE_VECTOR_LOOPS(suffix, T)                    \
  void unary_##suffix(AnyFn f, const T* in, T* out, int64_t n); \
  void binary_##suffix(AnyFn f, const T* a, const T* b, T* out, int64_t n);
KILN_DECLARE_VECTOR_LOOPS(sse4_f32, float)
KILN_DECLARE_VECTOR_LOOPS(sse4_f64, double)
KILN_DECLARE_VECTOR_LOOPS(avx2_f32, float)
KILN_DECLARE_VECTOR_LOOPS(avx2_f64, double)
KILN_DECLARE_VECTOR_LOOPS(avx512_f32, float)
KILN_DECLARE_VECTOR_LOOPS(avx512_f64, double)
#undef KILN_DECLARE_VECTOR_LOOPS

}  // namespace kiln::math
