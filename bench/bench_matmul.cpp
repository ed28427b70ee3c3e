// float32 kiln::matmul on each GEMM backend (OpenBLAS's sgemm, oneDNN's matmul; the one
// kiln::runtime_info() chooses is marked), in GFLOP/s (2*m*n*k per product) and as a share of
// the float32 FMA peak of as many cores (kiln::machine_peak), measured in the same run. Prints a
// Markdown table (docs/PERFORMANCE.md, "Matrix multiply").
//   build/bench/bench_matmul [--threads 1,2] [--rounds R (default 3)] [--target S (seconds per
//                            backend per round, default 0.15)] [--max N (largest square, 4096)]
// Per case, thread count and round, each backend runs batches of calls of ~20 ms; the figure
// is the best batch's mean over all rounds (the machine is shared: only same-run ratios count).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "kiln/kiln.h"

namespace {

using namespace kiln;

// c[batch, m, n] = a[batch, m, k] @ b[batch, k, n]; ta/tb: the operand is a transposed view of
// a row-major [k, m] (or [n, k]) tensor, as the backward products of a linear layer read.
struct Case {
  std::string name;
  int64_t batch, m, k, n;
  bool ta, tb;
};

std::vector<Case> cases(int64_t max_square) {
  std::vector<Case> c;
  for (int64_t s = 64; s <= max_square; s *= 2)
    c.push_back({std::to_string(s) + "³", 1, s, s, s, false, false});
  const std::vector<Case> skinny = {
      {"x[64,784] @ W[784,512]", 1, 64, 784, 512, false, false},
      {"x[64,512] @ W[512,512]", 1, 64, 512, 512, false, false},
      {"x[64,512] @ W[512,10]", 1, 64, 512, 10, false, false},
      {"x[64,3136] @ W[3136,128]", 1, 64, 3136, 128, false, false},
      {"xᵀ[784,64] @ dy[64,512]", 1, 784, 64, 512, true, false},
      {"xᵀ[512,64] @ dy[64,512]", 1, 512, 64, 512, true, false},
      {"xᵀ[512,64] @ dy[64,10]", 1, 512, 64, 10, true, false},
      {"xᵀ[3136,64] @ dy[64,128]", 1, 3136, 64, 128, true, false},
      {"dy[64,512] @ Wᵀ[512,784]", 1, 64, 512, 784, false, true},
      {"dy[64,512] @ Wᵀ[512,512]", 1, 64, 512, 512, false, true},
      {"dy[64,10] @ Wᵀ[10,512]", 1, 64, 10, 512, false, true},
      {"256 × 32³ (batched)", 256, 32, 32, 32, false, false},
      // A GPT layer's (bench_gpt's small and medium: 1024 and 2048 tokens a step).
      {"x[1024,256] @ W[256,1024]", 1, 1024, 256, 1024, false, false},
      {"hᵀ[1024,1024] @ dy[1024,256]", 1, 1024, 1024, 256, true, false},
      {"x[2048,384] @ W[384,1536]", 1, 2048, 384, 1536, false, false},
  };
  c.insert(c.end(), skinny.begin(), skinny.end());
  return c;
}

Tensor random_matrix(int64_t batch, int64_t rows, int64_t cols, bool transposed, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(static_cast<std::size_t>(batch * rows * cols));
  for (float& x : v) x = dist(gen);
  if (!transposed) return tensor(v, Shape{batch, rows, cols});
  return swapaxes(tensor(v, Shape{batch, cols, rows}), -1, -2);
}

double seconds_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Seconds per call: the best mean over batches of calls of ~20 ms, for ~target seconds.
double time_call(const Tensor& a, const Tensor& b, double target) {
  double t0 = seconds_now();
  (void)matmul(a, b);  // warm-up: creates the backend's cached primitive
  const double once = std::max(seconds_now() - t0, 1e-7);
  const int calls = std::max(1, static_cast<int>(0.02 / once));
  double best = 1e30;
  const double end = seconds_now() + target;
  do {
    t0 = seconds_now();
    for (int i = 0; i < calls; ++i) (void)matmul(a, b);
    best = std::min(best, (seconds_now() - t0) / calls);
  } while (seconds_now() < end);
  return best;
}

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown";
}

struct Options {
  std::vector<int> threads{1, 2};
  int rounds = 3;
  double target = 0.15;
  int64_t max_square = 4096;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--threads") {
      o.threads.clear();
      for (std::size_t p = 0; p < value.size();) {
        o.threads.push_back(std::stoi(value.substr(p)));
        const std::size_t comma = value.find(',', p);
        p = comma == std::string::npos ? value.size() : comma + 1;
      }
    } else if (flag == "--rounds") {
      o.rounds = std::stoi(value);
    } else if (flag == "--target") {
      o.target = std::stod(value);
    } else if (flag == "--max") {
      o.max_square = std::stoll(value);
    } else {
      std::fprintf(stderr, "unknown option %s\n", flag.c_str());
      std::exit(2);
    }
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  const RuntimeInfo info = runtime_info();
  const std::string chosen(gemm_backend_name(info.gemm_backend));
  std::printf("# %s; the CPU's vector ISA %s, OpenBLAS core %s; default float32 backend: %s\n",
              cpu_model().c_str(), info.cpu_isa.c_str(), info.blas_kernels.c_str(), chosen.c_str());
  const GemmBackend backends[] = {GemmBackend::openblas, GemmBackend::onednn};
  for (int threads : o.threads) {
    const MachinePeak peak = machine_peak(threads);
    const double peak_gf = peak.fma_gflops;
    std::printf("\n%d thread(s): float32 FMA peak of %d core(s) (%s) %.1f GFLOP/s\n\n", threads,
                threads, peak.isa.c_str(), peak_gf);
    std::printf("| product | OpenBLAS GFLOP/s | oneDNN GFLOP/s | %s, share of peak |\n",
                chosen.c_str());
    std::printf("|---|---:|---:|---:|\n");
    set_num_threads(threads);
    for (const Case& c : cases(o.max_square)) {
      const Tensor a = random_matrix(c.batch, c.m, c.k, c.ta, 1);
      const Tensor b = random_matrix(c.batch, c.k, c.n, c.tb, 2);
      double best[2] = {1e30, 1e30};
      for (int r = 0; r < o.rounds; ++r)
        for (int i = 0; i < 2; ++i) {
          set_gemm_backend(backends[i]);
          best[i] = std::min(best[i], time_call(a, b, o.target));
        }
      set_gemm_backend(std::nullopt);
      const double flops = 2.0 * static_cast<double>(c.batch * c.m * c.n * c.k);
      const double gf[2] = {flops / best[0] * 1e-9, flops / best[1] * 1e-9};
      const double mine = gf[info.gemm_backend == GemmBackend::openblas ? 0 : 1];
      std::printf("| %s | %.1f | %.1f | %.0f%% |\n", c.name.c_str(), gf[0], gf[1],
                  peak_gf > 0 ? 100 * mine / peak_gf : 0.0);
      std::fflush(stdout);
    }
  }
}
