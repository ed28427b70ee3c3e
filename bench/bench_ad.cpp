// Automatic differentiation end to end: a training step, a Hessian-vector product and the
// memory/time trade of checkpoint. The PyTorch (Python) side is bench/torch_peers.py; when
// libtorch is found the same computations also run here through libtorch's C++ API, so that
// one process measures Kiln and PyTorch side by side.
//   build/bench/bench_ad --benchmark_counters_tabular=true
//   build/bench/bench_ad --check       # correctness checks only (Kiln HVP vs its closed form)
//
// (a) MLP 784-512-512-10, relu, cross-entropy as -mean(sum(one_hot * log_softmax)), batch 128,
//     one step = forward + backward + SGD (lr 0.01) on every parameter.
// (b) Hessian-vector product of f(x) = sum(tanh(W x)), W 1000x1000: jvp of grad (forward over
//     reverse) in Kiln, double backward in PyTorch.
// (c) 16 tanh layers: grad of mean(h^2) with no checkpoint, each layer checkpointed, or blocks
//     of 4 layers checkpointed; peak bytes above the baseline (parameters and input) during one
//     grad call, eager and jitted. Two shapes (width/batch): 1024/256, where the 64 MiB of
//     weight gradients outweigh the 1 MiB activations, and 256/4096, where activations
//     (4 MiB each) dominate and rematerialisation can show.
#include <benchmark/benchmark.h>
#include <kiln/kiln.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#ifdef KILN_BENCH_WITH_TORCH
#include <torch/torch.h>
#endif

struct Mlp {
  kiln::Tensor w1, b1, w2, b2, w3, b3;
};
KILN_TREE(Mlp, w1, b1, w2, b2, w3, b3);

namespace {

using namespace kiln;

constexpr double kLr = 0.01;

// ---- (a) one training step ----------------------------------------------------------------

Mlp init_mlp() {
  auto keys = random::split(random::key(0), 3);
  auto layer = [&](int i, int64_t in, int64_t out) {
    return random::normal(index(keys, i), {in, out}) * (1.0 / std::sqrt(static_cast<double>(in)));
  };
  return {layer(0, 784, 512), zeros({512}),      layer(1, 512, 512),
          zeros({512}),       layer(2, 512, 10), zeros({10})};
}

Tensor mlp_loss(const Mlp& p, const Tensor& x, const Tensor& labels) {
  const Tensor h1 = maximum(matmul(x, p.w1) + p.b1, 0.0);
  const Tensor h2 = maximum(matmul(h1, p.w2) + p.b2, 0.0);
  const Tensor logits = matmul(h2, p.w3) + p.b3;
  return -mean(sum(one_hot(labels, 10) * log_softmax(logits, -1), {-1}));
}

Mlp sgd(const Mlp& p, const Mlp& g) {
  return tree_map([](const Tensor& w, const Tensor& d) { return w - kLr * d; }, p, g);
}

std::pair<Tensor, Mlp> train_step(const Mlp& p, const Tensor& x, const Tensor& labels) {
  auto [loss, g] = value_and_grad(mlp_loss)(p, x, labels);
  return {loss, sgd(p, g)};
}

struct MlpData {
  Tensor x = random::normal(random::key(1), {128, 784});
  Tensor labels = random::randint(random::key(2), {128}, 0, 10, int64);
};

void BM_step_kiln_eager(benchmark::State& state) {
  Mlp p = init_mlp();
  const MlpData d;
  Tensor loss;
  for (auto _ : state) {
    std::tie(loss, p) = train_step(p, d.x, d.labels);
    benchmark::DoNotOptimize(p.w1.raw_data());
  }
  state.counters["loss"] = loss.item<float>();
}
BENCHMARK(BM_step_kiln_eager)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_step_kiln_jit(benchmark::State& state) {
  Mlp p = init_mlp();
  const MlpData d;
  auto step = jit(train_step, "train_step");
  Tensor loss;
  std::tie(loss, p) = step(p, d.x, d.labels);  // compile
  for (auto _ : state) {
    std::tie(loss, p) = step(p, d.x, d.labels);
    benchmark::DoNotOptimize(p.w1.raw_data());
  }
  state.counters["loss"] = loss.item<float>();
}
BENCHMARK(BM_step_kiln_jit)->Unit(benchmark::kMillisecond)->UseRealTime();

// ---- (b) Hessian-vector product -----------------------------------------------------------

constexpr int64_t kHvpN = 1000;

Tensor tanh_sum(const Tensor& w, const Tensor& x) { return sum(tanh(matmul(w, x))); }

// Forward over reverse: the directional derivative of grad_x f along v.
Tensor hvp(const Tensor& w, const Tensor& x, const Tensor& v) {
  auto g = [&w](const Tensor& xx) {
    return grad([&w](const Tensor& y) { return tanh_sum(w, y); })(xx);
  };
  return jvp(g, std::tuple<Tensor>{x}, std::tuple<Tensor>{v}).second;
}

// Closed form: H v = W^T (s * (W v)), s = -2 t (1 - t^2), t = tanh(W x).
Tensor hvp_closed_form(const Tensor& w, const Tensor& x, const Tensor& v) {
  const Tensor t = tanh(matmul(w, x));
  const Tensor s = -2.0 * t * (1.0 - t * t);
  return matmul(transpose(w), s * matmul(w, v));
}

struct HvpData {
  Tensor w = random::normal(random::key(3), {kHvpN, kHvpN}) * (1.0 / std::sqrt(double(kHvpN)));
  Tensor x = random::normal(random::key(4), {kHvpN});
  Tensor v = random::normal(random::key(5), {kHvpN});
};

void BM_hvp_kiln_eager(benchmark::State& state) {
  const HvpData d;
  for (auto _ : state) benchmark::DoNotOptimize(hvp(d.w, d.x, d.v).raw_data());
}
BENCHMARK(BM_hvp_kiln_eager)->Unit(benchmark::kMicrosecond)->UseRealTime();

void BM_hvp_kiln_jit(benchmark::State& state) {
  const HvpData d;
  auto f = jit(hvp, "hvp");
  f(d.w, d.x, d.v);
  for (auto _ : state) benchmark::DoNotOptimize(f(d.w, d.x, d.v).raw_data());
}
BENCHMARK(BM_hvp_kiln_jit)->Unit(benchmark::kMicrosecond)->UseRealTime();

// The same product written out by hand (three matrix-vector products): a floor for both.
void BM_hvp_kiln_closed_form(benchmark::State& state) {
  const HvpData d;
  for (auto _ : state) benchmark::DoNotOptimize(hvp_closed_form(d.w, d.x, d.v).raw_data());
}
BENCHMARK(BM_hvp_kiln_closed_form)->Unit(benchmark::kMicrosecond)->UseRealTime();

// ---- (c) checkpoint: peak memory and time -------------------------------------------------

constexpr int kDepth = 16, kBlock = 4;

Tensor layer(const Tensor& h, const Tensor& w) { return tanh(matmul(h, w)); }

Tensor block(const Tensor& h, const std::vector<Tensor>& ws) {
  Tensor out = h;
  for (const Tensor& w : ws) out = layer(out, w);
  return out;
}

enum Remat { kNone = 0, kPerLayer = 1, kPerBlock = 2 };
const char* remat_name(int r) {
  return r == kNone       ? "no checkpoint"
         : r == kPerLayer ? "checkpoint each layer"
                          : "checkpoint blocks of 4";
}

template <int R>
Tensor deep_loss(const std::vector<Tensor>& ws, const Tensor& x) {
  Tensor h = x;
  if constexpr (R == kNone) {
    for (const Tensor& w : ws) h = layer(h, w);
  } else if constexpr (R == kPerLayer) {
    for (const Tensor& w : ws) h = checkpoint(layer)(h, w);
  } else {
    for (std::size_t i = 0; i < ws.size(); i += kBlock)
      h = checkpoint(block)(h, std::vector<Tensor>(ws.begin() + i, ws.begin() + i + kBlock));
  }
  return mean(square(h));
}

struct DeepData {
  std::vector<Tensor> ws;
  Tensor x;
  DeepData(int64_t width, int64_t batch) : x(random::normal(random::key(6), {batch, width})) {
    for (int i = 0; i < kDepth; ++i)
      ws.push_back(random::normal(random::key(100 + i), {width, width}) *
                   (1.0 / std::sqrt(double(width))));
  }
};

// Peak bytes allocated above what was live before the call, during one call of f.
template <class F>
double peak_mib(F&& f) {
  const int64_t before = memory_stats().bytes_in_use;
  reset_peak_memory_stats();
  {
    auto out = f();
    benchmark::DoNotOptimize(out);
  }
  return double(memory_stats().peak_bytes_in_use - before) / (1024.0 * 1024.0);
}

template <int R>
void BM_ckpt_eager(benchmark::State& state) {
  const DeepData d(state.range(0), state.range(1));
  auto g = grad(deep_loss<R>);
  g(d.ws, d.x);
  const double mib = peak_mib([&] { return g(d.ws, d.x); });
  for (auto _ : state) benchmark::DoNotOptimize(g(d.ws, d.x));
  state.counters["peak_MiB"] = mib;
  state.SetLabel(remat_name(R));
}
template <int R>
void BM_ckpt_jit(benchmark::State& state) {
  const DeepData d(state.range(0), state.range(1));
  auto g = jit(grad(deep_loss<R>), "deep_grad");
  g(d.ws, d.x);  // compile
  const double mib = peak_mib([&] { return g(d.ws, d.x); });
  for (auto _ : state) benchmark::DoNotOptimize(g(d.ws, d.x));
  state.counters["peak_MiB"] = mib;
  state.SetLabel(remat_name(R));
}
void ckpt_shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"width", "batch"})->Args({1024, 256})->Args({256, 4096});
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}
BENCHMARK(BM_ckpt_eager<kNone>)->Apply(ckpt_shapes);
BENCHMARK(BM_ckpt_eager<kPerLayer>)->Apply(ckpt_shapes);
BENCHMARK(BM_ckpt_eager<kPerBlock>)->Apply(ckpt_shapes);
BENCHMARK(BM_ckpt_jit<kNone>)->Apply(ckpt_shapes);
BENCHMARK(BM_ckpt_jit<kPerLayer>)->Apply(ckpt_shapes);
BENCHMARK(BM_ckpt_jit<kPerBlock>)->Apply(ckpt_shapes);

// ---- libtorch C++ peers -------------------------------------------------------------------

#ifdef KILN_BENCH_WITH_TORCH
torch::Tensor to_torch(const Tensor& t) {
  const Tensor c = astype(t, float32) + 0.0;  // a fresh contiguous copy
  std::vector<int64_t> dims(c.shape().begin(), c.shape().end());
  return torch::from_blob(const_cast<void*>(c.raw_data()), dims, torch::kFloat32).clone();
}

void BM_step_torch_cpp(benchmark::State& state) {
  const Mlp k = init_mlp();
  const MlpData d;
  std::vector<torch::Tensor> p;
  for (const Tensor& t : tree_flatten(k).first) p.push_back(to_torch(t).requires_grad_(true));
  const torch::Tensor x = to_torch(d.x);
  const torch::Tensor y = to_torch(d.labels).to(torch::kLong);
  float last = 0;
  for (auto _ : state) {
    auto h1 = torch::relu(torch::addmm(p[1], x, p[0]));
    auto h2 = torch::relu(torch::addmm(p[3], h1, p[2]));
    auto logits = torch::addmm(p[5], h2, p[4]);
    auto onehot = torch::one_hot(y, 10).to(torch::kFloat32);
    auto loss = -(onehot * torch::log_softmax(logits, -1)).sum(-1).mean();
    loss.backward();
    {
      torch::NoGradGuard ng;
      for (auto& w : p) {
        w.sub_(w.grad(), kLr);
        w.mutable_grad() = torch::Tensor();
      }
    }
    last = loss.item<float>();
  }
  state.counters["loss"] = last;
}
BENCHMARK(BM_step_torch_cpp)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_hvp_torch_cpp(benchmark::State& state) {
  const HvpData d;
  const torch::Tensor w = to_torch(d.w), v = to_torch(d.v);
  const torch::Tensor x0 = to_torch(d.x);
  for (auto _ : state) {
    torch::Tensor x = x0.detach().requires_grad_(true);
    auto f = torch::tanh(torch::mv(w, x)).sum();
    auto g = torch::autograd::grad({f}, {x}, {}, /*retain_graph=*/true, /*create_graph=*/true)[0];
    auto hv = torch::autograd::grad({torch::dot(g, v)}, {x})[0];
    benchmark::DoNotOptimize(hv.data_ptr());
  }
}
BENCHMARK(BM_hvp_torch_cpp)->Unit(benchmark::kMicrosecond)->UseRealTime();
#endif

// ---- correctness --------------------------------------------------------------------------

double max_abs_diff(const Tensor& a, const Tensor& b) { return max(abs(a - b)).item<float>(); }

int check() {
  int bad = 0;
  auto report = [&](const char* what, double err, double tol) {
    std::printf("%-44s max |diff| = %.3g  %s\n", what, err, err <= tol ? "ok" : "FAIL");
    bad += err > tol;
  };
  const HvpData d;
  const Tensor ref = hvp_closed_form(d.w, d.x, d.v);
  report("hvp eager vs closed form", max_abs_diff(hvp(d.w, d.x, d.v), ref), 1e-4);
  report("hvp jit vs closed form", max_abs_diff(jit(hvp)(d.w, d.x, d.v), ref), 1e-4);
  const DeepData dd(1024, 256);
  const auto g0 = grad(deep_loss<kNone>)(dd.ws, dd.x);
  const auto g1 = jit(grad(deep_loss<kPerLayer>))(dd.ws, dd.x);
  const auto g2 = grad(deep_loss<kPerBlock>)(dd.ws, dd.x);
  double e1 = 0, e2 = 0;
  for (int i = 0; i < kDepth; ++i) {
    e1 = std::max(e1, max_abs_diff(g0[i], g1[i]));
    e2 = std::max(e2, max_abs_diff(g0[i], g2[i]));
  }
  report("deep grad: checkpoint each layer (jit)", e1, 1e-6);
  report("deep grad: checkpoint blocks (eager)", e2, 1e-6);
  Mlp p = init_mlp(), q = init_mlp();
  const MlpData md;
  auto step = jit(train_step);
  Tensor le, lj;
  for (int i = 0; i < 3; ++i) {
    std::tie(le, p) = train_step(p, md.x, md.labels);
    std::tie(lj, q) = step(q, md.x, md.labels);
  }
  report("mlp step: jit vs eager loss after 3 steps", std::abs(le.item<float>() - lj.item<float>()),
         1e-5);
  report("mlp step: jit vs eager w1 after 3 steps", max_abs_diff(p.w1, q.w1), 1e-5);
#ifdef KILN_BENCH_WITH_TORCH
  {
    const torch::Tensor w = to_torch(d.w), v = to_torch(d.v);
    torch::Tensor x = to_torch(d.x).requires_grad_(true);
    auto f = torch::tanh(torch::mv(w, x)).sum();
    auto g = torch::autograd::grad({f}, {x}, {}, true, true)[0];
    auto hv = torch::autograd::grad({torch::dot(g, v)}, {x})[0];
    report("hvp libtorch vs Kiln closed form", (hv - to_torch(ref)).abs().max().item<float>(),
           1e-4);
  }
#endif
  return bad;
}

}  // namespace

int main(int argc, char** argv) {
#ifdef KILN_BENCH_WITH_TORCH
  // Two threads like Kiln's OpenMP default on the 2-core machine; OMP_NUM_THREADS overrides
  // both (Kiln's OpenMP pool reads it directly).
  const char* omp = std::getenv("OMP_NUM_THREADS");
  at::set_num_threads(omp ? std::atoi(omp) : 2);
#endif
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], "--check") == 0) return check() == 0 ? 0 : 1;
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
