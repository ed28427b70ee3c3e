// expect: vjp: the function must be callable with these arguments and return a tree of tensors
#include <kiln/kiln.h>
struct NotATree {
  kiln::Tensor t;
};
int main() {
  using namespace kiln;
  (void)vjp([](const Tensor& x) { return NotATree{x}; }, tensor({1.0}));
}
