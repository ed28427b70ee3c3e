// All-reduce of a float32 buffer through psum in a pmapped (hence jitted) function
// against a bare MPI_Allreduce of the same size with preallocated buffers, in the same run.
//
//   mpirun --allow-run-as-root --oversubscribe -np 2 build/bench/bench_allreduce
//   options: --sizes LIST (default 1MB,16MB,256MB; units B, KB, MB = 2^0, 2^10, 2^20 bytes),
//            --reps R (timed repetitions per side, default 9), --target S (seconds per timed
//            batch of calls, default 0.2), --threads T (Kiln's thread count, default 1),
//            --sides LIST (of bare, psum, local; default all three: one side alone is for
//            profiling it with perf)
//
//   bare   MPI_Allreduce(send, recv, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD), both buffers
//          allocated and touched once, up front
//   psum   f(x) with f = pmap([](x) { return psum(x, "dp"); }, axis_name("dp")) and x the
//          process's [1, n] slice; the result is dropped after each call, as a training step
//          drops its gradients
//   local  MPI_Reduce_local(send, recv, n, MPI_FLOAT, MPI_SUM): no communication, the cost of
//          the additions alone (the gamma of the alpha-beta-gamma model, docs/DISTRIBUTED.md)
// Timing: after a warm-up (which compiles f), repetitions of a batch of calls sized to ~target
// seconds, the sides interleaved (in the order given in even repetitions, reversed in odd
// ones); each repetition starts with a barrier and its time is the slowest process's. Reported
// per side: median and minimum per call, the algorithm bandwidth bytes / time (for local: the
// rate of the additions), the bus bandwidth 2 (P - 1) / P · bytes / time (what each process
// sends and receives in a ring or Rabenseifner all-reduce; NCCL's convention), and "vs bare",
// the bandwidth relative to bare's, i.e. bare's median time / this side's (psum's goal:
// >= 0.9x).
#include <kiln/distributed.h>
#include <kiln/kiln.h>
// The MPI C API only (OpenMPI's C++ bindings are deprecated and would need their library).
#define OMPI_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "side_by_side.h"

using namespace kiln;
using side_by_side::median;
using side_by_side::minimum;

namespace {

struct Size {
  std::string label;
  int64_t bytes;
};

// "1MB" -> {"1MB", 1 << 20}; units B, KB, MB (powers of 2).
std::optional<Size> parse_size(const std::string& s) {
  std::size_t digits = 0;
  while (digits < s.size() && std::isdigit(static_cast<unsigned char>(s[digits]))) ++digits;
  if (digits == 0) return std::nullopt;
  const int64_t n = std::stoll(s.substr(0, digits));
  const std::string unit = s.substr(digits);
  const std::map<std::string, int64_t> scale{{"B", 1}, {"KB", 1 << 10}, {"MB", 1 << 20}};
  const auto it = scale.find(unit);
  if (it == scale.end() || n * it->second < 4 || n * it->second % 4 != 0) return std::nullopt;
  return Size{s, n * it->second};
}

struct Flags {
  std::vector<Size> sizes;
  int reps = 9;
  double target = 0.2;
  int threads = 1;
  std::vector<std::string> sides;
};

std::vector<std::string> split(const std::string& list) {
  std::vector<std::string> parts;
  std::istringstream in(list);
  for (std::string s; std::getline(in, s, ',');) parts.push_back(s);
  return parts;
}

std::optional<Flags> parse_flags(int argc, char** argv) {
  Flags f;
  std::string sizes = "1MB,16MB,256MB", sides = "bare,psum,local";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) return std::nullopt;
    const std::string v = argv[++i];
    if (a == "--sizes")
      sizes = v;
    else if (a == "--reps")
      f.reps = std::stoi(v);
    else if (a == "--target")
      f.target = std::stod(v);
    else if (a == "--threads")
      f.threads = std::stoi(v);
    else if (a == "--sides")
      sides = v;
    else
      return std::nullopt;
  }
  for (const std::string& s : split(sizes)) {
    const std::optional<Size> size = parse_size(s);
    if (!size) return std::nullopt;
    f.sizes.push_back(*size);
  }
  for (const std::string& s : split(sides)) {
    if (s != "bare" && s != "psum" && s != "local") return std::nullopt;
    f.sides.push_back(s);
  }
  if (f.sizes.empty() || f.sides.empty() || f.reps < 1 || !(f.target > 0) || f.threads < 1)
    return std::nullopt;
  return f;
}

// Seconds per call of `calls` back-to-back calls of `run`, as the slowest process saw them;
// every process starts together.
double timed(const std::function<void()>& run, int64_t calls) {
  MPI_Barrier(MPI_COMM_WORLD);
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < calls; ++i) run();
  double local =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / calls;
  double slowest = 0;
  MPI_Allreduce(&local, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return slowest;
}

// "1.23" followed by unit, or "-" for NaN.
std::string fixed(double v, const char* unit) {
  if (std::isnan(v)) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f%s", v, unit);
  return buf;
}

struct Contender {
  std::string name;
  std::function<void()> run;
  int64_t calls = 1;
  std::vector<double> ms;  // per call, one entry per repetition
};

}  // namespace

int main(int argc, char** argv) {
  distributed::initialize();
  int mpi_up = 0;
  MPI_Initialized(&mpi_up);
  if (!mpi_up) {
    std::fprintf(stderr,
                 "bench_allreduce: run it under mpirun: mpirun --allow-run-as-root "
                 "--oversubscribe -np 2 %s\n",
                 argv[0]);
    return 2;
  }
  const std::optional<Flags> flags = parse_flags(argc, argv);
  if (!flags) {
    if (distributed::process_index() == 0)
      std::fprintf(stderr,
                   "usage: bench_allreduce [--sizes 1MB,16MB,256MB] [--reps 9] [--target 0.2] "
                   "[--threads 1] [--sides bare,psum,local]\n");
    return 2;
  }
  set_num_threads(flags->threads);
  const int rank = distributed::process_index(), procs = distributed::process_count();
  const bool root = rank == 0;
  if (root) {
    std::printf("# bench_allreduce:");
    for (int i = 0; i < argc; ++i) std::printf(" %s", argv[i]);
    std::printf("\n# %d processes x %d Kiln threads, %d repetitions per side, load [%s]\n", procs,
                flags->threads, flags->reps, side_by_side::load().c_str());
    std::printf("%-9s %-5s %6s %10s %10s %10s %10s %10s\n", "size", "side", "calls", "median ms",
                "min ms", "algbw GB/s", "busbw GB/s", "vs bare");
  }
  auto f = pmap([](const Tensor& x) { return psum(x, "dp"); }, axis_name("dp"));
  const double bus_factor = 2.0 * (procs - 1) / procs;
  int failures = 0;

  for (const Size& size : flags->sizes) {
    const int64_t n = size.bytes / 4;
    // Both sides sum the same values: process p contributes p + 1 everywhere.
    const float mine = static_cast<float>(rank + 1);
    const float expected = static_cast<float>(procs * (procs + 1) / 2);
    const std::size_t count = static_cast<std::size_t>(n);
    std::vector<float> send(count, mine), recv(count), acc(count);
    const Tensor x = expand_dims(full({n}, mine), 0);
    const std::map<std::string, std::function<void()>> run{
        {"bare",
         [&] {
           MPI_Allreduce(send.data(), recv.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM,
                         MPI_COMM_WORLD);
         }},
        {"psum", [&] { (void)f(x); }},
        {"local", [&] {
           MPI_Reduce_local(send.data(), acc.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM);
         }}};
    std::vector<Contender> sides;
    for (const std::string& name : flags->sides) sides.push_back({name, run.at(name)});

    // Warm-up (f compiles in its first call), a correctness check, then the batch sizes.
    for (Contender& s : sides)
      for (int i = 0; i < 3; ++i) s.run();
    const auto all_expected = [expected](const std::vector<float>& v) {
      return std::all_of(v.begin(), v.end(), [expected](float e) { return e == expected; });
    };
    for (const Contender& s : sides) {
      if (s.name == "bare" && !all_expected(recv)) ++failures;
      if (s.name == "psum") {
        const Tensor y = f(x);
        if (y.shape() != Shape{1, n} || !all_expected(y.to_vector<float>())) ++failures;
      }
    }
    for (Contender& s : sides) {
      // Doubling until a batch takes a tenth of the target; `timed` is the same on every
      // process, so all make the same number of calls.
      double per_call = timed(s.run, s.calls);
      while (per_call * static_cast<double>(s.calls) < flags->target / 10) {
        s.calls *= 2;
        per_call = timed(s.run, s.calls);
      }
      s.calls = std::max<int64_t>(1, static_cast<int64_t>(flags->target / per_call));
    }
    for (int k = 0; k < flags->reps; ++k)
      for (std::size_t j = 0; j < sides.size(); ++j) {
        Contender& s = sides[k % 2 ? sides.size() - 1 - j : j];
        s.ms.push_back(timed(s.run, s.calls) * 1e3);
      }

    if (!root) continue;
    double bare_ms = NAN;
    for (const Contender& s : sides)
      if (s.name == "bare") bare_ms = median(s.ms);
    for (const Contender& s : sides) {
      const double ms = median(s.ms), gbps = size.bytes / (ms * 1e-3) / 1e9;
      const bool collective = s.name != "local";
      std::printf("%-9s %-5s %6lld %10.4f %10.4f %10.2f %10s %10s\n", size.label.c_str(),
                  s.name.c_str(), static_cast<long long>(s.calls), ms, minimum(s.ms), gbps,
                  collective ? fixed(gbps * bus_factor, "").c_str() : "-",
                  collective ? fixed(bare_ms / ms, "x").c_str() : "-");
    }
    std::fflush(stdout);
  }
  int all_failures = 0;
  MPI_Allreduce(&failures, &all_failures, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (root) {
    std::printf("# load at the end [%s]; vs bare > 1: faster than bare\n",
                side_by_side::load().c_str());
    if (all_failures) std::printf("# WRONG RESULTS: %d checks failed\n", all_failures);
  }
  return all_failures ? 1 : 0;
}
