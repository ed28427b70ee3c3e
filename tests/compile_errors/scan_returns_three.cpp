// expect: scan: the body must be callable as f(carry, x) and return (carry, y)
#include <kiln/kiln.h>
int main() {
  using namespace kiln;
  auto body = [](const Tensor& c, const Tensor& x) { return std::tuple{c + x, c, x}; };
  (void)scan(body, tensor(0.0), tensor({1.0, 2.0}));
}
