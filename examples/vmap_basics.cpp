#include <kiln/kiln.h>

#include <iostream>
struct Params {
  kiln::Tensor w, b;
};
KILN_TREE(Params, w, b);
int main() {
  using namespace kiln;
  auto loss = [](const Params& p, const Tensor& x, const Tensor& y) {
    Tensor z = matmul(x, p.w) + p.b;
    return sum((z - y) * (z - y));
  };
  Params p{ones({3, 2}), zeros({2})};
  Tensor xs = ones({5, 3}), ys = zeros({5, 2});
  auto per_example = jit(vmap(grad(loss), in_axes(none, 0, 0)));
  Params g = per_example(p, xs, ys);
  std::cout << g.w.shape() << "\n";  // [5, 3, 2]
  auto centered =
      vmap([](const Tensor& v) { return v - pmean(v, "batch"); }, in_axes(0), axis_name("batch"));
  std::cout << centered(tensor({1.f, 2.f, 3.f})) << "\n";  // [-1, 0, 1]
}
