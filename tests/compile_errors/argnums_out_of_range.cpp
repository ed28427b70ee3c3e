// expect: argnums: every index must name an argument of the function
#include <kiln/kiln.h>
int main() {
  using namespace kiln;
  auto f = [](const Tensor& a, const Tensor& b) { return sum(a * b); };
  (void)jacfwd(f, argnums<2>)(tensor(1.0), tensor(2.0));
}
