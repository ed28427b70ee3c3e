// expect: while_loop: body_fn must be callable as body_fn(carry) and return the carry's type
#include <kiln/kiln.h>
int main() {
  using namespace kiln;
  (void)while_loop([](const Tensor& v) { return v > 1.0; }, [](const Tensor&) { return 0.5; },
                   tensor(4.0));
}
