// Kiln's all_gather, psum_scatter and psum across processes, each pmapped (hence jitted) and
// called back to back: the per-call time a training step pays, through shared memory on one
// host or, with KILN_SHARED_MEMORY_COLLECTIVES=0, through MPI's transport. Run both:
//
//   mpirun --allow-run-as-root --oversubscribe -np 2 build/bench/bench_gather_scatter
//   KILN_SHARED_MEMORY_COLLECTIVES=0 mpirun ... -x KILN_SHARED_MEMORY_COLLECTIVES \
//       build/bench/bench_gather_scatter
//   options: --floats N (per process, default 394880: a block of bench/gpt_parallel.py's GPT)
//
// Per collective: the best of 5 rounds of 100 calls after 20 warm-up calls, process 0's time
// per call (the processes meet at every call, so they agree).
#include <kiln/distributed.h>
#include <kiln/kiln.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

using namespace kiln;

int main(int argc, char** argv) {
  int64_t floats = 394880;
  for (int i = 1; i < argc; i += 2) {
    if (std::string(argv[i]) != "--floats" || i + 1 >= argc) {
      std::fprintf(stderr, "bench_gather_scatter: options: --floats N\n");
      return 2;
    }
    floats = std::atoll(argv[i + 1]);
  }
  distributed::initialize();
  set_num_threads(1);
  const int n = distributed::process_count();
  struct Case {
    const char* name;
    std::function<Tensor(const Tensor&)> f;
    Tensor x;
  };
  const std::vector<Case> cases = {
      {"all_gather", pmap([](const Tensor& x) { return all_gather(x, "p"); }, axis_name("p")),
       ones({1, floats})},
      {"psum_scatter", pmap([](const Tensor& x) { return psum_scatter(x, "p"); }, axis_name("p")),
       ones({1, n, floats})},
      {"psum", pmap([](const Tensor& x) { return psum(x, "p"); }, axis_name("p")),
       ones({1, floats})}};
  const char* shm = std::getenv("KILN_SHARED_MEMORY_COLLECTIVES");
  if (distributed::process_index() == 0)
    std::printf(
        "# %d processes x 1 thread, %lld float32 a process, %s\n", n,
        static_cast<long long>(floats),
        shm && std::string(shm) == "0" ? "MPI's transport" : "shared memory where it applies");
  for (const Case& c : cases) {
    for (int i = 0; i < 20; ++i) c.f(c.x);
    double best = 1e9;
    for (int r = 0; r < 5; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < 100; ++i) c.f(c.x);
      best = std::min(
          best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 100);
    }
    if (distributed::process_index() == 0) std::printf("%-13s %.3f ms\n", c.name, best * 1e3);
  }
}
