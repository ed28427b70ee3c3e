// Cholesky and solve of a batch of SPD matrices, forward and forward + backward,
// Kiln (jit) vs PyTorch 1.13 eager (bench/linalg_torch.py), side by side in one run.
//
//   build/bench/bench_linalg [--threads T] [--reps R] [--rounds N] [--target S] [--py PATH]
//
// A [64, 128, 128] float64 SPD (M M^T / 128 + I), b [64, 128, 8]; both sides use T threads
// (Kiln: set_num_threads, PyTorch: torch.set_num_threads).
//   kiln_forward            jit: L = cholesky(A), x = solve(A, b)
//   kiln_forward_backward   jit(grad): loss = sum(L * W) + sum(x * V), gradients of A and b
//   torch_*                 the same in PyTorch eager, loss.backward()
#include <kiln/kiln.h>

#include <cstdio>
#include <string>

#include "side_by_side.h"

using namespace kiln;
using namespace side_by_side;

namespace {
constexpr int64_t B = 64, N = 128, K = 8;
}  // namespace

int main(int argc, char** argv) {
  Options o;
  o.reps = 7, o.rounds = 2, o.threads = 1, o.target = 0.2;
  if (!parse_options(argc, argv, o)) return 2;
  set_num_threads(o.threads);
  const Tensor m = random::normal(random::key(1), {B, N, N}, float64);
  const Tensor A = matmul(m, swapaxes(m, -1, -2)) / double(N) + eye(N, float64);
  const Tensor b = random::normal(random::key(2), {B, N, K}, float64);
  const Tensor W = random::normal(random::key(3), {B, N, N}, float64);
  const Tensor V = random::normal(random::key(4), {B, N, K}, float64);

  auto forward = jit([](const Tensor& A, const Tensor& b) {
    return std::pair{linalg::cholesky(A), linalg::solve(A, b)};
  });
  auto backward = jit(grad(
      [&](const Tensor& A, const Tensor& b) {
        return sum(linalg::cholesky(A) * W) + sum(linalg::solve(A, b) * V);
      },
      argnums<0, 1>));
  std::vector<Case> cases{
      {"kiln_forward", [&] { (void)forward(A, b); }},
      {"kiln_forward_backward", [&] { (void)backward(A, b); }},
  };
  calibrate(cases, o.target, 2);
  const Rounds rounds = run_rounds(cases, o, [&](Times& t) {
    return run_peer(o, "linalg_torch.py", "", t,
                    [](const std::string& l) { std::fputs(l.c_str(), stdout); });
  });
  std::printf(
      "\ncholesky + solve, A [%lld, %lld, %lld] f64 SPD, b [%lld, %lld, %lld], Kiln and "
      "torch threads %d\n",
      (long long)B, (long long)N, (long long)N, (long long)B, (long long)N, (long long)K,
      o.threads);
  print_loads(rounds, o);
  std::printf("%-28s %12s %12s %14s\n", "case", "median ms", "min ms", "vs torch (med)");
  for (const char* c : {"forward", "forward_backward"}) {
    const auto torch = rounds.times.find(std::string("torch_") + c);
    const double tm = torch != rounds.times.end() ? median(torch->second) : 0;
    for (const std::string side : {"kiln_", "torch_"}) {
      const auto it = rounds.times.find(side + c);
      if (it == rounds.times.end()) continue;
      const double med = median(it->second);
      std::printf("%-28s %12.3f %12.3f %14s\n", it->first.c_str(), med, minimum(it->second),
                  tm > 0 ? (std::to_string(med / tm).substr(0, 5) + "x").c_str() : "-");
    }
  }
  return 0;
}
