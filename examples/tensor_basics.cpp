// Eager tensors in use: creation, weak scalars, broadcasting, reductions, matmul, random keys
// and an error message.
#include <kiln/kiln.h>

#include <iostream>

int main() {
  using namespace kiln;
  Tensor a = tensor({1.f, 2.f, 3.f, 4.f, 5.f, 6.f}, {2, 3});
  Tensor b = ones({3}) * 2.0;            // float32, weak scalar
  std::cout << sum(a * b, {1}) << "\n";  // [12, 30]
  std::cout << matmul(a, transpose(a)) << "\n";
  Tensor k = random::key(0);
  auto [k1, k2] = random::split(k);  // two keys; split(k, n) gives n
  std::cout << random::normal(k1, {2, 2}).shape() << "\n";
  try {
    matmul(a, a);
  } catch (const Error& e) {
    std::cout << e.what() << "\n";
  }
}
