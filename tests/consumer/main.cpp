#include <kiln/kiln.h>

#include <iostream>

int main() {
  using namespace kiln;
  const Tensor x = tensor({1.f, 2.f, 3.f});
  const float s = sum(x * x).item<float>();
  std::cout << "sum of squares: " << s << "\n";
  return s == 14.f ? 0 : 1;
}
