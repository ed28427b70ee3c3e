// Sort and cumsum of 10^7 float32 against PyTorch 1.13 (bench/sort_torch.py), side by
// side in one run.
//
//   build/bench/bench_sort --threads 1      # Kiln, then the PyTorch peer, alternating; table
//   options: --threads T (Kiln's and torch's thread count, default 1), --reps R (default 5),
//            --rounds N (default 3), --target S (seconds per timed batch, default 0.5),
//            --py PATH ("none" skips PyTorch)
//
//   kiln_sort / torch_sort      stable sort with the permutation: sort_with_indices(x) and
//                               torch.sort(x) (values f32 and indices i64 both)
//   kiln_cumsum / torch_cumsum  cumsum(x, 0) (float32 out, accumulated in double by both)
// Timing (bench/side_by_side.h): warm-up, then repetitions of a batch of calls of ~target s.
#include <kiln/kiln.h>

#include <cstdio>
#include <string>
#include <vector>

#include "side_by_side.h"

using namespace kiln;
using namespace side_by_side;

int main(int argc, char** argv) {
  Options o;
  o.threads = 1, o.target = 0.5;
  if (!parse_options(argc, argv, o)) return 2;
  set_num_threads(o.threads);
  constexpr int64_t kN = 10'000'000;
  const Tensor x = random::normal(random::key(0), {kN});

  // Correctness: ascending, and the permutation gives the values.
  const SortResult s = sort_with_indices(x);
  const bool sorted =
      all(slice(s.values, {Slice{1, kN}}) >= slice(s.values, {Slice{0, kN - 1}})).item<bool>() &&
      all(take(x, s.indices) == s.values).item<bool>();
  const double last = cumsum(x).to_vector<float>().back(), total = sum(x).item<float>();
  std::printf("# check: sorted %s, cumsum[-1] - sum = %.3g\n", sorted ? "yes" : "NO", last - total);
  if (!sorted) return 1;

  std::vector<Case> cases{{"kiln_sort", [&] { (void)sort_with_indices(x); }},
                          {"kiln_cumsum", [&] { (void)cumsum(x, 0); }}};
  calibrate(cases, o.target, 2);
  const Rounds r =
      run_rounds(cases, o, [&](Times& t) { return run_peer(o, "sort_torch.py", "", t); });
  std::printf("# sort and cumsum of 10^7 float32; Kiln and torch threads %d\n", o.threads);
  print_loads(r, o);
  print_against_peer(r, o, {"sort", "cumsum"}, {"kiln_", "torch_"}, 14);
  return 0;
}
