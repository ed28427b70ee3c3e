// Tracing to the IR and jit in use: the printed IR, a jitted function and its per-shape cache.
#include <kiln/kiln.h>

#include <iostream>
struct Params {
  kiln::Tensor w, b;
};
KILN_TREE(Params, w, b);
int main() {
  using namespace kiln;
  auto predict = [](const Params& p, const Tensor& x) { return tanh(matmul(x, p.w) + p.b); };
  Params p{ones({3, 2}), zeros({2})};
  Tensor x = ones({4, 3});
  std::cout << trace(predict, p, x) << "\n";  // readable IR
  auto fast = jit(predict);
  std::cout << fast(p, x) << "\n";
  std::cout << fast(p, ones({8, 3})).shape() << " " << fast.cache_size() << "\n";  // [8, 2] 2
  auto doubled = tree_map([](const Tensor& t) { return t * 2.0; }, p);
}
