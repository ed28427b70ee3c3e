// The machine's float32 FMA peak and streaming copy bandwidth on one core and on all of Kiln's
// threads (kiln::machine_peak, the figures profiles set steps against). A floor for
// matmul-bound and memory-bound steps: docs/PERFORMANCE.md compares steps against them.
//   build/bench/fma_peak
#include <kiln/profile.h>
#include <kiln/runtime.h>

#include <cstdio>
#include <set>

int main() {
  for (int threads : std::set<int>{1, kiln::num_threads()}) {
    const kiln::MachinePeak p = kiln::machine_peak(threads);
    std::printf("%d core%s, %s: float32 FMA peak %.1f GFLOP/s, copy %.1f GB/s\n", threads,
                threads == 1 ? "" : "s", p.isa.c_str(), p.fma_gflops, p.copy_gbps);
  }
}
