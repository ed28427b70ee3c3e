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
//   kiln_jit_vmap_grad    jit(vmap(grad(loss), in_axes(none, 0, 0)))
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
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#ifndef KILN_SOURCE_DIR
#define KILN_SOURCE_DIR "."
#endif

struct Mlp {
  kiln::Tensor w1, b1, w2, b2;
};
KILN_TREE(Mlp, w1, b1, w2, b2);

namespace {

using namespace kiln;
using Clock = std::chrono::steady_clock;

constexpr int64_t kBatch = 64, kIn = 784, kHidden = 128, kClasses = 10;

// One example: x [784], y [] (int64).
Tensor loss(const Mlp& p, const Tensor& x, const Tensor& y) {
  const Tensor h = maximum(matmul(x, p.w1) + p.b1, 0.0);
  const Tensor logits = matmul(h, p.w2) + p.b2;
  return -sum(one_hot(y, kClasses) * log_softmax(logits, -1));
}

Mlp init() {
  const Tensor keys = random::split(random::key(0), 2);
  return {random::normal(index(keys, 0), {kIn, kHidden}) * (1.0 / std::sqrt(double(kIn))), zeros({kHidden}),
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

struct Case {
  std::string name;
  std::function<void()> run;
  int64_t calls = 1;
};

double seconds_of(const std::function<void()>& f, int64_t n) {
  const auto t0 = Clock::now();
  for (int64_t i = 0; i < n; ++i) f();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string load() {
  FILE* f = std::fopen("/proc/loadavg", "r");
  if (!f) return "?";
  char buf[128] = {0};
  const char* ok = std::fgets(buf, sizeof buf, f);
  std::fclose(f);
  std::string s = ok ? buf : "?";
  std::istringstream in(s);
  std::string a, b, c;
  in >> a >> b >> c;
  return a + " " + b + " " + c;
}

// Runs the PyTorch script once; appends each case's per-repetition times (ms).
bool run_torch(const std::string& py, int reps, int threads, double target,
               std::map<std::string, std::vector<double>>& times) {
  const std::string cmd = py + " " KILN_SOURCE_DIR "/bench/vmap_torch.py --reps " + std::to_string(reps) +
                          " --threads " + std::to_string(threads) + " --target " + std::to_string(target) +
                          " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return false;
  char line[4096];
  bool any = false;
  while (std::fgets(line, sizeof line, p)) {
    std::istringstream in(line);
    std::string tag, name;
    in >> tag >> name;
    if (tag == "RESULT") continue;  // the script's own summary; the table below has it
    if (tag != "TIMES") {
      std::fputs(line, stderr);
      continue;
    }
    double t;
    while (in >> t) times[name].push_back(t);
    any = true;
  }
  return pclose(p) == 0 && any;
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 5, rounds = 3, threads = 2;
  double target = 0.2;
  std::string py = "/usr/bin/python3";
  bool ir_only = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--reps") reps = std::stoi(next());
    else if (a == "--rounds") rounds = std::stoi(next());
    else if (a == "--target") target = std::stod(next());
    else if (a == "--threads") threads = std::stoi(next());
    else if (a == "--py") py = next();
    else if (a == "--ir") ir_only = true;
    else {
      std::cerr << "unknown option " << a << "\n";
      return 2;
    }
  }

  const Mlp p = init();
  const Tensor x = random::normal(random::key(1), {kBatch, kIn});
  const Tensor y = random::randint(random::key(2), {kBatch}, 0, kClasses, int64);

  auto per_example = jit(vmap(grad(loss), in_axes(none, 0, 0)));
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
  const double e1 = max_abs_diff(per_example(p, x, y), want), e2 = max_abs_diff(vmapped(p, x, y), want);
  std::printf("# check: max |jit(vmap(grad)) - loop| = %.3g, max |vmap(grad) - loop| = %.3g\n", e1, e2);
  if (!(e1 < 1e-4 && e2 < 1e-4)) {
    std::fprintf(stderr, "per-example gradients differ from the loop\n");
    return 1;
  }

  std::vector<Case> cases{
      {"kiln_jit_vmap_grad", [&] { (void)per_example(p, x, y); }},
      {"kiln_vmap_grad", [&] { (void)vmapped(p, x, y); }},
      {"kiln_loop_grad", [&] {
         std::vector<Mlp> gs;
         for (int64_t i = 0; i < kBatch; ++i) gs.push_back(grad(loss)(p, index(x, i), index(y, i)));
         (void)stack_grads(gs);
       }},
      {"kiln_loop_jit_grad", [&] {
         std::vector<Mlp> gs;
         for (int64_t i = 0; i < kBatch; ++i) gs.push_back(jitted_grad(p, index(x, i), index(y, i)));
         (void)stack_grads(gs);
       }},
  };
  for (Case& c : cases) {
    for (int i = 0; i < 3; ++i) c.run();
    c.calls = std::max<int64_t>(1, static_cast<int64_t>(target / std::max(seconds_of(c.run, 1), 1e-6)));
  }

  std::map<std::string, std::vector<double>> times;
  std::vector<std::string> loads;
  bool torch_ok = py != "none";
  for (int r = 0; r < rounds; ++r) {
    loads.push_back(load());
    for (int k = 0; k < reps; ++k)
      for (const Case& c : cases) times[c.name].push_back(seconds_of(c.run, c.calls) / double(c.calls) * 1e3);
    if (torch_ok) torch_ok = run_torch(py, reps, threads, target, times);
  }
  loads.push_back(load());

  std::printf("# per-example gradients, MLP %lld-%lld-%lld relu, cross-entropy, batch %lld, f32\n",
              (long long)kIn, (long long)kHidden, (long long)kClasses, (long long)kBatch);
  std::printf("# %d rounds x %d reps; load average (1/5/15 min) per round:", rounds, reps);
  for (const std::string& l : loads) std::printf(" [%s]", l.c_str());
  std::printf("\n");
  const auto ref = times.find("torch_functorch_vmap_grad");
  const double functorch = ref == times.end() ? NAN : median(ref->second);
  const double kiln = median(times["kiln_jit_vmap_grad"]);
  std::printf("%-28s %10s %10s %14s %16s\n", "case", "median ms", "min ms", "vs functorch",
              "vs kiln jit(vmap)");
  for (const auto& [name, ts] : times) {
    const double m = median(ts);
    std::printf("%-28s %10.3f %10.3f %13.2fx %15.2fx\n", name.c_str(), m,
                *std::min_element(ts.begin(), ts.end()), m / functorch, m / kiln);
  }
  if (!torch_ok && py != "none") std::printf("# (the PyTorch peer did not run: see the messages above)\n");
  return 0;
}
