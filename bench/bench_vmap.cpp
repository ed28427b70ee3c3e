// Per-example gradients with vmap, against a per-example loop and PyTorch 1.13 (functorch).
//
//   build/bench/bench_vmap                 # Kiln and the PyTorch peers, alternating, + table
//   build/bench/bench_vmap --ir            # the optimised IR of jit(vmap(grad(loss)))
//   build/bench/bench_vmap --py none       # Kiln only
//   options: --reps R (per round, default 5), --rounds N (Kiln/PyTorch alternations, default 3),
//            --target S (seconds per timed batch of calls, default 0.2), --threads T (PyTorch's
//            torch.set_num_threads, default 2), --py PATH (default /usr/bin/python3)
//
// Problem: cross-entropy -sum(one_hot(y, 10) * log_softmax(logits)) of an MLP 784-128-10
// (relu), batch 64, float32; the gradient of each example's loss with respect to every
// parameter (shapes [64, 784, 128], [64, 128], [64, 128, 10], [64, 10]).
//   kiln_jit_vmap_grad    jit(vmap(grad(loss), in_axes(none, 0, 0))), KILN_JIT_BACKEND=llvm
//   kiln_interp_vmap_grad the same, KILN_JIT_BACKEND=interpreter (bench/models.h)
//   kiln_vmap_grad        vmap(grad(loss), in_axes(none, 0, 0)), no jit (traced every call)
//   kiln_loop_grad        eager grad(loss) per example, then stack per parameter
//   kiln_loop_jit_grad    jit(grad(loss)) per example, then stack
//   torch_*               bench/vmap_torch.py: functorch.vmap(functorch.grad(loss)) and a loop
//                         of torch.autograd.grad, in a child process between Kiln's rounds
// Timing: every case is warmed up, then timed in repetitions of a batch of calls sized to take
// ~target seconds, cases interleaved repetition by repetition; the table gives the median and
// the minimum per call over all repetitions of all rounds, and ratios of medians.
#include <kiln/kiln.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "models.h"
#include "side_by_side.h"

struct Mlp {
  kiln::Tensor w1, b1, w2, b2;
};
KILN_TREE(Mlp, w1, b1, w2, b2);

namespace {

using namespace kiln;
using namespace side_by_side;

constexpr int64_t kBatch = 64, kIn = 784, kHidden = 128, kClasses = 10;

// One example: x [784], y [] (int64).
Tensor loss(const Mlp& p, const Tensor& x, const Tensor& y) {
  const Tensor h = maximum(matmul(x, p.w1) + p.b1, 0.0);
  const Tensor logits = matmul(h, p.w2) + p.b2;
  return -sum(one_hot(y, kClasses) * log_softmax(logits, -1));
}

Mlp init() {
  const Tensor keys = random::split(random::key(0), 2);
  return {random::normal(index(keys, 0), {kIn, kHidden}) * (1.0 / std::sqrt(double(kIn))),
          zeros({kHidden}),
          random::normal(index(keys, 1), {kHidden, kClasses}) * (1.0 / std::sqrt(double(kHidden))),
          zeros({kClasses})};
}

Mlp stack_grads(const std::vector<Mlp>& gs) {
  auto field = [&](Tensor Mlp::*f) {
    std::vector<Tensor> parts;
    for (const Mlp& g : gs) parts.push_back(g.*f);
    return stack(parts, 0);
  };
  return {field(&Mlp::w1), field(&Mlp::b1), field(&Mlp::w2), field(&Mlp::b2)};
}

double max_abs_diff(const Mlp& a, const Mlp& b) {
  double m = 0;
  for (auto f : {&Mlp::w1, &Mlp::b1, &Mlp::w2, &Mlp::b2})
    m = std::max(m, max(abs(astype(a.*f, float64) - astype(b.*f, float64))).item<double>());
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;  // --reps 5 --rounds 3 --threads 2 --target 0.2 --py /usr/bin/python3
  bool ir_only = false;
  if (!parse_options(argc, argv, o, [&](const std::string& a, const auto&) {
        if (a != "--ir") return false;
        ir_only = true;
        return true;
      }))
    return 2;

  const Mlp p = init();
  const Tensor x = random::normal(random::key(1), {kBatch, kIn});
  const Tensor y = random::randint(random::key(2), {kBatch}, 0, kClasses, int64);

  auto per_example = jit(vmap(grad(loss), in_axes(none, 0, 0)));
  auto per_example_interp = jit(vmap(grad(loss), in_axes(none, 0, 0)));
  using bench_models::with_backend;
  auto vmapped = vmap(grad(loss), in_axes(none, 0, 0));
  auto jitted_grad = jit(grad(loss));
  if (ir_only) {
    std::cout << ir::print(per_example.lower(p, x, y));
    return 0;
  }

  // Correctness: every variant gives the loop's per-example gradients.
  std::vector<Mlp> per;
  for (int64_t i = 0; i < kBatch; ++i) per.push_back(grad(loss)(p, index(x, i), index(y, i)));
  const Mlp want = stack_grads(per);
  Mlp got, got_interp;
  with_backend("llvm", [&] { got = per_example(p, x, y); })();
  with_backend("interpreter", [&] { got_interp = per_example_interp(p, x, y); })();
  const double e1 = max_abs_diff(got, want), e2 = max_abs_diff(vmapped(p, x, y), want),
               e3 = max_abs_diff(got_interp, want);
  std::printf(
      "# check: max |jit(vmap(grad)) - loop| = %.3g (llvm), %.3g (interpreter), max "
      "|vmap(grad) - loop| = %.3g\n",
      e1, e3, e2);
  if (!(e1 < 1e-4 && e2 < 1e-4 && e3 < 1e-4)) {
    std::fprintf(stderr, "per-example gradients differ from the loop\n");
    return 1;
  }

  std::vector<Case> cases{
      {"kiln_jit_vmap_grad", with_backend("llvm", [&] { (void)per_example(p, x, y); })},
      {"kiln_interp_vmap_grad",
       with_backend("interpreter", [&] { (void)per_example_interp(p, x, y); })},
      {"kiln_vmap_grad", [&] { (void)vmapped(p, x, y); }},
      {"kiln_loop_grad",
       [&] {
         std::vector<Mlp> gs;
         for (int64_t i = 0; i < kBatch; ++i) gs.push_back(grad(loss)(p, index(x, i), index(y, i)));
         (void)stack_grads(gs);
       }},
      {"kiln_loop_jit_grad",
       [&] {
         std::vector<Mlp> gs;
         for (int64_t i = 0; i < kBatch; ++i)
           gs.push_back(jitted_grad(p, index(x, i), index(y, i)));
         (void)stack_grads(gs);
       }},
  };
  calibrate(cases, o.target);
  const Rounds r =
      run_rounds(cases, o, [&](Times& t) { return run_peer(o, "vmap_torch.py", "", t); });
  const Times& times = r.times;

  std::printf(
      "# per-example gradients, MLP %lld-%lld-%lld relu, cross-entropy, batch %lld, f32; Kiln "
      "threads %s, torch threads %d\n",
      (long long)kIn, (long long)kHidden, (long long)kClasses, (long long)kBatch,
      bench_models::kiln_threads().c_str(), o.threads);
  print_loads(r, o);
  const auto ref = times.find("torch_functorch_vmap_grad");
  const double functorch = ref == times.end() ? NAN : median(ref->second);
  const double kiln = median(times.at("kiln_jit_vmap_grad"));
  std::printf("%-28s %10s %10s %14s %16s\n", "case", "median ms", "min ms", "vs functorch",
              "vs kiln jit(vmap)");
  for (const auto& [name, ts] : times) {
    const double m = median(ts);
    std::printf("%-28s %10.3f %10.3f %13.2fx %15.2fx\n", name.c_str(), m, minimum(ts),
                m / functorch, m / kiln);
  }
  if (!r.peer_ok && o.py != "none")
    std::printf("# (the PyTorch peer did not run: see the messages above)\n");
  return 0;
}
