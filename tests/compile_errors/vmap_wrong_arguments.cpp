// expect: vmap: the function must be callable with these arguments and return a tree of tensors
#include <kiln/kiln.h>
int main() {
  using namespace kiln;
  (void)vmap([](const Tensor& x, const Tensor& y) { return x + y; })(ones({2, 3}));
}
