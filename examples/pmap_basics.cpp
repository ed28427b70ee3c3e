// pmap over processes (docs/DISTRIBUTED.md):
//   mpirun --allow-run-as-root --oversubscribe -np 2 build/examples/pmap_basics
// Each process holds one example; pmean over the axis "dp" averages across processes, also
// inside a gradient. Without mpirun it runs as one process.
#include <kiln/kiln.h>

#include <iostream>
using namespace kiln;
int main() {
  distributed::initialize();
  const int rank = distributed::process_index(), n = distributed::process_count();
  Tensor local = full({3}, double(rank + 1));  // this process's example
  auto centered = pmap([](const Tensor& x) { return x - pmean(x, "dp"); }, axis_name("dp"));
  std::cout << rank << ": " << centered(expand_dims(local, 0)) << "\n";
  auto loss = [](const Tensor& w, const Tensor& x) { return sum(w * x); };
  auto step = pmap([&](const Tensor& w, const Tensor& x) { return pmean(grad(loss)(w, x), "dp"); },
                   in_axes(none, 0), axis_name("dp"));
  // The mean of x over ranks:
  std::cout << rank << ": " << step(ones({3}), expand_dims(local, 0)) << "\n";
  if (rank == 0) std::cout << n << " processes\n";
}
