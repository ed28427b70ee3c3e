// Eager overhead and elementwise bandwidth, side by side with libtorch's C++ eager API.
//   build/bench/bench_eager --benchmark_counters_tabular=true
#include <benchmark/benchmark.h>
#include <kiln/kiln.h>

#include <cstring>
#include <vector>

#ifdef KILN_BENCH_WITH_TORCH
#include <torch/torch.h>
#endif

namespace {

// Small op: the cost of one eager add of two 2-element float32 tensors (dispatch, type rule,
// allocation), which dominates when models are made of many small ops.
void BM_kiln_add_small(benchmark::State& state) {
  const kiln::Tensor a = kiln::tensor({1.f, 2.f}), b = kiln::tensor({3.f, 4.f});
  for (auto _ : state) benchmark::DoNotOptimize(kiln::add(a, b));
}
BENCHMARK(BM_kiln_add_small);

// Large elementwise ops on 10^7 float32 elements: bytes moved (2 reads + 1 write, or 1+1)
// per second, against memcpy of the output's bytes.
constexpr int64_t kLarge = 10'000'000;

void BM_memcpy_large(benchmark::State& state) {
  std::vector<float> src(kLarge, 1.f), dst(kLarge);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), kLarge * sizeof(float));
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * kLarge * 2 * int64_t{sizeof(float)});
}
BENCHMARK(BM_memcpy_large)->UseRealTime();

void BM_kiln_add_large(benchmark::State& state) {
  const kiln::Tensor a = kiln::ones({kLarge}), b = kiln::ones({kLarge});
  for (auto _ : state) benchmark::DoNotOptimize(kiln::add(a, b));
  state.SetBytesProcessed(state.iterations() * kLarge * 3 * int64_t{sizeof(float)});
}
BENCHMARK(BM_kiln_add_large)->UseRealTime();

void BM_kiln_mul_scalar_large(benchmark::State& state) {
  const kiln::Tensor a = kiln::ones({kLarge});
  for (auto _ : state) benchmark::DoNotOptimize(a * 2.0);
  state.SetBytesProcessed(state.iterations() * kLarge * 2 * int64_t{sizeof(float)});
}
BENCHMARK(BM_kiln_mul_scalar_large)->UseRealTime();

void BM_kiln_exp_large(benchmark::State& state) {
  const kiln::Tensor a = kiln::ones({kLarge});
  for (auto _ : state) benchmark::DoNotOptimize(kiln::exp(a));
  state.SetBytesProcessed(state.iterations() * kLarge * 2 * int64_t{sizeof(float)});
}
BENCHMARK(BM_kiln_exp_large)->UseRealTime();

void BM_kiln_sum_large(benchmark::State& state) {
  const kiln::Tensor a = kiln::ones({kLarge});
  for (auto _ : state) benchmark::DoNotOptimize(kiln::sum(a));
  state.SetBytesProcessed(state.iterations() * kLarge * int64_t{sizeof(float)});
}
BENCHMARK(BM_kiln_sum_large)->UseRealTime();

#ifdef KILN_BENCH_WITH_TORCH
void BM_torch_add_small(benchmark::State& state) {
  torch::NoGradGuard no_grad;
  const torch::Tensor a = torch::tensor({1.f, 2.f}), b = torch::tensor({3.f, 4.f});
  for (auto _ : state) benchmark::DoNotOptimize(torch::add(a, b));
}
BENCHMARK(BM_torch_add_small);

void BM_torch_add_large(benchmark::State& state) {
  torch::NoGradGuard no_grad;
  const torch::Tensor a = torch::ones({kLarge}), b = torch::ones({kLarge});
  for (auto _ : state) benchmark::DoNotOptimize(torch::add(a, b));
  state.SetBytesProcessed(state.iterations() * kLarge * 3 * int64_t{sizeof(float)});
}
BENCHMARK(BM_torch_add_large)->UseRealTime();

void BM_torch_exp_large(benchmark::State& state) {
  torch::NoGradGuard no_grad;
  const torch::Tensor a = torch::ones({kLarge});
  for (auto _ : state) benchmark::DoNotOptimize(torch::exp(a));
  state.SetBytesProcessed(state.iterations() * kLarge * 2 * int64_t{sizeof(float)});
}
BENCHMARK(BM_torch_exp_large)->UseRealTime();

void BM_torch_sum_large(benchmark::State& state) {
  torch::NoGradGuard no_grad;
  const torch::Tensor a = torch::ones({kLarge});
  for (auto _ : state) benchmark::DoNotOptimize(torch::sum(a));
  state.SetBytesProcessed(state.iterations() * kLarge * int64_t{sizeof(float)});
}
BENCHMARK(BM_torch_sum_large)->UseRealTime();
#endif

}  // namespace

BENCHMARK_MAIN();
