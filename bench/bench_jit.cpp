// jit call overhead and an MLP forward under jit vs eager.
//   build/bench/bench_jit
#include <benchmark/benchmark.h>
#include <kiln/kiln.h>

#include <cmath>

struct Mlp {
  kiln::Tensor w1, b1, w2, b2, w3, b3;
};
KILN_TREE(Mlp, w1, b1, w2, b2, w3, b3);

namespace {

using namespace kiln;

// Three small inputs, three small ops: the eager cost of the ops is measured alongside, so
// the difference is jit's own overhead (flatten, cache lookup, interpreter).
Tensor small_fn(const Tensor& a, const Tensor& b, const Tensor& c) { return a * b + c - a; }

void BM_small_eager(benchmark::State& state) {
  const Tensor a = tensor({1.f, 2.f}), b = tensor({3.f, 4.f}), c = tensor({5.f, 6.f});
  for (auto _ : state) benchmark::DoNotOptimize(small_fn(a, b, c));
}
BENCHMARK(BM_small_eager);

void BM_small_jit(benchmark::State& state) {
  const Tensor a = tensor({1.f, 2.f}), b = tensor({3.f, 4.f}), c = tensor({5.f, 6.f});
  auto f = jit(small_fn);
  f(a, b, c);
  for (auto _ : state) benchmark::DoNotOptimize(f(a, b, c));
}
BENCHMARK(BM_small_jit);

Tensor mlp(const Mlp& p, const Tensor& x) {
  const Tensor h1 = maximum(matmul(x, p.w1) + p.b1, 0.0);
  const Tensor h2 = maximum(matmul(h1, p.w2) + p.b2, 0.0);
  return matmul(h2, p.w3) + p.b3;
}

Mlp init_mlp() {
  auto keys = random::split(random::key(0), 3);
  auto layer = [&](int i, int64_t in, int64_t out) {
    return random::normal(index(keys, i), {in, out}) * (1.0 / std::sqrt(static_cast<double>(in)));
  };
  return {layer(0, 784, 512), zeros({512}),      layer(1, 512, 512),
          zeros({512}),       layer(2, 512, 10), zeros({10})};
}

void BM_mlp_forward_eager(benchmark::State& state) {
  const Mlp p = init_mlp();
  const Tensor x = random::normal(random::key(1), {128, 784});
  for (auto _ : state) benchmark::DoNotOptimize(mlp(p, x));
}
BENCHMARK(BM_mlp_forward_eager)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_mlp_forward_jit(benchmark::State& state) {
  const Mlp p = init_mlp();
  const Tensor x = random::normal(random::key(1), {128, 784});
  auto f = jit(mlp);
  f(p, x);
  for (auto _ : state) benchmark::DoNotOptimize(f(p, x));
}
BENCHMARK(BM_mlp_forward_jit)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
