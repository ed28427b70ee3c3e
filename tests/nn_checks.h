// Helpers of the attention and sequence layer tests (test_attention.cpp, test_recurrent.cpp,
// test_nn_sequence.cpp): PyTorch reference values (tests/reference/attention_ref.py,
// recurrent_ref.py) and their tolerances. Closeness checks and finite differences over trees are
// tree_testing.h's.
#pragma once

#include <gtest/gtest.h>
#include <kiln/kiln.h>

#include <string>

#include "testing.h"

namespace kiln::nn_checks {

#ifdef KILN_REFERENCE_DIR
// A tensor of a reference file, cast to `dtype` when it is floating point.
inline Tensor ref_in(const io::TensorFile& file, const std::string& name, DType dtype) {
  const Tensor t = testing::at(file, name);
  return is_floating(t.dtype()) ? astype(t, dtype) : t;
}
#endif

// The tolerance of values computed in `dtype` against float64 references.
inline double tol_of(DType dtype) { return dtype == float64 ? 1e-10 : 2e-5; }

}  // namespace kiln::nn_checks
