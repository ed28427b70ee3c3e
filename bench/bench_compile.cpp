// Compile time: how long the first call of a jitted training step takes beyond a
// steady-state call, cold and with a warm on-disk compile cache (KILN_CACHE_DIR).
//
//   build/bench/bench_compile                # the table below
//   options: --reps R (processes per cold / warm measurement, default 3),
//            --only mlp|demo, --backends llvm,interpreter (default both)
//   (R processes: each measurement is a pair of processes, one timing calls, one .lower())
//   internal: --child call|lower MODEL BACKEND (one measurement in this process, printed as a
//             COMPILE line)
//
// Steps: examples/demo.cpp's training step (value_and_grad of cross-entropy with accuracy as
// aux, then optim::adam with cosine decay), jitted, for
//   mlp   784-512-512-10 relu (`demo --model mlp`), batch 128
//   demo  the demo's CNN (conv3x3 32, pool, conv3x3 64, pool, 3136-128-10), batch 64
// Every measurement runs in a fresh process (this binary with --child), so nothing a previous
// compile left in memory (LLVM's initialisation, an in-process cache) is reused; the child
// times the first call of a fresh jit and then 9 more calls, and reports
// compile = first call - median of the later calls. A second kind of child times only
// jit(step).lower(args) on a fresh jit (trace + optimise, and whatever compiling jit does
// before it first runs the step: no execution noise). Per backend:
//   cold        KILN_CACHE_DIR unset                                 (R processes)
//   populate    KILN_CACHE_DIR = an empty temporary folder           (1 process, writes it)
//   warm        KILN_CACHE_DIR = that folder, written by the process before (R processes)
// The interpreter has no cache on disk: its "compile" is the trace and the IR optimisation,
// measured cold only. The table gives the median (and min) over the R processes.
#include <kiln/kiln.h>
#include <kiln/optim.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "models.h"
#include "side_by_side.h"

namespace {

using namespace kiln;
namespace fs = std::filesystem;
using side_by_side::Clock;

struct Measurement {
  double first_ms = 0, steady_ms = 0;
  int64_t equations = 0;  // of the optimised IR (lower only)
};

// Times `step` (a jitted function of args...) as measure() does the training step.
template <class J, class... A>
Measurement time_calls(bool lower_only, const J& step, const A&... args) {
  Measurement r;
  if (lower_only) {
    const auto t0 = Clock::now();
    const ir::Function f = step.lower(args...);
    r.first_ms = std::chrono::duration<double>(Clock::now() - t0).count() * 1e3;
    r.equations = static_cast<int64_t>(f.equations.size());
    return r;
  }
  auto call = [&] {
    const auto t0 = Clock::now();
    (void)std::get<0>(step(args...)).template item<double>();
    return std::chrono::duration<double>(Clock::now() - t0).count() * 1e3;
  };
  r.first_ms = call();
  std::vector<double> later;
  for (int i = 0; i < 9; ++i) later.push_back(call());
  r.steady_ms = side_by_side::median(later);
  return r;
}

// A long straight-line program: value_and_grad of `steps` RK4 steps of y' = -k y + sin y,
// unrolled at trace time (a Python `for` over a concrete range does the same).
Measurement measure_rk4(bool lower_only, int steps) {
  auto f = [steps](const Tensor& y0, const Tensor& k) {
    auto rhs = [&](const Tensor& y) { return -k * y + sin(y); };
    Tensor y = y0;
    const float h = 0.01f;
    for (int i = 0; i < steps; ++i) {
      const Tensor a = rhs(y), b = rhs(y + h / 2 * a), c = rhs(y + h / 2 * b), d = rhs(y + h * c);
      y = y + h / 6 * (a + 2.0f * b + 2.0f * c + d);
    }
    return sum(y);
  };
  const auto step = jit(value_and_grad(f, argnums<0, 1>), "rk4");
  return time_calls(lower_only, step, random::normal(random::key(1), {8}), tensor(0.5f));
}

template <class M>
Measurement measure(bool lower_only, const M& model, const Tensor& x, const Tensor& y) {
  struct State {
    M model;
    optim::OptState<M> optimizer;
  };
  const optim::Optimizer opt = optim::adam({.lr = optim::cosine_decay(1e-3, 5 * 937)});
  // The demo's step (examples/demo.cpp), on (model, optimizer state) as a tuple.
  auto step = jit(
      [&opt](const M& m, const optim::OptState<M>& s, const Tensor& x, const Tensor& y) {
        auto loss_fn = [&](const M& net) {
          const Tensor logits = net(x);
          return std::pair{nn::cross_entropy(logits, y), nn::accuracy(logits, y)};
        };
        auto [loss_acc, grads] = value_and_grad(loss_fn, has_aux)(m);
        auto [m2, s2] = opt.update(m, grads, s);
        return std::tuple{m2, s2, loss_acc.first, loss_acc.second};
      },
      "train_step");
  M m = model;
  optim::OptState<M> s = opt.init(model);
  Tensor loss, acc;
  auto call = [&] {
    const auto t0 = Clock::now();
    std::tie(m, s, loss, acc) = step(m, s, x, y);
    (void)loss.item<double>();  // the step's results are ready
    return std::chrono::duration<double>(Clock::now() - t0).count() * 1e3;
  };
  Measurement r;
  if (lower_only) {
    const auto t0 = Clock::now();
    r.equations = static_cast<int64_t>(step.lower(m, s, x, y).equations.size());
    r.first_ms = std::chrono::duration<double>(Clock::now() - t0).count() * 1e3;
    return r;
  }
  r.first_ms = call();
  std::vector<double> later;
  for (int i = 0; i < 9; ++i) later.push_back(call());
  r.steady_ms = side_by_side::median(later);
  return r;
}

int child(const std::string& mode, const std::string& model, const std::string& backend) {
  bench_models::BackendScope scope(backend);
  const bool lower_only = mode == "lower";
  Measurement r;
  if (model.rfind("rk4_", 0) == 0)
    r = measure_rk4(lower_only, std::stoi(model.substr(4)));
  else if (model == "mlp")
    r = measure(lower_only, bench_models::make_mlp(random::key(0)),
                random::normal(random::key(1), {128, 784}),
                random::randint(random::key(2), {128}, 0, 10, int64));
  else
    r = measure(lower_only, bench_models::make_demo_cnn(random::key(0)),
                random::normal(random::key(1), {64, 1, 28, 28}),
                random::randint(random::key(2), {64}, 0, 10, int64));
  std::printf("COMPILE %s %s %.3f %.3f %lld\n", model.c_str(), backend.c_str(), r.first_ms,
              r.steady_ms, static_cast<long long>(r.equations));
  return 0;
}

// Runs `self --child mode model backend` with KILN_CACHE_DIR = cache_dir (unset when empty).
std::optional<Measurement> run_child(const std::string& self, const std::string& mode,
                                     const std::string& model, const std::string& backend,
                                     const std::string& cache_dir) {
  const std::string cmd =
      (cache_dir.empty() ? "env -u KILN_CACHE_DIR " : "env KILN_CACHE_DIR='" + cache_dir + "' ") +
      "'" + self + "' --child " + mode + " " + model + " " + backend + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return std::nullopt;
  std::optional<Measurement> r;
  char line[4096];
  while (std::fgets(line, sizeof line, p)) {
    std::istringstream in(line);
    std::string tag, m, b;
    Measurement x;
    if (in >> tag >> m >> b >> x.first_ms >> x.steady_ms >> x.equations && tag == "COMPILE")
      r = x;
    else
      std::fputs(line, stderr);
  }
  if (pclose(p) != 0) return std::nullopt;
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 5 && std::string(argv[1]) == "--child") return child(argv[2], argv[3], argv[4]);
  int reps = 3;
  std::vector<std::string> models{"mlp", "demo", "rk4_100", "rk4_1000"},
      backends{"llvm", "interpreter"};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const std::string v = i + 1 < argc ? argv[i + 1] : "";
    if (a == "--reps" && !v.empty())
      reps = std::max(1, std::stoi(v)), ++i;
    else if (a == "--only" && (v == "mlp" || v == "demo" || v == "rk4"))
      models = v == "rk4" ? std::vector<std::string>{"rk4_100", "rk4_1000"}
                          : std::vector<std::string>{v},
      ++i;
    else if (a == "--backends" && !v.empty()) {
      backends.clear();
      std::istringstream in(v);
      for (std::string b; std::getline(in, b, ',');) backends.push_back(b);
      ++i;
    } else {
      std::fprintf(stderr,
                   "usage: bench_compile [--reps R] [--only mlp|demo|rk4] [--backends "
                   "llvm,interpreter]\n");
      return 2;
    }
  }
  const std::string self = fs::read_symlink("/proc/self/exe").string();

  struct Row {
    std::string label;
    std::vector<double> compile, first, steady, lower;
    int64_t equations = 0;
  };
  std::vector<Row> rows;
  bool ok = true;
  // One call-child and one lower-child with this cache folder.
  auto record = [&](Row& row, const std::string& model, const std::string& backend,
                    const std::string& cache) {
    const std::optional<Measurement> m = run_child(self, "call", model, backend, cache);
    const std::optional<Measurement> l = run_child(self, "lower", model, backend, cache);
    if (!m || !l) {
      ok = false;
      return;
    }
    row.compile.push_back(m->first_ms - m->steady_ms);
    row.first.push_back(m->first_ms);
    row.steady.push_back(m->steady_ms);
    row.lower.push_back(l->first_ms);
    row.equations = l->equations;
  };
  const std::string load0 = side_by_side::load();
  for (const std::string& model : models)
    for (const std::string& backend : backends) {
      Row cold{model + " " + backend + " cold", {}, {}, {}, {}, 0};
      for (int r = 0; r < reps; ++r) record(cold, model, backend, "");
      rows.push_back(cold);
      if (backend == "interpreter") continue;
      char tmpl[] = "/tmp/kiln_bench_cache_XXXXXX";
      if (!mkdtemp(tmpl)) {
        std::perror("mkdtemp");
        return 1;
      }
      Row populate{model + " " + backend + " populate", {}, {}, {}, {}, 0};
      record(populate, model, backend, tmpl);
      Row warm{model + " " + backend + " warm cache", {}, {}, {}, {}, 0};
      for (int r = 0; r < reps; ++r) record(warm, model, backend, tmpl);
      std::uintmax_t bytes = 0;
      for (const auto& e : fs::recursive_directory_iterator(tmpl))
        if (e.is_regular_file()) bytes += e.file_size();
      populate.label += " (" + std::to_string(bytes / 1024) + " KiB on disk)";
      rows.push_back(populate);
      rows.push_back(warm);
      fs::remove_all(tmpl);
    }

  std::printf(
      "# compile time of the demo's training step (adam + cosine decay, loss + accuracy): first "
      "call - median of 9 later calls, each in a fresh process; Kiln threads %s\n",
      bench_models::kiln_threads().c_str());
  std::printf(
      "# lower ms: fresh jit .lower() in a fresh process (trace + optimise + what jit compiles "
      "before the first run)\n");
  std::printf("# mlp 784-512-512-10 batch 128, demo = the demo's CNN batch 64; load %s -> %s\n",
              load0.c_str(), side_by_side::load().c_str());
  std::printf(
      "# rk4_N: value_and_grad of N RK4 steps unrolled at trace time; eqs: equations of "
      "the optimised IR, ms/eq: first call / eqs (target <= 1)\n");
  std::printf("%-46s %5s %11s %8s %10s %10s %9s %8s %7s %6s\n", "case", "procs", "compile ms",
              "(min)", "first ms", "steady ms", "lower ms", "(min)", "eqs", "ms/eq");
  for (const Row& r : rows) {
    if (r.compile.empty()) {
      std::printf("%-46s %5s %11s\n", r.label.c_str(), "0", "(failed)");
      continue;
    }
    std::printf(
        "%-46s %5zu %11.1f %8.1f %10.1f %10.2f %9.1f %8.1f %7lld %6.3f\n", r.label.c_str(),
        r.compile.size(), side_by_side::median(r.compile), side_by_side::minimum(r.compile),
        side_by_side::median(r.first), side_by_side::median(r.steady),
        side_by_side::median(r.lower), side_by_side::minimum(r.lower),
        static_cast<long long>(r.equations),
        side_by_side::median(r.first) / static_cast<double>(std::max<int64_t>(r.equations, 1)));
  }
  if (!ok) std::fprintf(stderr, "a measurement failed (see the messages above)\n");
  return ok ? 0 : 1;
}
