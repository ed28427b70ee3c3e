// A user-defined primitive at work: `huber` (defined in custom_primitive.h with its kernels and
// all its rules) runs eagerly, under grad to second order, jvp, jit and vmap, and its errors
// read like the built-ins'. Every printed result is checked against values computed by hand;
// the program exits non-zero on a mismatch (CI runs it).
#include "custom_primitive.h"

#include <cmath>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

namespace {

int failures = 0;

// Prints `got` and checks it element by element against `want`.
void check(const std::string& what, const kiln::Tensor& got, const std::vector<double>& want,
           double tol = 1e-12) {
  const std::vector<double> g = got.to_vector<double>();
  bool ok = g.size() == want.size();
  for (std::size_t i = 0; ok && i < g.size(); ++i) ok = std::abs(g[i] - want[i]) <= tol;
  std::cout << what << ": " << got << "\n";
  if (!ok) {
    ++failures;
    std::cout << "  MISMATCH, expected [";
    for (std::size_t i = 0; i < want.size(); ++i) std::cout << (i ? ", " : "") << want[i];
    std::cout << "]\n";
  }
}

// Runs fn and checks that it raises a kiln::Error from the `huber` primitive.
template <class F>
void check_error(const std::string& what, F&& fn) {
  try {
    fn();
  } catch (const kiln::Error& e) {
    std::cout << what << ": " << e.what() << "\n";
    if (e.op() != "huber") ++failures, std::cout << "  MISMATCH, expected an error from huber\n";
    return;
  }
  ++failures;
  std::cout << what << ": MISMATCH, no error\n";
}

}  // namespace

int main() {
  using namespace kiln;
  using example::huber;

  // Eager: x^2/2 inside [-1, 1], |x| - 1/2 outside.
  const Tensor x = tensor({-3.0, -0.5, 0.0, 0.5, 2.0});
  check("huber(x)", huber(x), {2.5, 0.125, 0.0, 0.125, 1.5});
  check("huber(x, delta=2)", huber(x, 2.0), {4.0, 0.125, 0.0, 0.125, 2.0});
  const Tensor y32 = huber(tensor({-2.0f, 0.5f}));
  check("huber(float32)", y32, {1.5, 0.125});
  if (y32.dtype() != float32) ++failures, std::cout << "  MISMATCH, expected float32\n";

  // Derivatives come from the primitive's JVP and VJP rules: clip(x, -1, 1), and to second
  // order 1 inside [-1, 1] and 0 outside (the rules are made of ops with rules of their own).
  auto loss = [](const Tensor& v) { return sum(huber(v)); };
  check("grad", grad(loss)(x), {-1.0, -0.5, 0.0, 0.5, 1.0});
  check("hessian", hessian(loss)(x),
        {0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0});
  const auto [y, ty] = jvp(loss, std::tuple<Tensor>{x}, std::tuple<Tensor>{ones({5}, float64)});
  check("jvp along ones", ty, {-1.0 - 0.5 + 0.0 + 0.5 + 1.0});

  // jit: the primitive is one equation of the compiled program, its derivative rule others.
  auto step = jit([](const Tensor& v) {
    auto [value, g] = value_and_grad([](const Tensor& w) { return sum(huber(w)); })(v);
    return std::make_pair(value, v - 0.5 * g);
  });
  const auto [value, next] = step(x);
  check("jit: loss", value, {2.5 + 0.125 + 0.0 + 0.125 + 1.5});
  check("jit: x - 0.5 grad", next, {-2.5, -0.25, 0.0, 0.25, 1.5});
  const std::string program = ir::print(step.lower(x));
  std::cout << program << "\n";
  if (program.find("= huber %arg0 {delta=1.0}") == std::string::npos)
    ++failures, std::cout << "  MISMATCH, expected a huber equation\n";

  // vmap: the batching rule maps the primitive over the rows (or the columns) of a batch at
  // once; per-example gradients are clip of each row.
  const Tensor rows = tensor({-3.0, 0.5, 0.25, 4.0}, {2, 2});
  check("vmap(grad) over rows", vmap(grad(loss))(rows), {-1.0, 0.5, 0.25, 1.0});
  check("vmap over columns",
        vmap([](const Tensor& c) { return huber(c); }, in_axes(1), out_axes(1))(rows),
        {2.5, 0.125, 0.03125, 3.5});
  check("jit(vmap(grad))", jit(vmap(grad(loss)))(rows), {-1.0, 0.5, 0.25, 1.0});

  // Bad input gets the primitive's own error, naming this file's line.
  check_error("integer input", [] { huber(tensor({1, 2})); });
  check_error("negative delta", [&] { huber(x, -1.0); });

  std::printf("%s\n",
              failures ? "custom_primitive: FAILED" : "custom_primitive: all checks passed");
  return failures ? 1 : 0;
}
