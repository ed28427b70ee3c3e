// Operations in use: linear algebra under jit(grad), einsum, cumsum,
// top_k and a categorical draw.
#include <kiln/kiln.h>

#include <iostream>
using namespace kiln;
int main() {
  Tensor A = tensor({4.0, 2.0, 2.0, 3.0}, {2, 2}), b = tensor({1.0, 2.0});
  auto newton_dir = jit(grad([](const Tensor& A, const Tensor& b) {
    Tensor L = linalg::cholesky(A);
    Tensor x = linalg::triangular_solve(L, b, {.lower = true});
    return sum(x * x) + linalg::slogdet(A).second;
  }));
  std::cout << newton_dir(A, b) << "\n";
  Tensor q = ones({2, 4, 8, 16}), k = ones({2, 4, 8, 16});
  std::cout << einsum("bhqd,bhkd->bhqk", q, k).shape() << "\n";  // [2, 4, 8, 8]
  std::cout << cumsum(arange(5), 0) << " " << top_k(tensor({3.f, 1.f, 4.f, 1.f, 5.f}), 2).values
            << "\n";
  std::cout << random::categorical(random::key(0), log_softmax(zeros({3, 5}))) << "\n";
}
