// One training step, Kiln jit against PyTorch 1.13 eager (bench/train_torch.py), side by side.
//
//   build/bench/bench_train                 # Kiln and the PyTorch peer, alternating, + table
//   build/bench/bench_train --py none       # Kiln only (e.g. under perf record)
//   options: --reps R (per round, default 5), --rounds N (Kiln/PyTorch alternations, default 3),
//            --target S (seconds per timed batch of calls, default 0.2), --threads T (PyTorch's
//            torch.set_num_threads, default 2), --py PATH (default /usr/bin/python3),
//            --only cnn|mlp|demo (one problem), --steps K (loss values checked, default 8),
//            --ir (print the optimised IR of the jitted steps and stop)
//
// Problems (float32, fixed normal inputs and random integer labels, made once):
//   cnn  batch 64 of 1x28x28: conv 1->32 5x5 pad 2, relu, maxpool 2, conv 32->64 5x5 pad 2,
//        relu, maxpool 2, flatten, linear 3136->1024, relu, linear 1024->10
//   mlp  batch 128 of 784: linear 784->512, relu, linear 512->512, relu, linear 512->10
//   demo examples/demo.cpp's CNN, batch 64 of 1x28x28: conv 1->32 3x3 pad 1, relu, maxpool 2,
//        conv 32->64 3x3 pad 1, relu, maxpool 2, flatten, linear 3136->128, relu, linear 128->10
// Loss: cross-entropy with integer labels (mean). One step = forward, backward and an SGD update
// (lr 0.01, no momentum) of every parameter.
//   kiln_jit_<p>     jit(model, opt_state, x, y -> value_and_grad(loss)(model), optim::sgd
//                    update), the model an nn::Sequential; model and state go in and come out;
//                    KILN_JIT_BACKEND=llvm (the compiler)
//   kiln_interp_<p>  the same jit with KILN_JIT_BACKEND=interpreter (bench/models.h)
//   torch_eager_<p>  nn.Sequential of nn.Conv2d/nn.Linear..., F.cross_entropy, backward,
//                    torch.optim.SGD step, zero_grad(set_to_none=True)
// Both sides start from the same parameters and data: Kiln writes its initial parameters (named
// as in PyTorch's state_dict: "0.weight", ...) and the batch to a temporary folder the peer
// loads. Check: the first --steps losses of both sides, from those parameters, must agree (the
// loss must also fall). Timing (bench/side_by_side.h): warm-up, then repetitions of a batch of
// calls of ~target seconds, cases interleaved; median and min per step over all repetitions of
// all rounds, the ratio of Kiln's median to PyTorch's (> 1: Kiln takes longer), and Kiln's
// share of the FMA peak of its threads (kiln::machine_peak, measured in the same run) at the
// step's FLOPs (its matmuls and convolutions, 2 per multiply-add, as kiln::profile counts them).
#include <kiln/kiln.h>
#include <kiln/nn.h>
#include <kiln/optim.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "models.h"
#include "side_by_side.h"

namespace {

using namespace kiln;
using namespace side_by_side;
namespace fs = std::filesystem;

using bench_models::kClasses;
using bench_models::with_backend;

constexpr double kLr = 0.01;

// One problem: the jitted step with its state for each backend, the losses of the first steps
// with each backend.
struct Problem {
  std::string name;
  std::vector<Case> steps;
  std::vector<double> losses, interp_losses;
  double flops = 0;  // per step: the compiled step's matmuls and convolutions (kiln::profile)
};

// Writes the initial parameters and the batch to dir/<name>/ (raw little-endian f32, labels
// i64) for the peer, runs `steps` steps for the loss check, and returns the timed case, which
// goes on from there.
template <class M>
Problem make_problem(const std::string& name, const M& model, const Tensor& x, const Tensor& y,
                     const fs::path& dir, int steps, bool ir_only) {
  const fs::path at = dir / name;
  fs::create_directories(at);
  for (const auto& [param, t] : nn::named_parameters(model)) write_raw(at / (param + ".bin"), t);
  write_raw(at / "x.bin", x);
  write_raw(at / "y.bin", y);

  const optim::Optimizer opt = optim::sgd({.lr = kLr});
  const auto body = [opt](const M& m, const optim::OptState<M>& s, const Tensor& x,
                          const Tensor& y) {
    auto [loss, grads] =
        value_and_grad([&](const M& net) { return nn::cross_entropy(net(x), y); })(m);
    auto [m2, s2] = opt.update(m, grads, s);
    return std::tuple{m2, s2, loss};
  };
  const auto step = jit(body, "train_step_" + name);
  if (ir_only) {
    std::cout << "# " << name << "\n" << ir::print(step.lower(model, opt.init(model), x, y));
    return {name, {}, {}, {}};
  }
  struct State {
    M model;
    optim::OptState<M> opt;
    Tensor x, y, loss;
    decltype(step) f;
    void operator()() { std::tie(model, opt, loss) = f(model, opt, x, y); }
  };
  // One jitted function per backend: a jit's cache holds the executable of its first call.
  Problem p{name, {}, {}};
  for (const char* backend : {"llvm", "interpreter"}) {
    auto s = std::make_shared<State>(
        State{model, opt.init(model), x, y, Tensor(), jit(body, "train_step_" + name)});
    const std::string case_name =
        (backend == std::string("llvm") ? "kiln_jit_" : "kiln_interp_") + name;
    p.steps.push_back({case_name, with_backend(backend, [s] { (*s)(); })});
    std::vector<double>& losses = p.losses.empty() ? p.losses : p.interp_losses;
    for (int i = 0; i < steps; ++i) {
      p.steps.back().run();
      losses.push_back(s->loss.template item<double>());
    }
  }
  for (const ProfileRow& row : profile(p.steps.front().run).rows) p.flops += row.flops;
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;  // --reps 5 --rounds 3 --threads 2 --target 0.2 --py /usr/bin/python3
  std::string only;
  int steps = 8;
  bool ir_only = false;
  if (!parse_options(argc, argv, o, [&](const std::string& a, const auto& next) {
        if (a == "--only")
          only = next();
        else if (a == "--steps")
          steps = std::stoi(next());
        else if (a == "--ir")
          ir_only = true;
        else
          return false;
        return true;
      }))
    return 2;
  if (!only.empty() && only != "cnn" && only != "mlp" && only != "demo") {
    std::fprintf(stderr, "--only takes cnn, mlp or demo\n");
    return 2;
  }
  steps = std::max(steps, 2);

  char tmpl[] = "/tmp/kiln_bench_train_XXXXXX";
  if (!mkdtemp(tmpl)) {
    std::perror("mkdtemp");
    return 1;
  }
  const fs::path dir = tmpl;

  std::vector<Problem> problems;
  if (only.empty() || only == "cnn")
    problems.push_back(make_problem("cnn", bench_models::make_cnn(random::key(0)),
                                    random::normal(random::key(1), {64, 1, 28, 28}),
                                    random::randint(random::key(2), {64}, 0, kClasses, int64), dir,
                                    steps, ir_only));
  if (only.empty() || only == "mlp")
    problems.push_back(make_problem(
        "mlp", bench_models::make_mlp(random::key(3)), random::normal(random::key(4), {128, 784}),
        random::randint(random::key(5), {128}, 0, kClasses, int64), dir, steps, ir_only));
  if (only.empty() || only == "demo")
    problems.push_back(make_problem("demo", bench_models::make_demo_cnn(random::key(6)),
                                    random::normal(random::key(7), {64, 1, 28, 28}),
                                    random::randint(random::key(8), {64}, 0, kClasses, int64), dir,
                                    steps, ir_only));

  if (ir_only) {
    fs::remove_all(dir);
    return 0;
  }
  std::vector<Case> cases;
  for (const Problem& p : problems) cases.insert(cases.end(), p.steps.begin(), p.steps.end());
  calibrate(cases, o.target);

  const std::string args = "--init " + dir.string() + " --steps " + std::to_string(steps) +
                           (only.empty() ? "" : " --only " + only);
  const auto [r, torch_losses] = run_training_rounds(cases, o, "train_torch.py", args);
  fs::remove_all(dir);

  std::printf("# one training step (forward + backward + SGD lr %g on every parameter), f32:\n",
              kLr);
  std::printf(
      "#   cnn: batch 64 1x28x28, conv5x5(1->32) relu pool2 conv5x5(32->64) relu pool2 "
      "linear(3136->1024) relu linear(1024->10)\n");
  std::printf("#   mlp: batch 128, 784-512-512-10 relu; loss cross-entropy, integer labels\n");
  std::printf(
      "#   demo: batch 64 1x28x28, examples/demo.cpp's CNN: conv3x3(1->32) relu pool2 "
      "conv3x3(32->64) relu pool2 linear(3136->128) relu linear(128->10)\n");
  std::printf(
      "# kiln: jit(value_and_grad + optim::sgd), kiln_jit_* KILN_JIT_BACKEND=llvm, kiln_interp_* "
      "=interpreter, threads %s; torch: eager, set_num_threads(%d)\n",
      bench_models::kiln_threads().c_str(), o.threads);
  bool ok = true;
  for (const Problem& p : problems) {
    const bool falls = p.losses.back() < p.losses.front();
    ok = ok && falls && std::isfinite(p.losses.back());
    std::printf("# %s loss, kiln, steps 0..%zu:%s  (%s)\n", p.name.c_str(), p.losses.size() - 1,
                join(p.losses, 6).c_str(), falls ? "falls" : "DOES NOT FALL");
    double idiff = 0;
    for (std::size_t i = 0; i < std::min(p.interp_losses.size(), p.losses.size()); ++i)
      idiff = std::max(idiff, std::abs(p.interp_losses[i] - p.losses[i]) / std::abs(p.losses[i]));
    const bool iagree = p.interp_losses.size() == p.losses.size() && idiff < 1e-3;
    ok = ok && iagree;
    std::printf("# %s loss, kiln interpreter:%s  (max rel. diff %.2g%s)\n", p.name.c_str(),
                join(p.interp_losses, 6).c_str(), idiff, iagree ? "" : ", DISAGREE");
    const auto t = torch_losses.find("torch_eager_" + p.name);
    if (t == torch_losses.end()) continue;
    double diff = 0;
    for (std::size_t i = 0; i < std::min(t->second.size(), p.losses.size()); ++i)
      diff = std::max(diff, std::abs(t->second[i] - p.losses[i]) / std::abs(p.losses[i]));
    const bool agree = t->second.size() == p.losses.size() && diff < 1e-3;
    ok = ok && agree;
    std::printf("# %s loss, torch, same start:%s  (max rel. diff %.2g%s)\n", p.name.c_str(),
                join(t->second, 6).c_str(), diff, agree ? "" : ", DISAGREE");
  }
  print_loads(r, o);
  const MachinePeak peak = machine_peak(num_threads());
  std::printf("# FMA peak of Kiln's %d thread(s), measured now: %.1f GFLOP/s (%s)\n", peak.threads,
              peak.fma_gflops, peak.isa.c_str());
  for (const Problem& p : problems)
    std::printf("# %s: %.3f GFLOP a step (matmuls and convolutions, 2 per multiply-add)\n",
                p.name.c_str(), p.flops * 1e-9);
  std::printf("%-20s %10s %10s %12s %14s\n", "case", "median ms", "min ms", "kiln/torch",
              "share of peak");
  for (const Problem& p : problems) {
    const std::string tn = "torch_eager_" + p.name;
    const auto t = r.times.find(tn);
    const double tm = t == r.times.end() ? NAN : median(t->second);
    for (const Case& c : p.steps) {
      const std::vector<double>& k = r.times.at(c.name);
      const double share = p.flops / (median(k) * 1e-3) * 1e-9 / peak.fma_gflops;
      if (std::isnan(tm))
        std::printf("%-20s %10.3f %10.3f %12s %13.0f%%\n", c.name.c_str(), median(k), minimum(k),
                    "-", 100 * share);
      else
        std::printf("%-20s %10.3f %10.3f %11.2fx %13.0f%%\n", c.name.c_str(), median(k), minimum(k),
                    median(k) / tm, 100 * share);
    }
    if (t != r.times.end())
      std::printf("%-20s %10.3f %10.3f %11.2fx\n", tn.c_str(), tm, minimum(t->second), 1.0);
  }
  std::printf("# kiln/torch: ratio of medians, > 1 means Kiln takes longer\n");
  if (!r.peer_ok && o.py != "none")
    std::printf("# (the PyTorch peer did not run: see the messages above)\n");
  if (!ok) std::fprintf(stderr, "loss check failed\n");
  return ok ? 0 : 1;
}
