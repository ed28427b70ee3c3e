// expect: custom_vjp: fwd must return a std::pair (output of f, residuals)
#include <kiln/kiln.h>
int main() {
  using namespace kiln;
  auto f = custom_vjp([](const Tensor& x) { return x * 2.0; },
                      [](const Tensor& x) { return x * 2.0; },  // no residuals
                      [](const Tensor& r, const Tensor& g) { return std::tuple{g * r}; });
  (void)f(tensor({1.0, 2.0}));
}
