// Scaled dot-product attention against PyTorch 1.13 (bench/bench_attention_torch.py:
// the math path softmax(q k^T * scale + mask) v written out, 1.13 having no
// F.scaled_dot_product_attention), side by side in one run, float32, batch 8, heads 8,
// length 512, head dim 64:
//   fwd          nn::scaled_dot_product_attention(q, k, v)
//   fwd_bwd      the gradients of sum(sdpa(q, k, v) * cot) with respect to q, k and v
//   causal_bwd   the same with is_causal
// Kiln under jit (and eagerly, for reference); the table gives median and min per call and
// median / torch's.
//
//   build/bench/bench_attention --threads 1
//   options: --threads T (Kiln's and torch's thread count, default 1), --reps R (default 5),
//            --rounds N (default 3), --target S (seconds per timed batch, default 0.3),
//            --py PATH (default /usr/bin/python3; "none" skips PyTorch)
#include <kiln/kiln.h>

#include <cstdio>
#include <string>
#include <tuple>

#include "side_by_side.h"

using namespace kiln;
using namespace side_by_side;

int main(int argc, char** argv) {
  Options o;
  o.threads = 1, o.target = 0.3;
  if (!parse_options(argc, argv, o)) return 2;
  set_num_threads(o.threads);
  using QKV = std::tuple<Tensor, Tensor, Tensor>;
  const Shape shape{8, 8, 512, 64};
  const QKV qkv{random::normal(random::key(1), shape), random::normal(random::key(2), shape),
                random::normal(random::key(3), shape)};
  const Tensor cot = random::normal(random::key(4), shape);
  const auto forward = [](const QKV& in) {
    const auto& [q, k, v] = in;
    return nn::scaled_dot_product_attention(q, k, v);
  };
  const auto gradients = [&cot](bool causal) {
    return grad([&cot, causal](const QKV& in) {
      const auto& [q, k, v] = in;
      return sum(nn::scaled_dot_product_attention(q, k, v, {.is_causal = causal}) * cot);
    });
  };
  auto jforward = jit(forward);
  auto jgrad = jit(gradients(false));
  auto jcausal = jit(gradients(true));
  auto egrad = gradients(false);

  // Correctness: jit and eager agree.
  const double diff = max(abs(std::get<0>(jgrad(qkv)) - std::get<0>(egrad(qkv)))).item<float>();
  std::printf("# check: max |jit - eager| of grad q = %.3g\n", diff);
  if (!(diff < 1e-3)) return 1;

  std::vector<Case> cases{
      {"kiln_jit_fwd", [&] { (void)jforward(qkv); }},
      {"kiln_jit_fwd_bwd", [&] { (void)jgrad(qkv); }},
      {"kiln_jit_causal_bwd", [&] { (void)jcausal(qkv); }},
      {"kiln_eager_fwd", [&] { (void)forward(qkv); }},
      {"kiln_eager_fwd_bwd", [&] { (void)egrad(qkv); }},
  };
  calibrate(cases, o.target, 2);
  const Rounds r = run_rounds(
      cases, o, [&](Times& t) { return run_peer(o, "bench_attention_torch.py", "", t); });
  std::printf("# attention, f32, B 8, H 8, L = S 512, E 64; Kiln and torch threads %d\n",
              o.threads);
  print_loads(r, o);
  print_against_peer(r, o, {"fwd", "fwd_bwd", "causal_bwd"}, {"kiln_jit_", "kiln_eager_", "torch_"},
                     22);
  return 0;
}
