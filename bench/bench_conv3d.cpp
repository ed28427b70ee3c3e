// conv1d, conv3d (forward, and its gradient) and conv_transpose2d in float32 against
// PyTorch 1.13 (bench/conv3d_torch.py), side by side in one run. Both run through oneDNN.
//
//   build/bench/bench_conv3d --threads 1
//   options: --threads T (Kiln's and torch's thread count, default 1), --reps R (default 5),
//            --rounds N (default 3), --target S (seconds per timed batch, default 0.5),
//            --py PATH ("none" skips PyTorch)
//
//   conv1d           x [32, 64, 512] * w [64, 64, 5], padding 2
//   conv3d           x [2, 16, 16, 32, 32] * w [32, 16, 3, 3, 3], padding 1
//   conv3d_grad      the gradients of sum(conv3d(x, w) * r) for x and w (forward included)
//   conv_transpose2d x [16, 64, 16, 16] * w [64, 32, 4, 4], stride 2, padding 1 -> 32x32
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
  const auto k = [](uint64_t i) { return random::key(i); };
  const Tensor x1 = random::normal(k(0), {32, 64, 512}), w1 = random::normal(k(1), {64, 64, 5});
  const Tensor x3 = random::normal(k(2), {2, 16, 16, 32, 32}),
               w3 = random::normal(k(3), {32, 16, 3, 3, 3});
  const Tensor r3 = random::normal(k(4), {2, 32, 16, 32, 32});
  const Tensor xt = random::normal(k(5), {16, 64, 16, 16}),
               wt = random::normal(k(6), {64, 32, 4, 4});
  const ConvTranspose2dOptions up{.stride = {2, 2}, .padding = {1, 1}};
  const auto conv3d_grad = grad(
      [&](const Tensor& x, const Tensor& w) {
        return sum(conv3d(x, w, {.padding = {1, 1, 1}}) * r3);
      },
      argnums<0, 1>);
  std::printf("# shapes: conv1d %s, conv3d %s, conv_transpose2d %s\n",
              conv1d(x1, w1, {.padding = 2}).shape().to_string().c_str(),
              conv3d(x3, w3, {.padding = {1, 1, 1}}).shape().to_string().c_str(),
              conv_transpose2d(xt, wt, up).shape().to_string().c_str());

  std::vector<Case> cases{{"kiln_conv1d", [&] { (void)conv1d(x1, w1, {.padding = 2}); }},
                          {"kiln_conv3d",
                           [&] {
                             (void)conv3d(x3, w3, {.padding = {1, 1, 1}});
                           }},
                          {"kiln_conv3d_grad", [&] { (void)conv3d_grad(x3, w3); }},
                          {"kiln_conv_transpose2d", [&] { (void)conv_transpose2d(xt, wt, up); }}};
  calibrate(cases, o.target, 2);
  const Rounds r =
      run_rounds(cases, o, [&](Times& t) { return run_peer(o, "conv3d_torch.py", "", t); });
  std::printf("# float32 convolutions; Kiln and torch threads %d\n", o.threads);
  print_loads(r, o);
  print_against_peer(r, o, {"conv1d", "conv3d", "conv3d_grad", "conv_transpose2d"},
                     {"kiln_", "torch_"}, 24);
  return 0;
}
