// einsum at transformer sizes against PyTorch 1.13's torch.einsum (bench/einsum_torch.py), side
// by side in one run, float32, forward:
//   bmm        einsum("bij,bjk->bik"), b 64, 256 x 256 x 256
//   attention  einsum("bhqd,bhkd->bhqk"), b 8, h 8, q = k 512, d 64
// Kiln eagerly and under jit; the table gives median and min per call and median / torch's.
//
//   KILN_NUM_THREADS=1 build/bench/bench_einsum --threads 1
//   options: --reps R (default 5), --rounds N (default 3), --target S (seconds per timed batch,
//            default 0.2), --threads T (torch.set_num_threads; set KILN_NUM_THREADS to match),
//            --py PATH (default /usr/bin/python3; "none" skips PyTorch)
#include <kiln/kiln.h>

#include <cstdio>
#include <string>

#include "models.h"
#include "side_by_side.h"

using namespace kiln;
using namespace side_by_side;

int main(int argc, char** argv) {
  Options o;
  o.threads = 1;
  if (!parse_options(argc, argv, o)) return 2;
  const auto u = [](uint64_t seed, const Shape& s) {
    return random::uniform(random::key(seed), s, float32, -1.0, 1.0);
  };
  const Tensor x = u(1, {64, 256, 256}), y = u(2, {64, 256, 256});
  const Tensor q = u(3, {8, 8, 512, 64}), k = u(4, {8, 8, 512, 64});
  const auto bmm = [](const Tensor& a, const Tensor& b) { return einsum("bij,bjk->bik", a, b); };
  const auto attention = [](const Tensor& a, const Tensor& b) {
    return einsum("bhqd,bhkd->bhqk", a, b);
  };
  auto jbmm = jit(bmm);
  auto jattention = jit(attention);
  std::vector<Case> cases{
      {"kiln_bmm", [&] { (void)bmm(x, y); }},
      {"kiln_jit_bmm", [&] { (void)jbmm(x, y); }},
      {"kiln_attention", [&] { (void)attention(q, k); }},
      {"kiln_jit_attention", [&] { (void)jattention(q, k); }},
  };
  calibrate(cases, o.target);
  const Rounds rounds = run_rounds(cases, o, [&](Times& t) {
    return run_peer(o, "einsum_torch.py", "", t,
                    [](const std::string& l) { std::fputs(l.c_str(), stdout); });
  });
  std::printf("\neinsum, f32, forward (per call), Kiln threads %s, torch threads %d\n",
              bench_models::kiln_threads().c_str(), o.threads);
  print_loads(rounds, o);
  std::printf("%-24s %12s %12s %14s\n", "case", "median ms", "min ms", "vs torch (med)");
  for (const auto& [name, ts] : rounds.times) {
    const std::string what = name.substr(name.rfind('_') + 1);
    const auto peer = rounds.times.find("torch_" + what);
    const double tm = peer != rounds.times.end() ? median(peer->second) : 0;
    std::printf("%-24s %12.3f %12.3f %14s\n", name.c_str(), median(ts), minimum(ts),
                tm > 0 ? (std::to_string(median(ts) / tm).substr(0, 5) + "x").c_str() : "-");
  }
  return 0;
}
