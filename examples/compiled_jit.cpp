// jit compiles: the elementwise chain becomes one fused loop,
// and the gradient program of a softmax loss is compiled and fused too.
#include <kiln/kiln.h>

#include <iostream>
using namespace kiln;
int main() {
  kiln::set_num_threads(2);
  auto f = jit([](const Tensor& x, const Tensor& y, const Tensor& z) {
    return tanh(x) * sigmoid(y) + exp(z);  // one fused loop
  });
  Tensor x = ones({1 << 20}), y = ones({1 << 20}), z = zeros({1 << 20});
  std::cout << f(x, y, z).shape() << "\n";
  std::cout << f.lower(x, y, z) << "\n";  // optimised IR, as today
  auto loss = [](const Tensor& w, const Tensor& x) { return mean(log_softmax(matmul(x, w), -1)); };
  auto step = jit(value_and_grad(loss));  // grad program compiled, fused
  auto [l, g] = step(ones({784, 10}) * 0.01, ones({128, 784}));
  std::cout << l << " " << g.shape() << "\n";
}
