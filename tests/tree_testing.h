// Helpers of the tests over trees of tensors (test_nn.cpp, test_attention.cpp,
// test_recurrent.cpp, test_nn_sequence.cpp): float64 central finite differences over a tree's
// leaves, and leaf by leaf closeness of two trees.
#pragma once

#include <gtest/gtest.h>
#include <kiln/kiln.h>

#include <functional>
#include <source_location>
#include <string>
#include <vector>

#include "testing.h"

namespace kiln::testing {

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

// Same structure (static values included), and each leaf within tol (expect_allclose).
template <class M>
void expect_tree_allclose(const M& got, const M& want, Closeness tol,
                          std::source_location at = std::source_location::current()) {
  auto [gl, gd] = tree_flatten(got);
  auto [wl, wd] = tree_flatten(want);
  ASSERT_TRUE(gd == wd) << gd << " vs " << wd;
  ASSERT_EQ(gl.size(), wl.size());
  const std::vector<std::string> names = tree_names(gd);
  for (std::size_t i = 0; i < gl.size(); ++i) {
    ASSERT_EQ(gl[i].defined(), wl[i].defined()) << names[i];
    if (gl[i].defined()) expect_allclose(gl[i], wl[i], tol, names[i], at);
  }
}

// The reverse-mode gradient of `loss` (a 0-d tensor of a float64 tree) at `at`, against
// finite_differences of it, leaf by leaf.
template <class M, class F>
void expect_grad_matches_fd(const F& loss, const M& at, Closeness tol,
                            std::source_location where = std::source_location::current()) {
  const M fd =
      finite_differences<M>([&](const M& m) { return loss(m).template item<double>(); }, at);
  expect_tree_allclose(grad(loss)(at), fd, tol, where);
}

}  // namespace kiln::testing
