// expect: fori_loop: body must be callable as body(i, carry) and return the carry's type
#include <kiln/kiln.h>
int main() {
  using namespace kiln;
  (void)fori_loop(
      0, 3, [](const Tensor& c) { return c; }, tensor(1.0));
}
