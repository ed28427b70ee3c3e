// kiln::matmul against OpenBLAS sgemm called directly, in GFLOP/s (2*m*n*k per product).
// The target is kiln >= 90% of direct sgemm at 2048x2048x2048: the only overheads kiln adds
// are dispatch and allocating (and first-touching) the output.
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <random>
#include <vector>

#include "kiln/kiln.h"

namespace {

std::vector<float> random_floats(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (float& x : v) x = dist(gen);
  return v;
}

void set_gflops(benchmark::State& state, int64_t m, int64_t n, int64_t k) {
  state.counters["GFLOP/s"] =
      benchmark::Counter(2e-9 * static_cast<double>(m) * static_cast<double>(n) *
                             static_cast<double>(k) * static_cast<double>(state.iterations()),
                         benchmark::Counter::kIsRate);
}

void BM_KilnMatmul(benchmark::State& state) {
  const int64_t n = state.range(0);
  const kiln::Tensor a = kiln::tensor(random_floats(n * n, 1), kiln::Shape{n, n});
  const kiln::Tensor b = kiln::tensor(random_floats(n * n, 2), kiln::Shape{n, n});
  for (auto _ : state) {
    kiln::Tensor c = kiln::matmul(a, b);
    benchmark::DoNotOptimize(c.raw_data());
    benchmark::ClobberMemory();
  }
  set_gflops(state, n, n, n);
}

// b passed as a transposed view: no copy, gemm gets CblasTrans.
void BM_KilnMatmulTransposedB(benchmark::State& state) {
  const int64_t n = state.range(0);
  const kiln::Tensor a = kiln::tensor(random_floats(n * n, 1), kiln::Shape{n, n});
  const kiln::Tensor bt = kiln::transpose(kiln::tensor(random_floats(n * n, 2), kiln::Shape{n, n}));
  for (auto _ : state) {
    kiln::Tensor c = kiln::matmul(a, bt);
    benchmark::DoNotOptimize(c.raw_data());
    benchmark::ClobberMemory();
  }
  set_gflops(state, n, n, n);
}

void BM_DirectSgemm(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  const std::vector<float> a = random_floats(int64_t{n} * n, 1),
                           b = random_floats(int64_t{n} * n, 2);
  std::vector<float> c(static_cast<std::size_t>(n) * static_cast<std::size_t>(n));
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n,
                0.0f, c.data(), n);
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  set_gflops(state, n, n, n);
}

// Many small products: kiln splits the batch across threads.
void BM_KilnBatchedSmall(benchmark::State& state) {
  const int64_t batch = 256, n = state.range(0);
  const kiln::Tensor a = kiln::tensor(random_floats(batch * n * n, 3), kiln::Shape{batch, n, n});
  const kiln::Tensor b = kiln::tensor(random_floats(batch * n * n, 4), kiln::Shape{batch, n, n});
  for (auto _ : state) {
    kiln::Tensor c = kiln::matmul(a, b);
    benchmark::DoNotOptimize(c.raw_data());
  }
  set_gflops(state, batch * n, n, n);
}

void BM_DirectSgemmBatchedSmall(benchmark::State& state) {
  const int batch = 256, n = static_cast<int>(state.range(0));
  const std::size_t sz = static_cast<std::size_t>(n) * static_cast<std::size_t>(n);
  const std::vector<float> a = random_floats(batch * int64_t{n} * n, 3),
                           b = random_floats(batch * int64_t{n} * n, 4);
  std::vector<float> c(batch * sz);
  for (auto _ : state) {
    for (int i = 0; i < batch; ++i)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data() + i * sz, n,
                  b.data() + i * sz, n, 0.0f, c.data() + i * sz, n);
    benchmark::DoNotOptimize(c.data());
  }
  set_gflops(state, int64_t{batch} * n, n, n);
}

}  // namespace

BENCHMARK(BM_KilnMatmul)->Arg(512)->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_DirectSgemm)->Arg(512)->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_KilnMatmulTransposedB)->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_KilnBatchedSmall)->Arg(32)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_DirectSgemmBatchedSmall)->Arg(32)->Unit(benchmark::kMicrosecond)->UseRealTime();

BENCHMARK_MAIN();
