// Fusion benchmarks: an elementwise chain, softmax and layer norm, Kiln (jit with the
// LLVM backend, jit with the interpreter, eager) against PyTorch 1.13 eager
// (bench/fusion_torch.py), side by side in one run, with GB/s against a memcpy roofline.
//
//   build/bench/bench_fusion                  # Kiln and the PyTorch peer, alternating, + table
//   build/bench/bench_fusion --py none        # Kiln only
//   options: --reps R (per round, default 5), --rounds N (Kiln/PyTorch alternations, default 3),
//            --target S (seconds per timed batch of calls, default 0.3), --threads T (PyTorch's
//            torch.set_num_threads and the memcpy's thread count, default 2),
//            --py PATH (default /usr/bin/python3), --only chain|softmax|layernorm
//   Kiln's thread count: KILN_NUM_THREADS / OMP_NUM_THREADS in the environment
//   (bench/jit_vs_torch.sh sets both to T).
//
// Problems (float32, fixed normal inputs):
//   chain       tanh(x) * sigmoid(y) + exp(z), three vectors of 10^7. Minimal traffic: read
//               x, y, z, write the result: 16 bytes per element.
//   softmax     softmax over the rows of [4096, 1024]
//   layernorm   layer norm over the last axis of [4096, 1024], weight and bias [1024], eps 1e-5
//   Each of softmax/layernorm forward (_fwd: minimal traffic read x, write y) and forward +
//   backward (_fwdbwd: value and gradient of sum(f(x) * r), r a fixed random tensor of x's
//   shape; gradients with respect to x, and weight and bias for layer norm; minimal traffic
//   read x and r, write dx).
// Cases, <p> the problem:
//   kiln_jit_<p>     jit(f), KILN_JIT_BACKEND=llvm (jit(value_and_grad(loss)) for _fwdbwd)
//   kiln_interp_<p>  the same with KILN_JIT_BACKEND=interpreter (bench/models.h)
//   kiln_eager_<p>   f (value_and_grad(loss)) without jit
//   memcpy_chain     std::memcpy of 8 bytes per element (the chain's 16 bytes of traffic) into
//                    a buffer touched beforehand, split across T threads: the roofline
//   torch_eager_<p>  PyTorch eager (autograd for _fwdbwd; no_grad for the rest)
//   torch_out_chain  torch.tanh(x, out=a), torch.sigmoid(y, out=b), torch.mul(a, b, out=a),
//                    torch.exp(z, out=b), torch.add(a, b, out=a): preallocated outputs
//   torch_copy_chain b.copy_(a) of 8 bytes per element: PyTorch's own roofline
// GB/s is each case's minimal traffic over its median time. Checks: the llvm and interpreter
// results agree with eager (max |got - want| / max(1, |want|) printed; the run fails above 1e-4).
#include <kiln/kiln.h>
#include <kiln/nn.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "models.h"
#include "side_by_side.h"

namespace {

using namespace kiln;
using namespace side_by_side;
using bench_models::with_backend;

constexpr int64_t kChainN = 10'000'000;
constexpr int64_t kRows = 4096, kCols = 1024;

// One problem's cases and the bytes its minimal fused program reads and writes.
struct Problem {
  std::string name;
  double bytes = 0;
  std::vector<std::string> refs;  // the PyTorch cases its Kiln cases are compared to
};

// The largest |got - want| / max(1, |want|) over the leaves of two results of the same
// structure: relative where the values are large (the weight gradient of layer norm sums 4096
// rows, and a compiled sum may associate differently).
template <class T>
double max_rel_diff(const T& got, const T& want) {
  const auto [lg, dg] = tree_flatten(got);
  const auto [lw, dw] = tree_flatten(want);
  double m = 0;
  for (std::size_t i = 0; i < lw.size(); ++i) {
    const Tensor w = astype(lw[i], float64);
    const Tensor d = abs(astype(lg[i], float64) - w) / maximum(abs(w), 1.0);
    m = std::max(m, max(d).template item<double>());
  }
  return m;
}

// std::memcpy of `bytes` from src to dst split across `threads` threads.
void parallel_memcpy(char* dst, const char* src, std::size_t bytes, int threads) {
  std::vector<std::thread> pool;
  const std::size_t part = bytes / std::size_t(threads);
  for (int t = 0; t < threads; ++t) {
    const std::size_t at = part * std::size_t(t);
    const std::size_t n = t + 1 == threads ? bytes - at : part;
    pool.emplace_back([=] { std::memcpy(dst + at, src + at, n); });
  }
  for (std::thread& th : pool) th.join();
}

Tensor chain(const Tensor& x, const Tensor& y, const Tensor& z) {
  return tanh(x) * sigmoid(y) + exp(z);
}
Tensor softmax_rows(const Tensor& x) { return softmax(x, -1); }
Tensor softmax_loss(const Tensor& x, const Tensor& r) { return sum(softmax(x, -1) * r); }
Tensor layernorm_loss(const Tensor& x, const nn::LayerNorm& ln, const Tensor& r) {
  return sum(ln(x) * r);
}

// The three Kiln cases of one problem: f jitted for each backend, and f eagerly; checks the
// jitted results against the eager one first.
struct Harness {
  std::vector<Case> cases;
  std::vector<Problem> problems;
  bool ok = true;

  void check(const std::string& what, double d) {
    std::printf("# check %-26s max rel. diff vs eager %.3g%s\n", what.c_str(), d,
                d <= 1e-4 ? "" : "  FAILED");
    ok = ok && d <= 1e-4;
  }

  template <class F, class... A>
  void add(Problem p, F f, const A&... args) {
    auto llvm = jit(f, "jit_" + p.name), interp = jit(f, "interp_" + p.name);
    const auto want = f(args...);
    auto got = want, got_i = want;
    with_backend("llvm", [&] { got = llvm(args...); })();
    with_backend("interpreter", [&] { got_i = interp(args...); })();
    check(p.name + " llvm", max_rel_diff(got, want));
    check(p.name + " interpreter", max_rel_diff(got_i, want));
    cases.push_back({"kiln_jit_" + p.name, with_backend("llvm", [=] { (void)llvm(args...); })});
    cases.push_back(
        {"kiln_interp_" + p.name, with_backend("interpreter", [=] { (void)interp(args...); })});
    cases.push_back({"kiln_eager_" + p.name, [=] { (void)f(args...); }});
    problems.push_back(std::move(p));
  }
};

}  // namespace

int main(int argc, char** argv) {
  Options o;
  o.target = 0.3;
  std::string only;
  if (!parse_options(argc, argv, o, [&](const std::string& a, const auto& next) {
        if (a != "--only") return false;
        only = next();
        return true;
      }))
    return 2;
  if (!only.empty() && only != "chain" && only != "softmax" && only != "layernorm") {
    std::fprintf(stderr, "--only takes chain, softmax or layernorm\n");
    return 2;
  }
  const auto want = [&](const char* p) { return only.empty() || only == p; };
  const int threads = std::max(1, o.threads);
  Harness h;

  std::vector<char> src, dst;
  if (want("chain")) {
    const Tensor x = random::normal(random::key(1), {kChainN}),
                 y = random::normal(random::key(2), {kChainN}),
                 z = random::normal(random::key(3), {kChainN});
    h.add({"chain", 16.0 * kChainN, {"torch_eager_chain", "torch_out_chain"}}, chain, x, y, z);
    src.assign(std::size_t(kChainN) * 8, 1);
    dst.assign(src.size(), 0);
    h.cases.push_back(
        {"memcpy_chain", [&] { parallel_memcpy(dst.data(), src.data(), src.size(), threads); }});
  }
  const double mat = 4.0 * kRows * kCols;  // bytes of one [4096, 1024] f32 tensor
  const Tensor a = random::normal(random::key(4), {kRows, kCols}),
               r = random::normal(random::key(5), {kRows, kCols});
  if (want("softmax")) {
    h.add({"softmax_fwd", 2 * mat, {"torch_eager_softmax_fwd"}}, softmax_rows, a);
    h.add({"softmax_fwdbwd", 3 * mat, {"torch_eager_softmax_fwdbwd"}}, value_and_grad(softmax_loss),
          a, r);
  }
  if (want("layernorm")) {
    nn::LayerNorm ln({kCols});
    ln.weight = 1.0 + 0.1 * random::normal(random::key(6), {kCols});
    ln.bias = 0.1 * random::normal(random::key(7), {kCols});
    h.add(
        {"layernorm_fwd", 2 * mat, {"torch_eager_layernorm_fwd"}},
        [](const Tensor& x, const nn::LayerNorm& ln) { return ln(x); }, a, ln);
    h.add({"layernorm_fwdbwd", 3 * mat, {"torch_eager_layernorm_fwdbwd"}},
          value_and_grad(layernorm_loss, argnums<0, 1>), a, ln, r);
  }

  calibrate(h.cases, o.target, 2);
  const Rounds rounds = run_rounds(h.cases, o, [&](Times& t) {
    return run_peer(o, "fusion_torch.py", only.empty() ? "" : "--only " + only, t);
  });

  std::printf(
      "\n# fusion, float32: chain tanh(x)*sigmoid(y)+exp(z) on 3 x 10^7; softmax and layer norm "
      "over the rows of [%lld, %lld]; _fwdbwd = value and gradient of sum(f(x) * r)\n",
      (long long)kRows, (long long)kCols);
  std::printf(
      "# kiln_jit_* KILN_JIT_BACKEND=llvm, kiln_interp_* =interpreter, kiln_eager_* no jit; Kiln "
      "threads %s; torch set_num_threads(%d); memcpy %d threads\n",
      bench_models::kiln_threads().c_str(), o.threads, threads);
  print_loads(rounds, o);
  std::printf("%-28s %10s %10s %8s %14s %14s\n", "case", "median ms", "min ms", "GB/s", "vs ref 1",
              "vs ref 2");
  const Times& t = rounds.times;
  for (const Problem& p : h.problems) {
    std::printf("# %s: %.0f MB minimal traffic; ref 1 %s%s%s\n", p.name.c_str(), p.bytes / 1e6,
                p.refs[0].c_str(), p.refs.size() > 1 ? ", ref 2 " : "",
                p.refs.size() > 1 ? p.refs[1].c_str() : "");
    std::vector<std::string> rows;
    for (const auto& [name, ts] : t) {
      const std::string suffix = "_" + p.name;
      if (name.size() > suffix.size() &&
          name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0 &&
          (name.rfind("kiln_", 0) == 0 || name.rfind("torch_", 0) == 0 ||
           name.rfind("memcpy_", 0) == 0))
        rows.push_back(name);
    }
    for (const std::string& name : rows) {
      const double m = median(t.at(name));
      std::printf("%-28s %10.3f %10.3f %8.2f", name.c_str(), m, minimum(t.at(name)),
                  p.bytes / (m * 1e-3) / 1e9);
      for (const std::string& ref : p.refs) {
        const auto it = t.find(ref);
        if (it == t.end())
          std::printf(" %14s", "-");
        else
          std::printf(" %13.3fx", m / median(it->second));
      }
      std::printf("\n");
    }
  }
  std::printf("# vs ref: ratio of medians (time), < 1 means faster than the reference\n");
  if (!rounds.peer_ok && o.py != "none")
    std::printf("# (the PyTorch peer did not run: see the messages above)\n");
  if (!h.ok) std::fprintf(stderr, "a jitted result differs from eager\n");
  return h.ok ? 0 : 1;
}
