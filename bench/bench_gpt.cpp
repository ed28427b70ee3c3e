// One training step of GPT-2's architecture (examples/support/gpt_model.h), jitted, against
// PyTorch 1.13 eager (bench/gpt_torch.py), side by side in one run, with its model FLOPs
// utilisation.
//
//   build/bench/bench_gpt                    # Kiln and the PyTorch peer, alternating, + table
//   build/bench/bench_gpt --py none          # Kiln only
//   options: --reps R (per round, default 5), --rounds N (Kiln/PyTorch alternations, default 3),
//            --target S (seconds per timed batch of calls, default 0.2), --threads T (PyTorch's
//            torch.set_num_threads, default 2), --py PATH (default /usr/bin/python3),
//            --only small|medium (one problem), --steps K (losses compared, default 20)
//   Kiln's thread count: KILN_NUM_THREADS / OMP_NUM_THREADS in the environment.
//
// Problems (layers, heads, d_model, block, batch; vocabulary 256, byte-level; float32):
//   small (4, 4, 256, 128, 8), medium (6, 6, 384, 256, 8); a fixed batch of random tokens and
//   targets. One step: the mean cross-entropy of the next-token logits, its gradient, clipping
//   to global norm 1 and an AdamW update (lr 1e-3, weight decay 0.1 on every parameter).
//   kiln_jit_<p>     jit(model, opt_state, x, y -> value_and_grad + optim::adamw update)
//   torch_eager_<p>  the same model in PyTorch (nanoGPT's form), backward, clip_grad_norm_,
//                    torch.optim.AdamW
//   kiln_generate_<p>   jit(gpt::generate): 200 greedy tokens (block - 1 where the block is
//                       shorter) after a one-token prompt, key/value cache, a fori_loop per span
//   torch_generate_<p>  the same in PyTorch eager, a key/value cache grown by torch.cat
// Both sides start from the same parameters and batch (Kiln writes them, named as in the
// PyTorch model's state_dict, for the peer). Checks: the first --steps losses of Kiln's jit,
// of the interpreter (the first 3) and of PyTorch agree to 1e-5 relative, and the loss falls.
// The share of the peak is the model FLOPs utilisation: gpt::train_flops (6 per matrix
// parameter and token, plus 12 * layers * T * d_model per token for the attention products)
// per step against kiln::machine_peak of Kiln's threads, measured in the same run.
#include <kiln/kiln.h>
#include <kiln/optim.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "../examples/support/gpt_model.h"
#include "models.h"
#include "side_by_side.h"

namespace {

using namespace kiln;
using namespace side_by_side;
namespace fs = std::filesystem;

constexpr double kLr = 1e-3, kWeightDecay = 0.1, kClip = 1.0;
constexpr double kLossRtol = 1e-5;

struct Problem {
  std::string name;
  gpt::Config config;
  int64_t batch = 0;
  Case step, generate;
  int64_t generated = 0;  // tokens per generate call
  std::vector<double> losses, interp_losses;
};

// Greedy tokens generated after a one-token prompt (block - 1 where the block is shorter).
constexpr int64_t kGenerated = 200;

Problem make_problem(const std::string& name, const gpt::Config& c, int64_t batch,
                     const fs::path& dir, int steps) {
  const gpt::Model model = gpt::init(c, random::key(0));
  const Tensor x = random::randint(random::key(1), {batch, c.block_size}, 0, c.vocab, int64),
               y = random::randint(random::key(2), {batch, c.block_size}, 0, c.vocab, int64);
  const fs::path at = dir / name;
  fs::create_directories(at);
  for (const auto& [param, t] : nn::named_parameters(model)) write_raw(at / (param + ".bin"), t);
  write_raw(at / "x.bin", x);
  write_raw(at / "y.bin", y);

  const optim::Optimizer opt =
      optim::adamw({.lr = kLr, .weight_decay = kWeightDecay, .clip_norm = kClip});
  using State = optim::OptState<gpt::Model>;
  const auto body = [opt](const gpt::Model& m, const State& s, const Tensor& x, const Tensor& y) {
    auto [loss, grads] =
        value_and_grad([&](const gpt::Model& net) { return gpt::loss(net, x, y); })(m);
    auto [m2, s2] = opt.update(m, grads, s);
    return std::tuple{m2, s2, loss};
  };
  struct Run {
    gpt::Model model;
    State opt;
    Tensor x, y, loss;
    decltype(jit(body)) f;
    void operator()() { std::tie(model, opt, loss) = f(model, opt, x, y); }
  };
  Problem p{name, c, batch, {}, {}, 0, {}, {}};
  for (const char* backend : {"llvm", "interpreter"}) {
    auto run = std::make_shared<Run>(
        Run{model, opt.init(model), x, y, Tensor(), jit(body, "gpt_step_" + name)});
    const bool compiled = backend == std::string("llvm");
    const std::function<void()> call = bench_models::with_backend(backend, [run] { (*run)(); });
    std::vector<double>& losses = compiled ? p.losses : p.interp_losses;
    for (int i = 0; i < (compiled ? steps : 3); ++i) {
      call();
      losses.push_back(run->loss.item<double>());
    }
    if (compiled) p.step = {"kiln_jit_" + name, call};
  }
  // Generation from the initial weights: one compiled fori_loop with the key/value cache.
  p.generated = std::min(kGenerated, c.block_size - 1);
  const int64_t n = p.generated;
  const auto greedy = [n](const gpt::Model& m, const Tensor& prompt, const Tensor& key) {
    return gpt::generate(m, prompt, n, {.temperature = 0}, key);
  };
  auto generate = std::make_shared<decltype(jit(greedy))>(jit(greedy, "gpt_generate_" + name));
  const Tensor prompt = zeros({1, 1}, int64), key = random::key(3);
  p.generate = {"kiln_generate_" + name,
                [generate, model, prompt, key] { (void)(*generate)(model, prompt, key); }};
  return p;
}

// The largest relative difference of the first min(a, b) values; infinite when b is shorter
// than `want` values.
double max_rel_diff(const std::vector<double>& a, const std::vector<double>& b, std::size_t want) {
  if (a.size() < want || b.size() < want) return INFINITY;
  double d = 0;
  for (std::size_t i = 0; i < want; ++i) d = std::max(d, std::abs(a[i] - b[i]) / std::abs(a[i]));
  return d;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  std::string only;
  int steps = 20;
  if (!parse_options(argc, argv, o, [&](const std::string& a, const auto& next) {
        if (a == "--only")
          only = next();
        else if (a == "--steps")
          steps = std::stoi(next());
        else
          return false;
        return true;
      }))
    return 2;
  if (!only.empty() && only != "small" && only != "medium") {
    std::fprintf(stderr, "--only takes small or medium\n");
    return 2;
  }
  steps = std::max(steps, 3);
  char tmpl[] = "/tmp/kiln_bench_gpt_XXXXXX";
  if (!mkdtemp(tmpl)) {
    std::perror("mkdtemp");
    return 1;
  }
  const fs::path dir = tmpl;

  std::vector<Problem> problems;
  if (only.empty() || only == "small")
    problems.push_back(make_problem("small", {4, 4, 256, 128, 256}, 8, dir, steps));
  if (only.empty() || only == "medium")
    problems.push_back(make_problem("medium", {6, 6, 384, 256, 256}, 8, dir, steps));
  std::vector<Case> cases;
  for (const Problem& p : problems) cases.insert(cases.end(), {p.step, p.generate});
  calibrate(cases, o.target);

  const std::string args = "--init " + dir.string() + " --steps " + std::to_string(steps) +
                           (only.empty() ? "" : " --only " + only);
  const auto [r, torch_losses] = run_training_rounds(cases, o, "gpt_torch.py", args);
  fs::remove_all(dir);

  std::printf(
      "# one training step of GPT-2's architecture (examples/support/gpt_model.h), f32, "
      "vocabulary 256:"
      " cross-entropy, gradient, clip to norm %g, AdamW lr %g weight decay %g\n",
      kClip, kLr, kWeightDecay);
  std::printf("# kiln: jit, threads %s; torch: eager, set_num_threads(%d)\n",
              bench_models::kiln_threads().c_str(), o.threads);
  bool ok = true;
  for (const Problem& p : problems) {
    const gpt::Config& c = p.config;
    std::printf("# %s: %lld layers, %lld heads, d_model %lld, block %lld, batch %lld\n",
                p.name.c_str(), (long long)c.layers, (long long)c.heads, (long long)c.d_model,
                (long long)c.block_size, (long long)p.batch);
    const bool falls = p.losses.back() < p.losses.front() && std::isfinite(p.losses.back());
    ok = ok && falls;
    std::printf("#   loss, kiln:%s  (%s)\n", join(p.losses, 8).c_str(),
                falls ? "falls" : "DOES NOT FALL");
    const double idiff = max_rel_diff(p.losses, p.interp_losses, 3);
    ok = ok && idiff <= kLossRtol;
    std::printf("#   loss, kiln interpreter:%s  (max rel. diff %.2g%s)\n",
                join(p.interp_losses, 8).c_str(), idiff, idiff <= kLossRtol ? "" : ", DISAGREE");
    const auto t = torch_losses.find("torch_eager_" + p.name);
    if (t == torch_losses.end()) continue;
    const double diff = max_rel_diff(p.losses, t->second, p.losses.size());
    ok = ok && diff <= kLossRtol;
    std::printf("#   loss, torch, same start:%s  (max rel. diff %.2g%s)\n",
                join(t->second, 8).c_str(), diff, diff <= kLossRtol ? "" : ", DISAGREE");
    const auto f64 = torch_losses.find("torch_f64_" + p.name);
    if (f64 == torch_losses.end()) continue;
    std::printf("#   loss, torch in float64:%s  (max rel. diff from it: kiln %.2g, torch %.2g)\n",
                join(f64->second, 8).c_str(), max_rel_diff(f64->second, p.losses, p.losses.size()),
                max_rel_diff(f64->second, t->second, p.losses.size()));
  }
  print_loads(r, o);
  const MachinePeak peak = machine_peak(num_threads());
  std::printf("# FMA peak of Kiln's %d thread(s), measured now: %.1f GFLOP/s (%s)\n", peak.threads,
              peak.fma_gflops, peak.isa.c_str());
  std::printf("%-20s %10s %10s %12s %14s\n", "case", "median ms", "min ms", "kiln/torch", "MFU");
  for (const Problem& p : problems) {
    const double flops = gpt::train_flops(p.config, p.batch, p.config.block_size);
    const std::string tn = "torch_eager_" + p.name;
    const auto t = r.times.find(tn);
    const double tm = t == r.times.end() ? NAN : median(t->second);
    auto row = [&](const std::string& name, const std::vector<double>& ms, double ratio) {
      std::printf("%-20s %10.3f %10.3f %11.2fx %13.0f%%\n", name.c_str(), median(ms), minimum(ms),
                  ratio, 100 * flops / (median(ms) * 1e-3) * 1e-9 / peak.fma_gflops);
    };
    row(p.step.name, r.times.at(p.step.name), median(r.times.at(p.step.name)) / tm);
    if (t != r.times.end()) row(tn, t->second, 1.0);
    std::printf("# %s: %.3f GFLOP a step (model FLOPs, 2 per multiply-add)\n", p.name.c_str(),
                flops * 1e-9);
    const std::string tg = "torch_generate_" + p.name;
    const auto g = r.times.find(tg);
    const double gm = g == r.times.end() ? NAN : median(g->second);
    auto generation = [&](const std::string& name, const std::vector<double>& ms, double ratio) {
      std::printf("%-20s %10.3f %10.3f %11.2fx %9.0f tok/s\n", name.c_str(), median(ms),
                  minimum(ms), ratio, static_cast<double>(p.generated) / (median(ms) * 1e-3));
    };
    generation(p.generate.name, r.times.at(p.generate.name),
               median(r.times.at(p.generate.name)) / gm);
    if (g != r.times.end()) generation(tg, g->second, 1.0);
    std::printf("# %s generation: %lld greedy tokens after a one-token prompt, key/value cache\n",
                p.name.c_str(), static_cast<long long>(p.generated));
  }
  std::printf(
      "# kiln/torch: ratio of medians, > 1 means Kiln takes longer; MFU: model FLOPs per "
      "second against the FMA peak of Kiln's threads (torch's row: the same peak)\n");
  if (!r.peer_ok && o.py != "none")
    std::printf("# (the PyTorch peer did not run: see the messages above)\n");
  if (!ok) std::fprintf(stderr, "loss check failed\n");
  return ok ? 0 : 1;
}
