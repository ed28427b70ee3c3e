// Pooling windows other than the 2x2 tiling (which has its own vector kernels) in float32
// against PyTorch 1.13 (bench/pool_torch.py), side by side in one run, eager.
//
//   build/bench/bench_pool --threads 1
//   options: --threads T (Kiln's and torch's thread count, default 1), --reps R (default 5),
//            --rounds N (default 3), --target S (seconds per timed batch, default 0.3),
//            --py PATH ("none" skips PyTorch)
//
//   max_3x3s2        max_pool2d of x [32, 64, 56, 56], kernel 3, stride 2, padding 1 (ResNet's)
//   max_3x3s2_grad   the gradient of sum(max_pool2d(x) * r) for x (forward included)
//   max_3x3s1        max_pool2d, kernel 3, stride 1, padding 1
//   max_3x3s1_grad   its gradient, as above
//   avg_3x3s1        avg_pool2d, kernel 3, stride 1, padding 1 (padding counted, as PyTorch's
//                    default count_include_pad)
// Timing (bench/side_by_side.h): warm-up, then repetitions of a batch of calls of ~target s.
#include <kiln/kiln.h>

#include <cstdio>
#include <vector>

#include "side_by_side.h"

using namespace kiln;
using namespace side_by_side;

int main(int argc, char** argv) {
  Options o;
  o.threads = 1, o.target = 0.3;
  if (!parse_options(argc, argv, o)) return 2;
  set_num_threads(o.threads);
  const Tensor x = random::normal(random::key(0), {32, 64, 56, 56});
  const Pool2dOptions s2{.kernel = {3, 3}, .stride = {{2, 2}}, .padding = {1, 1}},
      s1{.kernel = {3, 3}, .stride = {{1, 1}}, .padding = {1, 1}};
  const Tensor r2 = random::normal(random::key(1), max_pool2d(x, s2).shape()),
               r1 = random::normal(random::key(2), max_pool2d(x, s1).shape());
  const auto grad_s2 = grad([&](const Tensor& a) { return sum(max_pool2d(a, s2) * r2); });
  const auto grad_s1 = grad([&](const Tensor& a) { return sum(max_pool2d(a, s1) * r1); });
  std::vector<Case> cases{{"kiln_max_3x3s2", [&] { (void)max_pool2d(x, s2); }},
                          {"kiln_max_3x3s2_grad", [&] { (void)grad_s2(x); }},
                          {"kiln_max_3x3s1", [&] { (void)max_pool2d(x, s1); }},
                          {"kiln_max_3x3s1_grad", [&] { (void)grad_s1(x); }},
                          {"kiln_avg_3x3s1", [&] { (void)avg_pool2d(x, s1); }}};
  calibrate(cases, o.target, 2);
  const Rounds r =
      run_rounds(cases, o, [&](Times& t) { return run_peer(o, "pool_torch.py", "", t); });
  std::printf("# float32 pooling of x [32, 64, 56, 56]; Kiln and torch threads %d\n", o.threads);
  print_loads(r, o);
  print_against_peer(r, o,
                     {"max_3x3s2", "max_3x3s2_grad", "max_3x3s1", "max_3x3s1_grad", "avg_3x3s1"},
                     {"kiln_", "torch_"}, 24);
  return 0;
}
