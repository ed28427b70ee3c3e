#include <kiln/kiln.h>

#include <iostream>
int main() {
  using namespace kiln;
  // sqrt(a) by Newton iteration; the number of iterations depends on a
  auto newton_sqrt = [](const Tensor& a) {
    auto state = while_loop(
        [&](const std::pair<Tensor, Tensor>& s) { return abs(s.first * s.first - a) > 1e-10; },
        [&](const std::pair<Tensor, Tensor>& s) {
          return std::pair{0.5 * (s.first + a / s.first), s.second + 1};
        },
        std::pair{a, zeros({}, int32)});
    return state.first;
  };
  Tensor a = tensor(2.0);
  std::cout << newton_sqrt(a) << " " << grad(newton_sqrt)(a) << "\n";  // 1.41421 0.353553
  std::cout << jit(grad(newton_sqrt))(a) << "\n";
  std::cout << vmap(newton_sqrt)(tensor({1.0, 4.0, 100.0})) << "\n";  // [1, 2, 10]
  auto [h, ys] = scan(
      [](const Tensor& h, const Tensor& x) {
        Tensor n = tanh(h + x);
        return std::pair{n, n};
      },
      zeros({3}), ones({10, 3}));
  Tensor y = cond(
      sum(h) > 0.0, [&] { return h * 2.0; }, [&] { return h - 1.0; });
}
