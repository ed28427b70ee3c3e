// Helpers of the layer tests (test_attention.cpp, test_recurrent.cpp, test_nn_sequence.cpp,
// test_nn_conv.cpp):
// PyTorch reference values (tests/reference/attention_ref.py, recurrent_ref.py), closeness, and
// float64 central finite differences over the leaves of a tree.
#pragma once

#include <gtest/gtest.h>
#include <kiln/kiln.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "testing.h"

namespace kiln::nn_checks {

#ifdef KILN_REFERENCE_DIR
// A tensor of a reference file, cast to `dtype` when it is floating point.
inline Tensor ref_in(const io::TensorFile& file, const std::string& name, DType dtype) {
  const Tensor t = testing::at(file, name);
  return is_floating(t.dtype()) ? astype(t, dtype) : t;
}
#endif

inline void expect_close(const Tensor& got, const Tensor& want, double tol,
                         const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  const std::vector<double> g = astype(got, float64).to_vector<double>();
  const std::vector<double> w = astype(want, float64).to_vector<double>();
  for (std::size_t i = 0; i < g.size(); ++i)
    EXPECT_NEAR(g[i], w[i], tol * (1 + std::abs(w[i]))) << what << " element " << i;
}

// The tolerance of values computed in `dtype` against float64 references.
inline double tol_of(DType dtype) { return dtype == float64 ? 1e-10 : 2e-5; }

// Central finite differences of a scalar loss with respect to every element of every tensor
// leaf of a float64 tree; the result has the tree's type.
template <class M>
M finite_differences(const std::function<double(const M&)>& loss, const M& at, double h = 1e-6) {
  auto [leaves, def] = tree_flatten(at);
  std::vector<Tensor> out(leaves.size());
  for (std::size_t k = 0; k < leaves.size(); ++k) {
    if (!leaves[k].defined()) continue;
    const std::vector<double> v = leaves[k].template to_vector<double>();
    std::vector<double> g(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) {
      std::vector<Tensor> moved = leaves;
      const auto loss_at = [&](double d) {
        std::vector<double> p = v;
        p[i] += d;
        moved[k] = tensor(p, leaves[k].shape());
        return loss(tree_unflatten<M>(def, moved));
      };
      g[i] = (loss_at(h) - loss_at(-h)) / (2 * h);
    }
    out[k] = tensor(g, leaves[k].shape());
  }
  return tree_unflatten<M>(def, out);
}

// Leaf by leaf closeness of two trees of one structure.
template <class M>
void expect_tree_close(const M& got, const M& want, double tol) {
  auto [gl, gd] = tree_flatten(got);
  auto [wl, wd] = tree_flatten(want);
  ASSERT_TRUE(gd == wd) << gd << " vs " << wd;
  const std::vector<std::string> names = tree_names(gd);
  for (std::size_t i = 0; i < gl.size(); ++i) {
    ASSERT_EQ(gl[i].defined(), wl[i].defined()) << names[i];
    if (gl[i].defined()) expect_close(gl[i], wl[i], tol, names[i]);
  }
}

}  // namespace kiln::nn_checks
