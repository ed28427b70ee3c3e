// A scan RNN against the same loop unrolled at trace time and PyTorch 1.13 eager (Python loop),
// forward + backward; and compilation time (first-call trace + optimise) against step count.
//
//   build/bench/bench_scan                   # Kiln, then bench/scan_torch.py, then the table
//   options: --reps R (default 7), --target S (seconds per timed batch, default 0.3),
//            --threads T (torch.set_num_threads, default 1), --py PATH (default /usr/bin/python3;
//            "none" skips PyTorch), --unroll K (also time scan with ScanOptions{.unroll = K}),
//            --rounds N (Kiln/PyTorch alternations, default 1), --timing-only (the per-call
//            table only: no compilation table, no memory table; bench/jit_vs_torch.sh uses it),
//            --tiny-steps N (steps of the per-step overhead cases, default 100000; 0 skips them)
//
// Problem: h = tanh(h @ Wh + x_t @ Wx + b), hidden 256, input 256, batch 32, 100 steps,
// float32, h0 = 0; loss = sum of the final h; gradient w.r.t. (Wh, Wx, b).
//   kiln_jit_scan        jit(grad(loss)) with the loop as kiln::scan, KILN_JIT_BACKEND=llvm
//   kiln_jit_unrolled    jit(grad(loss)) with a C++ for loop inside the jitted function (llvm)
//   kiln_interp_*        the same two with KILN_JIT_BACKEND=interpreter (bench/models.h)
//   torch_eager_loop     bench/scan_torch.py: Python loop, loss.backward()
// Per-step overhead (the loop machinery, not the arithmetic): jit of a scan whose body is one
// fused line on a carry of f32[16] (c' = c * 0.5 + x, y = c'; xs [N, 16], ys stacked), of a
// fori_loop with static bounds (a scan without xs or ys) and with tensor bounds (a while), each
// N steps, llvm and interpreter; the table gives microseconds per step.
// Timing (bench/side_by_side.h): warm-up, then repetitions of a batch of calls of ~target s,
// the Kiln cases interleaved; the table gives median and min per call and median / torch's.
// Compilation: jit(...).lower(args) on a fresh jit (trace of grad + ir::optimize; nothing runs)
// for 10, 100 and 1000 steps, scan vs unrolled (unrolled 1000 is included).
#include <kiln/kiln.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "models.h"
#include "side_by_side.h"

using namespace kiln;
using namespace side_by_side;

namespace {

constexpr int64_t B = 32, H = 256, D = 256;

Tensor loss_scan(const Tensor& wh, const Tensor& wx, const Tensor& b, const Tensor& xs,
                 int64_t unroll) {
  auto [h, ys] = scan(
      [&](const Tensor& h, const Tensor& x) {
        return std::pair{tanh(matmul(h, wh) + matmul(x, wx) + b), std::tuple<>{}};
      },
      zeros({B, H}, float32), xs, ScanOptions{.unroll = unroll});
  return sum(h);
}
Tensor loss_unrolled(const Tensor& wh, const Tensor& wx, const Tensor& b, const Tensor& xs) {
  Tensor h = zeros({B, H}, float32);
  for (int64_t t = 0; t < xs.shape()[0]; ++t)
    h = tanh(matmul(h, wh) + matmul(index(xs, t), wx) + b);
  return sum(h);
}

double seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  o.reps = 7, o.rounds = 1, o.threads = 1, o.target = 0.3;
  int64_t unroll = 0, tiny_steps = 100000;
  bool timing_only = false;
  if (!parse_options(argc, argv, o, [&](const std::string& a, const auto& next) {
        if (a == "--timing-only")
          timing_only = true;
        else if (a == "--unroll")
          unroll = std::stoll(next());
        else if (a == "--tiny-steps")
          tiny_steps = std::stoll(next());
        else
          return false;
        return true;
      }))
    return 2;
  const Tensor wh = random::normal(random::key(1), {H, H}, float32) * (1.0 / 16);
  const Tensor wx = random::normal(random::key(2), {D, H}, float32) * (1.0 / 16);
  const Tensor b = zeros({H}, float32);
  auto xs_of = [](int64_t T) { return random::normal(random::key(3), {T, B, D}, float32); };
  const Tensor xs = xs_of(100);

  const auto grad_scan = grad([](const Tensor& wh, const Tensor& wx, const Tensor& b,
                                 const Tensor& xs) { return loss_scan(wh, wx, b, xs, 1); },
                              argnums<0, 1, 2>);
  const auto grad_unr = grad(loss_unrolled, argnums<0, 1, 2>);
  auto g_scan = jit(grad_scan);
  auto g_unr = jit(grad_unr);
  // The interpreter's variants: jits of their own (a jit keeps the executable of its first
  // call), always called under KILN_JIT_BACKEND=interpreter.
  auto gi_scan = jit(grad_scan);
  auto gi_unr = jit(grad_unr);
  using bench_models::with_backend;
  {  // agreement
    bench_models::BackendScope llvm("llvm");
    auto [a1, a2, a3] = g_scan(wh, wx, b, xs);
    auto [c1, c2, c3] = g_unr(wh, wx, b, xs);
    double md = 0;
    const auto u = a1.to_vector<float>(), v = c1.to_vector<float>();
    for (std::size_t i = 0; i < u.size(); ++i) md = std::max(md, double(std::abs(u[i] - v[i])));
    std::printf("max |dWh scan - dWh unrolled| = %.3g\n", md);
  }
  std::vector<Case> cases{
      {"kiln_jit_scan", with_backend("llvm", [&] { (void)g_scan(wh, wx, b, xs); })},
      {"kiln_jit_unrolled", with_backend("llvm", [&] { (void)g_unr(wh, wx, b, xs); })},
      {"kiln_interp_scan", with_backend("interpreter", [&] { (void)gi_scan(wh, wx, b, xs); })},
      {"kiln_interp_unrolled", with_backend("interpreter", [&] { (void)gi_unr(wh, wx, b, xs); })},
  };
  if (unroll > 1) {
    auto g_u = jit(grad([unroll](const Tensor& wh, const Tensor& wx, const Tensor& b,
                                 const Tensor& xs) { return loss_scan(wh, wx, b, xs, unroll); },
                        argnums<0, 1, 2>));
    cases.push_back({"kiln_jit_scan_unroll" + std::to_string(unroll), [&, g_u] {
                       auto r = g_u(wh, wx, b, xs);
                       (void)r;
                     }});
  }
  // The per-step overhead cases: one jit per backend each (a jit keeps its first executable).
  const Tensor tiny_xs =
      random::normal(random::key(4), {std::max<int64_t>(tiny_steps, 1), 16}, float32);
  auto tiny_scan = [](const Tensor& c0, const Tensor& xs) {
    return scan(
        [](const Tensor& c, const Tensor& x) {
          const Tensor n = c * 0.5f + x;
          return std::pair{n, n};
        },
        c0, xs);
  };
  auto tiny_fori = [tiny_steps](const Tensor& c0) {
    return fori_loop(
        0, tiny_steps, [](const Tensor&, const Tensor& c) { return c * 0.5f + 1.0f; }, c0);
  };
  auto tiny_while = [](const Tensor& c0, const Tensor& n) {
    return fori_loop(
        zeros({}, int32), n, [](const Tensor&, const Tensor& c) { return c * 0.5f + 1.0f; }, c0);
  };
  const Tensor c0 = zeros({16}, float32), tiny_n = full({}, double(tiny_steps), int32);
  std::vector<std::string> tiny_cases;
  if (tiny_steps > 0)
    for (const char* backend : {"llvm", "interpreter"}) {
      const std::string suffix = std::string("_") + backend;
      auto js = jit(tiny_scan);
      auto jf = jit(tiny_fori);
      auto jw = jit(tiny_while);
      cases.push_back({"tiny_scan" + suffix,
                       with_backend(backend, [=, &c0, &tiny_xs] { (void)js(c0, tiny_xs); })});
      cases.push_back({"tiny_fori" + suffix, with_backend(backend, [=, &c0] { (void)jf(c0); })});
      cases.push_back({"tiny_while" + suffix,
                       with_backend(backend, [=, &c0, &tiny_n] { (void)jw(c0, tiny_n); })});
      for (int k = 3; k > 0; --k) tiny_cases.push_back(cases[cases.size() - k].name);
    }
  calibrate(cases, o.target, 2);
  const Rounds rounds = run_rounds(cases, o, [&](Times& t) {
    return run_peer(o, "scan_torch.py", "", t,
                    [](const std::string& l) { std::fputs(l.c_str(), stdout); });
  });
  std::printf(
      "\nRNN hidden %lld, input %lld, batch %lld, 100 steps, f32, fwd+bwd (per call), Kiln "
      "threads %s, torch threads %d\n",
      (long long)H, (long long)D, (long long)B, bench_models::kiln_threads().c_str(), o.threads);
  print_loads(rounds, o);
  std::printf("%-28s %12s %12s %14s\n", "case", "median ms", "min ms", "vs torch (med)");
  const auto torch = rounds.times.find("torch_eager_loop");
  const double tm = torch != rounds.times.end() ? median(torch->second) : 0;
  for (const auto& [k, ts] : rounds.times) {
    if (k.rfind("tiny_", 0) == 0) continue;
    std::printf("%-28s %12.3f %12.3f %14s\n", k.c_str(), median(ts), minimum(ts),
                tm > 0 ? (std::to_string(median(ts) / tm).substr(0, 5) + "x").c_str() : "-");
  }
  if (!tiny_cases.empty()) {
    std::printf("\nper-step overhead, %lld steps, carry f32[16] (per step)\n",
                (long long)tiny_steps);
    std::printf("%-28s %12s %12s\n", "case", "median us", "min us");
    for (const std::string& k : tiny_cases) {
      const std::vector<double>& ts = rounds.times.at(k);
      std::printf("%-28s %12.3f %12.3f\n", k.c_str(), median(ts) * 1e3 / double(tiny_steps),
                  minimum(ts) * 1e3 / double(tiny_steps));
    }
  }
  if (timing_only) return 0;

  std::printf("\ncompilation (fresh jit, .lower(): trace of grad + optimise), ms\n");
  std::printf("%8s %12s %14s %10s %12s\n", "steps", "scan", "unrolled", "scan eqns", "unr eqns");
  for (int64_t T : {10, 100, 1000}) {
    const Tensor x = xs_of(T);
    double ts = 1e30, tu = 1e30;
    std::size_t ns = 0, nu = 0;
    for (int r = 0; r < 3; ++r) {
      auto fs = jit(grad([](const Tensor& wh, const Tensor& wx, const Tensor& b,
                            const Tensor& xs) { return loss_scan(wh, wx, b, xs, 1); },
                         argnums<0, 1, 2>));
      auto t0 = Clock::now();
      ir::Function f1 = fs.lower(wh, wx, b, x);
      ts = std::min(ts, seconds(t0, Clock::now()) * 1e3);
      ns = f1.equations.size();
      auto fu = jit(grad(loss_unrolled, argnums<0, 1, 2>));
      t0 = Clock::now();
      ir::Function f2 = fu.lower(wh, wx, b, x);
      tu = std::min(tu, seconds(t0, Clock::now()) * 1e3);
      nu = f2.equations.size();
      if (T == 1000) break;
    }
    std::printf("%8lld %12.2f %14.2f %10zu %12zu\n", (long long)T, ts, tu, ns, nu);
  }

  // Memory of reverse mode through a long scan, with and without kiln::checkpoint(body).
  // Body with intermediates: n1 = tanh(h @ Wh + x @ Wx + b); h' = tanh(n1 @ Wh). Steps 1000.
  {
    const int64_t T = 1000;
    const Tensor x = xs_of(T);
    auto body = [](const Tensor& wh, const Tensor& wx, const Tensor& b, const Tensor& h,
                   const Tensor& xt) {
      const Tensor n1 = tanh(matmul(h, wh) + matmul(xt, wx) + b);
      return tanh(matmul(n1, wh));
    };
    auto loss_plain = [&](const Tensor& wh, const Tensor& wx, const Tensor& b, const Tensor& xs) {
      return sum(scan(
                     [&](const Tensor& h, const Tensor& xt) {
                       return std::pair{body(wh, wx, b, h, xt), std::tuple<>{}};
                     },
                     zeros({B, H}, float32), xs)
                     .first);
    };
    auto loss_ckpt = [&](const Tensor& wh, const Tensor& wx, const Tensor& b, const Tensor& xs) {
      auto cb = checkpoint(body);
      return sum(scan(
                     [&](const Tensor& h, const Tensor& xt) {
                       return std::pair{cb(wh, wx, b, h, xt), std::tuple<>{}};
                     },
                     zeros({B, H}, float32), xs)
                     .first);
    };
    auto loss_unr = [&](const Tensor& wh, const Tensor& wx, const Tensor& b, const Tensor& xs) {
      Tensor h = zeros({B, H}, float32);
      for (int64_t t = 0; t < T; ++t) h = body(wh, wx, b, h, index(xs, t));
      return sum(h);
    };
    auto peak = [&](auto&& f) {
      {
        auto warm = f(wh, wx, b, x);  // compile outside the measurement
      }
      const int64_t base = memory_stats().bytes_in_use;
      reset_peak_memory_stats();
      { auto r = f(wh, wx, b, x); }
      return (memory_stats().peak_bytes_in_use - base) / 1e6;
    };
    auto gp = jit(grad(loss_plain, argnums<0, 1, 2>));
    auto gc = jit(grad(loss_ckpt, argnums<0, 1, 2>));
    auto gu = jit(grad(loss_unr, argnums<0, 1, 2>));
    auto [p1, p2, p3] = gp(wh, wx, b, x);
    auto [c1, c2, c3] = gc(wh, wx, b, x);
    double md = 0;
    const auto u = p1.to_vector<float>(), v = c1.to_vector<float>();
    for (std::size_t i = 0; i < u.size(); ++i) md = std::max(md, double(std::abs(u[i] - v[i])));
    std::printf(
        "\nreverse-mode peak memory above the inputs, %lld steps, carry %lld x %lld f32 "
        "(%.2f MB/step; xs %.1f MB are inputs)\n",
        (long long)T, (long long)B, (long long)H, B * H * 4 / 1e6, T * B * D * 4 / 1e6);
    std::printf("  jit(grad) scan(body)              %8.1f MB\n", peak(gp));
    std::printf("  jit(grad) scan(checkpoint(body))  %8.1f MB   (max |dWh diff| %.3g)\n", peak(gc),
                md);
    std::printf("  jit(grad) unrolled C++ loop       %8.1f MB\n", peak(gu));
    std::printf("  grad (no jit) scan(body)          %8.1f MB\n",
                peak(grad(loss_plain, argnums<0, 1, 2>)));
    std::printf("  grad (no jit) scan(checkpoint)    %8.1f MB\n",
                peak(grad(loss_ckpt, argnums<0, 1, 2>)));
  }
  return 0;
}
