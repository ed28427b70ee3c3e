// The timing harness shared by the side-by-side benchmarks (bench_vmap, bench_scan, bench_train):
// Kiln's cases are timed in this process, a PyTorch script (bench/*_torch.py, timing with
// bench/side_by_side.py) in a child process between Kiln's rounds, and both report per-call
// milliseconds of each repetition, from which the tables give medians, minima and ratios.
//
// Timing: every case is warmed up, then timed in repetitions of a batch of calls sized to take
// ~target seconds, cases interleaved repetition by repetition; one round is `reps` such
// repetitions of every Kiln case followed by one run of the PyTorch script, which prints
//     TIMES <name> <ms of each repetition ...>
// (and RESULT <name> <median ms> <min ms>, its own summary, which is skipped here).
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <iostream>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/runtime.h"
#include "kiln/tensor.h"

#ifndef KILN_SOURCE_DIR
#define KILN_SOURCE_DIR "."
#endif

namespace side_by_side {

using Clock = std::chrono::steady_clock;
// Per-case milliseconds per call, one entry per timed repetition.
using Times = std::map<std::string, std::vector<double>>;

struct Case {
  std::string name;
  std::function<void()> run;
  int64_t calls = 1;  // calls per timed repetition (set by calibrate)
};

inline double seconds_of(const std::function<void()>& f, int64_t n) {
  const auto t0 = Clock::now();
  for (int64_t i = 0; i < n; ++i) f();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

inline double median(std::vector<double> v) {
  if (v.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

inline double minimum(const std::vector<double>& v) {
  return v.empty() ? std::numeric_limits<double>::quiet_NaN()
                   : *std::min_element(v.begin(), v.end());
}

// The 1/5/15-minute load averages, "a b c".
inline std::string load() {
  FILE* f = std::fopen("/proc/loadavg", "r");
  if (!f) return "?";
  char buf[128] = {0};
  const char* ok = std::fgets(buf, sizeof buf, f);
  std::fclose(f);
  std::istringstream in(ok ? buf : "?");
  std::string a, b, c;
  in >> a >> b >> c;
  return a + " " + b + " " + c;
}

// The flags every side-by-side benchmark takes; defaults differ per benchmark.
struct Options {
  int reps = 5;                         // --reps: repetitions per round
  int rounds = 3;                       // --rounds: Kiln / PyTorch alternations
  int threads = 2;                      // --threads: torch.set_num_threads of the peer
  double target = 0.2;                  // --target: seconds per timed batch of calls
  std::string py = "/usr/bin/python3";  // --py: the Python with torch; "none" skips the peer
};

// Reads the common flags into `o`; any other flag goes to `extra(flag, next)` (next() takes
// the flag's value), which returns false for a flag it does not know. False on a bad flag.
inline bool parse_options(
    int argc, char** argv, Options& o,
    const std::function<bool(const std::string&, const std::function<std::string()>&)>& extra =
        {}) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const std::function<std::string()> next = [&] {
      return i + 1 < argc ? std::string(argv[++i]) : std::string();
    };
    if (a == "--reps")
      o.reps = std::stoi(next());
    else if (a == "--rounds")
      o.rounds = std::stoi(next());
    else if (a == "--target")
      o.target = std::stod(next());
    else if (a == "--threads")
      o.threads = std::stoi(next());
    else if (a == "--py")
      o.py = next();
    else if (!extra || !extra(a, next)) {
      std::cerr << "unknown option " << a << "\n";
      return false;
    }
  }
  return true;
}

// Warms each case up, then sizes its batch of calls to ~target seconds from one timed call.
inline void calibrate(std::vector<Case>& cases, double target, int warmups = 3) {
  for (Case& c : cases) {
    for (int i = 0; i < warmups; ++i) c.run();
    c.calls =
        std::max<int64_t>(1, static_cast<int64_t>(target / std::max(seconds_of(c.run, 1), 1e-6)));
  }
}

// Runs `KILN_SOURCE_DIR/bench/<script> --reps R --threads T --target S <args>` once and appends
// each case's per-repetition times. Lines other than TIMES and RESULT go to `other` (stderr
// when unset). True when the script exited 0 and reported at least one case.
inline bool run_peer(const Options& o, const std::string& script, const std::string& args,
                     Times& times, const std::function<void(const std::string&)>& other = {}) {
  // The peer runs the same OpenBLAS kernels as Kiln (which corrects OpenBLAS's choice on CPUs
  // it does not know: kiln::blas_kernels), so that matmul-bound cases compare like with like.
  const std::string blas =
      std::getenv("OPENBLAS_CORETYPE") ? "" : "OPENBLAS_CORETYPE=" + kiln::blas_kernels() + " ";
  const std::string cmd = blas + o.py + " " KILN_SOURCE_DIR "/bench/" + script + " --reps " +
                          std::to_string(o.reps) + " --threads " + std::to_string(o.threads) +
                          " --target " + std::to_string(o.target) + (args.empty() ? "" : " ") +
                          args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return false;
  char line[1 << 16];
  bool any = false;
  while (std::fgets(line, sizeof line, p)) {
    std::istringstream in(line);
    std::string tag, name;
    in >> tag >> name;
    if (tag == "RESULT") continue;  // the script's own summary; the caller's table has it
    if (tag != "TIMES") {
      if (other)
        other(line);
      else
        std::fputs(line, stderr);
      continue;
    }
    double t;
    while (in >> t) times[name].push_back(t);
    any = true;
  }
  return pclose(p) == 0 && any;
}

struct Rounds {
  Times times;
  std::vector<std::string> loads;  // at the start of each round, and at the end
  bool peer_ok = false;            // the peer ran (and reported) in every round
};

// `o.rounds` rounds: `o.reps` interleaved repetitions of every (calibrated) case, then
// `peer(times)` unless o.py is "none"; after a failed peer run, the peer is not run again.
inline Rounds run_rounds(const std::vector<Case>& cases, const Options& o,
                         const std::function<bool(Times&)>& peer) {
  Rounds r;
  r.peer_ok = o.py != "none";
  for (int round = 0; round < o.rounds; ++round) {
    r.loads.push_back(load());
    for (int k = 0; k < o.reps; ++k)
      for (const Case& c : cases)
        r.times[c.name].push_back(seconds_of(c.run, c.calls) / double(c.calls) * 1e3);
    if (r.peer_ok) r.peer_ok = peer(r.times);
  }
  r.loads.push_back(load());
  return r;
}

// "# R rounds x N reps; load average (1/5/15 min) per round: [a b c] ..."
// run_rounds with a training peer that also prints "LOSSES <case> l0 l1 ..." (its first
// losses from the same start as Kiln's, every round): the rounds, and the last losses per case.
struct TrainingRounds {
  Rounds rounds;
  std::map<std::string, std::vector<double>> losses;
};
inline TrainingRounds run_training_rounds(const std::vector<Case>& cases, const Options& o,
                                          const std::string& script, const std::string& args) {
  TrainingRounds t;
  t.rounds = run_rounds(cases, o, [&](Times& times) {
    return run_peer(o, script, args, times, [&](const std::string& line) {
      std::istringstream in(line);
      std::string tag, name;
      in >> tag >> name;
      if (tag != "LOSSES") return (void)std::fputs(line.c_str(), stderr);
      std::vector<double>& v = t.losses[name];
      v.clear();
      for (double d; in >> d;) v.push_back(d);
    });
  });
  return t;
}

// " v0 v1 ..." with `digits` significant digits: a row of losses.
inline std::string join(const std::vector<double>& v, int digits) {
  std::ostringstream out;
  out.precision(digits);
  for (double d : v) out << " " << d;
  return out.str();
}

inline void print_loads(const Rounds& r, const Options& o) {
  std::printf("# %d rounds x %d reps; load average (1/5/15 min) per round:", o.rounds, o.reps);
  for (const std::string& l : r.loads) std::printf(" [%s]", l.c_str());
  std::printf("\n");
}

// The table of a side-by-side run: per operation, a row for each side that ran it ("<side><op>",
// the cases' names) with its median and fastest time and its median against the peer's
// ("torch_<op>"; nan where the peer did not run), then a note when the peer failed.
inline void print_against_peer(const Rounds& r, const Options& o,
                               std::initializer_list<std::string_view> ops,
                               std::initializer_list<std::string_view> sides, int width) {
  std::printf("%-*s %10s %10s %10s\n", width, "case", "median ms", "min ms", "vs torch");
  for (const std::string_view op : ops) {
    const auto peer = r.times.find("torch_" + std::string(op));
    const double t = peer == r.times.end() ? NAN : median(peer->second);
    for (const std::string_view side : sides) {
      const auto it = r.times.find(std::string(side) + std::string(op));
      if (it == r.times.end()) continue;
      std::printf("%-*s %10.2f %10.2f %9.2fx\n", width, it->first.c_str(), median(it->second),
                  minimum(it->second), median(it->second) / t);
    }
  }
  if (!r.peer_ok && o.py != "none")
    std::printf("# (the PyTorch peer did not run: see the messages above)\n");
}

// Writes t's elements raw (little-endian int64 or float32) for the peer, which reads them with
// side_by_side.read_raw: the initial parameters and the batch that both sides start from.
inline void write_raw(const std::filesystem::path& path, const kiln::Tensor& t) {
  std::ofstream out(path, std::ios::binary);
  if (t.dtype() == kiln::int64) {
    const auto v = t.to_vector<int64_t>();
    out.write(reinterpret_cast<const char*>(v.data()), std::streamsize(v.size() * sizeof(int64_t)));
  } else {
    const auto v = t.to_vector<float>();
    out.write(reinterpret_cast<const char*>(v.data()), std::streamsize(v.size() * sizeof(float)));
  }
}

}  // namespace side_by_side
