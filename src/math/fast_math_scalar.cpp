// fast_math.h's scalar variants without FMA (the sse4 variant's twin and the scalar ISA's
// function): a * b + c rounds twice (CMake compiles the fast_math files with -ffp-contract=off).
#include "math/fast_math.h"
#include "math/fast_math_impl.h"

using Plain = kiln::math::fast::Scalar<false>;
float kiln_expf1(float x) { return kiln::math::fast::exp(Plain{}, x); }
float kiln_tanhf1(float x) { return kiln::math::fast::tanh(Plain{}, x); }
