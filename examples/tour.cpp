// A short tour of Kiln. Eager tensors compute when
// a line runs; a mistake raises a kiln::Error naming the operation, the shapes and what was
// expected. Then the transformations: trace, grad, jit, vmap.
#include <kiln/kiln.h>

#include <iostream>

int main() {
  using namespace kiln;
  std::cout << "Kiln eager tensors\n\n";

  const Tensor x = reshape(arange(0.0, 6.0, 1.0), {2, 3});
  std::cout << "x =\n" << x << "\n\n";
  std::cout << "x * 2.0 + 1 (weak scalars keep f32): " << (x * 2.0 + 1).dtype() << "\n"
            << x * 2.0 + 1 << "\n\n";
  std::cout << "sum over axis 1: " << sum(x, {1}) << "   mean: " << mean(x) << "\n";
  std::cout << "softmax of each row:\n" << softmax(x) << "\n\n";

  const Tensor xt = transpose(x);  // a view: no copy
  std::cout << "transpose shares storage: " << std::boolalpha << xt.shares_storage_with(x) << "\n";
  std::cout << "x @ x^T =\n" << matmul(x, xt) << "\n\n";

  auto [k1, k2] = random::split(random::key(42));
  const Tensor w = random::normal(k1, {3, 4});
  std::cout << "normal(key, [3, 4]) =\n" << w << "\n\n";

  const Tensor img = random::uniform(k2, {1, 1, 6, 6});
  const Tensor kernel = ones({1, 1, 3, 3}) / 9.0;
  std::cout << "3x3 box blur of a 6x6 image -> " << conv2d(img, kernel, {.padding = {1, 1}}).shape()
            << ", then max_pool2d -> " << max_pool2d(img).shape() << "\n\n";

  std::cout << "A mistake raises a kiln::Error:\n";
  try {
    matmul(x, x);
  } catch (const Error& e) {
    std::cout << "  " << e.what() << "\n";
  }
  try {
    reshape(x, {4, 2});
  } catch (const Error& e) {
    std::cout << "  " << e.what() << "\n";
  }

  std::cout << "\nTransformations\n\n";
  auto f = [](const Tensor& v) { return sum(sin(v) * v); };
  const Tensor v = tensor({0.5, 1.0, 2.0});
  std::cout << "f(v) = sum(sin(v) * v); grad(f)(v) = " << grad(f)(v)
            << "  (sin(v) + v cos(v) = " << sin(v) + v * cos(v) << ")\n";
  std::cout << "the derivative program, optimised:\n" << jit(grad(f)).lower(v) << "\n";
  std::cout << "hessian(f)(v) =\n" << hessian(f)(v) << "\n";
  auto norms = vmap([](const Tensor& row) { return sqrt(sum(row * row)); });
  std::cout << "vmap(norm) over the rows of x: " << norms(x) << "\n";
  return 0;
}
