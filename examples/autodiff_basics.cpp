// Autodiff in use: grad, hessian, the traced derivative program, value_and_grad over a tree of
// parameters, and a jitted SGD step.
#include <kiln/kiln.h>

#include <iostream>
struct Params {
  kiln::Tensor w, b;
};
KILN_TREE(Params, w, b);
int main() {
  using namespace kiln;
  auto f = [](const Tensor& x) { return sum(sin(x) * x); };
  Tensor x = tensor({0.5, 1.0, 2.0});  // float64
  std::cout << grad(f)(x) << "\n";     // sin(x) + x cos(x)
  std::cout << hessian(f)(x) << "\n";
  std::cout << trace(grad(f), x) << "\n";  // the derivative program
  auto loss = [](const Params& p, const Tensor& x, const Tensor& y) {
    Tensor pred = matmul(x, p.w) + p.b;
    return mean((pred - y) * (pred - y));
  };
  Params p{ones({3, 1}), zeros({1})};
  auto [value, g] = value_and_grad(loss)(p, ones({4, 3}), zeros({4, 1}));
  std::cout << value << " " << g.w.shape() << "\n";
  auto step = jit([&](const Params& p, const Tensor& x, const Tensor& y) {
    Params g = grad(loss)(p, x, y);
    return tree_map([](const Tensor& w, const Tensor& d) { return w - 0.1 * d; }, p, g);
  });
  p = step(p, ones({4, 3}), zeros({4, 1}));
}
