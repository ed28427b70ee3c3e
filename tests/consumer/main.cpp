// Builds against an installed Kiln, with g++ and with clang++ -fopenmp (make install-test):
// every public template a user instantiates is compiled here, so a header that only one
// compiler accepts fails CI.
#include <kiln/kiln.h>

#include <cmath>
#include <iostream>

struct Params {
  kiln::Tensor w, b;
};
KILN_TREE(Params, w, b);

int main() {
  using namespace kiln;
  const Tensor x = tensor({1.f, 2.f, 3.f});
  const float s = sum(x * x).item<float>();
  std::cout << "sum of squares: " << s << "\n";
  bool ok = s == 14.f;

  auto loss = [](const Params& p, const Tensor& v) { return sum(square(p.w * v + p.b)); };
  const Params p{tensor({0.5f, -1.f, 2.f}), tensor({0.25f, 0.f, -0.5f})};
  // d/dw sum((w v + b)^2) = 2 (w v + b) v
  const Params g = jit(grad(loss))(p, x);
  const std::vector<float> gw = g.w.to_vector<float>();
  ok = ok && gw[0] == 2.f * 0.75f * 1.f && gw[1] == 2.f * -2.f * 2.f && gw[2] == 2.f * 5.5f * 3.f;
  auto [value, grads] = value_and_grad(loss, argnums<0, 1>)(p, x);
  (void)grads;
  ok = ok && std::abs(value.item<float>() - (0.5625f + 4.f + 30.25f)) < 1e-5f;

  const Tensor batch = tensor({1.f, 2.f, 3.f, 4.f, 5.f, 6.f}, {2, 3});
  ok = ok && vmap([](const Tensor& r) { return sum(r); })(batch).to_vector<float>() ==
                 std::vector<float>{6.f, 15.f};
  auto cube = [](const Tensor& v) { return sum(v * v * v); };
  ok = ok && hessian(cube)(x).shape() == Shape{3, 3};
  ok = ok && jacrev([](const Tensor& v) { return v * 2.f; })(x).shape() == Shape{3, 3};
  ok = ok && jacfwd([](const Tensor& v) { return v * 2.f; })(x).shape() == Shape{3, 3};
  auto [yv, tangent] = jvp(cube, std::tuple{x}, std::tuple{ones_like(x)});
  ok = ok && tangent.item<float>() == 3.f * (1.f + 4.f + 9.f) && yv.item<float>() == 36.f;

  const auto [total, partial] = scan(
      [](const Tensor& c, const Tensor& v) {
        return std::pair{c + v, c};
      },
      tensor(0.f), x);
  (void)partial;
  ok = ok && total.item<float>() == 6.f;
  const Tensor halved = while_loop([](const Tensor& v) { return v > 1.f; },
                                   [](const Tensor& v) { return v / 2.f; }, tensor(10.f));
  ok = ok && halved.item<float>() == 0.625f;
  ok = ok && cond(
                 index(x, 0) > 0.f, [&] { return x; },
                 [&] {
                   return -x;
                 }).to_vector<float>() == x.to_vector<float>();

  std::cout << (ok ? "consumer: all checks passed\n" : "consumer: a check FAILED\n");
  return ok ? 0 : 1;
}
