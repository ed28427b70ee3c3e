// A scan RNN against the same loop unrolled at trace time and PyTorch 1.13 eager (Python loop),
// forward + backward; and compilation time (first-call trace + optimise) against step count.
//
//   build/bench/bench_scan                   # Kiln, then bench/scan_torch.py, then the table
//   options: --reps R (default 7), --target S (seconds per timed batch, default 0.3),
//            --threads T (torch.set_num_threads, default 1), --py PATH (default /usr/bin/python3;
//            "none" skips PyTorch), --unroll K (also time scan with ScanOptions{.unroll = K})
//
// Problem: h = tanh(h @ Wh + x_t @ Wx + b), hidden 256, input 256, batch 32, 100 steps,
// float32, h0 = 0; loss = sum of the final h; gradient w.r.t. (Wh, Wx, b).
//   kiln_jit_scan        jit(grad(loss)) with the loop as kiln::scan
//   kiln_jit_unrolled    jit(grad(loss)) with a C++ for loop inside the jitted function
//   torch_eager_loop     bench/scan_torch.py: Python loop, loss.backward()
// Compilation: jit(...).lower(args) on a fresh jit (trace of grad + ir::optimize; nothing runs)
// for 10, 100 and 1000 steps, scan vs unrolled (unrolled 1000 is included).
#include <kiln/kiln.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#ifndef KILN_SOURCE_DIR
#define KILN_SOURCE_DIR "."
#endif

using namespace kiln;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int64_t B = 32, H = 256, D = 256;

Tensor loss_scan(const Tensor& wh, const Tensor& wx, const Tensor& b, const Tensor& xs,
                 int64_t unroll) {
  auto [h, ys] = scan([&](const Tensor& h, const Tensor& x) {
    return std::pair{tanh(matmul(h, wh) + matmul(x, wx) + b), std::tuple<>{}};
  }, zeros({B, H}, float32), xs, ScanOptions{.unroll = unroll});
  return sum(h);
}
Tensor loss_unrolled(const Tensor& wh, const Tensor& wx, const Tensor& b, const Tensor& xs) {
  Tensor h = zeros({B, H}, float32);
  for (int64_t t = 0; t < xs.shape()[0]; ++t) h = tanh(matmul(h, wh) + matmul(index(xs, t), wx) + b);
  return sum(h);
}

double seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Median and min per-call ms over `reps` batches of calls sized to ~target seconds.
std::pair<double, double> time_ms(const std::function<void()>& f, int reps, double target) {
  f();
  f();
  auto t0 = Clock::now();
  f();
  const double one = std::max(seconds(t0, Clock::now()), 1e-6);
  const int n = std::max(1, static_cast<int>(target / one));
  std::vector<double> v;
  for (int r = 0; r < reps; ++r) {
    t0 = Clock::now();
    for (int i = 0; i < n; ++i) f();
    v.push_back(seconds(t0, Clock::now()) * 1e3 / n);
  }
  std::sort(v.begin(), v.end());
  return {v[v.size() / 2], v.front()};
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 7, threads = 1;
  int64_t unroll = 0;
  double target = 0.3;
  std::string py = "/usr/bin/python3";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] { return std::string(i + 1 < argc ? argv[++i] : ""); };
    if (a == "--reps") reps = std::stoi(next());
    else if (a == "--target") target = std::stod(next());
    else if (a == "--threads") threads = std::stoi(next());
    else if (a == "--py") py = next();
    else if (a == "--unroll") unroll = std::stoll(next());
  }
  const Tensor wh = random::normal(random::key(1), {H, H}, float32) * (1.0 / 16);
  const Tensor wx = random::normal(random::key(2), {D, H}, float32) * (1.0 / 16);
  const Tensor b = zeros({H}, float32);
  auto xs_of = [](int64_t T) { return random::normal(random::key(3), {T, B, D}, float32); };
  const Tensor xs = xs_of(100);

  std::map<std::string, std::pair<double, double>> res;
  auto g_scan = jit(grad([](const Tensor& wh, const Tensor& wx, const Tensor& b, const Tensor& xs) {
    return loss_scan(wh, wx, b, xs, 1); }, argnums<0, 1, 2>));
  auto g_unr = jit(grad(loss_unrolled, argnums<0, 1, 2>));
  {  // agreement
    auto [a1, a2, a3] = g_scan(wh, wx, b, xs);
    auto [c1, c2, c3] = g_unr(wh, wx, b, xs);
    double md = 0;
    const auto u = a1.to_vector<float>(), v = c1.to_vector<float>();
    for (std::size_t i = 0; i < u.size(); ++i) md = std::max(md, double(std::abs(u[i] - v[i])));
    std::printf("max |dWh scan - dWh unrolled| = %.3g\n", md);
  }
  res["kiln_jit_scan"] = time_ms([&] { auto r = g_scan(wh, wx, b, xs); (void)r; }, reps, target);
  res["kiln_jit_unrolled"] = time_ms([&] { auto r = g_unr(wh, wx, b, xs); (void)r; }, reps, target);
  if (unroll > 1) {
    auto g_u = jit(grad([unroll](const Tensor& wh, const Tensor& wx, const Tensor& b, const Tensor& xs) {
      return loss_scan(wh, wx, b, xs, unroll); }, argnums<0, 1, 2>));
    res["kiln_jit_scan_unroll" + std::to_string(unroll)] =
        time_ms([&] { auto r = g_u(wh, wx, b, xs); (void)r; }, reps, target);
  }
  if (py != "none") {
    const std::string cmd = py + " " KILN_SOURCE_DIR "/bench/scan_torch.py --reps " +
                            std::to_string(reps) + " --threads " + std::to_string(threads) +
                            " --target " + std::to_string(target) + " 2>&1";
    if (FILE* p = popen(cmd.c_str(), "r")) {
      char line[4096];
      while (fgets(line, sizeof line, p)) {
        std::istringstream is(line);
        std::string tag, name;
        double med, mn;
        if (is >> tag >> name >> med >> mn && tag == "RESULT") res[name] = {med, mn};
        else std::fputs(line, stdout);
      }
      pclose(p);
    }
  }
  std::printf("\nRNN hidden %lld, input %lld, batch %lld, 100 steps, f32, fwd+bwd (per call)\n",
              (long long)H, (long long)D, (long long)B);
  std::printf("%-28s %12s %12s %14s\n", "case", "median ms", "min ms", "vs torch (med)");
  const double tm = res.count("torch_eager_loop") ? res["torch_eager_loop"].first : 0;
  for (auto& [k, v] : res)
    std::printf("%-28s %12.3f %12.3f %14s\n", k.c_str(), v.first, v.second,
                tm > 0 ? (std::to_string(v.first / tm).substr(0, 5) + "x").c_str() : "-");

  std::printf("\ncompilation (fresh jit, .lower(): trace of grad + optimise), ms\n");
  std::printf("%8s %12s %14s %10s %12s\n", "steps", "scan", "unrolled", "scan eqns", "unr eqns");
  for (int64_t T : {10, 100, 1000}) {
    const Tensor x = xs_of(T);
    double ts = 1e30, tu = 1e30;
    std::size_t ns = 0, nu = 0;
    for (int r = 0; r < 3; ++r) {
      auto fs = jit(grad([](const Tensor& wh, const Tensor& wx, const Tensor& b, const Tensor& xs) {
        return loss_scan(wh, wx, b, xs, 1); }, argnums<0, 1, 2>));
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
      return sum(scan([&](const Tensor& h, const Tensor& xt) {
        return std::pair{body(wh, wx, b, h, xt), std::tuple<>{}}; }, zeros({B, H}, float32), xs).first);
    };
    auto loss_ckpt = [&](const Tensor& wh, const Tensor& wx, const Tensor& b, const Tensor& xs) {
      auto cb = checkpoint(body);
      return sum(scan([&](const Tensor& h, const Tensor& xt) {
        return std::pair{cb(wh, wx, b, h, xt), std::tuple<>{}}; }, zeros({B, H}, float32), xs).first);
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
      const int64_t base = memory_stats().current_bytes;
      reset_peak_memory();
      {
        auto r = f(wh, wx, b, x);
      }
      return (memory_stats().peak_bytes - base) / 1e6;
    };
    auto gp = jit(grad(loss_plain, argnums<0, 1, 2>));
    auto gc = jit(grad(loss_ckpt, argnums<0, 1, 2>));
    auto gu = jit(grad(loss_unr, argnums<0, 1, 2>));
    auto [p1, p2, p3] = gp(wh, wx, b, x);
    auto [c1, c2, c3] = gc(wh, wx, b, x);
    double md = 0;
    const auto u = p1.to_vector<float>(), v = c1.to_vector<float>();
    for (std::size_t i = 0; i < u.size(); ++i) md = std::max(md, double(std::abs(u[i] - v[i])));
    std::printf("\nreverse-mode peak memory above the inputs, %lld steps, carry %lld x %lld f32 "
                "(%.2f MB/step; xs %.1f MB are inputs)\n", (long long)T, (long long)B,
                (long long)H, B * H * 4 / 1e6, T * B * D * 4 / 1e6);
    std::printf("  jit(grad) scan(body)              %8.1f MB\n", peak(gp));
    std::printf("  jit(grad) scan(checkpoint(body))  %8.1f MB   (max |dWh diff| %.3g)\n", peak(gc), md);
    std::printf("  jit(grad) unrolled C++ loop       %8.1f MB\n", peak(gu));
    std::printf("  grad (no jit) scan(body)          %8.1f MB\n", peak(grad(loss_plain, argnums<0, 1, 2>)));
    std::printf("  grad (no jit) scan(checkpoint)    %8.1f MB\n", peak(grad(loss_ckpt, argnums<0, 1, 2>)));
  }
  return 0;
}
