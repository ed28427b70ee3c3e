// The models and jit-backend switch shared by the training-step benchmarks (bench_train,
// bench_compile): the training-step networks as nn::Sequential (parameter names "0.weight", ...
// as in PyTorch's state_dict, so the peers load them), and a scope that selects the backend
// of the jitted functions called inside it.
#pragma once

#include <kiln/kiln.h>
#include <kiln/nn.h>

#include <cstdlib>
#include <functional>
#include <optional>
#include <string>

namespace bench_models {

using namespace kiln;

// bench_train's CNN: conv 1->32 5x5 pad 2, relu, pool, conv 32->64 5x5 pad 2, relu, pool,
// linear 3136->1024, relu, linear 1024->10.
using Cnn = nn::Sequential<nn::Conv2d, nn::Activation, nn::MaxPool2d, nn::Conv2d, nn::Activation,
                           nn::MaxPool2d, nn::Flatten, nn::Linear, nn::Activation, nn::Linear>;
// The MLP 784-512-512-10 (also `demo --model mlp`).
using Mlp = nn::Sequential<nn::Linear, nn::Activation, nn::Linear, nn::Activation, nn::Linear>;
constexpr int64_t kClasses = 10;

inline Cnn make_cnn(const Tensor& key) {
  const Tensor k = random::split(key, 4);
  const nn::Conv2d::Options same{.padding = {2, 2}};
  return Cnn(nn::Conv2d(1, 32, {5, 5}, index(k, 0), same), nn::ReLU(), nn::MaxPool2d{},
             nn::Conv2d(32, 64, {5, 5}, index(k, 1), same), nn::ReLU(), nn::MaxPool2d{},
             nn::Flatten{}, nn::Linear(64 * 7 * 7, 1024, index(k, 2)), nn::ReLU(),
             nn::Linear(1024, kClasses, index(k, 3)));
}

// examples/demo.cpp's CNN, with the same layer types as Cnn: conv 1->32 3x3 pad 1, relu, pool,
// conv 32->64 3x3 pad 1, relu, pool, linear 3136->128, relu, linear 128->10 (the demo nests
// it differently; the arithmetic is the same).
inline Cnn make_demo_cnn(const Tensor& key) {
  const Tensor k = random::split(key, 4);
  const nn::Conv2d::Options same{.padding = {1, 1}};
  return Cnn(nn::Conv2d(1, 32, {3, 3}, index(k, 0), same), nn::ReLU(), nn::MaxPool2d{},
             nn::Conv2d(32, 64, {3, 3}, index(k, 1), same), nn::ReLU(), nn::MaxPool2d{},
             nn::Flatten{}, nn::Linear(64 * 7 * 7, 128, index(k, 2)), nn::ReLU(),
             nn::Linear(128, kClasses, index(k, 3)));
}

inline Mlp make_mlp(const Tensor& key) {
  const Tensor k = random::split(key, 3);
  return Mlp(nn::Linear(784, 512, index(k, 0)), nn::ReLU(), nn::Linear(512, 512, index(k, 1)),
             nn::ReLU(), nn::Linear(512, kClasses, index(k, 2)));
}

// Sets KILN_JIT_BACKEND for its lifetime and restores the previous value. jit reads it when
// it compiles a signature (ir::default_backend); the benchmarks set it around every call of
// a case, so each variant runs the backend it names whether the backend is fixed at compile
// time or read per call. Not thread-safe (setenv): the benchmarks call it from one thread.
class BackendScope {
 public:
  explicit BackendScope(const std::string& backend) {
    if (const char* v = std::getenv("KILN_JIT_BACKEND")) previous_ = v;
    setenv("KILN_JIT_BACKEND", backend.c_str(), 1);
  }
  ~BackendScope() {
    if (previous_)
      setenv("KILN_JIT_BACKEND", previous_->c_str(), 1);
    else
      unsetenv("KILN_JIT_BACKEND");
  }
  BackendScope(const BackendScope&) = delete;
  BackendScope& operator=(const BackendScope&) = delete;

 private:
  std::optional<std::string> previous_;
};

// f, run with KILN_JIT_BACKEND=backend.
inline std::function<void()> with_backend(std::string backend, std::function<void()> f) {
  return [backend = std::move(backend), f = std::move(f)] {
    BackendScope scope(backend);
    f();
  };
}

// The thread count Kiln runs with, as set for this process: KILN_NUM_THREADS, else
// OMP_NUM_THREADS, else "(default)".
inline std::string kiln_threads() {
  for (const char* v : {"KILN_NUM_THREADS", "OMP_NUM_THREADS"})
    if (const char* s = std::getenv(v); s && *s) return s;
  return "(default)";
}

}  // namespace bench_models
